"""Plain-PyTorch attention reference (the oracle for every other path).

Written for clarity, not speed: materializes the full score matrix in the input
dtype. Tests run it in float64.

Legend: ``b`` batch, ``h`` heads, ``q`` query positions, ``k`` key positions,
``d`` head dim.
"""

from __future__ import annotations

import math

import torch

from ._mask import MaskSpec, dense_mask

__all__ = ["attention_reference", "check_qkv"]


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    """Validate q/k/v layouts; returns ``(heads_q, heads_kv)``.

    Raises:
        ValueError: wrong ranks, mismatched batch/seq/head_dim, an empty key
            sequence, or ``heads_q`` not a multiple of ``heads_kv``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(
                f"{name} must have shape (batch, heads, seq, head_dim), got {tuple(t.shape)}"
            )
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree on (batch, heads_kv, seq_kv), got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k head_dim differ: {q.shape[3]} vs {k.shape[3]}")
    if k.shape[2] == 0:
        raise ValueError("seq_kv must be >= 1, got 0")
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(
            f"heads_q must be a multiple of heads_kv (GQA), got heads_q={heads_q}, heads_kv={heads_kv}"
        )
    return heads_q, heads_kv


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec,
    *,
    key_padding: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention in plain PyTorch, computed in the input dtype.

    ``out = softmax(scale * q @ k^T + mask) @ v`` (Vaswani et al. 2017), with
    grouped-query attention (Ainslie et al. 2023): query head ``h`` uses kv head
    ``h // (heads_q // heads_kv)``.

    Args:
        q: ``(batch, heads_q, seq_q, head_dim)``.
        k: ``(batch, heads_kv, seq_kv, head_dim)``.
        v: ``(batch, heads_kv, seq_kv, head_dim_v)``.
        mask: which keys each query may see (see :class:`MaskSpec`).
        key_padding: optional ``(batch, seq_kv)`` bool, ``True`` = real token.
        document_ids: optional ``(batch, seq_kv)`` int; attend only within the same id.
        scale: score scale, default ``1 / sqrt(head_dim)``.

    Returns:
        ``(out, lse)``: ``out`` ``(batch, heads_q, seq_q, head_dim_v)`` and
        ``lse`` ``(batch, heads_q, seq_q)``, both in the input dtype. ``lse`` is
        the natural log of the softmax denominator of the scaled scores. Rows
        with no allowed key give ``out = 0`` and ``lse = -inf`` (finite grads).

    Raises:
        ValueError: bad shapes or GQA ratio (see :func:`attention`).

    Example:
        >>> q = k = v = torch.randn(1, 2, 3, 4, dtype=torch.float64)
        >>> out, lse = attention_reference(q, k, v, MaskSpec("causal"))
        >>> out.shape, lse.shape
        (torch.Size([1, 2, 3, 4]), torch.Size([1, 2, 3]))
    """
    heads_q, heads_kv = check_qkv(q, k, v)
    group = heads_q // heads_kv
    k_bhkd = k.repeat_interleave(group, dim=1)
    v_bhkd = v.repeat_interleave(group, dim=1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    allowed_bhqk = dense_mask(
        mask, q.shape[2], k.shape[2], key_padding=key_padding, document_ids=document_ids, device=q.device
    )
    row_any_bhq1 = allowed_bhqk.any(dim=-1, keepdim=True)
    # Rows with no allowed key are un-masked before the softmax (so it never sees
    # an all -inf row, whose NaN would leak into backward) and zeroed after.
    scores_bhqk = (q @ k_bhkd.transpose(-1, -2)) * scale
    scores_bhqk = scores_bhqk.masked_fill(~(allowed_bhqk | ~row_any_bhq1), float("-inf"))
    probs_bhqk = torch.softmax(scores_bhqk, dim=-1) * row_any_bhq1.to(q.dtype)
    out = probs_bhqk @ v_bhkd
    lse_bhq = torch.logsumexp(scores_bhqk, dim=-1)
    lse_bhq = torch.where(row_any_bhq1[..., 0], lse_bhq, torch.full_like(lse_bhq, float("-inf")))
    return out, lse_bhq
