"""The attention entry point: one call, a mask description, the right backend.

:func:`~lf_kernels._dispatch.choose_backend` names the backend from the call's
static facts (its module docstring holds the order); this module runs it:

- ``"sdpa"`` / ``"sdpa_causal"``: SDPA with no mask tensor (``is_causal`` for
  causal), so CUDA may take its cuDNN or flash kernel.
- ``"sdpa_split"`` (CUDA, ``block_causal``, fp16 / bf16): a causal cuDNN call over the sequence plus
  one batched causal call on the frame-reversed in-frame upper triangles, merged by log-sum-exp, see
  :mod:`lf_kernels._split_attention`; falls back to the next backend for head dims its kernels do
  not take (not a multiple of 8, above 256, or v's differing from q's).
- ``"sdpa_frames"`` (CUDA without FlexAttention, ``block_causal``): frame ``f``'s queries attend to
  keys ``[0, end of frame f)`` with no mask, so one mask-free SDPA call per frame
  computes the block-causal result exactly and spends no FLOPs on masked tiles.
- ``"flash_varlen"`` (CUDA, packed documents, ``flash_attn`` installed or torch's ``varlen_attn``): see
  :mod:`lf_kernels._varlen`; falls back to the next backend when document ids
  are not contiguous runs or the head dim is not a multiple of 8 up to 256 (FlashAttention-2's limits).
- ``"flex_tiles"`` (CUDA, ``window_3d``): FlexAttention on tokens reordered into 128-token boxes, see
  :mod:`lf_kernels._window_tiles`; also gives the log-sum-exp.
- ``"flex"`` (CUDA): compiled FlexAttention on a block mask, see
  :mod:`lf_kernels._flex`; also gives the log-sum-exp.
- ``"sdpa_mask"``: SDPA with the dense bool mask (fused CPU kernel; CUDA's
  memory-efficient kernel), the CPU path for every mask without the lse.
- ``"math"``: explicit float32-accumulating softmax with the lse, query-chunked
  for long sequences, see :mod:`lf_kernels._math`.

GQA: the mask-free SDPA paths pass ``enable_gqa=True`` (no copy of k/v) on
CPU and for fp16 / bf16 inputs on CUDA, where SDPA's flash and cuDNN kernels
take it; elsewhere (fp32 on CUDA) and on the dense-mask path k/v heads are
expanded with ``repeat_interleave``, because CUDA's memory-efficient kernel
does not support ``enable_gqa`` (checked on an H200 with torch 2.11: "No
available kernel"). FlexAttention and flash_attn take GQA natively.

Fully masked query rows (every key padded, ``q_len > kv_len`` with a causal
mask): the dense-mask path un-masks such rows before SDPA and multiplies their
output by zero afterwards, so no kernel ever sees an all ``-inf`` row. This is
needed: on an H200 (torch 2.11) SDPA's cuDNN backend returns non-zero rows and
NaN gradients for fully masked rows, while the CPU, math and memory-efficient
kernels return zeros.

Legend: ``b`` batch, ``h`` heads, ``q`` query positions, ``k`` key positions, ``d`` head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._dispatch import Backend, canonical_mask, choose_backend, select_backend
from ._mask import MaskSpec, check_mask_inputs, dense_mask
from ._math import attention_math
from ._reference import check_qkv

__all__ = ["Backend", "attention", "choose_backend", "select_backend"]

# Mask-free half-precision SDPA on CUDA: cuDNN first (H200, torch 2.11, causal S=8192
# 32x128 fwd+bwd: cuDNN ~500-546 TFLOP/s vs flash 281), then the others.
_CUDA_PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.MATH]


def _sdpa_plain(q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
    heads_q, heads_kv = q.shape[1], k.shape[1]
    native_gqa_ok = q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16)
    if heads_q != heads_kv and not native_gqa_ok:
        k = k.repeat_interleave(heads_q // heads_kv, dim=1)
        v = v.repeat_interleave(heads_q // heads_kv, dim=1)
    if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
        with sdpa_kernel(_CUDA_PRIORITY, set_priority=True):
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
            )
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def _sdpa_frames(q, k, v, frame_tokens: int, scale: float) -> torch.Tensor:
    """Block-causal attention as one mask-free SDPA call per frame (q_len == kv_len)."""
    seq = q.shape[2]
    outs = []
    for start in range(0, seq, frame_tokens):
        stop = min(start + frame_tokens, seq)
        outs.append(_sdpa_plain(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], causal=False, scale=scale))
    return torch.cat(outs, dim=2)


def _sdpa_mask(q, k, v, allowed_bhqk: torch.Tensor, scale: float) -> torch.Tensor:
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        k = k.repeat_interleave(heads_q // heads_kv, dim=1)
        v = v.repeat_interleave(heads_q // heads_kv, dim=1)
    # Un-mask empty rows, zero them afterwards (module docstring).
    row_any_bhq1 = allowed_bhqk.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_bhqk | ~row_any_bhq1, scale=scale)
    return out * row_any_bhq1.to(out.dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec,
    *,
    key_padding: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with a mask description, packed documents and GQA.

    ``out = softmax(scale * q @ k^T, masked) @ v`` (Vaswani et al. 2017);
    grouped-query attention (Ainslie et al. 2023): query head ``h`` uses kv head
    ``h // (heads_q // heads_kv)`` (the ``repeat_interleave`` convention of HF
    ``transformers``). The backend per case: :func:`choose_backend`.

    Args:
        q: ``(batch, heads_q, seq_q, head_dim)``, any float dtype.
        k: ``(batch, heads_kv, seq_kv, head_dim)``, same dtype as ``q``.
        v: ``(batch, heads_kv, seq_kv, head_dim_v)``, same dtype as ``q``.
        mask: which keys each query may see; with ``seq_q != seq_kv`` the
            queries are the last ``seq_q`` positions (see :func:`dense_mask`).
        key_padding: optional ``(batch, seq_kv)`` bool, ``True`` = real token.
        document_ids: optional ``(batch, seq_kv)`` int, packed documents: attend
            only within the same id (combined with ``mask``); needs ``seq_q <= seq_kv``.
        scale: score scale, default ``1 / sqrt(head_dim)``.
        return_lse: also return the log-sum-exp.

    Returns:
        ``out`` ``(batch, heads_q, seq_q, head_dim_v)`` in ``q.dtype``; with
        ``return_lse=True`` the pair ``(out, lse)``, ``lse``
        ``(batch, heads_q, seq_q)`` float32 (float64 for float64 inputs), the
        natural log of the softmax denominator of the scaled scores. Query rows
        with no allowed key give ``out = 0`` and ``lse = -inf``, never NaN,
        forward and backward.

    Raises:
        ValueError: ranks other than 4, mismatched batch / seq_kv / head_dim,
            ``seq_kv == 0``, ``heads_q % heads_kv != 0`` (names both numbers),
            bad ``key_padding`` / ``document_ids`` shape or dtype, a
            ``window_3d`` grid that does not hold ``seq_kv`` tokens.
        TypeError: ``mask`` is not a :class:`MaskSpec`.

    Example:
        >>> q = torch.randn(2, 8, 16, 64)
        >>> k = v = torch.randn(2, 2, 16, 64)
        >>> attention(q, k, v, MaskSpec("block_causal", frame_tokens=4)).shape
        torch.Size([2, 8, 16, 64])
    """
    if not isinstance(mask, MaskSpec):
        raise TypeError(f"mask must be a MaskSpec, got {type(mask).__name__}")
    check_qkv(q, k, v)
    seq_q, seq_kv = q.shape[2], k.shape[2]
    check_mask_inputs(mask, seq_q, seq_kv, key_padding, document_ids)
    for name, extra in (("key_padding", key_padding), ("document_ids", document_ids)):
        if extra is not None and extra.shape[0] != q.shape[0]:
            raise ValueError(f"{name} batch {extra.shape[0]} differs from q batch {q.shape[0]}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    facts = {
        "device": q.device, "dtype": q.dtype, "has_key_padding": key_padding is not None,
        "has_documents": document_ids is not None, "return_lse": return_lse,
    }
    backend: Backend = choose_backend(mask, seq_q, seq_kv, **facts)
    spec = canonical_mask(mask, seq_q, seq_kv)
    if backend == "flash_varlen":
        from ._varlen import attention_flash_varlen, document_segments_cached

        head_dims_ok = all(d % 8 == 0 and d <= 256 for d in (q.shape[-1], v.shape[-1]))
        segments = document_segments_cached(document_ids) if head_dims_ok else None
        if segments is not None:
            return attention_flash_varlen(q, k, v, segments, causal=spec.kind == "causal", scale=scale)
        backend = choose_backend(mask, seq_q, seq_kv, flash_attn=False, **facts)
    if backend in ("sdpa", "sdpa_causal"):
        return _sdpa_plain(q, k, v, causal=backend == "sdpa_causal", scale=scale)
    if backend == "sdpa_split":
        from ._split_attention import attention_split, kernels_support

        if kernels_support(q, v):
            out, lse = attention_split(q, k, v, spec.frame_tokens, scale=scale)
            return (out, lse) if return_lse else out
        backend = choose_backend(mask, seq_q, seq_kv, split=False, **facts)
    if backend == "sdpa_frames":
        return _sdpa_frames(q, k, v, spec.frame_tokens, scale)
    if backend == "flex_tiles":
        from ._window_tiles import attention_window_tiles

        out, lse = attention_window_tiles(q, k, v, spec, scale)
        return (out, lse) if return_lse else out
    if backend == "flex":
        from ._flex import attention_flex

        out, lse = attention_flex(q, k, v, spec, scale, key_padding=key_padding, document_ids=document_ids)
        return (out, lse) if return_lse else out
    allowed_bhqk = dense_mask(spec, seq_q, seq_kv, key_padding=key_padding, document_ids=document_ids,
                              device=q.device)
    if backend == "math":
        return attention_math(q, k, v, allowed_bhqk, scale)
    return _sdpa_mask(q, k, v, allowed_bhqk, scale)
