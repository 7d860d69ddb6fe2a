"""Fault handling of the trainer (every family), on :mod:`lf_orchestrator.faults`' policies.

* :func:`nonfinite_step`: ``train.on_nonfinite`` for a step whose all-reduced loss or gradient norm is NaN/inf
  (``stop`` / ``skip`` / ``rollback``; a pending background save is committed first so that ``rollback``
  finds it).
* :func:`check_finite_weights`: refuses to write a checkpoint of non-finite weights, so a blown-up run never
  rotates its last good checkpoint out.
* :class:`RunGuard`: SIGTERM / SIGINT become a flag agreed over the ranks at each step boundary (the trainer then
  saves and stops), and the ``train.hang_timeout_s`` watchdog gets a heartbeat per step.

Every decision is taken on values all ranks share, so all ranks skip, roll back, save or stop together.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from lf_orchestrator.faults import NonFiniteError, SigtermFlag, apply_nonfinite_policy, record_fault
from lf_orchestrator.watchdog import Watchdog
from lf_parallel import DistContext, global_sum


def nonfinite_step(trainer, reason: str, grad_norm: float) -> dict[str, float]:
    """Apply ``train.on_nonfinite`` to ``trainer`` before its update is applied.

    Returns the step's scalars for ``skip`` (with ``train/target_units`` 0: the throughput counts none).

    Raises:
        NonFiniteError: policy ``stop`` (weights, optimizer, schedule and checkpoints untouched), or ``rollback``
            without a checkpoint or past ``faults.MAX_ROLLBACKS``.
        RolledBack: after reloading the latest checkpoint (all but the data position).
    """
    if trainer.cfg.train.on_nonfinite == "rollback":
        trainer.checkpointer.wait()  # a background save in flight becomes the checkpoint to roll back to
        if trainer.ctx.distributed:
            torch.distributed.barrier()  # rank 0 commits it (rename, marker) before anyone looks
    out = apply_nonfinite_policy(trainer, reason, grad_norm)
    out["train/target_units"] = 0.0
    return out


def nonfinite_parameters(module: nn.Module, ctx: DistContext) -> tuple[str, int]:
    """(the first parameter name of ``module`` holding NaN or inf on this rank, or ``"(on another rank)"``;
    the number of such parameter tensors over all ranks, 0 when all are finite). One ``isfinite`` pass over the
    local shards and one all-reduce; call on every rank."""
    from torch.distributed.tensor import DTensor

    bad = [name for name, p in module.named_parameters()
           if not bool(torch.isfinite(p.detach().to_local() if isinstance(p, DTensor) else p.detach()).all())]
    count = torch.tensor(float(len(bad)), device=ctx.device)
    if ctx.distributed:
        count = global_sum(count, ctx)
    return (bad[0] if bad else "(on another rank)"), int(count)


def check_finite_weights(module: nn.Module, ctx: DistContext, step: int, run_dir: Path) -> None:
    """Raise :class:`NonFiniteError` when any parameter of ``module`` on any rank holds NaN or inf.

    Called before every checkpoint (:func:`nonfinite_parameters`: cheap next to writing the shards). The event goes
    to ``faults.jsonl``.
    """
    first, count = nonfinite_parameters(module, ctx)
    if count == 0:
        return
    if ctx.is_main:
        record_fault(run_dir, {"step": step, "fault": "nonfinite_weights", "reason": first, "action": "stop"})
    raise NonFiniteError(f"step {step}: parameter {first!r} holds NaN or inf ({int(count)} parameter tensors over "
                         f"all ranks); the checkpoint was not written, so the previous ones stay as they were")


class RunGuard:
    """SIGTERM / SIGINT flag and hang watchdog of one :func:`lf_orchestrator.train.fit.fit_loop` call (a context
    manager).

    Args:
        hang_timeout_s: ``train.hang_timeout_s`` (0: no watchdog).
        on_hang: ``train.on_hang`` (``"abort"`` exits the process after the stack dump).
        ctx: the run's distributed context.
        run_dir: where ``hang-rank{r}.txt`` is written.
        describe: a line of run state for the hang report.
    """

    def __init__(self, *, hang_timeout_s: float, on_hang: str, ctx: DistContext, run_dir: Path,
                 describe: Callable[[], str]):
        self.ctx = ctx
        self.signal = SigtermFlag()
        self.watchdog = (Watchdog(hang_timeout_s, Path(run_dir) / f"hang-rank{ctx.rank}.txt",
                                  abort=on_hang == "abort", describe=describe) if hang_timeout_s > 0 else None)

    def __enter__(self) -> RunGuard:
        self.signal.install()
        if self.watchdog is not None:
            self.watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self.signal.uninstall()
        if self.watchdog is not None:
            self.watchdog.stop()

    def step_done(self) -> bool:
        """A step finished: beat the watchdog; whether any rank got SIGTERM / SIGINT (every rank answers the same)."""
        if self.watchdog is not None:
            self.watchdog.beat()
        return self.signal.agreed(self.ctx)
