"""adaLN modulation kernels on ``x`` viewed as ``(batch * groups, tokens_per_group, hidden)``, contiguous.

Tiles are ``(BLOCK_R tokens, BLOCK_D features)`` inside one group, so each
program loads its group's ``shift`` / ``scale`` block once.

Forward, one modulation row per sample (DiT, Wan 2.1: ``groups == 1``): ``_modulate_fwd_flat``, inductor's
point-wise layout: 1-D blocks of ``BLOCK`` consecutive elements of one sample (across rows), the feature index
a modulo by the compile-time ``HIDDEN``; grid (blocks, samples). On the H200, at Wan's hidden 1,536, it ran in
47.8 us against ``torch.compile``'s 47.7, where the tiles below took 49.1 at best
(``bench/results/fwd_sweep_h200.json``).
Forward, per frame / per token (``groups > 1``): one program per (group, token block, feature block) on a 2-D
grid (groups on axis ``BG_AXIS``, token and feature blocks on the other, ``D_BLOCKS`` feature blocks a row).
Both have no masks when their blocks divide the tensor (``EVEN``, set by a heuristic after the tuner's pick).
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

from . import INTERPRETED
from .tuning import autotuned, bwd_configs, row_configs


@triton.jit
def _sample_offsets(pid, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """Element offsets of block ``pid`` within a sample; int64 before the multiply for samples of 2**31 elements
    or more (``WIDE``), int32 (fewer instructions) otherwise."""
    if WIDE:
        pid = pid.to(tl.int64)
    return pid * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _modulate_fwd_flat(X, SHIFT, SCALE, Y, per_sample, ss_b, sc_b, HIDDEN: tl.constexpr, BLOCK: tl.constexpr,
                       BG_AXIS: tl.constexpr, WIDE: tl.constexpr, EVEN: tl.constexpr):
    offs = _sample_offsets(tl.program_id(1 - BG_AXIS), BLOCK, WIDE)  # within the sample
    b = tl.program_id(BG_AXIS).to(tl.int64)
    col = offs % HIDDEN
    x_ptr = X + b * per_sample + offs
    y_ptr = Y + b * per_sample + offs
    if EVEN:
        shift = tl.load(SHIFT + b * ss_b + col, eviction_policy="evict_last").to(tl.float32)
        scale = tl.load(SCALE + b * sc_b + col, eviction_policy="evict_last").to(tl.float32)
        x = tl.load(x_ptr).to(tl.float32)
        tl.store(y_ptr, (x * (1.0 + scale) + shift).to(Y.dtype.element_ty))
    else:
        mask = offs < per_sample
        shift = tl.load(SHIFT + b * ss_b + col, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        scale = tl.load(SCALE + b * sc_b + col, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        x = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr, (x * (1.0 + scale) + shift).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _modulate_fwd(X, SHIFT, SCALE, Y, groups, tokens_per_group, hidden, ss_b, ss_g, sc_b, sc_g,
                  BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, D_BLOCKS: tl.constexpr, BG_AXIS: tl.constexpr,
                  EVEN: tl.constexpr):
    # The (group, tile) pair comes from two grid axes and the feature block from a compile-time count: one
    # run-time integer division per program (by ``groups``), where the earlier 1-D grid needed three (div.s32).
    tile = tl.program_id(1 - BG_AXIS)
    bg = tl.program_id(BG_AXIS).to(tl.int64)
    cols = (tile % D_BLOCKS) * BLOCK_D + tl.arange(0, BLOCK_D)
    t = (tile // D_BLOCKS) * BLOCK_R + tl.arange(0, BLOCK_R)
    b = bg // groups
    g = bg % groups
    offs = (bg * tokens_per_group + t)[:, None] * hidden + cols[None, :]
    # x / y: default cache policy, as swiglu.py says; shift / scale rows are re-read by every token block: kept
    if EVEN:  # the tile divides the group: no masks
        shift = tl.load(SHIFT + b * ss_b + g * ss_g + cols, eviction_policy="evict_last").to(tl.float32)
        scale = tl.load(SCALE + b * sc_b + g * sc_g + cols, eviction_policy="evict_last").to(tl.float32)
        x = tl.load(X + offs).to(tl.float32)
    else:
        c_mask = cols < hidden
        shift = tl.load(SHIFT + b * ss_b + g * ss_g + cols, mask=c_mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
        scale = tl.load(SCALE + b * sc_b + g * sc_g + cols, mask=c_mask, other=0.0,
                        eviction_policy="evict_last").to(tl.float32)
        mask = (t < tokens_per_group)[:, None] & c_mask[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    y = (x * (1.0 + scale[None, :]) + shift[None, :]).to(Y.dtype.element_ty)
    if EVEN:
        tl.store(Y + offs, y)
    else:
        tl.store(Y + offs, y, mask=mask)


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
    """Forward tuned for ``block_d``; grid ``(cdiv(tokens_per_group, BLOCK_R) * D_BLOCKS, batch * groups)``, or
    the two swapped with ``BG_AXIS = 0`` (see ``lf_kernels.triton._layout.grid_axis``)."""
    return autotuned(triton.heuristics({"EVEN": _even_fwd})(_modulate_fwd), _configs(block_d, few_tokens, 2.5),
                     key=["hidden"])


@functools.cache
def modulate_fwd_flat():
    """Per-sample forward; grid ``(cdiv(per_sample, BLOCK), batch)``, or swapped with ``BG_AXIS = 0``.
    ``BLOCK`` x ``num_warps``: 8 elements a thread (16-byte bf16 accesses), inductor's 1,024 x 4 and 2,048 x 8."""
    configs = ([triton.Config({"BLOCK": 128}, num_warps=4)] if INTERPRETED else
               [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 2048}, num_warps=8)])
    return autotuned(triton.heuristics({"EVEN": _even_flat})(_modulate_fwd_flat), configs, key=["HIDDEN"])


def _even_flat(args) -> bool:
    """Whether ``BLOCK`` divides the sample (no masks)."""
    return args["per_sample"] % args["BLOCK"] == 0


def _even_fwd(args) -> bool:
    """Whether the forward's ``(BLOCK_R, BLOCK_D)`` tiles divide ``(tokens_per_group, hidden)`` (no masks)."""
    return args["tokens_per_group"] % args["BLOCK_R"] == 0 and args["hidden"] % args["BLOCK_D"] == 0


@functools.cache
def modulate_bwd(block_d: int, few_tokens: bool):
    """Backward tuned for ``block_d``; grid ``(batch * groups * n_splits * d_blocks,)``."""
    return autotuned(_modulate_bwd, bwd_configs(_configs(block_d, few_tokens, 6.0)), key=["hidden"])
