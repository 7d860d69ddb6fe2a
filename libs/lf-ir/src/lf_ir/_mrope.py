"""Multimodal rotary embedding settings: M-RoPE for the LLM, axial 2D RoPE for the ViT.

M-RoPE (Qwen2-VL, Wang et al. 2024, arXiv 2409.12191, sec. 2.1) gives every token
three position ids (temporal, height, width). The ``head_dim / 2`` rotary
frequencies ``theta ** (-2i / head_dim)`` are cut into three consecutive bands of
``sections = (t, h, w)`` frequencies; band ``j`` rotates by the ``j``-th position
id. Text tokens carry three equal ids, so M-RoPE reduces to 1D RoPE on text. The
feature pairing is "rotate half" (``i`` with ``i + head_dim/2``), as in HF
``transformers``' ``Qwen2VLRotaryEmbedding``.

Vision 2D RoPE (the Qwen2-VL ViT): ``head_dim / 4`` frequencies
``theta ** (-2i / (head_dim / 2))`` rotate the first quarter of each half by the
patch row and the second quarter by the patch column (transformers'
``Qwen2VLVisionRotaryEmbedding``, "axial" rope type).

Both settings are tagged structs (``kind`` field) so an attention node carries
either in JSON. This module is torch-free; tensors come from ``_mrope_torch.py``.
"""

from __future__ import annotations

import math

import msgspec


class MRoPE(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="mrope"):
    """Multimodal RoPE settings (temporal / height / width frequency bands).

    Example:
        >>> MRoPE(theta=1e6, sections=(16, 24, 24)).problem(head_dim=128) is None
        True
    """

    theta: float = 1000000.0
    """Base of the geometric frequency progression (HF ``rope_theta``)."""
    sections: tuple[int, int, int] = (16, 24, 24)
    """Frequencies per band (t, h, w) (HF ``mrope_section``); they sum to ``head_dim / 2``."""

    def problem(self, head_dim: int) -> str | None:
        """Why these settings cannot rotate heads of ``head_dim`` features (None if they can)."""
        if head_dim % 2:
            return f"head_dim must be even, got {head_dim}"
        if not self.theta > 0 or not math.isfinite(self.theta):
            return f"theta must be a positive finite number, got {self.theta!r}"
        if len(self.sections) != 3 or any(not isinstance(s, int) or s < 0 for s in self.sections):
            return f"mrope sections must be three integers >= 0 (t, h, w), got {list(self.sections)}"
        if 2 * sum(self.sections) != head_dim:
            return (f"mrope sections {list(self.sections)} sum to {sum(self.sections)} but must sum to "
                    f"head_dim / 2 = {head_dim // 2}")
        return None


class VisionRoPE(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="vision_2d"):
    """Axial 2D RoPE settings of a ViT (row and column of each patch).

    Example:
        >>> VisionRoPE(theta=10000.0).problem(head_dim=80) is None
        True
    """

    theta: float = 10000.0
    """Base of the geometric frequency progression (HF vision ``rope_theta``)."""

    def problem(self, head_dim: int) -> str | None:
        """Why these settings cannot rotate heads of ``head_dim`` features (None if they can)."""
        if head_dim % 4:
            return f"head_dim must be divisible by 4 for 2D rotary embedding, got {head_dim}"
        if not self.theta > 0 or not math.isfinite(self.theta):
            return f"theta must be a positive finite number, got {self.theta!r}"
        return None
