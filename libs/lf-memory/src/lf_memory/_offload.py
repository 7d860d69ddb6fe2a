"""CPU offload of the activations autograd saves for backward.

Every tensor the forward pass saves for backward is copied to host memory when
it is saved and copied back when backward needs it, through PyTorch's
``torch.autograd.graph.save_on_cpu`` (saved-tensor hooks; pinned host memory
on CUDA so the copies can overlap compute). GPU memory held between forward and
backward drops to what the hooks do not see; the price is PCIe traffic of the
same size each way. Under activation recomputation, a checkpointed block's
saved tensors are its inputs only (what recomputation keeps), so the two
compose: recompute decides what is kept, offload decides where.

Values are copied, never converted: outputs and gradients equal those without
offload bitwise.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["offload_activations"]


def offload_activations(device: torch.device | str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """A context manager under which saved activations live in host memory until backward.

    Args:
        device: the device the model computes on; pinned host memory is used when it is CUDA.
        enabled: False gives a no-op context (so callers need no branch).

    Returns:
        ``torch.autograd.graph.save_on_cpu(pin_memory=...)`` or ``contextlib.nullcontext()``.
        Run the forward pass inside it; backward may run outside.

    Example:
        >>> lin = torch.nn.Linear(4, 2)
        >>> with offload_activations("cpu"):
        ...     y = lin(torch.randn(3, 4, requires_grad=True))
        >>> y.sum().backward()
    """
    if not enabled:
        return contextlib.nullcontext()
    device = torch.device(device)
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
