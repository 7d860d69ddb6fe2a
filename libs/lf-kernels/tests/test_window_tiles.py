"""The tile-order ``window_3d`` path (``lf_kernels._window_tiles``) on the CPU.

Oracles: ``attention_reference`` (dense mask, plain PyTorch) in float64 on fresh random inputs,
forward, lse and backward (q, k, v gradients of a random upstream gradient) through the reordering
with the ``"math"`` kernel; and, for the block counts that pick the order, a brute-force count of the
128 x 128 blocks of the dense mask holding a kept entry. Tolerance 1e-10: both sides are float64
softmax attention over the same keys, differing only in summation order.
"""

import zlib

import pytest
import torch

from lf_kernels._dispatch import choose_backend
from lf_kernels._mask import MaskSpec, dense_mask
from lf_kernels._reference import attention_reference
from lf_kernels._window_tiles import BLOCK, attention_window_tiles, tile_order, tiled_mask

TOL = 1e-10
WAN_480P = MaskSpec("window_3d", grid=(21, 30, 52), window=(3, 9, 9))


def _blocks(mask_ll: torch.Tensor) -> int:
    """Brute force: blocks of ``BLOCK x BLOCK`` (last ones padded) with any True entry."""
    n = mask_ll.shape[0]
    pad = -n % BLOCK
    full = torch.nn.functional.pad(mask_ll, (0, pad, 0, pad))
    nb = full.shape[0] // BLOCK
    return int(full.reshape(nb, BLOCK, nb, BLOCK).any(dim=3).any(dim=1).sum())


def _raster_blocks(spec):
    seq = spec.grid[0] * spec.grid[1] * spec.grid[2]
    return _blocks(dense_mask(spec, seq, seq)[0, 0])


@pytest.mark.parametrize(("grid", "window", "causal_t"), [
    ((4, 30, 52), (3, 9, 9), False), ((4, 30, 52), (3, 9, 9), True), ((6, 17, 23), (3, 5, 7), False),
    ((5, 20, 33), (5, 3, 9), True),
])
def test_block_counts_match_brute_force(grid, window, causal_t):
    """Oracle: blocks of the dense mask (raster) and of the tiled mask (chosen or forced tile) counted directly."""
    spec = MaskSpec("window_3d", grid=grid, window=window, causal_t=causal_t)
    order = tile_order(spec)
    assert order.raster_blocks == _raster_blocks(spec)
    tile = order.tile or (1, 16, 8)
    mask = tiled_mask(spec, tile)
    from lf_kernels._window_tiles import _kept_tile_blocks, _radii

    assert _blocks(mask) == _kept_tile_blocks(grid, tile, _radii(spec), causal_t)
    if order.tile is not None:
        assert order.blocks == _blocks(mask) <= 0.85 * order.raster_blocks


def test_wan_720p_keeps_raster():
    """Oracle: the brute-force-checked counts above; at Wan 720p latents (21 x 45 x 80, 75,600 tokens) no tile keeps
    15% fewer blocks than the raster order, so the order stays raster (the dispatcher keeps ``flex``)."""
    order = tile_order(MaskSpec("window_3d", grid=(21, 45, 80), window=(3, 9, 9)))
    assert order.tile is None and order.blocks == order.raster_blocks == 11599


def test_wan_480p_order():
    """Oracle: the box counts, checked by brute force above (and, once, at this shape: 3,570); the choice is the
    column tile (1, 32, 4), 2,257 blocks, and the dispatcher sends this mask there on CUDA."""
    order = tile_order(WAN_480P)
    assert (order.tile, order.padded, order.blocks, order.raster_blocks) == ((1, 32, 4), (21, 32, 52), 2257, 3570)
    facts = {"device": "cuda", "dtype": torch.bfloat16, "flex": True, "split": True}
    assert choose_backend(WAN_480P, 32760, 32760, **facts) == "flex_tiles"
    assert choose_backend(WAN_480P, 32760, 32760, has_key_padding=True, **facts) == "flex"
    small = MaskSpec("window_3d", grid=(4, 6, 10), window=(3, 3, 5))
    assert tile_order(small).tile is None and choose_backend(small, 240, 240, **facts) == "flex"
    assert choose_backend(WAN_480P, 32760, 32760, device="cpu") == "sdpa_mask"


def test_tiled_mask_is_the_window_mask():
    """Oracle: ``dense_mask``; the tiled mask read back through the token order is the raster mask, padding
    slots see only themselves."""
    spec = MaskSpec("window_3d", grid=(5, 9, 13), window=(3, 5, 3), causal_t=True)
    from lf_kernels._window_tiles import _layout

    gather, scatter, coords = _layout(spec, (1, 8, 16), "cpu")
    mask = tiled_mask(spec, (1, 8, 16))
    seq = 5 * 9 * 13
    assert torch.equal(mask[scatter][:, scatter], dense_mask(spec, seq, seq)[0, 0])
    pad = torch.ones(mask.shape[0], dtype=torch.bool)
    pad[scatter] = False
    assert torch.equal(mask[pad], torch.eye(mask.shape[0], dtype=torch.bool)[pad])
    assert torch.equal(gather[scatter], torch.arange(seq))


def _inputs(key, heads_q, heads_kv, seq, head_dim):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    shapes = [(2, heads_q, seq, head_dim), (2, heads_kv, seq, head_dim), (2, heads_kv, seq, head_dim),
              (2, heads_q, seq, head_dim)]
    return [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]


@pytest.mark.parametrize(("grid", "window", "causal_t", "tile", "heads"), [
    ((4, 11, 13), (3, 9, 9), False, (1, 8, 16), (4, 4)),
    ((5, 9, 10), (3, 5, 7), True, (2, 4, 16), (8, 2)),
    ((3, 7, 11), (1, 3, 3), True, (1, 4, 4), (4, 1)),
])
def test_matches_reference(grid, window, causal_t, tile, heads):
    """Oracle: float64 dense reference, forward, lse and q/k/v gradients; grids the tiles do not divide,
    GQA ratios 1 / 4 / 4, batch 2."""
    spec = MaskSpec("window_3d", grid=grid, window=window, causal_t=causal_t)
    seq, head_dim = grid[0] * grid[1] * grid[2], 16
    q, k, v, grad_out = _inputs((grid, window, causal_t, tile), *heads, seq, head_dim)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = attention_window_tiles(q, k, v, spec, head_dim**-0.5, tile=tile, kernel="math")
    ref, ref_lse = attention_reference(q, k, v, spec, scale=head_dim**-0.5)
    assert out.shape == ref.shape and out.dtype == torch.float64 and lse.shape == ref_lse.shape
    torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
    torch.testing.assert_close(lse, ref_lse, rtol=TOL, atol=TOL)
    grads = torch.autograd.grad((out * grad_out).sum() + lse.sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * grad_out).sum() + ref_lse.sum(), (q, k, v))
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=lambda m, n=name: f"d{n}: {m}")


def test_refusals():
    """Errors name the problem: a flex tile that is not one block, a grid that does not hold the sequence,
    a spec that keeps the raster order, a mask of another kind."""
    q = torch.zeros(1, 2, 240, 8)
    small = MaskSpec("window_3d", grid=(4, 6, 10), window=(3, 3, 5))
    with pytest.raises(ValueError, match="keeps the raster order"):
        attention_window_tiles(q, q, q, small, 1.0)
    with pytest.raises(ValueError, match="must hold 128 tokens"):
        attention_window_tiles(q, q, q, small, 1.0, tile=(1, 4, 4))
    with pytest.raises(ValueError, match="240 tokens"):
        attention_window_tiles(q[:, :, :200], q, q, small, 1.0, tile=(1, 4, 4), kernel="math")
    with pytest.raises(ValueError, match="q, k and v of 240 tokens"):
        attention_window_tiles(q, q, q[:, :, :200], small, 1.0, tile=(1, 4, 4), kernel="math")
    with pytest.raises(ValueError, match="needs a window_3d MaskSpec"):
        attention_window_tiles(q, q, q, MaskSpec("causal"), 1.0, tile=(1, 4, 4), kernel="math")
    with pytest.raises(ValueError, match="window_3d"):
        tile_order(MaskSpec("causal"))
