"""Index layout of the tile + halo ``window_3d`` decomposition, and the work counts that pick its tile.

See :mod:`lf_kernels._window_halo` for the method. A :class:`HaloLayout` holds, for one ``(spec,
tile)``, where each tile's query slots and halo key slots sit in the token sequence, which slots lie
outside the grid (padding), and the fixed relative pattern between a query slot and a halo slot.
Radii are clipped to the grid (``r = min(w // 2, n - 1)``), which removes no kept pair but shrinks
halos on short axes.

Legend: ``n`` tiles, ``ab`` query slots of a tile (``a * b``), ``s`` sequence, ``h`` kv heads.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ._mask import MaskSpec

__all__ = ["KERNEL_ROWS", "HaloLayout", "choose_tile", "halo_entries", "halo_layout", "row_indices"]

KERNEL_ROWS = 64
"""Query / key granularity of the fused attention kernels, used to round work in :func:`choose_tile`."""
_MAX_TILE_SIDE = 32


@dataclass(frozen=True, eq=False)
class HaloLayout:
    """Index tensors of one ``(spec, tile)`` decomposition (see module docstring); built by :func:`halo_layout`."""

    tile: tuple[int, int]
    """``(a, b)``: query tile height and width in tokens."""
    n_tiles: int
    halo: int
    """Halo slots per tile."""
    q_index: torch.Tensor
    """``(n, a*b)`` int64 token position of each query slot (0 for padding slots)."""
    q_real: torch.Tensor
    """``(n, a*b)`` bool, query slot inside the grid."""
    k_index: torch.Tensor
    """``(n, halo)`` int64 token position of each halo slot (0 for padding slots)."""
    k_real: torch.Tensor
    """``(n, halo)`` bool, halo slot inside the grid."""
    pattern: torch.Tensor
    """``(a*b, halo)`` bool, the relative window rule between a tile slot and a halo slot."""
    slot_of_token: torch.Tensor
    """``(s,)`` int64, ``tile * a*b + local`` slot of each token."""


def _radii(spec: MaskSpec) -> tuple[int, int, int]:
    return tuple(min(w // 2, n - 1) for w, n in zip(spec.window, spec.grid, strict=True))


def _halo_shape(spec: MaskSpec, tile: tuple[int, int]) -> tuple[int, int, int]:
    rt, rh, rw = _radii(spec)
    return (rt + 1 if spec.causal_t else 2 * rt + 1), tile[0] + 2 * rh, tile[1] + 2 * rw


def _n_tiles(spec: MaskSpec, tile: tuple[int, int]) -> int:
    t_size, h_size, w_size = spec.grid
    return t_size * -(-h_size // tile[0]) * -(-w_size // tile[1])


def halo_entries(spec: MaskSpec, tile: tuple[int, int]) -> int:
    """Score entries the halo layout computes per (batch, query head): ``n_tiles * a*b * halo``.

    Divided by :func:`lf_kernels._keep.kept_entries` this is the dense work ratio of the layout.
    """
    return _n_tiles(spec, tile) * tile[0] * tile[1] * math.prod(_halo_shape(spec, tile))


@functools.lru_cache(maxsize=64)
def choose_tile(spec: MaskSpec, group: int = 1, *, rows: int = KERNEL_ROWS) -> tuple[int, int]:
    """The query tile ``(a, b)`` with the least kernel work for ``spec`` (``window_3d``).

    Work counts ``n_tiles * roundup(a*b*group, rows) * roundup(halo, rows)``: the kernels compute
    blocks of ``rows`` queries / keys, so with 64 a tile of 65 queries costs as much as one of 128.
    Ties go to larger tiles. Sides up to 32 tokens (or the grid side) are searched. Bench shape
    (21, 30, 52), window (3, 9, 9), group 1: ``(10, 6)`` (567 tiles, 756-key halos) with 64-row
    blocks, ``(16, 8)`` with 128-row blocks.
    """
    _, h_size, w_size = spec.grid

    def cost(tile):
        q_rows = -(-tile[0] * tile[1] * group // rows) * rows
        keys = -(-math.prod(_halo_shape(spec, tile)) // rows) * rows
        return _n_tiles(spec, tile) * q_rows * keys, -tile[0] * tile[1]

    sides_h, sides_w = range(1, min(h_size, _MAX_TILE_SIDE) + 1), range(1, min(w_size, _MAX_TILE_SIDE) + 1)
    return min(((a, b) for a in sides_h for b in sides_w), key=cost)


@functools.lru_cache(maxsize=64)
@functools.lru_cache(maxsize=32)
def halo_layout(spec: MaskSpec, tile: tuple[int, int], device: str = "cpu") -> HaloLayout:
    """Build (and cache) the index tensors of the tile + halo decomposition of a ``window_3d`` spec.

    Raises:
        ValueError: ``spec`` not ``window_3d``, or a tile side < 1.
    """
    if spec.kind != "window_3d":
        raise ValueError(f"halo_layout needs a window_3d MaskSpec, got kind={spec.kind!r}")
    if len(tile) != 2 or any(not isinstance(x, int) or x < 1 for x in tile):
        raise ValueError(f"tile must be two ints >= 1 (a, b), got {tile!r}")
    (t_size, h_size, w_size), (a, b) = spec.grid, tile
    rt, rh, rw = _radii(spec)
    et, eh, ew = _halo_shape(spec, tile)
    nh, nw = -(-h_size // a), -(-w_size // b)
    ar = functools.partial(torch.arange, device=device)
    # Tile origin (t, row, col), shape (n, 1, 1, 1).
    tt, ti, tj = (x.reshape(-1, 1, 1, 1) for x in torch.meshgrid(ar(t_size), ar(nh) * a, ar(nw) * b, indexing="ij"))
    # Query slots (n, 1, a, b).
    qh, qw = ti + ar(a)[:, None], tj + ar(b)[None, :]
    q_real = ((qh < h_size) & (qw < w_size)).expand(-1, 1, a, b)
    q_index = torch.where(q_real, (tt * h_size + qh) * w_size + qw, 0)
    # Halo slots (n, et, eh, ew).
    kt = tt + ar(et)[:, None, None] - rt
    kh = ti + ar(eh)[:, None] - rh
    kw = tj + ar(ew) - rw
    k_real = (kt >= 0) & (kt < t_size) & (kh >= 0) & (kh < h_size) & (kw >= 0) & (kw < w_size)
    k_index = torch.where(k_real, (kt * h_size + kh) * w_size + kw, 0)
    # Relative rule: halo slot (dt, yy, xx) vs tile slot (y, x); every halo frame is in the t window.
    dh = ar(eh)[None, None, :, None] - rh - ar(a)[:, None, None, None]  # (a, 1, eh, 1)
    dw = ar(ew)[None, None, None, :] - rw - ar(b)[None, :, None, None]  # (1, b, 1, ew)
    pattern = ((dh.abs() <= rh) & (dw.abs() <= rw))[:, :, None].expand(a, b, et, eh, ew)
    n = t_size * nh * nw
    q_real, q_index = q_real.reshape(n, a * b), q_index.reshape(n, a * b)
    slot_of_token = torch.empty(t_size * h_size * w_size, dtype=torch.long, device=device)
    slot_of_token[q_index[q_real]] = ar(n * a * b).reshape(n, a * b)[q_real]
    return HaloLayout(
        tile=tile, n_tiles=n, halo=et * eh * ew, q_index=q_index, q_real=q_real,
        k_index=k_index.expand(n, et, eh, ew).reshape(n, -1), k_real=k_real.expand(n, et, eh, ew).reshape(n, -1),
        pattern=pattern.reshape(a * b, -1), slot_of_token=slot_of_token,
    )


@functools.lru_cache(maxsize=64)
def row_indices(layout: HaloLayout, batch: int, seq: int, heads_kv: int):
    """Rows into ``(b*s*h, .)`` for the q and k gathers and into ``(b*n*h*ab, .)`` for the way back."""
    dev = layout.q_index.device
    b_off = (torch.arange(batch, device=dev) * seq)[:, None, None, None]
    h = torch.arange(heads_kv, device=dev)[None, None, :, None]
    q_rows = ((b_off + layout.q_index[None, :, None, :]) * heads_kv + h).reshape(-1)  # (b, n, h, ab)
    k_rows = ((b_off + layout.k_index[None, :, None, :]) * heads_kv + h).reshape(-1)  # (b, n, h, k)
    ab = layout.q_index.shape[1]
    tile_s, local_s = layout.slot_of_token // ab, layout.slot_of_token % ab
    b_tiles = (torch.arange(batch, device=dev) * layout.n_tiles)[:, None, None]
    out_rows = (((b_tiles + tile_s[None, :, None]) * heads_kv + h[..., 0]) * ab + local_s[None, :, None]).reshape(-1)
    return q_rows, k_rows, out_rows
