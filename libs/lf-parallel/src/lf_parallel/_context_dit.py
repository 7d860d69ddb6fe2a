"""Context-parallel self-attention of video diffusion transformers (lf-ir's ``DiTAttentionModule``).

Every video token attends to every other (``MaskSpec("full")`` over the 3D latent
grid), so under context parallelism each rank computes q/k/v of its zigzag shard of
the tokens, rotates them with the rows of the 3D RoPE tables at the tokens' *global*
positions, and calls :func:`lf_parallel._context.context_attention` (ring or
Ulysses). Cross-attention to the text keeps its lowered class: its queries are this
rank's tokens and its keys the whole (replicated) text, which is already exact.

Legend: ``x_bsd`` (batch, local tokens, dim); ``q_bshd`` (batch, tokens, heads, head_dim);
RoPE tables ``(1, tokens, 1, head_dim)``.
"""

from __future__ import annotations

import torch
from torch import nn

from lf_kernels import MaskSpec

_FULL = MaskSpec(kind="full")


def _dit_class():
    from lf_ir import DiTAttentionModule, apply_rope3d
    from lf_parallel._context import context_attention

    class ContextParallelDiTAttention(DiTAttentionModule):
        """A DiT self-attention whose attention spans the context-parallel group (``self.lf_cp``).

        forward(x (batch, local tokens, dim), context=None, rope=(cos, sin)): ``rope`` may be the whole
        sequence's tables (tokens = local tokens * cp; this rank's rows are selected) or already this rank's.
        """

        def forward(self, x_bsd: torch.Tensor, context: torch.Tensor | None = None,
                    rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
            if context is not None:  # cross-attention: local queries against the whole text
                return super().forward(x_bsd, context=context, rope=rope)
            cp = self.lf_cp
            s = x_bsd.shape[1]
            pos = cp.positions(s, device=x_bsd.device)
            q_bshd = self.norm_q(self.q(x_bsd)).unflatten(2, (self.heads, -1))
            k_bshd = self.norm_k(self.k(x_bsd)).unflatten(2, (self.heads, -1))
            v_bshd = self.v(x_bsd).unflatten(2, (self.heads, -1))
            if rope is not None:
                cos, sin = rope
                if cos.shape[1] != s:
                    if cos.shape[1] != s * cp.cp:
                        raise ValueError(f"context-parallel DiT attention: RoPE tables of {cos.shape[1]} tokens "
                                         f"fit neither the local {s} tokens nor the whole {s * cp.cp}")
                    cos, sin = cos.index_select(1, pos), sin.index_select(1, pos)
                q_bshd, k_bshd = apply_rope3d(q_bshd, cos, sin), apply_rope3d(k_bshd, cos, sin)
            out_bhsd = context_attention(q_bshd.transpose(1, 2), k_bshd.transpose(1, 2), v_bshd.transpose(1, 2),
                                         _FULL, cp=cp, positions=pos)
            return self.o(out_bhsd.transpose(1, 2).flatten(2).type_as(q_bshd))

    return ContextParallelDiTAttention


_CLASS = None


def context_parallel_class(module: nn.Module) -> type | None:
    """The context-parallel class for ``module`` if it is a DiT *self*-attention (lowered, not cross), else None."""
    global _CLASS
    from lf_ir import DiTAttentionModule

    if type(module) is not DiTAttentionModule or getattr(getattr(module, "lf_node", None), "cross", True):
        return None
    if _CLASS is None:
        _CLASS = _dit_class()
    return _CLASS
