"""The split block-causal decomposition (``sdpa_split``) on the CPU, with the plain math kernel pair.

Oracle: ``attention_reference`` in float64 with ``MaskSpec("block_causal")`` on fresh random
inputs (forward ``out`` / ``lse`` and the gradients of q, k, v under random upstream gradients of
both), to 1e-10; the call shapes against the decomposition in ``lf_kernels._split_attention``'s
docstring; the CUDA ops' argument lists against this torch's op schemas (meta tensors).
"""

import warnings
import zlib

import pytest
import torch

from lf_kernels import _split_kernels
from lf_kernels._attention import attention
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference
from lf_kernels._split_attention import CausalKernels, attention_split, default_kernels, math_kernels

F64_TOL = {"rtol": 1e-10, "atol": 1e-10}


def _qkv(params, batch, heads_q, heads_kv, seq, head_dim):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(params).encode()))
    return [torch.randn(batch, h, seq, head_dim, generator=gen, dtype=torch.float64).requires_grad_()
            for h in (heads_q, heads_kv, heads_kv)]


def _check(q, k, v, frame_tokens, *, run=None, upstream=("out", "lse")):
    run = run or (lambda q, k, v: attention_split(q, k, v, frame_tokens))
    out, lse = run(q, k, v)
    ref_out, ref_lse = attention_reference(q, k, v, MaskSpec("block_causal", frame_tokens=frame_tokens))
    assert out.dtype == q.dtype
    torch.testing.assert_close(out, ref_out, **F64_TOL)
    if lse is not None:
        assert lse.dtype == torch.float64
        torch.testing.assert_close(lse, ref_lse, **F64_TOL)
    gen = torch.Generator().manual_seed(frame_tokens)
    pairs = {"out": (out, ref_out), "lse": (lse, ref_lse)}
    ups = [torch.randn(pairs[name][0].shape, generator=gen, dtype=torch.float64) for name in upstream]
    got = torch.autograd.grad([pairs[n][0] for n in upstream], (q, k, v), ups)
    want = torch.autograd.grad([pairs[n][1] for n in upstream], (q, k, v), ups, allow_unused=True)
    want = [torch.zeros_like(t) if w is None else w for t, w in zip((q, k, v), want, strict=True)]  # lse: no dv
    for name, g, w in zip("qkv", got, want, strict=True):
        torch.testing.assert_close(g, w, **F64_TOL, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize(
    ("frame_tokens", "seq", "heads", "head_dim", "batch"),
    [
        (7, 35, (4, 4), 64, 2),   # whole frames, odd frame size
        (7, 38, (8, 2), 80, 1),   # partial last frame of 3, GQA 4
        (5, 26, (8, 1), 128, 3),  # partial last frame of 1 (no part-2 tail), GQA 8, batch 3
        (6, 40, (4, 2), 24, 2),   # partial last frame of 4
        (13, 10, (4, 1), 64, 1),  # one frame longer than the sequence
        (2, 9, (2, 2), 16, 2),    # smallest frames
        (1, 9, (2, 1), 16, 1),    # frame of 1: plain causal, no part 2
    ],
)
def test_split_matches_reference(frame_tokens, seq, heads, head_dim, batch):
    """Oracle: float64 reference; out, lse and dq/dk/dv with upstream gradients on both out and lse."""
    q, k, v = _qkv((frame_tokens, seq, heads, head_dim), batch, *heads, seq, head_dim)
    _check(q, k, v, frame_tokens)


@pytest.mark.parametrize("upstream", [("out",), ("lse",)])
def test_split_gradient_of_one_output(upstream):
    """Oracle: float64 reference; only out (no lse gradient pass) or only lse (no dO) receives a gradient."""
    q, k, v = _qkv(("one", upstream), 2, 4, 2, 31, 16)
    _check(q, k, v, 6, upstream=upstream)


def test_split_non_contiguous_inputs():
    """Oracle: float64 reference; q/k/v as (batch, seq, heads, dim) transposed views, the usual model layout."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 23, h, 16, generator=gen, dtype=torch.float64).transpose(1, 2).requires_grad_()
               for h in (4, 2, 2))
    _check(q, k, v, 5)


def test_split_call_shapes():
    """Oracle: the module docstring: one causal call over the sequence, one batched (b * frames, h, F - 1, d)
    call for the whole frames and one (b, h, r - 1, d) call for a last partial frame of r tokens."""
    fwd, bwd = math_kernels()
    shapes = {"fwd": [], "bwd": []}

    def rec_fwd(q, k, v, causal, scale):
        assert causal
        shapes["fwd"].append((tuple(q.shape), tuple(k.shape)))
        return fwd(q, k, v, causal, scale)

    def rec_bwd(dout, q, k, v, out, lse, causal, scale):
        shapes["bwd"].append(tuple(q.shape))
        return bwd(dout, q, k, v, out, lse, causal, scale)

    q, k, v = _qkv("shapes", 2, 8, 2, 7 * 4 + 3, 16)
    out, _ = attention_split(q, k, v, 7, kernels=CausalKernels(rec_fwd, rec_bwd))
    out.sum().backward()
    want = [(2, 8, 31, 16), (2 * 4, 8, 6, 16), (2, 8, 2, 16)]
    assert shapes["fwd"] == [(s, s) for s in want]
    assert shapes["bwd"] == want


def test_math_pair_matches_reference():
    """Oracle: float64 causal reference; the CPU kernel pair alone (lse in natural log; backward from out/lse)."""
    fwd, bwd = math_kernels()
    q, k, v = _qkv("pair", 2, 3, 3, 17, 8)
    out, lse = fwd(q, k, v, True, 0.3)
    ref_out, ref_lse = attention_reference(q, k, v, MaskSpec("causal"), scale=0.3)
    torch.testing.assert_close(out, ref_out, **F64_TOL)
    torch.testing.assert_close(lse, ref_lse, **F64_TOL)
    dout = torch.randn_like(out)
    got = bwd(dout, q, k, v, out, lse, True, 0.3)
    for g, w in zip(got, torch.autograd.grad(ref_out, (q, k, v), dout), strict=True):
        torch.testing.assert_close(g, w, **F64_TOL)


@pytest.mark.parametrize("return_lse", [False, True])
def test_attention_routes_to_split(monkeypatch, return_lse):
    """Oracle: float64 reference; attention() with the dispatcher answering "sdpa_split" (as on CUDA)."""
    import lf_kernels._attention as attention_module

    monkeypatch.setattr(attention_module, "choose_backend", lambda *a, **kw: "sdpa_split")
    q, k, v = _qkv(("route", return_lse), 2, 4, 2, 30, 16)
    mask = MaskSpec("block_causal", frame_tokens=7)
    if return_lse:
        _check(q, k, v, 7, run=lambda q, k, v: attention(q, k, v, mask, return_lse=True))
    else:
        _check(q, k, v, 7, run=lambda q, k, v: (attention(q, k, v, mask), None), upstream=("out",))


@pytest.mark.parametrize(
    ("shapes", "frame_tokens", "match"),
    [
        (((1, 2, 8, 4), (1, 2, 9, 4)), 2, "q_len == kv_len"),
        (((1, 3, 8, 4), (1, 2, 8, 4)), 2, "heads_q=3, heads_kv=2"),
        (((1, 2, 8, 4), (1, 2, 8, 4)), 0, "frame_tokens must be an int >= 1, got 0"),
        (((2, 8, 4), (1, 2, 8, 4)), 2, "must be 4-D"),
    ],
)
def test_split_errors(shapes, frame_tokens, match):
    """Oracle: the Raises section of attention_split (messages name the values)."""
    q, k = torch.zeros(shapes[0]), torch.zeros(shapes[1])
    with pytest.raises(ValueError, match=match):
        attention_split(q, k, k, frame_tokens)


def test_cuda_op_calls_bind_to_this_torch():
    """Oracle: this torch's op schemas and meta kernels; the cuDNN and flash calls (positional order, None for
    undefined tensors, dummy philox tensors, the lse rank handed back to the cuDNN backward) bind and return
    (batch, heads, seq, head_dim) tensors and a (batch, heads, seq) lse."""
    q = torch.empty(2, 4, 24, 64, device="meta", dtype=torch.bfloat16)
    for fwd, bwd in ((_split_kernels._cudnn_forward, _split_kernels._cudnn_backward),
                     (_split_kernels._flash_forward, _split_kernels._flash_backward)):
        out, lse = fwd(q, q, q, True, 0.125)
        assert out.shape == q.shape and lse.shape == (2, 4, 24) and lse.dtype == torch.float32
        grads = bwd(q, q, q, q, out, lse, True, 0.125)
        assert [g.shape for g in grads] == [q.shape] * 3


def test_cuda_pair_falls_back_to_flash(monkeypatch):
    """Oracle: the module docstring of _split_kernels: a cuDNN RuntimeError switches that shape (head_dim, dtype,
    lengths) to the flash kernels for the process, with one warning; another length still tries cuDNN first."""
    calls = []

    def cudnn(q, k, v, causal, scale):
        calls.append("cudnn")
        raise RuntimeError("cuDNN Frontend error: no engine")

    def flash(q, k, v, causal, scale):
        calls.append("flash")
        return q, q[..., 0]

    monkeypatch.setattr(_split_kernels, "_CUDNN_FAILED", set())
    call = _split_kernels._with_fallback(cudnn, flash)
    q = torch.zeros(1, 1, 4, 40)
    with pytest.warns(UserWarning, match="head_dim=40"):
        call(q, q, q, True, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(q, q, q, True, 1.0)
    assert calls == ["cudnn", "flash", "flash"]
    longer = torch.zeros(1, 1, 8, 40)
    with pytest.warns(UserWarning, match="query/key length 8/8"):
        call(longer, longer, longer, True, 1.0)
    assert calls[3:] == ["cudnn", "flash"]


def test_default_kernels_and_support():
    """Oracle: docstrings; the math pair off CUDA, which takes any dtype and head dim."""
    assert default_kernels("cpu") == CausalKernels(*math_kernels())
    q = torch.zeros(1, 1, 4, 12, dtype=torch.float64)
    assert _split_kernels.kernels_support(q, q)
    assert _split_kernels.split_ops_available()
