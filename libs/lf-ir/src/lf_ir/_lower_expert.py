"""Lowering of the action-expert nodes (:mod:`lf_ir._nodes_expert`): pi0's time MLP and joint-attention block.

The joint attention under pi0's block mask is computed as two attention calls with
exactly the same result as one masked call over the concatenated sequence: the
prefix attends to its own keys (full, key padding), the suffix attends to the
prefix keys followed by its own (full, key padding). Split this way the prefix's
keys and values of every layer depend on the prefix only, so sampling computes them
once (:meth:`JointBlockModule.prefix_kv`) and reuses them at every integration step.

Legend: ``x_bsd`` (batch, seq, width); ``q_bhsd`` (batch, heads, seq, head_dim); ``P`` prefix, ``H`` suffix tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lf_ir._lower import lower_node, register_lowering
from lf_ir._nodes_expert import ActionTimeEmbed, JointAttentionBlock
from lf_kernels import MaskSpec, attention

MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0
"""Periods of pi0's sine-cosine time embedding (openpi ``posemb_sincos``), in units of flow time."""

_FULL = MaskSpec(kind="full")


def time_embedding(sigma_b: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Sine-cosine embedding (batch, width) of the flow time ``sigma_b`` (batch,) in [0, 1].

    ``[sin(2 pi t / p_i), cos(2 pi t / p_i)]`` with periods ``p_i`` geometric from
    :data:`MIN_PERIOD` to :data:`MAX_PERIOD` (pi0, arXiv 2410.24164; openpi ``posemb_sincos``).
    Computed in float64 then cast to ``dtype``.
    """
    frac = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=sigma_b.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** frac
    angle = sigma_b.to(torch.float64)[:, None] * (2 * math.pi / period)[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1).to(dtype)


class ActionTimeEmbedModule(nn.Module):
    """(noisy actions (batch, H, action_dim), sigma (batch,)) -> (batch, H, width); see :class:`ActionTimeEmbed`."""

    def __init__(self, node: ActionTimeEmbed):
        super().__init__()
        self.width = node.width
        self.action_in = nn.Linear(node.action_dim, node.width)
        self.mlp_in = nn.Linear(2 * node.width, node.width)
        self.mlp_out = nn.Linear(node.width, node.width)

    def forward(self, actions_bha: torch.Tensor, sigma_b: torch.Tensor) -> torch.Tensor:
        x_bhw = self.action_in(actions_bha)
        t_bhw = time_embedding(sigma_b, self.width, x_bhw.dtype)[:, None, :].expand_as(x_bhw)
        return self.mlp_out(nn.functional.silu(self.mlp_in(torch.cat([x_bhw, t_bhw], dim=-1))))


class _Stream(nn.Module):
    """One expert's half of a joint block: norms, q/k/v/o and MLP (only k/v with ``kv_only``)."""

    def __init__(self, node: JointAttentionBlock, width: int, kv_only: bool, name: str):
        super().__init__()
        a, kv = node.heads * node.head_dim, node.kv_heads * node.head_dim
        self.attn_norm = nn.LayerNorm(width)
        self.k = nn.Linear(width, kv, bias=False)
        self.v = nn.Linear(width, kv, bias=False)
        if not kv_only:
            self.q = nn.Linear(width, a, bias=False)
            self.o = nn.Linear(a, width, bias=False)
            self.mlp_norm = nn.LayerNorm(width)
            self.mlp = lower_node(node.mlp(name))


class JointBlockModule(nn.Module):
    """The lowered :class:`JointAttentionBlock`: ``prefix`` and ``suffix`` streams sharing one attention.

    ``forward(x_pre, x_suf, key_padding)`` is the training path (both streams);
    ``prefix_kv`` and ``suffix`` are its two halves, for sampling with a KV cache.
    """

    def __init__(self, node: JointAttentionBlock):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = node.heads, node.kv_heads, node.head_dim
        self.kv_only = node.prefix_kv_only
        self.prefix = _Stream(node, node.dim, node.prefix_kv_only, "prefix")
        self.suffix = _Stream(node, node.expert_dim, False, "suffix")

    def _heads(self, x_bsd: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = x_bsd.shape
        return x_bsd.view(b, s, n, self.head_dim).transpose(1, 2)

    def _merge(self, out_bhsd: torch.Tensor) -> torch.Tensor:
        b, _, s, _ = out_bhsd.shape
        return out_bhsd.transpose(1, 2).reshape(b, s, -1)

    def prefix_kv(self, x_pre: torch.Tensor, key_padding: torch.Tensor):
        """Prefix stream: (next prefix hidden (batch, P, dim) or None if kv-only, k_bhsd, v_bhsd).

        ``key_padding`` (batch, P) bool, True = real prefix token.
        """
        s = self.prefix
        h_bsd = s.attn_norm(x_pre)
        k_bhsd, v_bhsd = self._heads(s.k(h_bsd), self.kv_heads), self._heads(s.v(h_bsd), self.kv_heads)
        if self.kv_only:
            return None, k_bhsd, v_bhsd
        q_bhsd = self._heads(s.q(h_bsd), self.heads)
        x_pre = x_pre + s.o(self._merge(attention(q_bhsd, k_bhsd, v_bhsd, _FULL, key_padding=key_padding)))
        return x_pre + s.mlp(s.mlp_norm(x_pre)), k_bhsd, v_bhsd

    def suffix_step(self, x_suf: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor,
                    key_padding: torch.Tensor) -> torch.Tensor:
        """Suffix stream (batch, H, expert_dim) attending to the cached prefix keys/values and its own.

        ``key_padding`` (batch, P) bool is the prefix's; action tokens are never padding.
        """
        s = self.suffix
        h_bsd = s.attn_norm(x_suf)
        q_bhsd = self._heads(s.q(h_bsd), self.heads)
        k_bhsd = torch.cat([k_pre, self._heads(s.k(h_bsd), self.kv_heads)], dim=2)
        v_bhsd = torch.cat([v_pre, self._heads(s.v(h_bsd), self.kv_heads)], dim=2)
        ones = torch.ones(x_suf.shape[0], x_suf.shape[1], dtype=torch.bool, device=x_suf.device)
        pad = torch.cat([key_padding, ones], dim=1)
        x_suf = x_suf + s.o(self._merge(attention(q_bhsd, k_bhsd, v_bhsd, _FULL, key_padding=pad)))
        return x_suf + s.mlp(s.mlp_norm(x_suf))

    def forward(self, x_pre: torch.Tensor, x_suf: torch.Tensor, key_padding: torch.Tensor):
        """(prefix hidden or None, suffix hidden): one joint layer over both streams."""
        x_pre_next, k_pre, v_pre = self.prefix_kv(x_pre, key_padding)
        return x_pre_next, self.suffix_step(x_suf, k_pre, v_pre, key_padding)


register_lowering(ActionTimeEmbed)(ActionTimeEmbedModule)
register_lowering(JointAttentionBlock)(JointBlockModule)
