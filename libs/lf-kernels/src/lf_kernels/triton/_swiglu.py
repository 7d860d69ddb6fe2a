"""Fused SwiGLU activation ``silu(gate) * up``, forward and backward.

Legend: ``n`` rows (leading dims flattened), ``f`` ffn hidden.
"""

from __future__ import annotations

import torch

from .._fused_reference import swiglu_reference
from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import as_rows, cdiv, next_pow2

__all__ = ["swiglu"]

_MAX_BLOCK = 1024


def _col_block(f: int) -> int:
    """Column block: the largest power of two <= 1024 dividing ``f`` (no masked lanes: 1536 -> 512,
    11008 -> 256), or ``next_pow2(f)`` capped at 1024 when that divisor is below 128."""
    div = f & -f
    return min(_MAX_BLOCK, div) if div >= 128 else min(_MAX_BLOCK, next_pow2(f))


def _launch(kernel, n: int, f: int, *args) -> None:
    block = _col_block(f)
    col_blocks = cdiv(f, block)
    kernel(block)[lambda meta: (cdiv(n, meta["BLOCK_R"]) * col_blocks,)](*args, n, f, COL_BLOCKS=col_blocks,
                                                                           BLOCK_D=block)


class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        g_nf, u_nf = as_rows(gate), as_rows(up)
        y_nf = torch.empty(g_nf.shape, dtype=gate.dtype, device=gate.device)
        if y_nf.numel():
            _launch(kernels("swiglu").swiglu_fwd, *g_nf.shape, g_nf, u_nf, y_nf, g_nf.stride(0), u_nf.stride(0),
                    y_nf.stride(0))
        ctx.save_for_backward(g_nf, u_nf)
        ctx.shapes = (gate.shape, up.dtype)
        return y_nf.view(gate.shape)

    @staticmethod
    def backward(ctx, dy):
        g_nf, u_nf = ctx.saved_tensors
        shape, up_dtype = ctx.shapes
        dy_nf = as_rows(dy)
        dg_nf = torch.empty(g_nf.shape, dtype=g_nf.dtype, device=g_nf.device)
        du_nf = torch.empty(u_nf.shape, dtype=up_dtype, device=u_nf.device)
        if dg_nf.numel():
            _launch(kernels("swiglu").swiglu_bwd, *g_nf.shape, dy_nf, g_nf, u_nf, dg_nf, du_nf, dy_nf.stride(0),
                    g_nf.stride(0), u_nf.stride(0), dg_nf.stride(0), du_nf.stride(0))
        return dg_nf.view(shape), du_nf.view(shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: FusedBackend | None = None) -> torch.Tensor:
    """SwiGLU ``silu(gate) * up`` (Shazeer 2020, arXiv 2002.05202; Llama's MLP), fused.

    Float32 math, one read of ``gate`` and ``up`` and one write of the output
    (backward: reads ``dy``, ``gate``, ``up``; writes both grads); nothing but
    the inputs is saved. ``gate`` / ``up`` may be column slices of one fused
    ``gate_up`` projection (a row stride, unit column stride): no copy.

    Args:
        gate, up: same shape ``(..., ffn_hidden)``.
        backend: ``"triton"`` / ``"reference"`` to force one; default picks (see ``kernel_backend``).

    Returns:
        Same shape, ``gate.dtype``.

    Raises:
        ValueError: ``gate`` and ``up`` shapes differ.

    Example:
        >>> swiglu(torch.zeros(2, 3), torch.ones(2, 3)).sum().item()
        0.0
    """
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate and up shapes differ: {tuple(gate.shape)} vs {tuple(up.shape)}")
    if resolve_backend("swiglu", backend, gate, up) == "reference" or gate.dim() == 0:
        return swiglu_reference(gate, up)
    return _SwiGLUFn.apply(gate, up)
