"""Ring attention: q stays, k/v travel around the context-parallel ring, partial results merge by log-sum-exp.

Written here because PyTorch's experimental ``context_parallel`` has no CPU SDPA
handler and takes no masks (DESIGN.md, "Known CPU gaps"). Each rank holds a
sequence shard of q, k and v; in ``cp`` steps every k/v shard visits every rank
(``batch_isend_irecv`` to the next rank, overlapped with the block's compute;
works on gloo and NCCL). Each block ``(local q, visiting k/v)`` is computed by
lf-kernels' float32-accumulating math attention with a dense mask built from the
*global* positions of both shards (:func:`lf_parallel._context.block_mask`), so
every ``MaskSpec`` kind, packed documents and key padding work with any layout,
zigzag included. Blocks are merged online with their log-sum-exp (Liu et al.,
"Ring Attention with Blockwise Transformers", 2023; Milakov & Gimelshein,
"Online normalizer calculation for softmax", 2018).

Backward: an autograd Function with the ring in the backward too (as in
FlashAttention-2 and Ring Attention), rather than all-gathering k/v in the forward
and reduce-scattering their gradients: the all-gather form holds the whole
sequence's k/v on every rank (memory O(seq) instead of O(seq / cp)), and gloo
has no reduce-scatter. In the backward each block is recomputed under autograd and
given the gradients of the merge: with ``w_j = exp(lse_j - lse)``,
``d out_j = w_j dO`` and ``d lse_j = w_j (sum(dO * (out_j - out)) + d lse)``;
the k/v gradients travel around the ring with their k/v and arrive home after
``cp`` hops.

Dense blocks (a ``full`` mask without key padding or documents, e.g. a video DiT's self-attention):
no block mask is built and each block runs on lf-kernels' kernel pair (:func:`lf_kernels.attention_kernels`:
cuDNN / flash SDPA forward with its log-sum-exp on CUDA, the math pair elsewhere). The backward then calls
the pair's backward once per block with the *merged* output and log-sum-exp, which gives that block's exact
dq / dk / dv (FlashAttention-2's backward recomputes ``P = exp(S - lse)`` from the lse it is handed), so no
``(s, s)`` scores are kept or recomputed under autograd. A gradient flowing into the returned lse takes the
general path. At 75,660 tokens per rank (Wan 1.3B, 385 frames 480p, cp=2) the explicit-softmax block would
hold 12 x 75,660^2 float32 scores (275 GB); the kernel pair holds O(s) per block.

Legend: ``b`` batch, ``h`` heads, ``s`` local tokens, ``d`` head dim; ``*_bhsd``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from lf_kernels import MaskSpec
from lf_parallel._context import block_mask, gather_meta

__all__ = ["ring_attention"]


def _attention_block(q, k, v, allowed, scale):
    # lf-kernels' explicit-softmax path: (out in q.dtype, lse float32|float64), takes a dense mask.
    from lf_kernels import attention_math

    return attention_math(q, k, v, allowed, scale)


def _shift(tensors: list[torch.Tensor], group):
    """Start sending ``tensors`` to the next rank of ``group``; returns a callable giving those from the previous."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
    prv = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
    tensors = [t.contiguous() for t in tensors]
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in received]
    works = dist.batch_isend_irecv(ops)

    def finish() -> list[torch.Tensor]:
        for work in works:
            work.wait()
        return received
    return finish


def _safe(lse: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _dense(mask: MaskSpec, meta, q: torch.Tensor, v: torch.Tensor) -> bool:
    """Every block is fully visible (``full``, no padding, no documents) and the kernel pair takes q / v."""
    from lf_kernels import attention_kernels_support

    return (mask.kind == "full" and all(pad is None and doc is None for _, pad, doc in meta)
            and attention_kernels_support(q, v))


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold(g: torch.Tensor, groups: int) -> torch.Tensor:
    """Sum the gradients of the ``groups`` query heads that share one kv head."""
    return g if groups == 1 else g.unflatten(1, (g.shape[1] // groups, groups)).sum(2)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, meta, group, scale):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        out = torch.zeros(q.shape, dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=out.dtype, device=q.device)
        dense, groups = _dense(mask, meta, q, v), q.shape[1] // k.shape[1]
        if dense:
            from lf_kernels import attention_kernels

            pair = attention_kernels(q.device)
        k_cur, v_cur = k, v
        for step in range(size):
            src = (rank - step) % size
            allowed = None if dense else block_mask(mask, meta, rank, src)
            if step < size - 1:  # the next k/v travel while this block computes
                pending = _shift([k_cur, v_cur], group)
            if dense or bool(allowed.any()):
                if dense:
                    out_j, lse_j = pair.forward(q, _expand(k_cur, groups), _expand(v_cur, groups), False, scale)
                else:
                    out_j, lse_j = _attention_block(q, k_cur, v_cur, allowed, scale)
                lse_j = lse_j.to(lse.dtype)
                new = torch.logaddexp(lse, lse_j)
                out = out * torch.exp(lse - _safe(new))[..., None] + out_j * torch.exp(lse_j - _safe(new))[..., None]
                lse = new
            if step < size - 1:
                k_cur, v_cur = pending()
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.meta, ctx.group, ctx.scale, ctx.dense = mask, meta, group, scale, dense
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        group, mask, meta = ctx.group, ctx.mask, ctx.meta
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if ctx.dense and (d_lse is None or not bool(d_lse.any())):
            return _dense_backward(ctx, q, k, v, out, lse, d_out) + (None, None, None, None)
        d_out = torch.zeros_like(out) if d_out is None else d_out
        d_lse = torch.zeros_like(lse) if d_lse is None else d_lse
        dq = torch.zeros_like(q, dtype=lse.dtype)
        k_cur, v_cur = k, v
        dk_cur, dv_cur = torch.zeros_like(k, dtype=lse.dtype), torch.zeros_like(v, dtype=lse.dtype)
        for step in range(size):
            src = (rank - step) % size
            allowed = block_mask(mask, meta, rank, src)
            if bool(allowed.any()):
                with torch.enable_grad():
                    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k_cur, v_cur))
                    out_j, lse_j = _attention_block(q_, k_, v_, allowed, ctx.scale)
                    w = torch.exp(lse_j - _safe(lse)).where(~torch.isinf(lse_j), torch.zeros_like(lse_j))
                    g_out = (w[..., None] * d_out.to(w.dtype)).to(out_j.dtype)
                    g_lse = w * (((d_out.to(w.dtype) * (out_j.detach().to(w.dtype) - out.to(w.dtype))).sum(-1))
                                 + d_lse)
                    gq, gk, gv = torch.autograd.grad([out_j, lse_j], [q_, k_, v_], [g_out, g_lse])
                dq += gq
                dk_cur, dv_cur = dk_cur + gk, dv_cur + gv
            if step < size - 1:
                k_cur, v_cur, dk_cur, dv_cur = _shift([k_cur, v_cur, dk_cur, dv_cur], group)()
        if size > 1:  # the k/v gradients made cp - 1 hops; one more brings them home
            dk_cur, dv_cur = _shift([dk_cur, dv_cur], group)()
        return dq.to(q.dtype), dk_cur.to(k.dtype), dv_cur.to(v.dtype), None, None, None, None


def _dense_backward(ctx, q, k, v, out, lse, d_out):
    """dq, dk, dv of dense blocks from the kernel pair's backward, handed the merged ``out`` and ``lse``."""
    from lf_kernels import attention_kernels

    group, pair, groups = ctx.group, attention_kernels(q.device), q.shape[1] // k.shape[1]
    size = dist.get_world_size(group)
    d_out = torch.zeros_like(out) if d_out is None else d_out.to(out.dtype)
    dq = torch.zeros_like(q, dtype=lse.dtype)
    k_cur, v_cur = k, v
    dk_cur, dv_cur = torch.zeros_like(k, dtype=lse.dtype), torch.zeros_like(v, dtype=lse.dtype)
    for step in range(size):
        gq, gk, gv = pair.backward(d_out, q, _expand(k_cur, groups), _expand(v_cur, groups), out, lse, False,
                                   ctx.scale)
        dq += gq
        dk_cur, dv_cur = dk_cur + _fold(gk, groups), dv_cur + _fold(gv, groups)
        if step < size - 1:
            k_cur, v_cur, dk_cur, dv_cur = _shift([k_cur, v_cur, dk_cur, dv_cur], group)()
    if size > 1:  # the k/v gradients made cp - 1 hops; one more brings them home
        dk_cur, dv_cur = _shift([dk_cur, dv_cur], group)()
    return dq.to(q.dtype), dk_cur.to(k.dtype), dv_cur.to(v.dtype)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec, *,
                   positions: torch.Tensor, group=None, key_padding: torch.Tensor | None = None,
                   document_ids: torch.Tensor | None = None, scale: float | None = None,
                   return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sequence sharded across ``group``; equals unsharded :func:`lf_kernels.attention`.

    Args:
        q: ``(batch, heads_q, seq_local, head_dim)`` this rank's queries.
        k, v: ``(batch, heads_kv, seq_local, head_dim)`` this rank's keys and values (GQA allowed).
        mask: the mask of the *whole* sequence; evaluated on global positions.
        positions: ``(seq_local,)`` int64 global positions of this rank's tokens
            (:func:`lf_parallel._context.zigzag_positions` for the balanced layout).
            Every rank must hold the same number of tokens.
        group: the ring's process group (default: the world).
        key_padding: optional ``(batch, seq_local)`` bool of this rank's tokens, True = real token.
        document_ids: optional ``(batch, seq_local)`` int document ids of this rank's tokens.
        scale: score scale, default ``1 / sqrt(head_dim)``.
        return_lse: also return the log-sum-exp ``(batch, heads_q, seq_local)`` float32.

    Returns:
        ``out`` ``(batch, heads_q, seq_local, head_dim)`` in ``q.dtype`` (and ``lse``),
        differentiable w.r.t. q, k and v (and through ``lse``).

    Raises:
        ValueError: ``positions`` not of length ``seq_local``; shards of different lengths.
    """
    if positions.shape != (q.shape[2],):
        raise ValueError(f"ring_attention: positions must have shape ({q.shape[2]},), got {tuple(positions.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    meta = gather_meta(positions, key_padding, document_ids, group)
    out, lse = _RingAttention.apply(q, k, v, mask, meta, group, scale)
    return (out, lse) if return_lse else out
