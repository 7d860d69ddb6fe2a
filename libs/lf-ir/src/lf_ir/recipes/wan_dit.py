"""Wan2.1 text-to-video diffusion transformer (DiT), as diffusers' ``WanTransformer3DModel``.

Wan Team, "Wan: Open and Advanced Large-Scale Video Generative Models" (arXiv
2503.20314). Latents of the Wan VAE (16 channels, 4x temporal and 8x spatial
compression) are cut into (1, 2, 2) patches by a Conv3d; the tokens go through
blocks of 3D-RoPE self-attention, cross-attention to umT5 text states projected
from 4096 features, and a tanh-GELU MLP, each modulated (adaLN, DiT) by one time
projection shared by all blocks plus a per-block table; a modulated norm and a
linear head predict the flow-matching velocity, unpatchified to the latent shape.
Image-to-video (the CLIP image branch) is not implemented.

Graph: component ``text`` (seq = text tokens) holds the text projection; component
``video`` (seq = latent tokens per sample, see :func:`video_tokens`) holds
``patch_embed``, ``time_embed`` (per sample), blocks ``block0..``, ``head`` and the
``loss`` (:class:`FlowMatchingLoss`). ``lf_ir.interop.diffusers_wan`` converts
diffusers checkpoints both ways.

Legend: ``latents_bcfhw`` (batch, channels, latent frames, latent height, latent
width); ``text_bld`` (batch, text tokens, text_dim); ``t_b`` (batch,) diffusion time
in [0, num_train_timesteps].
"""

from __future__ import annotations

import math

import msgspec
import torch
from torch import nn

from lf_ir import _lower_video  # noqa: F401  (registers the video lowerings)
from lf_ir._graph import Component, Edge, Graph, validate
from lf_ir._lower import ComponentModule
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_video import (
    AdaLNHead,
    AdaLNModulation,
    RoPE3D,
    TextProjection,
    TimestepEmbedding,
    VideoPatchEmbed,
)
from lf_ir._nodes_vision import FeedForward
from lf_ir._pipeline_glue import blocks_between
from lf_ir._rope3d_torch import rope3d_cos_sin
from lf_ir.flow import FlowMatchingLoss, interpolate, timesteps_from_sigmas
from lf_ir.recipes._spec import RecipeSpec, lazy_function, register_recipe


class WanDiTConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of a Wan2.1 T2V DiT (defaults: Wan2.1-T2V-14B). Widths in features.

    Example:
        >>> wan_dit_config("1.3B").dim
        1536
    """

    dim: int = 5120
    """Model width (diffusers ``num_attention_heads * attention_head_dim``)."""
    ffn_dim: int = 13824
    """MLP hidden width."""
    heads: int = 40
    """Attention heads; must divide ``dim``."""
    layers: int = 40
    """DiT blocks."""
    in_channels: int = 16
    """Latent channels in."""
    out_channels: int = 16
    """Latent channels out (the predicted velocity)."""
    text_dim: int = 4096
    """Text-encoder width (umT5-XXL)."""
    freq_dim: int = 256
    """Sinusoidal time-embedding features."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Patch (frames, rows, columns) in latent pixels."""
    eps: float = 1e-6
    """Epsilon of every LayerNorm and RMSNorm."""
    cross_attn_norm: bool = True
    """Affine LayerNorm before the cross-attention."""
    rope_theta: float = 10000.0
    """3D RoPE base."""
    rope_max_seq_len: int = 1024
    """Largest latent-grid extent per axis the RoPE tables cover."""
    text_len: int = 512
    """Text tokens per sample (umT5 context, padded), for FLOPs."""
    vae_stride: tuple[int, int, int] = (4, 8, 8)
    """VAE compression (frames, height, width): pixels per latent pixel."""
    frames: int = 81
    """Video frames per sample the cost model assumes (4k + 1)."""
    height: int = 480
    """Video height in pixels the cost model assumes."""
    width: int = 832
    """Video width in pixels the cost model assumes."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def rope(self) -> RoPE3D:
        """The 3D RoPE settings of the self-attention nodes."""
        return RoPE3D(theta=self.rope_theta, max_seq_len=self.rope_max_seq_len)


SIZES: dict[str, dict] = {
    "tiny": dict(dim=36, ffn_dim=64, heads=3, layers=2, in_channels=4, out_channels=4, text_dim=32, freq_dim=16,
                 text_len=7, frames=9, height=48, width=80),
    "1.3B": dict(dim=1536, ffn_dim=8960, heads=12, layers=30),
    "14B": {},
}
"""Named sizes, overrides of the WanDiTConfig defaults: ``1.3B`` is Wan2.1-T2V-1.3B, ``14B``
Wan2.1-T2V-14B (both head_dim 128); ``tiny`` is for tests (3 heads of 12 features, 45 tokens)."""


def wan_dit_config(size: str = "14B", **overrides) -> WanDiTConfig:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return SPEC.config(size, **overrides)


def latent_grid(cfg: WanDiTConfig, frames: int, height: int, width: int) -> tuple[int, int, int]:
    """Token grid (f, h, w) of a video of ``frames`` x ``height`` x ``width`` pixels.

    Latent frames ``(frames - 1) / vae_t + 1`` (the causal VAE keeps the first frame),
    latent pixels ``height / vae_h``, ``width / vae_w``, each divided by the patch.

    Raises:
        ValueError: sizes the VAE stride or the patch do not divide, naming the value.
    """
    st, sh, sw = cfg.vae_stride
    pt, ph, pw = cfg.patch
    if frames < 1 or (frames - 1) % st:
        raise ValueError(f"video frames must be {st}k + 1 for the VAE's temporal stride {st}, got {frames}")
    latent = ((frames - 1) // st + 1, height / sh, width / sw)
    for axis, value, patch in zip(("frames", "height", "width"), latent, cfg.patch, strict=True):
        if value != int(value) or int(value) < 1 or int(value) % patch:
            raise ValueError(f"video {axis}: latent size {value} (from {frames}x{height}x{width} pixels) "
                             f"is not a positive multiple of the patch {patch}")
    return int(latent[0]) // pt, int(latent[1]) // ph, int(latent[2]) // pw


def video_tokens(cfg: WanDiTConfig, frames: int | None = None, height: int | None = None,
                 width: int | None = None) -> int:
    """Latent tokens per sample (the ``video`` component's seq); defaults from ``cfg``.

    Example:
        >>> video_tokens(wan_dit_config("14B"), 81, 480, 832)  # 21 x 30 x 52
        32760
    """
    return math.prod(latent_grid(cfg, frames or cfg.frames, height or cfg.height, width or cfg.width))


def build_graph(cfg: WanDiTConfig, seq_len: int | None = None) -> Graph:
    """The IR graph; ``seq_len`` (default :func:`video_tokens` of the config's video size) sets FLOPs.

    Raises:
        IRError: naming the node that does not fit (e.g. ``'block0.self_attn'`` when
            ``dim`` is not divisible by ``heads`` or head_dim is odd).
    """
    d, rope = cfg.dim, cfg.rope()
    patch_embed = VideoPatchEmbed(name="patch_embed", in_channels=cfg.in_channels, dim=d, patch=tuple(cfg.patch))
    blocks = [DiTBlock(
        name=f"block{i}", cross_attn_norm=cfg.cross_attn_norm, eps=cfg.eps,
        modulation=AdaLNModulation(name=f"block{i}.modulation", dim=d, chunks=6),
        self_attn=DiTAttention(name=f"block{i}.self_attn", dim=d, heads=cfg.heads, rope=rope, eps=cfg.eps),
        cross_attn=DiTAttention(name=f"block{i}.cross_attn", dim=d, heads=cfg.heads, cross=True,
                                context_len=cfg.text_len, eps=cfg.eps),
        ffn=FeedForward(name=f"block{i}.ffn", dim=d, hidden=cfg.ffn_dim, activation="gelu_tanh"),
    ) for i in range(cfg.layers)]
    out = cfg.out_channels * math.prod(cfg.patch)
    text = Component(name="text", modality="text", seq_len=cfg.text_len, nodes=[
        TextProjection(name="text_proj", in_features=cfg.text_dim, dim=d)])
    video = Component(name="video", modality="video", seq_len=seq_len or video_tokens(cfg), nodes=[
        patch_embed,
        TimestepEmbedding(name="time_embed", freq_dim=cfg.freq_dim, dim=d, chunks=6),
        *blocks,
        AdaLNHead(name="head", dim=d, out_features=out, eps=cfg.eps),
        FlowMatchingLoss(name="loss", dim=out),
    ])
    edges = [Edge(src="text", src_node="text_proj", dst="video", kind="context")]
    return validate(Graph(name="wan_dit", recipe="wan_dit", components=[text, video], edges=edges))


class WanDiTModel(nn.Module):
    """The lowered Wan2.1 DiT. Build under ``torch.device("meta")``, then ``lf_ir.materialize``.

    Example:
        >>> from lf_ir import materialize
        >>> cfg = wan_dit_config("tiny")
        >>> with torch.device("meta"):
        ...     model = WanDiTModel(cfg)
        >>> model = materialize(model, "cpu", seed=0)
        >>> model(torch.randn(2, 4, 3, 6, 10), torch.tensor([10.0, 900.0]), torch.randn(2, 7, 32)).shape
        torch.Size([2, 4, 3, 6, 10])
    """

    def __init__(self, cfg: WanDiTConfig, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg)
        self.components = nn.ModuleDict({c.name: ComponentModule(c) for c in self.graph.components})

    @property
    def blocks(self) -> list[nn.Module]:
        """The DiT blocks in order (for recompute and pipeline planning)."""
        video = self.components["video"]
        return [video[n.name] for n in self.graph.component("video").nodes if isinstance(n, DiTBlock)]

    def _check(self, latents: torch.Tensor, t_b: torch.Tensor, text: torch.Tensor) -> tuple[int, int, int]:
        cfg = self.cfg
        if latents.dim() != 5 or latents.shape[1] != cfg.in_channels:
            raise ValueError(f"latents: expected (batch, {cfg.in_channels}, frames, height, width), "
                             f"got {tuple(latents.shape)}")
        grid = tuple(s // p for s, p in zip(latents.shape[2:], cfg.patch, strict=True))
        if any(s % p for s, p in zip(latents.shape[2:], cfg.patch, strict=True)):
            raise ValueError(f"latents: frames/height/width {tuple(latents.shape[2:])} are not multiples of "
                             f"the patch {tuple(cfg.patch)}")
        if t_b.shape != (latents.shape[0],):
            raise ValueError(f"timestep: expected shape ({latents.shape[0]},), got {tuple(t_b.shape)}")
        if text.dim() != 3 or text.shape[0] != latents.shape[0] or text.shape[2] != cfg.text_dim:
            raise ValueError(f"text: expected ({latents.shape[0]}, tokens, {cfg.text_dim}), got {tuple(text.shape)}")
        return grid

    def forward(self, latents_bcfhw: torch.Tensor, t_b: torch.Tensor, text_bld: torch.Tensor) -> torch.Tensor:
        """Velocity (batch, out_channels, frames, height, width) for noisy latents at time ``t_b``.

        Args:
            latents_bcfhw: noisy latents; frames/height/width multiples of the patch.
            t_b: (batch,) float diffusion time, ``sigma * 1000`` in the flow convention.
            text_bld: text-encoder states (batch, text tokens, text_dim).

        Raises:
            ValueError: shapes that do not fit the config, naming the argument.
        """
        x_bsd, *side = self.embed_inputs(latents_bcfhw, t_b, text_bld)
        return self.trunk_head(self.trunk_blocks(x_bsd, *side), *side)

    def embed_inputs(self, latents_bcfhw: torch.Tensor, t_b: torch.Tensor, text_bld: torch.Tensor
                     ) -> tuple[torch.Tensor, ...]:
        """Pipeline glue (:mod:`lf_ir._pipeline_glue`): :meth:`forward`'s inputs -> the blocks' input and sides.

        Returns ``(x_bsd, context_btd, emb_bcd, temb_bd, cos_bfhwk, sin_bfhwk)``: patch tokens (batch,
        f*h*w, dim); the projected text (batch, text tokens, dim); the time modulation (batch, 6, dim) and
        time embedding (batch, dim); the 3D RoPE tables (batch, f, h, w, head_dim) float32, whose shape
        carries the token grid to :meth:`trunk_head`.

        Raises:
            ValueError: as :meth:`forward`.
        """
        grid = self._check(latents_bcfhw, t_b, text_bld)
        video, cfg = self.components["video"], self.cfg
        cos, sin = rope3d_cos_sin(cfg.rope(), cfg.head_dim, grid, latents_bcfhw.device)
        b = latents_bcfhw.shape[0]
        x_bsd = video["patch_embed"](latents_bcfhw)
        temb_bd, emb_bcd = video["time_embed"](t_b)
        context = self.components["text"]["text_proj"](text_bld)
        return (x_bsd, context, emb_bcd, temb_bd.type_as(text_bld), cos.view(1, *grid, -1).expand(b, -1, -1, -1, -1),
                sin.view(1, *grid, -1).expand(b, -1, -1, -1, -1))

    def trunk_blocks(self, x_bsd: torch.Tensor, context: torch.Tensor, emb_bcd: torch.Tensor, temb_bd: torch.Tensor,
                     cos_bfhwk: torch.Tensor, sin_bfhwk: torch.Tensor, *, start: int = 0,
                     stop: int | None = None) -> torch.Tensor:
        """Pipeline glue: the DiT blocks among ``video`` nodes ``[start, stop)``; (batch, tokens, dim) in and out."""
        rope = (cos_bfhwk.flatten(1, 3).unsqueeze(2), sin_bfhwk.flatten(1, 3).unsqueeze(2))
        for block in blocks_between(self.components["video"], start, stop):
            x_bsd = block(x_bsd, context, emb_bcd, rope)
        return x_bsd

    def trunk_head(self, x_bsd: torch.Tensor, context: torch.Tensor, emb_bcd: torch.Tensor, temb_bd: torch.Tensor,
                   cos_bfhwk: torch.Tensor, *side: torch.Tensor) -> torch.Tensor:
        """Pipeline glue: the modulated head and unpatchify, velocity (batch, out_channels, frames, height, width)."""
        out = self.components["video"]["head"](x_bsd, temb_bd)
        return self.unpatchify(out, tuple(cos_bfhwk.shape[1:4]))

    def unpatchify(self, tokens_bsk: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """(batch, f*h*w, out_channels*pt*ph*pw) -> (batch, out_channels, f*pt, h*ph, w*pw)."""
        (f, h, w), (pt, ph, pw) = grid, self.cfg.patch
        x = tokens_bsk.reshape(tokens_bsk.shape[0], f, h, w, pt, ph, pw, -1)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def flow_loss(self, x0_bcfhw: torch.Tensor, text_bld: torch.Tensor, noise_bcfhw: torch.Tensor,
                  sigma_b: torch.Tensor) -> torch.Tensor:
        """Flow-matching training loss (float32 scalar) of clean latents at noise levels ``sigma_b`` (batch,).

        ``x_t = (1 - sigma) x0 + sigma noise``, network time ``1000 sigma``, target
        ``noise - x0`` (:mod:`lf_ir.flow`), through the graph's ``loss`` node.
        """
        x_t = interpolate(x0_bcfhw, noise_bcfhw, sigma_b).to(x0_bcfhw.dtype)
        pred = self(x_t, timesteps_from_sigmas(sigma_b), text_bld)
        return self.components["video"]["loss"](pred, x0_bcfhw, noise_bcfhw, sigma_b)


SPEC = register_recipe(RecipeSpec(
    name="wan_dit", family="video", config_class=WanDiTConfig, sizes=SIZES, build_graph=build_graph,
    model=WanDiTModel, import_hf=lazy_function("lf_ir.interop", "import_diffusers_wan"),
    export_hf=lazy_function("lf_ir.interop", "export_diffusers_wan"),
    masks=("full",), tensor_parallel=True, sequence_parallel=True, context_parallel=("ring", "ulysses")))
"""The wan_dit recipe (video family): full attention over the video tokens, cross-attention to the text."""
