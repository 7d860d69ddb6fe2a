"""`lf run` for every family: run folder, plan (tuned by measurement with ``parallel.tune = "measure"``,
:mod:`lf_orchestrator.families._tune`), ``plan.json``, training with a progress display, held-out evaluation,
``summary.json`` and the family's after-training step (the VLA's closed-loop evaluation); the trainer itself is
:class:`lf_orchestrator.train.trainer.Trainer`."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lf_memory import resolve_precision
from lf_orchestrator._cpu_numerics import cpu_numerics
from lf_orchestrator.checkpoint import write_text_atomic
from lf_orchestrator.families._recompute import plan_line
from lf_orchestrator.families._tune import tuned_plan_of
from lf_orchestrator.families.base import Family
from lf_orchestrator.progress import TrainProgress
from lf_orchestrator.run_folder import absolute_paths, announce_run_folder, start_run_folder
from lf_orchestrator.train.fit import resumed_phrase, trained_phrase
from lf_orchestrator.train.trainer import Trainer, precision_name, prepare_family
from lf_parallel import DistContext


def write_plan(trainer: Trainer) -> None:
    """``plan.json`` of the run folder (rank 0)."""
    if trainer.ctx.is_main:
        write_text_atomic(trainer.run_dir / "plan.json", json.dumps(
            {"plan": trainer.plan.describe(), "world_size": trainer.ctx.world_size, "device": str(trainer.ctx.device),
             "precision": str(trainer.precision.compute_dtype), **trainer.plan_info, "cpu_numerics": cpu_numerics()},
            indent=1, default=str))


def _measure_plans(cfg, run_dir: Path, ctx: DistContext, family, console):
    """``parallel.tune = "measure"``: trials of the top runnable plans (:mod:`.families._tune`); the fastest."""
    import shutil

    from lf_orchestrator.families._tune import measure_candidates, runnable_candidates

    dtype = resolve_precision(cfg.memory.precision, ctx.device).compute_dtype
    prec = precision_name(dtype)
    cands = runnable_candidates(cfg, family.graph, world_size=ctx.world_size, device_type=ctx.device.type,
                                seq=family.seq_len, precision=prec, top=cfg.parallel.tune_top)
    if ctx.is_main:
        console.print(f"tune: measuring {len(cands)} plan(s), {cfg.parallel.tune_steps} timed step(s) each",
                      highlight=False)
    chosen, _ = measure_candidates(cfg, run_dir, ctx, family, cands, console)
    if ctx.distributed:
        torch.distributed.barrier()
    if ctx.is_main:
        shutil.rmtree(Path(run_dir) / "tune", ignore_errors=True)
    return chosen


def run_family(cfg, ctx: DistContext, resume: Path | None, run_dir: Path | None, console) -> None:
    """`lf run` of any family: run folder, training, evaluation, summary (see the module docstring).

    Raises:
        typer.Exit: a preempted run (SIGTERM / SIGINT; exit code 143 / 130), after saving its step.
    """
    cfg = absolute_paths(cfg)  # so a resumed or evaluated run finds its files from any folder
    run_dir = start_run_folder(cfg, ctx, resume, run_dir, console)
    # a rich bar on a terminal, plain lines every train.log_every steps when the output is redirected
    with TrainProgress(console, enabled=ctx.is_main, log_every=cfg.train.log_every) as progress:
        trainer = _trainer(cfg, ctx, resume, run_dir, console, progress.data)
        if trainer is None:
            return
        progress.start(cfg.train.steps, trainer.step)
        summary = trainer.fit(progress.step)
    if summary["preempted"]:
        import typer

        if ctx.is_main:
            from lf_orchestrator.train.fit import preempted_phrase

            console.print(preempted_phrase(summary, run_dir, cfg.train.ckpt_every), highlight=False)
        raise typer.Exit(summary["exit_code"])
    if not ctx.is_main:
        return
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=1, default=str))
    extra = " ".join(f"{k.removeprefix('eval/')} {v:.4g}" for k, v in summary["eval"].items())
    if not extra and trainer.pipe is not None and cfg.eval.at_end and type(trainer.family).evaluate is not \
            Family.evaluate:  # a family with held-out metrics (the VLA's closed-loop evaluation still runs below)
        extra_note = "; eval skipped: held-out evaluation does not run under pipeline parallel yet"
    else:
        extra_note = f"; eval: {extra}" if extra else ""
    console.print(f"{trained_phrase(summary)}{extra_note}; loss curve: {run_dir / 'loss_curve.png'}",
                  highlight=False)
    trainer.family.after_training(run_dir, ctx.device, console)


def _trainer(cfg, ctx: DistContext, resume: Path | None, run_dir: Path, console, data_progress) -> Trainer | None:
    """The run's trainer, its plan written and announced; None when a resumed run has nothing left to train."""
    from lf_orchestrator.config import to_toml

    family, plan = None, None
    if cfg.parallel.plan == "auto" and cfg.parallel.tune == "measure":
        family = prepare_family(cfg, run_dir, ctx, data_progress)
        plan = tuned_plan_of(run_dir) if resume is not None else None
        if plan is None:
            plan = _measure_plans(cfg, run_dir, ctx, family, console)
    trainer = Trainer(cfg, run_dir, ctx, resume=resume is not None, family=family, plan=plan,
                      data_progress=data_progress)
    announce_run_folder(run_dir, ctx, console)
    if ctx.is_main and resume is not None:
        write_text_atomic(run_dir / "config.toml", to_toml(cfg))
        console.print(resumed_phrase(trainer.step, cfg.train.steps))
        if trainer.resharded:
            console.print(trainer.resharded, highlight=False)
            trainer.plan_info["resharded_from"] = trainer.resharded
    if trainer.step >= cfg.train.steps:  # after a resume, resumed_phrase said so
        if ctx.is_main and resume is None:
            console.print("the run is already finished; raise train.steps with --set to continue")
        return None
    write_plan(trainer)
    if ctx.is_main:
        _announce_plan(trainer, console)
    return trainer


def _announce_plan(trainer: Trainer, console) -> None:
    """The plan line (source, plan, prediction, parameters) and the notes that go with it."""
    info = trainer.plan_info
    predicted = (f", predicted {info['predicted_step_s'] * 1e3:.1f} ms/step on {info['cluster']}"
                 + (" (nominal: CPU job)" if info.get("nominal_cluster") else "")
                 if "predicted_step_s" in info else "")
    if "measured_step_s" in info:
        predicted += f", measured {info['measured_step_s'] * 1e3:.1f} ms/step while tuning"
    console.print(f"plan ({info['source']}): {trainer.plan.describe()} on {trainer.ctx.device}{predicted}; "
                  f"{info.get('params', sum(p.numel() for p in trainer.model.parameters())):,} parameters, "
                  f"{info['trainable_params']:,} trainable", highlight=False)
    for skip in info.get("skipped", ()):  # faster plans of the ranking that this trainer cannot run
        console.print(f"auto skipped {skip['plan']} (recompute={skip['recompute']}): {skip['why']}",
                      highlight=False, soft_wrap=True)
    if "recompute_plan" in info:
        console.print(plan_line(info["recompute_plan"]), highlight=False)
    if "data" in info:
        console.print(f"data: {info['data']}", highlight=False)
