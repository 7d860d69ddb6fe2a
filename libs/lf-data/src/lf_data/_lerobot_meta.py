"""LeRobot metadata of codebase versions v2.1 (and v2.0) and v3.0, read into one episode table.

Layouts (huggingface/lerobot ``datasets/utils.py``; v2.1 as in the ``LEGACY_*``
paths and ``v30/convert_dataset_v21_to_v30.py``):

- v2.1: ``meta/info.json`` (``data_path =
  "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"``,
  ``video_path = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"``,
  ``episode_chunk = episode_index // chunks_size``), ``meta/episodes.jsonl``
  (``episode_index, tasks, length``), ``meta/tasks.jsonl`` (``task_index, task``),
  ``meta/episodes_stats.jsonl``; one parquet and one mp4 per camera per episode.
- v3.0: ``meta/episodes/chunk-XXX/file-XXX.parquet`` (``data/chunk_index``,
  ``data/file_index``, ``dataset_from_index``, ``videos/<key>/chunk_index``,
  ``videos/<key>/file_index``, ``videos/<key>/from_timestamp``), ``meta/tasks.parquet``;
  several episodes per data file and per mp4 (an episode starts at frame
  ``round(from_timestamp * fps)`` of its mp4).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ._errors import DataError, is_lfs_pointer
from ._lerobot_format import task_column

__all__ = ["EpisodeMeta", "LeRobotMeta", "detect_format", "load_lerobot_meta", "read_stats"]

V21_VERSIONS = ("v2.0", "v2.1")
V30_VERSIONS = ("v3.0",)


@dataclass
class EpisodeMeta:
    """Where one episode's frames live."""

    index: int
    """``episode_index``."""
    length: int
    """Frames in the episode, as the metadata declares."""
    tasks: list[str]
    """The episode's task strings (language instructions)."""
    data_file: Path
    """Parquet file holding its rows."""
    row_start: int
    """First row of the episode in ``data_file``."""
    videos: dict[str, tuple[Path, int]] = field(default_factory=dict)
    """Video feature -> (mp4 file, index of the episode's first frame in it: ``round(from_timestamp * fps)``)."""
    video_spans: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    """v3.0: video feature -> (``from_timestamp``, ``to_timestamp`` or None) in seconds, as stored."""
    meta_file: Path | None = None
    """The metadata file that describes the episode (v3.0 ``meta/episodes/...parquet``, v2.1 ``episodes.jsonl``)."""


@dataclass
class LeRobotMeta:
    """A LeRobot dataset's metadata, whatever its codebase version."""

    root: Path
    version: str
    info: dict
    features: dict[str, dict]
    fps: int
    tasks: list[str]
    episodes: list[EpisodeMeta]
    stats: dict | None

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft.get("dtype") == "image"]


def _checked(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"LeRobot dataset file missing: {path}", file=path, reason="missing_file")
    if is_lfs_pointer(path):
        raise DataError(f"{path}: Git LFS pointer file in place of the data (run `git lfs pull`)", file=path,
                        reason="lfs_pointer")
    return path


def _json(path: Path) -> dict:
    try:
        return json.loads(_checked(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e})", file=path, reason="invalid") from e


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(_checked(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e})", file=path, record=n, reason="invalid") from e
    return rows


def read_stats(root: str | Path) -> dict:
    """A LeRobot v3.0 dataset's ``meta/stats.json`` (feature -> statistics), which training needs.

    The one check of that file: ``LeRobotDataset`` (so ``lf run``) raises its error and ``lf data inspect``
    reports it as a problem, in the same words.

    Raises:
        FileNotFoundError: the file is missing (the message names it and what needs it).
        DataError: a Git LFS pointer, not valid JSON, or not a JSON object of features.
    """
    path = Path(root) / "meta/stats.json"
    if not path.is_file():
        raise FileNotFoundError(f"LeRobot dataset file missing: {path} (training reads the state and action "
                                "statistics from it: normalization and the action tokenizer's bounds; `lf data "
                                "convert` and LeRobot's writers produce it)")
    stats = _json(path)
    if not isinstance(stats, dict):
        raise DataError(f"{path}: expected a JSON object of feature statistics, got {type(stats).__name__}",
                        file=path, reason="invalid")
    return stats


def _table(path: Path) -> pa.Table:
    try:
        return pq.read_table(_checked(path))
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read parquet ({e})", file=path, reason="invalid") from e


def _parquet(path: Path) -> dict:
    return _table(path).to_pydict()


def detect_format(path: str | Path) -> str:
    """The robot-data format of a folder: ``"lerobot-v2.1"``, ``"lerobot-v3.0"``, ``"rlds"`` or ``"rlbench"``.

    LeRobot versions come from ``meta/info.json``'s ``codebase_version`` (v2.0
    reads as v2.1: same layout, no per-episode stats). RLDS: ``dataset_info.json``
    and ``features.json``; RLBench: ``<task>/variation<N>/episodes``.

    Raises:
        DataError: not a folder, unknown layout or unsupported LeRobot version.
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: no such dataset folder", file=root, reason="missing_file")
    if (root / "meta/info.json").exists():
        version = _json(root / "meta/info.json").get("codebase_version")
        if version in V21_VERSIONS:
            return "lerobot-v2.1"
        if version in V30_VERSIONS:
            return "lerobot-v3.0"
        raise DataError(f"{root / 'meta/info.json'}: field 'codebase_version' is {version!r}, supported: "
                        f"{[*V21_VERSIONS, *V30_VERSIONS]}", file=root / "meta/info.json", field="codebase_version")
    if (root / "dataset_info.json").exists() and (root / "features.json").exists():
        return "rlds"
    if any(root.glob("*/variation*/episodes")):
        return "rlbench"
    raise DataError(f"{root}: unknown dataset layout (no meta/info.json, dataset_info.json + features.json, "
                    "or <task>/variation<N>/episodes)", file=root)


def _load_v21(root: Path, info: dict) -> tuple[list[str], list[EpisodeMeta]]:
    by_index = {int(r["task_index"]): r["task"] for r in _jsonl(root / "meta/tasks.jsonl")}
    tasks = [by_index.get(i, "") for i in range(max(by_index, default=-1) + 1)]
    chunks = int(info.get("chunks_size", 1000))
    data_tpl, video_tpl = info["data_path"], info.get("video_path")
    video_keys = [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]
    eps = []
    meta_file = root / "meta/episodes.jsonl"
    for r in _jsonl(meta_file):
        e = int(r["episode_index"])
        chunk = e // chunks
        videos = {k: (root / video_tpl.format(episode_chunk=chunk, video_key=k, episode_index=e), 0)
                  for k in video_keys}
        eps.append(EpisodeMeta(e, int(r["length"]), list(r.get("tasks") or []),
                               root / data_tpl.format(episode_chunk=chunk, episode_index=e), 0, videos,
                               meta_file=meta_file))
    return tasks, eps


def _load_v30(root: Path, info: dict, fps: int) -> tuple[list[str], list[EpisodeMeta]]:
    table = _table(root / "meta/tasks.parquet")
    column = task_column(table)
    if column is None or "task_index" not in table.column_names:
        raise DataError(f"{root / 'meta/tasks.parquet'}: no task_index and task (or pandas index) columns, has "
                        f"{table.column_names}", file=root / "meta/tasks.parquet", field="task", reason="invalid")
    by_index = dict(zip(table["task_index"].to_pylist(), table[column].to_pylist(), strict=True))
    tasks = [by_index.get(i, "") for i in range(max(by_index, default=-1) + 1)]
    ep_files = sorted((root / "meta/episodes").glob("*/*.parquet"))
    if not ep_files:
        raise DataError(f"LeRobot dataset file missing: {root}/meta/episodes/chunk-*/file-*.parquet",
                        file=root / "meta/episodes", reason="missing_file")
    rows: list[dict] = []
    for p in ep_files:
        t = _parquet(p)
        rows += [{**dict(zip(t, vals, strict=True)), "_meta_file": p} for vals in zip(*t.values(), strict=True)]
    video_keys = [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]
    file_start: dict[tuple[int, int], int] = {}
    for r in rows:
        key = (int(r["data/chunk_index"]), int(r["data/file_index"]))
        file_start[key] = min(file_start.get(key, r["dataset_from_index"]), int(r["dataset_from_index"]))
    eps = []
    for r in rows:
        ci, fi = int(r["data/chunk_index"]), int(r["data/file_index"])
        videos, spans = {}, {}
        for k in video_keys:
            vpath = info["video_path"].format(video_key=k, chunk_index=int(r[f"videos/{k}/chunk_index"]),
                                              file_index=int(r[f"videos/{k}/file_index"]))
            start, stop = float(r[f"videos/{k}/from_timestamp"]), r.get(f"videos/{k}/to_timestamp")
            spans[k] = (start, None if stop is None else float(stop))
            videos[k] = (root / vpath, round(start * fps) if math.isfinite(start) else 0)
        eps.append(EpisodeMeta(int(r["episode_index"]), int(r["length"]), list(r.get("tasks") or []),
                               root / info["data_path"].format(chunk_index=ci, file_index=fi),
                               int(r["dataset_from_index"]) - file_start[(ci, fi)], videos, spans,
                               r["_meta_file"]))
    return tasks, sorted(eps, key=lambda m: m.index)


def load_lerobot_meta(root: str | Path) -> LeRobotMeta:
    """Read the metadata of a local LeRobot v2.1 or v3.0 dataset (no frame data is read).

    Raises:
        DataError: a metadata file is missing, a Git LFS pointer, invalid, or the version unsupported.
    """
    root = Path(root)
    fmt_name = detect_format(root)
    if not fmt_name.startswith("lerobot"):
        raise DataError(f"{root}: a {fmt_name} dataset, not LeRobot", file=root)
    info = _json(root / "meta/info.json")
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise DataError(f"{root / 'meta/info.json'}: field {key!r} missing", file=root / "meta/info.json",
                            field=key)
    fps = int(info["fps"])
    loader = _load_v21 if fmt_name == "lerobot-v2.1" else (lambda r, i: _load_v30(r, i, fps))
    tasks, eps = loader(root, info)
    stats = _json(root / "meta/stats.json") if (root / "meta/stats.json").is_file() else None
    return LeRobotMeta(root, info["codebase_version"], info, info["features"], fps, tasks, eps, stats)
