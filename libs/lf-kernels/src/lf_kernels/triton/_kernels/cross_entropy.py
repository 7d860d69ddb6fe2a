"""Cross-entropy on one chunk of logits: per-row loss, and the logits' gradient written in place.

One program per row, two passes over the vocabulary in ``BLOCK_V`` slices:
(1) online max / sum-exp (and the sum of logits, for label smoothing) and the
target logit; (2) ``grad = (softmax * (1 + 2 z lse) - eps / V - (1 - eps) onehot) * grad_scale``
stored over the logits. Rows whose target is ``ignore_index`` get loss 0 and a zero gradient.
"""

import triton
import triton.language as tl


@triton.jit
def ce_chunk(LOGITS, TARGET, LOSS, stride_row, n_vocab, ignore_index, label_smoothing, z_loss, grad_scale,
             BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    target = tl.load(TARGET + row)
    if target == ignore_index:
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            tl.store(base + cols, tl.zeros((BLOCK_V,), dtype=tl.float32).to(LOGITS.dtype.element_ty),
                     mask=cols < n_vocab)
        tl.store(LOSS + row, 0.0)
        return
    m = float("-inf")
    d = 0.0
    sum_x = 0.0
    for v0 in range(0, n_vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < n_vocab
        x = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
        m = m_new
    lse = m + tl.log(d)
    x_t = tl.load(base + target).to(tl.float32)
    loss = lse - (1.0 - label_smoothing) * x_t - label_smoothing * sum_x / n_vocab + z_loss * lse * lse
    tl.store(LOSS + row, loss)
    p_scale = 1.0 + 2.0 * z_loss * lse
    for v0 in range(0, n_vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < n_vocab
        x = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) * p_scale - label_smoothing / n_vocab
        grad = tl.where(cols == target, grad - (1.0 - label_smoothing), grad) * grad_scale
        tl.store(base + cols, grad.to(LOGITS.dtype.element_ty), mask=mask)
