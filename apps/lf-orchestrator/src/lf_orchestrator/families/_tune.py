"""``parallel.tune = "measure"`` (``lf run --tune measure``): keep the fastest of the auto-tuner's top plans as
measured on this job's hardware, not as predicted.

With ``parallel.plan = "auto"`` the trainer normally trains with the cost model's fastest plan it can run
(:func:`lf_orchestrator.families._plan.auto_plan`). Under ``tune = "measure"`` it first takes the first
``parallel.tune_top`` plans of the same ranking that it can run (:func:`runnable_candidates`), trains each for
one warm-up and ``parallel.tune_steps`` timed optimizer steps on the run's own data, model and precision
(:func:`measure_candidates`: each a fresh :class:`~lf_orchestrator.train.trainer.Trainer` sharing the
prepared family, so the data is prepared once), and trains the run with the plan of the lowest median step
time. A trial's step time is the slowest rank's; its peak memory the largest rank's
``torch.cuda.max_memory_allocated`` over the timed steps (None on the CPU). A trial that runs out of memory in
a one-process job is recorded and skipped; in a multi-process job one rank's OOM leaves the others waiting in
a collective, so a plan the memory model prunes too little stops the job there (the ranking only holds plans
the memory model fits).

This is the measured mode of DeepSpeed's autotuner and of Megatron's manual sweeps, bounded to the ranking's
head: the cost model prunes thousands of plans in seconds, the trials settle what it cannot predict (kernel
choices, host overhead, the real interconnect). The trials, the predictions beside them and the choice go in
``plan.json`` (``tune``); a resumed run reads its plan back from there (``tuned_plan``) instead of trying again.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from pathlib import Path

import msgspec
import torch

from lf_parallel import Plan, PlanError, check_plan

WARMUP_STEPS = 1
"""Untimed optimizer steps per trial (allocator growth, autotuned kernels, first collectives)."""


def runnable_candidates(cfg, graph, *, world_size: int, device_type: str, seq: int, precision: str,
                        top: int) -> list[tuple[Plan, dict]]:
    """The first ``top`` distinct plans of ``lf plan``'s ranking that the trainer runs on ``world_size``
    processes, each as ``(plan, info)`` with ``info``'s ``predicted_step_s`` and ``recompute`` (on one process
    the ZeRO stages are one plan: only ZeRO-0 is tried).

    Raises:
        PlanError: no plan of the ranking runs here (the ranking's own errors name what is missing).
    """
    from lf_orchestrator.families._plan import rank_plans, search_cluster, trainer_unsupported

    cluster, nominal = search_cluster(device_type, world_size)
    result = rank_plans(cfg, graph, cluster, seq=seq, precision=precision)
    found: list[tuple[Plan, dict]] = []
    seen: set[tuple[str, str]] = set()
    for cand in result.ranked:
        if world_size == 1 and cand.plan.zero_stage:  # one process: a ZeRO stage shards nothing, same plan
            continue
        if trainer_unsupported(cand.plan, cfg, graph, seq) is not None:
            continue
        try:  # autocast, not FSDP casts, sets the compute dtype (as auto_plan)
            plan = check_plan(msgspec.structs.replace(cand.plan, precision="fp32"), world_size=world_size,
                              global_batch=cfg.train.global_batch, graph=graph)
        except PlanError:
            continue
        key = (plan.describe(), cand.recompute)
        if key in seen:
            continue
        seen.add(key)
        found.append((plan, {"source": "auto, measured", "predicted_step_s": cand.cost.step_s,
                             "recompute": cand.recompute, "cluster": cluster.describe(), "nominal_cluster": nominal,
                             "considered": result.considered}))
        if len(found) == top:
            break
    if not found:
        raise PlanError(f"parallel.tune = 'measure': none of the {result.considered} ranked plans runs in this "
                        f"trainer on {world_size} process(es)")
    return found


def _slowest(ctx, value: float) -> float:
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t[0])


def _trial(cfg, run_dir: Path, ctx, family, plan: Plan, info: dict) -> dict:
    """One plan's trial: median step seconds (slowest rank) and peak GiB (largest rank; None on the CPU)."""
    from lf_orchestrator.train import Trainer

    rep = msgspec.structs.replace
    steps = WARMUP_STEPS + cfg.parallel.tune_steps
    trial_cfg = rep(cfg, train=rep(cfg.train, steps=steps, ckpt_every=0, profile_steps=[]),
                    eval=rep(cfg.eval, at_end=False))
    cuda = ctx.device.type == "cuda"
    trainer = Trainer(trial_cfg, run_dir, ctx, family=family, plan=(plan, info))
    try:
        times = []
        for step in range(steps):
            if step == WARMUP_STEPS and cuda:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            trainer.train_step()  # ends reading its scalars: the device has finished the step
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return {"measured_step_s": _slowest(ctx, statistics.median(times[WARMUP_STEPS:])),
                "peak_gib": None if peak is None else _slowest(ctx, peak)}
    finally:
        trainer.prefetcher.close()
        del trainer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def measure_candidates(cfg, run_dir: Path, ctx, family, candidates: list[tuple[Plan, dict]], console=None
                       ) -> tuple[tuple[Plan, dict], list[dict]]:
    """Train each candidate briefly (see the module docstring); returns ``((plan, info), rows)``: the measured
    fastest with ``info["tune"] = rows`` and ``info["tuned_plan"]`` (the plan as builtins, for a resume), and one
    row per trial (``plan``, ``recompute``, ``predicted_step_s``, ``measured_step_s``, ``peak_gib``,
    ``prediction_error``; or ``error``).

    Raises:
        PlanError: every trial failed (the rows' errors are in the message).
    """
    rows = []
    for i, (plan, info) in enumerate(candidates):
        row = {"plan": plan.describe(), "recompute": info["recompute"], "predicted_step_s": info["predicted_step_s"]}
        try:
            row.update(_trial(cfg, Path(run_dir) / "tune" / f"trial-{i}", ctx, family, plan, info))
            row["prediction_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
        except torch.OutOfMemoryError as err:
            row["error"] = f"out of memory: {str(err).splitlines()[0][:200]}"
        rows.append(row)
        if console is not None and ctx.is_main:
            got = (f"{row['measured_step_s'] * 1e3:.1f} ms/step" if "measured_step_s" in row else row["error"])
            console.print(f"tune {i + 1}/{len(candidates)}: {row['plan']} (recompute={row['recompute']}): "
                          f"predicted {row['predicted_step_s'] * 1e3:.1f} ms/step, measured {got}",
                          highlight=False, soft_wrap=True)
    done = [i for i, r in enumerate(rows) if "measured_step_s" in r]
    if not done:
        raise PlanError("parallel.tune = 'measure': every trial failed: "
                        + "; ".join(f"{r['plan']}: {r['error']}" for r in rows))
    best = min(done, key=lambda i: rows[i]["measured_step_s"])
    plan, info = candidates[best]
    info = {**info, "tune": rows, "tuned_plan": msgspec.to_builtins(plan),
            "measured_step_s": rows[best]["measured_step_s"]}
    return (plan, info), rows


def tuned_plan_of(run_dir: Path) -> tuple[Plan, dict] | None:
    """The plan a ``tune = "measure"`` run chose, read back from its ``plan.json`` (None: not there)."""
    path = Path(run_dir) / "plan.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if "tuned_plan" not in saved:
        return None
    plan = msgspec.convert(saved["tuned_plan"], Plan)
    kept = {k: v for k, v in saved.items() if k not in _REBUILT}  # the trials, predictions, cluster, ...
    return plan, {**kept, "source": "auto, measured before the resume", "recompute": saved.get("recompute", "none")}


_REBUILT = ("plan", "world_size", "device", "precision", "source", "recomputed_blocks", "recompute_plan", "params",
            "trainable_params", "fused_ops", "lora_modules", "frozen_params", "resharded_from")
"""plan.json keys a resumed trainer writes again itself; the others come back from the tuned run's plan.json."""
