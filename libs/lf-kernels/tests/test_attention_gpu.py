"""attention() on CUDA in bf16 / fp16 / fp32 against the float64 CPU reference.

Oracle: attention_reference in float64 on the CPU, same (exactly representable)
inputs. Runs only with a CUDA device (``@pytest.mark.gpu``).
"""

import itertools
import zlib

import pytest
import torch

from lf_kernels import MaskSpec, attention, attention_reference

pytestmark = pytest.mark.gpu

MASKS = [MaskSpec("full"), MaskSpec("causal"), MaskSpec("prefix_lm", prefix_len=9)]
# Half precision: inputs and output rounded to 8 (bf16) / 11 (fp16) mantissa bits,
# kernels accumulate in fp32; |out| <= max|v| ~ 4, so a few output ulps: bf16
# step 2**-8 relative -> 3e-2 absolute, fp16 4e-3. fp32 on CUDA may use TF32 in
# SDPA's matmuls (10 bits) -> 5e-3.
TOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 5e-3}


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize(
    ("mask", "padded", "heads", "seqs", "return_lse"),
    list(itertools.product(MASKS, [False, True], [(8, 8), (8, 2)], [(65, 65), (17, 65)], [False, True])),
)
def test_cuda_matches_float64_reference(dtype, mask, padded, heads, seqs, return_lse):
    """Oracle: float64 CPU reference; outputs and q/k/v grads within TOL[dtype]."""
    gen = torch.Generator().manual_seed(zlib.crc32(repr((mask, padded, heads, seqs, return_lse)).encode()))
    (heads_q, heads_kv), (seq_q, seq_kv) = heads, seqs
    q64 = torch.randn(2, heads_q, seq_q, 64, generator=gen, dtype=torch.float64).to(dtype).double()
    k64 = torch.randn(2, heads_kv, seq_kv, 64, generator=gen, dtype=torch.float64).to(dtype).double()
    v64 = torch.randn(2, heads_kv, seq_kv, 64, generator=gen, dtype=torch.float64).to(dtype).double()
    grad_out = torch.randn(2, heads_q, seq_q, 64, generator=gen, dtype=torch.float64)
    key_padding = (torch.rand(2, seq_kv, generator=gen) > 0.3) if padded else None
    if padded:
        key_padding[1] = False  # batch element 1: every row fully masked
    q, k, v = (t.to("cuda", dtype).requires_grad_() for t in (q64, k64, v64))
    result = attention(
        q, k, v, mask, key_padding=None if key_padding is None else key_padding.cuda(), return_lse=return_lse
    )
    out = result[0] if return_lse else result
    assert out.dtype == dtype
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to("cuda", dtype))
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref_out, ref_lse = attention_reference(q64, k64, v64, mask, key_padding=key_padding)
    ref_grads = torch.autograd.grad(ref_out, (q64, k64, v64), grad_out)
    tol = TOL[dtype]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=tol, atol=tol)
    if return_lse:
        assert result[1].dtype == torch.float32
        torch.testing.assert_close(result[1].double().cpu(), ref_lse, rtol=1e-3, atol=1e-3)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(got).all()
        # Grads sum over up to 65 keys / 8 query heads: allow 4x the output tolerance.
        torch.testing.assert_close(got.double().cpu(), want, rtol=4 * tol, atol=4 * tol)


@pytest.mark.parametrize("backend", ["CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH"])
def test_fully_masked_rows_zero_under_each_cuda_kernel(backend):
    """Oracle: the contract (out = 0, finite grads for rows with no allowed key).

    cuDNN alone returns non-zero rows and NaN grads for all-masked rows (seen on
    H200, torch 2.11); attention() must hide that under every kernel.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 64, 64, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    k = torch.randn(2, 2, 64, 64, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    v = torch.randn(2, 2, 64, 64, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
    key_padding = torch.ones(2, 64, dtype=torch.bool, device="cuda")
    key_padding[1] = False
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        out = attention(q, k, v, MaskSpec("causal"), key_padding=key_padding)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0].abs().amax() > 0
    for grad in grads:
        assert torch.isfinite(grad).all()
