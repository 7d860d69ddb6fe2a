"""Inspect a robot dataset (format, episodes, frames, features, statistics, problems) and convert to LeRobot v3.0.

Statistics are recomputed from the raw frames of the episodes that read
cleanly and compared with the dataset's ``meta/stats.json``: mean, std, min and
max for equality, q01 and q99 by the share of values outside them
(:mod:`lf_data._inspect_checks`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ._errors import DataError, ErrorPolicy
from ._inspect_checks import bounds_problems, check_stored_stats, report_errors
from ._lerobot_meta import detect_format, read_stats
from ._lerobot_time import DEFAULT_TOLERANCE_S
from ._stats import compute_stats

__all__ = ["convert_dataset", "inspect_dataset"]


def _numeric_keys(features: dict) -> list[str]:
    return [k for k, ft in features.items() if ft.get("dtype") not in ("video", "image", "string")
            and len(ft.get("shape", [])) == 1 and k not in ("index", "timestamp", "episode_index", "frame_index",
                                                             "task_index")]


def _hwc(ft: dict) -> list[int]:
    """Shape of a feature, visual ones as (H, W, C) (LeRobot v2.0 stored some video shapes as (C, H, W))."""
    shape = list(ft["shape"])
    names = ft.get("names") or []
    if ft["dtype"] in ("video", "image") and names and str(names[0]).startswith("channel"):
        return shape[1:] + shape[:1]
    return shape


def _stats_notes(root: Path, fmt_name: str) -> list[str]:
    """Findings about a v2.1 dataset's stored statistics (a v3.0 one without them is a problem: ``read_stats``)."""
    stats = root / "meta/stats.json"
    if fmt_name == "lerobot-v3.0" or stats.is_file() or (root / "meta/episodes_stats.jsonl").is_file():
        return []
    return [f"{stats} and {root / 'meta/episodes_stats.jsonl'} are missing: no stored statistics to check; "
            f"converting to LeRobot v3.0 writes them"]


def _generator_notes(info: dict, root: Path) -> list[str]:
    """Episodes a generator (e.g. ``generate_metaworld``'s scripted experts) attempted but did not write."""
    lf = info.get("lf") if isinstance(info, dict) else None
    failed = lf.get("episodes_failed") if isinstance(lf, dict) else None
    attempted = lf.get("episodes_attempted", {}) if isinstance(lf, dict) else {}
    if not isinstance(failed, dict):
        return []
    return [f"{root / 'meta/info.json'}: {n} of {attempted.get(task, '?')} expert episodes of {task!r} failed "
            f"within max_steps and were not written" for task, n in failed.items() if n]


def _inspect_lerobot(root: Path, fmt_name: str, tolerance_s: float) -> dict:
    from ._lerobot_stream import LeRobotStream

    ds = LeRobotStream(root, image_key=None, on_error="skip", tolerance_s=tolerance_s)
    keys = _numeric_keys(ds.meta.features)
    values: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    policy = ErrorPolicy("skip")
    frames = episodes_read = 0
    for m in ds.episodes:
        try:
            arrays = ds.episode_arrays(m, keys)
        except DataError as err:
            policy.handle(err)
            continue
        frames += m.length
        episodes_read += 1
        for k in keys:
            values[k].append(arrays[k])
    by_key = {k: np.concatenate(v) for k, v in values.items() if v}
    stats = {k: compute_stats(v) for k, v in by_key.items()}
    problems = report_errors(ds.errors + policy.errors)
    if fmt_name == "lerobot-v3.0":
        try:
            read_stats(root)  # the check `lf run` makes (LeRobotDataset), in its words
        except (FileNotFoundError, DataError) as err:
            problems.append(str(err))
    skipped = dict(ds.skipped)
    for r, n in policy.skipped.items():
        skipped[r] = skipped.get(r, 0) + n
    notes = _stats_notes(root, fmt_name) + _generator_notes(ds.meta.info, root)
    n_skipped = len(ds.meta.episodes) - episodes_read
    if n_skipped and ds.meta.stats:
        # the stored statistics cover every frame; the frames read miss the skipped episodes
        notes.append(f"stats not compared: {n_skipped} episode(s) skipped; {root / 'meta/stats.json'} covers the "
                     "whole dataset, the frames read do not")
        problems += [p for k, st in ds.meta.stats.items() if isinstance(st, dict)
                     for p in bounds_problems(st, k, str(root / "meta/stats.json"))]  # wrong whatever was read
    else:
        problems += check_stored_stats(ds.meta.stats, by_key, stats, str(root / "meta/stats.json"))
    return {"format": fmt_name, "episodes": len(ds.meta.episodes), "frames": int(ds.meta.info.get("total_frames", 0)),
            "frames_read": frames, "fps": ds.meta.fps, "tasks": len(ds.meta.tasks),
            "features": {k: {"dtype": ft["dtype"], "shape": list(ft["shape"])} for k, ft in ds.meta.features.items()},
            "stats": stats, "skipped": skipped, "problems": problems, "notes": notes}


def _open_robot(root: Path, fmt_name: str, on_error: str):
    if fmt_name == "rlds":
        from .rlds import RLDSDataset

        return RLDSDataset(root, on_error=on_error)
    from .rlbench import RLBenchDataset

    return RLBenchDataset(root, on_error=on_error)


def inspect_dataset(path: str | Path, *, tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict:
    """Report on a dataset folder: format, episodes, frames, features, recomputed statistics and problems.

    Every episode is read (videos: headers only) with ``on_error="skip"``, so
    one report lists every problem found. ``tolerance_s``: accepted distance in
    seconds of a LeRobot timestamp from its frame-grid point (``LeRobotStream``).

    Returns:
        ``{"format", "episodes", "frames", "frames_read", "fps", "tasks", "features":
        {name: {dtype, shape}}, "stats": {name: compute_stats(...)}, "skipped":
        {reason: count}, "problems": [message, ...], "notes": [message, ...]}``. ``problems`` are damage
        (unreadable episodes, one line per broken file naming the episodes it affects; timestamps off the frame
        grid; stored statistics that disagree with the frames, q01/q99 included, or are unusable (not finite,
        q01 > q99, min > max; compared only when no episode was skipped, else a note says so); a LeRobot v3.0
        dataset without ``meta/stats.json``, which ``lf run`` refuses); ``notes`` are findings that do not make the
        dataset wrong but matter to its use (e.g. a v2.1 dataset without stored statistics, failed generator episodes).

    Raises:
        DataError: unknown layout or unreadable metadata.
    """
    root = Path(path)
    fmt_name = detect_format(root)
    if fmt_name.startswith("lerobot"):
        return _inspect_lerobot(root, fmt_name, tolerance_s)
    ds = _open_robot(root, fmt_name, "skip")
    first = ds[0] if len(ds) else None
    feats = {} if first is None else {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                                      for k, v in first.items() if hasattr(v, "dtype")}
    return {"format": fmt_name, "episodes": ds.num_episodes + sum(ds.skipped.values()), "frames": len(ds),
            "frames_read": len(ds), "fps": None, "tasks": len(getattr(ds, "tasks", [])), "features": feats,
            "stats": getattr(ds, "stats", {}), "skipped": ds.skipped, "problems": ds.problems, "notes": []}


def _robot_episodes(ds) -> Iterator[dict]:
    for a, b in ds.episode_ranges:
        items = [ds[i] for i in range(a, b)]
        frames = {"observation.image": np.stack([x["image"].numpy() for x in items]),
                  "action": np.stack([x["actions"][0].numpy() for x in items])}
        if items[0]["state"].numel():
            frames["observation.state"] = np.stack([x["state"].numpy() for x in items])
        yield {"task": items[0]["task"], "frames": frames}


def _lerobot_episodes(ds, keys: list[str], policy: ErrorPolicy) -> Iterator[dict]:
    for m in ds.episodes:
        try:
            arrays = ds.episode_arrays(m, keys)
        except DataError as err:
            policy.handle(err)
            continue
        yield {"task": m.tasks[0], "frames": arrays}


def convert_dataset(src: str | Path, dst: str | Path, *, to: str = "lerobot-v3", on_error: str = "raise",
                    fps: int = 10) -> dict:
    """Convert an RLDS, RLBench or LeRobot v2.1 dataset to LeRobot v3.0 (``write_lerobot_v3``), streaming episodes.

    Video features become ``dtype="image"`` PNG features (the v3.0 writer embeds
    images; lossless, so frames are kept exactly as decoded). RLDS / RLBench
    samples map to ``observation.image``, ``observation.state`` (when present) and
    ``action`` (the step's own action).

    Args:
        src / dst: folders; ``dst`` must not exist or be empty.
        to: only ``"lerobot-v3"``.
        on_error: ``"raise"`` or ``"skip"`` (skipped episodes are reported).
        fps: frame rate written for RLDS / RLBench sources (they store none).

    Returns:
        ``{"format": source format, "episodes": written, "skipped": {reason: n}, "problems": [...]}``.

    Raises:
        DataError / ValueError: unknown formats, bad input under ``on_error="raise"``.
    """
    from ._lerobot_writer import write_lerobot_v3

    if to != "lerobot-v3":
        raise ValueError(f"to must be 'lerobot-v3', got {to!r}")
    src = Path(src)
    fmt_name = detect_format(src)
    if fmt_name == "lerobot-v3.0":
        raise ValueError(f"{src}: already LeRobot v3.0, nothing to convert")
    policy = ErrorPolicy(on_error)
    count = {"episodes": 0}

    def counted(eps):
        for ep in eps:
            count["episodes"] += 1
            yield ep

    if fmt_name == "lerobot-v2.1":
        from ._lerobot_stream import LeRobotStream

        ds = LeRobotStream(src, image_key=None, on_error=on_error)
        feats = {k: ft for k, ft in ds.meta.features.items() if k in _numeric_keys(ds.meta.features)
                 or ft["dtype"] in ("video", "image")}
        features = {k: {"dtype": "image" if ft["dtype"] == "video" else ft["dtype"], "shape": _hwc(ft),
                        "names": None if ft["dtype"] in ("video", "image") else ft.get("names")}
                    for k, ft in feats.items()}
        write_lerobot_v3(dst, counted(_lerobot_episodes(ds, list(feats), policy)), fps=ds.meta.fps,
                         features=features, robot_type=ds.meta.info.get("robot_type"), tasks=ds.meta.tasks)
    else:
        ds = _open_robot(src, fmt_name, on_error)
        first = ds[0]
        features = {"observation.image": {"dtype": "image", "shape": list(first["image"].shape)},
                    "action": {"dtype": "float32", "shape": [int(first["actions"].shape[-1])]}}
        if first["state"].numel():
            features["observation.state"] = {"dtype": "float32", "shape": [int(first["state"].numel())]}
        write_lerobot_v3(dst, counted(_robot_episodes(ds)), fps=fps, features=features, robot_type=None)
    skipped = dict(ds.skipped)
    for r, n in policy.skipped.items():
        skipped[r] = skipped.get(r, 0) + n
    return {"format": fmt_name, "episodes": count["episodes"], "skipped": skipped,
            "problems": ds.problems + policy.problems}
