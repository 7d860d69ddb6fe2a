"""Every CUDA backend of attention() (bf16) against the float64 CPU reference, new masks included.

Oracle: attention_reference in float64 on the CPU, on the same bf16-representable
inputs. Runs only with a CUDA device (``@pytest.mark.gpu``): the lead runs
``python -m pytest libs/lf-kernels/tests/test_attention_gpu_masks.py`` on the H200.

Tolerance (bf16): inputs exact in bf16, kernels accumulate in fp32, the output is
rounded once to bf16 (relative step 2**-8, |out| <= ~3 for randn v) -> 3e-2
absolute as in test_attention_gpu.py; FlexAttention / flash also round P to bf16
before P @ V (another 2**-8 relative on a convex combination) -> still inside
3e-2. Gradients sum over up to a few hundred keys and 4 query heads per kv head
with bf16-rounded intermediates: 4x the output tolerance. lse is float32
throughout: 1e-3 absolute on values of size ~log(seq) + |scores|.
"""

import zlib

import pytest
import torch

from lf_kernels._attention import attention
from lf_kernels._dispatch import choose_backend
from lf_kernels._mask import MaskSpec
from lf_kernels._reference import attention_reference

pytestmark = pytest.mark.gpu

TOL, GRAD_TOL, LSE_TOL = 3e-2, 1.2e-1, 1e-3
GRID = (5, 7, 11)  # 385 tokens: not a multiple of 128
SEQ = GRID[0] * GRID[1] * GRID[2]
MASKS = {
    "full": MaskSpec("full"),
    "causal": MaskSpec("causal"),
    "prefix_lm": MaskSpec("prefix_lm", prefix_len=100),
    "block_causal": MaskSpec("block_causal", frame_tokens=77),
    "window_3d": MaskSpec("window_3d", grid=GRID, window=(3, 3, 5)),
    "window_3d_causal_t": MaskSpec("window_3d", grid=GRID, window=(3, 5, 3), causal_t=True),
}


def _inputs(params, heads_q, heads_kv, seq_q, head_dim, batch=2):
    gen = torch.Generator().manual_seed(zlib.crc32(repr(params).encode()))

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64).to(torch.bfloat16).double()

    q64 = randn(batch, heads_q, seq_q, head_dim)
    k64, v64 = randn(batch, heads_kv, SEQ, head_dim), randn(batch, heads_kv, SEQ, head_dim)
    grad_out = torch.randn(batch, heads_q, seq_q, head_dim, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(batch, heads_q, seq_q, generator=gen, dtype=torch.float64)
    document_ids = torch.cumsum((torch.rand(batch, SEQ, generator=gen) < 3 / SEQ).long(), dim=1)
    return q64, k64, v64, grad_out, grad_lse, document_ids


def _run_and_compare(mask, params, *, heads=(8, 2), head_dim=64, seq_q=SEQ, documents=False, padding=False,
                     return_lse=False, expect_backend=None):
    q64, k64, v64, grad_out, grad_lse, document_ids = _inputs(params, *heads, seq_q, head_dim)
    extra = {}
    if documents:
        extra["document_ids"] = document_ids
    if padding:
        key_padding = torch.ones(2, SEQ, dtype=torch.bool)
        key_padding[1, SEQ // 2:] = False
        extra["key_padding"] = key_padding
    if expect_backend is not None:
        got = choose_backend(mask, seq_q, SEQ, device="cuda", dtype=torch.bfloat16, return_lse=return_lse,
                             has_documents=documents, has_key_padding=padding)
        assert got == expect_backend
    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    result = attention(q, k, v, mask, return_lse=return_lse, **{n: t.cuda() for n, t in extra.items()})
    out, lse = result if return_lse else (result, None)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref_out, ref_lse = attention_reference(q64, k64, v64, mask, **extra)
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=TOL, atol=TOL)
    outputs, ref_outputs, ups = (out,), (ref_out,), (grad_out,)
    if return_lse:
        assert lse.dtype == torch.float32
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse.double().cpu()[finite], ref_lse[finite], rtol=LSE_TOL, atol=LSE_TOL)
        assert torch.isneginf(lse.cpu()[~finite]).all()
        # Upstream lse grads only where the lse is finite (a -inf lse has no meaningful gradient).
        ups_lse = torch.where(finite, grad_lse, torch.zeros_like(grad_lse))
        outputs, ref_outputs, ups = (out, lse), (ref_out, ref_lse), (grad_out, ups_lse)
    grads = torch.autograd.grad(outputs, (q, k, v), [u.to("cuda", o.dtype) for u, o in zip(ups, outputs, strict=True)])
    ref_ups = [u.masked_fill(~torch.isfinite(r), 0) if r.dim() == 3 else u for u, r in zip(ups, ref_outputs,
                                                                                              strict=True)]
    ref_grads = torch.autograd.grad(
        [r.masked_fill(~torch.isfinite(r), 0) for r in ref_outputs], (q64, k64, v64), ref_ups
    )
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(got).all(), f"d{name} not finite"
        torch.testing.assert_close(got.double().cpu(), want, rtol=GRAD_TOL, atol=GRAD_TOL,
                                   msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("kind", list(MASKS))
def test_cuda_masks_bf16(kind, documents, return_lse):
    """Oracle: float64 CPU reference; whichever backend the dispatcher picks (flex for most of these)."""
    _run_and_compare(MASKS[kind], (kind, documents, return_lse), documents=documents, return_lse=return_lse)


@pytest.mark.parametrize(("heads", "head_dim"), [((8, 8), 64), ((8, 2), 80), ((8, 1), 128)])
@pytest.mark.parametrize("kind", ["block_causal", "window_3d"])
def test_cuda_gqa_and_head_dims(kind, heads, head_dim):
    """Oracle: float64 CPU reference; GQA ratios 1 / 4 / 8 with head dims 64 / 80 / 128, lse returned
    (sdpa_split for block_causal, flex for window_3d)."""
    _run_and_compare(MASKS[kind], ("gqa", kind, heads, head_dim), heads=heads, head_dim=head_dim,
                     return_lse=True, expect_backend="sdpa_split" if kind == "block_causal" else "flex")


@pytest.mark.parametrize(
    ("kind", "extra", "backend"),
    [
        ("block_causal", {}, "sdpa_split"),
        ("block_causal", {"return_lse": True}, "sdpa_split"),
        ("block_causal", {"documents": True}, "flex"),
        ("window_3d", {"padding": True, "documents": True, "return_lse": True}, "flex"),
        ("causal", {}, "sdpa_causal"),
        ("full", {}, "sdpa"),
        ("prefix_lm", {"seq_q": 200}, "flex"),
        ("causal", {"seq_q": 100, "return_lse": True}, "math"),
        ("block_causal", {"seq_q": 100}, "sdpa_mask"),
    ],
)
def test_each_cuda_backend(kind, extra, backend):
    """Oracle: float64 CPU reference; one case per CUDA backend (the dispatcher is asked first)."""
    _run_and_compare(MASKS[kind], ("backend", kind, backend), expect_backend=backend, **extra)


@pytest.mark.parametrize(("kind", "heads", "head_dim"), [("causal", (8, 2), 64), ("causal", (8, 1), 128),
                                                       ("full", (8, 8), 80), ("causal", (4, 4), 128)])
def test_flash_varlen_backend(monkeypatch, kind, heads, head_dim):
    """Oracle: float64 CPU reference; packed documents through a varlen kernel (flash_attn, else torch's
    varlen_attn; skipped where neither exists; FlexAttention, which the dispatcher prefers, is hidden from it
    here), GQA 1 / 4 / 8, head dims 64 / 80 / 128."""
    import lf_kernels._attention as attention_module
    from lf_kernels._varlen import varlen_available

    if not varlen_available():
        pytest.skip("no varlen kernel: neither flash_attn nor torch.nn.attention.varlen")
    backends = []

    def without_flex(*args, **kwargs):
        backends.append(choose_backend(*args, **{**kwargs, "flex": False}))
        return backends[-1]

    monkeypatch.setattr(attention_module, "choose_backend", without_flex)
    _run_and_compare(MASKS[kind], ("varlen", kind, heads, head_dim), heads=heads, head_dim=head_dim,
                     documents=True)
    assert backends[0] == "flash_varlen"


@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
def test_sdpa_frames_backend(heads):
    """Oracle: float64 CPU reference; the per-frame SDPA decomposition (taken when FlexAttention is missing)."""
    from lf_kernels._attention import _sdpa_frames

    mask = MASKS["block_causal"]
    q64, k64, v64, grad_out, _, _ = _inputs(("frames", heads), *heads, SEQ, 64)
    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in (q64, k64, v64))
    out = _sdpa_frames(q, k, v, mask.frame_tokens, 64**-0.5)
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to("cuda", torch.bfloat16))
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    ref_out, _ = attention_reference(q64, k64, v64, mask)
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=TOL, atol=TOL)
    for got, want in zip(grads, torch.autograd.grad(ref_out, (q64, k64, v64), grad_out), strict=True):
        torch.testing.assert_close(got.double().cpu(), want, rtol=GRAD_TOL, atol=GRAD_TOL)
