"""RoPE tensors: inverse frequencies, cos/sin tables and the rotation of q and k.

Computed exactly as HF ``transformers`` does for Llama (float32 inverse
frequencies and angles, ``cat(freqs, freqs)`` layout, ``rotate_half``), so
logits match ``LlamaForCausalLM`` to float32 rounding. Angles are always float32
(as in Meta's and HF's Llama code), then cast to the activation dtype.

Legend: ``x_bhsd`` is (batch, heads, seq, head_dim); ``pos_bs`` is (batch, seq) int64.
"""

from __future__ import annotations

import math

import torch

from lf_ir._rope import RoPE


def rope_inv_freq(rope: RoPE, head_dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies (head_dim // 2,) float32, radians per position.

    Plain: ``theta ** (-2i / head_dim)``. ``rope.scaling == "llama3"``: Llama 3.1
    scaling (see :mod:`lf_ir._rope`), the formula of transformers'
    ``_compute_llama3_parameters``.

    Example:
        >>> rope_inv_freq(RoPE(theta=10000.0), 4).tolist()
        [1.0, 0.009999999776482582]
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta ** exponent)
    if rope.scaling != "llama3":
        return inv_freq
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(rope: RoPE, head_dim: int, pos_bs: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (batch, seq, head_dim) in ``dtype``, for positions ``pos_bs``."""
    inv_freq = rope_inv_freq(rope, head_dim, pos_bs.device)
    freqs_bsf = pos_bs.to(torch.float32)[..., None] * inv_freq  # outer product, float32
    emb = torch.cat((freqs_bsf, freqs_bsf), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x_bhsd: torch.Tensor, cos_bsd: torch.Tensor, sin_bsd: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) features by the angles of ``cos_bsd`` / ``sin_bsd``."""
    cos, sin = cos_bsd.unsqueeze(1), sin_bsd.unsqueeze(1)
    return (x_bhsd * cos) + (_rotate_half(x_bhsd) * sin)
