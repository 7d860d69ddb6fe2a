"""Fused linear + cross-entropy that never materializes the ``(tokens, vocab)`` logits.

Two modes share one chunk loop (:mod:`._fused_ce_sweep`):

- **grad in forward** (the default when a gradient is needed and the loss is a
  scalar; Liger-Kernel's scheme, Hsu et al. 2024, arXiv 2410.10989): the forward
  computes, chunk by chunk, the logits, the loss and the logits' gradient, and
  folds that gradient into ``grad_hidden``, ``grad_weight`` and ``grad_bias``
  (3 GEMMs per chunk, as many as eager). The backward only multiplies the
  stored gradients by the incoming scalar (skipped when it is 1).
- **recompute**: the forward computes the loss and saves the per-token
  log-sum-exp; the backward recomputes each chunk's logits (4 GEMMs). Used when
  no gradient is needed (eval: a loss-only sweep), for ``reduction="none"`` (a
  per-token ``grad_output`` must weight each token's term of ``grad_weight``
  before the sum over tokens, which grad-in-forward has already done), or when
  asked (``grad_in_forward=False``: backward-once semantics not wanted, e.g.
  ``retain_graph`` and two backward calls). Also the automatic choice for fp16
  inputs: grad-in-forward rounds ``grad * 1/n_tokens`` to fp16 before the loss
  scaler's factor arrives in the backward, so small gradient terms would flush
  to zero; the recompute backward sees the scaled ``grad_output`` first.

Precision: bf16/fp16 inputs get float32 chunk logits (the softmax never sees
rounded logits; eager ``F.linear`` rounds them to bf16), the logits' gradient
is rounded to the input dtype for the GEMMs. ``grad_weight`` accumulates across
chunks in ``grad_weight_dtype`` (default: the weight's dtype, as Liger-Kernel;
float32 costs ``4 * v * h`` bytes, 2 GB at vocab 128,256 x hidden 4,096, plus a
``2 * v * h`` cast at the end, and breaks the 1/4-of-eager memory target at that
shape). Measured error of ``grad_weight`` vs float64 is in the CHANGELOG.

Legend: ``n`` tokens (leading dims flattened), ``h`` hidden, ``v`` vocab.
"""

from __future__ import annotations

from typing import Literal

import torch

from ._dispatch import FusedBackend, resolve_backend
from ._fused_ce_sweep import SweepConfig, default_chunk, sweep
from ._layout import as_rows

__all__ = ["fused_linear_cross_entropy"]

_OP = "fused_linear_cross_entropy"


def _prepare(hidden, weight, target, cfg, reduction):
    """Rows, flat targets, the wide dtype and the loss normalisation; checks the targets (one host sync)."""
    h_nh, t_n = as_rows(hidden), target.reshape(-1)
    vocab = weight.shape[0]
    valid_n = t_n != cfg.ignore_index
    bad_n = valid_n & ((t_n < 0) | (t_n >= vocab))
    n_valid, n_bad = torch.stack((valid_n.sum(), bad_n.sum())).tolist()
    if n_bad:
        raise ValueError(f"{_OP}: {n_bad} target(s) outside [0, {vocab}) and not ignore_index={cfg.ignore_index}, "
                         f"e.g. {int(t_n[bad_n][0])}")
    norm = 1.0 / max(n_valid, 1) if reduction == "mean" else 1.0
    return h_nh, t_n, torch.promote_types(hidden.dtype, torch.float32), norm


def _finish(grads, weight, bias):
    grad_h, grad_w, grad_b = grads
    if grad_w is not None and grad_w.dtype != weight.dtype:
        grad_w = grad_w.to(weight.dtype)
    if grad_b is not None and grad_b.dtype != bias.dtype:
        grad_b = grad_b.to(bias.dtype)
    return grad_h, grad_w, grad_b


class _GradInForwardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, cfg, reduction):
        h_nh, t_n, wide, norm = _prepare(hidden, weight, target, cfg, reduction)
        n = h_nh.shape[0]
        loss_n = torch.empty(n, dtype=wide, device=hidden.device)
        lse_n = torch.empty_like(loss_n)
        scale = torch.full((1,), norm, dtype=wide, device=hidden.device)
        need = tuple(ctx.needs_input_grad[:3])
        grads = _finish(sweep(h_nh, weight, bias, t_n, cfg, scale_n=scale, lse_n=lse_n, loss_n=loss_n, need=need),
                        weight, bias)
        ctx.save_for_backward(*grads)
        ctx.hidden_shape = hidden.shape
        ctx.used = False
        return loss_n.sum() * norm

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.used:
            raise RuntimeError(f"{_OP}: backward through the same loss twice is not supported in grad-in-forward "
                               "mode (the gradients were computed in the forward and scaled in place); pass "
                               "grad_in_forward=False to recompute instead")
        ctx.used = True
        g = float(grad_loss)  # one host sync; exact scaling (a bf16-rounded factor would bias the gradients)
        grad_h, grad_w, grad_b = (t.mul_(g) if t is not None and g != 1.0 else t for t in ctx.saved_tensors)
        if grad_h is not None:
            grad_h = grad_h.view(ctx.hidden_shape)
        return grad_h, grad_w, grad_b, None, None, None


class _RecomputeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, cfg, reduction):
        h_nh, t_n, wide, norm = _prepare(hidden, weight, target, cfg, reduction)
        loss_n = torch.empty(h_nh.shape[0], dtype=wide, device=hidden.device)
        lse_n = torch.empty_like(loss_n)
        sweep(h_nh, weight, bias, t_n, cfg, lse_n=lse_n, loss_n=loss_n)
        ctx.save_for_backward(hidden, weight, bias, target, lse_n)
        ctx.cfg, ctx.reduction, ctx.norm = cfg, reduction, norm
        return loss_n.view(target.shape) if reduction == "none" else loss_n.sum() * norm

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, target, lse_n = ctx.saved_tensors
        if ctx.reduction == "none":
            scale_n = grad_out.reshape(-1).to(lse_n.dtype).contiguous()
        else:
            scale_n = (grad_out.to(lse_n.dtype) * ctx.norm).reshape(1)
        need = tuple(ctx.needs_input_grad[:3])
        grads = sweep(as_rows(hidden), weight, bias, target.reshape(-1), ctx.cfg, scale_n=scale_n, lse_n=lse_n,
                      need=need)
        grad_h, grad_w, grad_b = _finish(grads, weight, bias)
        if grad_h is not None:
            grad_h = grad_h.view(hidden.shape)
        return grad_h, grad_w, grad_b, None, None, None


def _check(hidden, weight, bias, target, label_smoothing, z_loss, reduction, chunk_tokens, grad_weight_dtype):
    if weight.dim() != 2 or hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{_OP}: need hidden (..., h) and weight (vocab, h), got hidden {tuple(hidden.shape)} and "
                         f"weight {tuple(weight.shape)}")
    if target.shape != hidden.shape[:-1] or target.dtype.is_floating_point or target.dtype == torch.bool:
        raise ValueError(f"{_OP}: target must be integer with shape {tuple(hidden.shape[:-1])}, got "
                         f"{tuple(target.shape)} {target.dtype}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"{_OP}: hidden and weight dtypes differ: {hidden.dtype} vs {weight.dtype}")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype):
        raise ValueError(f"{_OP}: bias must be ({weight.shape[0]},) {weight.dtype}, got {tuple(bias.shape)} "
                         f"{bias.dtype}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{_OP}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if z_loss < 0.0:
        raise ValueError(f"{_OP}: z_loss must be >= 0, got {z_loss}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{_OP}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"{_OP}: chunk_tokens must be >= 1, got {chunk_tokens}")
    if grad_weight_dtype not in (None, weight.dtype, torch.float32):
        raise ValueError(f"{_OP}: grad_weight_dtype must be None, the weight's dtype ({weight.dtype}) or "
                         f"torch.float32, got {grad_weight_dtype}")


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    reduction: Literal["mean", "sum", "none"] = "mean",
    chunk_tokens: int | None = None,
    *,
    bias: torch.Tensor | None = None,
    grad_in_forward: bool | None = None,
    grad_weight_dtype: torch.dtype | None = None,
    backend: FusedBackend | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``target``, chunked over tokens (the LM head + loss).

    Per non-ignored token, with logits ``x`` (vocab ``V``) and ``lse = logsumexp(x)``::

        loss = (1 - eps) * (lse - x[target]) + eps * (lse - mean(x)) + z_loss * lse**2

    label smoothing ``eps`` as ``torch.nn.functional.cross_entropy``, z-loss as
    PaLM (arXiv 2204.02311). ``"mean"`` divides by the number of non-ignored
    tokens (by 1 if there are none: loss 0, zero gradients, where PyTorch gives
    NaN); ``"none"`` returns the per-token losses (0 on ignored tokens). Memory is
    ``O(chunk_tokens * V)`` rather than ``O(tokens * V)``. By default the
    gradients are computed in the forward (3 GEMMs, as eager) when one is needed
    and the reduction is a scalar; otherwise the backward recomputes the logits
    (see the module docstring). The softmax / CE-gradient step runs as a Triton
    kernel on CUDA, in torch otherwise (still chunked).

    Args:
        hidden: ``(..., h)`` final hidden states (float32 / bf16 / fp16 / float64, same dtype as ``weight``).
        weight: ``(V, h)`` LM head (untied or tied embedding).
        target: ``hidden.shape[:-1]`` integer labels, already shifted for next-token prediction.
        ignore_index: label that contributes nothing (padding, prompt tokens).
        label_smoothing: ``eps`` in ``[0, 1]``.
        z_loss: coefficient of ``lse**2`` (PaLM uses 1e-4), ``>= 0``.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        chunk_tokens: tokens per chunk; default: float32 chunk logits <= 512 MiB and <= a quarter of the
            tokens (1,024 at vocab 128,256 and 8,192 tokens).
        bias: optional ``(V,)`` output bias, same dtype as ``weight``.
        grad_in_forward: ``None`` (auto: grad-in-forward for a scalar reduction unless ``hidden`` is fp16),
            ``True`` (needs a scalar reduction), ``False`` (recompute).
        grad_weight_dtype: accumulator of ``grad_weight`` across chunks: ``None`` (the weight's dtype) or
            ``torch.float32`` (more accurate, ``4 * V * h`` bytes); the gradient is returned in the weight's dtype.
        backend: ``"triton"`` / ``"reference"`` for the per-chunk step; default picks (see ``kernel_backend``).

    Returns:
        The loss in float32 (float64 for float64 inputs): a scalar, or ``target.shape`` for ``"none"``.
        In grad-in-forward mode, backward through it once (a second backward raises ``RuntimeError``).

    Raises:
        ValueError: shapes or dtypes that do not fit, an option out of range, ``grad_in_forward=True`` with
            ``reduction="none"``, or a target outside ``[0, V)`` that is not ``ignore_index``.

    Example:
        >>> hidden, weight = torch.randn(2, 5, 16, requires_grad=True), torch.randn(100, 16)
        >>> target = torch.randint(0, 100, (2, 5))
        >>> loss = fused_linear_cross_entropy(hidden, weight, target, chunk_tokens=4)
        >>> loss.backward(); hidden.grad.shape
        torch.Size([2, 5, 16])
    """
    _check(hidden, weight, bias, target, label_smoothing, z_loss, reduction, chunk_tokens, grad_weight_dtype)
    if grad_in_forward and reduction == "none":
        raise ValueError(f"{_OP}: grad_in_forward=True needs reduction 'mean' or 'sum' (a per-token grad_output "
                         "must weight grad_weight before the sum over tokens), got reduction='none'")
    use_triton = resolve_backend(_OP, backend, hidden, weight, target, bias) == "triton"
    n = max(1, hidden.numel() // max(1, hidden.shape[-1]))
    cfg = SweepConfig(
        ignore_index=int(ignore_index), label_smoothing=float(label_smoothing), z_loss=float(z_loss),
        chunk=int(chunk_tokens or default_chunk(n, weight.shape[0])), use_triton=use_triton,
        grad_weight_dtype=grad_weight_dtype or weight.dtype,
    )
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if grad_in_forward is None:  # fp16: see the module docstring (loss scaling comes after the rounding)
        grad_in_forward = reduction != "none" and hidden.dtype != torch.float16
    fn = _GradInForwardFn if grad_in_forward and wants_grad else _RecomputeFn
    return fn.apply(hidden, weight, bias, target, cfg, reduction)
