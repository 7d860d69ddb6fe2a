"""Views the kernels take: a unit stride on the last dim, leading dims flattened without copies when possible."""

from __future__ import annotations

import math

import torch

__all__ = ["MAX_GRID_YZ", "as_rows", "cdiv", "grid_axis", "next_pow2", "unit_last"]

MAX_GRID_YZ = 65535
"""CUDA's limit on grid axes 1 and 2 (axis 0 takes 2**31 - 1)."""


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


def grid_axis(count: int, other: int) -> int:
    """Grid axis for ``count`` programs of a 2-D launch whose other axis has ``other``: 1 while ``count`` fits
    :data:`MAX_GRID_YZ`, else 0 (``other`` then goes on axis 1).

    Raises:
        ValueError: both above the limit (over 4e9 programs: no tensor that fits in memory).
    """
    if count <= MAX_GRID_YZ:
        return 1
    if other <= MAX_GRID_YZ:
        return 0
    raise ValueError(f"a grid of {count} by {other} programs exceeds CUDA's grid limits")
