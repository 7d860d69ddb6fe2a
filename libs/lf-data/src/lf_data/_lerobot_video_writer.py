"""Write LeRobot v2.1 or v3.0 datasets with mp4 video features, in LeRobot's own layout.

The ``lerobot`` package (0.4.x) pins ``torch<2.11`` and cannot be installed next
to lf's torch, so tests build datasets with this writer, which follows
huggingface/lerobot ``datasets/utils.py``, ``lerobot_dataset.py`` (v3.0
``_save_episode_video``: ``videos/<key>/from_timestamp`` / ``to_timestamp``
are cumulative durations in the shared mp4) and
``v30/convert_dataset_v21_to_v30.py`` (the v2.1 paths and jsonl files). Videos
are lossless H.264 RGB by default (``libx264rgb``, ``crf=0``: the stream's pixel
format is ``gbrp``, planar G, B, R), so decoded frames equal the written ones;
``video_codec="libx264"`` or ``"libsvtav1"`` writes lossy yuv420p as LeRobot does
(its default is AV1 yuv420p). The ``info`` block of each video feature in
``meta/info.json`` is read back from the written mp4 (``video_stream_info``), so it
always describes the stream. ``dtype="image"`` features are PNG in the parquet
files, next to the video features.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import _lerobot_format as fmt
from ._lerobot_writer import _check_features, _column
from ._staged import staged_output
from ._stats import compute_stats, image_stats_from_histograms, pixel_histograms
from ._video import video_stream_info, write_video

__all__ = ["write_lerobot_video"]

V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V30_VIDEO_PATH = "videos/{video_key}/" + fmt.CHUNK_FILE_PATTERN + ".mp4"
VIDEO_CODECS = ("libx264rgb", "libx264", "libsvtav1")


def _video_feature(ft: dict, mp4: Path) -> dict:
    h, w, c = ft["shape"]
    return {"dtype": "video", "shape": [h, w, c], "names": ["height", "width", "channels"],
            "info": video_stream_info(mp4)}


@staged_output
def write_lerobot_video(out_dir: str | Path, episodes: Sequence[dict], *, version: str, fps: int,
                        features: dict[str, dict], tasks: Sequence[str] | None = None,
                        robot_type: str = "sawyer", video_codec: str = "libx264rgb") -> Path:
    """Write episodes as a LeRobot ``version`` ("v2.1" or "v3.0") dataset, ``dtype="video"`` features as mp4.

    Args:
        out_dir: new folder.
        episodes: ``[{"task": str, "frames": {feature: (T, ...) array}}]``; video and
            image frames uint8 ``(T, H, W, 3)``. A task of ``""`` is written as is (to test readers).
        version: ``"v2.1"`` (one parquet and mp4 per episode, jsonl metadata) or
            ``"v3.0"`` (all episodes in one parquet and one mp4 per camera).
        fps: frames per second.
        features: ``{name: {"dtype", "shape"}}`` without LeRobot's default features;
            dtypes ``video`` (mp4), ``image`` (PNG in parquet) or a numpy dtype name.
        tasks: task strings registered first.
        video_codec: ``"libx264rgb"`` (lossless, pix_fmt ``gbrp``), ``"libx264"`` or
            ``"libsvtav1"`` (lossy, pix_fmt ``yuv420p``).

    Returns:
        ``Path(out_dir)``, written whole through a temporary sibling folder (removed on failure).

    Raises:
        ValueError: unknown version or video codec, bad features or frames.
        FileExistsError: ``out_dir`` exists and is not empty.
    """
    if version not in ("v2.1", "v3.0"):
        raise ValueError(f"version must be 'v2.1' or 'v3.0', got {version!r}")
    if video_codec not in VIDEO_CODECS:
        raise ValueError(f"video_codec must be one of {list(VIDEO_CODECS)}, got {video_codec!r}")
    out = Path(out_dir)  # the temporary sibling folder (staged_output)
    videos = [k for k, ft in features.items() if ft["dtype"] == "video"]
    plain = _check_features({k: ft for k, ft in features.items() if k not in videos})
    schema = pa.schema([(k, fmt.arrow_type(ft)) for k, ft in plain.items()],
                       metadata={b"huggingface": fmt.hf_features_metadata(plain)})
    task_list = list(tasks or [])
    tables, ep_rows, ep_stats_rows, numeric, hists, total = [], [], [], {}, {}, 0
    clips: dict[str, list[np.ndarray]] = {k: [] for k in videos}
    for e, ep in enumerate(episodes):
        frames, task = ep["frames"], ep["task"]
        n = len(frames[next(iter(features))])
        if task not in task_list:
            task_list.append(task)
        frames = {**frames, "timestamp": np.arange(n) / fps, "frame_index": np.arange(n),
                  "episode_index": np.full(n, e), "index": total + np.arange(n),
                  "task_index": np.full(n, task_list.index(task))}
        cols, stats = [], {}
        for key, ft in plain.items():
            col, values = _column(key, ft, frames[key], n, e)
            cols.append(col)
            if ft["dtype"] == "image":
                h = pixel_histograms(values)
                hists[key] = hists[key] + h if key in hists else h
                stats[key] = image_stats_from_histograms(h, n)
            else:
                numeric.setdefault(key, []).append(values)
                stats[key] = compute_stats(values)
        for key in videos:
            h = pixel_histograms(frames[key])
            hists[key] = hists[key] + h if key in hists else h
            stats[key] = image_stats_from_histograms(h, n)
            clips[key].append(np.asarray(frames[key]))
        tables.append(pa.Table.from_arrays(cols, schema=schema))
        row = {"episode_index": e, "tasks": [task] if task is not None else [], "length": n}
        if version == "v2.1":
            (out / "data/chunk-000").mkdir(parents=True, exist_ok=True)
            pq.write_table(tables[-1], out / V21_DATA_PATH.format(episode_chunk=0, episode_index=e))
            for key in videos:
                write_video(out / V21_VIDEO_PATH.format(episode_chunk=0, video_key=key, episode_index=e),
                            frames[key], fps, codec=video_codec)
        else:
            row.update({"data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": total,
                        "dataset_to_index": total + n, "meta/episodes/chunk_index": 0,
                        "meta/episodes/file_index": 0})
            for key in videos:
                row.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                            f"videos/{key}/from_timestamp": total / fps,
                            f"videos/{key}/to_timestamp": (total + n) / fps})
            row.update({f"stats/{k}/{s}": v for k, st in stats.items() for s, v in st.items()})
        ep_rows.append(row)
        ep_stats_rows.append({"episode_index": e, "stats": stats})
        total += n
    info = {"codebase_version": version, "robot_type": robot_type, "total_episodes": len(ep_rows),
            "total_frames": total, "total_tasks": len(task_list), "chunks_size": fmt.DEFAULT_CHUNK_SIZE,
            "fps": fps, "splits": {"train": f"0:{len(ep_rows)}"}, "features": {}}
    (out / "meta").mkdir(parents=True, exist_ok=True)
    stats = {k: compute_stats(np.concatenate(v)) for k, v in numeric.items()}
    stats.update({k: image_stats_from_histograms(h, total) for k, h in hists.items()})
    if version == "v2.1":
        info.update(total_videos=len(videos) * len(ep_rows), total_chunks=1, data_path=V21_DATA_PATH,
                    video_path=V21_VIDEO_PATH if videos else None)
        lines = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
        (out / "meta/episodes.jsonl").write_text(lines(ep_rows))
        (out / "meta/tasks.jsonl").write_text(lines({"task_index": i, "task": t} for i, t in enumerate(task_list)))
        (out / "meta/episodes_stats.jsonl").write_text(lines(ep_stats_rows))
    else:
        path = out / fmt.DATA_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(tables), path)
        for key in videos:
            write_video(out / V30_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0),
                        np.concatenate(clips[key]), fps, codec=video_codec)
        ep_path = out / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
        ep_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(ep_rows), ep_path)
        pq.write_table(fmt.tasks_table(task_list), out / fmt.TASKS_PATH)
        (out / fmt.STATS_PATH).write_text(json.dumps(stats))
        info.update(data_files_size_in_mb=fmt.DEFAULT_DATA_FILE_SIZE_IN_MB,
                    video_files_size_in_mb=fmt.DEFAULT_VIDEO_FILE_SIZE_IN_MB, data_path=fmt.DATA_PATH,
                    video_path=V30_VIDEO_PATH if videos else None)
    first_mp4 = {k: out / (V21_VIDEO_PATH.format(episode_chunk=0, video_key=k, episode_index=0) if version == "v2.1"
                           else V30_VIDEO_PATH.format(video_key=k, chunk_index=0, file_index=0)) for k in videos}
    info["features"] = {**{k: _video_feature(features[k], first_mp4[k]) for k in videos}, **plain}
    (out / fmt.INFO_PATH).write_text(json.dumps(info, indent=4))
    return out
