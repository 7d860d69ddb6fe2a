"""Read a local LeRobot v3.0 dataset into memory as a map-style torch Dataset.

Legend: ``N`` frames, ``H``/``W`` image size, ``A`` action horizon, ``D`` width.
"""

from __future__ import annotations

import io
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from . import _lerobot_format as fmt
from ._lerobot_meta import V21_VERSIONS, read_stats
from ._lerobot_time import DEFAULT_TOLERANCE_S, check_frame_timestamps, check_tolerance
from ._windows import action_window, check_index

__all__ = ["LeRobotDataset", "DEFAULT_PRELOAD_MAX_BYTES"]

DEFAULT_PRELOAD_MAX_BYTES = 2 * 1024**3
"""Decode all images once at init when ``N*H*W*3`` bytes stay below this (2 GiB)."""


def _load_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"LeRobot dataset file missing: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def _read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    if not path.is_file():
        raise FileNotFoundError(f"LeRobot dataset file missing: {path}")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: cannot read parquet ({e})") from e
    return table if columns is None else _select(table, columns, path)


def _select(table: pa.Table, columns: list[str], path: Path) -> pa.Table:
    absent = [c for c in columns if c not in table.column_names]
    if absent:
        raise ValueError(f"{path}: missing columns {absent} (has {table.column_names})")
    return table.select(columns)


def _to_numpy(col: pa.ChunkedArray, width: int | None) -> np.ndarray:
    arr = col.combine_chunks()
    if width is None:
        return arr.to_numpy(zero_copy_only=False)
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), width)


def _decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def convert_hint(root: Path, version: object) -> str:
    """What to do with a LeRobot dataset of another ``codebase_version``: the exact ``lf data convert`` command."""
    if version in V21_VERSIONS:
        dst = root.with_name(f"{root.name}-v3.0")
        return (f"convert it with `lf data convert {shlex.quote(str(root))} {shlex.quote(str(dst))}` "
                f"(LeRobot {version} -> v3.0, into a new folder) and read that folder instead")
    return "lf reads LeRobot v3.0 and converts v2.0 / v2.1 with `lf data convert <in> <out>`"


class LeRobotDataset(torch.utils.data.Dataset):
    """Frames of a local LeRobot v3.0 dataset with action chunks (map-style, in memory).

    Parquet columns are loaded once as numpy arrays. Images (``dtype="image"``,
    PNG bytes) are decoded once at init into one uint8 ``(N, H, W, 3)`` array
    when that array is below ``preload_max_bytes`` (default 2 GiB: 64x64 images
    fit 170k frames), else decoded per ``__getitem__``. Video features are not
    supported.

    ``actions[j]`` is the action at frame ``t + j`` of the same episode; past the
    episode end the last action is repeated and ``action_is_pad[j]`` is True
    (LeRobot's ``delta_timestamps`` padding convention).

    Args:
        root: dataset folder (holds ``meta/info.json``).
        action_horizon: ``A`` >= 1, actions per sample.
        episodes: episode indices to keep (order kept), default all.
        tasks: task strings to keep (``LeRobotDataset.tasks`` values), default all: an episode is kept when the
            task of its first frame is one of them (LeRobot records one task per episode).
        max_frames: keep the first ``max_frames`` >= 1 frames of each episode, default all; the action
            chunks of a cut episode end at its last kept frame (padded past it, as at a real end).
        image_key / state_key / action_key: feature names to read.
        preload_max_bytes: threshold for decoding all images at init.
        tolerance_s: accepted distance in seconds of a frame's ``timestamp`` from ``frame_index / fps``
            (LeRobot's ``tolerance_s``, default 1e-4; see :mod:`lf_data._lerobot_time`).

    Raises:
        FileNotFoundError: a metadata or data file is missing (message names it).
        ValueError: ``codebase_version`` is not "v3.0", a file is corrupt or
            inconsistent, a feature is missing, an episode index is unknown, a task in
            ``tasks`` is not in the dataset or has no selected episode (the message lists the
            dataset's tasks), ``max_frames`` < 1, or a frame's ``timestamp`` is off the frame grid (a
            :class:`DataError` naming the data file, episode, frame and drift in seconds).

    Example:
        >>> ds = LeRobotDataset("data/mw", action_horizon=8)  # doctest: +SKIP
        >>> ds[0]["actions"].shape  # doctest: +SKIP
        torch.Size([8, 4])
    """

    def __init__(
        self,
        root: str | Path,
        *,
        action_horizon: int = 1,
        episodes: Sequence[int] | None = None,
        tasks: Sequence[str] | None = None,
        max_frames: int | None = None,
        image_key: str = "observation.image",
        state_key: str = "observation.state",
        action_key: str = "action",
        preload_max_bytes: int = DEFAULT_PRELOAD_MAX_BYTES,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
    ) -> None:
        if int(action_horizon) < 1:
            raise ValueError(f"action_horizon must be >= 1, got {action_horizon}")
        if max_frames is not None and int(max_frames) < 1:
            raise ValueError(f"max_frames must be >= 1 (or None for whole episodes), got {max_frames}")
        self.root = Path(root)
        self.action_horizon = int(action_horizon)
        info_path = self.root / fmt.INFO_PATH
        self.info: dict = _load_json(info_path)
        version = self.info.get("codebase_version")
        if version != fmt.CODEBASE_VERSION:
            raise ValueError(f"{info_path}: field 'codebase_version' is {version!r}, expected "
                             f"{fmt.CODEBASE_VERSION!r}; {convert_hint(self.root, version)}")
        feats = self.info.get("features", {})
        for key in (image_key, state_key, action_key):
            if key not in feats:
                raise ValueError(f"{info_path}: feature {key!r} missing (features: {sorted(feats)})")
        if feats[image_key]["dtype"] != "image":
            raise ValueError(f"{info_path}: feature {image_key!r} has dtype {feats[image_key]['dtype']!r}; "
                             "only 'image' (PNG in parquet) is supported, not video")
        self.fps: int = int(self.info["fps"])
        self.tolerance_s = check_tolerance(tolerance_s)
        self.stats: dict = read_stats(self.root)
        tasks_path = self.root / fmt.TASKS_PATH
        task_table = _read_parquet(tasks_path)
        column = fmt.task_column(task_table)
        if column is None or "task_index" not in task_table.column_names:
            raise ValueError(f"{tasks_path}: missing columns task_index and task (or a pandas index of task "
                             f"strings), has {task_table.column_names}")
        by_index = dict(zip(task_table["task_index"].to_pylist(), task_table[column].to_pylist(), strict=True))
        if sorted(by_index) != list(range(len(by_index))):
            raise ValueError(f"{tasks_path}: task_index values are not 0..{len(by_index) - 1}")
        self.tasks: list[str] = [by_index[i] for i in range(len(by_index))]

        ep_files = sorted((self.root / "meta/episodes").glob("*/*.parquet"))
        if not ep_files:
            raise FileNotFoundError(f"LeRobot dataset file missing: {self.root}/meta/episodes/chunk-*/file-*.parquet")
        ep_cols = ["episode_index", "dataset_from_index", "dataset_to_index"]
        eps = pa.concat_tables([_read_parquet(p, ep_cols) for p in ep_files]).to_pydict()
        bounds = {e: (a, b) for e, a, b in zip(*(eps[c] for c in ep_cols), strict=True)}
        chosen = sorted(bounds) if episodes is None else [int(e) for e in episodes]
        unknown = [e for e in chosen if e not in bounds]
        if unknown or len(set(chosen)) != len(chosen):
            raise ValueError(f"{self.root}: episodes must be distinct indices of its episodes "
                             f"{sorted(bounds)[:5]}...{max(bounds)} ({len(bounds)} episodes), got unknown={unknown} "
                             "or duplicates")

        self._load_frames(feats, image_key, state_key, action_key)
        if tasks is not None:
            chosen = self._episodes_of_tasks(list(tasks), chosen, bounds)
        rows, stops, ranges, pos = [], [], [], 0
        for e in chosen:
            a, b = bounds[e]
            b = b if max_frames is None else min(b, a + int(max_frames))
            ranges.append((pos, pos + b - a))
            pos += b - a
            rows.append(np.arange(a, b))
            stops.append(np.full(b - a, b))
        self._rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        self._stops = np.concatenate(stops) if stops else np.zeros(0, np.int64)
        self.episode_ranges: list[tuple[int, int]] = ranges
        """(start, stop) positions of each selected episode in this dataset's index space."""
        self.num_episodes = len(chosen)
        h, w, c = feats[image_key]["shape"]
        if len(self._rows) * h * w * c < preload_max_bytes:
            self._images = np.stack([_decode(self._png[r].as_py()) for r in self._rows]) if len(self._rows) \
                else np.zeros((0, h, w, c), np.uint8)
            self._png = None

    def _episodes_of_tasks(self, tasks: list[str], chosen: list[int], bounds: dict) -> list[int]:
        """The episodes of ``chosen`` whose first frame's task is in ``tasks`` (order kept)."""
        def listed() -> str:
            shown = ", ".join(repr(t) for t in self.tasks[:20])
            return f"{shown}, ... ({len(self.tasks)} in all)" if len(self.tasks) > 20 else shown

        unknown = [t for t in tasks if t not in self.tasks]
        if unknown:
            raise ValueError(f"{self.root}: task {unknown[0]!r} is not in the dataset (its tasks: {listed()})")
        wanted = {self.tasks.index(t) for t in tasks}
        kept = [e for e in chosen if int(self._task[bounds[e][0]]) in wanted]
        found = {int(self._task[bounds[e][0]]) for e in kept}
        empty = [t for t in tasks if self.tasks.index(t) not in found]
        if empty:
            raise ValueError(f"{self.root}: task {empty[0]!r} has no episode among the selected "
                             f"{len(chosen)} (its tasks: {listed()})")
        return kept

    def _load_frames(self, feats: dict, image_key: str, state_key: str, action_key: str) -> None:
        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            raise FileNotFoundError(f"LeRobot dataset file missing: {self.root / 'data'}/chunk-*/file-*.parquet")
        cols = [image_key, state_key, action_key, "episode_index", "frame_index", "index", "task_index"]
        tables = []
        for p in files:
            table = _read_parquet(p)
            tables.append(_select(table, cols, p))
            if "timestamp" in table.column_names:
                check_frame_timestamps(table["timestamp"].to_numpy(), table["frame_index"].to_numpy(),
                                       table["episode_index"].to_numpy(), self.fps, self.tolerance_s, file=p)
        table = pa.concat_tables(tables)
        index = _to_numpy(table["index"], None)
        if not np.array_equal(index, np.arange(len(index))):
            bad = files[np.searchsorted(np.cumsum([len(t) for t in tables]),
                                        int(np.argmax(index != np.arange(len(index)))), side="right")]
            raise ValueError(f"{bad}: column 'index' is not the contiguous global frame index 0..N-1")
        total = self.info.get("total_frames")
        if total != len(index):
            raise ValueError(f"{self.root / fmt.INFO_PATH}: total_frames={total} but data files hold {len(index)} rows")
        self._state = _to_numpy(table[state_key], feats[state_key]["shape"][0]).astype(np.float32)
        self._action = _to_numpy(table[action_key], feats[action_key]["shape"][0]).astype(np.float32)
        self._episode = _to_numpy(table["episode_index"], None).astype(np.int64)
        self._frame = _to_numpy(table["frame_index"], None).astype(np.int64)
        self._task = _to_numpy(table["task_index"], None).astype(np.int64)
        self._png = table[image_key].combine_chunks().field("bytes")
        self._images = None

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def frame_actions(self) -> np.ndarray:
        """float32 ``(N, D_a)``: the action of every selected frame, in this dataset's index order (a copy)."""
        return self._action[self._rows]

    def image(self, i: int) -> np.ndarray:
        """uint8 ``(H, W, 3)`` image of frame ``i`` (this dataset's index space)."""
        if self._images is not None:
            return self._images[i]
        return _decode(self._png[int(self._rows[i])].as_py())

    def __getitem__(self, i: int) -> dict:
        i = check_index(i, len(self._rows), "LeRobotDataset")
        r, stop = int(self._rows[i]), int(self._stops[i])
        rows, is_pad = action_window(r, stop, self.action_horizon)
        task_index = int(self._task[r])
        return {
            "image": torch.from_numpy(np.array(self.image(i))),
            "state": torch.from_numpy(self._state[r].copy()),
            "actions": torch.from_numpy(self._action[rows]),
            "action_is_pad": torch.from_numpy(is_pad),
            "task": self.tasks[task_index],
            "task_index": task_index,
            "episode_index": int(self._episode[r]),
            "frame_index": int(self._frame[r]),
        }
