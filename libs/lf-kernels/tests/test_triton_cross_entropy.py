"""fused_linear_cross_entropy against the materializing float64 reference and PyTorch's cross_entropy.

Oracles: ``linear_cross_entropy_reference`` in float64 (loss, grad of hidden
and weight) on fresh random inputs, with ignored rows, label smoothing, z-loss,
both reductions and chunk sizes that do not divide the token count; and
``torch.nn.functional.cross_entropy`` for the reference itself (z-loss 0).
The per-chunk softmax/CE-gradient kernel runs compiled on CUDA, else under
Triton's interpreter on the CPU (``TRITON_INTERPRET=1``); the torch chunk path
is checked too. Tolerance: float32 logits and softmax, so ~1e-6 relative (2e-5
allowed); bf16 matmuls round logits and gradients to bf16 (2 ulps of the largest entry).
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

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make(seed, tokens=(3, 7), hidden=80, vocab=333, dtype=torch.float32):
    """float64 leaves exactly representable in ``dtype``; 4 ignored targets."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(*tokens, hidden, generator=gen, dtype=torch.float64).to(dtype).double().requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * 0.3).to(dtype).double().requires_grad_()
    t = torch.randint(0, vocab, tokens, generator=gen)
    t.view(-1)[[0, 1, 5, -1]] = -100
    return h, w, t


def compare(h, w, t, dtype, *, backend=None, grad_scale=1.7, **kw):
    hd, wd = (h.detach().to(DEVICE, dtype).requires_grad_(), w.detach().to(DEVICE, dtype).requires_grad_())
    loss = fused_linear_cross_entropy(hd, wd, t.to(DEVICE), backend=backend, **kw)
    grads = torch.autograd.grad(loss * grad_scale, (hd, wd))
    kw.pop("chunk_tokens", None)
    ref = linear_cross_entropy_reference(h, w, t, **kw)
    ref_grads = torch.autograd.grad(ref * grad_scale, (h, w))
    tol = 2e-5 if dtype == torch.float32 else 2**-7
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    for name, a, e in zip(["dhidden", "dweight"], grads, ref_grads, strict=False):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double().cpu(), e, rtol=tol, atol=tol * float(e.abs().max()), msg=name)


@pytest.mark.parametrize(("label_smoothing", "z_loss", "reduction"),
                         [(0.0, 0.0, "mean"), (0.1, 1e-3, "mean"), (0.25, 0.02, "sum"), (0.0, 1e-4, "sum")])
@pytest.mark.parametrize("chunk_tokens", [4, 21])
def test_triton_chunks_match_reference(label_smoothing, z_loss, reduction, chunk_tokens):
    """Oracle: float64 reference; 21 tokens (4 ignored) in chunks of 4 (ragged last chunk) or one chunk."""
    h, w, t = make(int(label_smoothing * 100 + z_loss * 1e4) + chunk_tokens)
    assert kernel_backend(h.to(DEVICE)) == "triton"
    compare(h, w, t, torch.float32, label_smoothing=label_smoothing, z_loss=z_loss, reduction=reduction,
            chunk_tokens=chunk_tokens)


@pytest.mark.parametrize(("hidden", "dtype"), [(96, torch.float32), (130, torch.bfloat16)])
def test_triton_vocab_over_one_block(hidden, dtype):
    """Oracle: float64 reference on dtype-exact inputs; vocab 20,000 > one 16,384-wide kernel block."""
    h, w, t = make(hidden, tokens=(7,), hidden=hidden, vocab=20000, dtype=dtype)
    compare(h, w, t, dtype, label_smoothing=0.1, z_loss=1e-3, chunk_tokens=2)


def test_torch_chunk_path_matches_reference():
    """Oracle: float64 reference; the per-chunk step in torch (backend="reference"), float64 end to end."""
    h, w, t = make(7)
    hd, wd = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fused_linear_cross_entropy(hd, wd, t, label_smoothing=0.1, z_loss=1e-3, chunk_tokens=5,
                                      backend="reference")
    ref = linear_cross_entropy_reference(h, w, t, label_smoothing=0.1, z_loss=1e-3)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for a, e in zip(torch.autograd.grad(loss, (hd, wd)), torch.autograd.grad(ref, (h, w)), strict=False):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
def test_reference_matches_torch_cross_entropy(label_smoothing):
    """Oracle: F.cross_entropy on materialized logits (z-loss 0), both reductions, ignore_index rows."""
    h, w, t = make(8, dtype=torch.float64)
    for reduction in ("mean", "sum"):
        expected = F.cross_entropy((h @ w.T).reshape(-1, w.shape[0]), t.reshape(-1), ignore_index=-100,
                                   label_smoothing=label_smoothing, reduction=reduction)
        got = linear_cross_entropy_reference(h, w, t, label_smoothing=label_smoothing, reduction=reduction)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_all_targets_ignored_gives_zero_loss_and_grads():
    """Oracle: documented convention (PyTorch gives NaN here): loss 0, zero gradients."""
    h, w, t = make(9)
    t[:] = 7
    hd, wd = h.detach().float().to(DEVICE).requires_grad_(), w.detach().float().to(DEVICE).requires_grad_()
    loss = fused_linear_cross_entropy(hd, wd, t.to(DEVICE), ignore_index=7, chunk_tokens=8)
    gh, gw = torch.autograd.grad(loss, (hd, wd))
    assert loss.item() == 0.0
    assert not gh.any() and not gw.any()


def test_no_grad_and_frozen_weight():
    """Oracle: float64 reference; under no_grad the loss alone, with a frozen weight only dhidden."""
    h, w, t = make(10)
    ref = linear_cross_entropy_reference(h, w, t)
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h.detach().float().to(DEVICE), w.detach().float().to(DEVICE), t.to(DEVICE))
    torch.testing.assert_close(loss.double().cpu(), ref.detach(), rtol=2e-5, atol=2e-5)
    hd = h.detach().float().to(DEVICE).requires_grad_()
    loss = fused_linear_cross_entropy(hd, w.detach().float().to(DEVICE), t.to(DEVICE), chunk_tokens=3)
    (gh,) = torch.autograd.grad(loss, hd)
    (ref_gh,) = torch.autograd.grad(ref, h)
    torch.testing.assert_close(gh.double().cpu(), ref_gh, rtol=2e-5, atol=2e-5)


def test_errors():
    """Oracle: the documented ValueError / RuntimeError messages."""
    h, w = (x.detach().float().to(DEVICE) for x in make(11)[:2])
    t = torch.zeros(3, 7, dtype=torch.long, device=DEVICE)
    bad = t.clone()
    bad[1, 2] = 333
    with pytest.raises(ValueError, match=r"outside \[0, 333\) .* e\.g\. 333"):
        fused_linear_cross_entropy(h, w, bad)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'none'"):
        fused_linear_cross_entropy(h, w, t, reduction="none")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        fused_linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="dtypes differ"):
        fused_linear_cross_entropy(h, w.double(), t)
    with pytest.raises(ValueError, match=r"target must be integer with shape \(3, 7\)"):
        fused_linear_cross_entropy(h, w, t[:, :3])
    hd = h.clone().requires_grad_()
    loss = fused_linear_cross_entropy(hd, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same loss twice"):
        loss.backward()
