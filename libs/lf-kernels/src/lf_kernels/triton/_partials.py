"""The second pass of the persistent backward kernels: float32 partial sums -> parameter gradients, one launch.

Legend: ``o`` output rows, ``p`` partial rows per output, ``c`` columns (hidden).
"""

from __future__ import annotations

import torch

from ._dispatch import kernels
from ._layout import cdiv, grid_axis, next_pow2

__all__ = ["sum_partials"]

_MAX_BLOCK_P = 512  # partial rows loaded at once: every persistent grid here has fewer per output
_TILE = 8192  # float32 elements per program (64 per thread at 4 warps)


def sum_partials(parts_opc: torch.Tensor, out_a: torch.Tensor, out_b: torch.Tensor | None = None) -> None:
    """``out[o] = parts_opc[o].sum(0)`` in float32, rounded once to the output's dtype, written in place.

    Rows ``o < out_a.shape[0]`` of the result go to ``out_a``, the rest to ``out_b``; one kernel launch
    replaces PyTorch's reduction plus one cast per output (each a few microseconds next to a 50-150 us
    backward). The sum is over a fixed order: deterministic.

    Args:
        parts_opc: ``(o, p, c)`` float32, contiguous.
        out_a: ``(o_a, c)`` contiguous, any float dtype.
        out_b: ``(o - o_a, c)`` contiguous, any float dtype; ``None`` when ``o_a == o``.
    """
    n_out, n_parts, n_cols = parts_opc.shape
    out_b = out_a if out_b is None else out_b
    if n_out == 0 or n_cols == 0:
        return
    block_p = min(_MAX_BLOCK_P, next_pow2(n_parts))
    block_c = min(256, max(32, _TILE // block_p))
    col_blocks = cdiv(n_cols, block_c)
    o_axis = grid_axis(n_out, col_blocks)  # per-token dshift / dscale of a long sequence: many rows
    kernels("partials").sum_partials[(col_blocks, n_out) if o_axis == 1 else (n_out, col_blocks)](
        parts_opc, out_a, out_b, out_a.shape[0], n_parts, n_cols, BLOCK_P=block_p, BLOCK_C=block_c, O_AXIS=o_axis,
        num_warps=4 if block_p * block_c <= _TILE else 8,
    )
