"""The order in which a plan's techniques are applied to a model, written down once.

1. tensor + sequence parallel (:func:`apply_tensor_parallel`, DTensor on the ``tp`` dim);
2. activation recomputation (lf-memory; the caller wraps blocks between 1 and 3);
3. data parallel / ZeRO / HSDP (:func:`apply_zero`, on the dp dims).

Pipeline and context parallel split the model and the sequence before step 1
(:mod:`lf_parallel._stages` and the context-parallel modules).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lf_parallel._plan import Plan
from lf_parallel._tensor_parallel import apply_tensor_parallel
from lf_parallel._zero import apply_zero


def parallelize(model: nn.Module, mesh: DeviceMesh, plan: Plan, *, loss_parallel: bool = True,
                recompute=None) -> nn.Module:
    """Apply ``plan`` to a materialized lf model: TP(+SP), then ``recompute(model)`` if given, then DP/ZeRO.

    Args:
        model: a lowered lf model on its device (``lf_ir.materialize`` done; same seed on every rank).
        mesh: :func:`lf_parallel.build_mesh` of ``plan``.
        plan: a plan that passed :func:`check_plan` with the model's graph.
        loss_parallel: keep vocab-sharded logits for :func:`vocab_parallel_loss`.
        recompute: optional callable applied to the model between TP and FSDP (activation checkpointing).

    Returns:
        The model to train (a DDP wrapper for ZeRO-0/1 with dp > 1, else the module itself).
    """
    if plan.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], plan, loss_parallel=loss_parallel)
    if recompute is not None:
        recompute(model)
    return apply_zero(model, mesh, plan)
