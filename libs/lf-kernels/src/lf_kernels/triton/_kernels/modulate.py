"""adaLN modulation kernels on ``x`` viewed as ``(batch * groups, tokens_per_group, hidden)``, contiguous.

Forward: one program per (group, block of tokens, block of features).
Backward: one program per (group, token split, block of features) walks its
tokens, writes ``dx`` and float32 partial sums of ``dshift = sum dy`` and
``dscale = sum dy * x``; the host sums the splits.
"""

import triton
import triton.language as tl


@triton.jit
def modulate_fwd(X, SHIFT, SCALE, Y, groups, tokens_per_group, hidden, t_blocks, ss_b, ss_g, sc_b, sc_g,
                 BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    bg = pid // t_blocks
    t = (pid % t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_mask = cols < hidden
    b = bg // groups
    g = bg % groups
    shift = tl.load(SHIFT + b * ss_b + g * ss_g + cols, mask=c_mask, other=0.0).to(tl.float32)
    scale = tl.load(SCALE + b * sc_b + g * sc_g + cols, mask=c_mask, other=0.0).to(tl.float32)
    mask = (t < tokens_per_group)[:, None] & c_mask[None, :]
    offs = (bg * tokens_per_group + t)[:, None] * hidden + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * (1.0 + scale[None, :]) + shift[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def modulate_bwd(DY, X, SCALE, DX, DSHIFT_PART, DSCALE_PART, groups, tokens_per_group, hidden, n_splits,
                 tokens_per_split, sc_b, sc_g, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    bg = pid // n_splits
    split = pid % n_splits
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    c_mask = cols < hidden
    b = bg // groups
    g = bg % groups
    scale = tl.load(SCALE + b * sc_b + g * sc_g + cols, mask=c_mask, other=0.0).to(tl.float32)
    acc_shift = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_scale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    t_start = split * tokens_per_split
    for t0 in range(0, tokens_per_split, BLOCK_T):
        t = t_start + t0 + tl.arange(0, BLOCK_T)
        mask = (t < tokens_per_group)[:, None] & c_mask[None, :]
        offs = (bg * tokens_per_group + t)[:, None] * hidden + cols[None, :]
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, (dy * (1.0 + scale[None, :])).to(DX.dtype.element_ty), mask=mask)
        acc_shift += tl.sum(dy, axis=0)
        acc_scale += tl.sum(dy * x, axis=0)
    part = (bg * n_splits + split) * hidden + cols
    tl.store(DSHIFT_PART + part, acc_shift, mask=c_mask)
    tl.store(DSCALE_PART + part, acc_scale, mask=c_mask)
