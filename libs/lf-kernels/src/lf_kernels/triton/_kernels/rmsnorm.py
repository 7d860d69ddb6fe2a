"""RMSNorm forward/backward kernels on ``(BLOCK_R, BLOCK_D)`` tiles of rows (``(n, hidden)``, last dim contiguous).

Forward: one program per ``BLOCK_R`` rows; reads ``x`` (and ``residual``),
writes ``y``, the summed residual ``h`` and ``rstd`` (float32, one per row).

Backward (Liger / Apex scheme): a persistent grid of about ``n_SM * k``
programs, each over one contiguous chunk of ``rows_per_program`` rows in
``BLOCK_R``-row tiles: writes ``dh`` and keeps its share of
``dweight = sum_rows dy * x_hat`` in float32 registers (a ``(BLOCK_R, BLOCK_D)``
accumulator, so no cross-warp reduction inside the loop), stored once as one row
of ``DW_PART (programs, hidden)``; the host sums the partials. Bytes: reads
``dy``, ``h`` (and ``dres``), writes ``dh``, plus ``programs * hidden * 4``.
"""

import functools

import triton
import triton.language as tl

from .tuning import autotuned, row_configs


@triton.jit
def _rms_norm_fwd(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, stride_h, n_rows, n_cols, eps,
                  HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    r_mask = rows < n_rows
    c_mask = cols < n_cols
    mask = r_mask[:, None] & c_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    if HAS_RES:
        x += tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        h = x.to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    w = tl.load(W + cols, mask=c_mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=r_mask)


@triton.jit
def _rms_norm_bwd(DY, H, W, RSTD, DRES, DH, DW_PART, stride_dy, stride_h, stride_dres, stride_dh,
                  n_rows, n_cols, rows_per_program, HAS_DRES: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    c_mask = cols < n_cols
    w = tl.load(W + cols, mask=c_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)  # reduced over rows once, after the loop
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for i in range(0, row_end - row_start, BLOCK_R):
        rows = row_start + i + tl.arange(0, BLOCK_R)
        r_mask = rows < row_end
        rows = rows.to(tl.int64)
        mask = r_mask[:, None] & c_mask[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                     eviction_policy="evict_first").to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=r_mask, other=0.0)[:, None]
        x_hat = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0,
                        eviction_policy="evict_first").to(tl.float32) * rstd
        wdy = w[None, :] * dy
        dh = (wdy - x_hat * (tl.sum(x_hat * wdy, axis=1) / n_cols)[:, None]) * rstd
        if HAS_DRES:
            dh += tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0,
                          eviction_policy="evict_first").to(tl.float32)
        tl.store(DH + rows[:, None] * stride_dh + cols[None, :], dh.to(DH.dtype.element_ty), mask=mask)
        dw += dy * x_hat
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + cols, tl.sum(dw, axis=0), mask=c_mask)


@functools.cache
def rms_norm_fwd(block_d: int):
    """The forward kernel tuned for feature block ``block_d``; grid ``(cdiv(n_rows, BLOCK_R),)``."""
    return autotuned(_rms_norm_fwd, row_configs(block_d, regs_per_elem=2.5), key=["n_cols", "HAS_RES"])


@functools.cache
def rms_norm_bwd(block_d: int):
    """The persistent backward kernel tuned for ``block_d``; grid ``(programs,)``, see ``persistent_split``."""
    return autotuned(_rms_norm_bwd, row_configs(block_d, rows=(1, 2, 4, 8), regs_per_elem=6.0),
                     key=["n_cols", "HAS_DRES"])
