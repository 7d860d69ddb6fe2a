"""Shared checks of the fused Triton ops against their float64 references (tests only)."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def leaves(gen, *shapes, scale=1.0):
    """Float64 leaves exactly representable in float32."""
    return [(torch.randn(*s, generator=gen, dtype=torch.float64) * scale).float().double().requires_grad_()
            for s in shapes]


def check(fused, reference, inputs64, seed):
    """Outputs and input grads of ``fused`` on float32 copies vs ``reference`` on the float64 leaves."""
    inputs = [t.detach().to(DEVICE, torch.float32).requires_grad_() for t in inputs64]
    outs, refs = fused(*inputs), reference(*inputs64)
    outs, refs = (outs, refs) if isinstance(outs, tuple) else ((outs,), (refs,))
    gen = torch.Generator().manual_seed(seed)
    grads_out = [torch.randn(r.shape, generator=gen, dtype=torch.float64) for r in refs]
    got = torch.autograd.grad(outs, inputs, [g.to(DEVICE, torch.float32) for g in grads_out])
    expected = torch.autograd.grad(refs, inputs64, grads_out)
    for name, a, e in zip(["out"] * len(outs) + ["grad"] * len(got), (*outs, *got), (*refs, *expected), strict=True):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a.detach().double().cpu(), e.detach(), rtol=2e-5, atol=2e-5, msg=name)
