"""Loop pipelining modes of the persistent backward kernels, and the partial-sum pass.

Oracle: the plain-PyTorch references of ``lf_kernels._fused_reference`` in
float64 on the same float32-exact inputs, forward and backward (vector-Jacobian
product with a random output gradient); for ``sum_partials``, ``torch.sum`` in
float64 of the same float32 partials. Float32 kernels agree to 2e-5 (float32
math, sums over <= 250 rows); a bf16 output of ``sum_partials`` to one ulp
(2**-7 relative: the GPU rounds to nearest, the interpreter's cast truncates).
Each ``STAGES`` mode of ``tuning.BWD_STAGES`` (0: next tile prefetched into
registers, 1: plain loop, 2 / 3: Triton's loop pipeliner, a plain loop under
the interpreter) is pinned in turn and the kernel caches rebuilt; row counts
leave a partial last tile and programs of unequal length.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from _fused_check import DEVICE, check, leaves  # noqa: E402

from lf_kernels._fused_reference import modulate_reference, rms_norm_reference  # noqa: E402
from lf_kernels.triton._dispatch import kernel_backend, kernels  # noqa: E402
from lf_kernels.triton._modulate import modulate  # noqa: E402
from lf_kernels.triton._partials import sum_partials  # noqa: E402
from lf_kernels.triton._rmsnorm import rms_norm  # noqa: E402


@pytest.fixture(params=[0, 1, 2, 3])
def stages(request, monkeypatch):
    """Pins ``tuning.BWD_STAGES`` to one mode (interpreter: 4 tile rows, 2 SMs) and rebuilds the tuners."""
    tuning = kernels("tuning")
    clear = [kernels("rmsnorm").rms_norm_bwd.cache_clear, kernels("modulate").modulate_bwd.cache_clear]
    monkeypatch.setattr(tuning, "BWD_STAGES", (request.param,))
    monkeypatch.setattr(tuning, "INTERPRETER_ROWS", 4)
    monkeypatch.setattr(tuning, "INTERPRETER_SMS", 2)
    for c in clear:
        c()
    assert kernel_backend(torch.zeros(1, device=DEVICE)) == "triton"
    yield request.param
    monkeypatch.undo()
    for c in clear:
        c()


GPU_ONLY = DEVICE == "cuda"  # sizes whose programs walk several tiles on 132 SMs; too slow for the interpreter


@pytest.mark.parametrize(("n", "hidden"), [(1, 130), (29, 96), (250, 80)] + ([(3000, 200)] if GPU_ONLY else []))
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_backward_each_stage_mode(stages, n, hidden, with_residual):
    """Oracle: rms_norm_reference in float64; x / weight (/ residual) grads through each loop mode. Interpreter:
    250 rows over 8 programs (2 SMs x 4): 32 rows each (8 tiles of 4), the last 26 (a partial last tile). GPU:
    3000 rows over 528 programs, 6 rows each, in tiles the tuner picks."""
    gen = torch.Generator().manual_seed(n + hidden + stages)
    x, w, r = leaves(gen, (n, hidden), (hidden,), (n, hidden))
    if with_residual:
        check(lambda a, b, c: rms_norm(a, b, 1e-5, residual=c), lambda a, b, c: rms_norm_reference(a, b, 1e-5, c),
              [x, w, r], n)
    else:
        check(lambda a, b: rms_norm(a, b, 1e-5), lambda a, b: rms_norm_reference(a, b, 1e-5), [x, w], n)


@pytest.mark.parametrize(("x_shape", "mod_shape"), [
    ((1, 67, 384), (1, 384)),       # per sample, 3 feature blocks, token splits of unequal length
    ((3, 20, 96), (1, 1, 96)),      # broadcast over batch: partial rows (b, split) summed per output row
    ((2, 21, 96), (1, 3, 96)),      # broadcast per frame: partial rows laid out (g, b, split)
    ((2, 15, 96), (2, 3, 96)),      # per frame, one split per group: gradients written directly
] + ([((2, 3000, 384), (1, 1, 384))] if GPU_ONLY else []))
def test_modulate_backward_each_stage_mode(stages, x_shape, mod_shape):
    """Oracle: modulate_reference in float64; dx, dshift, dscale through each loop mode."""
    gen = torch.Generator().manual_seed(sum(x_shape) + stages)
    x, shift, scale = leaves(gen, x_shape, mod_shape, mod_shape)
    check(modulate, modulate_reference, [x, shift, scale], 3)


@pytest.mark.parametrize(("n_out_a", "n_out", "n_parts", "n_cols"), [
    (1, 1, 132, 4096 // 16),   # rms_norm: one output row
    (3, 6, 7, 130),            # two outputs of 3 rows, a partial column block
    (2, 4, 600, 33),           # more partial rows than one load holds (512): two loop steps
    (1, 1, 0, 40),             # no partial rows: zeros
])
@pytest.mark.parametrize("dtype_b", [torch.float32, torch.bfloat16])
def test_sum_partials(n_out_a, n_out, n_parts, n_cols, dtype_b):
    """Oracle: float64 torch.sum over the partial rows, each output rounded once to its dtype."""
    gen = torch.Generator().manual_seed(n_parts + n_cols)
    parts = torch.randn(n_out, n_parts, n_cols, generator=gen).to(DEVICE)
    out_a = torch.full((n_out_a, n_cols), float("nan"), device=DEVICE)
    out_b = torch.full((n_out - n_out_a, n_cols), float("nan"), device=DEVICE, dtype=dtype_b)
    sum_partials(parts, out_a, out_b if n_out > n_out_a else None)
    expected = parts.double().sum(1).cpu()
    torch.testing.assert_close(out_a.double().cpu(), expected[:n_out_a], rtol=2e-5, atol=2e-5)
    if n_out > n_out_a:
        rtol = 2e-5 if dtype_b == torch.float32 else 2**-7  # bf16: one ulp (the interpreter's cast truncates)
        torch.testing.assert_close(out_b.double().cpu(), expected[n_out_a:], rtol=rtol, atol=2e-5)
