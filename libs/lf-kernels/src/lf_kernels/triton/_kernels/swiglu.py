"""SwiGLU kernels on ``(rows, cols)`` views with a unit column stride; float32 math.

``y = silu(g) * u``; ``dg = dy * u * s * (1 + g * (1 - s))`` with ``s = sigmoid(g)``; ``du = dy * silu(g)``.
One program per ``(BLOCK_R, BLOCK_D)`` tile, column blocks fastest (consecutive programs touch
consecutive memory); bytes: forward reads ``g``, ``u``, writes ``y``; backward reads ``dy``, ``g``, ``u``,
writes ``dg``, ``du``. Loads keep the default cache policy: with ``evict_first`` these kernels took 50.2 / 82.8 us
(forward / backward) at the LLM shape and 73.3 / 122.9 us at the DiT shape of ``bench/kernels/fused_ops.py``,
without it 47.8 / 78.8 and 69.8 / 117.0 us (H200, GPU kernel time; ``torch.compile`` 47.3 / 70.2 us forward;
``bench/results/fused_ops_h200.json`` before and after).
"""

import functools

import triton
import triton.language as tl

from .tuning import autotuned, row_configs


@triton.jit
def _tile(pid, n_rows, n_cols, col_blocks, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = (pid // col_blocks).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % col_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    return rows, cols, (rows < n_rows)[:, None] & (cols < n_cols)[None, :]


@triton.jit
def _swiglu_fwd(G, U, Y, stride_g, stride_u, stride_y, n_rows, n_cols, col_blocks,
                BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    rows, cols, mask = _tile(tl.program_id(0), n_rows, n_cols, col_blocks, BLOCK_R, BLOCK_D)
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(DY, G, U, DG, DU, stride_dy, stride_g, stride_u, stride_dg, stride_du, n_rows, n_cols, col_blocks,
                BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    rows, cols, mask = _tile(tl.program_id(0), n_rows, n_cols, col_blocks, BLOCK_R, BLOCK_D)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = dy * u * s * (1.0 + g * (1.0 - s))
    tl.store(DG + rows[:, None] * stride_dg + cols[None, :], dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + rows[:, None] * stride_du + cols[None, :], (dy * g * s).to(DU.dtype.element_ty), mask=mask)


@functools.cache
def swiglu_fwd(block_d: int):
    """Forward tuned for column block ``block_d``; grid ``(cdiv(n_rows, BLOCK_R) * col_blocks,)``."""
    return autotuned(_swiglu_fwd, row_configs(block_d, rows=(1, 2, 4, 8, 16, 32), warps=(4, 8), max_elems=32),
                     key=["n_cols"])


@functools.cache
def swiglu_bwd(block_d: int):
    """Backward tuned for column block ``block_d``; same grid as the forward."""
    return autotuned(_swiglu_bwd, row_configs(block_d, rows=(1, 2, 4, 8, 16, 32), warps=(4, 8), max_elems=32),
                     key=["n_cols"])
