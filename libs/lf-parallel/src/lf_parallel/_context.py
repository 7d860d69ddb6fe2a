"""Context parallelism (CP): the zigzag sequence layout, masks from global positions, and the dispatch.

Each of ``cp`` ranks holds ``seq / cp`` tokens of every sample. The layout is
*zigzag* (load-balanced for causal masks, as in Megatron-LM's CP and
Brandon et al., "Striped Attention", 2023): the sequence is cut into ``2 * cp``
equal chunks and cp rank ``i`` holds chunks ``i`` and ``2 * cp - 1 - i``, so every
rank gets one early (cheap) and one late (expensive) chunk of a causal mask.

Masks are evaluated on global token positions with lf-kernels'
``mask_predicate`` (the rule ``dense_mask`` uses), combined with packed-document
ids and key padding; so every ``MaskSpec`` kind works under any layout.

Kinds (``Plan.cp_kind``): ``"ring"`` (:mod:`lf_parallel._ring`), ``"ulysses"``
(:mod:`lf_parallel._ulysses`), ``"ring+ulysses"`` (a 2D group: all-to-all inside
each Ulysses group, then a ring across them).

Legend: ``b`` batch, ``h`` heads, ``s`` tokens, ``d`` head dim; ``x_bs...`` is (batch, seq, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.distributed as dist

from lf_kernels import MaskSpec

__all__ = ["CPKind", "ContextParallel", "apply_context_parallel", "block_mask", "context_attention",
           "context_parallel_of", "gather_meta", "gather_sequence", "shard_sequence", "zigzag_positions"]

CPKind = Literal["ring", "ulysses", "ring+ulysses"]
_KINDS = ("ring", "ulysses", "ring+ulysses")


def zigzag_positions(seq_len: int, cp_rank: int, cp: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Global positions ``(seq_len // cp,)`` int64 of cp rank ``cp_rank``: chunks ``i`` and ``2cp-1-i`` of ``2cp``.

    Raises:
        ValueError: ``seq_len`` not divisible by ``2 * cp``, or ``cp_rank`` out of range.

    Example:
        >>> zigzag_positions(8, 0, 2).tolist()
        [0, 1, 6, 7]
    """
    if cp < 1 or not 0 <= cp_rank < cp:
        raise ValueError(f"context parallel: cp_rank must be in [0, cp={cp}), got {cp_rank}")
    if seq_len % (2 * cp):
        raise ValueError(f"context parallel: sequence length {seq_len} must divide by 2 * cp = {2 * cp} "
                         "(zigzag layout); pad the sequence")
    chunk = seq_len // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, device=device)
    second = torch.arange((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk, device=device)
    return torch.cat([first, second])


def shard_sequence(x: torch.Tensor, cp_rank: int, cp: int, *, dim: int = 1) -> torch.Tensor:
    """This cp rank's zigzag shard of ``x`` along ``dim`` (the sequence dim, size divisible by ``2 * cp``)."""
    return x.index_select(dim, zigzag_positions(x.shape[dim], cp_rank, cp, device=x.device))


def gather_sequence(x_local: torch.Tensor, cp: int, *, group=None, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: all-gather the zigzag shards of ``group`` back into global order.

    ``group`` is the process group whose rank ``i`` holds cp rank ``i``'s shard (size ``cp``).
    Not differentiable (for outputs, losses, tests).
    """
    parts = [torch.empty_like(x_local) for _ in range(cp)]
    dist.all_gather(parts, x_local.contiguous(), group=group)
    seq = x_local.shape[dim] * cp
    order = torch.cat([zigzag_positions(seq, r, cp, device=x_local.device) for r in range(cp)])
    out = torch.empty_like(torch.cat(parts, dim=dim))
    out.index_copy_(dim, order, torch.cat(parts, dim=dim))
    return out


@dataclasses.dataclass(frozen=True)
class ContextParallel:
    """Where this rank sits in the context-parallel layout, and the groups to talk over.

    cp rank = ``ring_rank * ulysses_size + ulysses_rank``: the members of one Ulysses
    group hold neighbouring cp ranks (put them on one node: all-to-all is the heavier
    traffic), the ring runs across the Ulysses groups.
    """

    kind: CPKind
    """``Plan.cp_kind``: ``"ring"``, ``"ulysses"`` or ``"ring+ulysses"``."""
    cp: int
    """Context-parallel degree (``Plan.cp``): ranks sharing one sequence."""
    cp_rank: int
    """This rank's index in the layout, 0..cp-1 (selects its zigzag shard)."""
    ring_group: object = None
    """Process group of the ring (``"ring"``: the whole cp group); None for ``"ulysses"``."""
    ulysses_group: object = None
    """Process group of the all-to-all (``"ulysses"``: the whole cp group); None for ``"ring"``."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"parallel.cp_kind must be one of {list(_KINDS)}, got {self.kind!r}")
        if not 0 <= self.cp_rank < self.cp:
            raise ValueError(f"context parallel: cp_rank must be in [0, cp={self.cp}), got {self.cp_rank}")
        need_ring, need_uly = self.kind != "ulysses", self.kind != "ring"
        if need_ring != (self.ring_group is not None) or need_uly != (self.ulysses_group is not None):
            raise ValueError(f"context parallel kind {self.kind!r} needs ring_group "
                             f"{'set' if need_ring else 'None'} and ulysses_group {'set' if need_uly else 'None'}")
        sizes = [dist.get_world_size(g) for g in (self.ring_group, self.ulysses_group) if g is not None]
        if sizes and int(torch.tensor(sizes).prod()) != self.cp:
            raise ValueError(f"context parallel: group sizes {sizes} do not multiply to cp={self.cp}")

    def positions(self, seq_local: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Global positions ``(seq_local,)`` of this rank's tokens (zigzag layout)."""
        return zigzag_positions(seq_local * self.cp, self.cp_rank, self.cp, device=device)

    def shard(self, x: torch.Tensor, *, dim: int = 1) -> torch.Tensor:
        """This rank's shard of a full-sequence tensor (ids, labels, rotary positions, document ids)."""
        return shard_sequence(x, self.cp_rank, self.cp, dim=dim)


def gather_meta(positions: torch.Tensor, key_padding: torch.Tensor | None, document_ids: torch.Tensor | None,
                group) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """All-gather each rank's (positions, key_padding, document_ids) of ``group``; a list indexed by group rank.

    Small tensors (one int per token), gathered once per attention call so each block's mask
    can be built locally.
    """
    size = dist.get_world_size(group)
    out = []
    for t in (positions, key_padding, document_ids):
        if t is None:
            out.append([None] * size)
            continue
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous(), group=group)
        out.append(parts)
    return list(zip(*out, strict=True))


def block_mask(mask: MaskSpec, meta, q_rank: int, k_rank: int) -> torch.Tensor:
    """Dense bool mask ``(b|1, 1, s_q, s_k)`` of queries held by ``q_rank`` against keys held by ``k_rank``.

    ``meta`` is :func:`gather_meta`'s list. ``mask`` is evaluated on global positions,
    then restricted to equal document ids and to real (non-padding) keys.
    """
    from lf_kernels import mask_predicate

    q_pos, _, q_doc = meta[q_rank]
    k_pos, k_pad, k_doc = meta[k_rank]
    allowed = mask_predicate(mask, q_pos[:, None], k_pos[None, :])[None, None]
    if k_pad is not None:
        allowed = allowed & k_pad[:, None, None, :]
    if q_doc is not None:
        allowed = allowed & (q_doc[:, None, :, None] == k_doc[:, None, None, :])
    return allowed


def context_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec, *,
                      cp: ContextParallel, positions: torch.Tensor | None = None,
                      key_padding: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                      scale: float | None = None, return_lse: bool = False):
    """Context-parallel attention of this rank's shard; equals :func:`lf_kernels.attention` on the whole sequence.

    Args:
        q: ``(batch, heads_q, seq_local, head_dim)``; k, v: ``(batch, heads_kv, seq_local, head_dim)``.
        mask: the whole sequence's mask.
        cp: the layout and groups.
        positions: ``(seq_local,)`` global token positions; default the zigzag shard of ``cp``.
        key_padding: ``(batch, seq_local)`` bool (True = real token) of this rank's tokens.
        document_ids: ``(batch, seq_local)`` int document ids of this rank's tokens.
        scale, return_lse: as in :func:`lf_kernels.attention`.

    Returns:
        ``out`` ``(batch, heads_q, seq_local, head_dim)`` (and ``lse`` ``(batch, heads_q, seq_local)``).

    Raises:
        ValueError: for Ulysses, heads or kv_heads not divisible by the Ulysses group size.
    """
    from lf_parallel._ring import ring_attention
    from lf_parallel._ulysses import ulysses_attention

    if positions is None:
        positions = cp.positions(q.shape[2], device=q.device)
    kwargs = dict(positions=positions, key_padding=key_padding, document_ids=document_ids, scale=scale,
                  return_lse=return_lse)
    if cp.kind == "ring":
        return ring_attention(q, k, v, mask, group=cp.ring_group, **kwargs)
    return ulysses_attention(q, k, v, mask, group=cp.ulysses_group, ring_group=cp.ring_group, **kwargs)


def apply_context_parallel(model: torch.nn.Module, cp: ContextParallel) -> torch.nn.Module:
    """Make every lowered attention of ``model`` context-parallel over ``cp``, in place; returns ``model``.

    Finds the attention modules by their lowered class (lf-ir's ``AttentionModule``; the self-attention
    ``DiTAttentionModule`` of video DiTs, see :mod:`lf_parallel._context_dit`) and switches their class to
    one whose forward computes q/k/v of the local shard,
    applies RoPE at the tokens' *global* positions (default: the zigzag positions; pass the
    model's ``positions`` shard for packed documents), and calls :func:`context_attention`.
    Parameter names and values are untouched, so state dicts match the unsharded model.
    Feed the model its shard (``cp.shard(ids)``); token-wise layers need nothing else.
    For Ulysses the heads are checked here, before any step (ValueError naming heads and cp).
    """
    from lf_ir import AttentionModule
    from lf_parallel._context_dit import context_parallel_class
    from lf_parallel._ulysses import check_ulysses_heads

    for module in model.modules():
        cls = _ContextParallelAttention if type(module) is AttentionModule else context_parallel_class(module)
        if cls is not None:
            if cp.ulysses_group is not None:
                heads = module.heads
                check_ulysses_heads(heads, getattr(module, "kv_heads", heads), dist.get_world_size(cp.ulysses_group))
            module.__class__ = cls
            module.lf_cp = cp
    return model


def context_parallel_of(mesh, plan) -> ContextParallel:
    """The :class:`ContextParallel` of this rank under ``plan``: the ``cp`` dim of ``mesh`` is the ring
    (``cp_kind="ring"``) or the all-to-all group (``"ulysses"``).

    Raises:
        ValueError: ``cp_kind="ring+ulysses"``, whose 2-D split of the cp dim the plan does not describe
            (build the groups and a ContextParallel yourself, as ``tests/test_context.py`` does).
    """
    if plan.cp_kind not in ("ring", "ulysses"):
        raise ValueError(f"parallel.cp_kind={plan.cp_kind!r}: parallelize() applies cp_kind 'ring' or 'ulysses'; "
                         "the plan does not say how to split the cp dim into Ulysses x ring groups")
    sub = mesh["cp"]
    group = sub.get_group()
    return ContextParallel(kind=plan.cp_kind, cp=plan.cp, cp_rank=sub.get_local_rank(),
                           ring_group=group if plan.cp_kind == "ring" else None,
                           ulysses_group=group if plan.cp_kind == "ulysses" else None)


def _cp_attention_class():
    from lf_ir import AttentionModule, apply_rope, rope_cos_sin

    class ContextParallelAttention(AttentionModule):
        """An ``AttentionModule`` whose attention spans the context-parallel group (see apply_context_parallel)."""

        def forward(self, x_bsd, mask, key_padding=None, positions=None, document_ids=None):
            b, s, _ = x_bsd.shape
            cp: ContextParallel = self.lf_cp
            seq_pos = cp.positions(s, device=x_bsd.device)
            q_bhsd = self.q(x_bsd).view(b, s, self.heads, self.head_dim).transpose(1, 2)
            k_bhsd = self.k(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            v_bhsd = self.v(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            if self.rope is not None:
                rope_pos = seq_pos.expand(b, s) if positions is None else positions
                cos, sin = rope_cos_sin(self.rope, self.head_dim, rope_pos, q_bhsd.dtype)
                q_bhsd, k_bhsd = apply_rope(q_bhsd, cos, sin), apply_rope(k_bhsd, cos, sin)
            out_bhsd = context_attention(q_bhsd, k_bhsd, v_bhsd, mask, cp=cp, positions=seq_pos,
                                         key_padding=key_padding, document_ids=document_ids)
            return self.o(out_bhsd.transpose(1, 2).reshape(b, s, -1))

    return ContextParallelAttention


_ContextParallelAttention = _cp_attention_class()
