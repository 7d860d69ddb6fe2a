"""The tile-order ``window_3d`` path on CUDA (bf16, compiled FlexAttention) against a float64 reference.

Oracle: ``attention_reference`` in float64 (on the GPU, for memory) on the same bf16-representable
inputs, forward, lse and q/k/v gradients. Runs only with a CUDA device:
``python -m pytest libs/lf-kernels/tests/test_window_tiles_gpu.py``.

Tolerance (bf16), as in test_attention_gpu_masks.py: output rounded once to bf16 after fp32
accumulation -> 3e-2; gradients through bf16 dS -> 1e-1; lse float32 -> 1e-3.
"""

import zlib

import pytest
import torch

from lf_kernels._attention import attention
from lf_kernels._dispatch import choose_backend
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._window_tiles import attention_window_tiles, tile_order

pytestmark = pytest.mark.gpu

TOL, GRAD_TOL, LSE_TOL = 3e-2, 1e-1, 1e-3
GRID = (4, 30, 52)  # 6,240 tokens; tiles (1, 32, 4) pad the rows to 32


@pytest.mark.parametrize(("causal_t", "heads", "head_dim"), [
    (False, (8, 8), 128), (True, (8, 2), 64), (False, (8, 1), 80),
])
def test_dispatcher_takes_tiles(causal_t, heads, head_dim):
    """Oracle: float64 reference; ``attention`` picks ``flex_tiles`` here; GQA 1 / 4 / 8, head dims 128 / 64 / 80."""
    spec = MaskSpec("window_3d", grid=GRID, window=(3, 9, 9), causal_t=causal_t)
    seq = GRID[0] * GRID[1] * GRID[2]
    assert tile_order(spec).tile == (1, 32, 4)
    assert choose_backend(spec, seq, seq, device="cuda", dtype=torch.bfloat16, return_lse=True) == "flex_tiles"
    gen = torch.Generator().manual_seed(zlib.crc32(repr((causal_t, heads, head_dim)).encode()))

    def randn(*size):
        return torch.randn(*size, generator=gen).to(torch.bfloat16).to("cuda", torch.float64)

    q64 = randn(1, heads[0], seq, head_dim)
    k64, v64 = randn(1, heads[1], seq, head_dim), randn(1, heads[1], seq, head_dim)
    grad_out = randn(1, heads[0], seq, head_dim)
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    out, lse = attention(q, k, v, spec, return_lse=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref, ref_lse = attention_reference(q64, k64, v64, spec)
    torch.testing.assert_close(out.double(), ref, rtol=TOL, atol=TOL)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=LSE_TOL, atol=LSE_TOL)
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to(torch.bfloat16))
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(got).all(), f"d{name} not finite"
        torch.testing.assert_close(got.double(), want, rtol=GRAD_TOL, atol=GRAD_TOL, msg=lambda m, n=name: f"d{n}: {m}")


def test_same_as_raster_flex():
    """Oracle: FlexAttention in the raster order on the same inputs (bf16 both): the reordering changes
    which blocks are computed, not the result (fwd 2e-2, grads 6e-2)."""
    from lf_kernels._flex import attention_flex

    spec = MaskSpec("window_3d", grid=GRID, window=(3, 9, 9))
    seq = GRID[0] * GRID[1] * GRID[2]
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, g = (torch.randn(2, 4, seq, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = attention_window_tiles(q, k, v, spec, 128**-0.5)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref, ref_lse = attention_flex(q, k, v, spec, 128**-0.5)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-3, atol=1e-3)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=6e-2, atol=6e-2)
