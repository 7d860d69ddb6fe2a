"""Lowering of the video diffusion-transformer nodes (``_nodes_video.py``, ``_nodes_dit.py``).

The modules reproduce diffusers' ``WanTransformer3DModel`` operation by operation,
including where it computes in float32 (norms, modulation, gated residuals), so
float32 weights give the peer's outputs up to kernel rounding. Importing this module
registers the rules with :func:`lf_ir._lower.register_lowering`.

Legend: ``x_bsd`` (batch, tokens, dim); ``ctx_bld`` (batch, text tokens, dim);
``video_bcfhw`` (batch, channels, frames, height, width); ``q_bshd`` (batch, tokens,
heads, head_dim); ``emb_bcd`` (batch, chunks, dim).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lf_ir import _lower_mm  # noqa: F401  (registers the FeedForward lowering)
from lf_ir._fused import RMSNormModule, modulate_fits, rotary_fits
from lf_ir._lower import lower_node, register_lowering
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_video import AdaLNHead, AdaLNModulation, TextProjection, TimestepEmbedding, VideoPatchEmbed
from lf_ir._rope3d_torch import apply_rope3d
from lf_kernels import MaskSpec, apply_rotary, attention, modulate

_FULL = MaskSpec(kind="full")


def _modulate(fused: bool, h_btd: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN ``h * (1 + scale) + shift`` in float32 (``h`` float32 (batch, tokens, dim), ``shift`` / ``scale``
    float32 (batch, 1, dim)); with ``fused`` :func:`lf_kernels.modulate` where it takes the inputs."""
    if fused and modulate_fits(h_btd, shift, scale):
        return modulate(h_btd, shift, scale)
    return h_btd * (1 + scale) + shift


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the input dtype, result in the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() if self.weight is not None else None
        b = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


@register_lowering(VideoPatchEmbed)
class VideoPatchEmbedModule(nn.Module):
    """(batch, channels, frames, H, W) -> tokens (batch, f*h*w, dim) in (frame, row, column) order."""

    def __init__(self, node: VideoPatchEmbed):
        super().__init__()
        self.proj = nn.Conv3d(node.in_channels, node.dim, kernel_size=node.patch, stride=node.patch)

    def forward(self, video_bcfhw: torch.Tensor) -> torch.Tensor:
        return self.proj(video_bcfhw).flatten(2).transpose(1, 2).contiguous()


@register_lowering(TimestepEmbedding)
class TimestepEmbeddingModule(nn.Module):
    """t (batch,) float -> (temb (batch, dim), modulation (batch, chunks, dim)) in the weights' dtype."""

    def __init__(self, node: TimestepEmbedding):
        super().__init__()
        self.freq_dim, self.chunks = node.freq_dim, node.chunks
        self.linear_1 = nn.Linear(node.freq_dim, node.dim)
        self.linear_2 = nn.Linear(node.dim, node.dim)
        self.time_proj = nn.Linear(node.dim, node.chunks * node.dim)

    def sinusoid(self, t_b: torch.Tensor) -> torch.Tensor:
        """(batch, freq_dim) float32 ``[cos(t w_i), sin(t w_i)]`` with ``w_i = 10000^(-i / (freq_dim / 2))``."""
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t_b.device) / half)
        angle = t_b[:, None].float() * freqs[None, :]
        return torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)

    def forward(self, t_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.sinusoid(t_b).to(self.linear_1.weight.dtype)
        temb_bd = self.linear_2(F.silu(self.linear_1(h)))
        return temb_bd, self.time_proj(F.silu(temb_bd)).unflatten(1, (self.chunks, -1))


@register_lowering(TextProjection)
class TextProjectionModule(nn.Module):
    """(batch, text_len, in_features) -> (batch, text_len, dim): linear_2(gelu_tanh(linear_1(x)))."""

    def __init__(self, node: TextProjection):
        super().__init__()
        self.linear_1 = nn.Linear(node.in_features, node.dim)
        self.linear_2 = nn.Linear(node.dim, node.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))


@register_lowering(AdaLNModulation)
class AdaLNModulationModule(nn.Module):
    """emb (batch, chunks or 1, dim) -> ``chunks`` float32 tensors (batch, 1, dim): table + emb."""

    def __init__(self, node: AdaLNModulation):
        super().__init__()
        self.chunks = node.chunks
        self.table = nn.Parameter(torch.empty(1, node.chunks, node.dim))

    def forward(self, emb_bcd: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.table + emb_bcd.float()).chunk(self.chunks, dim=1)


@register_lowering(AdaLNHead)
class AdaLNHeadModule(nn.Module):
    """(x (batch, tokens, dim), temb (batch, dim)) -> (batch, tokens, out_features).

    With ``fused`` set (:func:`lf_ir.use_fused_ops`) the modulation runs :func:`lf_kernels.modulate`.
    """

    fused: bool = False

    def __init__(self, node: AdaLNHead):
        super().__init__()
        self.norm = FP32LayerNorm(node.dim, node.eps, elementwise_affine=False)
        self.modulation = lower_node(node.modulation)
        self.proj = nn.Linear(node.dim, node.out_features)

    def forward(self, x_bsd: torch.Tensor, temb_bd: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(temb_bd.unsqueeze(1))
        x_bsd = _modulate(self.fused, self.norm(x_bsd.float()), shift, scale).type_as(x_bsd)
        return self.proj(x_bsd)


@register_lowering(DiTAttention)
class DiTAttentionModule(nn.Module):
    """q/k-RMSNormed full attention; ``context`` (batch, text, dim) for cross-attention, ``rope`` tables
    (cos, sin) from :func:`lf_ir._rope3d_torch.rope3d_cos_sin` for self-attention. With ``fused`` set
    (:func:`lf_ir.use_fused_ops`) the rotation runs :func:`lf_kernels.apply_rotary` (interleaved pairs)
    on the same tables."""

    fused: bool = False

    def __init__(self, node: DiTAttention):
        super().__init__()
        self.heads = node.heads
        d = node.dim
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm_q = RMSNormModule(d, eps=node.eps)
        self.norm_k = RMSNormModule(d, eps=node.eps)

    @staticmethod
    def _rope_fits(q_bshd: torch.Tensor, k_bshd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Tables (1 | batch, tokens, 1, head_dim) that :func:`lf_kernels.apply_rotary` takes for q and k."""
        if cos.dim() != 4 or cos.shape[2] != 1 or cos.shape != sin.shape:
            return False
        cos, sin = cos[:, :, 0], sin[:, :, 0]
        return rotary_fits(q_bshd.transpose(1, 2), cos, sin) and rotary_fits(k_bshd.transpose(1, 2), cos, sin)

    def forward(self, x_bsd: torch.Tensor, context: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        kv_in = x_bsd if context is None else context
        q_bshd = self.norm_q(self.q(x_bsd)).unflatten(2, (self.heads, -1))
        k_bshd = self.norm_k(self.k(kv_in)).unflatten(2, (self.heads, -1))
        v_bshd = self.v(kv_in).unflatten(2, (self.heads, -1))
        if rope is not None:
            if self.fused and self._rope_fits(q_bshd, k_bshd, *rope):
                cos, sin = rope[0][:, :, 0], rope[1][:, :, 0]  # (1, tokens, 1, head_dim) -> (1, tokens, head_dim)
                q_bshd = apply_rotary(q_bshd, cos, sin, layout="bshd", interleaved=True)
                k_bshd = apply_rotary(k_bshd, cos, sin, layout="bshd", interleaved=True)
            else:
                q_bshd, k_bshd = apply_rope3d(q_bshd, *rope), apply_rope3d(k_bshd, *rope)
        out_bhsd = attention(q_bshd.transpose(1, 2), k_bshd.transpose(1, 2), v_bshd.transpose(1, 2), _FULL)
        return self.o(out_bhsd.transpose(1, 2).flatten(2).type_as(q_bshd))


@register_lowering(DiTBlock)
class DiTBlockModule(nn.Module):
    """The Wan2.1 block (see :class:`lf_ir._nodes_dit.DiTBlock` for the equations).

    forward(x (batch, tokens, dim), context (batch, text, dim), modulation (batch, 6, dim),
    rope (cos, sin)) -> (batch, tokens, dim). With ``fused`` set (:func:`lf_ir.use_fused_ops`) both
    modulations run :func:`lf_kernels.modulate`.
    """

    fused: bool = False

    def __init__(self, node: DiTBlock):
        super().__init__()
        for key, child in node.children().items():
            setattr(self, key, lower_node(child))
        self.norm1 = FP32LayerNorm(node.dim, node.eps, elementwise_affine=False)
        self.norm2 = FP32LayerNorm(node.dim, node.eps) if node.cross_attn_norm else nn.Identity()
        self.norm3 = FP32LayerNorm(node.dim, node.eps, elementwise_affine=False)

    def forward(self, x_bsd: torch.Tensor, context: torch.Tensor, emb_bcd: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        shift, scale, gate, c_shift, c_scale, c_gate = self.modulation(emb_bcd)
        h = _modulate(self.fused, self.norm1(x_bsd.float()), shift, scale).type_as(x_bsd)
        x_bsd = (x_bsd.float() + self.self_attn(h, rope=rope) * gate).type_as(x_bsd)
        h = self.norm2(x_bsd.float()).type_as(x_bsd)
        x_bsd = x_bsd + self.cross_attn(h, context=context)
        h = _modulate(self.fused, self.norm3(x_bsd.float()), c_shift, c_scale).type_as(x_bsd)
        return (x_bsd.float() + self.ffn(h).float() * c_gate).type_as(x_bsd)
