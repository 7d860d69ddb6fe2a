"""The fit loop of the trainer: steps, logging window, checkpoint cadence, faults, final save and summary.

:func:`fit_loop` drives :class:`lf_orchestrator.train.trainer.Trainer` (any family, any plan),
:func:`apply_update` ends its plain and its pipeline-parallel step (:mod:`lf_orchestrator.train._pipeline_step`)
the same way, and :func:`lr_schedule` is its learning-rate schedule.

Per step: ``trainer.train_step()``; every ``train.log_every`` steps (and the last) the scalars go to
``metrics.jsonl`` / TensorBoard with the throughput of the window since the previous log line (the trainer's
``rate_key``, ``perf/samples_per_s``: ``train.global_batch`` samples per step, and with ``tokens_per_step``
``perf/tokens_per_s``), ``step_s`` (seconds per step over that window, checkpoint writes included) and, on
CUDA, ``peak_mem_gib`` (``torch.cuda.max_memory_allocated`` since the start, GiB, of the main rank, which writes
the logs); every
``train.ckpt_every`` steps (and the last) ``trainer.save()`` and ``loss_curve.png`` (rank 0); with
``train.ckpt_every = 0`` nothing is saved, not even the last step or at a signal (the curve is still drawn at the
end): for throughput runs of models whose optimizer state would fill the disk. Faults
(:mod:`lf_orchestrator.families._faults`): ``train.on_nonfinite = "rollback"`` saves step 0 first when the run
has no checkpoint yet, and after a rollback (:class:`lf_orchestrator.faults.RolledBack`) the logs restart at
the checkpoint's step; SIGTERM / SIGINT save the step and stop (the summary says ``preempted``, ``signal``,
``exit_code`` 143 / 130); ``train.hang_timeout_s`` arms the hang watchdog, which beats once per step.

A trainer passed here has ``cfg``, ``ctx``, ``run_dir``, ``step``, ``checkpointer``, ``train_step()`` (returns
the step's scalars) and ``save()``; :func:`apply_update` also uses ``optimizer``, ``scheduler`` and ``scaler``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from lf_orchestrator.checkpoint import latest_checkpoint
from lf_orchestrator.families._faults import RunGuard
from lf_orchestrator.faults import RolledBack
from lf_orchestrator.metrics import MetricsLogger, plot_loss_curve

StepCallback = Callable[[int, dict[str, float]], None]
"""``on_step(step, scalars)``: called on every rank after each finished step."""


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def lr_schedule(optimizer: torch.optim.Optimizer, train) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of ``train`` (the config's ``train`` section): :func:`lr_factor` times ``train.lr`` over
    ``train.warmup_steps`` and ``train.steps``, down to ``train.min_lr_ratio``; stepped once per applied update."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(
        step, warmup=train.warmup_steps, total=train.steps, min_ratio=train.min_lr_ratio))


def check_enough_samples(num_samples: int, plan, cfg) -> None:
    """Refuse a data selection too small for one micro-batch per data-parallel rank, naming the fields to change.

    Raises:
        ConfigError: ``num_samples // plan.dp < plan.micro_batch`` (the sampler could not fill one micro-batch).
    """
    from lf_orchestrator.config import ConfigError

    if num_samples // max(plan.dp, 1) < plan.micro_batch:
        raise ConfigError(f"train.global_batch = {cfg.train.global_batch} takes micro-batches of {plan.micro_batch} "
                          f"sample(s) on each of {plan.dp} data-parallel rank(s), but the data gives {num_samples} "
                          f"training sample(s) (selected by data.tasks, data.max_steps, data.episodes_per_task); "
                          f"lower train.global_batch / parallel.micro_batch or select more data")


def apply_update(trainer) -> float:
    """Apply the step's (unscaled, clipped, finite) gradients: optimizer step through the loss scaler, zeroed
    gradients, the LR schedule advanced unless fp16 scaling skipped the update, ``trainer.step`` + 1.

    Returns:
        The learning rate the update used.
    """
    trainer.scaler.step(trainer.optimizer)  # skipped when fp16 gradients hold inf/NaN
    skipped = trainer.scaler.update()
    trainer.optimizer.zero_grad(set_to_none=True)
    lr = trainer.scheduler.get_last_lr()[0]
    if not skipped:  # the schedule counts applied updates
        trainer.scheduler.step()
    trainer.step += 1
    return lr


def scaler_fields(scaler) -> dict[str, float]:
    """The loss scaler's scalars for the step's log (``train/loss_scale``, ``train/skipped_steps``, ...) when fp16
    loss scaling is on, else ``{}``."""
    return {f"train/{k}": float(v) for k, v in scaler.log_fields().items()} if scaler.enabled else {}


def fit_loop(trainer, on_step: StepCallback | None = None, *, step_units: Callable[[dict[str, float]], float],
             rate_key: str, loss_label: str, evaluate: Callable[[], dict[str, float]] | None = None,
             summary: dict[str, Any] | None = None, tokens_per_step: int | None = None) -> dict[str, Any]:
    """Train ``trainer`` until ``train.steps``, logging and checkpointing; returns the run's summary.

    Args:
        trainer: the run (see the module docstring for what it must have).
        on_step: called after each finished step (on every rank) with the step and its scalars.
        step_units: the units a step's scalars count for the throughput (tokens, target units).
        rate_key: the scalar name of the throughput, units per second of the log window.
        loss_label: the y axis of ``loss_curve.png``.
        evaluate: held-out metrics computed after the final save unless preempted, logged at the last step and
            returned as the summary's ``eval`` (absent from the summary when None).
        summary: more summary fields, placed after ``final`` / ``eval``.
        tokens_per_step: sequence tokens of one global batch (``perf/tokens_per_s``); None: the trainer's
            ``rate_key`` already is that rate, or the run has no tokens.

    Returns:
        ``steps``, ``resumed_from``, ``seconds``, ``final`` (the last step's scalars), [``eval``], ``summary``'s
        fields, ``preempted``, and on preemption ``signal`` (``"SIGTERM"`` / ``"SIGINT"``) and ``exit_code``
        (143 / 130). The last checkpoint is committed when this returns (also after an asynchronous save).

    Raises:
        NonFiniteError: ``train.on_nonfinite = "stop"`` on a NaN/inf step (before its update), rollback gave up,
            or the weights to checkpoint hold NaN/inf.
    """
    t, ctx, run_dir = trainer.cfg.train, trainer.ctx, trainer.run_dir
    logger = MetricsLogger(run_dir, start_step=trainer.step, enabled=ctx.is_main)
    start, t0, last, evaluation = trainer.step, time.perf_counter(), {}, {}
    window_units, window_t, window_steps = 0.0, time.perf_counter(), 0
    guard = RunGuard(hang_timeout_s=t.hang_timeout_s, on_hang=t.on_hang, ctx=ctx, run_dir=run_dir,
                     describe=lambda: f"last finished step {trainer.step}")
    preempted = False
    from lf_orchestrator.profiling import StepProfiler

    profiler = StepProfiler(t.profile_steps, run_dir, rank=ctx.rank, device_type=ctx.device.type)
    try:
        with guard:
            if t.on_nonfinite == "rollback" and latest_checkpoint(run_dir) is None:
                trainer.save()  # something to roll back to
            while trainer.step < t.steps:
                profiler.step_begins(trainer.step + 1)
                try:
                    last = trainer.train_step()
                    profiler.step_ends(trainer.step)
                except RolledBack:  # continue from the checkpoint's step; its logs restart there
                    logger.close()
                    logger = MetricsLogger(run_dir, start_step=trainer.step, enabled=ctx.is_main)
                    window_units, window_t, window_steps = 0.0, time.perf_counter(), 0
                    continue
                window_units += step_units(last)
                window_steps += 1
                if trainer.step % t.log_every == 0 or trainer.step == t.steps:
                    now = time.perf_counter()
                    seconds = max(now - window_t, 1e-9)
                    last[rate_key] = window_units / seconds
                    last["perf/samples_per_s"] = window_steps * t.global_batch / seconds
                    if tokens_per_step is not None:
                        last["perf/tokens_per_s"] = window_steps * tokens_per_step / seconds
                    last["step_s"] = (now - window_t) / max(window_steps, 1)
                    window_units, window_t, window_steps = 0.0, now, 0
                    if torch.cuda.is_available() and torch.cuda.is_initialized():
                        last["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
                    logger.log(trainer.step, last)
                if on_step is not None:
                    on_step(trainer.step, last)
                saved = t.ckpt_every > 0 and (trainer.step % t.ckpt_every == 0 or trainer.step == t.steps)
                if saved:
                    trainer.save()
                if ctx.is_main and (saved or trainer.step == t.steps):
                    plot_loss_curve(run_dir, loss_label)
                if guard.step_done():  # SIGTERM / SIGINT on some rank: checkpoint this step, then stop
                    if not saved and t.ckpt_every > 0:
                        trainer.save()
                    preempted = True
                    break
        trainer.checkpointer.close()
        if evaluate is not None and not preempted:
            evaluation = evaluate()
            if evaluation:
                logger.log(trainer.step, evaluation)
    finally:
        if getattr(trainer, "prefetcher", None) is not None:
            trainer.prefetcher.close()  # a step drawn ahead of a stop is not kept
        profiler.close()
        trainer.checkpointer.wait()  # a failed step still leaves the save in flight committed
        logger.close()
    return {"steps": trainer.step, "resumed_from": start, "seconds": time.perf_counter() - t0, "final": last,
            **({"eval": evaluation} if evaluate is not None else {}), **(summary or {}), "preempted": preempted,
            **({"signal": guard.signal.name, "exit_code": guard.signal.exit_code} if preempted else {})}


def trained_phrase(summary: dict) -> str:
    """``"trained 1500 steps in 568 s"``, or after a resume ``"trained steps 501-1500 in 412 s (resumed from step
    500)"``: ``seconds`` only times this process's steps, so the phrase says which steps those were."""
    start, steps, seconds = summary.get("resumed_from") or 0, summary["steps"], summary["seconds"]
    if start:
        return f"trained steps {start + 1}-{steps} in {seconds:.0f} s (resumed from step {start})"
    return f"trained {steps} steps in {seconds:.0f} s"


def resumed_phrase(step: int, steps: int) -> str:
    """What `lf run --resume` prints once the checkpoint is loaded: ``"resumed from step 500 of 1500"``, or,
    when the checkpoint's ``step`` is already at or past ``steps`` (``train.steps``), one line saying that
    nothing is left to train and how to continue."""
    if step > steps:
        return (f"the checkpoint is at step {step}, past train.steps = {steps}: nothing to train; "
                "raise train.steps with --set to continue")
    if step == steps:
        return (f"the checkpoint is at step {step} = train.steps: the run is already finished; "
                "raise train.steps with --set to continue")
    return f"resumed from step {step} of {steps}"


def preempted_phrase(summary: dict, run_dir, ckpt_every: int) -> str:
    """What `lf run` prints after a SIGTERM / SIGINT stop: the saved step and how to resume, or with
    ``train.ckpt_every = 0`` that nothing was saved."""
    sig = summary.get("signal", "SIGTERM")
    if ckpt_every == 0:
        return f"{sig}: stopped at step {summary['steps']}; nothing saved (train.ckpt_every = 0)"
    return f"{sig}: saved step {summary['steps']} and stopped; continue with `lf run --resume {run_dir}`"
