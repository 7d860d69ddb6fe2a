"""``window_3d`` attention in tile order: tokens reordered so every 128-token block is a compact box.

FlexAttention (Dong et al. 2024, arXiv 2412.05496) skips the 128 x 128 (query block, key block)
tiles a mask rules out entirely, so its work is ``kept blocks x 128^2``. In the t-major raster
order a block is ~2.5 rows of one frame and its window touches many key blocks: at Wan 2.1 480p
(grid 21 x 30 x 52, window 3 x 9 x 9) Flex computes 8.6x the kept score entries (3,570 blocks).
Sliding-tile attention (Zhang et al. 2025, arXiv 2502.04507) reorders tokens tile by tile
instead. Here a *tile* is a ``(tt, th, tw)`` box of ``tt * th * tw == 128`` tokens; the grid is
padded up to whole tiles and the tokens are laid out tile after tile (tile-major, then t, h, w
inside a tile), so each Flex block is exactly one tile. The same grid with ``(1, 32, 4)`` tiles
keeps 2,257 blocks (5.4x the kept entries, 6.7% padding slots).

Which order: :func:`tile_order` counts the kept blocks of every candidate tile exactly (a block is
one box, clipped to the grid; two boxes share a kept pair iff their per-axis distances are within
the radii, the axes being independent, so a tile layout's count is a product over the axes) and of
the raster order (a block of 128 consecutive raster positions is a union of at most five boxes,
compared pairwise in chunks of query blocks), and takes a tile only when it keeps at most
:data:`MIN_GAIN` of the raster blocks, which pays for the reordering copies. The gain depends on the
grid: at Wan 480p the 30 rows pad to 32 and a 1 x 32 x 4 tile spans whole columns; at 720p
(21 x 45 x 80) no tile beats the raster order and the dispatcher keeps ``flex``.

The call (:func:`attention_window_tiles`): q, k, v are gathered into tile order (padding slots read
token 0), the kernel runs on the padded sequence with the mask in tile coordinates (padding keys
masked; a padding query sees only its own slot, so no row is empty), and out / lse are gathered
back. The backward of each gather is the inverse gather: a padding slot's gradient is discarded,
which is exact because padding queries and keys touch no real token. Kernels: ``"flex"`` (CUDA,
FlexAttention compiled per shape, block mask cached per spec, tile and device) or ``"math"`` (dense bool mask on
the tiled layout, float32-accumulating: the CPU check of the layout).

Legend: ``b`` batch, ``h`` heads, ``s`` sequence (``T * H * W``), ``L`` padded tiled length, ``d`` head dim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

from ._mask import MaskSpec

__all__ = ["BLOCK", "MIN_GAIN", "TileOrder", "attention_window_tiles", "tile_order", "tiled_mask"]

BLOCK = 128
"""FlexAttention's sparse block size (query and key), the size of one tile."""
MIN_GAIN = 0.85
"""Take a tile order only when it keeps at most this share of the raster order's blocks."""
_FAR = -(1 << 20)


@dataclass(frozen=True)
class TileOrder:
    """The token order :func:`tile_order` picks for one ``window_3d`` spec."""

    tile: tuple[int, int, int] | None
    """``(tt, th, tw)`` tokens per tile (product :data:`BLOCK`), or ``None``: keep the raster order."""
    padded: tuple[int, int, int]
    """Grid rounded up to whole tiles (the grid itself for the raster order)."""
    blocks: int
    """Kept ``BLOCK x BLOCK`` blocks in the chosen order."""
    raster_blocks: int
    """Kept blocks in the raster order."""

    @property
    def length(self) -> int:
        """Tokens of the padded, tiled sequence."""
        t, h, w = self.padded
        return t * h * w


def _radii(spec: MaskSpec) -> tuple[int, int, int]:
    return tuple(min(w // 2, n - 1) for w, n in zip(spec.window, spec.grid, strict=True))


def _raster_boxes(grid: tuple[int, int, int]) -> torch.Tensor:
    """``(blocks, 5, 6)`` int64 boxes ``(t0, t1, h0, h1, w0, w1)`` (inclusive; ``t0 > t1``: none) of raster blocks."""
    _, H, W = grid
    n = grid[0] * H * W
    out = torch.full((-(-n // BLOCK), 5, 6), 0, dtype=torch.int64)
    out[:, :, 0] = 1  # empty unless filled
    out[:, :, 1] = 0
    for b, start in enumerate(range(0, n, BLOCK)):
        stop, slot, pos = min(start + BLOCK, n), 0, start
        while pos < stop:  # peel: partial row, partial frame of whole rows, whole frames
            t, rem = divmod(pos, H * W)
            h, w = divmod(rem, W)
            if w or stop - pos < W:
                span = min(W - w, stop - pos)
                box = (t, t, h, h, w, w + span - 1)
            elif h or stop - pos < H * W:
                rows = min(H - h, (stop - pos) // W)
                box, span = (t, t, h, h + rows - 1, 0, W - 1), rows * W
            else:
                frames = (stop - pos) // (H * W)
                box, span = (t, t + frames - 1, 0, H - 1, 0, W - 1), frames * H * W
            out[b, slot] = torch.tensor(box)
            slot, pos = slot + 1, pos + span
    return out


def _kept_tile_blocks(grid: tuple[int, int, int], tile: tuple[int, int, int], radii: tuple[int, int, int],
                      causal_t: bool) -> int:
    """Kept (query tile, key tile) pairs of a tile layout, per axis: the tiles form a product grid and the rule is a
    conjunction of per-axis rules, so the count is the product of each axis's interval pairs within its radius."""
    total = 1
    for axis, (n, size, r) in enumerate(zip(grid, tile, radii, strict=True)):
        lo = torch.arange(0, n, size)
        hi = torch.clamp(lo + size - 1, max=n - 1)
        qa, qb, ka, kb = lo[:, None], hi[:, None], lo[None, :], hi[None, :]
        near = (ka <= qb) & (qa - kb <= r) if axis == 0 and causal_t else (ka - qb <= r) & (qa - kb <= r)
        total *= int(near.sum())
    return total


def _kept_blocks(boxes: torch.Tensor, radii: tuple[int, int, int], causal_t: bool, chunk: int = 64) -> int:
    """Query / key block pairs with at least one kept pair; ``boxes`` ``(blocks, m, 6)``, query = key blocks.

    Query blocks go ``chunk`` at a time, so memory stays ``O(chunk * blocks * m^2)``."""
    return sum(_kept_rows(boxes[i:i + chunk], boxes, radii, causal_t) for i in range(0, boxes.shape[0], chunk))


def _kept_rows(q_boxes: torch.Tensor, boxes: torch.Tensor, radii: tuple[int, int, int], causal_t: bool) -> int:
    q, k = q_boxes[:, None, :, None, :], boxes[None, :, None, :, :]
    ok = torch.ones(q.shape[0], k.shape[1], q.shape[2], k.shape[3], dtype=torch.bool)
    for axis, r in enumerate(radii):
        qa, qb, ka, kb = q[..., 2 * axis], q[..., 2 * axis + 1], k[..., 2 * axis], k[..., 2 * axis + 1]
        ok &= (qa <= qb) & (ka <= kb)
        if axis == 0 and causal_t:  # some t_k <= t_q with t_q - t_k <= r
            ok &= (ka <= qb) & (qa - kb <= r)
        else:
            ok &= (ka - qb <= r) & (qa - kb <= r)
    return int(ok.flatten(2).any(dim=-1).sum())


def _candidates() -> list[tuple[int, int, int]]:
    sizes = [1 << i for i in range(8)]
    return [(tt, th, BLOCK // (tt * th)) for tt in (1, 2, 4) for th in sizes if BLOCK % (tt * th) == 0]


@functools.lru_cache(maxsize=64)
def tile_order(spec: MaskSpec) -> TileOrder:
    """The token order with the fewest kept blocks for a ``window_3d`` spec (module docstring).

    Raises:
        ValueError: ``spec.kind`` is not ``"window_3d"``.
    """
    if spec.kind != "window_3d":
        raise ValueError(f"tile_order needs a window_3d MaskSpec, got kind={spec.kind!r}")
    radii, grid = _radii(spec), spec.grid
    raster = _kept_blocks(_raster_boxes(grid), radii, spec.causal_t)
    best = None
    for tile in _candidates():
        if any(s > 2 * n for s, n in zip(tile, grid, strict=True)):
            continue  # more than half a tile of padding along an axis
        blocks = _kept_tile_blocks(grid, tile, radii, spec.causal_t)
        if best is None or blocks < best[0]:
            best = (blocks, tile)
    if best is None or best[0] > MIN_GAIN * raster:
        return TileOrder(tile=None, padded=grid, blocks=raster, raster_blocks=raster)
    tile = best[1]
    padded = tuple(-(-n // s) * s for n, s in zip(grid, tile, strict=True))
    return TileOrder(tile=tile, padded=padded, blocks=best[0], raster_blocks=raster)


@functools.lru_cache(maxsize=16)
def _layout(spec: MaskSpec, tile: tuple[int, int, int], device: str) -> tuple[torch.Tensor, ...]:
    """``(gather (L,), scatter (s,), coords (3, L))``: token read by each tiled slot (0 for padding), slot
    of each token, and each slot's ``(t, h, w)`` int32 (``_FAR`` for padding)."""
    (tt, th, tw), (T, H, W) = tile, spec.grid
    nh, nw = -(-H // th), -(-W // tw)
    slot = torch.arange(-(-T // tt) * nh * nw * tt * th * tw)
    per_tile = tt * th * tw
    index, local = slot // per_tile, slot % per_tile
    t = (index // (nh * nw)) * tt + local // (th * tw)
    h = (index // nw % nh) * th + local // tw % th
    w = (index % nw) * tw + local % tw
    real = (t < T) & (h < H) & (w < W)
    token = torch.where(real, (t * H + h) * W + w, 0)
    scatter = torch.empty(T * H * W, dtype=torch.int64)
    scatter[token[real]] = slot[real]
    coords = torch.stack([torch.where(real, x, _FAR) for x in (t, h, w)]).to(torch.int32)
    return token.to(device), scatter.to(device), coords.to(device)


def _keep(spec: MaskSpec, coords: torch.Tensor, q_idx, kv_idx):
    """Mask rule in tile coordinates (works on index tensors of any broadcastable shapes)."""
    keep = coords[0][kv_idx] >= 0
    for axis, r in enumerate(_radii(spec)):
        diff = coords[axis][q_idx] - coords[axis][kv_idx]
        keep = keep & (diff <= r) & (diff >= (0 if axis == 0 and spec.causal_t else -r))
    return keep | (q_idx == kv_idx)


def tiled_mask(spec: MaskSpec, tile: tuple[int, int, int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``(L, L)`` bool mask on the layout of ``tile`` (True = may attend), as the kernels apply it."""
    _, _, coords = _layout(spec, tile, str(torch.device(device)))
    idx = torch.arange(coords.shape[1], device=coords.device)
    return _keep(spec, coords, idx[:, None], idx[None, :])


@functools.lru_cache(maxsize=16)
def _block_mask(spec: MaskSpec, tile: tuple[int, int, int], device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    _, _, coords = _layout(spec, tile, device)
    length = coords.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        return _keep(spec, coords, q_idx, kv_idx)

    return create_block_mask(mask_mod, None, None, length, length, device=device,
                             BLOCK_SIZE=BLOCK, _compile=torch.device(device).type == "cuda")


class _Gather(torch.autograd.Function):
    """``x.index_select(2, index)`` whose backward is ``grad.index_select(2, back)`` (see module docstring)."""

    @staticmethod
    def forward(ctx, x, index, back):
        ctx.save_for_backward(back)
        return x.index_select(2, index)

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        return grad.index_select(2, back), None, None


def attention_window_tiles(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, scale: float,
    *, tile: tuple[int, int, int] | None = None, kernel: Literal["flex", "math"] = "flex",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``window_3d`` attention computed in :func:`tile_order`'s token order.

    Args:
        q: ``(b, hq, s, d)``; k, v: ``(b, hkv, s, d)`` with ``s == T * H * W`` of ``spec.grid``; GQA allowed.
        spec: a ``window_3d`` mask.
        scale: score scale.
        tile: ``(tt, th, tw)`` tokens per tile (default :func:`tile_order`'s); ``"flex"`` needs a product of
            :data:`BLOCK`.
        kernel: ``"flex"`` (compiled FlexAttention, CUDA) or ``"math"`` (dense mask, float32-accumulating
            math path; any device, the CPU check of the layout).

    Returns:
        ``(out (b, hq, s, d_v) in q.dtype, lse (b, hq, s))``, lse float32 (float64 for float64 inputs with the
        ``"math"`` kernel), the same values as dense ``window_3d`` attention up to rounding.

    Raises:
        ValueError: ``spec`` not a ``window_3d`` mask; no ``tile`` given and :func:`tile_order` keeps the
            raster order; a ``"flex"`` tile that is not :data:`BLOCK` tokens; q, k or v not of the grid's
            token count.
    """
    if spec.kind != "window_3d":
        raise ValueError(f"attention_window_tiles needs a window_3d MaskSpec, got kind={spec.kind!r}")
    if tile is None:
        order = tile_order(spec)
        if order.tile is None:
            raise ValueError(f"{spec!r} keeps the raster order ({order.blocks} blocks); call FlexAttention")
        tile = order.tile
    if kernel == "flex" and tile[0] * tile[1] * tile[2] != BLOCK:
        raise ValueError(f"a flex tile must hold {BLOCK} tokens, got {tile}")
    tokens = spec.grid[0] * spec.grid[1] * spec.grid[2]
    if q.shape[2] != tokens or k.shape[2] != tokens or v.shape[2] != tokens:
        raise ValueError(f"window_3d tiles need q, k and v of {tokens} tokens (grid {spec.grid}), "
                         f"got {q.shape[2]}, {k.shape[2]} and {v.shape[2]}")
    gather, scatter, coords = _layout(spec, tile, str(q.device))
    qt, kt, vt = (_Gather.apply(x, gather, scatter) for x in (q, k, v))
    if kernel == "flex":
        from ._flex import flex_with_lse

        out_t, lse_t = flex_with_lse(qt, kt, vt, _block_mask(spec, tile, str(q.device)), scale, static=True)
    else:
        from ._math import attention_math

        idx = torch.arange(coords.shape[1], device=q.device)
        out_t, lse_t = attention_math(qt, kt, vt, _keep(spec, coords, idx[:, None], idx[None, :])[None, None], scale)
    return _Gather.apply(out_t, scatter, gather), _Gather.apply(lse_t, scatter, gather)
