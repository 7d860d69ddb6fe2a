"""Multi-row tiles and persistent partial reductions of the fused row kernels (rms_norm, swiglu, modulate, rotary).

Oracle: the plain-PyTorch references of ``lf_kernels._fused_reference`` run in
float64 on the same float32-exact inputs, forward and backward (vector-Jacobian
product with a random output gradient). Float32 kernels agree to 2e-5 (float32
math, sums over <= 400 rows). The row counts are chosen against the tile and
grid sizes: one row, fewer rows than programs, rows per program not a multiple
of the tile's rows, several tiles per program, hidden sizes that are not powers
of two and several feature blocks. Under ``TRITON_INTERPRET=1`` the tile height
(``tuning.INTERPRETER_ROWS``) and the pretended SM count are patched per test;
on a GPU the autotuned configs run instead.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from _fused_check import DEVICE, check, leaves  # noqa: E402

from lf_kernels._fused_reference import (  # noqa: E402
    modulate_reference,
    rms_norm_reference,
    rotary_reference,
    swiglu_reference,
)
from lf_kernels.triton import _rope  # noqa: E402
from lf_kernels.triton._dispatch import kernel_backend, kernels  # noqa: E402
from lf_kernels.triton._layout import next_pow2  # noqa: E402
from lf_kernels.triton._modulate import modulate  # noqa: E402
from lf_kernels.triton._rmsnorm import rms_norm  # noqa: E402
from lf_kernels.triton._rope import apply_rotary  # noqa: E402
from lf_kernels.triton._rope_tables import rope_inv_freq, rope_tables  # noqa: E402
from lf_kernels.triton._swiglu import swiglu  # noqa: E402

TUNED = [("rmsnorm", "rms_norm_fwd"), ("rmsnorm", "rms_norm_bwd"), ("swiglu", "swiglu_fwd"), ("swiglu", "swiglu_bwd"),
         ("modulate", "modulate_fwd"), ("modulate", "modulate_bwd"), ("rope", "rotary")]


@pytest.fixture
def tiles(monkeypatch):
    """``tiles(rows, sms)``: interpreter tile height and SM count for this test (tuner caches rebuilt)."""
    tuning = kernels("tuning")

    def clear():
        for module, name in TUNED:
            getattr(kernels(module), name).cache_clear()

    def set_tiles(rows, sms=1):
        monkeypatch.setattr(tuning, "INTERPRETER_ROWS", rows)
        monkeypatch.setattr(tuning, "INTERPRETER_SMS", sms)
        clear()
        return tuning

    assert kernel_backend(torch.zeros(1, device=DEVICE)) == "triton"
    yield set_tiles
    monkeypatch.undo()
    clear()


def test_persistent_split_covers_every_row_once():
    """Oracle: the documented contract, checked by enumeration: no empty program, chunks tile [0, n)."""
    tuning = kernels("tuning")
    for n in [1, 2, 3, 7, 64, 65, 1000, 8192, 32760]:
        for wanted in [1, 2, 5, 8, 132, 264, 528, 10_000]:
            programs, per = tuning.persistent_split(n, wanted)
            assert 1 <= programs <= min(n, wanted)
            assert (programs - 1) * per < n <= programs * per
    assert tuning.persistent_split(0, 8) == (0, 1)
    assert tuning.programs_per_sm(4096) == 1 and tuning.programs_per_sm(2048) == 2
    assert tuning.programs_per_sm(1024, partials=2) == 2 and tuning.programs_per_sm(16384) == 1


@pytest.mark.parametrize(("rows", "n", "hidden", "sms", "split"), [
    (4, 1, 130, 1, (1, 1)),      # one row
    (4, 3, 96, 1, (3, 1)),       # more programs wanted (4) than rows: one row each
    (4, 37, 130, 1, (4, 10)),    # 10 rows per program: not a multiple of the 4-row tile
    (2, 250, 96, 1, (4, 63)),    # 31.5 tiles per program, the last program 61 rows
    (1, 20, 80, 3, (10, 2)),     # one-row tiles, 12 programs wanted
    (8, 45, 200, 2, (8, 6)),     # 8-row tiles over 6 rows per program
])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_tiles(tiles, rows, n, hidden, sms, split, with_residual):
    """Oracle: rms_norm_reference in float64; y, h, and the x / weight / residual grads (dweight from partials)."""
    tuning = tiles(rows, sms)
    if DEVICE == "cpu":  # the grid the backward takes here: (programs, rows per program)
        assert tuning.persistent_split(n, sms * tuning.programs_per_sm(next_pow2(hidden))) == split
    gen = torch.Generator().manual_seed(n * 31 + hidden)
    x, w, r = leaves(gen, (n, hidden), (hidden,), (n, hidden))
    if with_residual:
        check(lambda a, b, c: rms_norm(a, b, 1e-5, residual=c), lambda a, b, c: rms_norm_reference(a, b, 1e-5, c),
              [x, w, r], n)
    else:
        check(lambda a, b: rms_norm(a, b, 1e-5), lambda a, b: rms_norm_reference(a, b, 1e-5), [x, w], n)


@pytest.mark.parametrize(("rows", "n", "ffn"), [(4, 1, 130), (4, 13, 384), (1, 5, 96), (8, 11, 1100)])
def test_swiglu_tiles(tiles, rows, n, ffn):
    """Oracle: swiglu_reference in float64; odd row counts, masked and several column blocks (384 = 3 x 128)."""
    tiles(rows)
    gen = torch.Generator().manual_seed(n + ffn)
    g, u = leaves(gen, (n, ffn), (n, ffn), scale=2.0)
    check(swiglu, swiglu_reference, [g, u], n)


@pytest.mark.parametrize(("rows", "x_shape", "mod_shape"), [
    (4, (1, 67, 384), (1, 384)),        # per sample: 3 feature blocks x token splits of 34 / 33 tokens
    (4, (3, 21, 96), (1, 96)),          # batch-broadcast shift/scale: partial sums reduced over batch too
    (2, (2, 15, 96), (2, 3, 96)),       # per frame, one split per group: gradients written directly
    (4, (2, 5, 130), (2, 5, 130)),      # per token (one-row tiles), hidden 130
    (8, (1, 1, 96), (1, 96)),           # one token
])
def test_modulate_tiles(tiles, rows, x_shape, mod_shape):
    """Oracle: modulate_reference in float64; dx and the dshift / dscale reductions over each group's tokens."""
    tiles(rows)
    gen = torch.Generator().manual_seed(sum(x_shape) + len(mod_shape))
    x, shift, scale = leaves(gen, x_shape, mod_shape, mod_shape)
    check(modulate, modulate_reference, [x, shift, scale], 5)


@pytest.mark.parametrize(("rows", "max_tile"), [(4, 8192), (1, 8192), (2, 64)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_tiles(tiles, monkeypatch, rows, max_tile, interleaved):
    """Oracle: rotary_reference in float64; 7 tokens (a partial token tile), 5 heads, partial rotary (48 of 56
    features), per-batch tables; ``max_tile=64`` splits the heads over grid axis 1 (2 heads per program)."""
    tiles(rows)
    monkeypatch.setattr(_rope, "_MAX_TILE", max_tile)
    gen = torch.Generator().manual_seed(rows + max_tile + interleaved)
    (x,) = leaves(gen, (1, 5, 7, 56))
    cos, sin = rope_tables(torch.randint(0, 512, (1, 7), generator=gen), rope_inv_freq(48), interleaved=interleaved)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    check(lambda a: apply_rotary(a.transpose(1, 2), cos, sin, layout="bshd", interleaved=interleaved).transpose(1, 2),
          lambda a: rotary_reference(a, cos.cpu().double(), sin.cpu().double(), interleaved=interleaved), [x], rows)
