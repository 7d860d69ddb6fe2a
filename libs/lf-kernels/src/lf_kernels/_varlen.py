"""FlashAttention-2 varlen backend for packed documents (optional ``flash_attn``).

Packed sequences are rows of back-to-back documents; ``flash_attn_varlen_func``
(Dao 2023, arXiv 2307.08691) takes them as one ``(total_tokens, heads, d)``
stream with cumulative boundaries ``cu_seqlens`` and never touches a
cross-document tile. Each *run* of equal ``document_ids`` becomes one segment.
That equals the dense rule (same id may attend) only when every id forms one
contiguous run per row; :func:`document_segments` checks this and returns
``None`` otherwise, and the caller falls back to a general backend.

Legend: ``b`` batch, ``h`` heads, ``s`` positions, ``t`` packed tokens (``b * s``), ``d`` head dim.
"""

from __future__ import annotations

import torch

__all__ = ["attention_flash_varlen", "document_segments"]


def document_segments(document_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """``(cu_seqlens int32 (segments + 1,), max_seqlen)`` of the runs of ``document_ids (b, s)``.

    Runs never cross a row boundary. Returns ``None`` when some id appears in two
    separate runs of one row (then runs and ids disagree). Synchronizes with the device.
    """
    batch, seq = document_ids.shape
    starts_bs = torch.ones_like(document_ids, dtype=torch.bool)
    starts_bs[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    runs = int(starts_bs.sum())
    distinct = sum(int(torch.unique(row).numel()) for row in document_ids)
    if distinct != runs:
        return None
    start_t = torch.nonzero(starts_bs.flatten(), as_tuple=True)[0]
    cu_seqlens = torch.cat([start_t, start_t.new_tensor([batch * seq])]).to(torch.int32)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return cu_seqlens, max_seqlen


def attention_flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: tuple[torch.Tensor, int],
    *,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` over ``segments``; q/k/v ``(b, h, s, d)`` -> out ``(b, h_q, s, d_v)``."""
    from flash_attn import flash_attn_varlen_func

    batch, heads_q, seq, _ = q.shape
    cu_seqlens, max_seqlen = segments

    def packed(x_bhsd: torch.Tensor) -> torch.Tensor:
        return x_bhsd.transpose(1, 2).reshape(batch * seq, x_bhsd.shape[1], x_bhsd.shape[3])

    out_thd = flash_attn_varlen_func(
        packed(q), packed(k), packed(v), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        dropout_p=0.0, softmax_scale=scale, causal=causal,
    )
    return out_thd.reshape(batch, seq, heads_q, v.shape[3]).transpose(1, 2)
