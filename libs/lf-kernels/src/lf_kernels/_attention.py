"""The attention entry point: one call, a mask description, the right backend.

Backends, chosen per call by :func:`select_backend` (all work on CPU and
CUDA, forward and backward):

- ``return_lse=True`` (any mask) -> ``"math"``: SDPA does not return the
  log-sum-exp, which ring / context-parallel attention needs to merge partial
  results. Explicit softmax with float32 accumulation (float64 for float64
  inputs) and plain autograd; materializes the score matrix.
- ``full`` without ``key_padding`` -> ``"sdpa"``: no mask tensor at all, so
  SDPA may pick its flash kernel.
- ``causal``, ``q_len == kv_len``, no ``key_padding`` -> ``"sdpa_causal"``:
  ``is_causal=True``, flash kernel, no mask tensor.
- ``causal`` with ``q_len != kv_len`` -> ``"sdpa_mask"``: SDPA's
  ``is_causal`` aligns the top-left corner, we align the end (decoding), so we
  pass the dense bool mask.
- ``prefix_lm``, or any mask with ``key_padding`` -> ``"sdpa_mask"``: SDPA has
  no such mask kind; the dense bool mask is the portable form (memory-efficient
  kernel on CUDA, fused CPU kernel on CPU). FlexAttention would avoid the dense
  mask but has no CPU backward in torch 2.11-2.13 (DESIGN.md).

GQA: the mask-free SDPA paths pass ``enable_gqa=True`` (no copy of k/v) on
CPU and for fp16 / bf16 inputs on CUDA, where SDPA's flash and cuDNN kernels
take it; elsewhere (fp32 on CUDA) and on the dense-mask path k/v heads are
expanded with ``repeat_interleave``, because CUDA's memory-efficient kernel
does not support ``enable_gqa`` (checked on an H200 with torch 2.11: "No
available kernel") and SDPA would otherwise fall back to its unfused math
kernel. The math path reshapes q to ``(batch, heads_kv, group, seq_q,
head_dim)`` and broadcasts, no copy.

Fully masked query rows (every key padded, or ``q_len > kv_len`` with a
causal mask): the dense-mask path un-masks such rows before SDPA and multiplies
their output by zero afterwards, so no kernel ever sees an all ``-inf`` row.
This is needed: on an H200 (torch 2.11) SDPA's cuDNN backend returns non-zero
rows and NaN gradients for fully masked rows, while the CPU, math and
memory-efficient kernels return zeros.

Legend: ``b`` batch, ``h`` heads, ``g`` query heads per kv head, ``q`` query
positions, ``k`` key positions, ``d`` head dim.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from ._mask import MaskSpec, dense_mask
from ._reference import check_qkv

__all__ = ["Backend", "attention", "select_backend"]

Backend = Literal["sdpa", "sdpa_causal", "sdpa_mask", "math"]


def select_backend(
    mask: MaskSpec, q_len: int, kv_len: int, *, has_key_padding: bool, return_lse: bool
) -> Backend:
    """Name the backend :func:`attention` takes for this case (see module docstring)."""
    if return_lse:
        return "math"
    if not has_key_padding and mask.kind == "full":
        return "sdpa"
    if not has_key_padding and mask.kind == "causal" and q_len == kv_len:
        return "sdpa_causal"
    return "sdpa_mask"


def _attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed_bhqk: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit softmax attention with fp32 (or fp64) accumulation; returns (out, lse)."""
    batch, heads_q, seq_q, head_dim = q.shape
    heads_kv = k.shape[1]
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    q_bhgqd = q.to(acc_dtype).reshape(batch, heads_kv, heads_q // heads_kv, seq_q, head_dim)
    k_bh1kd = k.to(acc_dtype)[:, :, None]
    v_bh1kd = v.to(acc_dtype)[:, :, None]
    allowed_bhgqk = allowed_bhqk[:, :, None]  # (b|1, 1, 1, q, k)
    scores = (q_bhgqd @ k_bh1kd.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed_bhgqk, float("-inf"))
    # Row max, detached: out and lse are invariant to it, so no gradient is lost,
    # and amax's tie-splitting backward is avoided. Empty rows use 0.
    row_max = scores.detach().amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    probs_unnorm = torch.exp(scores - row_max)  # exactly 0 where masked
    denom = probs_unnorm.sum(dim=-1, keepdim=True)
    has_key = denom > 0
    denom_safe = torch.where(has_key, denom, torch.ones_like(denom))
    out = (probs_unnorm @ v_bh1kd) / denom_safe
    lse = torch.where(
        has_key, torch.log(denom_safe) + row_max, torch.full_like(denom, float("-inf"))
    )
    out = out.reshape(batch, heads_q, seq_q, v.shape[-1]).to(q.dtype)
    return out, lse.reshape(batch, heads_q, seq_q)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec,
    *,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with a mask description and GQA.

    ``out = softmax(scale * q @ k^T, masked) @ v`` (Vaswani et al. 2017);
    grouped-query attention (Ainslie et al. 2023): query head ``h`` uses kv head
    ``h // (heads_q // heads_kv)`` (the ``repeat_interleave`` convention of HF
    ``transformers``). The backend per case is listed in the module docstring.

    Args:
        q: ``(batch, heads_q, seq_q, head_dim)``, any float dtype.
        k: ``(batch, heads_kv, seq_kv, head_dim)``, same dtype as ``q``.
        v: ``(batch, heads_kv, seq_kv, head_dim_v)``, same dtype as ``q``.
        mask: which keys each query may see; with ``seq_q != seq_kv`` the
            queries are the last ``seq_q`` positions (see :func:`dense_mask`).
        key_padding: optional ``(batch, seq_kv)`` bool, ``True`` = real token.
        scale: score scale, default ``1 / sqrt(head_dim)``.
        return_lse: also return the log-sum-exp (forces the math backend).

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
            bad ``key_padding`` shape or dtype.
        TypeError: ``mask`` is not a :class:`MaskSpec`.

    Example:
        >>> q = torch.randn(2, 8, 16, 64)
        >>> k = v = torch.randn(2, 2, 16, 64)
        >>> attention(q, k, v, MaskSpec("causal")).shape
        torch.Size([2, 8, 16, 64])
    """
    if not isinstance(mask, MaskSpec):
        raise TypeError(f"mask must be a MaskSpec, got {type(mask).__name__}")
    heads_q, heads_kv = check_qkv(q, k, v)
    seq_q, seq_kv = q.shape[2], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    backend = select_backend(
        mask, seq_q, seq_kv, has_key_padding=key_padding is not None, return_lse=return_lse
    )
    if backend != "sdpa" and backend != "sdpa_causal":
        allowed_bhqk = dense_mask(mask, seq_q, seq_kv, key_padding=key_padding, device=q.device)
    if backend == "math":
        return _attention_math(q, k, v, allowed_bhqk, scale)
    # GQA: enable_gqa where SDPA's kernels take it, else expand (module docstring).
    native_gqa_ok = q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16)
    expand_kv = heads_q != heads_kv and (backend == "sdpa_mask" or not native_gqa_ok)
    if expand_kv:
        k = k.repeat_interleave(heads_q // heads_kv, dim=1)
        v = v.repeat_interleave(heads_q // heads_kv, dim=1)
    if backend in ("sdpa", "sdpa_causal"):
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=backend == "sdpa_causal", scale=scale,
            enable_gqa=heads_q != heads_kv and not expand_kv,
        )
    # sdpa_mask: un-mask empty rows, zero them afterwards (module docstring).
    row_any_bhq1 = allowed_bhqk.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_bhqk | ~row_any_bhq1, scale=scale)
    return out * row_any_bhq1.to(out.dtype)
