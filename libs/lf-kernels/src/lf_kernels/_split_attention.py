"""Block-causal attention as two causal attention calls merged by log-sum-exp (no masked FLOPs).

The ``block_causal`` mask with frames of ``F`` tokens (key ``j`` visible to query
``i`` iff ``j // F <= i // F``) is the disjoint union of

1. the causal mask over the whole sequence (``j <= i``), and
2. the strict upper triangle inside each frame (same frame, ``j > i``).

Part 1 is one causal cuDNN call over the whole sequence. For part 2 the tokens of
each frame are put in reverse order, which turns ``j > i`` into ``j' < i'``:
queries at frame positions ``0 .. F-2`` against keys at ``1 .. F-1``, both
reversed, is ordinary causal attention on ``(batch * frames, heads, F - 1, d)``
(one batched call; the last token of a frame has no part-2 keys). A last partial
frame of ``r = seq % F`` tokens is a second, small call of the same form. The two
results merge exactly by their log-sum-exp (Milakov & Gimelshein 2018):
``L = logaddexp(L1, L2)``, ``O = exp(L1 - L) O1 + exp(L2 - L) O2`` (float32).

Backward: the FlashAttention backward (Dao 2023, alg. 2) needs only ``P = exp(S -
L)`` and ``D = rowsum(dO * O)``; called for each part with the *merged* ``O`` and
``L`` and the full ``dO`` it gives that part's exact share of ``dq, dk, dv``
(as ring attention and PyTorch's context-parallel backward do); part 2's share is
mapped back through the reversal and summed. A gradient ``g`` on the returned
log-sum-exp adds ``g_i P_ij`` to ``dS``; it is obtained from the same backward run
once more with constant values ``v' = e_0``, ``dO' = g e_0`` and ``O' = 0``
(``dP' = g``, ``D' = 0``), so that path costs a second backward (only when the
lse gets a gradient).

Kernels are a pluggable pair (:class:`CausalKernels`): on CUDA the private ops
``aten._scaled_dot_product_cudnn_attention`` / ``..._backward`` (flash variants
where cuDNN fails), on the CPU a plain float32/float64 math pair, so the whole
decomposition is tested on the CPU against the float64 reference.

Legend: ``b`` batch, ``h`` heads (k/v expanded to the query heads), ``n`` frames,
``m`` tokens per call row, ``s`` sequence, ``d`` head dim; ``*_calls`` tensors are
``(b * n, h, m, ...)``, frame views ``(b, h, n, m, ...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from ._split_kernels import cuda_kernels, kernels_support, math_kernels

__all__ = ["CausalKernels", "attention_split", "default_kernels", "kernels_support", "math_kernels"]


class CausalKernels(NamedTuple):
    """An attention kernel pair on ``(batch, heads, seq, head_dim)`` tensors (equal heads; causal or full).

    ``forward(q, k, v, causal, scale) -> (out in q.dtype, lse (b, h, s) float32 | float64)``, natural log;
    ``backward(dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)``, the FlashAttention backward given
    the (possibly merged) ``out`` and ``lse``.
    """

    forward: Callable
    backward: Callable


def default_kernels(device: torch.device | str) -> CausalKernels:
    """The cuDNN / flash pair on CUDA, the math pair elsewhere (exported as ``lf_kernels.attention_kernels``).

    Used by ``sdpa_split`` here and by lf-parallel's ring attention, whose blocks merge by log-sum-exp and
    whose backward hands each block the merged ``out`` / ``lse``. Check :func:`kernels_support` first.
    """
    pair = cuda_kernels() if torch.device(device).type == "cuda" else math_kernels()
    return CausalKernels(*pair)


def _segments(seq: int, frame_tokens: int) -> list[tuple[int, int, int]]:
    """``(start, frames, frame_len)`` runs of equal frames that have part-2 work (frame_len >= 2)."""
    full, tail = divmod(seq, frame_tokens)
    runs = [(0, full, frame_tokens), (full * frame_tokens, 1, tail)]
    return [(start, n, f) for start, n, f in runs if n >= 1 and f >= 2]


def _frames(x: torch.Tensor, start: int, n: int, f: int) -> torch.Tensor:
    """View ``(b, h, n, f, ...)`` of ``x[:, :, start : start + n * f]``."""
    return x[:, :, start:start + n * f].unflatten(2, (n, f))


def _to_calls(x_frames: torch.Tensor) -> torch.Tensor:
    """``(b, h, n, m, ...)`` -> reversed within each frame, ``(b * n, h, m, ...)`` contiguous."""
    return x_frames.transpose(1, 2).flip(3).flatten(0, 1).contiguous()


def _from_calls(x_calls: torch.Tensor, batch: int) -> torch.Tensor:
    """Inverse of :func:`_to_calls`: ``(b * n, h, m, ...)`` -> ``(b, h, n, m, ...)`` in frame order."""
    return x_calls.unflatten(0, (batch, -1)).flip(3).transpose(1, 2)


def _queries(x: torch.Tensor, seg) -> torch.Tensor:
    """Part-2 query rows (frame positions ``0 .. f-2``, reversed) as a call batch."""
    start, n, f = seg
    return _to_calls(_frames(x, start, n, f).narrow(3, 0, f - 1))


def _keys(x: torch.Tensor, seg) -> torch.Tensor:
    """Part-2 key rows (frame positions ``1 .. f-1``, reversed) as a call batch."""
    start, n, f = seg
    return _to_calls(_frames(x, start, n, f).narrow(3, 1, f - 1))


def _forward(q, k, v, frame_tokens: int, scale: float, kernels: CausalKernels):
    """Merged ``(out in q.dtype, lse)``; q, k, v with equal heads."""
    acc = torch.promote_types(q.dtype, torch.float32)
    out1, lse1 = kernels.forward(q, k, v, True, scale)
    out = out1.to(acc, copy=True)
    lse = lse1.to(acc, copy=True)
    for seg in _segments(q.shape[2], frame_tokens):
        start, n, f = seg
        out2, lse2 = kernels.forward(_queries(q, seg), _keys(k, seg), _keys(v, seg), True, scale)
        out_view = _frames(out, start, n, f).narrow(3, 0, f - 1)
        lse_view = _frames(lse, start, n, f).narrow(3, 0, f - 1)
        lse2 = _from_calls(lse2, q.shape[0]).to(acc)
        merged = torch.logaddexp(lse_view, lse2)
        out_view.mul_(torch.exp(lse_view - merged)[..., None])
        out_view.add_(torch.exp(lse2 - merged)[..., None] * _from_calls(out2, q.shape[0]).to(acc))
        lse_view.copy_(merged)
    return out.to(q.dtype), lse


def _backward(dout, q, k, v, out, lse, frame_tokens: int, scale: float, kernels: CausalKernels):
    """``(dq, dk, dv)`` of the merged attention (equal heads), each part's backward on the merged out / lse."""
    dq, dk, dv = kernels.backward(dout, q, k, v, out, lse, True, scale)
    for seg in _segments(q.shape[2], frame_tokens):
        start, n, f = seg
        dq2, dk2, dv2 = kernels.backward(
            _queries(dout, seg), _queries(q, seg), _keys(k, seg), _keys(v, seg), _queries(out, seg),
            _queries(lse, seg), True, scale,
        )
        _frames(dq, start, n, f).narrow(3, 0, f - 1).add_(_from_calls(dq2, q.shape[0]))
        _frames(dk, start, n, f).narrow(3, 1, f - 1).add_(_from_calls(dk2, q.shape[0]))
        _frames(dv, start, n, f).narrow(3, 1, f - 1).add_(_from_calls(dv2, q.shape[0]))
    return dq, dk, dv


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    return (t.repeat_interleave(group, dim=1) if group > 1 else t).contiguous()


def _fold(grad: torch.Tensor, group: int) -> torch.Tensor:
    """Sum the gradients of ``repeat_interleave``-expanded heads back to the kv heads."""
    return grad.unflatten(1, (-1, group)).sum(2) if group > 1 else grad


class _SplitBlockCausal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, frame_tokens, scale, kernels):
        group = q.shape[1] // k.shape[1]
        q = q.contiguous()
        out, lse = _forward(q, _expand(k, group), _expand(v, group), frame_tokens, scale, kernels)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (frame_tokens, scale, kernels, group)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        frame_tokens, scale, kernels, group = ctx.args
        k_e, v_e = _expand(k, group), _expand(v, group)
        dq = torch.zeros_like(q)
        dk_e, dv_e = torch.zeros_like(k_e), torch.zeros_like(v_e)
        if dout is not None:
            grads = _backward(dout.contiguous(), q, k_e, v_e, out, lse, frame_tokens, scale, kernels)
            dq, dk_e, dv_e = grads
        if dlse is not None:
            # d lse_i / d s_ij = P_ij: the backward with dP' = dlse (rows) and D' = 0 (module docstring).
            v_const = torch.zeros_like(v_e)
            v_const[..., 0] = 1
            dout_const = torch.zeros_like(out)
            dout_const[..., 0] = dlse.to(out.dtype)
            dq_l, dk_l, _ = _backward(dout_const, q, k_e, v_const, torch.zeros_like(out), lse, frame_tokens,
                                      scale, kernels)
            dq, dk_e = dq + dq_l, dk_e + dk_l
        return dq, _fold(dk_e, group), _fold(dv_e, group), None, None, None


def attention_split(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    frame_tokens: int,
    *,
    scale: float | None = None,
    kernels: CausalKernels | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-causal attention (``q_len == kv_len``, no padding) from two causal kernel calls, with autograd.

    Exact decomposition described in the module docstring; query head ``h`` uses kv head
    ``h // (heads_q // heads_kv)`` (k / v are expanded with ``repeat_interleave`` for the
    kernel calls and their gradients summed back).

    Args:
        q: ``(batch, heads_q, seq, head_dim)``.
        k, v: ``(batch, heads_kv, seq, head_dim)``, same dtype and device as ``q``.
        frame_tokens: tokens per frame (>= 1); a last partial frame is allowed.
        scale: score scale, default ``1 / sqrt(head_dim)``.
        kernels: the causal kernel pair, default :func:`default_kernels` of ``q.device``.

    Returns:
        ``(out, lse)``: ``out`` ``(batch, heads_q, seq, head_dim)`` in ``q.dtype``; ``lse``
        ``(batch, heads_q, seq)`` float32 (float64 for float64 inputs), natural log of the
        softmax denominator. Both are differentiable.

    Raises:
        ValueError: ``q`` / ``k`` / ``v`` not 4-D or with different sequence lengths,
            ``heads_q % heads_kv != 0``, or ``frame_tokens < 1`` (names the values).

    Example:
        >>> q = torch.randn(1, 4, 10, 16, dtype=torch.float64)
        >>> k = v = torch.randn(1, 2, 10, 16, dtype=torch.float64)
        >>> out, lse = attention_split(q, k, v, 4)
        >>> out.shape, lse.shape
        (torch.Size([1, 4, 10, 16]), torch.Size([1, 4, 10]))
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention_split: q, k, v must be 4-D, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not (q.shape[2] == k.shape[2] == v.shape[2]):
        raise ValueError(f"attention_split needs q_len == kv_len, got q_len={q.shape[2]}, kv_len={k.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"attention_split: heads_q must be a multiple of heads_kv, got heads_q={q.shape[1]}, "
                         f"heads_kv={k.shape[1]}")
    if not isinstance(frame_tokens, int) or frame_tokens < 1:
        raise ValueError(f"attention_split: frame_tokens must be an int >= 1, got {frame_tokens!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if kernels is None:
        kernels = default_kernels(q.device)
    return _SplitBlockCausal.apply(q, k, v, frame_tokens, scale, kernels)
