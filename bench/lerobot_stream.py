"""Stream a large LeRobot v3.0 dataset with lf-data's ``LeRobotStream`` and with lerobot's ``LeRobotDataset``.

Generates (``bench/lerobot_stream_gen.py``) a v3.0 dataset of ``--gb`` GB of parquet data files (PNG
camera frames in the parquet, ``--image`` pixels square, float32 state and action), then reads the same
frames in order with each reader, for ``--seconds`` or until the dataset ends: in one process (samples/s
is samples/s per core) and through a ``torch.utils.data.DataLoader`` of ``--loader-workers`` workers
(samples/s per core = samples/s / workers). Each variant runs in a fresh process; memory is its peak
anonymous RSS (``RssAnon`` of the process and its DataLoader workers, sampled every 64 samples, summed over
the tree) and ``ru_maxrss`` (which also counts memory-mapped parquet pages). Samples carry an action chunk
of ``--horizon`` steps (lerobot: ``delta_timestamps["action"]``), so both readers do the same work: one PNG
decode, a state, an action window and the task string per sample. The first 32 samples of the two
single-process runs must hold equal values (``values_match``). lerobot converts the parquet files to an
arrow cache at init (a second copy of the data, under the work folder): its ``init_s`` is reported apart.

GPU machine (16 cores, no internet), after installing lerobot's wheels (see the lf-data report)::

    /opt/torch/.venv/bin/python bench/lerobot_stream.py --gb 10 --out bench/results/lerobot_stream.json

CPU smoke test (a few seconds, lerobot optional)::

    python bench/lerobot_stream.py --dry --out /tmp/lerobot_stream_dry.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from lerobot_stream_gen import generate  # noqa: E402

CHECK = 32
MIB = 1024**2


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=10.0, help="size of the data files, GB (1e9 bytes)")
    p.add_argument("--image", type=int, default=256, help="camera frame height = width, pixels")
    p.add_argument("--episode-len", type=int, default=200)
    p.add_argument("--file-mb", type=int, default=100, help="data file size, MB (lerobot's default 100)")
    p.add_argument("--horizon", type=int, default=10, help="action chunk per sample")
    p.add_argument("--seconds", type=float, default=60.0, help="time per variant (stops earlier at the end)")
    p.add_argument("--loader-workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--workdir", type=Path, default=Path("/tmp/lf_lerobot_stream"))
    p.add_argument("--keep", action="store_true", help="keep the generated dataset")
    p.add_argument("--out", type=Path, default=HERE / "results" / "lerobot_stream.json")
    p.add_argument("--dry", action="store_true", help="tiny dataset, 3 s per variant, 2 loader workers")
    p.add_argument("--measure", nargs=3, metavar=("READER", "WORKERS", "ROOT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dry:
        a.gb, a.image, a.episode_len, a.file_mb, a.horizon, a.seconds = 0.004, 64, 20, 1, 4, 3.0
        a.loader_workers = 2
    return a


def _tree_rss_anon(pid: int) -> int:
    """Sum of ``RssAnon`` bytes of ``pid`` and its descendants (Linux ``/proc``; 0 elsewhere)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("RssAnon:"))) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def _lerobot_import():
    """lerobot's ``LeRobotDataset``; declares torchvision's two ops first when its compiled ops cannot load."""
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is not None and spec.origin:
        try:
            torch.ops.load_library(str(Path(spec.origin).parent / "_C.so"))
        except (OSError, RuntimeError):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            for op in ("nms", "qnms"):
                torch.library.define(f"torchvision::{op}", schema)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset


def _build(reader: str, root: Path, horizon: int):
    info = json.loads((root / "meta/info.json").read_text())
    if reader == "lf":
        from lf_data import LeRobotStream

        return LeRobotStream(root, image_key="observation.image", action_horizon=horizon), info
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["HF_DATASETS_CACHE"] = str(root.parent / "hf_cache")
    cls = _lerobot_import()
    return cls("local/lf_bench", root=root, delta_timestamps={"action": [i / info["fps"] for i in range(horizon)]},
               video_backend="pyav"), info


def _values(reader: str, s: dict) -> list[float]:
    """state, first action, image sum (uint8 scale) of one sample, for the cross-reader check."""
    if reader == "lf":
        return [*s["state"].tolist(), *s["actions"][0].tolist(), float(s["image"].double().sum())]
    img = torch.round(s["observation.image"].double() * 255)
    return [*s["observation.state"].tolist(), *s["action"][0].tolist(), float(img.sum())]


def measure(reader: str, workers: int, root: Path, horizon: int, seconds: float) -> dict:
    """Stream ``root`` with one reader; samples/s, peak memory, the first samples' values."""
    t0 = time.perf_counter()
    ds, info = _build(reader, root, horizon)
    init_s = time.perf_counter() - t0
    if workers == 0:
        samples = iter(ds) if reader == "lf" else (ds[i] for i in range(len(ds)))
        batches = ([s] for s in samples)
    else:
        batches = iter(torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers, shuffle=False))
    n, probe, peak, first, start = 0, 0, 0, [], time.perf_counter()
    for b in batches:
        if workers == 0 and len(first) < CHECK:
            first.append(_values(reader, b[0]))
        n += len(b) if workers == 0 else len(b["task"])
        if n >= probe:
            peak, probe = max(peak, _tree_rss_anon(os.getpid())), probe + 64
        if time.perf_counter() - start > seconds:
            break
    wall = time.perf_counter() - start
    peak = max(peak, _tree_rss_anon(os.getpid()))
    cores = max(workers, 1)
    return {"reader": reader, "workers": workers, "init_s": init_s, "samples": n, "seconds": wall,
            "samples_per_s": n / wall, "samples_per_s_per_core": n / wall / cores,
            "whole_dataset": n >= info["total_frames"], "peak_rss_anon_mib": peak / MIB,
            "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "first": first}


def _run_child(reader: str, workers: int, root: Path, a) -> dict:
    cmd = [sys.executable, __file__, "--measure", reader, str(workers), str(root), "--horizon", str(a.horizon),
           "--seconds", str(a.seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"reader": reader, "workers": workers, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    a = _args(argv)
    if a.measure:
        reader, workers, root = a.measure
        print(json.dumps(measure(reader, int(workers), Path(root), a.horizon, a.seconds)))
        return 0
    root = a.workdir / "dataset"
    shutil.rmtree(a.workdir, ignore_errors=True)
    t0 = time.perf_counter()
    gen = generate(root, gb=a.gb, image=a.image, episode_len=a.episode_len, file_mb=a.file_mb)
    gen["seconds"] = time.perf_counter() - t0
    print(f"generated {gen['bytes'] / 1e9:.2f} GB, {gen['frames']} frames in {gen['seconds']:.0f} s", flush=True)
    runs = {}
    for reader in ("lf", "lerobot"):
        for workers in (0, a.loader_workers):
            name = f"{reader}, {'1 process' if workers == 0 else f'DataLoader {workers} workers'}"
            runs[name] = _run_child(reader, workers, root, a)
            print(name, {k: v for k, v in runs[name].items() if k != "first"}, flush=True)
    lf1, lr1 = runs["lf, 1 process"], runs["lerobot, 1 process"]
    match = None
    if "first" in lf1 and "first" in lr1:
        match = bool(np.allclose(np.asarray(lf1["first"]), np.asarray(lr1["first"]), rtol=0, atol=1e-3))
    for r in runs.values():
        r.pop("first", None)
    ratios = {}
    for w in ("1 process", f"DataLoader {a.loader_workers} workers"):
        lf, lr = runs[f"lf, {w}"], runs[f"lerobot, {w}"]
        if "error" not in lf and "error" not in lr:
            ratios[w] = lf["samples_per_s_per_core"] / lr["samples_per_s_per_core"]
    result = {"benchmark": "lerobot_stream", "dry": a.dry, "device": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores", "torch": torch.__version__, "python": platform.python_version(),
              "commit": _commit(), "dataset": {**gen, "image": a.image, "episode_len": a.episode_len,
                                                 "horizon": a.horizon, "file_mb": a.file_mb},
              "seconds_per_variant": a.seconds, "runs": runs, "values_match": match,
              "lf_over_lerobot_per_core": ratios}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {a.out}")
    if not a.keep:
        shutil.rmtree(a.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
