"""Which backend the fused ops take, and the reference path models use on a plain CPU.

Oracles: the dispatch rule documented in ``lf_kernels.triton._dispatch``
(checked in a fresh interpreter without ``TRITON_INTERPRET``, where CPU tensors
must take the reference and still give the reference's values), and the float64
references for the ``backend="reference"`` path of every op.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lf_kernels._fused_reference import (  # noqa: E402
    modulate_reference,
    rms_norm_reference,
    rotary_reference,
    swiglu_reference,
)
from lf_kernels.triton import (  # noqa: E402
    apply_rotary,
    kernel_backend,
    modulate,
    rms_norm,
    rope_inv_freq,
    rope_tables,
    swiglu,
)
from lf_kernels.triton._dispatch import resolve_backend  # noqa: E402


def test_plain_cpu_takes_the_reference():
    """Oracle: documented rule; without TRITON_INTERPRET, CPU tensors -> "reference", and the ops still run."""
    code = textwrap.dedent("""
        import torch
        from lf_kernels.triton import kernel_backend, rms_norm, swiglu
        x = torch.randn(3, 8, requires_grad=True)
        assert kernel_backend(x) == "reference", kernel_backend(x)
        assert kernel_backend(x, None) == "reference"
        y = swiglu(rms_norm(x, torch.ones(8)), x)
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == (3, 8)
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_mixed_devices_and_forced_backend():
    """Oracle: documented rule; tensors on two device types -> "reference"; a bad name is a ValueError."""
    x = torch.zeros(2)
    assert kernel_backend(x, x.to("meta")) == "reference"
    with pytest.raises(ValueError, match="backend must be 'triton', 'reference' or None, got 'cuda'"):
        resolve_backend("rms_norm", "cuda", x)
    with pytest.raises(RuntimeError, match="rms_norm: backend='triton' needs"):
        resolve_backend("rms_norm", "triton", x.to("meta"))


def test_reference_backend_of_every_op_is_the_reference():
    """Oracle: the float64 references; backend="reference" in float32 agrees to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    x, res = torch.randn(2, 6, 8, generator=gen), torch.randn(2, 6, 8, generator=gen)
    w, shift = torch.randn(8, generator=gen), torch.randn(2, 3, 8, generator=gen)
    cos, sin = rope_tables(torch.arange(6), rope_inv_freq(8))
    d = torch.float64
    pairs = [
        (rms_norm(x, w, 1e-6, residual=res, backend="reference")[0],
         rms_norm_reference(x.to(d), w.to(d), 1e-6, res.to(d))[0]),
        (swiglu(x, res, backend="reference"), swiglu_reference(x.to(d), res.to(d))),
        (modulate(x, shift, shift, backend="reference"), modulate_reference(x.to(d), shift.to(d), shift.to(d))),
        (apply_rotary(x[:, None], cos, sin, backend="reference"), rotary_reference(x[:, None].to(d), cos, sin)),
    ]
    for got, expected in pairs:
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
