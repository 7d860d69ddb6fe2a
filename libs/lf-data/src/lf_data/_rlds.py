"""Open X-Embodiment / RLDS datasets (TFDS folders of TFRecord shards) without TensorFlow.

Legend: ``T`` steps of an episode, ``N`` frames, ``A`` action horizon, ``D``
action width, ``S`` state width, ``H``/``W`` image size.

Episodes are scanned once at init: low-dimensional values (actions, states,
instructions) are kept in memory; images stay in the shards and are decoded per
``__getitem__`` from the record's byte offset (the last episode's images are
cached), so memory does not grow with the image data.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ._errors import DataError, ErrorPolicy, is_lfs_pointer
from ._rlds_spec import decode_steps, flatten_features, load_json, shard_paths
from ._stats import compute_stats
from ._tf_example import WireError, parse_example
from ._tfrecord import iter_tfrecord, read_record_at
from ._windows import action_window, check_index, locate

__all__ = ["RLDSDataset", "EEF_ACTION_KEYS", "GRIPPER_KEYS", "INSTRUCTION_KEYS"]

EEF_ACTION_KEYS = ("world_vector", "rotation_delta")
"""Canonical order of a dict action: EEF delta xyz (3), rotation delta (3), then the gripper."""
GRIPPER_KEYS = ("gripper_closedness_action", "open_gripper", "gripper")
"""Gripper entries of a dict action, in order of preference (the first present is used)."""
INSTRUCTION_KEYS = ("language_instruction", "observation/natural_language_instruction")
"""Where RLDS datasets keep the instruction (step keys), in order of preference."""
STATE_FALLBACK = ("observation/base_pose_tool_reached", "observation/gripper_closed")
"""State of datasets without ``observation/state`` (fractal20220817_data / RT-1)."""


class RLDSDataset(torch.utils.data.Dataset):
    """Frames of an RLDS (TFDS) dataset split with action chunks, in LeRobotDataset's sample schema.

    ``ds[i]`` -> ``{"image": uint8 (H, W, 3), "state": float32 (S,), "actions":
    float32 (A, D), "action_is_pad": bool (A,), "task": str, "task_index": int,
    "episode_index": int, "frame_index": int}``. ``actions[j]`` is the action
    of step ``t + j``; past the episode end the last action repeats and
    ``action_is_pad[j]`` is True. ``episode_index`` is the episode's position in
    the split (shard order, then record order), whether or not others were skipped.

    Action mapping (``action_keys=None``): a tensor ``steps/action`` is used as
    stored. A dict action is concatenated as ``world_vector`` (3, EEF delta xyz),
    ``rotation_delta`` (3), then the first of :data:`GRIPPER_KEYS` present (1),
    values and signs as stored (RT-1: ``gripper_closedness_action`` 1 = close,
    -1 = open; bools become 0/1). Other dict entries (``terminate_episode``,
    base motion) are left out; pass ``action_keys`` to choose them.
    State: ``observation/state``, else ``base_pose_tool_reached`` +
    ``gripper_closed`` (fractal), else ``state_keys``, else empty ``(0,)``.
    Instruction: ``steps/language_instruction`` or
    ``steps/observation/natural_language_instruction``, the first non-empty step.

    Args:
        root: the TFDS version folder (holds ``dataset_info.json``, ``features.json``, shards).
        split: split name in ``dataset_info.json``.
        action_horizon: ``A`` >= 1.
        image_key / state_keys / action_keys: step feature names under
            ``observation/`` (image, state) and ``action/`` (dict actions), or None for the defaults.
        shards: indices of the split's shard files to read (default all): a
            subset of a large dataset; episode indices stay those of the split.
        on_error: ``"raise"`` raises :class:`DataError` at the first bad
            episode; ``"skip"`` skips it (or the rest of a truncated shard),
            counted in ``skipped`` (reason -> count) and listed in ``problems``.

    Raises:
        DataError (a ``ValueError``): truncated shard, CRC mismatch, Git LFS
            pointer in place of a shard, NaN/inf action or state, episode
            without instruction, missing shard, shard with another episode
            count than declared: the message names file, episode and field.
        FileNotFoundError / ValueError: missing or invalid metadata.

    Example:
        >>> ds = RLDSDataset("bridge/0.1.0", action_horizon=4)  # doctest: +SKIP
        >>> ds[0]["actions"].shape  # doctest: +SKIP
        torch.Size([4, 7])
    """

    def __init__(self, root: str | Path, *, split: str = "train", action_horizon: int = 1,
                 image_key: str | None = None, state_keys: Sequence[str] | None = None,
                 action_keys: Sequence[str] | None = None, shards: Sequence[int] | None = None,
                 on_error: str = "raise") -> None:
        if int(action_horizon) < 1:
            raise ValueError(f"RLDSDataset: action_horizon must be >= 1, got {action_horizon}")
        self._policy = ErrorPolicy(on_error)
        self.root, self.split, self.action_horizon = Path(root), split, int(action_horizon)
        self.info = load_json(self.root / "dataset_info.json")
        feats_path = self.root / "features.json"
        specs = flatten_features(load_json(feats_path), where=str(feats_path))
        self.step_specs = {k[len("steps/"):]: v for k, v in specs.items() if k.startswith("steps/")}
        self._choose_keys(feats_path, image_key, state_keys, action_keys)
        self._episodes: list[dict] = []
        self.tasks: list[str] = []
        self._task_ids: dict[str, int] = {}
        first, paths = 0, shard_paths(self.root, self.info, split)
        wanted = set(range(len(paths))) if shards is None else {int(s) for s in shards}
        if not wanted <= set(range(len(paths))):
            raise ValueError(f"RLDSDataset: shards must be indices in 0..{len(paths) - 1}, got {sorted(wanted)}")
        for s, (path, declared) in enumerate(paths):
            if s in wanted:
                self._scan_shard(path, declared, first)
            first += declared
        lengths = np.array([e["actions"].shape[0] for e in self._episodes], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.num_episodes = len(self._episodes)
        self.episode_ranges = [(int(a), int(b)) for a, b in zip(self._starts[:-1], self._starts[1:], strict=True)]
        self.stats = self._compute_stats()
        self._cache: tuple[tuple[str, int], list[bytes]] | None = None

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped items per reason (``on_error="skip"``), e.g. ``{"crc": 1}``."""
        return dict(self._policy.skipped)

    @property
    def problems(self) -> list[str]:
        """Messages of everything skipped."""
        return list(self._policy.problems)

    def _choose_keys(self, where: Path, image_key, state_keys, action_keys) -> None:
        steps = self.step_specs
        images = sorted(k for k, s in steps.items() if s.kind == "image" and k.startswith("observation/"))
        if image_key is None:
            image_key = "image" if "observation/image" in steps else (images[0][len("observation/"):]
                                                                      if images else None)
        self.image_key = f"observation/{image_key}"
        if self.image_key not in steps or steps[self.image_key].kind != "image":
            raise ValueError(f"{where}: image feature {self.image_key!r} not found (images: {images})")
        if state_keys is not None:
            state = [f"observation/{k}" for k in state_keys]
        elif "observation/state" in steps:
            state = ["observation/state"]
        elif all(k in steps for k in STATE_FALLBACK):
            state = list(STATE_FALLBACK)
        else:
            state = []
        if "action" in steps:
            action = ["action"]
        else:
            names = [k[len("action/"):] for k in steps if k.startswith("action/")]
            chosen = list(action_keys) if action_keys is not None else \
                [k for k in EEF_ACTION_KEYS if k in names] + [next((g for g in GRIPPER_KEYS if g in names), "")]
            if action_keys is None and (len(chosen) != 3 or not chosen[-1]):
                raise ValueError(f"{where}: dict action has {sorted(names)}; expected world_vector, "
                                 f"rotation_delta and one of {GRIPPER_KEYS}: pass action_keys=")
            action = [f"action/{k}" for k in chosen]
        for key in state + action:
            if key not in steps or steps[key].kind != "tensor":
                raise ValueError(f"{where}: step tensor feature {key!r} not found (steps: {sorted(steps)})")
            if steps[key].encoding != "none":
                raise ValueError(f"{where}: step feature {key!r} has Tensor encoding {steps[key].encoding!r}; "
                                 "only 'none' is supported")
        self.state_keys, self.action_keys = state, action
        self.instruction_key = next((k for k in INSTRUCTION_KEYS if k in steps), INSTRUCTION_KEYS[0])

    def _scan_shard(self, path: Path, declared: int, first: int) -> None:
        span = f"episodes {first}..{first + declared - 1}, field 'shard'"
        if not path.is_file():
            return self._policy.handle(DataError(f"{path}: shard file missing (declared in dataset_info.json, {span})",
                                                 file=path, field="shard", reason="missing_file"))
        if is_lfs_pointer(path):
            return self._policy.handle(DataError(
                f"{path}: is a Git LFS pointer file, not TFRecord data ({span}); run 'git lfs pull' or download "
                "the real shard", file=path, field="shard", reason="lfs_pointer"))
        count, clean, records = 0, True, iter_tfrecord(path)
        while True:
            try:
                item = next(records, None)
            except DataError as e:  # truncated / framing: the rest of the shard is lost
                e.episode = first + count
                e.args = (f"{e} (episode {first + count}, field {e.field!r})",)
                return self._policy.handle(e)
            if item is None:
                break
            index, offset, data = item
            count += 1
            if isinstance(data, DataError):
                data.episode, clean = first + index, False
                data.args = (f"{data} (episode {first + index}, field 'data')",)
                self._policy.handle(data)
                continue
            try:
                self._add_episode(path, offset, first + index, data)
            except DataError as e:
                clean = False
                self._policy.handle(e)
        if clean and count != declared:
            self._policy.handle(DataError(f"{path}: holds {count} episodes but dataset_info.json declares "
                                          f"{declared} (field 'shardLengths')", file=path, field="shardLengths",
                                          reason="episode_count"))

    def _add_episode(self, path: Path, offset: int, episode: int, data: bytes) -> None:
        def err(field: str, msg: str, reason: str) -> DataError:
            return DataError(f"{path}: episode {episode} field {field!r}: {msg}", file=path, episode=episode,
                             field=field, offset=offset, reason=reason)

        try:
            ex = parse_example(data)
        except WireError as e:
            raise err("data", f"not a tf.train.Example ({e})", "invalid") from e
        steps = self.step_specs
        key0 = f"steps/{self.action_keys[0]}"
        if key0 not in ex:
            raise err(key0, "missing from the record", "invalid")
        if isinstance(ex.get("steps/is_first"), np.ndarray):
            num = len(ex["steps/is_first"])
        else:
            num = len(ex[key0]) // max(1, int(np.prod(steps[self.action_keys[0]].shape or (1,))))

        def get(k: str):
            if f"steps/{k}" not in ex:
                raise err(f"steps/{k}", "missing from the record", "invalid")
            return decode_steps(ex[f"steps/{k}"], steps[k], num, key=f"steps/{k}", file=path, episode=episode)

        actions = np.concatenate([np.asarray(get(k), np.float32).reshape(num, -1) for k in self.action_keys], 1)
        state = np.concatenate([np.asarray(get(k), np.float32).reshape(num, -1) for k in self.state_keys], 1) \
            if self.state_keys else np.zeros((num, 0), np.float32)
        for name, arr, keys in (("action", actions, self.action_keys), ("state", state, self.state_keys)):
            bad = ~np.isfinite(arr)
            if bad.any():
                t, d = (int(v) for v in np.argwhere(bad)[0])
                raise err(f"steps/{keys[0]}" if len(keys) == 1 else f"steps/{'+'.join(keys)}",
                          f"non-finite {name} value {arr[t, d]} at step {t}, dim {d}", "non_finite")
        if num == 0:
            raise err(key0, "episode has no steps", "invalid")
        get(self.image_key)  # checks one encoded image per step
        texts = [] if f"steps/{self.instruction_key}" not in ex else get(self.instruction_key)
        task = next((t.decode("utf-8") for t in texts if t.strip()), "")
        if not task:
            raise err(" or ".join(f"steps/{k}" for k in INSTRUCTION_KEYS), "no language instruction "
                      "(absent or empty at every step)", "missing_instruction")
        if task not in self._task_ids:
            self._task_ids[task] = len(self.tasks)
            self.tasks.append(task)
        self._episodes.append({"file": path, "offset": offset, "episode": episode, "actions": actions,
                               "state": state, "task_index": self._task_ids[task]})

    def _compute_stats(self) -> dict:
        if not self._episodes:
            return {}
        out = {"action": compute_stats(np.concatenate([e["actions"] for e in self._episodes]))}
        if self.state_keys:
            out["state"] = compute_stats(np.concatenate([e["state"] for e in self._episodes]))
        return out

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _images(self, ep: dict) -> list[bytes]:
        key = (str(ep["file"]), ep["offset"])
        if self._cache is None or self._cache[0] != key:
            data = read_record_at(ep["file"], ep["offset"], index=ep["episode"], verify=False)
            self._cache = (key, parse_example(data)[f"steps/{self.image_key}"])
        return self._cache[1]

    def image(self, i: int) -> np.ndarray:
        """uint8 ``(H, W, 3)`` image of frame ``i``, decoded with Pillow (JPEG or PNG)."""
        e, t = locate(self._starts, i)
        return np.asarray(Image.open(io.BytesIO(self._images(self._episodes[e])[t])).convert("RGB"))

    def __getitem__(self, i: int) -> dict:
        i = check_index(i, len(self), "RLDSDataset")
        e, t = locate(self._starts, i)
        ep = self._episodes[e]
        rows, is_pad = action_window(t, len(ep["actions"]), self.action_horizon)
        task_index = ep["task_index"]
        return {
            "image": torch.from_numpy(self.image(i).copy()),
            "state": torch.from_numpy(ep["state"][t].copy()),
            "actions": torch.from_numpy(ep["actions"][rows]),
            "action_is_pad": torch.from_numpy(is_pad),
            "task": self.tasks[task_index],
            "task_index": task_index,
            "episode_index": ep["episode"],
            "frame_index": t,
        }
