"""fused_linear_cross_entropy against the materializing float64 reference and PyTorch's cross_entropy.

Oracles: ``linear_cross_entropy_reference`` in float64 (loss, grads of hidden,
weight and bias) on fresh random inputs, in both modes (gradients computed in
the forward, and recomputed in the backward), with ignored rows, label
smoothing, z-loss, a bias, all three reductions, token counts that chunks do
not divide and vocabularies that the kernel's block does not divide; and
``torch.nn.functional.cross_entropy`` for the reference itself (z-loss 0). The
per-chunk softmax/CE-gradient kernel runs compiled on CUDA, else under Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``); the torch chunk path is
checked too. Tolerance: float32 logits and softmax, ~1e-6 relative (2e-5
allowed); bf16 inputs: the logits' gradient and every GEMM output are rounded
to bf16 (2 ulps of the largest entry, 2**-7).
"""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from lf_kernels._fused_reference import linear_cross_entropy_reference  # noqa: E402
from lf_kernels.triton._dispatch import kernel_backend  # noqa: E402
from lf_kernels.triton._fused_ce import fused_linear_cross_entropy  # noqa: E402
from lf_kernels.triton._fused_ce_sweep import default_chunk  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODES = pytest.mark.parametrize("grad_in_forward", [True, False], ids=["grad_in_fwd", "recompute"])


def make(seed, tokens=(3, 7), hidden=80, vocab=333, dtype=torch.float32, bias=False):
    """float64 leaves exactly representable in ``dtype``; 4 ignored targets; optional bias."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(*tokens, hidden, generator=gen, dtype=torch.float64).to(dtype).double().requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * 0.3).to(dtype).double().requires_grad_()
    b = torch.randn(vocab, generator=gen, dtype=torch.float64).to(dtype).double().requires_grad_() if bias else None
    t = torch.randint(0, vocab, tokens, generator=gen)
    t.view(-1)[[0, 1, 5, -1]] = -100
    return h, w, b, t


def leaves(xs, dtype):
    return [None if x is None else x.detach().to(DEVICE, dtype).requires_grad_() for x in xs]


def compare(h, w, b, t, dtype, *, grad_scale=1.7, tol=None, **kw):
    """Loss and all gradients, with ``grad_output = grad_scale``, against the float64 reference."""
    ours = leaves((h, w, b), dtype)
    loss = fused_linear_cross_entropy(ours[0], ours[1], t.to(DEVICE), bias=ours[2], **kw)
    grads = torch.autograd.grad(loss, [x for x in ours if x is not None], torch.tensor(grad_scale).to(loss))
    for key in ("chunk_tokens", "backend", "grad_in_forward", "grad_weight_dtype"):
        kw.pop(key, None)
    ref = linear_cross_entropy_reference(h, w, t, bias=b, **kw)
    ref_grads = torch.autograd.grad(ref * grad_scale, [x for x in (h, w, b) if x is not None])
    tol = tol or (2e-5 if dtype == torch.float32 else 2**-7)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    for name, a, e in zip(["dhidden", "dweight", "dbias"], grads, ref_grads, strict=False):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double().cpu(), e, rtol=tol, atol=tol * float(e.abs().max()), msg=name)


@MODES
@pytest.mark.parametrize(("label_smoothing", "z_loss", "reduction"),
                         [(0.0, 0.0, "mean"), (0.1, 1e-3, "mean"), (0.25, 0.02, "sum"), (0.0, 1e-4, "sum")])
@pytest.mark.parametrize("chunk_tokens", [4, 21])
def test_triton_chunks_match_reference(grad_in_forward, label_smoothing, z_loss, reduction, chunk_tokens):
    """Oracle: float64 reference; 21 tokens (4 ignored) in chunks of 4 (ragged last chunk) or one chunk."""
    h, w, b, t = make(int(label_smoothing * 100 + z_loss * 1e4) + chunk_tokens)
    assert kernel_backend(h.to(DEVICE)) == "triton"
    compare(h, w, b, t, torch.float32, label_smoothing=label_smoothing, z_loss=z_loss, reduction=reduction,
            chunk_tokens=chunk_tokens, grad_in_forward=grad_in_forward)


@MODES
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias(grad_in_forward, dtype):
    """Oracle: float64 reference with the bias added to the logits; grad of the bias = column sums of dlogits."""
    h, w, b, t = make(3, tokens=(2, 9), bias=True, dtype=dtype)
    compare(h, w, b, t, dtype, label_smoothing=0.1, z_loss=1e-3, chunk_tokens=5, grad_in_forward=grad_in_forward)


@MODES
@pytest.mark.parametrize(("hidden", "dtype"), [(96, torch.float32), (130, torch.bfloat16)])
def test_triton_vocab_over_one_block(grad_in_forward, hidden, dtype):
    """Oracle: float64 reference on dtype-exact inputs; vocab 20,000 > one 16,384-wide kernel block, not a multiple."""
    h, w, b, t = make(hidden, tokens=(7,), hidden=hidden, vocab=20000, dtype=dtype)
    compare(h, w, b, t, dtype, label_smoothing=0.1, z_loss=1e-3, chunk_tokens=3, grad_in_forward=grad_in_forward)


@MODES
@pytest.mark.parametrize("grad_output", [1.0, 0.37, -2.5])
def test_grad_output_scales_gradients(grad_in_forward, grad_output):
    """Oracle: float64 reference gradients times grad_output (loss.backward(g) for g != 1, bf16 inputs)."""
    h, w, b, t = make(4, tokens=(19,), bias=True, dtype=torch.bfloat16)
    compare(h, w, b, t, torch.bfloat16, grad_scale=grad_output, reduction="sum", chunk_tokens=8,
            grad_in_forward=grad_in_forward)


def test_reduction_none_per_token_grad_output():
    """Oracle: float64 reference with reduction="none" and a random per-token grad_output (recompute mode)."""
    h, w, b, t = make(5, bias=True)
    ours = leaves((h, w, b), torch.float32)
    loss = fused_linear_cross_entropy(ours[0], ours[1], t.to(DEVICE), bias=ours[2], reduction="none",
                                      label_smoothing=0.2, z_loss=1e-3, chunk_tokens=6)
    ref = linear_cross_entropy_reference(h, w, t, bias=b, reduction="none", label_smoothing=0.2, z_loss=1e-3)
    assert loss.shape == t.shape and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=2e-5, atol=2e-5)
    g = torch.randn(t.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(loss, ours, g.float().to(DEVICE))
    for a, e in zip(grads, torch.autograd.grad(ref, (h, w, b), g), strict=True):
        torch.testing.assert_close(a.double().cpu(), e, rtol=2e-5, atol=2e-5 * float(e.abs().max()))


@pytest.mark.parametrize("accum", [None, torch.float32])
def test_grad_weight_accumulator_many_chunks(accum):
    """Oracle: float64 reference; bf16 inputs in 16 chunks. A float32 accumulator rounds grad_weight once
    (1 bf16 ulp of the largest entry); the bf16 one rounds per chunk (2 ulps allowed)."""
    h, w, b, t = make(6, tokens=(64,), hidden=48, vocab=200, dtype=torch.bfloat16)
    compare(h, w, b, t, torch.bfloat16, grad_scale=1.0, chunk_tokens=4, grad_weight_dtype=accum,
            tol=2**-8 if accum else 2**-7)


@MODES
@pytest.mark.parametrize("bias", [False, True])
def test_torch_chunk_path_matches_reference(grad_in_forward, bias):
    """Oracle: float64 reference; the per-chunk step in torch (backend="reference"), float64 end to end."""
    h, w, b, t = make(7, bias=bias)
    ours = [None if x is None else x.detach().clone().requires_grad_() for x in (h, w, b)]
    loss = fused_linear_cross_entropy(ours[0], ours[1], t, label_smoothing=0.1, z_loss=1e-3, chunk_tokens=5,
                                      bias=ours[2], backend="reference", grad_in_forward=grad_in_forward)
    ref = linear_cross_entropy_reference(h, w, t, label_smoothing=0.1, z_loss=1e-3, bias=b)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    leaves_ = [x for x in ours if x is not None]
    for a, e in zip(torch.autograd.grad(loss * 0.6, leaves_), torch.autograd.grad(ref * 0.6, [
            x for x in (h, w, b) if x is not None]), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_reference_matches_torch_cross_entropy(label_smoothing):
    """Oracle: F.cross_entropy on materialized logits (+ bias, z-loss 0), all reductions, ignore_index rows."""
    h, w, b, t = make(8, dtype=torch.float64, bias=True)
    for reduction in ("mean", "sum", "none"):
        expected = F.cross_entropy((h @ w.T + b).reshape(-1, w.shape[0]), t.reshape(-1), ignore_index=-100,
                                   label_smoothing=label_smoothing, reduction=reduction)
        got = linear_cross_entropy_reference(h, w, t, label_smoothing=label_smoothing, reduction=reduction, bias=b)
        torch.testing.assert_close(got.reshape(expected.shape), expected, rtol=1e-12, atol=1e-12)


@MODES
def test_all_targets_ignored_gives_zero_loss_and_grads(grad_in_forward):
    """Oracle: documented convention (PyTorch gives NaN here): loss 0, zero gradients, in both modes."""
    h, w, b, t = make(9, bias=True)
    t[:] = 7
    ours = leaves((h, w, b), torch.float32)
    loss = fused_linear_cross_entropy(ours[0], ours[1], t.to(DEVICE), ignore_index=7, chunk_tokens=8, bias=ours[2],
                                      grad_in_forward=grad_in_forward)
    grads = torch.autograd.grad(loss, ours)
    assert loss.item() == 0.0
    assert not any(g.any() for g in grads)


def test_no_grad_and_frozen_inputs():
    """Oracle: float64 reference; under no_grad the loss alone, with a frozen weight only dhidden, with a
    frozen hidden only dweight (grad-in-forward computes only what is asked)."""
    h, w, _, t = make(10)
    ref = linear_cross_entropy_reference(h, w, t)
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h.detach().float().to(DEVICE), w.detach().float().to(DEVICE), t.to(DEVICE))
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=2e-5, atol=2e-5)
    for mode in (True, False):
        hd = h.detach().float().to(DEVICE).requires_grad_()
        loss = fused_linear_cross_entropy(hd, w.detach().float().to(DEVICE), t.to(DEVICE), chunk_tokens=3,
                                          grad_in_forward=mode)
        torch.testing.assert_close(torch.autograd.grad(loss, hd)[0].double().cpu(), ref_gh, rtol=2e-5, atol=2e-5)
        wd = w.detach().float().to(DEVICE).requires_grad_()
        loss = fused_linear_cross_entropy(h.detach().float().to(DEVICE), wd, t.to(DEVICE), chunk_tokens=4,
                                          grad_in_forward=mode)
        torch.testing.assert_close(torch.autograd.grad(loss, wd)[0].double().cpu(), ref_gw, rtol=2e-5, atol=2e-5)


def test_recompute_mode_allows_two_backwards():
    """Oracle: the first backward's gradient (recompute mode keeps the graph with retain_graph=True)."""
    h, w, _, t = make(12)
    hd = h.detach().float().to(DEVICE).requires_grad_()
    loss = fused_linear_cross_entropy(hd, w.detach().float().to(DEVICE), t.to(DEVICE), grad_in_forward=False)
    (first,) = torch.autograd.grad(loss, hd, retain_graph=True)
    (second,) = torch.autograd.grad(loss, hd)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_fp16_defaults_to_recompute():
    """Oracle: the documented automatic mode: fp16 takes the recompute backward (so a second backward works,
    which grad-in-forward refuses), with gradients equal to the float64 reference within fp16 tolerance."""
    h, w, _, t = make(13, dtype=torch.float16)
    hd, wd = leaves((h, w), torch.float16)
    loss = fused_linear_cross_entropy(hd, wd, t.to(DEVICE))
    (first,) = torch.autograd.grad(loss, hd, retain_graph=True)
    (second,) = torch.autograd.grad(loss, hd)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    compare(h, w, None, t, torch.float16, tol=2**-6)


def test_default_chunk():
    """Oracle: the documented rule: float32 chunk logits <= 512 MiB, <= a quarter of the tokens, multiple of 128."""
    assert default_chunk(8192, 128256) == 1024
    assert default_chunk(4096, 32000) == 1024
    assert default_chunk(21, 333) == 6
    assert default_chunk(1, 10) == 1


def test_errors():
    """Oracle: the documented ValueError / RuntimeError messages."""
    h, w = (x.detach().float().to(DEVICE) for x in make(11)[:2])
    t = torch.zeros(3, 7, dtype=torch.long, device=DEVICE)
    bad = t.clone()
    bad[1, 2] = 333
    with pytest.raises(ValueError, match=r"outside \[0, 333\) .* e\.g\. 333"):
        fused_linear_cross_entropy(h, w, bad)
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        fused_linear_cross_entropy(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match="grad_in_forward=True needs reduction 'mean' or 'sum'"):
        fused_linear_cross_entropy(h, w, t, reduction="none", grad_in_forward=True)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        fused_linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="dtypes differ"):
        fused_linear_cross_entropy(h, w.double(), t)
    with pytest.raises(ValueError, match=r"bias must be \(333,\) torch.float32, got \(5,\)"):
        fused_linear_cross_entropy(h, w, t, bias=torch.zeros(5, device=DEVICE))
    with pytest.raises(ValueError, match="grad_weight_dtype must be None"):
        fused_linear_cross_entropy(h, w, t, grad_weight_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"target must be integer with shape \(3, 7\)"):
        fused_linear_cross_entropy(h, w, t[:, :3])
    hd = h.clone().requires_grad_()
    loss = fused_linear_cross_entropy(hd, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same loss twice"):
        loss.backward()
