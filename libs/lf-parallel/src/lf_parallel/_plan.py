"""The parallel plan: how a global batch is split over processes and micro-batches.

This version plans data parallelism (one model replica per process); the
``Plan`` is the struct later degrees (tensor, pipeline, context, ZeRO stage)
extend.

    global_batch = dp * micro_batch * grad_accum
"""

from __future__ import annotations

import msgspec


class PlanError(ValueError):
    """A plan that cannot run; the message says which constraint broke and a valid plan."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """A data-parallel plan."""

    dp: int = 1
    """Data-parallel replicas (processes)."""
    micro_batch: int = 1
    """Samples per process per forward/backward."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.grad_accum

    def describe(self) -> str:
        """One line, e.g. ``dp=2 micro_batch=16 grad_accum=2 (global batch 64)``."""
        return (f"dp={self.dp} micro_batch={self.micro_batch} grad_accum={self.grad_accum} "
                f"(global batch {self.global_batch})")


def check_plan(plan: Plan, *, world_size: int, global_batch: int) -> Plan:
    """Validate ``plan`` against the launch; returns it unchanged.

    Raises:
        PlanError: when a degree is not positive, dp differs from the world size, or the
            batch sizes do not multiply out; the message names a valid nearby plan.
    """
    for key in ("dp", "micro_batch", "grad_accum"):
        if getattr(plan, key) < 1:
            raise PlanError(f"parallel.{key} must be >= 1, got {getattr(plan, key)}")
    if plan.dp != world_size:
        raise PlanError(f"parallel.dp={plan.dp} must equal the number of processes "
                        f"({world_size}); try {_nearby(world_size, global_batch)}")
    if plan.global_batch != global_batch:
        raise PlanError(f"dp*micro_batch*grad_accum = {plan.global_batch} but train.global_batch "
                        f"= {global_batch}; try {_nearby(world_size, global_batch)}")
    return plan


def choose_plan(*, world_size: int, global_batch: int, max_micro_batch: int) -> Plan:
    """The data-parallel plan with the largest micro-batch <= ``max_micro_batch``.

    Raises:
        PlanError: if ``global_batch`` is not divisible by ``world_size``.
    """
    if world_size < 1 or global_batch < 1 or max_micro_batch < 1:
        raise PlanError(f"world_size, global_batch and max_micro_batch must be >= 1, got "
                        f"{world_size}, {global_batch}, {max_micro_batch}")
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size or world_size
        raise PlanError(f"train.global_batch={global_batch} is not divisible by the "
                        f"{world_size} data-parallel processes; use {lower} or "
                        f"{lower + world_size}")
    per_rank = global_batch // world_size
    accum = next(a for a in range(1, per_rank + 1)
                 if per_rank % a == 0 and per_rank // a <= max_micro_batch)
    return Plan(dp=world_size, micro_batch=per_rank // accum, grad_accum=accum)


def _nearby(world_size: int, global_batch: int) -> str:
    try:
        return choose_plan(world_size=world_size, global_batch=global_batch,
                           max_micro_batch=global_batch).describe()
    except PlanError as err:
        return str(err)
