"""RMSNorm forward/backward kernels on ``(BLOCK_R, BLOCK_D)`` tiles of rows (``(n, hidden)``, last dim contiguous).

Forward: one program per ``BLOCK_R`` rows; reads ``x`` (and ``residual``),
writes ``y``, the summed residual ``h`` and ``rstd`` (float32, one per row).

Backward (Liger / Apex scheme): a persistent grid of about ``n_SM * k``
programs, each over one contiguous chunk of ``rows_per_program`` rows in
``BLOCK_R``-row tiles: writes ``dh`` and keeps its share of
``dweight = sum_rows dy * x_hat`` in float32 registers (a ``(BLOCK_R, BLOCK_D)``
accumulator, so no cross-warp reduction inside the loop), stored once as one row
of ``DW_PART (programs, hidden)``; one small kernel (``partials.py``) sums the
partials into ``dweight``'s dtype. Bytes: reads ``dy``, ``h``, ``rstd`` (and
``dres``), writes ``dh``, plus ``2 * programs * hidden * 4``; ``rstd`` is the
forward's, never recomputed. The loop keeps the next tile's loads in flight while
it computes one (``STAGES``, :data:`tuning.BWD_STAGES`): with one or two programs
per SM and a cross-warp row sum per tile, a plain loop leaves the SM waiting a
full memory latency per tile with 16-32 KB requested, below what ~4 TB/s over
132 SMs needs (~20 KB per microsecond per SM of reads).
"""

import functools

import triton
import triton.language as tl

from .masked import load_f32, store
from .tuning import autotuned, bwd_configs, row_configs


@triton.jit
def _rms_norm_fwd(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, stride_h, n_rows, n_cols, eps,
                  HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, EVEN: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    r_mask = rows < n_rows
    c_mask = cols < n_cols
    mask = r_mask[:, None] & c_mask[None, :]  # unused when EVEN (the tiles divide (n_rows, n_cols))
    # Default cache policy on x / residual: with evict_first the forward took 69.5 / 99.4 us at best (rms_norm +
    # residual, the LLM / DiT shapes of bench/results/fwd_sweep_h200.json), without it 66.5 / 97.3 (torch.compile
    # 68.6 / 100.6).
    x = load_f32(X + rows[:, None] * stride_x + cols[None, :], mask, EVEN)
    if HAS_RES:
        x += load_f32(R + rows[:, None] * stride_r + cols[None, :], mask, EVEN)
        h = x.to(H.dtype.element_ty)
        store(H + rows[:, None] * stride_h + cols[None, :], h, mask, EVEN)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = load_f32(W + cols, c_mask, EVEN)
    store(Y + rows[:, None] * stride_y + cols[None, :], x * rstd[:, None] * w[None, :], mask, EVEN)
    store(RSTD + rows, rstd, r_mask, EVEN)


def _even_fwd(args) -> bool:
    """Whether the forward's ``(BLOCK_R, BLOCK_D)`` tiles divide ``(n_rows, n_cols)`` (no masks)."""
    return args["n_rows"] % args["BLOCK_R"] == 0 and args["n_cols"] == args["BLOCK_D"]


@triton.jit
def _bwd_load(DY, H, RSTD, DRES, rows, row_end, cols, c_mask, stride_dy, stride_h, stride_dres,
              HAS_DRES: tl.constexpr):
    """One tile's inputs as stored (``dy``, ``h``, ``dres`` in their dtypes, ``rstd`` float32); rows >= row_end
    masked (no memory traffic)."""
    r_mask = rows < row_end
    rows = rows.to(tl.int64)
    mask = r_mask[:, None] & c_mask[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    rstd = tl.load(RSTD + rows, mask=r_mask, other=0.0)
    dres = 0.0
    if HAS_DRES:
        dres = tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0,
                       eviction_policy="evict_first")
    return dy, h, rstd, dres


@triton.jit
def _bwd_tile(DH, dy, h, rstd, dres, w, rows, row_end, cols, c_mask, stride_dh, n_cols, HAS_DRES: tl.constexpr):
    """Stores ``dh`` of one tile; returns its ``dy * x_hat`` (float32, summed over rows by the caller)."""
    dy = dy.to(tl.float32)
    rstd = rstd[:, None]
    x_hat = h.to(tl.float32) * rstd
    wdy = w[None, :] * dy
    dh = (wdy - x_hat * (tl.sum(x_hat * wdy, axis=1) / n_cols)[:, None]) * rstd
    if HAS_DRES:
        dh += dres.to(tl.float32)
    mask = (rows < row_end)[:, None] & c_mask[None, :]
    tl.store(DH + rows.to(tl.int64)[:, None] * stride_dh + cols[None, :], dh.to(DH.dtype.element_ty), mask=mask)
    return dy * x_hat


@triton.jit
def _rms_norm_bwd(DY, H, W, RSTD, DRES, DH, DW_PART, stride_dy, stride_h, stride_dres, stride_dh,
                  n_rows, n_cols, rows_per_program, HAS_DRES: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_R: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    c_mask = cols < n_cols
    w = tl.load(W + cols, mask=c_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)  # reduced over rows once, after the loop
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    if STAGES == 0:  # software pipelining by hand: tile i + 1's loads are in flight while tile i is computed
        rows = row_start + tl.arange(0, BLOCK_R)
        dy, h, rstd, dres = _bwd_load(DY, H, RSTD, DRES, rows, row_end, cols, c_mask, stride_dy, stride_h,
                                      stride_dres, HAS_DRES)
        for _ in range(0, row_end - row_start, BLOCK_R):
            cur_rows, cur_dy, cur_h, cur_rstd, cur_dres = rows, dy, h, rstd, dres
            rows += BLOCK_R
            dy, h, rstd, dres = _bwd_load(DY, H, RSTD, DRES, rows, row_end, cols, c_mask, stride_dy, stride_h,
                                          stride_dres, HAS_DRES)
            dw += _bwd_tile(DH, cur_dy, cur_h, cur_rstd, cur_dres, w, cur_rows, row_end, cols, c_mask, stride_dh,
                            n_cols, HAS_DRES)
    else:  # STAGES == 1: plain loop; >= 2: Triton pipelines the loads through shared memory
        for i in tl.range(0, row_end - row_start, BLOCK_R, num_stages=STAGES):
            rows = row_start + i + tl.arange(0, BLOCK_R)
            dy, h, rstd, dres = _bwd_load(DY, H, RSTD, DRES, rows, row_end, cols, c_mask, stride_dy, stride_h,
                                          stride_dres, HAS_DRES)
            dw += _bwd_tile(DH, dy, h, rstd, dres, w, rows, row_end, cols, c_mask, stride_dh, n_cols, HAS_DRES)
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + cols, tl.sum(dw, axis=0), mask=c_mask)


@functools.cache
def rms_norm_fwd(block_d: int):
    """The forward kernel tuned for feature block ``block_d``; grid ``(cdiv(n_rows, BLOCK_R),)``."""
    # 16-32 elements a thread, 4 or 8 warps: the configs within 2% of the best at both bench shapes of
    # bench/results/fwd_sweep_h200.json (after the cache-policy change). With 8 a thread or 16 warps some ran
    # up to 46% slower (rms_norm at 32,760 x 1,536: up to 69.5 us against 47.7): a tuner that can pick them
    # sometimes does (do_bench noise at ~50 us).
    configs = row_configs(block_d, warps=(4, 8), min_elems=16, regs_per_elem=2.5)
    return autotuned(triton.heuristics({"EVEN": _even_fwd})(_rms_norm_fwd), configs, key=["n_cols", "HAS_RES"])


@functools.cache
def rms_norm_bwd(block_d: int):
    """The persistent backward kernel tuned for ``block_d``; grid ``(programs,)``, see ``persistent_split``."""
    configs = bwd_configs(row_configs(block_d, rows=(1, 2, 4, 8), regs_per_elem=6.0))
    return autotuned(_rms_norm_bwd, configs, key=["n_cols", "HAS_DRES"])
