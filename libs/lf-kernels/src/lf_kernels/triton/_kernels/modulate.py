"""adaLN modulation kernels on ``x`` viewed as ``(batch * groups, tokens_per_group, hidden)``, contiguous.

Tiles are ``(BLOCK_R tokens, BLOCK_D features)`` inside one group, so each
program loads its group's ``shift`` / ``scale`` block once.

Forward: one program per (group, token block, feature block).
Backward: one program per (group, token split, feature block) walks a
contiguous run of ``rows_per_split`` tokens in tiles, writes ``dx`` and keeps
``dshift = sum dy`` and ``dscale = sum dy * x`` in float32 registers (``(BLOCK_R, BLOCK_D)``
accumulators, reduced over rows after the loop), stored once per program in the
buffers' dtype at partial row ``b * part_b + g * part_g + split`` of
``DSHIFT_PART`` / ``DSCALE_PART`` (``(rows, hidden)``: the host picks the strides
so that the rows one gradient row sums are adjacent, batch included when the
modulation is broadcast over it); ``partials.py`` sums them. Bytes: reads
``dy``, ``x``, writes ``dx``, plus the partials. The loop keeps the next tile's
loads in flight while it computes one (``STAGES``, see ``tuning.BWD_STAGES``).
"""

import functools

import triton
import triton.language as tl

from .tuning import autotuned, bwd_configs, row_configs


@triton.jit
def _modulate_fwd(X, SHIFT, SCALE, Y, groups, tokens_per_group, hidden, d_blocks, ss_b, ss_g, sc_b, sc_g,
                  BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    pid = tl.program_id(0)
    t_blocks = tl.cdiv(tokens_per_group, BLOCK_R)
    cols = (pid % d_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    rest = pid // d_blocks
    bg = (rest // t_blocks).to(tl.int64)
    t = (rest % t_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    c_mask = cols < hidden
    b = bg // groups
    g = bg % groups
    shift = tl.load(SHIFT + b * ss_b + g * ss_g + cols, mask=c_mask, other=0.0).to(tl.float32)
    scale = tl.load(SCALE + b * sc_b + g * sc_g + cols, mask=c_mask, other=0.0).to(tl.float32)
    mask = (t < tokens_per_group)[:, None] & c_mask[None, :]
    offs = (bg * tokens_per_group + t)[:, None] * hidden + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)  # default cache policy, as swiglu.py says
    y = x * (1.0 + scale[None, :]) + shift[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _tile_offs(t, t_end, row0, cols, c_mask, hidden):
    """Element offsets and mask of the tokens ``t`` (rows ``row0 + t``) of one tile."""
    return (row0 + t)[:, None] * hidden + cols[None, :], (t < t_end)[:, None] & c_mask[None, :]


@triton.jit
def _bwd_load(DY, X, t, t_end, row0, cols, c_mask, hidden):
    offs, mask = _tile_offs(t, t_end, row0, cols, c_mask, hidden)
    dy = tl.load(DY + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    return dy, x


@triton.jit
def _bwd_tile(DX, dy, x, scale1, t, t_end, row0, cols, c_mask, hidden):
    """Stores ``dx`` of one tile; returns its ``dy`` and ``dy * x`` in float32."""
    offs, mask = _tile_offs(t, t_end, row0, cols, c_mask, hidden)
    dy = dy.to(tl.float32)
    tl.store(DX + offs, (dy * scale1).to(DX.dtype.element_ty), mask=mask)
    return dy, dy * x.to(tl.float32)


@triton.jit
def _modulate_bwd(DY, X, SCALE, DX, DSHIFT_PART, DSCALE_PART, groups, tokens_per_group, hidden, d_blocks, n_splits,
                  rows_per_split, sc_b, sc_g, part_b, part_g, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                  STAGES: tl.constexpr):
    pid = tl.program_id(0)
    cols = (pid % d_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    rest = pid // d_blocks
    split = rest % n_splits
    bg = (rest // n_splits).to(tl.int64)
    c_mask = cols < hidden
    b = bg // groups
    g = bg % groups
    scale1 = 1.0 + tl.load(SCALE + b * sc_b + g * sc_g + cols, mask=c_mask, other=0.0).to(tl.float32)[None, :]
    acc_shift = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)  # reduced over rows once, after the loop
    acc_scale = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    t_start = split * rows_per_split
    t_end = tl.minimum(t_start + rows_per_split, tokens_per_group)
    row0 = bg * tokens_per_group
    if STAGES == 0:  # software pipelining by hand: tile i + 1's loads are in flight while tile i is computed
        t = t_start + tl.arange(0, BLOCK_R)
        dy, x = _bwd_load(DY, X, t, t_end, row0, cols, c_mask, hidden)
        for _ in range(0, t_end - t_start, BLOCK_R):
            cur_t, cur_dy, cur_x = t, dy, x
            t += BLOCK_R
            dy, x = _bwd_load(DY, X, t, t_end, row0, cols, c_mask, hidden)
            d_shift, d_scale = _bwd_tile(DX, cur_dy, cur_x, scale1, cur_t, t_end, row0, cols, c_mask, hidden)
            acc_shift += d_shift
            acc_scale += d_scale
    else:  # STAGES == 1: plain loop; >= 2: Triton pipelines the loads through shared memory
        for i in tl.range(0, t_end - t_start, BLOCK_R, num_stages=STAGES):
            t = t_start + i + tl.arange(0, BLOCK_R)
            dy, x = _bwd_load(DY, X, t, t_end, row0, cols, c_mask, hidden)
            d_shift, d_scale = _bwd_tile(DX, dy, x, scale1, t, t_end, row0, cols, c_mask, hidden)
            acc_shift += d_shift
            acc_scale += d_scale
    part = (b * part_b + g * part_g + split) * hidden + cols
    tl.store(DSHIFT_PART + part, tl.sum(acc_shift, axis=0).to(DSHIFT_PART.dtype.element_ty), mask=c_mask)
    tl.store(DSCALE_PART + part, tl.sum(acc_scale, axis=0).to(DSCALE_PART.dtype.element_ty), mask=c_mask)


def _configs(block_d: int, few_tokens: bool, regs_per_elem: float):
    """Token tiles: 1 row when groups hold few tokens (per-token modulation), else tuned."""
    return row_configs(block_d, rows=(1,) if few_tokens else (1, 2, 4, 8, 16), min_elems=1 if few_tokens else 8,
                       regs_per_elem=regs_per_elem)


@functools.cache
def modulate_fwd(block_d: int, few_tokens: bool):
    """Forward tuned for ``block_d``; grid ``(batch * groups * cdiv(tokens_per_group, BLOCK_R) * d_blocks,)``."""
    return autotuned(_modulate_fwd, _configs(block_d, few_tokens, 2.5), key=["hidden"])


@functools.cache
def modulate_bwd(block_d: int, few_tokens: bool):
    """Backward tuned for ``block_d``; grid ``(batch * groups * n_splits * d_blocks,)``."""
    return autotuned(_modulate_bwd, bwd_configs(_configs(block_d, few_tokens, 6.0)), key=["hidden"])
