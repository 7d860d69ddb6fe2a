"""Sum of float32 partial-sum rows: the second pass of the persistent backward kernels' parameter gradients.

``OUT[o, :] = sum_p PART[o, p, :]`` for ``PART (n_out, n_parts, n_cols)``
(contiguous, float32), rounded once to each output's dtype: rows
``o < n_out_a`` go to ``OUT_A[o]``, the rest to ``OUT_B[o - n_out_a]`` (so one
launch writes e.g. ``dshift`` and ``dscale``, whatever their dtypes). One program
per ``(BLOCK_C columns, output row)`` loads ``BLOCK_P`` partial rows at once
(usually all of them: one memory latency, no loop), adds them in a fixed
order (deterministic, no atomics).
"""

import triton
import triton.language as tl


@triton.jit
def sum_partials(PART, OUT_A, OUT_B, n_out_a, n_parts, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                 O_AXIS: tl.constexpr):
    """Grid ``(cdiv(n_cols, BLOCK_C), n_out)`` with ``O_AXIS = 1``, or ``(n_out, cdiv(n_cols, BLOCK_C))`` with
    ``O_AXIS = 0`` (more than 65,535 output rows: CUDA's limit on grid axis 1)."""
    o = tl.program_id(O_AXIS)
    cols = tl.program_id(1 - O_AXIS) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = cols < n_cols
    base = PART + o.to(tl.int64) * n_parts * n_cols
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for p in range(0, n_parts, BLOCK_P):
        parts = p + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & c_mask[None, :]
        acc += tl.load(base + parts[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if o < n_out_a:
        tl.store(OUT_A + o.to(tl.int64) * n_cols + cols, total.to(OUT_A.dtype.element_ty), mask=c_mask)
    else:
        tl.store(OUT_B + (o - n_out_a).to(tl.int64) * n_cols + cols, total.to(OUT_B.dtype.element_ty), mask=c_mask)
