"""The order in which a plan's techniques are applied to a model, written down once.

1. tensor + sequence parallel (:func:`apply_tensor_parallel`, DTensor on the ``tp`` dim);
2. context parallel (:func:`apply_context_parallel` over the ``cp`` dim; after TP, so Ulysses checks the
   local heads): attention spans the cp group, the caller feeds each rank its sequence shard;
3. activation recomputation (lf-memory; the caller wraps blocks between 2 and 4);
4. data parallel / ZeRO / HSDP (:func:`apply_zero`, on the dp dims; with cp > 1 over dp x cp, whose ranks
   hold different tokens of the same samples).

Pipeline parallel splits the model before step 1 (:mod:`lf_parallel._stages`).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lf_parallel._context import apply_context_parallel, context_parallel_of
from lf_parallel._plan import Plan
from lf_parallel._tensor_parallel import apply_tensor_parallel
from lf_parallel._zero import apply_zero


def parallelize(model: nn.Module, mesh: DeviceMesh, plan: Plan, *, loss_parallel: bool = True,
                recompute=None) -> nn.Module:
    """Apply ``plan`` to a materialized lf model: TP(+SP), CP, then ``recompute(model)`` if given, then DP/ZeRO.

    Args:
        model: a lowered lf model on its device (``lf_ir.materialize`` done; same seed on every rank).
        mesh: :func:`lf_parallel.build_mesh` of ``plan``.
        plan: a plan that passed :func:`check_plan` with the model's graph.
        loss_parallel: keep vocab-sharded logits for :func:`vocab_parallel_loss`.
        recompute: optional callable applied to the model between TP and FSDP (activation checkpointing).

    Returns:
        The model to train (a DDP wrapper for ZeRO-0/1 with dp * cp > 1, else the module itself).

    Raises:
        ValueError: ``cp_kind="ring+ulysses"`` (see :func:`lf_parallel._context.context_parallel_of`), or
            Ulysses heads not divisible by cp.
    """
    if plan.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], plan, loss_parallel=loss_parallel)
    if plan.cp > 1:
        apply_context_parallel(model, context_parallel_of(mesh, plan))
    if recompute is not None:
        recompute(model)
    return apply_zero(model, mesh, plan)
