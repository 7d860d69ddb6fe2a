"""Fault handling of a training run: non-finite steps, SIGTERM (preemption) and hangs.

* Non-finite loss or gradient norm (``train.on_nonfinite``): ``stop`` raises :class:`NonFiniteError`
  before the update is applied; ``skip`` drops the update (weights, optimizer and schedule unchanged, the
  batch is consumed); ``rollback`` reloads the latest checkpoint's weights, optimizer, schedule and RNG but
  keeps the data position, so the batches that led to the blow-up are not replayed (the recovery of PaLM,
  Chowdhery et al. 2022, section 5.1). Every event is appended to ``faults.jsonl`` in the run folder.
* SIGTERM (preemption) and SIGINT (Ctrl-C): the handler only sets a flag; at the end of the step every rank
  agrees (one all-reduce), the step is checkpointed and the run stops (``lf run`` exits with 143 / 130 and
  prints the resume command). A second signal kills at once.
* Hangs: :class:`lf_orchestrator.watchdog.Watchdog` (``train.hang_timeout_s``).

Every decision is taken on values all ranks share (all-reduced loss, the data-parallel gradient norm),
so all ranks skip, roll back or stop together.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import torch

MAX_ROLLBACKS = 3
"""Rollbacks to one checkpoint before the run stops (the blow-up is not the data's fault)."""

FAULTS_FILE = "faults.jsonl"


class NonFiniteError(RuntimeError):
    """A step produced a non-finite loss or gradient and the policy says stop (or rollback gave up)."""


class RolledBack(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the trainer after restoring the latest checkpoint; the loop restarts its logging there."""


def nonfinite_reason(loss: torch.Tensor | float, grad_norm: torch.Tensor | float, *,
                     check_grad: bool = True) -> str | None:
    """``"loss"`` or ``"gradient norm"`` when that value is NaN or +-inf, else None.

    ``check_grad=False`` with fp16 dynamic loss scaling, whose scaler already skips steps with
    inf/NaN gradients (Micikevicius et al. 2018).
    """
    loss_v = float(loss)
    if not math.isfinite(loss_v):
        return f"loss ({loss_v})"
    norm_v = float(grad_norm)
    if check_grad and not math.isfinite(norm_v):
        return f"gradient norm ({norm_v})"
    return None


def record_fault(run_dir: Path, event: dict) -> None:
    """Append ``event`` (with a wall-clock ``time``) to ``run_dir/faults.jsonl``."""
    with (Path(run_dir) / FAULTS_FILE).open("a") as f:
        f.write(json.dumps({"time": time.time(), **event}) + "\n")


def read_faults(run_dir: Path) -> list[dict]:
    """The events of ``faults.jsonl`` (empty when none happened)."""
    path = Path(run_dir) / FAULTS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class SigtermFlag:
    """Turn SIGTERM (preemption) and SIGINT (Ctrl-C) into a flag the training loop polls at step boundaries.

    The trainer then saves the step and stops; ``lf run`` exits with :attr:`exit_code` (128 + the signal: 143
    for SIGTERM, 130 for SIGINT, as a shell reports them). A second signal kills at once. ``install()`` works
    from the main thread only (elsewhere it does nothing: Python delivers signals to the main thread);
    ``uninstall()`` restores the previous handlers.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested = False
        """Whether this process received one of :attr:`SIGNALS`."""
        self.signum: int | None = None
        """The signal received (here, or on another rank once :meth:`agreed` said so); None before."""
        self._old: dict[int, object] = {}

    def _handler(self, signum, _frame) -> None:
        if self.requested:  # a second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.requested = True
        self.signum = self.signum or signum

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}

    def uninstall(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}

    @property
    def name(self) -> str:
        """``"SIGTERM"`` or ``"SIGINT"`` (SIGTERM before any signal)."""
        return signal.Signals(self.signum or signal.SIGTERM).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 143 for SIGTERM, 130 for SIGINT."""
        return 128 + int(self.signum or signal.SIGTERM)

    def agreed(self, ctx) -> bool:
        """Whether any rank got SIGTERM or SIGINT (an all-reduce when distributed, so every rank answers the
        same; SIGTERM wins when ranks got different ones, and :attr:`signum` is set on every rank)."""
        if not ctx.distributed:
            return self.requested
        from lf_parallel import global_sum

        got = torch.tensor([float(self.signum == signal.SIGTERM), float(self.signum == signal.SIGINT)],
                           device=ctx.device)
        term, intr = (float(v) for v in global_sum(got, ctx))
        if term or intr:
            self.signum = signal.SIGTERM if term else signal.SIGINT
        return bool(term or intr)


def apply_nonfinite_policy(trainer, reason: str, grad_norm: float) -> dict[str, float]:
    """Apply ``train.on_nonfinite`` to ``trainer``'s current step, whose loss or gradient norm is NaN/inf.

    Called before the update is applied; the gradients are dropped in every case. Returns the step's
    scalars for ``skip``.

    Raises:
        NonFiniteError: policy ``stop``, or ``rollback`` without a checkpoint or past :data:`MAX_ROLLBACKS`.
        RolledBack: after restoring the latest checkpoint (all but the data position).
    """
    from lf_orchestrator.checkpoint import latest_checkpoint

    policy, step = trainer.cfg.train.on_nonfinite, trainer.step + 1
    trainer.optimizer.zero_grad(set_to_none=True)
    if trainer.scaler.enabled:
        trainer.scaler.update()  # close the scaler's step (it recorded the unscale)
    if trainer.ctx.is_main:
        record_fault(trainer.run_dir, {"step": step, "fault": "nonfinite", "reason": reason, "action": policy})
    if policy == "stop":
        raise NonFiniteError(f"step {step}: non-finite {reason} (train.on_nonfinite = 'stop'); the update was "
                             f"not applied; latest checkpoint: {latest_checkpoint(trainer.run_dir)}")
    if policy == "skip":
        trainer.step += 1
        trainer.nonfinite_skipped = getattr(trainer, "nonfinite_skipped", 0) + 1
        return {"train/loss": float("nan"), "train/grad_norm": grad_norm,
                "train/lr": trainer.scheduler.get_last_lr()[0],
                "train/nonfinite_skipped": float(trainer.nonfinite_skipped)}
    ckpt = latest_checkpoint(trainer.run_dir)
    counts = trainer.__dict__.setdefault("_rollbacks", {})
    counts[str(ckpt)] = counts.get(str(ckpt), 0) + 1
    if ckpt is None or counts[str(ckpt)] > MAX_ROLLBACKS:
        raise NonFiniteError(f"step {step}: non-finite {reason} (train.on_nonfinite = 'rollback'): "
                             + ("no checkpoint to roll back to" if ckpt is None
                                else f"already rolled back to {ckpt} {MAX_ROLLBACKS} times"))
    if getattr(trainer, "prefetcher", None) is not None:
        trainer.prefetcher.discard()  # the step drawn ahead is drawn again after the rollback
    position = trainer.sampler.state_dict()  # kept: the batches since the checkpoint are not replayed
    trainer._restore(ckpt)
    trainer.sampler.load_state_dict(position)
    trainer._indices = iter(trainer.sampler)
    raise RolledBack(ckpt.name)
