"""A small cache keyed by tensor identity: values derived from tensor *data* that many calls share.

The attention entry point is called once per layer with the same ``document_ids`` / ``key_padding`` tensors;
what it derives from their data (varlen segment boundaries, FlexAttention block masks) needs a host
synchronization or a kernel pass, and is the same for every layer. :class:`TensorKeyedCache` keeps the last few
results keyed by the tensors' identities (weak references, so a freed tensor whose memory is reused can never
hit) and their in-place ``_version`` counters (an in-place edit misses), plus any hashable static key.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

__all__ = ["TensorKeyedCache"]


class TensorKeyedCache:
    """Least-recently-used results keyed by ``(tensors by identity and version, static key)``.

    Args:
        size: entries kept (> 0).

    Example:
        >>> cache = TensorKeyedCache(size=2)
        >>> ids = torch.zeros(2, 4, dtype=torch.long)
        >>> cache.get((ids,), ("seg",), lambda: 1), cache.get((ids,), ("seg",), lambda: 2)
        (1, 1)
    """

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError(f"TensorKeyedCache size must be > 0, got {size}")
        self.size = size
        self._entries: OrderedDict[tuple, tuple[tuple, Any]] = OrderedDict()

    def get(self, tensors: tuple[torch.Tensor | None, ...], static: Hashable, build: Callable[[], Any]) -> Any:
        """The cached value for these tensors and ``static``, else ``build()`` (stored, oldest entry evicted)."""
        key = (tuple((id(t), t._version) if t is not None else None for t in tensors), static)
        hit = self._entries.get(key)
        if hit is not None:
            refs, value = hit
            if all((r is None and t is None) or (r is not None and r() is t) for r, t in zip(refs, tensors,
                                                                                            strict=True)):
                self._entries.move_to_end(key)
                return value
            del self._entries[key]
        value = build()
        self._entries[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors), value)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value
