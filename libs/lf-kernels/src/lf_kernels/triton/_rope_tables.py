"""Per-token cos/sin tables for :func:`apply_rotary`: 1D RoPE, M-RoPE (Qwen2-VL) and 3D RoPE (Wan).

Every variant is "angle = position * inverse frequency" per rotated pair; they
differ only in which position (t, h or w) drives which frequencies, so one
kernel serves all and only the tables differ:

- 1D (RoFormer, arXiv 2104.09864; Llama): one position per token, frequencies
  ``theta ** (-2i / dim)``.
- M-RoPE (Qwen2-VL, arXiv 2409.12191): three position ids per token (t, h, w);
  the ``dim/2`` frequencies of one 1D RoPE are cut into ``sections`` (default
  16/24/24 for head_dim 128): the first section's pairs turn with t, the next
  with h, the last with w. Text tokens carry t = h = w, which makes it 1D RoPE.
- 3D RoPE (Wan 2.1, arXiv 2503.20314): the head dim is cut into t/h/w parts
  (``h = w = 2 * (dim // 6)``, t the rest), each with its *own* 1D frequencies
  over its own width, positions from the (frames, height, width) latent grid.

A table covers ``rot = 2 * (number of pairs)`` features; ``interleaved=False``
lays it out ``cat(f, f)`` (rotate half, HF transformers), ``interleaved=True``
as ``repeat_interleave(f, 2)`` (complex pairs, Wan / diffusers). Angles are
multiplied in the inverse frequencies' precision (float32 as HF transformers,
float64 as diffusers' Wan), cos/sin taken in float64 and cast to ``dtype``
(default float32).

Legend: ``s`` seq (tokens), ``f`` pairs (``rot / 2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["mrope_tables", "rope3d_tables", "rope_inv_freq", "rope_tables", "sectioned_rope_tables"]


def rope_inv_freq(dim: int, theta: float = 10000.0, *, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2i / dim)`` for ``i < dim // 2``, radians per position.

    ``dtype=torch.float32`` rounds as HF transformers does; Wan / diffusers use float64.

    Raises:
        ValueError: ``dim`` not a positive even number, or ``theta <= 1``.

    Example:
        >>> rope_inv_freq(4).tolist()
        [1.0, 0.009999999776482582]
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"rope_inv_freq: dim must be a positive even number, got {dim}")
    if theta <= 1:
        raise ValueError(f"rope_inv_freq: theta must be > 1, got {theta}")
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(dtype) / dim
    return 1.0 / (theta ** exponent)


def _tables(freqs_sf: torch.Tensor, interleaved: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    emb = freqs_sf.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs_sf, freqs_sf), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, *, interleaved: bool = False,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """1D RoPE tables: ``angle[..., s, i] = positions[..., s] * inv_freq[i]``.

    Args:
        positions: ``(seq,)`` or ``(batch, seq)``, integer or float.
        inv_freq: ``(rot / 2,)``, e.g. :func:`rope_inv_freq` (or a scaled one, Llama 3.1).

    Returns:
        ``(cos, sin)``, each ``positions.shape + (rot,)`` in ``dtype``.

    Example:
        >>> cos, sin = rope_tables(torch.arange(6), rope_inv_freq(8))
        >>> cos.shape
        torch.Size([6, 8])
    """
    angle_dtype = torch.promote_types(inv_freq.dtype, torch.float32)
    freqs_sf = positions.to(angle_dtype)[..., None] * inv_freq.to(positions.device, angle_dtype)
    return _tables(freqs_sf.double(), interleaved, dtype)


def sectioned_rope_tables(positions: torch.Tensor, inv_freqs: Sequence[torch.Tensor], *,
                          interleaved: bool = False, dtype: torch.dtype = torch.float32
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables where section ``k`` of the pairs turns with its own positions ``positions[k]``.

    The pair frequencies are ``cat(inv_freqs)``; pair ``i`` in section ``k``
    has angle ``positions[k, ..., s] * inv_freqs[k][i']``.

    Args:
        positions: ``(sections, seq)`` or ``(sections, batch, seq)``.
        inv_freqs: ``sections`` 1-D tensors; their lengths sum to ``rot / 2``.

    Returns:
        ``(cos, sin)``, each ``positions.shape[1:] + (rot,)`` in ``dtype``.

    Raises:
        ValueError: ``positions.shape[0] != len(inv_freqs)``.
    """
    if positions.shape[0] != len(inv_freqs):
        raise ValueError(f"sectioned_rope_tables: positions has {positions.shape[0]} sections, "
                         f"inv_freqs has {len(inv_freqs)}")
    parts = []
    for pos, inv in zip(positions, inv_freqs, strict=True):
        angle_dtype = torch.promote_types(inv.dtype, torch.float32)
        parts.append(pos.to(angle_dtype)[..., None] * inv.to(pos.device, angle_dtype))
    return _tables(torch.cat([p.double() for p in parts], dim=-1), interleaved, dtype)


def mrope_tables(position_ids: torch.Tensor, head_dim: int, sections: Sequence[int] = (16, 24, 24),
                 theta: float = 10000.0, *, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL M-RoPE tables (rotate half), as ``Qwen2VLRotaryEmbedding`` of transformers builds them.

    Args:
        position_ids: ``(3, batch, seq)`` t/h/w position ids (``get_rope_index`` of Qwen2-VL).
        head_dim: attention head dim; ``sum(sections) == head_dim // 2``.
        sections: pairs per t/h/w section (``rope_scaling["mrope_section"]``).

    Returns:
        ``(cos, sin)``, each ``(batch, seq, head_dim)`` in ``dtype``.

    Raises:
        ValueError: ``position_ids`` not ``(3, batch, seq)`` or sections not summing to ``head_dim // 2``.
    """
    if position_ids.dim() != 3 or position_ids.shape[0] != len(sections):
        raise ValueError(f"mrope_tables: position_ids must be ({len(sections)}, batch, seq), "
                         f"got {tuple(position_ids.shape)}")
    if sum(sections) != head_dim // 2:
        raise ValueError(f"mrope_tables: sections {tuple(sections)} must sum to head_dim // 2 = {head_dim // 2}")
    inv = rope_inv_freq(head_dim, theta, device=position_ids.device)
    return sectioned_rope_tables(position_ids, list(inv.split(list(sections))), dtype=dtype)


def rope3d_tables(frames: int, height: int, width: int, head_dim: int, theta: float = 10000.0, *,
                  interleaved: bool = True, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan 3D RoPE tables over a (frames, height, width) grid of patches, tokens frame-major.

    Head dim split as Wan / diffusers ``WanRotaryPosEmbed``: ``h = w = 2 * (head_dim // 6)``
    features, t the rest, each part with float64 frequencies over its own width.
    ``interleaved=True`` matches Wan's complex pairs; ``False`` gives the same
    rotation in rotate-half order (for q/k projections whose rows were permuted).

    Returns:
        ``(cos, sin)``, each ``(frames * height * width, head_dim)`` in ``dtype``.

    Raises:
        ValueError: a non-positive grid size or ``head_dim`` not a multiple of 2 or below 6.
    """
    if min(frames, height, width) <= 0:
        raise ValueError(f"rope3d_tables: grid must be positive, got {(frames, height, width)}")
    if head_dim < 6 or head_dim % 2:
        raise ValueError(f"rope3d_tables: head_dim must be even and >= 6, got {head_dim}")
    hw_dim = 2 * (head_dim // 6)
    dims = (head_dim - 2 * hw_dim, hw_dim, hw_dim)
    grid = torch.meshgrid(*(torch.arange(n, device=device) for n in (frames, height, width)), indexing="ij")
    positions = torch.stack([g.reshape(-1) for g in grid])
    inv_freqs = [rope_inv_freq(d, theta, device=device, dtype=torch.float64) for d in dims]
    return sectioned_rope_tables(positions, inv_freqs, interleaved=interleaved, dtype=dtype)
