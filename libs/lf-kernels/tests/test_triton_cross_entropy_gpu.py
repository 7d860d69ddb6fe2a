"""fused_linear_cross_entropy compiled on CUDA in bf16: both modes, bias, float32 accumulator, per-token loss.

Oracle: the float64 reference (``linear_cross_entropy_reference``) on the GPU on
bf16-exact inputs. Tolerance: float32 chunk logits, so the loss to 1e-5
relative; gradients are bf16 GEMM outputs with the logits' gradient rounded to
bf16 and, by default, ``grad_weight`` rounded once per chunk (2**-6 of the
largest entry; 2**-7 with the float32 accumulator). ``@pytest.mark.gpu``.
"""

import pytest
import torch

from lf_kernels._fused_reference import linear_cross_entropy_reference
from lf_kernels.triton._fused_ce import fused_linear_cross_entropy
from lf_kernels.triton._fused_ce_sweep import logits_dtype

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def inputs(tokens=2048, hidden=512, vocab=20000, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    h = (torch.randn(tokens, hidden, device="cuda", generator=gen, dtype=torch.float64)).to(BF16).double()
    w = (torch.randn(vocab, hidden, device="cuda", generator=gen, dtype=torch.float64) * hidden**-0.5).to(BF16)
    b = torch.randn(vocab, device="cuda", generator=gen, dtype=torch.float64).to(BF16).double()
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    t[::7] = -100
    return h.requires_grad_(), w.double().requires_grad_(), b.requires_grad_(), t


@pytest.mark.parametrize(("grad_in_forward", "accum", "reduction"), [
    (True, None, "mean"), (True, torch.float32, "sum"), (False, None, "mean"), (False, torch.float32, "none")])
def test_fused_ce_cuda_matches_float64(grad_in_forward, accum, reduction):
    """Oracle: float64 reference; 2,048 tokens in chunks of 384 (ragged), vocab 20,000 (not a block multiple)."""
    h64, w64, b64, t = inputs()
    assert logits_dtype(BF16, h64.device) == torch.float32  # mm(out_dtype=float32) runs on this torch
    ours = [x.detach().to(BF16).requires_grad_() for x in (h64, w64, b64)]
    kw = {"label_smoothing": 0.1, "z_loss": 1e-4, "reduction": reduction}
    loss = fused_linear_cross_entropy(*ours[:2], t, bias=ours[2], chunk_tokens=384, grad_in_forward=grad_in_forward,
                                      grad_weight_dtype=accum, **kw)
    ref = linear_cross_entropy_reference(h64, w64, t, bias=b64, **kw)
    g = torch.rand(ref.shape, device="cuda", dtype=torch.float64) + 0.5
    got = torch.autograd.grad(loss, ours, g.float())
    exp = torch.autograd.grad(ref, (h64, w64, b64), g)
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    tol = 2**-7 if accum else 2**-6
    for name, a, e in zip(["dhidden", "dweight", "dbias"], got, exp, strict=True):
        assert a.dtype == BF16, name
        torch.testing.assert_close(a.double(), e, rtol=tol, atol=tol * float(e.abs().max()), msg=name)


def test_out_dtype_matmuls_run_on_this_torch():
    """Oracle: torch's documented ``out_dtype`` matmuls (torch >= 2.8): without them the float32 chunk logits
    fall back to bf16 and the float32 ``grad_weight`` accumulator to float32 GEMMs (slow)."""
    from lf_kernels.triton._fused_ce_sweep import _out_dtype_ops

    assert _out_dtype_ops("cuda") == (True, True)
