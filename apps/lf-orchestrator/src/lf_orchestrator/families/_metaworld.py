"""The Meta-World demonstrations the vla, vlm and video families read (generated on rank 0 when absent)."""

from __future__ import annotations

from pathlib import Path


def open_dataset(cfg, generate: bool, *, action_horizon: int = 1, progress=None):
    """``lf_data.LeRobotDataset`` of ``data.path`` with ``action_horizon`` actions per sample; with ``generate``
    (rank 0) and ``data.source = "metaworld"`` the expert demonstrations are generated there first (cached,
    atomic: ``lf_data.generate_metaworld``; ``progress(done, total)`` follows the episodes).
    With ``data.source = "lerobot"`` only ``data.tasks`` and ``data.max_steps`` frames per episode are read
    (:func:`dataset_selection`)."""
    from lf_data import LeRobotDataset, generate_metaworld

    d = cfg.data
    path = Path(d.path).resolve()
    if generate and d.source == "metaworld":
        generate_metaworld(path, tasks=d.tasks, episodes_per_task=d.episodes_per_task, image_size=d.image_size,
                           max_steps=d.max_steps, seed=d.seed, workers=d.workers, progress=progress)
    return LeRobotDataset(path, action_horizon=action_horizon, **dataset_selection(cfg))


def dataset_selection(cfg) -> dict:
    """``LeRobotDataset`` keyword arguments (``tasks``, ``max_frames``) that make a ``data.source = "lerobot"``
    dataset hold what ``data.tasks`` and ``data.max_steps`` say, as a generated Meta-World one does; ``{}`` for
    ``data.source = "metaworld"`` (generated from these very settings).

    A ``data.tasks`` entry names a task string of the dataset (``meta/tasks.parquet``), or a Meta-World task
    name (``reach-v3``) whose instruction (``lf_data.METAWORLD_INSTRUCTIONS``) is one; episodes of other tasks
    are skipped; ``["*"]`` selects every task. Each episode keeps its first ``data.max_steps`` frames.

    Raises:
        ConfigError: a ``data.tasks`` entry that the dataset does not hold (the message lists those it holds).
    """
    from lf_data import METAWORLD_INSTRUCTIONS, load_lerobot_meta
    from lf_orchestrator.config import ALL_TASKS, ConfigError

    d = cfg.data
    if d.source != "lerobot":
        return {}
    have = load_lerobot_meta(d.path).tasks
    tasks = []
    for name in (list(have) if d.tasks == [ALL_TASKS] else d.tasks):
        task = name if name in have else METAWORLD_INSTRUCTIONS.get(name)
        if task not in have:
            shown = ", ".join(repr(t) for t in have[:20]) + (f", ... ({len(have)} in all)" if len(have) > 20 else "")
            also = f" (instruction {task!r})" if task is not None else ""
            raise ConfigError(f"data.tasks: {name!r}{also} is not a task of the LeRobot dataset at {d.path}; "
                              f"it has {len(have)}: {shown}")
        tasks.append(task)
    return {"tasks": tasks, "max_frames": d.max_steps}


def split_episodes(n_episodes: int, eval_fraction: float) -> tuple[list[int], list[int]]:
    """(training, held-out) episode indices: every ``round(1 / eval_fraction)``-th episode is held out,
    none when that would leave no training episode."""
    every = max(2, round(1 / eval_fraction))
    held = [e for e in range(n_episodes) if e % every == every - 1]
    train = [e for e in range(n_episodes) if e not in held]
    return (train, held) if train else (list(range(n_episodes)), [])
