"""Rotary position embedding (RoPE) settings, carried by an ``Attention`` node.

1D RoPE (Su et al., "RoFormer", arXiv 2104.09864) rotates each (i, i + head_dim/2)
pair of q and k features by the angle ``position * inv_freq[i]`` with
``inv_freq[i] = theta ** (-2i / head_dim)``. The pairing is the "rotate half"
convention of HF ``transformers`` (and of Meta's Llama checkpoints as converted
to HF), so HF weights load without permuting q/k rows.

``scaling="llama3"`` applies the Llama 3.1 frequency scaling (Meta's
``apply_scaling``; transformers' ``_compute_llama3_parameters``): wavelengths
longer than ``original_max_position_embeddings / low_freq_factor`` are divided
by ``factor``, those shorter than ``original_max_position_embeddings /
high_freq_factor`` kept, and those in between interpolated smoothly.

This module is torch-free; the tensors are built by ``_rope_torch.py``.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec


class RoPE(msgspec.Struct, frozen=True, kw_only=True):
    """1D rotary embedding settings (plain, or with Llama-3 frequency scaling).

    Example:
        >>> RoPE(theta=500000.0, scaling="llama3", factor=8.0).problem(head_dim=128) is None
        True
    """

    theta: float = 10000.0
    """Base of the geometric frequency progression (``rope_theta``)."""
    scaling: Literal["none", "llama3"] = "none"
    """``"none"``: plain RoPE; ``"llama3"``: Llama 3.1 frequency scaling."""
    factor: float = 8.0
    """llama3 only: how much low frequencies are slowed (context extension factor)."""
    low_freq_factor: float = 1.0
    """llama3 only: wavelengths above ``original_max_position_embeddings / low_freq_factor`` are scaled."""
    high_freq_factor: float = 4.0
    """llama3 only: wavelengths below ``original_max_position_embeddings / high_freq_factor`` are kept."""
    original_max_position_embeddings: int = 8192
    """llama3 only: context length of the model before extension, in tokens."""

    def problem(self, head_dim: int) -> str | None:
        """Why these settings cannot rotate heads of ``head_dim`` features (None if they can)."""
        if head_dim % 2:
            return f"head_dim must be even, got {head_dim}"
        if not self.theta > 0 or not math.isfinite(self.theta):
            return f"theta must be a positive finite number, got {self.theta!r}"
        if self.scaling not in ("none", "llama3"):
            return f"scaling must be 'none' or 'llama3', got {self.scaling!r}"
        if self.scaling == "llama3":
            if not self.factor > 0:
                return f"factor must be positive, got {self.factor!r}"
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                return (f"need 0 < low_freq_factor < high_freq_factor, got {self.low_freq_factor!r} "
                        f"and {self.high_freq_factor!r}")
            if self.original_max_position_embeddings <= 0:
                return ("original_max_position_embeddings must be positive, got "
                        f"{self.original_max_position_embeddings!r}")
        return None
