"""Causal conv3d. Oracle: ``F.conv3d`` in float64 on the input explicitly left-padded in time with
``F.pad`` (the definition of a causal convolution), on fresh random inputs; chunked runs against the
whole clip's run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lf_kernels.conv3d import CausalConv3d, causal_conv3d


def _reference(x, w, b, padding, stride=(1, 1, 1)):
    pt, ph, pw = padding
    return F.conv3d(F.pad(x, (pw, pw, ph, ph, pt, 0)), w, b, stride=stride)


@pytest.mark.parametrize(("kernel", "padding", "stride", "shape"), [
    ((3, 3, 3), (2, 1, 1), (1, 1, 1), (2, 3, 7, 5, 9)),
    ((3, 1, 1), (2, 0, 0), (1, 1, 1), (1, 5, 4, 3, 3)),
    ((1, 1, 1), (0, 0, 0), (1, 1, 1), (2, 4, 3, 6, 5)),
    ((2, 3, 5), (1, 1, 2), (1, 2, 1), (1, 2, 6, 7, 11)),
    ((3, 1, 1), (0, 0, 0), (2, 1, 1), (1, 3, 9, 4, 4)),
])
def test_forward_and_backward_match_float64_reference(kernel, padding, stride, shape):
    """Oracle: float64 F.conv3d on the left-padded input; output and the gradients of a random
    projection of it w.r.t. input, weight and bias."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, shape[1], *kernel, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    out, cache = causal_conv3d(x, w, b, padding, stride=stride)
    ref = _reference(x, w, b, padding, stride)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert cache.shape[2] == min(padding[0], shape[2])
    torch.testing.assert_close(cache, x[:, :, shape[2] - cache.shape[2]:].detach())
    proj = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * proj).sum(), (x, w, b))
    ref_grads = torch.autograd.grad((ref * proj).sum(), (x, w, b))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunks", [(1, 4, 4), (1, 1, 1, 1, 1, 1, 1, 1, 1), (3, 2, 4), (9,)])
def test_chunked_with_cache_equals_full_clip(chunks):
    """Oracle: the whole clip's output (float64), against chunk outputs concatenated along time
    with the cache threaded through, including chunks shorter than the temporal padding."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, sum(chunks), 5, 7, generator=gen, dtype=torch.float64)
    w = torch.randn(6, 3, 3, 3, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(6, generator=gen, dtype=torch.float64)
    full, _ = causal_conv3d(x, w, b, (2, 1, 1))
    outs, cache, start = [], None, 0
    for n in chunks:
        out, cache = causal_conv3d(x[:, :, start:start + n], w, b, (2, 1, 1), cache=cache)
        outs.append(out)
        start += n
    torch.testing.assert_close(torch.cat(outs, 2), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full, _reference(x, w, b, (2, 1, 1)), rtol=1e-12, atol=1e-12)


def test_gradients_flow_through_the_cache():
    """Oracle: gradients of the whole-clip run (float64); the chunked run must carry gradient
    from the second chunk's output back into the first chunk's input through the cache."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 5, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    full, _ = causal_conv3d(x, w, None, (2, 1, 1))
    a, cache = causal_conv3d(x[:, :, :2], w, None, (2, 1, 1))
    b, _ = causal_conv3d(x[:, :, 2:], w, None, (2, 1, 1), cache=cache)
    proj = torch.randn(full.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((full * proj).sum(), (x, w))
    got = torch.autograd.grad((torch.cat([a, b], 2) * proj).sum(), (x, w))
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_module_float32_matches_float64_reference_and_keeps_shape():
    """Oracle: float64 reference on the same (upcast) weights; float32 tolerance 1e-5 relative."""
    torch.manual_seed(3)
    conv = CausalConv3d(3, 5, (3, 3, 3))
    x = torch.randn(1, 3, 6, 9, 7)
    out, cache = conv(x)
    ref = _reference(x.double(), conv.weight.double(), conv.bias.double(), (2, 1, 1))
    assert out.shape == (1, 5, 6, 9, 7) and cache.shape == (1, 3, 2, 9, 7)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_meta_device_construction_and_bad_arguments():
    with torch.device("meta"):
        conv = CausalConv3d(2, 4, 3)
    assert conv.weight.is_meta and conv.padding == (2, 1, 1)
    x, w = torch.randn(1, 2, 3, 4, 4), torch.randn(4, 2, 3, 3, 3)
    with pytest.raises(ValueError, match="x has 3 channels but weight expects 2"):
        causal_conv3d(torch.randn(1, 3, 3, 4, 4), w, None, 1)
    with pytest.raises(ValueError, match=r"cache must be .* got \(1, 2, 3, 4, 4\)"):
        causal_conv3d(x, w, None, (2, 1, 1), cache=torch.randn(1, 2, 3, 4, 4))
    with pytest.raises(ValueError, match="a cache needs stride_t 1"):
        causal_conv3d(x, w, None, (2, 1, 1), cache=torch.randn(1, 2, 1, 4, 4), stride=(2, 1, 1))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        causal_conv3d(x, w, torch.zeros(3), 1)
    with pytest.raises(ValueError, match="padding must be"):
        causal_conv3d(x, w, None, (1, 1))
    with pytest.raises(ValueError, match="kernel_size=0"):
        CausalConv3d(2, 4, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-3), (torch.bfloat16, 3e-2)])
def test_cuda_channels_last_matches_float64_reference(dtype, tol):
    """Oracle: float64 CPU reference; on CUDA the output comes back channels_last_3d and the chunked run
    equals the full run. Tolerance relative to the output scale: cuDNN runs fp32 convs in TF32 by default
    (10-bit mantissa; 3e-4 seen on an H200 for 432-term sums), so 2e-3; bf16 3e-2."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, 16, 9, 24, 40, generator=gen, dtype=torch.float64)
    w = torch.randn(32, 16, 3, 3, 3, generator=gen, dtype=torch.float64) / 12
    b = torch.randn(32, generator=gen, dtype=torch.float64)
    ref = _reference(x, w, b, (2, 1, 1))
    xc, wc, bc = (t.to("cuda", dtype) for t in (x, w, b))
    out, _ = causal_conv3d(xc, wc, bc, (2, 1, 1))
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    first, cache = causal_conv3d(xc[:, :, :1], wc, bc, (2, 1, 1))
    rest, _ = causal_conv3d(xc[:, :, 1:], wc, bc, (2, 1, 1), cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], 2).double().cpu(), out.double().cpu(),
                               rtol=tol, atol=tol * ref.abs().max().item())
