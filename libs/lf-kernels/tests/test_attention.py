"""attention() against attention_reference (float64), forward and backward.

Oracle everywhere: ``attention_reference`` run in float64 on the same inputs,
itself checked against a literal Python-loop softmax in test_reference.py.
"""

import itertools
import zlib

import pytest
import torch
import torch.nn.functional as F

from lf_kernels import MaskSpec, attention, attention_reference, select_backend

# float64: both sides compute the same maths in double precision, so only
# summation order differs (~1e-15 relative); 1e-10 leaves room for conditioning.
F64_TOL = {"rtol": 1e-10, "atol": 1e-10}

MASKS = {
    "full": MaskSpec("full"),
    "causal": MaskSpec("causal"),
    "prefix_lm": MaskSpec("prefix_lm", prefix_len=5),
}
GQA = [(4, 4), (4, 2), (8, 2)]  # (heads_q, heads_kv): ratios 1, 2, 4
# (seq_q, seq_kv, head_dim): odd lengths, decoding (seq_q < seq_kv) and seq_q > seq_kv.
SHAPES = [(1, 1, 16), (7, 7, 24), (33, 33, 64), (7, 33, 16), (1, 33, 24), (33, 7, 64)]


def _seed(*params) -> int:
    """A fresh, reproducible seed per parametrization."""
    return zlib.crc32(repr(params).encode())


def _inputs(seed, heads, shape, padded, dtype=torch.float64, batch=2):
    gen = torch.Generator().manual_seed(seed)
    (heads_q, heads_kv), (seq_q, seq_kv, head_dim) = heads, shape

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()

    q = randn(batch, heads_q, seq_q, head_dim)
    k = randn(batch, heads_kv, seq_kv, head_dim)
    v = randn(batch, heads_kv, seq_kv, head_dim)
    key_padding = None
    if padded:
        key_padding = torch.rand(batch, seq_kv, generator=gen) > 0.3
        key_padding[:, -1] = True  # keep most rows non-empty; empty rows have their own test
    grad_out = torch.randn(batch, heads_q, seq_q, head_dim, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(batch, heads_q, seq_q, generator=gen, dtype=torch.float64)
    return q, k, v, key_padding, grad_out, grad_lse


CASES = list(itertools.product(MASKS, [False, True], GQA, SHAPES))


@pytest.mark.parametrize(("kind", "padded", "heads", "shape"), CASES)
@pytest.mark.parametrize("return_lse", [False, True])
def test_matches_reference_float64(kind, padded, heads, shape, return_lse):
    """Oracle: attention_reference in float64; out, lse and grads of q, k, v."""
    q, k, v, key_padding, grad_out, grad_lse = _inputs(
        _seed(kind, padded, heads, shape, return_lse), heads, shape, padded
    )
    ref_out, ref_lse = attention_reference(q, k, v, MASKS[kind], key_padding=key_padding)
    result = attention(q, k, v, MASKS[kind], key_padding=key_padding, return_lse=return_lse)
    if return_lse:
        out, lse = result
        assert lse.dtype == torch.float64
        torch.testing.assert_close(lse, ref_lse, **F64_TOL)
        outputs, ref_outputs, grads_up = (out, lse), (ref_out, ref_lse), (grad_out, grad_lse)
    else:
        out = result
        outputs, ref_outputs, grads_up = (out,), (ref_out,), (grad_out,)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, **F64_TOL)
    grads = torch.autograd.grad(outputs, (q, k, v), grads_up)
    ref_grads = torch.autograd.grad(ref_outputs, (q, k, v), grads_up)
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **F64_TOL, msg=lambda m, n=name: f"d{n}: {m}")


SDPA_CASES = [
    (kind, padded, heads, shape)
    for kind, padded, heads, shape in CASES
    if shape[2] == 64 or shape[0] != shape[1]
]


@pytest.mark.parametrize(("kind", "padded", "heads", "shape"), SDPA_CASES)
def test_sdpa_paths_float32_against_float64_reference(kind, padded, heads, shape):
    """Oracle: attention_reference in float64 on the same (float32-representable) inputs.

    Tolerance: float32 has eps ~1.2e-7; the kernels sum up to head_dim=64
    products for scores, 33 exp-weighted values for the output and a few more
    terms in backward, each O(1) with randn inputs; the largest error measured
    over these cases is 2.5e-6 absolute. 2e-5 keeps an 8x margin while still
    catching any masking or GQA mistake (those are O(1e-1)).
    """
    q, k, v, key_padding, grad_out, _ = _inputs(
        _seed("f32", kind, padded, heads, shape), heads, shape, padded, dtype=torch.float32
    )
    out = attention(q, k, v, MASKS[kind], key_padding=key_padding)
    assert out.dtype == torch.float32
    grads = torch.autograd.grad(out, (q, k, v), grad_out.float())
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, _ = attention_reference(q64, k64, v64, MASKS[kind], key_padding=key_padding)
    ref_grads = torch.autograd.grad(ref_out, (q64, k64, v64), grad_out)
    tol = {"rtol": 2e-5, "atol": 2e-5}
    torch.testing.assert_close(out.double(), ref_out, **tol)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, **tol)


def test_math_path_float32_accumulates_in_float32_and_returns_float32_lse():
    """Oracle: float64 reference; lse dtype is float32 for bf16 inputs (contract)."""
    q, k, v, _, _, _ = _inputs(7, (4, 2), (7, 7, 16), False, dtype=torch.bfloat16)
    out, lse = attention(q, k, v, MaskSpec("causal"), return_lse=True)
    assert out.dtype == torch.bfloat16
    assert lse.dtype == torch.float32
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    ref_out, ref_lse = attention_reference(q64, k64, v64, MaskSpec("causal"))
    # lse accumulated in float32 from exact bf16 inputs: float32-level error.
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    # out is rounded to bf16 (8 mantissa bits, relative step 2**-8).
    torch.testing.assert_close(out.double(), ref_out, rtol=2**-7, atol=2**-7)


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fully_masked_rows_are_zero_with_finite_grads(return_lse, dtype):
    """Oracle: the contract; rows with no allowed key give out = 0, lse = -inf, no NaN.

    Batch element 1 is entirely padding; with causal and seq_q > seq_kv the
    first two queries of batch element 0 sit at negative positions.
    """
    q, k, v, _, grad_out, grad_lse = _inputs(3, (4, 2), (5, 3, 16), False, dtype=dtype)
    key_padding = torch.tensor([[True, True, True], [False, False, False]])
    result = attention(q, k, v, MaskSpec("causal"), key_padding=key_padding, return_lse=return_lse)
    out, lse = result if return_lse else (result, None)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[0, :, :2], torch.zeros_like(out[0, :, :2]))
    assert not torch.equal(out[0, :, 2:], torch.zeros_like(out[0, :, 2:]))
    outputs, grads_up = (out,), (grad_out.to(dtype),)
    if return_lse:
        assert torch.isneginf(lse[1]).all() and torch.isneginf(lse[0, :, :2]).all()
        assert torch.isfinite(lse[0, :, 2:]).all()
        outputs, grads_up = (out, lse), (grad_out.to(dtype), grad_lse.to(lse.dtype))
    dq, dk, dv = torch.autograd.grad(outputs, (q, k, v), grads_up)
    for grad in (dq, dk, dv):
        assert torch.isfinite(grad).all()
    # Nothing attends in batch element 1, so nothing flows into it.
    assert torch.equal(dq[1], torch.zeros_like(dq[1]))
    assert torch.equal(dk[1], torch.zeros_like(dk[1]))
    assert torch.equal(dv[1], torch.zeros_like(dv[1]))


@pytest.mark.parametrize(
    ("mask", "seq_q", "seq_kv", "padded", "return_lse", "backend"),
    [
        (MaskSpec("full"), 5, 5, False, False, "sdpa"),
        (MaskSpec("full"), 3, 5, False, False, "sdpa"),
        (MaskSpec("causal"), 5, 5, False, False, "sdpa_causal"),
        (MaskSpec("causal"), 3, 5, False, False, "sdpa_mask"),
        (MaskSpec("causal"), 5, 5, True, False, "sdpa_mask"),
        (MaskSpec("full"), 5, 5, True, False, "sdpa_mask"),
        (MaskSpec("prefix_lm", prefix_len=2), 5, 5, False, False, "sdpa_mask"),
        (MaskSpec("causal"), 5, 5, False, True, "math"),
    ],
)
def test_dispatch(monkeypatch, mask, seq_q, seq_kv, padded, return_lse, backend):
    """Oracle: the dispatch table in the _attention module docstring.

    SDPA is wrapped to record how it was called: not at all for "math",
    is_causal without a mask for "sdpa_causal", a bool mask for "sdpa_mask".
    """
    calls = []
    real_sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    assert select_backend(
        mask, seq_q, seq_kv, has_key_padding=padded, return_lse=return_lse
    ) == backend
    q = torch.randn(1, 2, seq_q, 8)
    k = v = torch.randn(1, 2, seq_kv, 8)
    key_padding = torch.ones(1, seq_kv, dtype=torch.bool) if padded else None
    attention(q, k, v, mask, key_padding=key_padding, return_lse=return_lse)
    if backend == "math":
        assert calls == []
        return
    assert len(calls) == 1
    assert calls[0].get("is_causal", False) == (backend == "sdpa_causal")
    attn_mask = calls[0].get("attn_mask")
    if backend == "sdpa_mask":
        assert attn_mask is not None and attn_mask.dtype == torch.bool
    else:
        assert attn_mask is None


def test_scale_argument():
    """Oracle: reference with the same explicit scale; differs from the default scale."""
    q, k, v, _, _, _ = _inputs(11, (2, 2), (7, 7, 16), False)
    for return_lse in (False, True):
        got = attention(q, k, v, MaskSpec("causal"), scale=0.3, return_lse=return_lse)
        got = got[0] if return_lse else got
        want, _ = attention_reference(q, k, v, MaskSpec("causal"), scale=0.3)
        torch.testing.assert_close(got, want, **F64_TOL)
    default, _ = attention_reference(q, k, v, MaskSpec("causal"))
    assert not torch.allclose(default, want)


def test_bad_gqa_and_shapes_raise():
    """Oracle: the attention contract (ValueError naming the numbers received)."""
    q = torch.randn(1, 3, 4, 8)
    k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="heads_q=3, heads_kv=2"):
        attention(q, k, v, MaskSpec("full"))
    with pytest.raises(ValueError, match="heads_q=3, heads_kv=2"):
        attention_reference(q, k, v, MaskSpec("full"))
    with pytest.raises(ValueError, match=r"q must have shape .* got \(3, 4, 8\)"):
        attention(q[0], k, v, MaskSpec("full"))
    with pytest.raises(ValueError, match="head_dim differ: 8 vs 6"):
        attention(q, torch.randn(1, 1, 4, 6), torch.randn(1, 1, 4, 6), MaskSpec("full"))
    with pytest.raises(TypeError, match="mask must be a MaskSpec, got str"):
        attention(q, q, q, "causal")
