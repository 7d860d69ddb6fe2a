"""RMSNormModule under mixed dtypes: a bf16 input with a float32 weight (autocast over float32 master weights)."""

import torch

from lf_ir import RMSNormModule


def test_bf16_input_float32_weight_stays_bf16_and_matches_float64():
    """Oracle: float64 ``x / sqrt(mean(x^2) + eps) * w`` on fresh random inputs; the output is not promoted to
    float32 and the gradient reaches the float32 weight."""
    gen = torch.Generator().manual_seed(7)
    norm = RMSNormModule(96, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=gen))
    x = torch.randn(5, 33, 96, generator=gen).to(torch.bfloat16).requires_grad_()
    y = norm(x)
    assert y.dtype == torch.bfloat16
    x64, w64 = x.detach().double(), norm.weight.detach().double()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64
    scale = ref.abs().max()
    assert (y.double() - ref).abs().max() <= 2 ** -7 * scale * 2  # bf16 rounding of the output and the weight
    y.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    ref_grad = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)).sum((0, 1))
    assert torch.allclose(norm.weight.grad.double(), ref_grad, rtol=0.02, atol=0.02 * ref_grad.abs().max())


def test_float32_input_is_unchanged_by_the_cast_rule():
    """A float32 input with a float32 weight runs nn.RMSNorm's own computation (bit for bit)."""
    gen = torch.Generator().manual_seed(8)
    norm = RMSNormModule(64, eps=1e-5)
    x = torch.randn(4, 64, generator=gen)
    assert torch.equal(norm(x), torch.nn.RMSNorm.forward(norm, x))
