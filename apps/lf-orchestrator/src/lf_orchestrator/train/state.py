"""What the trainer checkpoints besides the model and optimizer shards.

The trainer (:mod:`lf_orchestrator.train.trainer`) saves through
:class:`lf_orchestrator.families._state.FamilyCheckpointer` (sharded DCP folders, atomic marker + rename,
keep-last-k, optionally asynchronous). This module writes and restores the rest (the trainer's ``save`` /
``_restore`` call it): the LR schedule, the loss scaler, every dp
rank's sampler position, every rank's RNG states, the step and the plan. A checkpoint written under one plan or
world size loads under another (DCP reshards the tensors,
:func:`lf_orchestrator.families._state.reshard_sampler` the data position).

Folders of lf-orchestrator 0.3's full-state layout (``model.safetensors`` + ``state.pt``, VLA runs) resume too,
under a data-parallel plan without ZeRO sharding and the world size that wrote them.

A trainer passed here has the attributes ``cfg``, ``ctx``, ``plan``, ``step``, ``optimizer``, ``scheduler``,
``scaler``, ``sampler``, ``dp_rank``, ``checkpointer`` and ``state_module`` (the module whose names are saved:
``model.`` + the recipe model's parameter names; under pipeline parallel the rank's ``StageView``, same names).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lf_orchestrator.checkpoint import damaged, is_legacy, load_checkpoint
from lf_orchestrator.families._state import (
    describe_reshard,
    gather_objects,
    reshard_sampler,
    rng_state,
    set_rng_state,
)
from lf_orchestrator.prefetch import sampler_state

EMPTY_OPTIMIZER = "optimizer_empty"
"""Training-state key: the optimizer had taken no step when saved (step 0)."""


def save_training_state(trainer) -> Path:
    """Checkpoint ``trainer``'s current step (call on every rank); returns the checkpoint folder.

    DCP's ``get_state_dict`` initializes an optimizer without state by running a zero-LR step (AdamW's step
    counter becomes 1); a step-0 save (``train.on_nonfinite = "rollback"`` saves one) therefore clears that
    state again afterwards and marks the checkpoint, so neither the run nor a rollback to step 0 sees it.
    """
    ctx, plan = trainer.ctx, trainer.plan
    local = _local_optimizer(trainer.optimizer)
    empty = not local.state
    per_rank = gather_objects((trainer.dp_rank, sampler_state(trainer), rng_state(ctx.device)),
                              ctx.distributed)
    samplers = dict((dp_rank, s) for dp_rank, s, _ in per_rank)  # tp ranks repeat their dp rank's
    state = {"step": trainer.step, "scheduler": trainer.scheduler.state_dict(),
             "scaler": trainer.scaler.state_dict(), "sampler": [samplers[r] for r in range(plan.dp)],
             "rng": [r for _, _, r in per_rank], "plan": plan.describe(), EMPTY_OPTIMIZER: empty}
    path = trainer.checkpointer.save(trainer.step, trainer.state_module, trainer.optimizer, state, plan.describe())
    if empty:  # the state DCP made up for the save (async saves have copied it already)
        local.state.clear()
    return path


def restore_training_state(trainer, path: Path) -> str | None:
    """Load checkpoint ``path`` (written under any plan or world size) into ``trainer``: model and optimizer
    shards, schedule, loss scaler, sampler position, RNG states and step (call on every rank).

    Returns:
        A log line when the checkpoint was written under another plan or world size (resharded), else None.

    Raises:
        FileNotFoundError: ``path`` is incomplete or lacks a file (names it).
        CheckpointError: a damaged shard or training-state file (names it).
    """
    if is_legacy(path):
        _restore_legacy(trainer, path)
        return None
    ctx = trainer.ctx
    state, extra = trainer.checkpointer.load(path, trainer.state_module, trainer.optimizer)
    _check_finite(trainer.state_module, ctx, path)
    if state.get(EMPTY_OPTIMIZER):
        _local_optimizer(trainer.optimizer).state.clear()
    saved = state["scheduler"]
    if len(saved["base_lrs"]) == len(trainer.optimizer.param_groups):
        trainer.scheduler.load_state_dict(saved)
    # The schedule is a function of the step (and of this run's train.steps, which a resume may raise): the next
    # LR comes from this run's schedule at the saved step, not from the saved one (another plan may also group the
    # parameters differently, by tensor kind)
    trainer.scheduler.last_epoch = saved["last_epoch"]
    factor = trainer.scheduler.lr_lambdas[0](saved["last_epoch"])
    trainer.scheduler._last_lr = [base * factor for base in trainer.scheduler.base_lrs]
    for group, lr in zip(trainer.optimizer.param_groups, trainer.scheduler.get_last_lr(), strict=True):
        group["lr"] = lr  # ZeRO-1's wrapper groups are not in the (local) optimizer state
    sampler, note = reshard_sampler(state["sampler"], trainer.dp_rank, trainer.plan.dp)
    trainer.sampler.load_state_dict({"epoch": sampler["epoch"], "offset": sampler["offset"]})
    trainer.scaler.load_state_dict(state["scaler"])
    rngs = state["rng"]
    set_rng_state(rngs[ctx.rank] if len(rngs) == ctx.world_size else rngs[0], ctx.device)
    trainer.step = int(state["step"])
    resharded = describe_reshard(extra, trainer.plan.describe(), ctx.world_size)
    return f"{resharded}; {note}" if resharded and note else resharded


def _local_optimizer(optimizer):
    """The optimizer holding this rank's state: ZeRO-1's ``ZeroRedundancyOptimizer`` keeps it in its local
    ``optim`` (the wrapper's own ``state`` stays empty), as ``lf_parallel``'s checkpoint code reads it."""
    return optimizer.optim if type(optimizer).__name__ == "ZeroRedundancyOptimizer" else optimizer


def _check_finite(module: torch.nn.Module, ctx, path: Path) -> None:
    """Raise ``CheckpointError`` on every rank when a loaded parameter holds NaN/inf on any rank."""
    from lf_orchestrator.families._faults import nonfinite_parameters

    first, count = nonfinite_parameters(module, ctx)
    if count:
        raise damaged(path, "the DCP shards", f"tensor {first.removeprefix('model.')!r} holds NaN or inf",
                      plural=True)


def _restore_legacy(trainer, path: Path) -> None:
    """A full-state folder of lf-orchestrator 0.3 (``model.safetensors`` + ``state.pt``), written by a
    data-parallel VLA run: model, optimizer, schedule, sampler, loss scaler, CPU RNG and step.

    Raises:
        ValueError: the plan shards the model or the optimizer (the layout holds whole tensors only).
    """
    plan = trainer.plan
    if plan.zero_stage > 0 or plan.tp > 1 or plan.pp > 1 or plan.cp > 1:
        raise ValueError(f"checkpoint {path}: the full-state layout of lf-orchestrator 0.3 resumes under a "
                         f"data-parallel plan without ZeRO only, got {plan.describe()}")
    model_state, state = load_checkpoint(path, trainer.ctx.device)
    trainer.model.load_state_dict(model_state)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.sampler.load_state_dict(state["sampler"])
    if "scaler" in state:
        trainer.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"].cpu())
    trainer.step = int(state["step"])
