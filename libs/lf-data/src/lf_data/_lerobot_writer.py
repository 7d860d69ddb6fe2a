"""Write episodes as a LeRobot v3.0 dataset (parquet data, images embedded as PNG)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from . import _lerobot_format as fmt
from ._staged import destination_of, staged_output
from ._stats import compute_stats, image_stats_from_histograms, pixel_histograms

__all__ = ["write_lerobot_v3"]


def encode_png(image: np.ndarray) -> bytes:
    """Lossless PNG bytes of one uint8 ``(H, W, 3)`` image."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def _check_features(features: dict[str, dict]) -> dict[str, dict]:
    for key, ft in features.items():
        if "/" in key:
            raise ValueError(f"feature name {key!r} must not contain '/' (LeRobot rule)")
        if key in fmt.DEFAULT_FEATURES:
            raise ValueError(f"feature {key!r} is added by the writer; leave it out of `features`")
        if not {"dtype", "shape"} <= set(ft):
            raise ValueError(f"features[{key!r}] needs 'dtype' and 'shape', got keys {sorted(ft)}")
        fmt.arrow_type(ft)  # raises on unsupported dtype/shape
    return {k: {"dtype": v["dtype"], "shape": list(v["shape"]), "names": v.get("names")}
            for k, v in {**features, **fmt.DEFAULT_FEATURES}.items()}


def _column(key: str, ft: dict, value, n: int, ep: int) -> tuple[pa.Array, np.ndarray]:
    """Arrow column and the numpy values used for stats, after shape/dtype checks."""
    arr = np.asarray(value)
    shape = tuple(ft["shape"])
    want = (n,) if shape == (1,) else (n, *shape)
    if arr.shape != want and not (shape == (1,) and arr.shape == (n, 1)):
        raise ValueError(f"episode {ep}: feature {key!r} has shape {arr.shape}, expected {want}")
    if ft["dtype"] == "image":
        if arr.dtype != np.uint8:
            raise ValueError(f"episode {ep}: image feature {key!r} must be uint8, got {arr.dtype}")
        data = [{"bytes": encode_png(img), "path": ""} for img in arr]
        return pa.array(data, type=fmt.IMAGE_STRUCT), arr
    dtype = np.dtype(ft["dtype"])
    if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise ValueError(f"episode {ep}: feature {key!r} has dtype {arr.dtype}, cannot store as {dtype}")
    arr = arr.astype(dtype).reshape(want)
    if shape == (1,):
        return pa.array(arr), arr
    return pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), shape[0]), arr


@staged_output
def write_lerobot_v3(
    out_dir: str | Path,
    episodes: Iterable[dict],
    *,
    fps: int,
    features: dict[str, dict],
    robot_type: str | None = "sawyer",
    tasks: Sequence[str] | None = None,
    extra_info: dict | None = None,
    data_files_size_in_mb: int = fmt.DEFAULT_DATA_FILE_SIZE_IN_MB,
    chunks_size: int = fmt.DEFAULT_CHUNK_SIZE,
) -> Path:
    """Write episodes to ``out_dir`` in the LeRobot v3.0 layout, streaming one episode at a time.

    Args:
        out_dir: target folder; must not exist or be empty.
        episodes: iterable of ``{"task": str, "frames": {feature: array}}`` where each
            array has a leading frame axis ``T`` (``(T, H, W, 3)`` uint8 for
            ``dtype="image"``, ``(T, D)`` for vectors, ``(T,)`` for shape ``[1]``).
        fps: frames per second; ``timestamp = frame_index / fps`` (seconds, float32).
        features: ``{name: {"dtype", "shape", "names"}}`` without the default
            features (timestamp, frame_index, episode_index, index, task_index),
            which the writer adds. dtypes: ``image`` or a numpy dtype name.
        robot_type: stored in ``info.json``.
        tasks: task strings to register first (``task_index`` = position); tasks
            first seen in ``episodes`` are appended, as LeRobot does.
        extra_info: extra top-level keys merged into ``info.json``.
        data_files_size_in_mb: start a new data file once the current one holds this
            much (uncompressed arrow size); episodes never span files.
        chunks_size: files per ``chunk-XXX`` folder.

    Returns:
        ``Path(out_dir)``. Everything is written into a temporary sibling folder that is
        renamed to ``out_dir`` at the end (``meta/info.json`` last); if writing fails, the
        temporary folder is removed and ``out_dir`` is left as it was.

    Raises:
        FileExistsError: ``out_dir`` exists and is not empty.
        ValueError: a feature is missing, has the wrong shape/dtype, or there are no episodes.

    Example:
        >>> write_lerobot_v3(tmp, [{"task": "t", "frames": {"action": np.zeros((3, 4), np.float32)}}],
        ...                  fps=10, features={"action": {"dtype": "float32", "shape": [4]}})  # doctest: +SKIP
    """
    out = Path(out_dir)  # the temporary sibling folder (staged_output)
    all_features = _check_features(features)
    user_keys = [k for k in all_features if k not in fmt.DEFAULT_FEATURES]
    schema = pa.schema([(k, fmt.arrow_type(all_features[k])) for k in all_features],
                       metadata={b"huggingface": fmt.hf_features_metadata(all_features)})
    task_list = list(tasks or [])
    task_index = {t: i for i, t in enumerate(task_list)}
    if len(task_index) != len(task_list):
        raise ValueError(f"tasks contain duplicates: {task_list}")

    numeric: dict[str, list[np.ndarray]] = {k: [] for k in all_features if all_features[k]["dtype"] != "image"}
    hists: dict[str, np.ndarray] = {}
    ep_rows: list[dict] = []
    chunk, file, file_bytes, writer, total = 0, 0, 0, None, 0
    try:
        for ep, episode in enumerate(episodes):
            frames, task = episode.get("frames"), episode.get("task")
            if not isinstance(task, str) or not isinstance(frames, dict):
                raise ValueError(f"episode {ep}: expected {{'task': str, 'frames': dict}}, got keys {sorted(episode)}")
            missing = [k for k in user_keys if k not in frames]
            if missing:
                raise ValueError(f"episode {ep}: frames miss features {missing}")
            n = len(frames[user_keys[0]])
            if n == 0:
                raise ValueError(f"episode {ep}: has no frames")
            if task not in task_index:
                task_index[task] = len(task_list)
                task_list.append(task)
            frames = {**frames, "timestamp": np.arange(n) / fps, "frame_index": np.arange(n),
                      "episode_index": np.full(n, ep), "index": total + np.arange(n),
                      "task_index": np.full(n, task_index[task])}
            cols, ep_stats = [], {}
            for key, ft in all_features.items():
                col, values = _column(key, ft, frames[key], n, ep)
                cols.append(col)
                if ft["dtype"] == "image":
                    h = pixel_histograms(values)
                    hists[key] = hists[key] + h if key in hists else h
                    ep_stats[key] = image_stats_from_histograms(h, n)
                else:
                    numeric[key].append(values)
                    ep_stats[key] = compute_stats(values)
            table = pa.Table.from_arrays(cols, schema=schema)
            if writer is not None and file_bytes + table.nbytes > data_files_size_in_mb * 1024**2:
                writer.close()
                writer, file_bytes = None, 0
                chunk, file = (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)
            if writer is None:
                path = out / fmt.DATA_PATH.format(chunk_index=chunk, file_index=file)
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(path, schema, compression="snappy")
            writer.write_table(table)
            file_bytes += table.nbytes
            row = {"episode_index": ep, "tasks": [task], "length": n, "data/chunk_index": chunk,
                   "data/file_index": file, "dataset_from_index": total, "dataset_to_index": total + n,
                   "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
            row.update({f"stats/{k}/{s}": v for k, st in ep_stats.items() for s, v in st.items()})
            ep_rows.append(row)
            total += n
    finally:
        if writer is not None:
            writer.close()
    if not ep_rows:
        raise ValueError(f"{destination_of(out)}: no episodes were given, nothing to write")

    stats = {k: compute_stats(np.concatenate(v)) for k, v in numeric.items()}
    stats.update({k: image_stats_from_histograms(h, total) for k, h in hists.items()})
    ep_path = out / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
    ep_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(ep_rows), ep_path)
    pq.write_table(fmt.tasks_table(task_list), out / fmt.TASKS_PATH)
    (out / fmt.STATS_PATH).write_text(json.dumps(stats, indent=4))
    info = {
        "codebase_version": fmt.CODEBASE_VERSION, "robot_type": robot_type,
        "total_episodes": len(ep_rows), "total_frames": total, "total_tasks": len(task_list),
        "chunks_size": chunks_size, "data_files_size_in_mb": data_files_size_in_mb,
        "video_files_size_in_mb": fmt.DEFAULT_VIDEO_FILE_SIZE_IN_MB, "fps": fps,
        "splits": {"train": f"0:{len(ep_rows)}"}, "data_path": fmt.DATA_PATH, "video_path": None,
        "features": all_features, **(extra_info or {}),
    }
    (out / fmt.INFO_PATH).write_text(json.dumps(info, indent=4))
    return out
