"""Measure the bytes a forward pass keeps alive for backward.

Two sources, merged by storage (``untyped_storage().data_ptr()``, so views and
tensors saved twice count once):

1. tensors autograd saves, seen by ``torch.autograd.graph.saved_tensors_hooks``
   (all of them without recomputation; only the block inputs under
   checkpointing, whose own hooks take over inside the block);
2. storages created during the forward that are still alive when it returns
   (found with a ``TorchDispatchMode`` that weak-references every op output).
   This catches what selective checkpointing caches outside autograd's hooks
   (the outputs of the ops it must save). Under the other modes it finds the
   same storages as source 1.

Parameters (and anything in ``exclude``) are never counted (not activations).
Source 2 also skips the storages of the returned outputs and of the inputs
(views of inputs are op outputs too): the caller holds those, not backward;
source 1 counts them when autograd saves them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["measure_saved_bytes"]


class _OutputRecorder(TorchDispatchMode):
    """Weak references to the storage of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
                storage = leaf.untyped_storage()
                known = self.storages.get(storage.data_ptr())
                if storage.nbytes() and (known is None or known[0].expired()):  # address reuse
                    self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        return out


def _storage_ptrs(tree: object) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}


def measure_saved_bytes(
    fn: Callable[..., object], *args, exclude: Iterable[torch.Tensor] = (), **kwargs
) -> tuple[int, object]:
    """Run ``fn(*args, **kwargs)`` and count the activation bytes kept for backward.

    Args:
        fn: a forward function (a module, a block); it must return tensors
            (or a pytree of them) that require grad.
        *args, **kwargs: its inputs. Input tensors that backward keeps (the
            block input under checkpointing, LayerNorm's input) are counted.
        exclude: tensors whose storages are not activations (pass
            ``module.parameters()``).

    Returns:
        ``(bytes, output)``: unique storage bytes held for backward, and what
        ``fn`` returned (call ``backward`` on it to free the saved tensors).

    Example:
        >>> lin = torch.nn.Linear(4, 8)
        >>> nbytes, y = measure_saved_bytes(lin, torch.randn(2, 4), exclude=lin.parameters())
        >>> nbytes  # the (2, 4) float32 input saved for the weight gradient
        32
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    hooked: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            hooked[storage.data_ptr()] = storage.nbytes()
        return tensor

    recorder = _OutputRecorder()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), recorder:
        out = fn(*args, **kwargs)
    not_created = excluded | _storage_ptrs(out) | _storage_ptrs((args, kwargs))  # views of inputs too
    held = dict(hooked)
    for ptr, (ref, nbytes) in recorder.storages.items():
        if not ref.expired() and ptr not in not_created:
            held[ptr] = nbytes
    return sum(held.values()), out
