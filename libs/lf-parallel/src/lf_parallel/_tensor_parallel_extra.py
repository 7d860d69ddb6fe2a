"""Tensor-parallel styles for the pieces of diffusion-transformer blocks that Megatron's pairs do not cover.

- :class:`HeadShardedRMSNorm`: an RMSNorm over the *whole* width of a column-parallel
  projection (Wan's q/k RMSNorm "across heads"), whose input on each tp rank is its
  heads' slice. The weight is sharded like the projection (``Shard(0)``), the sum of
  squares is all-reduced over tp (differentiable), so every rank normalizes its slice
  by the full-width RMS, exactly as the unsplit norm.
- :class:`TensorParallelGradSum`: under sequence parallelism, a replicated
  conditioning module (adaLN modulation: per-sample inputs, no sequence dim) whose
  outputs scale and shift the *sequence-sharded* residual gets, on each tp rank, the
  gradient of its own tokens only. Its outputs pass through identity-forward /
  all-reduce-backward (Megatron's "copy to tensor-parallel region"), so its parameters
  and everything upstream (the time embedding) receive the whole sequence's gradient.
- Affine norms inside a composite block (not IR nodes of their own) get PyTorch's
  ``SequenceParallel`` with local outputs (see ``_tensor_parallel.tensor_parallel_styles``).

Legend: ``x_bsd`` (batch, seq, local features).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _GradSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class HeadShardedRMSNorm(ParallelStyle):
    """Style for an ``nn.RMSNorm`` over the full width of a column-parallel output (input: this rank's slice)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.RMSNorm) or len(module.normalized_shape) != 1:
            raise ValueError(f"tensor parallel: a norm split with its projection must be a 1-D nn.RMSNorm, got "
                             f"{type(module).__name__} of shape {getattr(module, 'normalized_shape', None)}")
        width = module.normalized_shape[0]
        if width % device_mesh.size():
            raise ValueError(f"tensor parallel: RMSNorm width {width} is not divisible by tp={device_mesh.size()}")
        if module.weight is not None:
            module.weight = nn.Parameter(distribute_tensor(module.weight.data, device_mesh, [Shard(0)]))
        group, eps = device_mesh.get_group(), module.eps

        def forward(x_bsd: torch.Tensor) -> torch.Tensor:
            x32 = x_bsd.float()
            sum_sq = _AllReduceSum.apply(x32.pow(2).sum(-1, keepdim=True), group)
            eps_ = torch.finfo(x_bsd.dtype).eps if eps is None else eps
            out = x32 * torch.rsqrt(sum_sq / width + eps_)
            weight = module.weight
            if weight is not None:
                out = out * (weight.to_local() if isinstance(weight, DTensor) else weight)
            return out.to(x_bsd.dtype)

        module.forward = forward  # instance attribute: state_dict keys unchanged
        return module


class TensorParallelGradSum(ParallelStyle):
    """Style for a replicated per-sample conditioning module under sequence parallelism: its tensor outputs
    (a tensor or a tuple of them) are the same forward, and their gradients are summed over the tp ranks."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group = device_mesh.get_group()
        inner = module.forward

        def forward(*args, **kwargs):
            out = inner(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                return _GradSum.apply(out, group)
            return type(out)(_GradSum.apply(t, group) if isinstance(t, torch.Tensor) else t for t in out)

        module.forward = forward
        return module
