"""Ulysses context parallelism: all-to-all from sequence-sharded to head-sharded, attention, all-to-all back.

DeepSpeed-Ulysses (Jacobs et al., arXiv 2309.14509). Each of ``u`` ranks holds
``seq / u`` tokens of all heads; one all-to-all gives each rank ``heads / u``
heads of the whole sequence, attention runs unsharded (any lf-kernels backend,
any mask, packed documents), and a second all-to-all restores the sequence
shards. Written here because PyTorch has no Ulysses building block; the
all-to-all is ``all_to_all_single`` (gloo and NCCL) inside an autograd Function
whose backward is the opposite all-to-all.

With a ring group as well (``cp_kind = "ring+ulysses"``, a 2D cp group of
``u x r`` ranks) the gathered sequence is still only ``1 / r`` of the whole, so
the attention in the middle is :func:`lf_parallel._ring.ring_attention` across
the ring group instead of a local call.

GQA: query head ``h`` reads kv head ``h // (heads / kv_heads)``; splitting both
head counts into ``u`` contiguous groups keeps that mapping, so both must divide
by ``u``.

Legend: ``b`` batch, ``h`` heads, ``s`` tokens, ``d`` head dim; ``x_bhsd``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lf_kernels import MaskSpec, attention
from lf_parallel._context import gather_meta

__all__ = ["check_ulysses_heads", "head_to_seq", "seq_to_head", "ulysses_attention"]


def _seq_to_head(x_bhsd: torch.Tensor, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    b, h, s, d = x_bhsd.shape
    send = x_bhsd.reshape(b, size, h // size, s, d).transpose(0, 1).contiguous()  # (dst rank, b, h/u, s, d)
    recv = torch.empty_like(send)  # (src rank, b, h/u, s, d)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * s, d)


def _head_to_seq(x_bhsd: torch.Tensor, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    b, h, s, d = x_bhsd.shape
    send = x_bhsd.reshape(b, h, size, s // size, d).permute(2, 0, 1, 3, 4).contiguous()  # (dst rank, b, h, s/u, d)
    recv = torch.empty_like(send)  # (src rank = head group, b, h, s/u, d)
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, size * h, s // size, d)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_head(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _head_to_seq(grad.contiguous(), ctx.group), None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _head_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_head(grad.contiguous(), ctx.group), None


def seq_to_head(x_bhsd: torch.Tensor, group=None) -> torch.Tensor:
    """``(b, h, s_local, d)`` -> ``(b, h / u, u * s_local, d)``: rank ``j`` gets heads ``[j h/u, (j+1) h/u)``.

    The gathered sequence is the members' shards in group-rank order. Differentiable.
    """
    return _SeqToHead.apply(x_bhsd, group)


def head_to_seq(x_bhsd: torch.Tensor, group=None) -> torch.Tensor:
    """Inverse of :func:`seq_to_head`: ``(b, h / u, u * s_local, d)`` -> ``(b, h, s_local, d)``. Differentiable."""
    return _HeadToSeq.apply(x_bhsd, group)


def check_ulysses_heads(heads: int, kv_heads: int, ulysses: int) -> None:
    """Raise ValueError naming the numbers when ``heads`` or ``kv_heads`` do not divide by the Ulysses degree."""
    for name, value in (("heads", heads), ("kv_heads", kv_heads)):
        if value % ulysses:
            raise ValueError(f"Ulysses context parallel splits attention heads over {ulysses} ranks, but the "
                             f"attention has {name}={value} (heads={heads}, kv_heads={kv_heads}), not divisible "
                             f"by cp={ulysses}; use cp_kind='ring' or a cp that divides both")


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec, *,
                      positions: torch.Tensor, group=None, ring_group=None,
                      key_padding: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                      scale: float | None = None, return_lse: bool = False):
    """Ulysses (and, with ``ring_group``, Ulysses x ring) attention; equals unsharded :func:`lf_kernels.attention`.

    Args:
        q: ``(batch, heads_q, seq_local, head_dim)``; k, v: ``(batch, heads_kv, seq_local, head_dim)``.
        mask: the whole sequence's mask.
        positions: ``(seq_local,)`` int64 global positions of this rank's tokens.
        group: the Ulysses (all-to-all) group, size ``u``.
        ring_group: optional ring group across Ulysses groups (``cp_kind="ring+ulysses"``).
        key_padding: ``(batch, seq_local)`` bool, True = real token; document_ids: ``(batch, seq_local)`` int.
        scale, return_lse: as in :func:`lf_kernels.attention`.

    Returns:
        ``out`` ``(batch, heads_q, seq_local, head_dim)`` in ``q.dtype`` (and ``lse`` float32).

    Raises:
        ValueError: ``heads_q`` or ``heads_kv`` not divisible by ``u`` (names heads and cp).
    """
    size = dist.get_world_size(group)
    check_ulysses_heads(q.shape[1], k.shape[1], size)
    q_h, k_h, v_h = (seq_to_head(t, group) for t in (q, k, v))
    pos_parts, pad_parts, doc_parts = zip(*gather_meta(positions, key_padding, document_ids, group), strict=True)
    pos = torch.cat(pos_parts)
    pad = None if key_padding is None else torch.cat(pad_parts, dim=1)
    doc = None if document_ids is None else torch.cat(doc_parts, dim=1)
    if ring_group is not None:
        from lf_parallel._ring import ring_attention

        out_h, lse_h = ring_attention(q_h, k_h, v_h, mask, positions=pos, group=ring_group, key_padding=pad,
                                      document_ids=doc, scale=scale, return_lse=True)
    else:  # the whole sequence is here: reorder to global order and call the unsharded kernel
        order = torch.argsort(pos)
        if not torch.equal(pos[order], torch.arange(pos.numel(), device=pos.device)):
            raise ValueError("ulysses_attention: the group's positions must cover 0..seq-1 exactly once")
        res = attention(q_h[:, :, order], k_h[:, :, order], v_h[:, :, order], mask,
                        key_padding=None if pad is None else pad[:, order],
                        document_ids=None if doc is None else doc[:, order], scale=scale, return_lse=return_lse)
        out_h, lse_h = res if return_lse else (res, None)
        inverse = torch.argsort(order)
        out_h = out_h[:, :, inverse]
        lse_h = None if lse_h is None else lse_h[:, :, inverse]
    out = head_to_seq(out_h, group)
    if not return_lse:
        return out
    lse = head_to_seq(lse_h.unsqueeze(-1), group).squeeze(-1)
    return out, lse
