"""SwiGLU kernels on ``(rows, cols)`` views with a unit column stride; float32 math.

``y = silu(g) * u``; ``dg = dy * u * s * (1 + g * (1 - s))`` with ``s = sigmoid(g)``; ``du = dy * silu(g)``.
One program per ``(BLOCK_R, BLOCK_D)`` tile, column blocks fastest (consecutive programs touch
consecutive memory), without masks when the tiles divide the view (``EVEN``, a heuristic after the tuner's
pick); bytes: forward reads ``g``, ``u``, writes ``y``; backward reads ``dy``, ``g``, ``u``, writes ``dg``, ``du``.
Loads keep the default cache policy: with ``evict_first`` these kernels took 50.2 / 82.8 us
(forward / backward) at the LLM shape and 73.3 / 122.9 us at the DiT shape of ``bench/kernels/fused_ops.py``,
without it 47.8 / 78.8 and 69.8 / 117.0 us (H200, GPU kernel time; ``torch.compile`` 47.3 / 70.2 us forward;
``bench/results/fused_ops_h200.json`` before and after).
"""

import functools

import triton
import triton.language as tl

from .masked import load_f32, store
from .tuning import autotuned, row_configs


@triton.jit
def _tile(pid, n_rows, n_cols, COL_BLOCKS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # COL_BLOCKS is a compile-time count: no run-time integer division per program
    rows = (pid // COL_BLOCKS).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % COL_BLOCKS) * BLOCK_D + tl.arange(0, BLOCK_D)
    return rows, cols, (rows < n_rows)[:, None] & (cols < n_cols)[None, :]


@triton.jit
def _swiglu_fwd(G, U, Y, stride_g, stride_u, stride_y, n_rows, n_cols, COL_BLOCKS: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, EVEN: tl.constexpr):
    rows, cols, mask = _tile(tl.program_id(0), n_rows, n_cols, COL_BLOCKS, BLOCK_R, BLOCK_D)
    g = load_f32(G + rows[:, None] * stride_g + cols[None, :], mask, EVEN)
    u = load_f32(U + rows[:, None] * stride_u + cols[None, :], mask, EVEN)
    store(Y + rows[:, None] * stride_y + cols[None, :], g * tl.sigmoid(g) * u, mask, EVEN)


@triton.jit
def _swiglu_bwd(DY, G, U, DG, DU, stride_dy, stride_g, stride_u, stride_dg, stride_du, n_rows, n_cols,
                COL_BLOCKS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, EVEN: tl.constexpr):
    rows, cols, mask = _tile(tl.program_id(0), n_rows, n_cols, COL_BLOCKS, BLOCK_R, BLOCK_D)
    dy = load_f32(DY + rows[:, None] * stride_dy + cols[None, :], mask, EVEN)
    g = load_f32(G + rows[:, None] * stride_g + cols[None, :], mask, EVEN)
    u = load_f32(U + rows[:, None] * stride_u + cols[None, :], mask, EVEN)
    s = tl.sigmoid(g)
    store(DG + rows[:, None] * stride_dg + cols[None, :], dy * u * s * (1.0 + g * (1.0 - s)), mask, EVEN)
    store(DU + rows[:, None] * stride_du + cols[None, :], dy * g * s, mask, EVEN)


def _even(args) -> bool:
    """Whether the ``(BLOCK_R, BLOCK_D)`` tiles divide ``(n_rows, n_cols)`` (no masks)."""
    return args["n_rows"] % args["BLOCK_R"] == 0 and args["n_cols"] % args["BLOCK_D"] == 0


_CONFIGS = {"rows": (1, 2, 4, 8, 16, 32), "warps": (4, 8), "max_elems": 32}


@functools.cache
def swiglu_fwd(block_d: int):
    """Forward tuned for column block ``block_d``; grid ``(cdiv(n_rows, BLOCK_R) * COL_BLOCKS,)``."""
    return autotuned(triton.heuristics({"EVEN": _even})(_swiglu_fwd), row_configs(block_d, **_CONFIGS), key=["n_cols"])


@functools.cache
def swiglu_bwd(block_d: int):
    """Backward tuned for column block ``block_d``; same grid as the forward."""
    return autotuned(triton.heuristics({"EVEN": _even})(_swiglu_bwd), row_configs(block_d, **_CONFIGS), key=["n_cols"])
