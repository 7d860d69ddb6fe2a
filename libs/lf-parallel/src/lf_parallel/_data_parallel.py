"""Data parallelism: PyTorch DDP over the processes of a :class:`DistContext`.

Gradients are averaged over ranks by DDP's bucketed all-reduce (Li et al.,
"PyTorch Distributed", VLDB 2020). Losses that must be normalized by a global
count (tokens across ranks and micro-batches) use :func:`global_sum`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lf_parallel._dist import DistContext


def apply_data_parallel(model: nn.Module, ctx: DistContext) -> nn.Module:
    """Wrap ``model`` in DDP when the job has several processes; otherwise return it."""
    if not ctx.distributed:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or ``model`` itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def global_sum(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum of ``value`` over all ranks (a copy; the input is unchanged)."""
    out = value.detach().clone()
    if ctx.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
