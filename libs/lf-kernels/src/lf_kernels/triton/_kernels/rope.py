"""Rotary embedding kernel (forward and, with ``BACKWARD``, the transposed rotation).

One program per ``BLOCK_S`` tokens x all heads (``BLOCK_H >= heads`` unless the
heads do not fit one tile): each token's cos/sin row is loaded once and applied
to every head, ``x`` is read as the two contiguous halves of each head (rotate
half) or as one contiguous row split into (even, odd) pairs in registers
(interleaved), never gathered. ``x`` and ``y`` are addressed through strides
``(batch, heads, seq)`` with a unit feature stride, so both (b, h, s, d) and
transposed (b, s, h, d) memory layouts work without copies. For pair ``(a, b)``
(``(i, i + rot/2)`` rotate-half, ``(2i, 2i + 1)`` interleaved)::

    forward:  y_a = x_a cos_a - x_b sin_a      y_b = x_b cos_b + x_a sin_b
    backward: dx_a = dy_a cos_a + dy_b sin_b   dx_b = dy_b cos_b - dy_a sin_a

Tiles are 3-D ``(BLOCK_S, BLOCK_H, BLOCK_P)``; tables ``(BLOCK_S, BLOCK_P)`` broadcast over heads.
Bytes: reads ``x`` and the tables' rows once, writes ``y``.
"""

import functools

import triton
import triton.language as tl

from .tuning import autotuned, row_configs


@triton.jit
def _rotary(X, COS, SIN, Y, n_tokens, seq_len, n_heads, head_dim, rot_half,
            sx_b, sx_h, sx_s, sy_b, sy_h, sy_s, sc_b, sc_s,
            INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_PASS: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_S: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    t_mask = tok < n_tokens
    b = tok // seq_len
    s = tok % seq_len
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    th_mask = t_mask[:, None, None] & (heads < n_heads)[None, :, None]
    c_row = (b * sc_b + s * sc_s)[:, None]                                               # (S, 1)
    x_row = X + (b * sx_b + s * sx_s)[:, None, None] + heads[None, :, None] * sx_h      # (S, H, 1)
    y_row = Y + (b * sy_b + s * sy_s)[:, None, None] + heads[None, :, None] * sy_h
    if INTERLEAVED:
        q = tl.arange(0, 2 * BLOCK_P)
        q_mask = q < 2 * rot_half
        c_mask = t_mask[:, None] & q_mask[None, :]
        mask = th_mask & q_mask[None, None, :]
        cos_a, cos_b = tl.split(tl.reshape(tl.load(COS + c_row + q[None, :], mask=c_mask, other=0.0).to(tl.float32),
                                           (BLOCK_S, BLOCK_P, 2)))
        sin_a, sin_b = tl.split(tl.reshape(tl.load(SIN + c_row + q[None, :], mask=c_mask, other=0.0).to(tl.float32),
                                           (BLOCK_S, BLOCK_P, 2)))
        x = tl.load(x_row + q[None, None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        x_a, x_b = tl.split(tl.reshape(x, (BLOCK_S, BLOCK_H, BLOCK_P, 2)))
    else:
        p = tl.arange(0, BLOCK_P)
        p_mask = p < rot_half
        c_mask = t_mask[:, None] & p_mask[None, :]
        mask = th_mask & p_mask[None, None, :]
        cos_a = tl.load(COS + c_row + p[None, :], mask=c_mask, other=0.0).to(tl.float32)
        cos_b = tl.load(COS + c_row + rot_half + p[None, :], mask=c_mask, other=0.0).to(tl.float32)
        sin_a = tl.load(SIN + c_row + p[None, :], mask=c_mask, other=0.0).to(tl.float32)
        sin_b = tl.load(SIN + c_row + rot_half + p[None, :], mask=c_mask, other=0.0).to(tl.float32)
        x_a = tl.load(x_row + p[None, None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        x_b = tl.load(x_row + rot_half + p[None, None, :], mask=mask, other=0.0,
                      eviction_policy="evict_first").to(tl.float32)
    cos_a, cos_b, sin_a, sin_b = cos_a[:, None, :], cos_b[:, None, :], sin_a[:, None, :], sin_b[:, None, :]
    if BACKWARD:
        y_a = x_a * cos_a + x_b * sin_b
        y_b = x_b * cos_b - x_a * sin_a
    else:
        y_a = x_a * cos_a - x_b * sin_a
        y_b = x_b * cos_b + x_a * sin_b
    if INTERLEAVED:
        y = tl.reshape(tl.join(y_a, y_b), (BLOCK_S, BLOCK_H, 2 * BLOCK_P))
        tl.store(y_row + q[None, None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(y_row + p[None, None, :], y_a.to(Y.dtype.element_ty), mask=mask)
        tl.store(y_row + rot_half + p[None, None, :], y_b.to(Y.dtype.element_ty), mask=mask)
    if HAS_PASS:
        r = 2 * rot_half + tl.arange(0, BLOCK_PASS)
        r_mask = th_mask & (r < head_dim)[None, None, :]
        tl.store(y_row + r[None, None, :], tl.load(x_row + r[None, None, :], mask=r_mask), mask=r_mask)


@functools.cache
def rotary(block_h: int, block_p: int):
    """The kernel tuned for ``BLOCK_S`` tokens of ``block_h`` heads x ``2 * block_p`` features (``BLOCK_S`` and
    ``num_warps`` tuned); grid ``(cdiv(n_tokens, BLOCK_S), cdiv(n_heads, block_h))``."""
    configs = row_configs(block_h * 2 * block_p, rows=(1, 2, 4, 8), warps=(4, 8), name="BLOCK_S")
    return autotuned(_rotary, configs, key=["n_heads", "head_dim", "rot_half", "INTERLEAVED", "BACKWARD"])
