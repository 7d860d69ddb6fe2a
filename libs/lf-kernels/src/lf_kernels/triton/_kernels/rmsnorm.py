"""RMSNorm forward/backward kernels, one row per program (rows are ``(n, hidden)``, last dim contiguous).

Forward reads ``x`` (and ``residual``), writes ``y``, the summed residual ``h``
and ``rstd`` (float32, one per row). Backward: each program walks a block of
rows, writes ``dh`` and accumulates its share of ``dweight`` in float32; the
host sums the per-program partials.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm_fwd(X, R, W, Y, H, RSTD, stride_x, stride_r, stride_y, stride_h, n_cols, eps,
                 HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = x.to(H.dtype.element_ty)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def rms_norm_bwd(DY, H, W, RSTD, DRES, DH, DW_PART, stride_dy, stride_h, stride_dres, stride_dh,
                 n_rows, n_cols, rows_per_program, HAS_DRES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    row_start = (pid * rows_per_program).to(tl.int64)
    for i in range(0, tl.minimum(rows_per_program, n_rows - row_start)):
        row = row_start + i
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        x_hat = tl.load(H + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32) * tl.load(RSTD + row)
        wdy = w * dy
        dh = (wdy - x_hat * (tl.sum(x_hat * wdy, axis=0) / n_cols)) * tl.load(RSTD + row)
        if HAS_DRES:
            dh += tl.load(DRES + row * stride_dres + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DH + row * stride_dh + cols, dh.to(DH.dtype.element_ty), mask=mask)
        dw += dy * x_hat
    tl.store(DW_PART + pid * n_cols + cols, dw, mask=mask)
