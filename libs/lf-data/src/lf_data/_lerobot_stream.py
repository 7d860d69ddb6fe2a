"""Stream samples from a LeRobot v2.1 or v3.0 dataset (parquet frames, mp4 video or PNG image features).

Memory holds one data file's table (LeRobot caps data files at 100 MB) and a
few decoded blocks of video frames, never the dataset. Legend: ``T`` frames of
an episode, ``K`` offsets of a window, ``D`` feature width, ``H``/``W`` image size.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from ._errors import DataError, ErrorPolicy, is_lfs_pointer
from ._lerobot_meta import EpisodeMeta, load_lerobot_meta
from ._lerobot_time import DEFAULT_TOLERANCE_S, check_frame_timestamps, check_tolerance, check_video_span
from ._video import count_frames, read_video_frames

__all__ = ["LeRobotStream", "delta_indices"]

VIDEO_BLOCK = 32
"""Frames decoded per video read; two blocks per camera stay cached."""


def delta_indices(delta_timestamps: Mapping[str, Sequence[float]], fps: int, tol_s: float = 1e-4) -> dict:
    """Integer frame offsets of LeRobot ``delta_timestamps`` (seconds), checked to fall on frames.

    Raises:
        ValueError: an offset is not a multiple of ``1 / fps`` within ``tol_s`` (names the key and value).
    """
    out = {}
    for key, deltas in delta_timestamps.items():
        idx = []
        for d in deltas:
            k = round(float(d) * fps)
            if abs(k / fps - float(d)) > tol_s:
                raise ValueError(f"delta_timestamps[{key!r}]: {d} s is not a multiple of 1/fps = {1 / fps:.6g} s")
            idx.append(k)
        out[key] = np.asarray(idx, np.int64)
    return out


class _Frames:
    """Decoded frames of one video feature of one episode, by block, LRU of two blocks."""

    def __init__(self, path: Path, first: int, fps: int, key: str, episode: int) -> None:
        self.path, self.first, self.fps, self.key, self.episode = path, first, fps, key, episode
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.length = 0

    def get(self, t: int) -> np.ndarray:
        b = t // VIDEO_BLOCK
        if b not in self.blocks:
            idx = self.first + np.arange(b * VIDEO_BLOCK, min((b + 1) * VIDEO_BLOCK, self.length))
            self.blocks[b] = read_video_frames(self.path, idx, fps=self.fps, field=self.key, episode=self.episode)
            while len(self.blocks) > 2:
                self.blocks.popitem(last=False)
        self.blocks.move_to_end(b)
        return self.blocks[b][t - b * VIDEO_BLOCK]


class LeRobotStream(torch.utils.data.IterableDataset):
    """Samples of a local LeRobot dataset, codebase v2.1 (or v2.0) or v3.0, streamed episode by episode.

    Detects the version from ``meta/info.json``. Video features (``dtype="video"``)
    are decoded with PyAV by integer frame index (see :mod:`lf_data._video`);
    image features (``dtype="image"``) are PNGs in the parquet.

    Each sample: ``image`` uint8 ``(H, W, 3)`` (feature ``image_key``), ``state``
    float32 ``(D_s,)``, ``actions`` float32 ``(A, D_a)`` with ``action_is_pad`` bool
    ``(A,)`` (frames past the episode end repeat the last action), ``task``,
    ``task_index``, ``episode_index``, ``frame_index``; and for every key of
    ``delta_timestamps`` the window ``sample[key]`` ``(K, ...)`` with
    ``sample[key + "_is_pad"]`` ``(K,)`` (offsets outside the episode are clamped to
    its first/last frame and marked, as LeRobot does).

    Bad input is a :class:`DataError` naming the file, episode and field, raised
    (``on_error="raise"``) or skipped per episode and counted in ``skipped``
    (``"skip"``): missing data/video files (``missing_file``), Git LFS pointers
    (``lfs_pointer``), video frame counts or parquet rows that differ from the
    episode length (``frame_count``), NaN/inf actions or states (``non_finite``),
    episodes without a task (``missing_instruction``), timestamps off the frame grid
    ``frame_index / fps`` by more than ``tolerance_s`` (``timestamp``: a v3.0
    ``videos/<key>/from_timestamp`` or ``to_timestamp`` in ``meta/episodes``, checked at
    init, or a frame's ``timestamp``; see :mod:`lf_data._lerobot_time`). Files are
    checked at init (headers only), values when an episode is read.

    Args:
        root: dataset folder.
        image_key: visual feature for ``image``; default the first video or image
            feature, ``None`` in a dataset without one (no ``image`` then).
        state_key / action_key: vector features.
        action_horizon: ``A`` >= 1.
        delta_timestamps: ``{feature: [seconds, ...]}`` windows, multiples of ``1/fps``.
        episodes: episode indices to read (order kept), default all.
        rank / world_size: read only episodes ``rank::world_size`` of the list
            (DataLoader workers split it further).
        on_error: ``"raise"`` or ``"skip"``.
        tolerance_s: accepted distance in seconds of a timestamp from its frame-grid point (LeRobot's
            ``tolerance_s``, default 1e-4).

    Raises:
        DataError: bad metadata, unknown feature or episode, or bad input under ``on_error="raise"``.
        ValueError: ``action_horizon`` < 1, ``rank`` outside ``[0, world_size)``, ``tolerance_s`` < 0.
    """

    def __init__(self, root: str | Path, *, image_key: str | None = "", state_key: str = "observation.state",
                 action_key: str = "action", action_horizon: int = 1,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                 episodes: Sequence[int] | None = None, rank: int = 0, world_size: int = 1,
                 on_error: str = "raise", tolerance_s: float = DEFAULT_TOLERANCE_S) -> None:
        super().__init__()
        self.tolerance_s = check_tolerance(tolerance_s)
        self.meta = load_lerobot_meta(root)
        self._policy = ErrorPolicy(on_error)
        feats, info_path = self.meta.features, self.meta.root / "meta/info.json"
        visual = [k for k, ft in feats.items() if ft.get("dtype") in ("video", "image")]
        self.image_key = (visual[0] if visual else None) if image_key == "" else image_key
        keys = [k for k in (self.image_key, state_key, action_key, *(delta_timestamps or {})) if k is not None]
        for key in keys:
            if key not in feats:
                raise DataError(f"{info_path}: feature {key!r} missing (features: {sorted(feats)})",
                                file=info_path, field=key)
        if int(action_horizon) < 1:
            raise ValueError(f"action_horizon must be >= 1, got {action_horizon}")
        self.state_key, self.action_key, self.action_horizon = state_key, action_key, int(action_horizon)
        self.deltas = delta_indices(delta_timestamps or {}, self.meta.fps)
        by_index = {m.index: m for m in self.meta.episodes}
        chosen = [m.index for m in self.meta.episodes] if episodes is None else [int(e) for e in episodes]
        unknown = [e for e in chosen if e not in by_index]
        if unknown:
            raise DataError(f"{self.meta.root}: episodes {unknown} are not in the dataset "
                            f"({len(by_index)} episodes)", file=self.meta.root)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
        self._video_frames: dict[Path, int] = {}
        self.episodes: list[EpisodeMeta] = []
        """Episodes that passed the file checks, in reading order (this rank's share)."""
        for e in chosen[rank::world_size]:
            try:
                self._check_files(by_index[e])
                self.episodes.append(by_index[e])
            except DataError as err:
                self._policy.handle(err)
        self._table: tuple[Path, pa.Table] | None = None

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped episodes by reason (``on_error="skip"``)."""
        return dict(self._policy.skipped)

    @property
    def problems(self) -> list[str]:
        """Messages of the skipped items, in order."""
        return list(self._policy.problems)

    @property
    def errors(self) -> list[DataError]:
        """The skipped items' errors, in order (file, episode, field and reason of each)."""
        return list(self._policy.errors)

    @property
    def num_frames(self) -> int:
        """Frames of the episodes that passed the file checks (declared lengths)."""
        return sum(m.length for m in self.episodes)

    def _check_files(self, m: EpisodeMeta) -> None:
        if not m.tasks or not all(isinstance(t, str) and t.strip() for t in m.tasks):
            raise DataError(f"{self.meta.root}: episode {m.index} has no language instruction (tasks={m.tasks})",
                            file=self.meta.root, episode=m.index, field="tasks", reason="missing_instruction")
        for path, key in [(m.data_file, None), *((p, k) for k, (p, _) in m.videos.items())]:
            what = "data file" if key is None else f"video of feature {key!r}"
            if not path.is_file():
                raise DataError(f"{path}: {what} missing (episode {m.index})", file=path, episode=m.index,
                                field=key, reason="missing_file")
            if is_lfs_pointer(path):
                raise DataError(f"{path}: Git LFS pointer file in place of the {what} (episode {m.index}; "
                                "run `git lfs pull`)", file=path, episode=m.index, field=key, reason="lfs_pointer")
        for key, (start, stop) in m.video_spans.items():
            check_video_span(m.meta_file, m.index, key, start, stop, m.length, self.meta.fps, self.tolerance_s)
        for key, (path, first) in m.videos.items():
            if path not in self._video_frames:
                self._video_frames[path] = count_frames(path, field=key, episode=m.index).frames
            n = self._video_frames[path]
            if (first + m.length > n) or (first == 0 and self.meta.version != "v3.0" and n != m.length):
                raise DataError(f"{path}: video holds {n} frames, episode {m.index} needs frames {first}.."
                                f"{first + m.length - 1} (length {m.length}, feature {key!r})", file=path,
                                episode=m.index, field=key, reason="frame_count")

    def _rows(self, m: EpisodeMeta) -> pa.Table:
        if self._table is None or self._table[0] != m.data_file:
            try:
                self._table = (m.data_file, pq.read_table(m.data_file, memory_map=True))
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{m.data_file}: cannot read parquet (episode {m.index}): {e}", file=m.data_file,
                                episode=m.index) from e
        table = self._table[1]
        rows = table.slice(m.row_start, m.length)
        ep_col = rows.column("episode_index").to_numpy() if "episode_index" in table.column_names else None
        if len(rows) != m.length or (ep_col is not None and not (ep_col == m.index).all()):
            got = int((ep_col == m.index).sum()) if ep_col is not None else len(rows)
            raise DataError(f"{m.data_file}: episode {m.index} has {got} rows from row {m.row_start}, metadata "
                            f"says length {m.length}", file=m.data_file, episode=m.index, field="episode_index",
                            reason="frame_count")
        if "timestamp" in table.column_names:
            check_frame_timestamps(rows.column("timestamp").to_numpy(), rows.column("frame_index").to_numpy(),
                                   np.full(len(rows), m.index), self.meta.fps, self.tolerance_s, file=m.data_file)
        return rows

    def _column(self, rows: pa.Table, key: str, m: EpisodeMeta) -> np.ndarray:
        ft = self.meta.features[key]
        col = rows.column(key).combine_chunks()
        if ft["dtype"] == "image":
            return np.stack([np.asarray(Image.open(io.BytesIO(v["bytes"])).convert("RGB")) for v in col.to_pylist()])
        if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
            arr = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), -1)
        else:
            arr = col.to_numpy(zero_copy_only=False)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            t = int(np.argwhere(~np.isfinite(arr.reshape(len(arr), -1)))[0, 0])
            raise DataError(f"{m.data_file}: NaN/inf in feature {key!r} of episode {m.index} at frame {t}",
                            file=m.data_file, episode=m.index, field=key, record=t, reason="non_finite")
        return arr.astype(np.float32) if arr.dtype.kind == "f" else arr

    def read_episode(self, m: EpisodeMeta) -> dict:
        """The episode's columns as numpy (visual features as lazy frame getters), after value checks.

        Raises:
            DataError: row count, NaN/inf or decode problems (always raised; ``__iter__`` applies the policy).
        """
        rows = self._rows(m)
        cols = {k: self._column(rows, k, m) for k in {self.state_key, self.action_key, *self.deltas} & set(
            rows.column_names)}
        cols["task_index"] = rows.column("task_index").to_numpy()
        cols["frame_index"] = rows.column("frame_index").to_numpy()
        if self.image_key is not None and self.image_key not in cols:
            cols[self.image_key] = self._column(rows, self.image_key, m) \
                if self.meta.features[self.image_key]["dtype"] == "image" else None
        frames = {k: _Frames(p, first, self.meta.fps, k, m.index) for k, (p, first) in m.videos.items()}
        for f in frames.values():
            f.length = m.length
        bad = [int(t) for t in np.unique(cols["task_index"]) if not 0 <= t < len(self.meta.tasks)
               or not self.meta.tasks[t].strip()]
        if bad:
            raise DataError(f"{m.data_file}: episode {m.index} has task_index {bad[0]} without a task string "
                            f"(tasks: {len(self.meta.tasks)})", file=m.data_file, episode=m.index,
                            field="task_index", reason="missing_instruction")
        return {"columns": cols, "videos": frames}

    def episode_arrays(self, m: EpisodeMeta, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Whole-episode arrays ``(T, ...)`` of ``keys`` (video features decoded to uint8 ``(T, H, W, 3)``).

        Raises:
            DataError: missing file, row count, NaN/inf or decode problems (always raised).
        """
        rows = self._rows(m)
        out = {}
        for key in keys:
            if key in m.videos:
                path, first = m.videos[key]
                out[key] = read_video_frames(path, first + np.arange(m.length), fps=self.meta.fps, field=key,
                                             episode=m.index)
            else:
                out[key] = self._column(rows, key, m)
        return out

    def _visual(self, ep: dict, key: str, t: int) -> np.ndarray:
        if key in ep["videos"]:
            return ep["videos"][key].get(t)
        return ep["columns"][key][t]

    def _samples(self, m: EpisodeMeta, ep: dict) -> Iterator[dict]:
        cols, n = ep["columns"], m.length
        for t in range(n):
            want = t + np.arange(self.action_horizon)
            s = {"state": torch.from_numpy(cols[self.state_key][t].copy()),
                 "actions": torch.from_numpy(cols[self.action_key][np.minimum(want, n - 1)]),
                 "action_is_pad": torch.from_numpy(want >= n)}
            if self.image_key is not None:
                s["image"] = torch.from_numpy(np.array(self._visual(ep, self.image_key, t)))
            for key, offs in self.deltas.items():
                idx = t + offs
                clamped = np.clip(idx, 0, n - 1)
                if self.meta.features[key]["dtype"] in ("video", "image"):
                    win = np.stack([self._visual(ep, key, int(i)) for i in clamped])
                else:
                    win = cols[key][clamped]
                s[key] = torch.from_numpy(np.array(win))
                s[f"{key}_is_pad"] = torch.from_numpy((idx < 0) | (idx >= n))
            ti = int(cols["task_index"][t])
            s.update(task=self.meta.tasks[ti], task_index=ti, episode_index=m.index,
                     frame_index=int(cols["frame_index"][t]))
            yield s

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        mine = self.episodes if info is None else self.episodes[info.id::info.num_workers]
        for m in mine:
            try:
                ep = self.read_episode(m)
            except DataError as err:
                self._policy.handle(err)
                continue
            samples = self._samples(m, ep)
            while True:  # a video that fails mid-episode ends the episode; what was yielded is correct
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                except DataError as err:
                    self._policy.handle(err)
                    break
                yield sample
