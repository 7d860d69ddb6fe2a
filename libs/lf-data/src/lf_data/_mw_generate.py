"""Scripted-expert Meta-World demonstrations -> LeRobot v3.0 dataset (cached, atomic)."""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import numbers
import os
import shutil
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from . import _lerobot_writer
from ._mw_env import MetaWorldEnv, import_sim
from ._mw_instructions import instruction_for

__all__ = ["generate_metaworld", "metaworld_episode_seed", "METAWORLD_FEATURES_NAMES"]

_OBJ = [f"{o}_{a}" for o in ("obj1", "obj2") for a in ("x", "y", "z", "qw", "qx", "qy", "qz")]
_FRAME = ["hand_x", "hand_y", "hand_z", "gripper", *_OBJ]
METAWORLD_FEATURES_NAMES = {
    "observation.state": _FRAME + [f"prev_{n}" for n in _FRAME] + ["goal_x", "goal_y", "goal_z"],
    "action": ["dx", "dy", "dz", "gripper"],
}


def metaworld_episode_seed(seed: int, task: str, episode: int) -> int:
    """Reset seed of episode ``episode`` of ``task``: ``SeedSequence([seed, crc32(task), episode])``.

    Stable across processes and Python versions (no ``hash()``); in [0, 2**32).
    Use another ``seed`` for evaluation episodes to get goals unseen in training.
    """
    if seed < 0 or episode < 0:
        raise ValueError(f"seed and episode must be >= 0, got {seed}, {episode}")
    ss = np.random.SeedSequence([int(seed), zlib.crc32(task.encode()), int(episode)])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def _features(image_size: int) -> dict[str, dict]:
    return {
        "observation.image": {"dtype": "image", "shape": [image_size, image_size, 3],
                              "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [39],
                              "names": METAWORLD_FEATURES_NAMES["observation.state"]},
        "action": {"dtype": "float32", "shape": [4], "names": METAWORLD_FEATURES_NAMES["action"]},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "next.success": {"dtype": "bool", "shape": [1], "names": None},
    }


def _run_episode(env: MetaWorldEnv, seed: int, max_steps: int, steps_after_success: int) -> dict | None:
    """Frames of one expert episode, or None if it did not succeed within ``max_steps``."""
    obs = env.reset(seed)
    images, states, actions, successes, success_at = [], [], [], [], None
    while True:
        action = env.expert_action()
        images.append(obs["image"])
        states.append(obs["state"])
        actions.append(action)
        obs, success, _ = env.step(action)
        successes.append(success)
        t = len(actions) - 1
        if success and success_at is None:
            success_at = t
        if success_at is not None and t - success_at >= steps_after_success:
            break
        if success_at is None and len(actions) >= max_steps:
            return None
    done = np.zeros(len(actions), dtype=bool)
    done[-1] = True
    return {"observation.image": np.stack(images), "observation.state": np.stack(states),
            "action": np.stack(actions), "next.done": done, "next.success": np.array(successes)}


_WORKER_ENVS: dict[tuple, MetaWorldEnv] = {}


def _job(args: tuple, envs: dict | None = None) -> tuple:
    """One (task, episode) job; envs are cached per process and reused (reset is exact)."""
    i, task, env_seed, image_size, camera, max_steps, after = args
    envs = _WORKER_ENVS if envs is None else envs
    key = (task, image_size, camera, max_steps)
    if key not in envs:
        envs[key] = MetaWorldEnv(task, image_size=image_size, camera=camera, max_steps=max_steps)
    return i, _run_episode(envs[key], env_seed, max_steps, after)


def _check_existing(out: Path, params: dict) -> bool:
    """True if ``out`` holds a complete dataset made with ``params``; False if absent or empty."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    info_path = out / "meta/info.json"
    try:
        stored = json.loads(info_path.read_text())["lf"]["params"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{out}: exists but is not a Meta-World dataset written by lf "
                         f"({info_path} missing or without 'lf.params'); pick another --out or delete it") from None
    for key in sorted(set(params) | set(stored)):
        if stored.get(key) != params.get(key):
            raise ValueError(f"{out}: generated with {key}={stored.get(key)!r}, "
                             f"requested {key}={params.get(key)!r}; pick another --out or delete it")
    needed = ["meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet",
              "data/chunk-000/file-000.parquet"]
    absent = [p for p in needed if not (out / p).is_file()]
    if absent:
        raise ValueError(f"{out}: incomplete (missing {absent}); delete it")
    return True


def generate_metaworld(
    out_dir: str | Path,
    *,
    tasks: Sequence[str],
    episodes_per_task: int,
    image_size: int = 64,
    camera: str = "corner",
    max_steps: int = 150,
    steps_after_success: int = 10,
    seed: int = 0,
    workers: int = 2,
    fps: int = 20,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Run Meta-World's scripted experts and write a LeRobot v3.0 dataset at ``out_dir``.

    Episode ``e`` of ``task`` is reset with ``metaworld_episode_seed(seed, task, e)``.
    Each frame holds the camera image and state *before* the action, the expert
    action (clipped to [-1, 1], float32), ``next.success`` (after the action) and
    ``next.done`` (last frame). An episode runs until ``steps_after_success``
    steps after its first success; episodes without success within
    ``max_steps`` are dropped and counted in ``info.json["lf"]``, so a task may
    hold fewer than ``episodes_per_task`` episodes. ``task_index`` follows the
    order of ``tasks``; ``episode_index`` follows (task, episode) order,
    whatever ``workers`` is.

    Cached and atomic: if ``out_dir`` already holds a dataset generated with the
    same parameters (``workers`` and ``progress`` excluded) it is returned at
    once; otherwise the dataset is written to a hidden sibling folder and renamed
    into place at the end, so an interrupted run never leaves ``out_dir`` looking
    complete (a hard kill may leave a ``.NAME.tmp-*`` sibling to delete).

    Args:
        out_dir: dataset folder.
        tasks: Meta-World v3 task names (keys of ``METAWORLD_INSTRUCTIONS``).
        episodes_per_task: expert episodes attempted per task.
        image_size: square image side in pixels. camera: MuJoCo camera name.
        max_steps: steps allowed to reach success. steps_after_success: frames kept after it.
        seed: base seed. workers: processes (spawn context); 1 runs in this process.
        fps: stored frame rate (timestamps = frame_index / fps).
        progress: ``progress(done, total)`` after each finished episode.

    Returns:
        ``Path(out_dir)``.

    Raises:
        ValueError: unknown task, bad argument, or ``out_dir`` holds something else
            (another parameter set: the message names the parameter).
        RuntimeError: every expert episode failed.
        ImportError: the ``sim`` extra is missing.

    Example:
        >>> generate_metaworld("data/mw", tasks=["reach-v3"], episodes_per_task=5)  # doctest: +SKIP
    """
    tasks = list(tasks)
    for t in tasks:
        instruction_for(t)
    if not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks must be non-empty and distinct, got {tasks}")
    checked = {}
    for name, value, low in [("episodes_per_task", episodes_per_task, 1), ("image_size", image_size, 8),
                             ("max_steps", max_steps, 1), ("steps_after_success", steps_after_success, 0),
                             ("seed", seed, 0), ("workers", workers, 1), ("fps", fps, 1)]:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        checked[name] = int(value)
    episodes_per_task, image_size, max_steps = checked["episodes_per_task"], checked["image_size"], checked["max_steps"]
    steps_after_success, seed, workers, fps = (checked[k] for k in ("steps_after_success", "seed", "workers", "fps"))
    params = {"tasks": tasks, "episodes_per_task": episodes_per_task, "image_size": image_size,
              "camera": camera, "max_steps": max_steps, "steps_after_success": steps_after_success,
              "seed": seed, "fps": fps}
    out = Path(out_dir)
    if _check_existing(out, params):
        return out
    import_sim()
    meta = [(t, e) for t in tasks for e in range(episodes_per_task)]
    jobs = [(i, t, metaworld_episode_seed(seed, t, e), image_size, camera, max_steps, steps_after_success)
            for i, (t, e) in enumerate(meta)]
    failed: dict[str, list[int]] = {t: [] for t in tasks}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    pool, local_envs = None, {}
    try:
        if workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(workers)
            results = pool.imap_unordered(_job, jobs)
        else:
            results = (_job(j, local_envs) for j in jobs)

        def ordered() -> Iterator[dict]:
            pending, nxt, done = {}, 0, 0
            for i, frames in results:
                pending[i] = frames
                done += 1
                if progress is not None:
                    progress(done, len(jobs))
                while nxt in pending:
                    frames, (task, _) = pending.pop(nxt), meta[nxt]
                    if frames is None:
                        failed[task].append(jobs[nxt][2])
                    else:
                        yield {"task": instruction_for(task), "frames": frames}
                    nxt += 1
            if all(len(f) == episodes_per_task for f in failed.values()):
                raise RuntimeError(f"{out}: all {len(jobs)} expert episodes failed within "
                                   f"max_steps={max_steps}")

        _lerobot_writer.write_lerobot_v3(tmp, ordered(), fps=fps, features=_features(image_size),
                                         robot_type="sawyer", tasks=[instruction_for(t) for t in tasks])
        info_path = tmp / "meta/info.json"
        info = json.loads(info_path.read_text())
        info["lf"] = {
            "generator": "lf_data.generate_metaworld", "params": params,
            "episodes_attempted": {t: episodes_per_task for t in tasks},
            "episodes_failed": {t: len(f) for t, f in failed.items()},
            "failed_reset_seeds": failed,
            "versions": {p: importlib.metadata.version(p) for p in ("lf-data", "metaworld", "mujoco")},
        }
        info_path.write_text(json.dumps(info, indent=4))
        if out.exists():
            if _check_existing(out, params):  # a concurrent run finished first
                shutil.rmtree(tmp)
                return out
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        for env in local_envs.values():
            env.close()
    return out
