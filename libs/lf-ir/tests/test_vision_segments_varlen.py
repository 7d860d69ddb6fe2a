"""The vision tower's packed-image attention: one call with the images as documents equals one call per image.

Oracle: the per-segment path of ``MMAttentionModule`` (one ``lf_kernels.attention`` call per image, the HF
``cu_seqlens`` semantics) in float64; the one-call path is forced by making the dispatcher answer
``flex`` / ``flash_varlen`` (as it does on CUDA in bf16), which on the CPU lf-kernels serves with the
documents' dense mask.
"""

import pytest
import torch

import lf_ir._lower_mm as lower_mm
from lf_ir._lower import lower_node
from lf_ir._nodes_mm import MMAttention


@pytest.mark.parametrize(("batch", "backend"), [(1, "flex"), (2, "flash_varlen")])
def test_packed_images_equal_per_image_calls(monkeypatch, batch, backend):
    torch.manual_seed(0)
    module = lower_node(MMAttention(name="vision", dim=32, heads=4, kv_heads=4, mask="full", o_bias=True)).double()
    x_bsd = torch.randn(batch, 5 + 9 + 2, 32, dtype=torch.float64, requires_grad=True)
    segments = [5, 9, 2]
    want = module(x_bsd, segments=segments)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x_bsd)
    calls = []

    def varlen_here(*args, **kwargs):
        calls.append(kwargs.get("has_documents"))
        return backend

    monkeypatch.setattr(lower_mm, "choose_backend", varlen_here)
    got = module(x_bsd, segments=segments)
    (got_grad,) = torch.autograd.grad(got.square().sum(), x_bsd)
    assert calls == [True]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    ids = lower_mm.segment_ids((5, 9, 2), batch, "cpu")
    assert ids.tolist() == [[0] * 5 + [1] * 9 + [2] * 2] * batch
    assert lower_mm.segment_ids((5, 9, 2), batch, "cpu") is ids  # one tensor for every layer of a forward pass
