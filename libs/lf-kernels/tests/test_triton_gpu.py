"""Compiled Triton kernels on CUDA at model sizes in bf16, and the fused CE's memory bound.

Oracles: the float64 references (``lf_kernels._fused_reference``) on the GPU,
same bf16-exact inputs; for memory, the eager materializing pattern
(``F.linear`` then ``F.cross_entropy`` on float32 logits) measured in the same
process. Tolerance: bf16 outputs, 2 bf16 ulps of the largest entry (2**-7
relative); loss to 1e-3 relative (bf16 logits). ``@pytest.mark.gpu``.
"""

import pytest
import torch
import torch.nn.functional as F

from lf_kernels import _fused_reference as ref
from lf_kernels.triton import (
    apply_rotary,
    fused_linear_cross_entropy,
    kernel_backend,
    modulate,
    rms_norm,
    rope3d_tables,
    swiglu,
)

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def leaves(*shapes, seed, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(s, device="cuda", generator=gen, dtype=torch.float64) * scale).to(BF16).double()
            .requires_grad_() for s in shapes]


def check(fused_fn, ref_fn, inputs64, seed):
    """Forward and VJP of fused_fn on bf16 copies vs ref_fn on the float64 leaves."""
    inputs = [t.detach().to(BF16).requires_grad_() for t in inputs64]
    assert kernel_backend(*inputs) == "triton"
    out, expected = fused_fn(*inputs), ref_fn(*inputs64)
    out, expected = (out[0], expected[0]) if isinstance(out, tuple) else (out, expected)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    grad = torch.randn(out.shape, device="cuda", generator=gen, dtype=torch.float64).to(BF16)
    got_grads = torch.autograd.grad(out, inputs, grad)
    exp_grads = torch.autograd.grad(expected, inputs64, grad.double())
    for a, e in zip((out, *got_grads), (expected, *exp_grads), strict=True):
        e = e.detach()
        torch.testing.assert_close(a.double(), e, rtol=2**-7, atol=2**-7 * float(e.abs().max()))


def test_rms_norm_residual_llm_size():
    """Oracle: float64 reference; 4096 x 4096 bf16 with a residual."""
    x, w, r = leaves((4096, 4096), (4096,), (4096, 4096), seed=0)
    check(lambda a, b, c: rms_norm(a, b, 1e-5, residual=c), lambda a, b, c: ref.rms_norm_reference(a, b, 1e-5, c),
          [x, w, r], 1)


def test_swiglu_and_modulate_dit_size():
    """Oracle: float64 references; swiglu 4096 x 11008, modulate 2 x 32760 x 1536 per sample."""
    g, u = leaves((4096, 11008), (4096, 11008), seed=2)
    check(swiglu, ref.swiglu_reference, [g, u], 3)
    x, sh, sc = leaves((2, 32760, 1536), (2, 1, 1536), (2, 1, 1536), seed=4)
    check(modulate, ref.modulate_reference, [x, sh, sc], 5)


def test_rotary_wan_size():
    """Oracle: float64 reference; Wan 3D RoPE, (1, 32760, 12, 128) bshd, interleaved."""
    (x,) = leaves((1, 32760, 12, 128), seed=6)
    cos, sin = rope3d_tables(21, 30, 52, 128, device="cuda")
    check(lambda a: apply_rotary(a, cos, sin, layout="bshd", interleaved=True),
          lambda a: ref.rotary_reference(a.transpose(1, 2), cos.double(), sin.double(), interleaved=True)
          .transpose(1, 2), [x], 7)


def test_fused_ce_matches_and_uses_a_quarter_of_eager_memory():
    """Oracle: float64 reference for values; eager F.cross_entropy for peak memory (fused <= 1/4)."""
    tokens, hidden, vocab = 4096, 1024, 32000
    h64, w64 = leaves((tokens, hidden), (vocab, hidden), seed=8)
    with torch.no_grad():
        w64.mul_(hidden ** -0.5)
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    target[:100] = -100
    h, w = h64.detach().to(BF16).requires_grad_(), w64.detach().to(BF16).requires_grad_()
    expected = ref.linear_cross_entropy_reference(h64, w64, target, label_smoothing=0.1, z_loss=1e-4)
    exp_gh, exp_gw = torch.autograd.grad(expected, (h64, w64))

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = fn()
        grads = torch.autograd.grad(loss, (h, w))
        torch.cuda.synchronize()
        return loss, grads, torch.cuda.max_memory_allocated() - base

    loss, (gh, gw), fused_peak = peak(lambda: fused_linear_cross_entropy(h, w, target, label_smoothing=0.1,
                                                                         z_loss=1e-4))
    _, _, eager_peak = peak(lambda: F.cross_entropy(F.linear(h, w).float(), target, label_smoothing=0.1))
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=1e-3, atol=1e-3)
    for a, e in ((gh, exp_gh), (gw, exp_gw)):
        torch.testing.assert_close(a.double(), e, rtol=2**-6, atol=2**-6 * float(e.abs().max()))
    assert fused_peak <= eager_peak / 4, (fused_peak, eager_peak)
