"""What autograd really saves: the oracle of the IR's ``saved_bytes`` rules (shared by the byte tests)."""

from __future__ import annotations

import torch


def measure_saved(fn, module: torch.nn.Module, shared: tuple[torch.Tensor, ...] = (), *,
                  with_grad_fn: bool = False) -> int | tuple[int, str]:
    """Unique storage bytes autograd packs during ``fn()``, ``module``'s parameters and ``shared`` excluded.

    Runs backward on the output (a tuple's first element) afterwards, so the graph is known to be complete.
    With ``with_grad_fn`` also returns the output's ``grad_fn`` class name (which kernel ran).
    """
    skip = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *shared)}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in skip:
            held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out = out[0] if isinstance(out, tuple) else out
    name = type(out.grad_fn).__name__
    out.float().sum().backward()  # the graph was complete: backward runs on what was saved
    total = sum(held.values())
    return (total, name) if with_grad_fn else total
