"""M-RoPE and vision 2D RoPE tensors: cos/sin tables and the rotation of q and k.

Computed as HF ``transformers``' Qwen2-VL does (float32 inverse frequencies and
angles, ``cat(freqs, freqs)`` layout, ``rotate_half``), so logits match
``Qwen2VLForConditionalGeneration`` to float32 rounding. The text tables are cast
to the activation dtype; the vision tables stay float32 and the vision rotation
runs in float32 (``apply_rotary_pos_emb_vision``).

Legend: ``pos_3bs`` (3, batch, seq) int64 (t, h, w) position ids; ``pos_n2``
(tokens, 2) int64 (row, column) of each patch; ``x_bhsd`` (batch, heads, seq, head_dim).
"""

from __future__ import annotations

import torch

from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._rope import RoPE
from lf_ir._rope_torch import apply_rope, rope_inv_freq


def mrope_cos_sin(rope: MRoPE, head_dim: int, pos_3bs: torch.Tensor,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (batch, seq, head_dim) in ``dtype``, for M-RoPE positions ``pos_3bs``.

    Frequency ``i`` of ``head_dim / 2`` rotates by the t, h or w id, whichever band of
    ``rope.sections`` it falls in (Qwen2-VL, arXiv 2409.12191).

    Raises:
        ValueError: ``pos_3bs`` is not (3, batch, seq).

    Example:
        >>> cos, sin = mrope_cos_sin(MRoPE(theta=1e4, sections=(1, 1, 2)), 8, torch.zeros(3, 1, 5, dtype=torch.long),
        ...                          torch.float32)
        >>> cos.shape, float(cos.min())
        (torch.Size([1, 5, 8]), 1.0)
    """
    if pos_3bs.dim() != 3 or pos_3bs.shape[0] != 3:
        raise ValueError(f"M-RoPE positions must be (3, batch, seq), got shape {tuple(pos_3bs.shape)}")
    inv_freq = rope_inv_freq(RoPE(theta=rope.theta), head_dim, pos_3bs.device)
    band = torch.repeat_interleave(torch.arange(3, device=pos_3bs.device),
                                   torch.tensor(rope.sections, device=pos_3bs.device))  # (head_dim/2,)
    pos_bsf = pos_3bs.permute(1, 2, 0)[..., band]  # the id each frequency rotates by
    freqs_bsf = pos_bsf.to(torch.float32) * inv_freq
    emb = torch.cat((freqs_bsf, freqs_bsf), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def vision_rope_cos_sin(rope: VisionRoPE, head_dim: int, pos_n2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin tables, each (tokens, head_dim), for patch (row, column) positions ``pos_n2``.

    Layout per half: ``head_dim / 4`` row frequencies then ``head_dim / 4`` column
    frequencies, ``inv_freq = theta ** (-2i / (head_dim / 2))``.

    Raises:
        ValueError: ``pos_n2`` is not (tokens, 2).
    """
    if pos_n2.dim() != 2 or pos_n2.shape[1] != 2:
        raise ValueError(f"vision RoPE positions must be (tokens, 2), got shape {tuple(pos_n2.shape)}")
    inv_freq = rope_inv_freq(RoPE(theta=rope.theta), head_dim // 2, pos_n2.device)
    freqs_n2f = pos_n2.to(torch.float32)[..., None] * inv_freq
    freqs_nf = torch.cat((freqs_n2f[:, 0], freqs_n2f[:, 1]), dim=-1)
    emb = torch.cat((freqs_nf, freqs_nf), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope_fp32(x_bhsd: torch.Tensor, cos_bsd: torch.Tensor, sin_bsd: torch.Tensor) -> torch.Tensor:
    """:func:`lf_ir.apply_rope` computed in float32 and cast back to ``x_bhsd.dtype`` (the ViT's rotation)."""
    return apply_rope(x_bhsd.float(), cos_bsd.float(), sin_bsd.float()).to(x_bhsd.dtype)
