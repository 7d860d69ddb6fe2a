"""Rotary embedding kernel (forward and, with ``BACKWARD``, the transposed rotation).

One program per (token, block of heads); the token's cos/sin row is loaded
once and applied to every head. ``x`` and ``y`` are addressed through strides
``(batch, heads, seq)`` with a unit feature stride, so both (b, h, s, d) and
transposed (b, s, h, d) memory layouts work without copies. For pair ``(a, b)``
(``(i, i + rot/2)`` rotate-half, ``(2i, 2i + 1)`` interleaved)::

    forward:  y_a = x_a cos_a - x_b sin_a      y_b = x_b cos_b + x_a sin_b
    backward: dx_a = dy_a cos_a + dy_b sin_b   dx_b = dy_b cos_b - dy_a sin_a
"""

import triton
import triton.language as tl


@triton.jit
def rotary(X, COS, SIN, Y, seq_len, n_heads, head_dim, rot_half,
           sx_b, sx_h, sx_s, sy_b, sy_h, sy_s, sc_b, sc_s,
           INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, HAS_PASS: tl.constexpr,
           BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_PASS: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // seq_len
    s = tok % seq_len
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    p = tl.arange(0, BLOCK_P)
    p_mask = p < rot_half
    h_mask = (heads < n_heads)[:, None]
    c_base = b * sc_b + s * sc_s
    x_row = X + b * sx_b + s * sx_s + heads[:, None] * sx_h
    y_row = Y + b * sy_b + s * sy_s + heads[:, None] * sy_h
    if INTERLEAVED:
        # Contiguous loads of the 2 * BLOCK_P features, then split into (even, odd) pairs in registers.
        q = tl.arange(0, 2 * BLOCK_P)
        q_mask = q < 2 * rot_half
        mask = h_mask & q_mask[None, :]
        cos_a, cos_b = tl.split(tl.reshape(tl.load(COS + c_base + q, mask=q_mask, other=0.0).to(tl.float32),
                                           (BLOCK_P, 2)))
        sin_a, sin_b = tl.split(tl.reshape(tl.load(SIN + c_base + q, mask=q_mask, other=0.0).to(tl.float32),
                                           (BLOCK_P, 2)))
        x = tl.load(x_row + q[None, :], mask=mask, other=0.0).to(tl.float32)
        x_a, x_b = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_P, 2)))
    else:
        mask = h_mask & p_mask[None, :]
        cos_a = tl.load(COS + c_base + p, mask=p_mask, other=0.0).to(tl.float32)
        cos_b = tl.load(COS + c_base + p + rot_half, mask=p_mask, other=0.0).to(tl.float32)
        sin_a = tl.load(SIN + c_base + p, mask=p_mask, other=0.0).to(tl.float32)
        sin_b = tl.load(SIN + c_base + p + rot_half, mask=p_mask, other=0.0).to(tl.float32)
        x_a = tl.load(x_row + p[None, :], mask=mask, other=0.0).to(tl.float32)
        x_b = tl.load(x_row + p[None, :] + rot_half, mask=mask, other=0.0).to(tl.float32)
    cos_a, cos_b, sin_a, sin_b = cos_a[None, :], cos_b[None, :], sin_a[None, :], sin_b[None, :]
    if BACKWARD:
        y_a = x_a * cos_a + x_b * sin_b
        y_b = x_b * cos_b - x_a * sin_a
    else:
        y_a = x_a * cos_a - x_b * sin_a
        y_b = x_b * cos_b + x_a * sin_b
    if INTERLEAVED:
        y = tl.reshape(tl.join(y_a, y_b), (BLOCK_H, 2 * BLOCK_P))
        tl.store(y_row + q[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(y_row + p[None, :], y_a.to(Y.dtype.element_ty), mask=mask)
        tl.store(y_row + p[None, :] + rot_half, y_b.to(Y.dtype.element_ty), mask=mask)
    if HAS_PASS:
        q = 2 * rot_half + tl.arange(0, BLOCK_PASS)
        q_mask = h_mask & (q < head_dim)[None, :]
        tl.store(y_row + q[None, :], tl.load(x_row + q[None, :], mask=q_mask), mask=q_mask)
