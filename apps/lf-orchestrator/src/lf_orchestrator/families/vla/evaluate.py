"""Closed-loop evaluation: the trained VLA drives the robot in Meta-World.

Each policy step decodes an action chunk (``action_horizon`` steps: action tokens
unnormalized by the run's action tokenizer, or for ``vla_flow`` a chunk integrated
from noise and unnormalized by the action mean/std) and executes it in the
simulator (open-loop within the chunk, as in ACT / OpenVLA-OFT chunking). Episodes
of one task run as a batch of environments stepped in lock-step, so one
model call serves every active episode. A uniform random policy is measured
with the same seeds as the baseline, and on request (``baselines=["bc-mlp"]``) a
behaviour-cloning MLP trained on the same data for the same time
(:mod:`lf_orchestrator.families.vla.baselines`), through the same :func:`rollout`.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from lf_data import MetaWorldEnv, metaworld_episode_seed
from lf_memory import resolve_precision
from lf_orchestrator.checkpoint import latest_checkpoint, load_weights, write_text_atomic
from lf_orchestrator.config import Config, load_config
from lf_orchestrator.families.vla import assembly
from lf_orchestrator.progress import EvalProgress


class Policy(Protocol):
    """Maps a batch of observations to action chunks (n, horizon, action_dim)."""

    horizon: int
    needs_images: bool

    def act(self, images: np.ndarray, states: np.ndarray, texts: Sequence[str]) -> np.ndarray: ...


class VLAPolicy:
    """A trained run's model and encoder: greedy action tokens (``vla``) or a sampled flow (``vla_flow``).

    A flow model integrates from Gaussian noise drawn from a CPU generator seeded with
    ``noise_seed`` (the run's ``eval.seed``), so an evaluation repeats exactly.
    """

    def __init__(self, model, encoder, device: torch.device, precision, noise_seed: int = 0):
        self.model, self.encoder, self.device, self.precision = model, encoder, device, precision
        self.generator = torch.Generator().manual_seed(noise_seed)
        self.horizon = model.cfg.action_horizon
        self.needs_images = True
        self.model.eval()

    @classmethod
    def from_run(cls, run_dir: Path, device: torch.device, cfg: Config | None = None,
                 checkpoint: Path | None = None) -> VLAPolicy:
        """Load ``run_dir``'s config, encoder and (latest) checkpoint weights (a DCP folder written under any
        plan, read whole in this process, or a legacy full-state folder).

        Raises:
            FileNotFoundError: the run has no complete checkpoint or misses a file.
            CheckpointError: damaged checkpoint files (names the file).
        """
        run_dir = Path(run_dir)
        cfg = cfg or load_config(run_dir / "config.toml")
        ckpt = checkpoint or latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"run folder {run_dir}: no complete checkpoint under "
                                    f"{run_dir / 'checkpoints'}")
        encoder = assembly.load_encoder(cfg, run_dir)
        model = assembly.build_model(assembly.load_model_config(run_dir), device, cfg.run.seed)
        model.load_state_dict(load_weights(ckpt, device))
        return cls(model, encoder, device, resolve_precision(cfg.memory.precision, device), cfg.eval.seed)

    @torch.no_grad()
    def act(self, images: np.ndarray, states: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        batch = self.encoder.observation(images, states, texts)
        batch = assembly.fit_images({k: v.to(self.device) for k, v in batch.items()}, self.model.cfg.image_size)
        with self.precision.autocast(self.device.type):
            obs = (batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"])
            if hasattr(self.model, "sample_actions"):  # flow matching: normalized action chunks
                out = self.model.sample_actions(*obs, generator=self.generator)
            else:  # action tokens (FAST: until the end-of-action token)
                out = self.model.generate(*obs, eos_id=getattr(self.encoder, "eos_id", None))
        return self.encoder.decode_actions(out)


class RandomPolicy:
    """Uniform random actions in [-1, 1] (the baseline)."""

    def __init__(self, action_dim: int, horizon: int, seed: int):
        self.action_dim, self.horizon, self.needs_images = action_dim, horizon, False
        self.rng = np.random.default_rng(seed)

    def act(self, images: np.ndarray, states: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        return self.rng.uniform(-1, 1, size=(len(states), self.horizon, self.action_dim))


def rollout(policy: Policy, task: str, *, episodes: int, seed: int, max_steps: int,
            image_size: int, parallel_envs: int = 10,
            on_episodes: Callable[[int, int], None] | None = None) -> list[bool]:
    """Success flag per episode; episode ``e`` resets with ``metaworld_episode_seed(seed, task, e)``.

    Training demonstrations use the run seed as base, evaluation ``eval.seed``, so the
    evaluated goals are not the ones trained on. ``parallel_envs`` environments are
    stepped in lock-step and reused for later episodes; after each such group
    ``on_episodes(done, count)`` is called (episodes of ``task`` finished so far, and in this group).
    """
    results: list[bool] = []
    envs = [MetaWorldEnv(task, image_size=image_size, max_steps=max_steps)
            for _ in range(min(parallel_envs, episodes))]
    try:
        for first in range(0, episodes, len(envs)):
            group = envs[: min(len(envs), episodes - first)]
            obs = [env.reset(seed=metaworld_episode_seed(seed, task, first + i))
                   for i, env in enumerate(group)]
            success, active = [False] * len(group), list(range(len(group)))
            while active:
                images = (np.stack([obs[i]["image"] for i in active]) if policy.needs_images
                          else np.empty((len(active), 0)))
                chunk = policy.act(images, np.stack([obs[i]["state"] for i in active]),
                                   [group[i].instruction for i in active])
                last = chunk.shape[1] - 1
                for j in range(chunk.shape[1]):
                    still = []
                    for row, i in enumerate(active):
                        obs[i], ok, done = group[i].step(  # images only for the next decision
                            np.clip(chunk[row, j], -1.0, 1.0),
                            render=policy.needs_images and j == last)
                        success[i] = success[i] or ok
                        if not done:
                            still.append(i)
                    chunk = chunk[[active.index(i) for i in still]]
                    active = still
                    if not active:
                        break
            results.extend(success)
            if on_episodes is not None:
                on_episodes(len(results), len(success))
    finally:
        for env in envs:
            env.close()
    return results


def _baselines(tasks: list[str], action_dim: int, horizon: int, kw: dict[str, Any], random: bool,
               bc_run_dir: str | None) -> dict[str, dict[str, list[bool]]]:
    """Rollouts of the random policy and the BC MLP of ``bc_run_dir`` for every task (run in a worker process)."""
    torch.set_num_threads(1)
    out: dict[str, dict[str, list[bool]]] = {}
    if random:
        out["random"] = {task: rollout(RandomPolicy(action_dim, horizon, kw["seed"]), task, **kw) for task in tasks}
    if bc_run_dir is not None:
        from lf_orchestrator.families.vla.baselines import BCMLPPolicy

        bc = BCMLPPolicy.from_run(Path(bc_run_dir))
        out["bc_mlp"] = {task: rollout(bc, task, **kw) for task in tasks}
    return out


def eval_tasks(cfg, tasks: list[str] | None = None) -> list[str]:
    """The Meta-World task names to roll out: ``tasks`` if given, else ``data.tasks``; ``["*"]`` (every task of the
    run's LeRobot dataset) becomes the names of the dataset's tasks, each a Meta-World instruction.

    Raises:
        ValueError: under ``["*"]``, a dataset task that is no Meta-World instruction (it cannot be rolled out).
    """
    from lf_data import METAWORLD_INSTRUCTIONS, load_lerobot_meta

    tasks = list(tasks or cfg.data.tasks)
    if tasks != ["*"]:
        return tasks
    names = {text: name for name, text in METAWORLD_INSTRUCTIONS.items()}
    have = load_lerobot_meta(cfg.data.path).tasks
    other = [t for t in have if t not in names]
    if other:
        raise ValueError(f"data.tasks = ['*']: the dataset at {cfg.data.path} holds tasks that are not Meta-World "
                         f"instructions ({other[0]!r}, ...); pass --tasks with Meta-World task names")
    return [names[t] for t in have]


def evaluate_run(run_dir: Path, *, device: torch.device, episodes: int | None = None,
                 tasks: Sequence[str] | None = None, random_baseline: bool | None = None,
                 out_name: str = "eval.json", baselines: Sequence[str] = (),
                 bc_seconds: float | None = None, bc_budget: str = "steps",
                 report: Callable[[str], None] | None = None, cfg: Config | None = None) -> dict[str, Any]:
    """Closed-loop success per task for a run (and the random baseline); writes ``out_name``.

    The random baseline runs in a second process while the VLA is evaluated here, so a
    two-core machine evaluates both in the time of one. ``baselines`` may name ``"bc-mlp"``:
    the behaviour-cloning MLP of :mod:`lf_orchestrator.families.vla.baselines`, trained first for the VLA's
    training budget (``bc_budget``, :data:`lf_orchestrator.families.vla.baselines.BC_BUDGETS`: ``steps``, the VLA's
    optimizer steps at its batch size, or ``time``, its training time or ``bc_seconds``: a VLA run trained
    over several sessions, whose ``summary.json`` times only the last) unless ``RUN/bc_mlp/`` holds one
    trained under the same rule, rolled out in the same worker with the same seeds; its rows get
    ``bc_mlp_success`` and the report its training record (with ``budget_rule``) under ``bc_mlp``.
    ``report`` (e.g. :class:`lf_orchestrator.progress.LineReporter`) receives progress lines: the BC MLP's
    training and, per group of episodes and per task, the VLA's rollouts with the time left
    (:class:`lf_orchestrator.progress.EvalProgress`). ``cfg``: the run's config as read with overrides
    (``lf eval --set``); default: ``run_dir/config.toml`` as it is.

    Raises:
        ValueError: an unknown task or baseline name.
        FileNotFoundError: no checkpoint, or (for ``bc-mlp``) no ``summary.json`` to time its training.
    """
    run_dir = Path(run_dir)
    cfg = cfg or load_config(run_dir / "config.toml")
    e = cfg.eval
    episodes = episodes or e.episodes
    tasks = eval_tasks(cfg, tasks)
    from lf_data import METAWORLD_INSTRUCTIONS

    unknown = [t for t in tasks if t not in METAWORLD_INSTRUCTIONS]
    if unknown:
        raise ValueError(f"--tasks: unknown Meta-World task {unknown[0]!r}")
    from lf_orchestrator.families.vla.baselines import BASELINES, BC_DIR, train_bc_mlp

    wrong = [b for b in baselines if b not in BASELINES]
    if wrong:
        raise ValueError(f"--baseline: unknown baseline {wrong[0]!r} (known: {', '.join(BASELINES)})")
    bc_record = None
    if "bc-mlp" in baselines:
        record_path = run_dir / BC_DIR / "bc_mlp.json"
        budget = "time" if bc_seconds is not None else bc_budget
        saved = record_path.is_file() and (run_dir / BC_DIR / "model.safetensors").is_file()
        bc_record = json.loads(record_path.read_text()) if saved else None
        if bc_record is None or bc_record.get("budget", "time") != budget:  # none yet, or another rule's
            bc_record = train_bc_mlp(run_dir, cfg=cfg, budget=budget, seconds=bc_seconds, report=report)
    policy = VLAPolicy.from_run(run_dir, device, cfg)
    baseline = e.random_baseline if random_baseline is None else random_baseline
    kw = dict(episodes=episodes, seed=e.seed, max_steps=e.max_steps,
              image_size=cfg.data.image_size)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = pool.submit(_baselines, tasks, policy.model.cfg.action_dim, policy.horizon, kw, baseline,
                              str(run_dir) if bc_record is not None else None
                              ) if baseline or bc_record is not None else None
        vla, invalid = {}, {}  # FAST: chunks decoded / fallen back to zero actions, per task
        progress = EvalProgress(report, tasks, episodes)
        for task in tasks:
            before = dict(getattr(policy.encoder, "decode_counts", {}))
            vla[task] = rollout(policy, task, **kw,
                                on_episodes=lambda done, count, task=task: progress.episodes_done(task, done, count))
            progress.task_done(task, vla[task])
            if hasattr(policy.encoder, "decode_counts"):
                invalid[task] = {k: v - before[k] for k, v in policy.encoder.decode_counts.items()}
        others = pending.result() if pending is not None else {}
    rnd, bc = others.get("random", {}), others.get("bc_mlp", {})
    rows = []
    for task in tasks:
        row = {"task": task, "episodes": episodes, "vla_success": sum(vla[task]) / episodes,
               "vla_successes": [bool(x) for x in vla[task]]}
        if task in rnd:
            row["random_success"] = sum(rnd[task]) / episodes
        if task in invalid:
            row["action_chunks"], row["invalid_action_chunks"] = invalid[task]["chunks"], invalid[task]["invalid"]
        if task in bc:
            row["bc_mlp_success"] = sum(bc[task]) / episodes
            row["bc_mlp_successes"] = [bool(x) for x in bc[task]]
        rows.append(row)
    report = {"run_dir": str(run_dir), "checkpoint": str(latest_checkpoint(run_dir)),
              "eval_seed": e.seed, "max_steps": e.max_steps, "seconds": time.perf_counter() - t0,
              "tasks": rows}
    if invalid:
        report["invalid_action_chunks"] = sum(v["invalid"] for v in invalid.values())
    if bc_record is not None:
        report["bc_mlp"] = {k: v for k, v in bc_record.items() if k != "loss_curve"}
    write_text_atomic(run_dir / out_name, json.dumps(report, indent=1))
    return report
