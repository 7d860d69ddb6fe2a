"""Wan 2.1 causal 3D VAE recipe: video (3, 4k+1, H, W) <-> latent (16, k+1, H/8, W/8).

Follows the Wan 2.1 VAE (Wan Team, "Wan: Open and Advanced Large-Scale Video
Generative Models", arXiv 2503.20314, section 3.1) as implemented by diffusers'
``AutoencoderKLWan`` (``is_residual=False``): causal 3D convolutions, channel RMS
norms, residual blocks, per-frame attention in the middle blocks, spatial and
temporal resampling, 4x8x8 compression. ``lf_ir.interop.diffusers_wan_vae``
converts diffusers checkpoints both ways.

Two ways to run a clip, equal up to float summation order (tested):

- ``"chunked"`` (diffusers' way): the first frame, then chunks of 4 frames (encode)
  or one latent frame at a time (decode), with the feature cache carrying the
  causal context; activation memory of one chunk.
- ``"full"``: the whole clip at once; more memory, fewer and larger kernels.

Legend: ``video_bcthw`` (batch, channels, frames, height, width) float in [-1, 1];
``latent_bcthw`` (batch, z_dim, latent frames, height / 8, width / 8).
"""

from __future__ import annotations

from typing import Literal

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from lf_ir import _lower_vae  # noqa: F401  (registers the VAE lowerings)
from lf_ir._graph import Graph, validate
from lf_ir._lower import lower_node
from lf_ir._lower_vae import ChannelRMSNormModule, FeatureCache
from lf_ir.recipes._spec import RecipeSpec, lazy_function, register_recipe
from lf_ir.recipes._wan_vae_graph import chain_edges, decoder_components, encoder_components
from lf_kernels.conv3d import CausalConv3d

LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
"""Per-channel mean of Wan 2.1 latents (published with the checkpoint, diffusers ``latents_mean``)."""
LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
               3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
"""Per-channel standard deviation of Wan 2.1 latents (diffusers ``latents_std``)."""

EncodeMode = Literal["chunked", "full"]


class WanVAEConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of a Wan 2.1 VAE (diffusers ``AutoencoderKLWan`` config names). Widths in channels.

    Example:
        >>> wan_vae_config("wan2.1").z_dim
        16
    """

    base_dim: int = 96
    """Channels of the first encoder level (diffusers ``base_dim``)."""
    decoder_base_dim: int | None = None
    """Channels of the last decoder level (None: ``base_dim``)."""
    z_dim: int = 16
    """Latent channels."""
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    """Channel multiplier per level; ``len - 1`` levels halve height and width."""
    num_res_blocks: int = 2
    """Residual blocks per encoder level (the decoder has one more)."""
    attn_scales: tuple[float, ...] = ()
    """Encoder levels (by scale 1, 1/2, ...) with an attention block after each residual block."""
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    """Per downsampling level, whether time is halved too (diffusers' spelling); reversed in the decoder."""
    in_channels: int = 3
    """Video channels in."""
    out_channels: int = 3
    """Video channels out."""
    latents_mean: tuple[float, ...] = LATENTS_MEAN
    """Per-channel latent mean for :meth:`WanVAE.normalize_latents`."""
    latents_std: tuple[float, ...] = LATENTS_STD
    """Per-channel latent standard deviation for :meth:`WanVAE.normalize_latents`."""

    def __post_init__(self) -> None:
        for key in ("base_dim", "z_dim", "num_res_blocks", "in_channels", "out_channels"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.decoder_base_dim is not None and self.decoder_base_dim < 1:
            raise ValueError(f"model.decoder_base_dim must be positive or None, got {self.decoder_base_dim!r}")
        if not self.dim_mult or any(m < 1 for m in self.dim_mult):
            raise ValueError(f"model.dim_mult must be positive multipliers, got {self.dim_mult!r}")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(f"model.temperal_downsample must have len(dim_mult) - 1 = {len(self.dim_mult) - 1} "
                             f"entries, got {self.temperal_downsample!r}")
        for key in ("latents_mean", "latents_std"):
            if len(getattr(self, key)) != self.z_dim:
                raise ValueError(f"model.{key} must have z_dim = {self.z_dim} entries, got {len(getattr(self, key))}")

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame (after the first): 2 ** (temporal downsamplings)."""
        return 2 ** sum(self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel along height and width."""
        return 2 ** (len(self.dim_mult) - 1)


SIZES: dict[str, dict] = {
    "tiny": dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                 latents_mean=(0.1, -0.2, 0.3, 0.0), latents_std=(1.5, 0.5, 2.0, 1.0)),
    "wan2.1": {},
}
"""Named sizes, overrides of the WanVAEConfig defaults (the published Wan2.1 VAE); ``tiny`` is for tests."""


def wan_vae_config(size: str = "wan2.1", **overrides) -> WanVAEConfig:
    """The config of a named size (any case: ``"8b"`` = ``"8B"``) with field overrides.

    Raises:
        ValueError: unknown size (lists the sizes); TypeError: unknown field.
    """
    return SPEC.config(size, **overrides)


def latent_shape(cfg: WanVAEConfig, frames: int, height: int, width: int) -> tuple[int, int, int]:
    """(latent frames, latent height, latent width) of a clip.

    Raises:
        ValueError: ``frames`` not ``1 + temporal_factor * k``, or height / width not multiples of
            ``spatial_factor``.
    """
    ft, fs = cfg.temporal_factor, cfg.spatial_factor
    if frames < 1 or (frames - 1) % ft:
        raise ValueError(f"video frames must be 1 + {ft} * k, got {frames}")
    if height < 1 or width < 1 or height % fs or width % fs:
        raise ValueError(f"video height and width must be positive multiples of {fs}, got {height} x {width}")
    return 1 + (frames - 1) // ft, height // fs, width // fs


def build_graph(cfg: WanVAEConfig, frames: int = 81, height: int = 480, width: int = 832) -> Graph:
    """The IR graph for clips of ``frames`` x ``height`` x ``width`` (default 81 x 480 x 832).

    Components ``encoder0..`` (video -> mean and log-variance) and ``decoder0..``
    (latent -> video), one per resolution level; FLOPs are those of encoding and
    decoding one such clip.

    Raises:
        ValueError: a clip shape the VAE cannot take (see :func:`latent_shape`).
        IRError: naming a node that does not fit.
    """
    lt, lh, lw = latent_shape(cfg, frames, height, width)
    enc = encoder_components(cfg, frames, height, width)
    dec = decoder_components(cfg, lt, lh, lw)
    return validate(Graph(name="wan_vae", recipe="wan_vae", components=[*enc, *dec],
                          edges=[*chain_edges(enc), *chain_edges(dec)]))


def _side_flops(cfg: WanVAEConfig, side: str, frames: int, height: int, width: int, batch: int) -> int:
    graph = build_graph(cfg, frames, height, width)
    return sum(n.forward_flops(batch, c.seq_len) for c in graph.components if c.name.startswith(side)
               for n in c.nodes)


def encode_flops(cfg: WanVAEConfig, frames: int, height: int, width: int, batch: int = 1) -> int:
    """Forward FLOPs (multiply-add = 2) of encoding ``batch`` clips of ``frames`` x ``height`` x ``width``.

    Example:
        >>> round(encode_flops(wan_vae_config("wan2.1"), 81, 480, 832) / 1e12)
        164
    """
    return _side_flops(cfg, "encoder", frames, height, width, batch)


def decode_flops(cfg: WanVAEConfig, frames: int, height: int, width: int, batch: int = 1) -> int:
    """Forward FLOPs of decoding the latents of ``batch`` clips of ``frames`` x ``height`` x ``width`` (video size)."""
    return _side_flops(cfg, "decoder", frames, height, width, batch)


class VAEStage(nn.Module):
    """The lowered nodes of one resolution level, applied in order with the feature cache.

    A bare channel norm (``norm_out``) is followed by SiLU, as in Wan's output heads.
    """

    def __init__(self, component):
        super().__init__()
        self.lf_component = component
        self.layers = nn.ModuleList(lower_node(n) for n in component.nodes)

    def forward(self, x_bcthw: torch.Tensor, cache: FeatureCache | None = None) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, ChannelRMSNormModule):
                x_bcthw = F.silu(layer(x_bcthw))
            elif isinstance(layer, CausalConv3d):
                x_bcthw = _lower_vae.cached_conv(layer, x_bcthw, cache)
            else:
                x_bcthw = layer(x_bcthw, cache)
        return x_bcthw


class WanVAE(nn.Module):
    """The lowered Wan 2.1 VAE. Build under ``torch.device("meta")``, then ``lf_ir.materialize``.

    Example:
        >>> from lf_ir import materialize
        >>> with torch.device("meta"):
        ...     vae = WanVAE(wan_vae_config("tiny"))
        >>> vae = materialize(vae, "cpu", seed=0)
        >>> mean, logvar = vae.encode(torch.zeros(1, 3, 5, 16, 16))
        >>> mean.shape, vae.decode(mean).shape
        (torch.Size([1, 4, 2, 2, 2]), torch.Size([1, 3, 5, 16, 16]))
    """

    def __init__(self, cfg: WanVAEConfig, graph: Graph | None = None):
        super().__init__()
        self.cfg = cfg
        self.graph = graph if graph is not None else build_graph(cfg, 1 + cfg.temporal_factor,
                                                                 cfg.spatial_factor, cfg.spatial_factor)
        comps = self.graph.components
        self.encoder = nn.ModuleList(VAEStage(c) for c in comps if c.name.startswith("encoder"))
        self.decoder = nn.ModuleList(VAEStage(c) for c in comps if c.name.startswith("decoder"))

    def _run(self, stages: nn.ModuleList, x: torch.Tensor, cache: FeatureCache | None) -> torch.Tensor:
        for stage in stages:
            x = stage(x, cache)
        return x

    def encode(self, video_bcthw: torch.Tensor, mode: EncodeMode = "chunked") -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and log-variance (clamped to [-30, 20]), each (batch, z_dim, 1 + (T-1)/4, H/8, W/8).

        ``mode="chunked"`` runs the first frame, then 4 frames at a time (diffusers' way);
        ``"full"`` the whole clip at once. Input (batch, in_channels, T, H, W), T = 4k + 1.

        Raises:
            ValueError: wrong rank, channels, frame count or size (naming the value), unknown mode.
        """
        if video_bcthw.dim() != 5 or video_bcthw.shape[1] != self.cfg.in_channels:
            raise ValueError(f"video: expected (batch, {self.cfg.in_channels}, frames, height, width), "
                             f"got {tuple(video_bcthw.shape)}")
        latent_shape(self.cfg, *video_bcthw.shape[2:])
        if mode == "full":
            h = self._run(self.encoder, video_bcthw, None)
        elif mode == "chunked":
            cache: FeatureCache = {}
            step = self.cfg.temporal_factor
            starts = [0, *range(1, video_bcthw.shape[2], step)]
            ends = [*starts[1:], video_bcthw.shape[2]]
            h = torch.cat([self._run(self.encoder, video_bcthw[:, :, a:b], cache)
                           for a, b in zip(starts, ends, strict=True)], 2)
        else:
            raise ValueError(f"encode mode must be 'chunked' or 'full', got {mode!r}")
        mean, logvar = h.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, latent_bcthw: torch.Tensor, mode: EncodeMode = "chunked") -> torch.Tensor:
        """Video (batch, out_channels, 1 + 4(T'-1), 8H', 8W') in [-1, 1] from latents (batch, z_dim, T', H', W').

        ``mode="chunked"`` decodes one latent frame at a time (diffusers' way); ``"full"`` all at once.

        Raises:
            ValueError: wrong rank or channels, unknown mode.
        """
        if latent_bcthw.dim() != 5 or latent_bcthw.shape[1] != self.cfg.z_dim:
            raise ValueError(f"latent: expected (batch, {self.cfg.z_dim}, frames, height, width), "
                             f"got {tuple(latent_bcthw.shape)}")
        if mode == "full":
            out = self._run(self.decoder, latent_bcthw, None)
        elif mode == "chunked":
            cache: FeatureCache = {}
            out = torch.cat([self._run(self.decoder, latent_bcthw[:, :, i:i + 1], cache)
                             for i in range(latent_bcthw.shape[2])], 2)
        else:
            raise ValueError(f"decode mode must be 'chunked' or 'full', got {mode!r}")
        return out.clamp(-1.0, 1.0)

    def forward(self, video_bcthw: torch.Tensor, mode: EncodeMode = "chunked") -> torch.Tensor:
        """Reconstruction: decode the latent mean of the video (diffusers ``forward`` without sampling)."""
        return self.decode(self.encode(video_bcthw, mode)[0], mode)

    def normalize_latents(self, latent_bcthw: torch.Tensor) -> torch.Tensor:
        """``(z - latents_mean) / latents_std`` per channel: what the diffusion transformer sees."""
        mean, std = self._stats(latent_bcthw)
        return (latent_bcthw - mean) / std

    def denormalize_latents(self, latent_bcthw: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`normalize_latents`: ``z * latents_std + latents_mean``."""
        mean, std = self._stats(latent_bcthw)
        return latent_bcthw * std + mean

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if like.dim() != 5 or like.shape[1] != self.cfg.z_dim:
            raise ValueError(f"latent: expected (batch, {self.cfg.z_dim}, frames, height, width), "
                             f"got {tuple(like.shape)}")
        shape = (1, -1, 1, 1, 1)
        return (torch.tensor(self.cfg.latents_mean, dtype=like.dtype, device=like.device).view(shape),
                torch.tensor(self.cfg.latents_std, dtype=like.dtype, device=like.device).view(shape))


SPEC = register_recipe(RecipeSpec(
    name="wan_vae", family="video_vae", config_class=WanVAEConfig, sizes=SIZES, build_graph=build_graph,
    model=WanVAE, import_hf=lazy_function("lf_ir.interop", "import_diffusers_wan_vae"),
    export_hf=lazy_function("lf_ir.interop", "export_diffusers_wan_vae"), masks=("full",)))
"""The wan_vae recipe (video_vae family): causal 3D convolutions and per-frame full attention; its graph
annotates no tensor-parallel split."""


__all__ = ["LATENTS_MEAN", "LATENTS_STD", "SPEC", "VAEStage", "WanVAE", "WanVAEConfig", "build_graph",
           "decode_flops", "encode_flops", "latent_shape", "wan_vae_config"]
