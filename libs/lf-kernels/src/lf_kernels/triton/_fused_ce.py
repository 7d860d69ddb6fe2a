"""Fused linear + cross-entropy that never materializes the ``(tokens, vocab)`` logits.

Liger-Kernel's approach (Hsu et al. 2024, arXiv 2410.10989): the forward walks
the tokens in chunks; per chunk it computes the logits ``(chunk, vocab)``, the
per-token loss and the logits' gradient in place (Triton kernel, or torch on
the reference backend), then folds that gradient into ``grad_hidden`` (chunk
rows) and ``grad_weight`` (accumulated with ``addmm_`` in the weight's dtype).
Backward only scales the stored gradients by the incoming scalar (in place).
Peak extra memory: ``grad_weight`` + ``grad_hidden`` + one ``(chunk, vocab)``
logits buffer in the input dtype.

Legend: ``n`` tokens (leading dims flattened), ``h`` hidden, ``v`` vocab, ``c`` chunk.
"""

from __future__ import annotations

from typing import Literal

import torch

from ._dispatch import FusedBackend, kernels, resolve_backend
from ._layout import as_rows, next_pow2

__all__ = ["fused_linear_cross_entropy"]

_CHUNK_ELEMENTS = 1 << 25  # default chunk: ~32M logits (64 MiB in bf16)


def _ce_chunk_torch(logits_cv, target_c, loss_c, ignore_index, eps, z, grad_scale):
    """The torch version of the Triton ``ce_chunk`` kernel (same maths, same in-place contract)."""
    x_cv = logits_cv.to(torch.promote_types(logits_cv.dtype, torch.float32))
    vocab = x_cv.shape[1]
    valid_c = target_c != ignore_index
    safe_t = torch.where(valid_c, target_c, 0)[:, None]
    lse_c = torch.logsumexp(x_cv, dim=-1)
    loss = lse_c - (1 - eps) * x_cv.gather(1, safe_t)[:, 0] - eps * x_cv.mean(-1) + z * lse_c.square()
    loss_c.copy_(torch.where(valid_c, loss, 0))
    grad_cv = torch.exp(x_cv - lse_c[:, None]) * (1 + 2 * z * lse_c)[:, None] - eps / vocab
    grad_cv.scatter_add_(1, safe_t, torch.full_like(safe_t, -(1 - eps), dtype=grad_cv.dtype))
    logits_cv.copy_(grad_cv.masked_fill_(~valid_c[:, None], 0.0).mul_(grad_scale))


def _ce_chunk_triton(logits_cv, target_c, loss_c, ignore_index, eps, z, grad_scale):
    vocab = logits_cv.shape[1]
    block_v = min(next_pow2(vocab), 16384)
    warps = 16 if block_v >= 8192 else 8 if block_v >= 2048 else 4
    kernels("cross_entropy").ce_chunk[(logits_cv.shape[0],)](
        logits_cv, target_c, loss_c, logits_cv.stride(0), vocab, ignore_index, eps, z, grad_scale,
        BLOCK_V=block_v, num_warps=warps,
    )


class _FusedLinearCEFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, ignore_index, eps, z, reduction, chunk, use_triton, need_h, need_w):
        h_nh = as_rows(hidden)
        t_n = target.reshape(-1)
        n, vocab = h_nh.shape[0], weight.shape[0]
        valid_n = t_n != ignore_index
        bad_n = valid_n & ((t_n < 0) | (t_n >= vocab))
        n_valid, n_bad = torch.stack((valid_n.sum(), bad_n.sum())).tolist()
        if n_bad:
            first = int(t_n[bad_n][0])
            raise ValueError(f"fused_linear_cross_entropy: {n_bad} target(s) outside [0, {vocab}) and not "
                             f"ignore_index={ignore_index}, e.g. {first}")
        grad_scale = 1.0 / max(n_valid, 1) if reduction == "mean" else 1.0
        wide = torch.promote_types(hidden.dtype, torch.float32)
        loss_n = torch.empty(n, dtype=wide, device=hidden.device)
        grad_h = torch.empty_like(h_nh, memory_format=torch.contiguous_format) if need_h else None
        grad_w = torch.zeros_like(weight, memory_format=torch.contiguous_format) if need_w else None
        logits_buf = torch.empty((min(chunk, n), vocab), dtype=hidden.dtype, device=hidden.device)
        ce_chunk = _ce_chunk_triton if use_triton else _ce_chunk_torch
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            h_ch, logits_cv = h_nh[start:stop], logits_buf[: stop - start]
            torch.mm(h_ch, weight.t(), out=logits_cv)
            ce_chunk(logits_cv, t_n[start:stop], loss_n[start:stop], ignore_index, eps, z, grad_scale)
            if grad_h is not None:
                torch.mm(logits_cv, weight, out=grad_h[start:stop])
            if grad_w is not None:
                grad_w.addmm_(logits_cv.t(), h_ch)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.hidden_shape = hidden.shape
        ctx.used = False
        return loss_n.sum() * grad_scale

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.used:
            raise RuntimeError("fused_linear_cross_entropy: backward through the same loss twice is not supported "
                               "(the gradients were computed in the forward and scaled in place)")
        ctx.used = True
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is not None:
            grad_h = grad_h.mul_(grad_loss.to(grad_h.dtype)).view(ctx.hidden_shape)
        if grad_w is not None:
            grad_w = grad_w.mul_(grad_loss.to(grad_w.dtype))
        return grad_h, grad_w, *([None] * 9)


def _check(hidden, weight, target, label_smoothing, z_loss, reduction, chunk_tokens):
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"fused_linear_cross_entropy: need hidden (..., h) and weight (vocab, h), got hidden "
                         f"{tuple(hidden.shape)} and weight {tuple(weight.shape)}")
    if target.shape != hidden.shape[:-1] or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise ValueError(f"fused_linear_cross_entropy: target must be integer with shape {tuple(hidden.shape[:-1])},"
                         f" got {tuple(target.shape)} {target.dtype}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"fused_linear_cross_entropy: hidden and weight dtypes differ: {hidden.dtype} vs "
                         f"{weight.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"fused_linear_cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0.0:
        raise ValueError(f"fused_linear_cross_entropy: z_loss must be >= 0, got {z_loss}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"fused_linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"fused_linear_cross_entropy: chunk_tokens must be >= 1, got {chunk_tokens}")


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    reduction: Literal["mean", "sum"] = "mean",
    chunk_tokens: int | None = None,
    *,
    backend: FusedBackend | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``target``, chunked over tokens (the LM head + loss).

    Per non-ignored token, with logits ``x`` and ``lse = logsumexp(x)``::

        loss = (1 - eps) * (lse - x[target]) + eps * (lse - mean(x)) + z_loss * lse**2

    label smoothing ``eps`` as ``torch.nn.functional.cross_entropy``, z-loss as
    PaLM (arXiv 2204.02311). ``"mean"`` divides by the number of non-ignored
    tokens (by 1 if there are none: loss 0, zero gradients, where PyTorch gives
    NaN). The gradients of ``hidden`` and ``weight`` are computed in the forward,
    one chunk at a time, so memory is ``O(chunk_tokens * vocab)`` rather than
    ``O(tokens * vocab)``; the softmax / CE gradient runs as a Triton kernel on
    CUDA, in torch otherwise (still chunked). Matmuls run in the input dtype
    (fp32 accumulation inside); ``grad_weight`` is accumulated across chunks in
    ``weight.dtype``, as Liger-Kernel does.

    Args:
        hidden: ``(..., h)`` final hidden states (float32 / bf16 / fp16, same dtype as ``weight``).
        weight: ``(vocab, h)`` LM head (untied or tied embedding).
        target: ``hidden.shape[:-1]`` integer labels, already shifted for next-token prediction.
        ignore_index: label that contributes nothing (padding, prompt tokens).
        label_smoothing: ``eps`` in ``[0, 1]``.
        z_loss: coefficient of ``lse**2`` (PaLM uses 1e-4), ``>= 0``.
        reduction: ``"mean"`` or ``"sum"`` over tokens.
        chunk_tokens: tokens per chunk; default ``2**25 // vocab`` (256 at vocab 128,256).
        backend: ``"triton"`` / ``"reference"`` for the per-chunk step; default picks (see ``kernel_backend``).

    Returns:
        The scalar loss in float32 (float64 for float64 inputs). Backward through it
        once (a second backward raises ``RuntimeError``).

    Raises:
        ValueError: shapes or dtypes that do not fit, an option out of range, or a
            target outside ``[0, vocab)`` that is not ``ignore_index``.

    Example:
        >>> hidden, weight = torch.randn(2, 5, 16, requires_grad=True), torch.randn(100, 16)
        >>> target = torch.randint(0, 100, (2, 5))
        >>> loss = fused_linear_cross_entropy(hidden, weight, target, chunk_tokens=4)
        >>> loss.backward(); hidden.grad.shape
        torch.Size([2, 5, 16])
    """
    _check(hidden, weight, target, label_smoothing, z_loss, reduction, chunk_tokens)
    use_triton = resolve_backend("fused_linear_cross_entropy", backend, hidden, weight, target) == "triton"
    n = max(1, hidden.numel() // max(1, hidden.shape[-1]))
    chunk = chunk_tokens or max(1, min(n, _CHUNK_ELEMENTS // weight.shape[0]))
    grad_on = torch.is_grad_enabled()
    return _FusedLinearCEFn.apply(
        hidden, weight, target, int(ignore_index), float(label_smoothing), float(z_loss), reduction, int(chunk),
        use_triton, grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
    )

