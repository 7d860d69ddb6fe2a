"""Causal 3D convolution with a feature cache, for video VAEs that encode a clip chunk by chunk.

A convolution is *causal in time* when every temporal padding frame goes on
the left, so output frame ``t`` sees input frames ``<= t`` only. Then a clip
cut into chunks along time gives the same output as the whole clip, provided
each chunk is prefixed with the last ``pad_t`` input frames of the chunks
before it: the *feature cache* (Wan 2.1's causal VAE, arXiv 2503.20314,
section 3.1; diffusers' ``WanCausalConv3d``). :func:`causal_conv3d` takes the
cache of the previous chunk and returns the cache for the next one, so the
caller only threads it through.

On CUDA the input and weight are put in the ``channels_last_3d`` memory format
(cuDNN's fastest 3D convolution layout, and the one ``torch.cat`` along time
keeps); on the CPU the tensors are used as they come.

Legend: ``x_bcthw`` is (batch, channels, frames, height, width);
``w_oikkk`` is (out_channels, in_channels, kernel_t, kernel_h, kernel_w).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalConv3d", "causal_conv3d"]


def _triple(value: int | tuple[int, int, int], what: str) -> tuple[int, int, int]:
    triple = (value,) * 3 if isinstance(value, int) else tuple(value)
    if len(triple) != 3 or any(not isinstance(v, int) or v < 0 for v in triple):
        raise ValueError(f"causal_conv3d: {what} must be an int or 3 non-negative ints, got {value!r}")
    return triple  # type: ignore[return-value]


def causal_conv3d(x_bcthw: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  padding: int | tuple[int, int, int], cache: torch.Tensor | None = None,
                  stride: int | tuple[int, int, int] = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """3D convolution, causal in time, that continues a clip from the cache of its previous chunk.

    The input is prefixed along time by ``cache`` (the previous chunks' last
    frames) topped up with zero frames to ``pad_t`` frames, padded by ``pad_h`` /
    ``pad_w`` zeros on both sides in space, and convolved with no temporal padding.
    Cutting a clip into chunks and threading the cache gives the whole clip's
    output (exactly, up to float summation order).

    Args:
        x_bcthw: input (batch, in_channels, frames, height, width), float.
        weight: ``w_oikkk`` (out_channels, in_channels, kernel_t, kernel_h, kernel_w), dtype of ``x``.
        bias: (out_channels,) or None.
        padding: ``(pad_t, pad_h, pad_w)`` or one int: ``pad_t`` zero frames on the left in time
            (``kernel_t - 1`` keeps the frame count), ``pad_h`` / ``pad_w`` zeros on each side in space.
        cache: the previous chunk's ``new_cache``, (batch, in_channels, <= pad_t, height, width);
            None (or zero frames) at the start of a clip.
        stride: ``(stride_t, stride_h, stride_w)`` or one int; a cache needs ``stride_t == 1``.

    Returns:
        ``(out, new_cache)``: out (batch, out_channels, frames', height', width') with
        ``frames' = (pad_t + frames - kernel_t) // stride_t + 1`` (``frames`` for stride 1 and
        ``pad_t = kernel_t - 1``), and new_cache, a copy of the last ``pad_t`` frames of the cache
        followed by ``x`` (fewer when there are fewer), to pass with the next chunk.

    Raises:
        ValueError: on a shape mismatch between ``x``, ``weight``, ``bias`` or ``cache``, a
            ``pad_t`` of zero with a non-empty cache, or a cache with ``stride_t != 1``; the
            message names the argument and the value received.

    Example:
        >>> x = torch.randn(1, 4, 9, 8, 8); w = torch.randn(6, 4, 3, 3, 3)
        >>> full, _ = causal_conv3d(x, w, None, (2, 1, 1))
        >>> a, c = causal_conv3d(x[:, :, :1], w, None, (2, 1, 1))
        >>> b, _ = causal_conv3d(x[:, :, 1:], w, None, (2, 1, 1), cache=c)
        >>> torch.allclose(torch.cat([a, b], 2), full, atol=1e-5)
        True
    """
    pad_t, pad_h, pad_w = _triple(padding, "padding")
    stride_t, stride_h, stride_w = _triple(stride, "stride")
    if x_bcthw.dim() != 5 or weight.dim() != 5:
        raise ValueError(f"causal_conv3d: x and weight must be 5-D, got x {tuple(x_bcthw.shape)} and "
                         f"weight {tuple(weight.shape)}")
    if x_bcthw.shape[1] != weight.shape[1]:
        raise ValueError(f"causal_conv3d: x has {x_bcthw.shape[1]} channels but weight expects "
                         f"{weight.shape[1]} (weight {tuple(weight.shape)})")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"causal_conv3d: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if min(stride_t, stride_h, stride_w) < 1:
        raise ValueError(f"causal_conv3d: stride must be positive, got {stride!r}")
    cached = 0 if cache is None else cache.shape[2]
    if cache is not None:
        if stride_t != 1 and cached:
            raise ValueError(f"causal_conv3d: a cache needs stride_t 1, got stride {stride!r}")
        want = (x_bcthw.shape[0], x_bcthw.shape[1], x_bcthw.shape[3], x_bcthw.shape[4])
        have = (cache.shape[0], cache.shape[1], cache.shape[3], cache.shape[4])
        if cache.dim() != 5 or have != want or cached > pad_t:
            raise ValueError(f"causal_conv3d: cache must be (batch, channels, <= pad_t={pad_t}, height, width) "
                             f"matching x {tuple(x_bcthw.shape)}, got {tuple(cache.shape)}")
    layout = torch.channels_last_3d if x_bcthw.is_cuda else torch.contiguous_format
    parts = [x_bcthw]
    if cached:
        parts.insert(0, cache.to(device=x_bcthw.device, dtype=x_bcthw.dtype))
    if pad_t - cached > 0:
        b, c, _, h, w = x_bcthw.shape
        parts.insert(0, x_bcthw.new_zeros(b, c, pad_t - cached, h, w))
    stream = torch.cat(parts, dim=2) if len(parts) > 1 else x_bcthw
    if x_bcthw.is_cuda:
        stream, weight = stream.contiguous(memory_format=layout), weight.contiguous(memory_format=layout)
    out = F.conv3d(stream, weight, bias, stride=(stride_t, stride_h, stride_w), padding=(0, pad_h, pad_w))
    keep = min(pad_t, cached + x_bcthw.shape[2])
    new_cache = stream[:, :, stream.shape[2] - keep:].clone()
    return out, new_cache


class CausalConv3d(nn.Module):
    """A learned :func:`causal_conv3d`: ``forward(x, cache=None) -> (out, new_cache)``.

    Parameters ``weight`` (out_channels, in_channels, kernel_t, kernel_h, kernel_w) and
    ``bias`` (out_channels,), initialized like ``nn.Conv3d``. The default padding keeps
    the frame count and the spatial size for odd kernels:
    ``(kernel_t - 1, kernel_h // 2, kernel_w // 2)``.

    Raises:
        ValueError: non-positive channels or kernel sizes (naming the value).

    Example:
        >>> conv = CausalConv3d(3, 8, 3)
        >>> out, cache = conv(torch.randn(1, 3, 5, 16, 16))
        >>> out.shape, cache.shape[2]
        (torch.Size([1, 8, 5, 16, 16]), 2)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int, int],
                 padding: int | tuple[int, int, int] | None = None, stride: int | tuple[int, int, int] = 1,
                 bias: bool = True):
        super().__init__()
        kernel = _triple(kernel_size, "kernel_size")
        if min(kernel) < 1 or in_channels < 1 or out_channels < 1:
            raise ValueError(f"CausalConv3d: channels and kernel sizes must be positive, got in_channels="
                             f"{in_channels}, out_channels={out_channels}, kernel_size={kernel_size!r}")
        self.kernel_size = kernel
        self.padding = _triple(padding, "padding") if padding is not None else (
            kernel[0] - 1, kernel[1] // 2, kernel[2] // 2)
        self.stride = _triple(stride, "stride")
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *kernel))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Conv3d``'s default init (Kaiming-uniform weight, uniform bias)."""
        if self.weight.is_meta:
            return
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight[0].numel())
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x_bcthw: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return causal_conv3d(x_bcthw, self.weight, self.bias, self.padding, cache, self.stride)

    def extra_repr(self) -> str:
        o, i = self.weight.shape[:2]
        return f"{i}, {o}, kernel_size={self.kernel_size}, padding={self.padding}, stride={self.stride}"
