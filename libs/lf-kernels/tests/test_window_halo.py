"""The tile + halo ``window_3d`` path (``lf_kernels._window_halo``) on the CPU.

Oracle: ``attention_reference`` (dense mask, plain PyTorch) in float64 on fresh random inputs, forward
and backward (q, k, v gradients of a random upstream gradient), and the exact kept-entry count of
``lf_kernels._keep`` for the layout itself. Tolerance 1e-10: both sides are float64 softmax
attention over the same keys, differing only in summation order.
"""

import zlib

import pytest
import torch

from lf_kernels._halo_layout import choose_tile, halo_entries, halo_layout
from lf_kernels._keep import kept_entries
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._window_halo import attention_window_halo

TOL = 1e-10


def _inputs(key, batch, heads_q, heads_kv, seq, head_dim, head_dim_v=None):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
    q = torch.randn(batch, heads_q, seq, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads_kv, seq, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads_kv, seq, head_dim_v or head_dim, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(batch, heads_q, seq, head_dim_v or head_dim, generator=gen, dtype=torch.float64)
    return q, k, v, grad_out, gen


def _check(spec, *, batch=2, heads=(4, 4), head_dim=16, head_dim_v=None, tile=None, key_padding=None, key=()):
    seq = spec.grid[0] * spec.grid[1] * spec.grid[2]
    q, k, v, grad_out, _ = _inputs((spec, heads, head_dim, tile, key), batch, *heads, seq, head_dim, head_dim_v)
    scale = head_dim**-0.5
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention_window_halo(q, k, v, spec, scale, tile=tile, key_padding=key_padding)
    ref, _ = attention_reference(q, k, v, spec, scale=scale, key_padding=key_padding)
    assert out.shape == ref.shape and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL, msg=lambda m, n=name: f"d{n}: {m}")
    return out


CASES = [((3, 7, 11), (1, 3, 3)), ((4, 11, 13), (3, 9, 9)), ((5, 9, 10), (3, 5, 7))]


@pytest.mark.parametrize("causal_t", [False, True])
@pytest.mark.parametrize(("grid", "window"), CASES)
def test_matches_reference(grid, window, causal_t):
    """Oracle: float64 dense reference; odd grids that the default tile does not divide, batch 2."""
    spec = MaskSpec("window_3d", grid=grid, window=window, causal_t=causal_t)
    tile = choose_tile(spec)
    assert grid[1] % tile[0] or grid[2] % tile[1] or tile == (grid[1], grid[2]), "want padded tiles"
    _check(spec)


@pytest.mark.parametrize(("heads", "head_dim"), [((4, 4), 64), ((8, 2), 80), ((8, 1), 128)])
def test_gqa_and_head_dims(heads, head_dim):
    """Oracle: float64 dense reference; GQA ratios 1 / 4 / 8 fold into the tile's query axis."""
    _check(MaskSpec("window_3d", grid=(3, 5, 9), window=(3, 3, 5)), heads=heads, head_dim=head_dim)


@pytest.mark.parametrize("tile", [(1, 1), (2, 3), (4, 4), (7, 16), (32, 32)])
def test_explicit_tiles(tile):
    """Oracle: float64 dense reference; tiles from one token to larger than the grid, v's head dim differing."""
    _check(MaskSpec("window_3d", grid=(2, 7, 9), window=(3, 5, 3), causal_t=True), tile=tile, heads=(4, 2),
           head_dim_v=24)


@pytest.mark.parametrize("causal_t", [False, True])
def test_key_padding(causal_t):
    """Oracle: float64 dense reference with the same key padding; fully padded rows give 0 and finite grads."""
    spec = MaskSpec("window_3d", grid=(3, 6, 7), window=(3, 3, 3), causal_t=causal_t)
    seq = 3 * 6 * 7
    key_padding = torch.rand(2, seq, generator=torch.Generator().manual_seed(3)) > 0.4
    key_padding[1] = False  # sample 1: every key padded, every row empty
    key_padding[0, :42] = False  # sample 0: frame 0 padded, so its rows are empty with causal_t
    out = _check(spec, heads=(4, 2), key_padding=key_padding, key=causal_t)
    assert torch.all(out[1] == 0)


def test_layout_counts_the_kept_entries_exactly():
    """Oracle: lf_kernels._keep.kept_entries; real query x allowed halo key pairs of the layout, and the
    computed entries equal n_tiles * a*b * halo."""
    for spec in (MaskSpec("window_3d", grid=(3, 11, 13), window=(3, 9, 9)),
                 MaskSpec("window_3d", grid=(5, 4, 6), window=(5, 3, 7), causal_t=True)):
        for tile in ((3, 4), choose_tile(spec)):
            layout = halo_layout(spec, tile)
            allowed = layout.pattern[None] & layout.k_real[:, None, :] & layout.q_real[:, :, None]
            assert int(allowed.sum()) == kept_entries(spec, layout.slot_of_token.numel())
            assert halo_entries(spec, tile) == layout.n_tiles * tile[0] * tile[1] * layout.halo
            # Every real token has exactly one query slot, and the slots point back at it.
            seq = layout.slot_of_token.numel()
            assert torch.equal(layout.q_index.reshape(-1)[layout.slot_of_token], torch.arange(seq))


def test_bench_shape_tile_and_ratio():
    """Oracle: hand count for the Wan 480p shape; tile (10, 6): 21 x 3 x 9 tiles, halo 3 x 18 x 14 = 756."""
    spec = MaskSpec("window_3d", grid=(21, 30, 52), window=(3, 9, 9))
    assert choose_tile(spec) == (10, 6)
    assert halo_entries(spec, (10, 6)) == 21 * 3 * 9 * 60 * 756
    assert halo_entries(spec, (8, 8)) == 21 * 4 * 7 * 64 * 3 * 16 * 16
    ratio = halo_entries(spec, (10, 6)) / kept_entries(spec, 32760)
    assert 3.7 < ratio < 3.8


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("with_padding", [False, True])
def test_flex_kernel_forward_and_lse(with_padding):
    """Oracle: float64 dense reference (out, lse); eager FlexAttention has no CPU backward: forward only."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    spec = MaskSpec("window_3d", grid=(3, 5, 7), window=(3, 3, 5))
    q, k, v, _, gen = _inputs("flex", 2, 4, 2, 105, 16)
    key_padding = (torch.rand(2, 105, generator=gen) > 0.3) if with_padding else None
    if with_padding:
        key_padding[1] = False
    out, lse = attention_window_halo(q, k, v, spec, 0.25, key_padding=key_padding, kernel="flex", return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, spec, scale=0.25, key_padding=key_padding)
    torch.testing.assert_close(out, ref, rtol=TOL, atol=TOL)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], rtol=TOL, atol=TOL)
    assert torch.isneginf(lse[~finite]).all()


def test_errors_name_the_problem():
    """Oracle: the documented ValueErrors."""
    spec = MaskSpec("window_3d", grid=(2, 3, 4), window=(1, 3, 3))
    q = k = v = torch.randn(1, 2, 24, 8)
    with pytest.raises(ValueError, match="window_3d self-attention"):
        attention_window_halo(q, k, v, MaskSpec("causal"), 1.0)
    with pytest.raises(ValueError, match="q_len=23, kv_len=24"):
        attention_window_halo(q[:, :, 1:], k, v, spec, 1.0)
    with pytest.raises(ValueError, match="kernel='flex'"):
        attention_window_halo(q, k, v, spec, 1.0, return_lse=True)
    with pytest.raises(ValueError, match="'triton'"):
        attention_window_halo(q, k, v, spec, 1.0, kernel="triton")
    with pytest.raises(ValueError, match=r"\(0, 2\)"):
        attention_window_halo(q, k, v, spec, 1.0, tile=(0, 2))
    with pytest.raises(ValueError, match="kind='causal'"):
        halo_layout(MaskSpec("causal"), (2, 2))
