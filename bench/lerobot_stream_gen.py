"""Generate a LeRobot v3.0 dataset of a given size quickly, in parallel, for ``bench/lerobot_stream.py``.

Layout as lerobot 0.4 writes it (``lf_data._lerobot_format``): ``data/chunk-000/file-XXX.parquet`` of about
``file_mb`` each holding whole episodes, ``meta/episodes/chunk-000/file-000.parquet``, ``meta/tasks.parquet``,
``meta/stats.json`` (state and action only), ``meta/info.json``. Features: ``observation.image`` PNG in the
parquet (``dtype="image"``, what lerobot's v3.0 writer stores for image features), ``observation.state``
float32 (8,), ``action`` float32 (7,). Images are uniform noise over a gradient, so PNG cannot shrink them
and the bytes on disk are real (``H*W*3`` per frame plus PNG framing). Each worker encodes a pool of 16
distinct PNGs and cycles through it: decoding costs the same as for distinct frames, and the parquet image
column is written without dictionary encoding so repeats are not stored once.

Legend: ``T`` frames of an episode, ``H``/``W`` image size.
"""

from __future__ import annotations

import io
import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from lf_data import lerobot as fmt

STATE_DIM, ACTION_DIM, POOL = 8, 7, 16
TASKS = ["pick up the cube", "open the drawer", "push the button", "stack the blocks"]


def features(image: int) -> dict[str, dict]:
    """The dataset's features, with lerobot's default ones appended."""
    hwc = ["height", "width", "channels"]
    user = {"observation.image": {"dtype": "image", "shape": [image, image, 3], "names": hwc},
            "observation.state": {"dtype": "float32", "shape": [STATE_DIM], "names": None},
            "action": {"dtype": "float32", "shape": [ACTION_DIM], "names": None}}
    return {**user, **fmt.DEFAULT_FEATURES}


def _png_pool(image: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    grad = np.linspace(0, 128, image, dtype=np.float32)[None, :, None]
    out = []
    for _ in range(POOL):
        img = (rng.integers(0, 128, (image, image, 3)) + grad).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def episode_values(episode: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 state ``(T, 8)`` and action ``(T, 7)`` of one episode (seeded by its index)."""
    rng = np.random.default_rng(1000 + episode)
    return (rng.normal(size=(length, STATE_DIM)).astype(np.float32),
            rng.uniform(-1, 1, (length, ACTION_DIM)).astype(np.float32))


def _write_file(job: dict) -> dict:
    """Write one data file of whole episodes; return per-feature sums for the statistics."""
    root, image, fps = Path(job["root"]), job["image"], job["fps"]
    feats = features(image)
    schema = pa.schema([(k, fmt.arrow_type(ft)) for k, ft in feats.items()],
                       metadata={b"huggingface": fmt.hf_features_metadata(feats)})
    pool = _png_pool(image, job["file"])
    path = root / fmt.DATA_PATH.format(chunk_index=0, file_index=job["file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    acc = {k: {"sum": 0.0, "sq": 0.0, "min": np.inf, "max": -np.inf} for k in ("observation.state", "action")}
    plain = [k for k in feats if k != "observation.image"]  # dictionary: PNG pool stored once; min/max: 2 PNGs
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=plain, write_statistics=plain) as w:
        for ep, start, n in job["episodes"]:
            state, action = episode_values(ep, n)
            imgs = [{"bytes": pool[(start + t) % POOL], "path": ""} for t in range(n)]
            cols = {"observation.image": pa.array(imgs, type=fmt.IMAGE_STRUCT),
                    "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), STATE_DIM),
                    "action": pa.FixedSizeListArray.from_arrays(pa.array(action.reshape(-1)), ACTION_DIM),
                    "timestamp": pa.array((np.arange(n) / fps).astype(np.float32)),
                    "frame_index": pa.array(np.arange(n, dtype=np.int64)),
                    "episode_index": pa.array(np.full(n, ep, np.int64)),
                    "index": pa.array(start + np.arange(n, dtype=np.int64)),
                    "task_index": pa.array(np.full(n, ep % len(TASKS), np.int64))}
            w.write_table(pa.Table.from_pydict(cols, schema=schema))
            for k, v in (("observation.state", state), ("action", action)):
                a = acc[k]
                a["sum"] = a["sum"] + v.astype(np.float64).sum(0)
                a["sq"] = a["sq"] + (v.astype(np.float64) ** 2).sum(0)
                a["min"], a["max"] = np.minimum(a["min"], v.min(0)), np.maximum(a["max"], v.max(0))
    return {"file": job["file"], "bytes": path.stat().st_size, "acc": acc}


def generate(root: str | Path, *, gb: float, image: int = 256, episode_len: int = 200, file_mb: int = 100,
             fps: int = 30, workers: int | None = None) -> dict:
    """Write a LeRobot v3.0 dataset of about ``gb`` GB (10^9 bytes) of data files to ``root``.

    Returns:
        ``{"root", "frames", "episodes", "files", "bytes", "frame_bytes"}`` (``bytes``: data files on disk).

    Raises:
        FileExistsError: ``root`` exists and is not empty.
    """
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"lerobot_stream_gen: {root} exists and is not empty")
    frame_bytes = len(_png_pool(image, 0)[0]) + 4 * (STATE_DIM + ACTION_DIM) + 40
    total_frames = max(episode_len, int(gb * 1e9 / frame_bytes))
    eps_per_file = max(1, int(file_mb * 1e6 / frame_bytes) // episode_len)
    n_eps = math.ceil(total_frames / episode_len)
    jobs, ep_rows = [], []
    for f in range(math.ceil(n_eps / eps_per_file)):
        eps = []
        for ep in range(f * eps_per_file, min(n_eps, (f + 1) * eps_per_file)):
            start = ep * episode_len
            eps.append((ep, start, episode_len))
            ep_rows.append({"episode_index": ep, "tasks": [TASKS[ep % len(TASKS)]], "length": episode_len,
                            "data/chunk_index": 0, "data/file_index": f, "dataset_from_index": start,
                            "dataset_to_index": start + episode_len, "meta/episodes/chunk_index": 0,
                            "meta/episodes/file_index": 0})
        jobs.append({"root": str(root), "file": f, "image": image, "fps": fps, "episodes": eps})
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        results = list(pool.map(_write_file, jobs))
    frames = n_eps * episode_len
    stats = {}
    for k in ("observation.state", "action"):
        s = sum(r["acc"][k]["sum"] for r in results)
        sq = sum(r["acc"][k]["sq"] for r in results)
        mean = s / frames
        stats[k] = {"mean": mean.tolist(), "std": np.sqrt(np.maximum(sq / frames - mean**2, 0)).tolist(),
                    "min": np.min([r["acc"][k]["min"] for r in results], 0).tolist(),
                    "max": np.max([r["acc"][k]["max"] for r in results], 0).tolist(), "count": [frames]}
    ep_path = root / fmt.EPISODES_PATH.format(chunk_index=0, file_index=0)
    ep_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(ep_rows), ep_path)
    pq.write_table(fmt.tasks_table(TASKS), root / fmt.TASKS_PATH)
    (root / fmt.STATS_PATH).write_text(json.dumps(stats, indent=2))
    info = {"codebase_version": fmt.CODEBASE_VERSION, "robot_type": "synthetic", "total_episodes": n_eps,
            "total_frames": frames, "total_tasks": len(TASKS), "chunks_size": fmt.DEFAULT_CHUNK_SIZE,
            "data_files_size_in_mb": file_mb, "video_files_size_in_mb": fmt.DEFAULT_VIDEO_FILE_SIZE_IN_MB,
            "fps": fps, "splits": {"train": f"0:{n_eps}"}, "data_path": fmt.DATA_PATH, "video_path": None,
            "features": features(image)}
    (root / fmt.INFO_PATH).write_text(json.dumps(info, indent=2))
    return {"root": str(root), "frames": frames, "episodes": n_eps, "files": len(jobs),
            "bytes": sum(r["bytes"] for r in results), "frame_bytes": frame_bytes}
