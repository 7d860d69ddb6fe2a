"""Edge shapes of the fused ops: a strided RMSNorm weight, zero features, an empty batch through the backward.

Oracle: the float64 references of ``lf_kernels._fused_reference`` (``_fused_check.check``, 2e-5), and for empty
tensors the shapes and zeros the references give. Interpreter on the CPU, compiled on a GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from _fused_check import DEVICE, check, leaves  # noqa: E402

from lf_kernels._fused_reference import rms_norm_reference  # noqa: E402
from lf_kernels.triton import modulate, rms_norm, swiglu  # noqa: E402


def test_rms_norm_strided_weight():
    """A weight that is every other entry of a longer vector (a view with stride 2)."""
    gen = torch.Generator().manual_seed(21)
    x, w_long = leaves(gen, (5, 64), (128,))
    check(lambda a, w: rms_norm(a, w[::2], 1e-5), lambda a, w: rms_norm_reference(a, w[::2], 1e-5), [x, w_long],
          seed=6)


def test_swiglu_zero_features():
    gate = torch.randn(4, 0, device=DEVICE, requires_grad=True)
    up = torch.randn(4, 0, device=DEVICE, requires_grad=True)
    y = swiglu(gate, up)
    assert y.shape == (4, 0)
    y.sum().backward()
    assert gate.grad.shape == up.grad.shape == (4, 0)


@pytest.mark.parametrize(("x_shape", "mod_shape"), [((0, 4, 64), (1, 64)), ((0, 4, 64), (0, 64)),
                                                    ((2, 4, 0), (2, 0)), ((2, 0, 8), (2, 8))], ids=str)
def test_modulate_empty_backward(x_shape, mod_shape):
    """No samples, features or tokens: gradients of the inputs' shapes, all zero (no division by zero)."""
    x = torch.randn(*x_shape, device=DEVICE, requires_grad=True)
    shift = torch.randn(*mod_shape, device=DEVICE, requires_grad=True)
    scale = torch.randn(*mod_shape, device=DEVICE, requires_grad=True)
    modulate(x, shift, scale).sum().backward()
    for t in (x, shift, scale):
        assert t.grad.shape == t.shape
        assert not t.grad.any()
