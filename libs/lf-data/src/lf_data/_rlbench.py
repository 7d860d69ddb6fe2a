"""RLBench stored demonstrations (``rlbench/dataset_generator.py`` layout) without rlbench.

Legend: ``T`` observations of an episode, ``A`` action horizon, ``H``/``W`` image size.

Layout (stepjam/RLBench ``backend/const.py``)::

    <root>/<task>/variation<N>/variation_descriptions.pkl      # list of str
    <root>/<task>/variation<N>/episodes/episode<M>/low_dim_obs.pkl
    <root>/<task>/variation<N>/episodes/episode<M>/<camera>_{rgb,depth,mask}/<t>.png

``low_dim_obs.pkl`` holds an ``rlbench.demo.Demo`` of ``Observation`` objects
with the images set to None; it is read with :mod:`._safe_pickle`.
Low-dimensional values are loaded at init; PNGs are decoded per item.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ._errors import DataError, ErrorPolicy, is_lfs_pointer
from ._safe_pickle import safe_load
from ._windows import action_window, check_index, locate

__all__ = ["RLBenchDataset", "DEPTH_SCALE", "decode_depth", "decode_mask"]

DEPTH_SCALE = 2**24 - 1
"""RLBench ``backend/const.py``: depth in [0, 1] is stored as a 24-bit integer in RGB."""


def decode_depth(rgb: np.ndarray, near: float, far: float) -> np.ndarray:
    """Metric depth from an RLBench depth PNG (``rlbench/utils.py`` ``get_stored_demos``).

    ``d = (R * 65536 + G * 256 + B) / (2**24 - 1)`` (``image_to_float_array``
    with ``DEPTH_SCALE``), then ``near + d * (far - near)`` metres, computed in
    float64 and returned as float32 ``(H, W)``.

    Example:
        >>> decode_depth(np.array([[[255, 255, 255]]], np.uint8), 0.1, 3.1)
        array([[3.1]], dtype=float32)
    """
    code = rgb[..., 0].astype(np.int64) * 65536 + rgb[..., 1].astype(np.int64) * 256 + rgb[..., 2]
    return (near + code / DEPTH_SCALE * (far - near)).astype(np.float32)


def decode_mask(rgb: np.ndarray) -> np.ndarray:
    """Object handles ``R + 256 G + 65536 B`` (int32 ``(H, W)``) from an RLBench mask PNG.

    RLBench writes ``(rgb_coded_handles * 255).astype(uint8)`` and decodes with
    ``rgb_handles_to_mask`` (same formula after scaling by 255, which on the
    uint8 array it reads back wraps around); this applies the formula to the
    stored bytes.
    """
    return (rgb[..., 0].astype(np.int32) + rgb[..., 1].astype(np.int32) * 256
            + rgb[..., 2].astype(np.int32) * 65536)


def _numbered(folder: Path, prefix: str) -> list[tuple[int, Path]]:
    pat = re.compile(rf"{prefix}(\d+)$")
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := pat.match(p.name))]
    return sorted(found)


class RLBenchDataset(torch.utils.data.Dataset):
    """Frames of RLBench stored demos, in LeRobotDataset's sample schema.

    RLBench demos store observations only, no actions. As in the usual
    behaviour-cloning pipelines on RLBench (ARM / C2F-ARM / PerAct derive the
    action of step ``t`` from observation ``t + 1``), the action of frame ``t``
    is the *next* observation's target: ``action_space="joint"`` ->
    ``joint_positions[t+1]`` (7) + ``gripper_open[t+1]`` (1);
    ``"ee_pose"`` -> ``gripper_pose[t+1]`` (xyz + quaternion xyzw, 7) +
    ``gripper_open[t+1]``. So an episode of ``T`` observations gives ``T - 1``
    frames. State: ``joint_positions[t]`` (7) + ``gripper_open[t]`` (1), float32.

    ``ds[i]`` -> ``{"image": uint8 (H, W, 3) (RGB of cameras[0]), "state":
    float32 (8,), "actions": float32 (A, 8), "action_is_pad": bool (A,),
    "task": str, "task_index": int, "episode_index": int, "frame_index": int,
    "variation": int}``, plus ``"images"`` ``{camera: uint8 (H, W, 3)}`` when
    several cameras are read, ``"depth"`` ``{camera: float32 (H, W) metres}``
    when ``depth=True`` and ``"mask"`` ``{camera: int32 (H, W) handles}`` when
    ``mask=True``. ``task`` is the variation's first description (the others
    are paraphrases; all are in ``descriptions``).

    Args:
        root: folder holding one folder per task.
        tasks: task folder names (default: all, sorted).
        cameras: camera names (``front``, ``left_shoulder``, ``right_shoulder``, ``overhead``, ``wrist``).
        action_horizon: ``A`` >= 1; past the episode end the last action repeats, padded.
        action_space: ``"joint"`` or ``"ee_pose"``.
        depth / mask: also decode depth (needs ``misc[<camera>_camera_near/far]``) / masks.
        on_error: ``"raise"`` or ``"skip"`` (episode skipped, counted in ``skipped``).

    Raises:
        DataError: a pickle naming a class outside the allow list, a Git LFS
            pointer file, a PNG count that differs from the observations,
            NaN/inf values, a missing or empty ``variation_descriptions.pkl``,
            a missing field: the message names file, episode and field.

    Example:
        >>> ds = RLBenchDataset("rlbench/train", tasks=["reach_target"], action_horizon=4)  # doctest: +SKIP
        >>> ds[0]["actions"].shape  # doctest: +SKIP
        torch.Size([4, 8])
    """

    def __init__(self, root: str | Path, *, tasks: Sequence[str] | None = None, cameras: Sequence[str] = ("front",),
                 action_horizon: int = 1, action_space: str = "joint", depth: bool = False, mask: bool = False,
                 on_error: str = "raise") -> None:
        if int(action_horizon) < 1:
            raise ValueError(f"RLBenchDataset: action_horizon must be >= 1, got {action_horizon}")
        if action_space not in ("joint", "ee_pose"):
            raise ValueError(f"RLBenchDataset: action_space must be 'joint' or 'ee_pose', got {action_space!r}")
        if not cameras:
            raise ValueError("RLBenchDataset: cameras must name at least one camera, got an empty sequence")
        self._policy = ErrorPolicy(on_error)
        self.root, self.cameras = Path(root), tuple(cameras)
        self.action_horizon, self.action_space = int(action_horizon), action_space
        self.depth, self.mask = bool(depth), bool(mask)
        if not self.root.is_dir():
            raise FileNotFoundError(f"RLBench dataset folder missing: {self.root}")
        names = sorted(p.name for p in self.root.iterdir() if p.is_dir()) if tasks is None else list(tasks)
        self.tasks: list[str] = []
        self.descriptions: dict[tuple[str, int], list[str]] = {}
        self._episodes: list[dict] = []
        count = 0
        for task in names:
            if not (self.root / task).is_dir():
                raise FileNotFoundError(f"RLBench task folder missing: {self.root / task}")
            for var, vdir in _numbered(self.root / task, "variation"):
                eps = _numbered(vdir / "episodes", "episode") if (vdir / "episodes").is_dir() else []
                for _, edir in eps:
                    try:
                        self._add_episode(task, var, vdir, edir, count)
                    except DataError as e:
                        self._policy.handle(e)
                    count += 1
        lengths = np.array([len(e["state"]) - 1 for e in self._episodes], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.num_episodes = len(self._episodes)
        self.episode_ranges = [(int(a), int(b)) for a, b in zip(self._starts[:-1], self._starts[1:], strict=True)]

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped episodes per reason (``on_error="skip"``)."""
        return dict(self._policy.skipped)

    @property
    def problems(self) -> list[str]:
        """Messages of everything skipped."""
        return list(self._policy.problems)

    def _descriptions(self, task: str, var: int, vdir: Path, episode: str) -> list[str]:
        if (task, var) not in self.descriptions:
            path = vdir / "variation_descriptions.pkl"
            if not path.is_file():
                raise DataError(f"{path}: missing, so episode {episode} has no language instruction "
                                "(field 'variation_descriptions')", file=path, episode=episode,
                                field="variation_descriptions", reason="missing_instruction")
            desc = safe_load(path, episode=episode)
            if not isinstance(desc, list | tuple) or not [d for d in desc if isinstance(d, str) and d.strip()]:
                raise DataError(f"{path}: episode {episode} field 'variation_descriptions': no language "
                                f"instruction (got {desc!r:.80})", file=path, episode=episode,
                                field="variation_descriptions", reason="missing_instruction")
            self.descriptions[(task, var)] = [d for d in desc if isinstance(d, str) and d.strip()]
        return self.descriptions[(task, var)]

    def _add_episode(self, task: str, var: int, vdir: Path, edir: Path, index: int) -> None:
        name = f"{task}/variation{var}/{edir.name}"
        pkl = edir / "low_dim_obs.pkl"

        def err(field: str, msg: str, reason: str, file: Path = pkl) -> DataError:
            return DataError(f"{file}: episode {name} field {field!r}: {msg}", file=file, episode=name,
                             field=field, reason=reason)

        if not pkl.is_file():
            raise err("low_dim_obs.pkl", "file missing", "missing_file")
        demo = safe_load(pkl, episode=name)
        obs = getattr(demo, "_observations", demo)
        if not isinstance(obs, list) or len(obs) < 2:
            raise err("_observations", f"expected a list of at least 2 observations, got {type(obs).__name__}"
                      f"{f' of {len(obs)}' if isinstance(obs, list) else ''}", "invalid")
        pose = "joint_positions" if self.action_space == "joint" else "gripper_pose"
        rows = {}
        for field in dict.fromkeys(("joint_positions", "gripper_open", pose)):
            try:
                vals = [np.asarray(getattr(o, field), np.float64).reshape(-1) for o in obs]
                rows[field] = np.stack(vals)
            except (AttributeError, TypeError, ValueError) as e:
                raise err(field, f"missing or not numeric in some observation ({e})", "invalid") from e
            bad = ~np.isfinite(rows[field])
            if bad.any():
                t = int(np.argwhere(bad)[0][0])
                raise err(field, f"non-finite value {rows[field][bad][0]} at step {t}", "non_finite")
        state = np.concatenate([rows["joint_positions"], rows["gripper_open"][:, :1]], 1).astype(np.float32)
        target = np.concatenate([rows[pose], rows["gripper_open"][:, :1]], 1).astype(np.float32)
        near_far = {}
        for cam in self.cameras:
            kinds = ["rgb"] + (["depth"] if self.depth else []) + (["mask"] if self.mask else [])
            for kind in kinds:
                folder = edir / f"{cam}_{kind}"
                files = sorted(folder.glob("*.png")) if folder.is_dir() else []
                if len(files) != len(obs) or any(not (folder / f"{t}.png").is_file() for t in range(len(obs))):
                    raise err(f"{cam}_{kind}", f"{len(files)} PNGs in {folder}, expected 0.png..{len(obs) - 1}.png "
                              f"(one per observation)", "frame_count", folder)
                lfs = next((f for f in files if is_lfs_pointer(f)), None)
                if lfs is not None:
                    raise err(f"{cam}_{kind}", "is a Git LFS pointer file, not a PNG", "lfs_pointer", lfs)
            if self.depth:
                try:
                    near_far[cam] = np.array([[o.misc[f"{cam}_camera_near"], o.misc[f"{cam}_camera_far"]]
                                              for o in obs], np.float64)
                except (AttributeError, KeyError, TypeError) as e:
                    raise err(f"misc[{cam}_camera_near/far]", f"needed to decode depth, missing ({e!r})",
                              "invalid") from e
        descs = self._descriptions(task, var, vdir, name)
        if descs[0] not in self.tasks:
            self.tasks.append(descs[0])
        self._episodes.append({"dir": edir, "index": index, "variation": var, "state": state, "target": target,
                               "near_far": near_far, "task_index": self.tasks.index(descs[0])})

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _png(self, ep: dict, folder: str, t: int) -> np.ndarray:
        path = ep["dir"] / folder / f"{t}.png"
        try:
            with Image.open(path) as im:
                return np.asarray(im.convert("RGB"))
        except OSError as e:
            raise DataError(f"{path}: episode {ep['dir']} field {folder!r}: cannot decode PNG ({e})", file=path,
                            episode=str(ep["dir"]), field=folder, reason="invalid") from e

    def __getitem__(self, i: int) -> dict:
        i = check_index(i, len(self), "RLBenchDataset")
        e, t = locate(self._starts, i)
        ep = self._episodes[e]
        rows, is_pad = action_window(t, len(ep["state"]) - 1, self.action_horizon)
        rgb = {c: torch.from_numpy(self._png(ep, f"{c}_rgb", t).copy()) for c in self.cameras}
        item = {
            "image": rgb[self.cameras[0]],
            "state": torch.from_numpy(ep["state"][t].copy()),
            "actions": torch.from_numpy(ep["target"][rows + 1]),
            "action_is_pad": torch.from_numpy(is_pad),
            "task": self.tasks[ep["task_index"]],
            "task_index": ep["task_index"],
            "episode_index": ep["index"],
            "frame_index": t,
            "variation": ep["variation"],
        }
        if len(self.cameras) > 1:
            item["images"] = rgb
        if self.depth:
            item["depth"] = {c: torch.from_numpy(decode_depth(self._png(ep, f"{c}_depth", t), *ep["near_far"][c][t]))
                             for c in self.cameras}
        if self.mask:
            item["mask"] = {c: torch.from_numpy(decode_mask(self._png(ep, f"{c}_mask", t))) for c in self.cameras}
        return item
