"""Lowering rules of the causal video VAE nodes (``_nodes_vae.py``), with the feature cache.

Every module's ``forward(x, cache=None)`` takes a :data:`FeatureCache`: a dict
that each causal module keys by itself and in which it keeps what the next
chunk of the same clip needs (the last input frames of a causal conv, the
pending frame of a stride-2 time conv, whether a clip's first frame was seen).
Run a whole clip with ``cache=None`` (or a fresh dict), or run its chunks in
order with one dict: the outputs concatenated along time are the whole clip's
(Wan 2.1, arXiv 2503.20314, section 3.1; diffusers ``AutoencoderKLWan``'s
``feat_cache``, here keyed by module instead of a running index).

Legend: ``x_bcthw`` is (batch, channels, frames, height, width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lf_ir._lower import lower_node, register_lowering
from lf_ir._nodes_vae import CausalConv3D, ChannelRMSNorm, VAEAttention, VAEResample, VAEResBlock
from lf_kernels import MaskSpec, attention
from lf_kernels.conv3d import CausalConv3d

FeatureCache = dict[nn.Module, torch.Tensor]
"""Per-clip streaming state: module -> the tensor it carries to the next chunk."""

_FULL = MaskSpec(kind="full")


def cached_conv(conv: CausalConv3d, x_bcthw: torch.Tensor, cache: FeatureCache | None) -> torch.Tensor:
    """``conv(x)`` continuing from ``cache[conv]`` and storing the new cache (convs with temporal padding)."""
    if cache is None or conv.padding[0] == 0:
        return conv(x_bcthw)[0]
    out, cache[conv] = conv(x_bcthw, cache.get(conv))
    return out


class ChannelRMSNormModule(nn.RMSNorm):
    """Wan's channel RMS norm on (batch, channels, ...): ``normalize(x, dim=1) * sqrt(channels) * weight``.

    A subclass of ``nn.RMSNorm`` (its ``weight`` (channels,), initialized to ones by
    :func:`lf_ir.init_weights` like every norm); half-precision inputs are normalized in
    float32, as diffusers' ``WanRMS_norm`` does.
    """

    def __init__(self, node: ChannelRMSNorm):
        super().__init__(node.dim)
        self.scale = node.dim ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        upcast = x.dtype in (torch.float16, torch.bfloat16)
        normed = F.normalize(x.float() if upcast else x, dim=1).to(x.dtype)
        return normed * self.scale * self.weight.view(-1, *([1] * (x.dim() - 2)))


class ResBlockModule(nn.Module):
    """:class:`VAEResBlock` lowered: ``shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))``."""

    def __init__(self, node: VAEResBlock):
        super().__init__()
        kids = node.children()
        self.norm1, self.conv1 = lower_node(kids["norm1"]), lower_node(kids["conv1"])
        self.norm2, self.conv2 = lower_node(kids["norm2"]), lower_node(kids["conv2"])
        self.shortcut = lower_node(kids["shortcut"]) if "shortcut" in kids else None

    def forward(self, x_bcthw: torch.Tensor, cache: FeatureCache | None = None) -> torch.Tensor:
        h = x_bcthw if self.shortcut is None else self.shortcut(x_bcthw)[0]
        x = cached_conv(self.conv1, F.silu(self.norm1(x_bcthw)), cache)
        x = cached_conv(self.conv2, F.silu(self.norm2(x)), cache)
        return x + h


class AttentionModule(nn.Module):
    """:class:`VAEAttention` lowered: single-head attention among each frame's pixels, residual."""

    def __init__(self, node: VAEAttention):
        super().__init__()
        kids = node.children()
        self.norm, self.qkv, self.proj = (lower_node(kids[k]) for k in ("norm", "qkv", "proj"))

    def forward(self, x_bcthw: torch.Tensor, cache: FeatureCache | None = None) -> torch.Tensor:
        b, c, t, h, w = x_bcthw.shape
        qkv = self.qkv(self.norm(x_bcthw))[0]
        qkv_fsc = qkv.permute(0, 2, 3, 4, 1).reshape(b * t, 1, h * w, 3 * c)  # one head per frame
        q, k, v = qkv_fsc.chunk(3, dim=-1)
        out = attention(q, k, v, _FULL).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        return self.proj(out)[0] + x_bcthw


class ResampleModule(nn.Module):
    """:class:`VAEResample` lowered; the ``*3d`` modes stream time through the cache."""

    def __init__(self, node: VAEResample):
        super().__init__()
        self.mode = node.mode
        up = node.mode.startswith("up")
        self.conv = CausalConv3d(node.dim, node.out_dim, (1, 3, 3), padding=(0, 1, 1) if up else 0,
                                 stride=1 if up else (1, 2, 2))
        if node.mode == "up3d":
            self.time_conv = CausalConv3d(node.dim, 2 * node.dim, (3, 1, 1))
        elif node.mode == "down3d":
            self.time_conv = CausalConv3d(node.dim, node.dim, (3, 1, 1), padding=0, stride=(2, 1, 1))

    def forward(self, x_bcthw: torch.Tensor, cache: FeatureCache | None = None) -> torch.Tensor:
        x = x_bcthw
        if self.mode == "up3d":
            x = self._time_up(x, cache)
        if self.mode.startswith("up"):
            x = F.interpolate(x.float(), scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact").type_as(x)
        else:
            x = F.pad(x, (0, 1, 0, 1))
        x = self.conv(x)[0]
        if self.mode == "down3d":
            x = self._time_down(x, cache)
        return x

    def _time_down(self, x: torch.Tensor, cache: FeatureCache | None) -> torch.Tensor:
        """Frame 0 of the clip kept; a stride-2 (3,1,1) conv over the stream of frames 0, 1, 2, ..."""
        pending = None if cache is None else cache.get(self)
        if pending is None:
            head, stream = x[:, :, :1], x
        else:
            head, stream = x[:, :, :0], torch.cat([pending, x], 2)
        windows = (stream.shape[2] - 1) // 2
        out = head
        if windows:
            out = torch.cat([head, self.time_conv(stream[:, :, :2 * windows + 1])[0]], 2)
        if cache is not None:
            cache[self] = stream[:, :, 2 * windows:].clone()
        return out

    def _time_up(self, x: torch.Tensor, cache: FeatureCache | None) -> torch.Tensor:
        """Frame 0 of the clip kept; each later frame -> two frames by a causal (3,1,1) conv to 2 x channels."""
        started = cache is not None and self in cache
        head, rest = (x[:, :, :0], x) if started else (x[:, :, :1], x[:, :, 1:])
        conv_cache = cache[self] if started else rest[:, :, :0]
        if rest.shape[2]:
            y, conv_cache = self.time_conv(rest, conv_cache)
            b, c2, t, h, w = y.shape
            y = y.reshape(b, 2, c2 // 2, t, h, w)
            y = torch.stack((y[:, 0], y[:, 1]), 3).reshape(b, c2 // 2, 2 * t, h, w)
            head = torch.cat([head, y], 2)
        if cache is not None:
            cache[self] = conv_cache.clone() if conv_cache.shape[2] == 0 else conv_cache
        return head


register_lowering(CausalConv3D)(lambda node: CausalConv3d(node.in_channels, node.out_channels, node.kernel))
register_lowering(ChannelRMSNorm)(ChannelRMSNormModule)
register_lowering(VAEResBlock)(ResBlockModule)
register_lowering(VAEAttention)(AttentionModule)
register_lowering(VAEResample)(ResampleModule)
