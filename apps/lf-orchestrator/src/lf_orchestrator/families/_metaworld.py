"""The Meta-World demonstrations the vlm and video families read (generated on rank 0 when absent)."""

from __future__ import annotations

from pathlib import Path


def open_dataset(cfg, generate: bool):
    """``lf_data.LeRobotDataset`` of ``data.path``; with ``generate`` (rank 0) and ``data.source = "metaworld"``
    the expert demonstrations are generated there first (cached, atomic: ``lf_data.generate_metaworld``)."""
    from lf_data import LeRobotDataset, generate_metaworld

    d = cfg.data
    path = Path(d.path).resolve()
    if generate and d.source == "metaworld":
        generate_metaworld(path, tasks=d.tasks, episodes_per_task=d.episodes_per_task, image_size=d.image_size,
                           max_steps=d.max_steps, seed=d.seed, workers=d.workers)
    return LeRobotDataset(path, action_horizon=1)


def split_episodes(n_episodes: int, eval_fraction: float) -> tuple[list[int], list[int]]:
    """(training, held-out) episode indices: every ``round(1 / eval_fraction)``-th episode is held out,
    none when that would leave no training episode."""
    every = max(2, round(1 / eval_fraction))
    held = [e for e in range(n_episodes) if e % every == every - 1]
    train = [e for e in range(n_episodes) if e not in held]
    return (train, held) if train else (list(range(n_episodes)), [])
