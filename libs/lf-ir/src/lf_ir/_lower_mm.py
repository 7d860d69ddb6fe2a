"""Lowering of the multimodal nodes (3D patch embed, patch merger, FeedForward, MMAttention, MMBlock).

Importing this module registers the rules with :func:`lf_ir._lower.register_lowering`.
Numerics follow HF ``transformers``' Qwen2-VL modules op for op (see each class).

Legend: ``x_bsd`` (batch, seq, dim); ``q_bhsd`` (batch, heads, seq, head_dim);
``cos_bsd`` (batch, seq, head_dim) rotary table; ``patches_nf`` (patches, C*T*p*p).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from lf_ir._fused import rotary_fits
from lf_ir._lower import TransformerBlockModule, lower_node, register_lowering
from lf_ir._mrope import MRoPE
from lf_ir._mrope_torch import apply_rope_fp32, mrope_cos_sin
from lf_ir._nodes_mm import MMAttention, MMBlock
from lf_ir._nodes_vision import FeedForward, PatchEmbed3D, PatchMerger
from lf_ir._rope_torch import apply_rope
from lf_kernels import MaskSpec, apply_rotary, attention, choose_backend

_ACTIVATIONS = {
    "gelu": nn.functional.gelu,
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # HF QuickGELUActivation
    "silu": nn.functional.silu,
}


@register_lowering(PatchEmbed3D)
class PatchEmbed3DModule(nn.Module):
    """(..., C*T*p*p) flattened patches -> (..., dim): the Conv3d of one patch, computed as a matmul.

    ``proj.weight`` keeps the Conv3d shape (dim, C, T, p, p) so checkpoints load as is.
    """

    def __init__(self, node: PatchEmbed3D):
        super().__init__()
        self.features = node.patch_features
        self.proj = nn.Module()
        p, t = node.patch_size, node.temporal_patch_size
        self.proj.weight = nn.Parameter(torch.empty(node.dim, node.in_channels, t, p, p))
        self.proj.bias = nn.Parameter(torch.empty(node.dim)) if node.bias else None

    def forward(self, patches_nf: torch.Tensor) -> torch.Tensor:
        if patches_nf.shape[-1] != self.features:
            raise ValueError(f"pixel_values: expected (..., {self.features}) flattened patches, "
                             f"got shape {tuple(patches_nf.shape)}")
        weight = self.proj.weight
        return nn.functional.linear(patches_nf.to(weight.dtype), weight.reshape(weight.shape[0], -1), self.proj.bias)


@register_lowering(PatchMerger)
class PatchMergerModule(nn.Module):
    """(tokens, in) -> (tokens / merge**2, out): LayerNorm, fuse each block, Linear-GELU-Linear (HF ``PatchMerger``)."""

    def __init__(self, node: PatchMerger):
        super().__init__()
        self.hidden = node.hidden
        self.norm = nn.LayerNorm(node.in_features, eps=node.eps)
        self.fc1 = nn.Linear(node.hidden, node.hidden)
        self.fc2 = nn.Linear(node.hidden, node.out_features)

    def forward(self, x_nd: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(self.norm(x_nd).reshape(-1, self.hidden))))


@register_lowering(FeedForward)
class FeedForwardModule(nn.Module):
    """``down(act(up(x)))`` on the last dim."""

    def __init__(self, node: FeedForward):
        super().__init__()
        self.act = _ACTIVATIONS[node.activation]
        self.up = nn.Linear(node.dim, node.hidden, bias=node.bias)
        self.down = nn.Linear(node.hidden, node.dim, bias=node.bias)

    def forward(self, x_bsd: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x_bsd)))


@register_lowering(MMAttention)
class MMAttentionModule(nn.Module):
    """GQA self-attention through :func:`lf_kernels.attention` with M-RoPE or vision 2D RoPE.

    ``cos_sin``: the rotary tables ((batch|1, seq, head_dim) each), computed once per
    model call; for M-RoPE they may instead be computed here from ``positions``
    (3, batch, seq) (default ``0..seq-1`` on all axes). Vision tables are float32 and
    the vision rotation runs in float32, as in HF. ``segments``: token counts along
    ``seq`` (summing to it); attention then stays inside each segment: one call with the segments as packed
    documents where lf-kernels serves them block-sparse (CUDA: FlexAttention, whose block mask is then built
    once per segment list, or a varlen kernel; one kernel for all images instead of one per image), else one
    call per segment (CPU: a dense mask over all images would cost more than the per-image calls).
    With ``fused`` set (:func:`lf_ir.use_fused_ops`) the M-RoPE rotation runs :func:`lf_kernels.apply_rotary`
    on the same tables (the vision rotation stays plain).
    """

    fused: bool = False

    def __init__(self, node: MMAttention):
        super().__init__()
        kv = node.kv_heads * node.head_dim
        self.heads, self.kv_heads, self.head_dim = node.heads, node.kv_heads, node.head_dim
        self.rope = node.rope
        self.mask = MaskSpec(kind=node.mask)
        self.q = nn.Linear(node.dim, node.dim, bias=node.qkv_bias)
        self.k = nn.Linear(node.dim, kv, bias=node.qkv_bias)
        self.v = nn.Linear(node.dim, kv, bias=node.qkv_bias)
        self.o = nn.Linear(node.dim, node.dim, bias=node.o_bias)

    def forward(self, x_bsd: torch.Tensor, mask: MaskSpec | None = None, key_padding: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, *, cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
                segments: list[int] | None = None) -> torch.Tensor:
        b, s, _ = x_bsd.shape
        mask = self.mask if mask is None else mask
        q_bhsd = self.q(x_bsd).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k_bhsd = self.k(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v_bhsd = self.v(x_bsd).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope is not None:
            if cos_sin is None:
                if not isinstance(self.rope, MRoPE):
                    raise ValueError("vision 2D RoPE needs cos_sin tables (lf_ir._mrope_torch.vision_rope_cos_sin)")
                if positions is None:
                    positions = torch.arange(s, device=x_bsd.device).view(1, 1, s).expand(3, b, s)
                cos_sin = mrope_cos_sin(self.rope, self.head_dim, positions, q_bhsd.dtype)
            rotate = apply_rope if isinstance(self.rope, MRoPE) else apply_rope_fp32
            if (self.fused and isinstance(self.rope, MRoPE) and rotary_fits(q_bhsd, *cos_sin)
                    and rotary_fits(k_bhsd, *cos_sin)):
                rotate = apply_rotary
            q_bhsd, k_bhsd = rotate(q_bhsd, *cos_sin), rotate(k_bhsd, *cos_sin)
        if segments is None:
            out_bhsd = attention(q_bhsd, k_bhsd, v_bhsd, mask, key_padding=key_padding)
        else:
            if sum(segments) != s:
                raise ValueError(f"attention segments sum to {sum(segments)} tokens but the sequence has {s}")
            if key_padding is None and choose_backend(mask, s, s, device=x_bsd.device, dtype=q_bhsd.dtype,
                                                      has_documents=True) in ("flex", "flash_varlen"):
                ids_bs = segment_ids(tuple(segments), b, str(x_bsd.device))
                return self.o(attention(q_bhsd, k_bhsd, v_bhsd, mask, document_ids=ids_bs).transpose(1, 2)
                              .reshape(b, s, -1))
            pads = key_padding.split(segments, dim=1) if key_padding is not None else [None] * len(segments)
            out_bhsd = torch.cat([attention(q, k, v, mask, key_padding=p) for q, k, v, p in zip(
                q_bhsd.split(segments, dim=2), k_bhsd.split(segments, dim=2), v_bhsd.split(segments, dim=2), pads,
                strict=True)], dim=2)
        return self.o(out_bhsd.transpose(1, 2).reshape(b, s, -1))


@functools.lru_cache(maxsize=16)
def segment_ids(segments: tuple[int, ...], batch: int, device: str) -> torch.Tensor:
    """``(batch, sum(segments))`` int64 ids, ``i`` over the ``i``-th segment; cached, so every layer of one
    forward pass hands lf-kernels the same tensor object (its varlen boundaries, a host sync, are then computed
    once per pass, not once per layer)."""
    counts = torch.tensor(segments, dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(segments)), counts)[None].expand(batch, -1).to(device)


@register_lowering(MMBlock)
class MMBlockModule(TransformerBlockModule):
    """Pre-norm residual block with an :class:`MMAttentionModule` (rotary tables and segments passed through)."""

    def __init__(self, node: MMBlock):
        nn.Module.__init__(self)
        self.mask_kind = node.attention.mask
        self.attn_norm = lower_node(node.attn_norm)
        self.attention = lower_node(node.attention)
        self.mlp_norm = lower_node(node.mlp_norm)
        self.mlp = lower_node(node.mlp)

    def forward(self, x_bsd: torch.Tensor, mask: MaskSpec | None = None, key_padding: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, *, cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
                segments: list[int] | None = None) -> torch.Tensor:
        x_bsd = x_bsd + self.attention(self.attn_norm(x_bsd), mask, key_padding, positions, cos_sin=cos_sin,
                                       segments=segments)
        return x_bsd + self.mlp(self.mlp_norm(x_bsd))
