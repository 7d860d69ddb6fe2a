"""Data parallel with ZeRO stages 0-3 and HSDP, over the data-parallel dims of the plan's mesh.

How each stage maps onto PyTorch (Rajbhandari et al., "ZeRO", SC 2020):

- ZeRO-0: ``DistributedDataParallel`` over all dp ranks (bucketed gradient all-reduce).
- ZeRO-1 (optimizer state sharded): DDP plus
  ``torch.distributed.optim.ZeroRedundancyOptimizer``; each rank keeps and updates
  the optimizer state of its share of the parameters, then broadcasts them.
- ZeRO-2 (gradients + optimizer state sharded): FSDP2 ``fully_shard`` with
  ``reshard_after_forward=False``. Gradients are reduce-scattered (each rank keeps its
  shard), the optimizer state is built on the shards, and the parameters gathered
  in the forward are kept for the backward, so there is one all-gather per step as
  in ZeRO-2. Unlike DeepSpeed's ZeRO-2, FSDP2 frees the gathered parameters after
  the backward, so between steps parameters are sharded too: ZeRO-2 communication,
  ZeRO-3 memory at rest. PyTorch has no parameter-replicating sharded-gradient mode;
  a hand-written one is not worth its code while this one is exact.
- ZeRO-3 (parameters sharded too): ``fully_shard`` on every transformer block
  (``ComponentModule.blocks``) and then the root, ``reshard_after_forward=True``: each
  block's parameters are gathered for its forward and again for its backward.
- HSDP: ZeRO-2/3 on the 2-D ``(dp_replicate, dp_shard)`` mesh: sharded within a
  ``dp_shard`` group, replicated (gradient all-reduce) across ``dp_replicate``.

Composed with tensor parallelism (applied first), FSDP2 shards the already
tp-sharded DTensor parameters over the dp dims (2-D parallel). Gradients are
averaged over dp ranks, so the loss on each rank is the mean over its local batch.

:func:`build_optimizer` puts plain tensors and DTensors (per mesh) into separate parameter groups, so
fused and ``foreach`` optimizers run after tensor parallelism (see :func:`tensor_kind_groups`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from lf_parallel._mesh import dp_mesh, flat_dp_group
from lf_parallel._plan import Plan

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP2 policy for ``plan.precision``: parameters/compute in ``precision``, gradient reduction in fp32.

    Raises:
        ValueError: an unknown precision name.
    """
    if precision not in _DTYPES:
        raise ValueError(f"parallel.precision must be one of {sorted(_DTYPES)}, got {precision!r}")
    dtype = _DTYPES[precision]
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [b for m in model.modules() if getattr(m, "lf_component", None) is not None for b in m.blocks]


def apply_zero(model: nn.Module, mesh: DeviceMesh, plan: Plan) -> nn.Module:
    """Wrap ``model`` for data parallelism at ``plan.zero_stage`` over the dp dims of ``mesh``.

    Args:
        model: materialized model (tensor parallelism already applied, if any).
        mesh: from :func:`lf_parallel.build_mesh`.
        plan: a checked plan.

    Returns:
        DDP wrapper (ZeRO-0/1, dp > 1), the same module turned into an ``FSDPModule`` (ZeRO-2/3),
        or ``model`` unchanged (ZeRO-0/1 with dp = 1 and cp = 1).
    """
    if plan.zero_stage >= 2:
        dp = dp_mesh(mesh, plan)
        if plan.dp_replicate == 1:  # plain FSDP: the 1-D shard mesh
            dp = dp[dp.mesh_dim_names[-1]]
        policy = mixed_precision_policy(plan.precision)
        reshard = plan.zero_stage == 3
        for block in _blocks(model):
            fully_shard(block, mesh=dp, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=dp, reshard_after_forward=reshard, mp_policy=policy)
        return model
    if plan.dp * plan.cp == 1:
        return model
    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=flat_dp_group(mesh, plan))


def tensor_kind_groups(params) -> list[dict]:
    """Parameter groups holding one tensor kind each: plain tensors, then DTensors per device mesh.

    After tensor parallelism, split parameters are DTensors on the ``tp`` mesh (or, under FSDP, the 2-D
    ``(dp_shard, tp)`` mesh) while unsplit ones (norms outside sequence parallel, a replicated embedding,
    a ``tp = 1`` component) stay plain tensors (or DTensors on the dp mesh only). One fused or ``foreach``
    optimizer kernel takes one list of tensors and cannot mix them ("got mixed torch.Tensor and DTensor",
    or tensors on different meshes); one group per kind gives one kernel launch per kind. AdamW's update of
    each parameter does not depend on its group, so the groups change kernel batching only.

    Args:
        params: parameters (``model.parameters()``), or parameter groups (dicts with ``"params"`` and
            options such as ``weight_decay``): each group is split by kind and its options copied.

    Returns:
        ``[{"params": [...], **options}, ...]``: per input group, plain tensors first, then one group per
        distinct mesh in order of first appearance, order kept within a kind; empty groups are left out.

    Example:
        >>> groups = tensor_kind_groups(torch.nn.Linear(2, 2).parameters())
        >>> [len(g["params"]) for g in groups]
        [2]
    """
    params = list(params)
    if not params or not isinstance(params[0], dict):
        params = [{"params": params}]
    out = []
    for group in params:
        kinds: dict = {}
        members = group["params"]
        for p in [members] if isinstance(members, torch.Tensor) else members:
            kinds.setdefault(("mesh", p.device_mesh) if isinstance(p, DTensor) else ("plain",), []).append(p)
        options = {k: v for k, v in group.items() if k != "params"}
        ordered = sorted(kinds.items(), key=lambda kv: kv[0][0] != "plain")  # stable: meshes keep their order
        out += [{"params": ps, **options} for _, ps in ordered]
    return out


def build_optimizer(model: nn.Module, mesh: DeviceMesh, plan: Plan, optimizer_class=torch.optim.AdamW,
                    **kwargs) -> torch.optim.Optimizer:
    """The optimizer of a parallelized model: ``optimizer_class(params, **kwargs)``.

    When a multi-tensor kernel may run (``fused=True``, or ``foreach`` not ``False``: PyTorch picks
    ``foreach`` by default on GPUs), the parameters go in :func:`tensor_kind_groups` (one group per tensor
    kind, every group with the same ``kwargs``), so fused / foreach AdamW work after tensor parallelism;
    with ``foreach=False`` (and no ``fused``) they stay one group. Under ZeRO-1 with dp > 1 (no tensor
    parallelism there), ``ZeroRedundancyOptimizer`` over the dp ranks (each rank holds the state of its
    share of the parameters).

    The number of groups is part of a DCP checkpoint's optimizer state (``param_groups.<i>``), so an
    optimizer state saved under one plan loads under another only when both have as many groups (always
    with ``foreach=False``; with fused / foreach, when both plans leave the same tensor kinds).

    Args:
        model: the module :func:`lf_parallel.parallelize` returned (a DDP wrapper, an FSDP module, or plain).
        mesh: the plan's mesh (None for one process).
        plan: the plan the model was parallelized with.
        optimizer_class: a ``torch.optim.Optimizer`` taking parameter groups.
        **kwargs: the optimizer's options (``lr``, ``eps``, ``fused``, ``foreach``, ...).
    """
    if plan.zero_stage == 1 and plan.dp * plan.cp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class,
                                       process_group=flat_dp_group(mesh, plan), **kwargs)
    multi_tensor = bool(kwargs.get("fused")) or kwargs.get("foreach") is not False
    return optimizer_class(tensor_kind_groups(model.parameters()) if multi_tensor else model.parameters(), **kwargs)
