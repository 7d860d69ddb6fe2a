"""Cross-entropy on one chunk of logits: per-row loss and log-sum-exp, and the logits' gradient.

One program per row, up to two passes over the vocabulary in ``BLOCK_V`` slices:
(1) online max / sum-exp (and the sum of logits, for label smoothing) and the
target logit, giving ``lse`` and the loss (skipped when ``HAS_LSE``: the
recompute backward reads the forward's ``lse``); (2) when ``WRITE_GRAD``,
``grad = (softmax * (1 + 2 z lse) - eps / V - (1 - eps) onehot) * scale[row]``
written to ``GRAD`` (in the gradient's dtype; ``GRAD`` may be ``LOGITS`` itself:
each element is read and then written by the same thread). Rows whose target
is ``ignore_index`` get loss 0, lse 0 and a zero gradient. ``LOGITS`` may be
float32 while ``GRAD`` is bf16/fp16: the softmax then never sees rounded logits.
"""

import triton
import triton.language as tl


@triton.jit
def ce_chunk(LOGITS, GRAD, TARGET, LOSS, LSE, SCALE, stride_logits, stride_grad, stride_scale, n_vocab,
             ignore_index, label_smoothing, z_loss,
             BLOCK_V: tl.constexpr, HAS_LSE: tl.constexpr, WRITE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = LOGITS + row * stride_logits
    g_row = GRAD + row * stride_grad
    target = tl.load(TARGET + row)
    if target == ignore_index:
        if WRITE_GRAD:
            for v0 in range(0, n_vocab, BLOCK_V):
                cols = v0 + tl.arange(0, BLOCK_V)
                tl.store(g_row + cols, tl.zeros((BLOCK_V,), dtype=tl.float32).to(GRAD.dtype.element_ty),
                         mask=cols < n_vocab)
        if WRITE_LOSS:
            tl.store(LOSS + row, 0.0)
            tl.store(LSE + row, 0.0)
        return
    if HAS_LSE:
        lse = tl.load(LSE + row).to(tl.float32)
    else:
        m = float("-inf")
        d = 0.0
        sum_x = 0.0
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = cols < n_vocab
            x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
            m = m_new
        lse = m + tl.log(d)
        if WRITE_LOSS:
            x_t = tl.load(x_row + target).to(tl.float32)
            loss = lse - (1.0 - label_smoothing) * x_t - label_smoothing * sum_x / n_vocab + z_loss * lse * lse
            tl.store(LOSS + row, loss)
            tl.store(LSE + row, lse)
    if WRITE_GRAD:
        scale = tl.load(SCALE + row * stride_scale).to(tl.float32)
        p_scale = 1.0 + 2.0 * z_loss * lse
        for v0 in range(0, n_vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = cols < n_vocab
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) * p_scale - label_smoothing / n_vocab
            grad = tl.where(cols == target, grad - (1.0 - label_smoothing), grad) * scale
            tl.store(g_row + cols, grad.to(GRAD.dtype.element_ty), mask=mask)
