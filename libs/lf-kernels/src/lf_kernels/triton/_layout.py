"""Views the kernels take: a unit stride on the last dim, leading dims flattened without copies when possible."""

from __future__ import annotations

import math

import torch

__all__ = ["as_rows", "cdiv", "next_pow2", "unit_last"]


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its last dim has stride 1, else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``(..., d)`` -> ``(n, d)`` with a unit column stride; a view when the strides allow it."""
    t = unit_last(t)
    rows = math.prod(t.shape[:-1])  # not -1: ambiguous for zero features
    try:
        return t.view(rows, t.shape[-1])
    except RuntimeError:
        return t.reshape(rows, t.shape[-1])


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``."""
    return -(-a // b)
