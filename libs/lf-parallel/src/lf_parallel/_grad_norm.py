"""The total norm of tensors spread over any mix of meshes, and gradient clipping by it.

After a plan is applied, one model's gradients are of several kinds at once: plain tensors (a module that
is neither tensor- nor data-sharded, or DDP's replicas), DTensors on the ``tp`` mesh, DTensors on the 1-D
dp mesh (FSDP2 over a parameter that tensor parallelism left whole, such as a norm's weight), DTensors
on the 2-D ``(dp_shard, tp)`` or ``(dp_replicate, dp_shard)`` meshes, and, under pipeline parallelism,
only this stage's parameters. ``torch.nn.utils.clip_grad_norm_`` stacks the per-tensor norms into one
DTensor and fails when they sit on different meshes ("All operands in aten.stack.default must have the
same mesh"); it also knows nothing of pipeline stages.

Here each tensor's local shard gives ``|local|_p^p`` (``max |local|`` for the inf-norm); the shards are
grouped by the process groups of the mesh dims they are *sharded* over (every placement but ``Replicate``:
``Shard``, and the ``_StridedShard`` FSDP2 puts over tensor-parallel dim-0 shards); each group's sum (max)
is all-reduced over exactly those process groups, and the groups are added up. A ``Replicate`` dim is never
reduced over (its ranks hold the same numbers, so a sum would count them several times); a ``Partial``
gradient is first reduced to ``Replicate``. Plain tensors count as they are on every rank. Pipeline stages
hold disjoint parameters, so the result is finally summed (max) over ``pp_group``. Every rank ends with the
norm of the whole model, the value the single-process run computes from the same gradients
(``torch.nn.utils.get_total_norm``).

Compare torchtitan's ``clip_grad_norm_`` (``torchtitan/distributed/utils.py``): it calls
``get_total_norm`` on the DTensors, takes ``full_tensor()`` of the result and all-reduces ``norm^p`` over the
pp mesh, which needs every gradient on one mesh (torchtitan puts non-expert parameters there, and handles
expert-parallel ones as a second group). lf's plans leave parameters on several meshes, hence the grouping
by sharded process groups.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate


def _local_part(t: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """(the tensor this rank sums over, the process groups of its sharded mesh dims)."""
    if not isinstance(t, DTensor):
        return t, ()
    if any(p.is_partial() for p in t.placements):  # pending sums: reduce them before taking the norm
        t = t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p for p in t.placements])
    # every dim that splits the data: Shard, and FSDP-over-TP's _StridedShard (not a Shard subclass in torch 2.13)
    groups = tuple(t.device_mesh.get_group(i) for i, p in enumerate(t.placements) if not p.is_replicate())
    return t.to_local(), groups


def _check_norm_type(norm_type: float) -> float:
    norm_type = float(norm_type)
    if not (norm_type > 0 or math.isinf(norm_type)) or math.isnan(norm_type):
        raise ValueError(f"norm_type must be > 0 or inf, got {norm_type}")
    return norm_type


@torch.no_grad()
def total_norm(tensors: Iterable[torch.Tensor], norm_type: float = 2.0, *, pp_group=None) -> torch.Tensor:
    """The ``norm_type``-norm of all elements of ``tensors`` taken together, whatever their meshes.

    Args:
        tensors: plain tensors and DTensors on any meshes and placements (typically the gradients of a
            parallelized model, or its parameters). Every rank must pass its own part of the same list
            (same meshes in the same order; a rank of another pipeline stage passes its stage's tensors).
        norm_type: ``p > 0``, or ``inf`` (the largest absolute element).
        pp_group: the pipeline-parallel process group when the ranks of this group hold different
            parameters (the stages of one pipeline); the result is combined over it. None: no pipeline.

    Returns:
        A 0-d float32 tensor on the tensors' device (CPU when ``tensors`` is empty), equal on every rank:
        ``(sum |x|^p)^(1/p)`` over every element of the full (unsharded) tensors, each counted once. NaN or
        inf when any element is (not raised: the caller's non-finite policy decides).

    Raises:
        ValueError: ``norm_type`` is neither > 0 nor inf.

    Example:
        >>> total_norm([torch.tensor([3.0]), torch.tensor([4.0])])
        tensor(5.)
        >>> total_norm([torch.tensor([3.0, -7.0])], float("inf"))
        tensor(7.)
    """
    p = _check_norm_type(norm_type)
    inf = math.isinf(p)
    by_groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        local, groups = _local_part(t.detach())
        shards = by_groups.setdefault(groups, [])  # the key even for an empty (uneven) shard: every rank of
        if local.numel():                           # a process group must join that group's all-reduce
            shards.append(local)
    device = next((ts[0].device for ts in by_groups.values() if ts), torch.device("cpu"))
    zero = torch.zeros((), dtype=torch.float32, device=device)
    # per group of shards: sum |x|^p (max |x| for inf) over the local elements, then over its sharded dims
    values = {key: nn.utils.get_total_norm(ts, p).float().to(device) if ts else zero
              for key, ts in by_groups.items()}
    if not inf:
        values = {key: v ** p for key, v in values.items()}
    op = dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM
    order = list(values)
    pending = list(dict.fromkeys(g for key in order for g in key))  # each process group once
    for group in pending:
        keys = [key for key in order if group in key]
        vec = torch.stack([values[key] for key in keys])
        dist.all_reduce(vec, op=op, group=group)
        values.update(zip(keys, vec.unbind(0), strict=True))
    if inf:
        out = torch.stack([zero, *values.values()]).max()
    else:
        out = torch.stack([zero, *values.values()]).sum()
    if pp_group is not None:
        dist.all_reduce(out, op=op, group=pp_group)
    return out if inf else out ** (1.0 / p)


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0, *,
                    pp_group=None) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that their total norm is at most ``max_norm``; return the norm.

    The norm is :func:`total_norm` of the gradients (any mix of plain tensors and DTensors on any meshes;
    combined over ``pp_group`` for pipeline stages), the value one process computes on the full model. As
    ``torch.nn.utils.clip_grad_norm_``, every gradient is multiplied by
    ``min(1, max_norm / (norm + 1e-6))``, in place, on its local shard; with no host synchronization.
    A NaN/inf norm leaves the gradients as they are (and is returned, so the caller skips the step).

    Args:
        parameters: the model's parameters (those without a gradient are skipped), e.g.
            ``model.parameters()`` of a model from :func:`lf_parallel.parallelize`.
        max_norm: the largest norm kept; ``<= 0`` means no clipping (the norm is still returned).
        norm_type: ``p > 0`` or ``inf``.
        pp_group: the pipeline-parallel process group when each of its ranks holds other stages, else None.

    Returns:
        The total norm before clipping: a 0-d float32 tensor on the gradients' device, the same on every rank.

    Raises:
        ValueError: ``norm_type`` is neither > 0 nor inf.

    Example:
        >>> layer = torch.nn.Linear(2, 1, bias=False)
        >>> layer.weight.grad = torch.tensor([[3.0, 4.0]])
        >>> clip_grad_norm_(layer.parameters(), max_norm=1.0)
        tensor(5.)
        >>> layer.weight.grad
        tensor([[0.6000, 0.8000]])
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = total_norm(grads, norm_type, pp_group=pp_group)
    if max_norm <= 0 or not grads:
        return norm
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    coef = torch.where(torch.isfinite(norm), coef, torch.ones_like(coef))
    locals_by_device: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        local = g._local_tensor if isinstance(g, DTensor) else g  # the shard itself, scaled in place
        locals_by_device.setdefault((local.device, local.dtype), []).append(local)
    for (dev, _), ts in locals_by_device.items():
        torch._foreach_mul_(ts, coef.to(dev))
    return norm
