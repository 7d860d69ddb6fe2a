"""Tensors of the 3D rotary embedding (:class:`lf_ir._nodes_video.RoPE3D`) and its application.

The angles are computed in float64 and the cos/sin tables cast to float32, as
diffusers' ``WanRotaryPosEmbed`` does, so the tables are bit-identical to the peer's.

Legend: ``x_bshd`` is (batch, tokens, heads, head_dim); tokens are in (frame, row, column) order.
"""

from __future__ import annotations

import torch

from lf_ir._nodes_video import RoPE3D


def rope3d_cos_sin(rope: RoPE3D, head_dim: int, grid: tuple[int, int, int],
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (1, f*h*w, 1, head_dim) float32 for a latent token grid (f, h, w).

    Feature ``2i`` and ``2i + 1`` share an angle (interleaved pairs); the head's
    features are the t, h and w groups of ``rope.split(head_dim)`` in that order.

    Raises:
        ValueError: a grid axis larger than ``rope.max_seq_len``.
    """
    if max(grid) > rope.max_seq_len:
        raise ValueError(f"latent token grid {grid} exceeds the rope's max_seq_len {rope.max_seq_len} per axis")
    angles = []
    for axis, (size, feats) in enumerate(zip(grid, rope.split(head_dim), strict=True)):
        inv_freq = 1.0 / rope.theta ** (torch.arange(0, feats, 2, dtype=torch.float64, device=device) / feats)
        pos = torch.arange(size, dtype=torch.float64, device=device)
        angle = torch.outer(pos, inv_freq).repeat_interleave(2, dim=1)  # (size, feats)
        shape = [1, 1, 1, feats]
        shape[axis] = size
        angles.append(angle.view(shape).expand(*grid, feats))
    angle = torch.cat(angles, dim=-1).reshape(1, -1, 1, head_dim)
    return angle.cos().float(), angle.sin().float()


def apply_rope3d(x_bshd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each interleaved pair (x[2i], x[2i+1]) of (batch, tokens, heads, head_dim) by its angle.

    Math in the promoted dtype of ``x`` and the (float32) tables, result in ``x.dtype``.
    """
    x1, x2 = x_bshd.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return out.to(x_bshd.dtype)
