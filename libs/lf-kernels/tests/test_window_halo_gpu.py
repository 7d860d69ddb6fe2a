"""The tile + halo ``window_3d`` path on CUDA (bf16) against the float64 CPU reference, and its memory.

Oracle: ``attention_reference`` in float64 on the CPU, on the same bf16-representable inputs. Runs only
with a CUDA device: ``python -m pytest libs/lf-kernels/tests/test_window_halo_gpu.py``.

Tolerance (bf16), as in test_attention_gpu_masks.py: the output is rounded once to bf16 after fp32
accumulation -> 3e-2 absolute; gradients also pass through bf16 dS and a bf16 ``index_add`` of up to
~12 halo copies per key -> 1.2e-1. lse is float32: 1e-3.
"""

import zlib

import pytest
import torch

from lf_kernels._attention import attention
from lf_kernels._dispatch import choose_backend
from lf_kernels._halo_layout import choose_tile, halo_layout
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._window_halo import attention_window_halo

pytestmark = pytest.mark.gpu

TOL, GRAD_TOL, LSE_TOL = 3e-2, 1.2e-1, 1e-3
GRID = (5, 21, 27)  # 2,835 tokens; the default tiles (7, 9) / (4, 4) leave no padding, (8, 16) does
SEQ = GRID[0] * GRID[1] * GRID[2]
MASKS = {
    "window": MaskSpec("window_3d", grid=GRID, window=(3, 5, 7)),
    "window_causal_t": MaskSpec("window_3d", grid=GRID, window=(3, 7, 5), causal_t=True),
}


def _compare(mask, key, *, heads=(8, 2), head_dim=64, padding=False, via_dispatcher=False, **halo_kwargs):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64).to(torch.bfloat16).double()

    q64 = randn(2, heads[0], SEQ, head_dim)
    k64, v64 = randn(2, heads[1], SEQ, head_dim), randn(2, heads[1], SEQ, head_dim)
    grad_out = torch.randn(2, heads[0], SEQ, head_dim, generator=gen, dtype=torch.float64)
    key_padding = None
    if padding:
        key_padding = torch.rand(2, SEQ, generator=gen) > 0.3
        key_padding[1, : GRID[1] * GRID[2]] = False  # frame 0 of sample 1: empty rows with causal_t
    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    kp_cuda = None if key_padding is None else key_padding.cuda()
    if via_dispatcher:
        assert choose_backend(mask, SEQ, SEQ, device="cuda", dtype=torch.bfloat16, has_key_padding=padding) == "flex"
        out, lse = attention(q, k, v, mask, key_padding=kp_cuda), None
    else:
        result = attention_window_halo(q, k, v, mask, head_dim**-0.5, key_padding=kp_cuda, **halo_kwargs)
        out, lse = result if halo_kwargs.get("return_lse") else (result, None)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref, ref_lse = attention_reference(q64, k64, v64, mask, key_padding=key_padding)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=TOL, atol=TOL)
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse.double().cpu()[finite], ref_lse[finite], rtol=LSE_TOL, atol=LSE_TOL)
        assert torch.isneginf(lse.cpu()[~finite]).all()
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to("cuda", torch.bfloat16))
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(got).all(), f"d{name} not finite"
        torch.testing.assert_close(got.double().cpu(), want, rtol=GRAD_TOL, atol=GRAD_TOL,
                                   msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("kind", list(MASKS))
def test_dispatcher_on_halo_grid(kind, padding):
    """Oracle: float64 CPU reference; on this grid ``attention`` keeps the raster order (``flex``): the
    dispatcher does not take the halo path (slower than Flex at the bench shape, BENCHMARKS.md)."""
    _compare(MASKS[kind], ("dispatch", kind, padding), padding=padding, via_dispatcher=True)


@pytest.mark.parametrize(("heads", "head_dim"), [((8, 8), 64), ((8, 2), 80), ((8, 1), 128)])
def test_gqa_and_head_dims(heads, head_dim):
    """Oracle: float64 CPU reference; GQA ratios 1 / 4 / 8, head dims 64 / 80 / 128."""
    _compare(MASKS["window"], ("gqa", heads, head_dim), heads=heads, head_dim=head_dim)


@pytest.mark.parametrize("tile", [(8, 16), (16, 8), (4, 4)])
def test_other_tiles(tile):
    """Oracle: float64 CPU reference; tiles that pad the grid (8 x 16) and small ones."""
    _compare(MASKS["window_causal_t"], ("tile", tile), tile=tile)


@pytest.mark.parametrize("padding", [False, True])
def test_flex_kernel_with_lse(padding):
    """Oracle: float64 CPU reference (out, lse, grads); compiled FlexAttention on the batched tiles."""
    _compare(MASKS["window_causal_t"], ("flex", padding), padding=padding, kernel="flex", return_lse=True)


def test_peak_memory_is_the_halo_buffers():
    """Oracle: the analytic size of the halo buffers. At the bench shape (Wan 480p, 12 x 128 heads, bf16) the
    fwd+bwd peak above the inputs stays within 2.5x the tiles + halos + bias (fwd saves them, bwd makes their
    gradients, plus kernel workspace) and twice the inputs (layout copies, input gradients): ~7 GB, far below one
    dense score matrix (12 * 32760**2 * 2 B = 25.8 GB) or GQA-repeated halos."""
    spec = MaskSpec("window_3d", grid=(21, 30, 52), window=(3, 9, 9))
    seq, heads, dim = 32760, 12, 128
    q, k, v, grad = (torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    layout = halo_layout(spec, choose_tile(spec), "cuda")
    ab = layout.q_index.shape[1]
    item = 2
    tiles = 2 * layout.n_tiles * ab * heads * dim * item  # q tiles and out tiles
    halos = 2 * layout.n_tiles * layout.halo * heads * dim * item  # k and v halos
    bias = layout.n_tiles * ab * layout.halo * item
    inputs = 3 * seq * heads * dim * item
    attention_window_halo(q, k, v, spec, dim**-0.5).backward(grad)  # warm the caches (layout, bias)
    q.grad = k.grad = v.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    attention_window_halo(q, k, v, spec, dim**-0.5).backward(grad)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    print(f"peak extra {extra / 1e9:.2f} GB; halos {halos / 1e9:.2f} GB, tiles {tiles / 1e9:.2f} GB, "
          f"bias {bias / 1e9:.3f} GB")
    assert extra <= 2.5 * (tiles + halos + bias) + 2 * inputs
