"""rms_norm, swiglu and modulate: the Triton kernels against the float64 plain-PyTorch reference.

Oracle: ``lf_kernels._fused_reference`` run in float64 on the same (exactly
representable) inputs, forward and backward (vector-Jacobian products with a
random output gradient). The kernels run compiled on CUDA when there is a GPU,
else under Triton's interpreter on the CPU (``TRITON_INTERPRET=1`` is set here,
before the first kernel call); each test asserts the dispatcher took Triton.
Tolerances: the kernels compute in float32 and round once to the output dtype,
so float32 results agree to ~1e-6 relative (2e-5 allowed: sums over 130
features), bf16 results to a few bf16 ulps of the tensor's largest entry.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from lf_kernels._fused_reference import modulate_reference, rms_norm_reference, swiglu_reference  # noqa: E402
from lf_kernels.triton._dispatch import kernel_backend  # noqa: E402
from lf_kernels.triton._modulate import modulate  # noqa: E402
from lf_kernels.triton._rmsnorm import rms_norm  # noqa: E402
from lf_kernels.triton._swiglu import swiglu  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def rand(gen, *shape, dtype, scale=1.0):
    """Float64 leaf whose values are exactly representable in ``dtype``."""
    t = (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype).double()
    return t.requires_grad_()


def assert_close(actual, expected, dtype, what):
    """float32: 2e-5 relative + absolute; bf16: 2 ulps (2**-7) of the largest entry."""
    expected = expected.detach().double()
    actual = actual.detach().cpu().double()
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-5, atol=2e-5, msg=what)
    else:
        torch.testing.assert_close(actual, expected, rtol=2**-7, atol=2**-7 * float(expected.abs().max()), msg=what)


def run(fn, leaves, dtype, grad_out_seed):
    """Outputs and input grads of ``fn`` on copies of ``leaves`` cast to ``dtype`` on DEVICE."""
    inputs = [leaf.detach().to(DEVICE, dtype).requires_grad_() for leaf in leaves]
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(grad_out_seed)
    grads_out = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype).double() for o in outs]
    total = sum((o.double().cpu() * g).sum() for o, g in zip(outs, grads_out, strict=False))
    return outs, torch.autograd.grad(total, inputs), grads_out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [80, 96, 130])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype, hidden, with_residual):
    """Oracle: rms_norm_reference in float64; y (and the summed residual) plus x/weight/residual grads."""
    gen = torch.Generator().manual_seed(hidden * 7 + with_residual)
    x, residual = rand(gen, 2, 5, hidden, dtype=dtype), rand(gen, 2, 5, hidden, dtype=dtype)
    weight = rand(gen, hidden, dtype=dtype, scale=0.5)
    leaves = [x, weight] + ([residual] if with_residual else [])
    assert kernel_backend(x.to(DEVICE)) == "triton"

    def fused(*a):
        return rms_norm(a[0], a[1], 1e-5, residual=a[2] if with_residual else None)

    outs, grads, grads_out = run(fused, leaves, dtype, 1)
    ref = rms_norm_reference(x, weight, 1e-5, residual if with_residual else None)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if with_residual:
        ref = (ref[0], ref[1].to(dtype).double())  # the kernel stores the sum in the stream's dtype
    ref_total = sum((r * g).sum() for r, g in zip(ref, grads_out, strict=False))
    ref_grads = torch.autograd.grad(ref_total, leaves)
    for name, a, e in zip(["y", "h"], outs, ref, strict=False):
        assert a.dtype == dtype
        assert_close(a, e, dtype, name)
    for name, a, e in zip(["dx", "dweight", "dresidual"], grads, ref_grads, strict=False):
        assert_close(a, e, dtype, name)


def test_rms_norm_float32_residual_stream_with_bf16_input():
    """Oracle: float64 reference; bf16 x added into a float32 residual stream, h returned in float32."""
    gen = torch.Generator().manual_seed(3)
    x = rand(gen, 7, 96, dtype=torch.bfloat16)
    residual, weight = rand(gen, 7, 96, dtype=torch.float32), rand(gen, 96, dtype=torch.bfloat16)
    y, h = rms_norm(x.detach().to(DEVICE, torch.bfloat16), weight.detach().to(DEVICE, torch.bfloat16), 1e-6,
                    residual=residual.detach().to(DEVICE, torch.float32))
    y_ref, h_ref = rms_norm_reference(x, weight, 1e-6, residual)
    assert (y.dtype, h.dtype) == (torch.bfloat16, torch.float32)
    assert_close(h, h_ref, torch.float32, "h")
    assert_close(y, y_ref, torch.bfloat16, "y")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ffn", [80, 130, 1100])
def test_swiglu_matches_reference(dtype, ffn):
    """Oracle: swiglu_reference in float64; output and gate/up grads."""
    gen = torch.Generator().manual_seed(ffn)
    gate, up = rand(gen, 3, ffn, dtype=dtype, scale=2.0), rand(gen, 3, ffn, dtype=dtype)
    assert kernel_backend(gate.to(DEVICE)) == "triton"
    outs, grads, grads_out = run(swiglu, [gate, up], dtype, 2)
    ref = swiglu_reference(gate, up)
    ref_grads = torch.autograd.grad((ref * grads_out[0]).sum(), [gate, up])
    assert_close(outs[0], ref, dtype, "y")
    for name, a, e in zip(["dgate", "dup"], grads, ref_grads, strict=False):
        assert_close(a, e, dtype, name)


def test_swiglu_on_slices_of_a_fused_projection():
    """Oracle: float64 reference; gate/up as column halves of one (2, 3, 2 * 96) tensor (strided, no copy)."""
    gen = torch.Generator().manual_seed(5)
    gate_up = rand(gen, 2, 3, 192, dtype=torch.float32)
    fused = gate_up.detach().to(DEVICE).requires_grad_()
    gate, up = fused.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    y = swiglu(gate, up)
    grad_y = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (grad_fused,) = torch.autograd.grad((y.double().cpu() * grad_y).sum(), fused)
    ref = swiglu_reference(*gate_up.chunk(2, dim=-1))
    (ref_grad,) = torch.autograd.grad((ref * grad_y).sum(), gate_up)
    assert_close(y, ref, torch.float32, "y")
    assert_close(grad_fused, ref_grad, torch.float32, "dgate_up")


MOD_SHAPES = [(2, 96), (2, 1, 96), (1, 96), (2, 3, 96), (1, 3, 96), (2, 18, 96)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mod_shape", MOD_SHAPES, ids=str)
def test_modulate_matches_reference(dtype, mod_shape):
    """Oracle: modulate_reference in float64; per sample / frame / token, batch-broadcast shift and scale."""
    gen = torch.Generator().manual_seed(len(mod_shape) * 10 + mod_shape[0] + mod_shape[-2])
    x = rand(gen, 2, 18, 96, dtype=dtype)
    shift, scale = rand(gen, *mod_shape, dtype=dtype), rand(gen, *mod_shape, dtype=dtype, scale=0.3)
    assert kernel_backend(x.to(DEVICE)) == "triton"
    outs, grads, grads_out = run(modulate, [x, shift, scale], dtype, 4)
    ref = modulate_reference(x, shift, scale)
    ref_grads = torch.autograd.grad((ref * grads_out[0]).sum(), [x, shift, scale])
    assert_close(outs[0], ref, dtype, "y")
    for name, a, e in zip(["dx", "dshift", "dscale"], grads, ref_grads, strict=False):
        assert a.shape == e.shape, name
        assert_close(a, e, dtype, name)


def test_modulate_many_tokens_per_group_odd_hidden():
    """Oracle: float64 reference; 67 tokens per sample (several backward token splits) and hidden 130."""
    gen = torch.Generator().manual_seed(6)
    x = rand(gen, 1, 67, 130, dtype=torch.float32)
    chunks = rand(gen, 1, 2, 130, dtype=torch.float32)  # adaLN output, shift/scale are strided views of it
    outs, grads, grads_out = run(lambda a, c: modulate(a, c[:, :1], c[:, 1:]), [x, chunks], torch.float32, 7)
    ref = modulate_reference(x, chunks[:, :1], chunks[:, 1:])
    ref_grads = torch.autograd.grad((ref * grads_out[0]).sum(), [x, chunks])
    assert_close(outs[0], ref, torch.float32, "y")
    for name, a, e in zip(["dx", "dchunks"], grads, ref_grads, strict=False):
        assert_close(a, e, torch.float32, name)


def test_shape_errors_name_the_argument():
    """Oracle: the documented ValueErrors and their messages."""
    x = torch.zeros(2, 6, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        rms_norm(x, torch.ones(7, device=DEVICE))
    with pytest.raises(ValueError, match="residual shape"):
        rms_norm(x, torch.ones(8, device=DEVICE), residual=torch.zeros(2, 8, device=DEVICE))
    with pytest.raises(ValueError, match="gate and up shapes differ"):
        swiglu(x, x[:, :5])
    with pytest.raises(ValueError, match=r"tokens % groups == 0 .* got \(2, 4, 8\)"):
        modulate(x, torch.zeros(2, 4, 8, device=DEVICE), torch.zeros(2, 4, 8, device=DEVICE))
