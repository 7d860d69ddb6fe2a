"""``sdpa_split`` (block-causal from two causal cuDNN calls) on CUDA against the float64 CPU reference.

Oracle: ``attention_reference`` in float64 on the CPU, on the same bf16 / fp16-representable
inputs; the kernel pairs alone against the float64 causal reference. Runs only with a CUDA
device (``@pytest.mark.gpu``); the lead runs
``python -m pytest libs/lf-kernels/tests/test_attention_gpu_split.py`` on the H200.

Tolerances as in test_attention_gpu_masks.py (same reasoning): outputs 3e-2 absolute/relative
(one bf16 rounding of a convex combination of |v| <~ 3, P rounded to bf16 before P @ V), grads
4x that (bf16 intermediates summed over keys and query heads), lse 1e-3 (float32 throughout).
The merge adds one float32 rescale and one rounding of out, and the part gradients are added
in bf16 (one more rounding): inside the same bounds.
"""

import zlib

import pytest
import torch

from lf_kernels import _split_kernels
from lf_kernels._attention import attention
from lf_kernels._dispatch import choose_backend
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._split_attention import CausalKernels, attention_split

pytestmark = pytest.mark.gpu

TOL, GRAD_TOL, LSE_TOL = 3e-2, 1.2e-1, 1e-3


def _inputs(params, batch, heads_q, heads_kv, seq, head_dim, dtype):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(params).encode()))

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64).to(dtype).double()

    q64 = randn(batch, heads_q, seq, head_dim)
    k64, v64 = randn(batch, heads_kv, seq, head_dim), randn(batch, heads_kv, seq, head_dim)
    grad_out = torch.randn(batch, heads_q, seq, head_dim, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(batch, heads_q, seq, generator=gen, dtype=torch.float64)
    return q64, k64, v64, grad_out, grad_lse


def _compare(run, mask, params, batch, heads, seq, head_dim, dtype, return_lse):
    q64, k64, v64, grad_out, grad_lse = _inputs(params, batch, *heads, seq, head_dim, dtype)
    q, k, v = (t.to("cuda", dtype).requires_grad_() for t in (q64, k64, v64))
    out, lse = run(q, k, v)
    assert out.dtype == dtype and torch.isfinite(out).all()
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref_out, ref_lse = attention_reference(q64, k64, v64, mask)
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=TOL, atol=TOL)
    outs, refs, ups = [out], [ref_out], [grad_out]
    if return_lse:
        assert lse.dtype == torch.float32
        torch.testing.assert_close(lse.double().cpu(), ref_lse, rtol=LSE_TOL, atol=LSE_TOL)
        outs, refs, ups = [out, lse], [ref_out, ref_lse], [grad_out, grad_lse]
    grads = torch.autograd.grad(outs, (q, k, v), [u.to("cuda", o.dtype) for u, o in zip(ups, outs, strict=True)])
    ref_grads = torch.autograd.grad(refs, (q64, k64, v64), ups)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(got).all(), f"d{name} not finite"
        torch.testing.assert_close(got.double().cpu(), want, rtol=GRAD_TOL, atol=GRAD_TOL,
                                   msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize(
    ("frame_tokens", "seq", "heads", "head_dim", "batch", "dtype", "return_lse"),
    [
        (77, 385, (8, 2), 64, 2, torch.bfloat16, False),    # whole frames, GQA 4
        (77, 400, (8, 8), 128, 1, torch.bfloat16, True),    # partial last frame of 15
        (77, 386, (8, 1), 80, 2, torch.bfloat16, True),     # partial last frame of 1, GQA 8
        (64, 300, (4, 2), 128, 1, torch.float16, False),    # fp16
        (300, 2100, (4, 4), 128, 1, torch.bfloat16, True),  # longer: 7 frames of 300
    ],
)
def test_attention_takes_split_on_cuda(frame_tokens, seq, heads, head_dim, batch, dtype, return_lse):
    """Oracle: float64 CPU reference; attention() picks sdpa_split and matches out / lse / grads (lse grads too)."""
    mask = MaskSpec("block_causal", frame_tokens=frame_tokens)
    assert choose_backend(mask, seq, seq, device="cuda", dtype=dtype, return_lse=return_lse) == "sdpa_split"

    def run(q, k, v):
        res = attention(q, k, v, mask, return_lse=return_lse)
        return res if return_lse else (res, None)

    _compare(run, mask, ("split", frame_tokens, seq, heads, head_dim), batch, heads, seq, head_dim, dtype,
             return_lse)


@pytest.mark.parametrize("which", ["cudnn", "flash"])
def test_kernel_pairs_match_causal_reference(which):
    """Oracle: float64 causal reference; each CUDA pair alone: natural-log lse, backward from its own out / lse."""
    fwd, bwd = {"cudnn": (_split_kernels._cudnn_forward, _split_kernels._cudnn_backward),
                "flash": (_split_kernels._flash_forward, _split_kernels._flash_backward)}[which]
    q64, k64, v64, grad_out, _ = _inputs(("pair", which), 3, 4, 4, 203, 128, torch.bfloat16)
    q, k, v = (t.to("cuda", torch.bfloat16) for t in (q64, k64, v64))
    out, lse = fwd(q, k, v, True, 0.1)
    assert lse.shape == (3, 4, 203) and lse.dtype == torch.float32
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref_out, ref_lse = attention_reference(q64, k64, v64, MaskSpec("causal"), scale=0.1)
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=TOL, atol=TOL)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, rtol=LSE_TOL, atol=LSE_TOL)
    grads = bwd(grad_out.to("cuda", torch.bfloat16), q, k, v, out, lse, True, 0.1)
    for got, want in zip(grads, torch.autograd.grad(ref_out, (q64, k64, v64), grad_out), strict=True):
        torch.testing.assert_close(got.double().cpu(), want, rtol=GRAD_TOL, atol=GRAD_TOL)


def test_split_with_flash_pair():
    """Oracle: float64 CPU reference; the whole decomposition on the flash fallback pair."""
    kernels = CausalKernels(_split_kernels._flash_forward, _split_kernels._flash_backward)
    mask = MaskSpec("block_causal", frame_tokens=50)
    _compare(lambda q, k, v: attention_split(q, k, v, 50, kernels=kernels), mask, ("flash",), 2, (8, 2), 333, 64,
             torch.bfloat16, True)


def test_unsupported_head_dim_falls_back():
    """Oracle: float64 CPU reference; head_dim 36 (not a multiple of 8): the dispatcher answers sdpa_split,
    attention() takes the next backend (flex) and is still right."""
    mask = MaskSpec("block_causal", frame_tokens=77)

    def run(q, k, v):
        return attention(q, k, v, mask), None

    _compare(run, mask, ("hd36",), 1, (4, 2), 385, 36, torch.bfloat16, False)
