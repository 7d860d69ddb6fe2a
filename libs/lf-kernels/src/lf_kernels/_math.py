"""Explicit softmax attention with float32 (or float64) accumulation; returns the log-sum-exp.

The portable path for everything SDPA cannot do (the log-sum-exp that context
parallelism merges partial results with) on any device, with plain autograd.
It materializes ``(batch, heads, q_chunk, seq_kv)`` scores; when the whole
score matrix would exceed :data:`MAX_SCORE_BYTES`, queries are processed in
chunks, each under activation checkpointing so that backward also holds one
chunk's scores at a time.

Legend: ``b`` batch, ``h`` kv heads, ``g`` query heads per kv head, ``q`` query
positions, ``k`` key positions, ``d`` head dim.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["MAX_SCORE_BYTES", "attention_math"]

MAX_SCORE_BYTES = 1 << 30
"""Score bytes per chunk above which queries are chunked (1 GiB)."""


def _math_block(q, k, v, allowed_bhqk, scale):
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
    lse = torch.where(has_key, torch.log(denom_safe) + row_max, torch.full_like(denom, float("-inf")))
    out = out.reshape(batch, heads_q, seq_q, v.shape[-1]).to(q.dtype)
    return out, lse.reshape(batch, heads_q, seq_q)


def attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed_bhqk: torch.Tensor,
    scale: float,
    *,
    max_score_bytes: int = MAX_SCORE_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out (b, h_q, q, d_v) in q.dtype, lse (b, h_q, q) float32 | float64)``; query-chunked past the budget.

    ``allowed_bhqk`` is the dense bool mask ``(b|1, 1, seq_q, seq_kv)``.
    """
    batch, heads_q, seq_q, _ = q.shape
    acc_bytes = torch.promote_types(q.dtype, torch.float32).itemsize
    row_bytes = batch * heads_q * k.shape[2] * acc_bytes
    rows = max(1, max_score_bytes // max(row_bytes, 1))
    if rows >= seq_q:
        return _math_block(q, k, v, allowed_bhqk, scale)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs, lses = [], []
    for start in range(0, seq_q, rows):
        q_chunk = q[:, :, start:start + rows]
        mask_chunk = allowed_bhqk[:, :, start:start + rows]
        if needs_grad:
            out, lse = checkpoint(_math_block, q_chunk, k, v, mask_chunk, scale, use_reentrant=False)
        else:
            out, lse = _math_block(q_chunk, k, v, mask_chunk, scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)
