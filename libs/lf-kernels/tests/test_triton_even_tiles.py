"""The unmasked (``EVEN``) paths of the rms_norm, swiglu and modulate kernels against the float64 reference.

Oracle: ``lf_kernels._fused_reference`` in float64 (``_fused_check.check``: outputs and input gradients of
float32 copies, 2e-5). The shapes are chosen so that every tile the tuner can pick divides them (rows a multiple
of 32, a hidden size equal to its feature block), which is when the kernels drop their masks; the other test
files use odd sizes, which keep them. Interpreter on the CPU, compiled on a GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _fused_check import check, leaves  # noqa: E402

from lf_kernels._fused_reference import modulate_reference, rms_norm_reference, swiglu_reference  # noqa: E402
from lf_kernels.triton._dispatch import kernels  # noqa: E402
from lf_kernels.triton._kernels.modulate import _sample_offsets  # noqa: E402
from lf_kernels.triton._modulate import _block_d, modulate  # noqa: E402
from lf_kernels.triton._rmsnorm import rms_norm  # noqa: E402
from lf_kernels.triton._swiglu import _col_block, swiglu  # noqa: E402


@triton.jit
def probe(OUT, pid, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    """Stores the per-sample modulate kernel's offsets of block ``pid``."""
    tl.store(OUT + tl.arange(0, BLOCK), _sample_offsets(pid, BLOCK, WIDE).to(tl.int64))


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_even_tiles(with_residual):
    gen = torch.Generator().manual_seed(11 + with_residual)
    x, weight, residual = leaves(gen, (2, 32, 128), (128,), (2, 32, 128))
    if with_residual:
        check(lambda a, w, r: rms_norm(a, w, 1e-5, residual=r),
              lambda a, w, r: rms_norm_reference(a, w, 1e-5, r), [x, weight, residual], seed=1)
    else:
        check(lambda a, w: rms_norm(a, w, 1e-5), lambda a, w: rms_norm_reference(a, w, 1e-5), [x, weight], seed=2)


def test_swiglu_even_tiles():
    gen = torch.Generator().manual_seed(12)
    gate, up = leaves(gen, (64, 256), (64, 256), scale=2.0)
    assert _col_block(256) == 256
    check(swiglu, swiglu_reference, [gate, up], seed=3)


@pytest.mark.parametrize("mod_shape", [(2, 1, 256), (2, 4, 256), (1, 256)], ids=str)
def test_modulate_even_tiles(mod_shape):
    """Per sample (64 tokens a group), per frame (4 groups of 16 tokens), and broadcast over the batch."""
    gen = torch.Generator().manual_seed(13 + len(mod_shape) + mod_shape[0])
    x, shift, scale = leaves(gen, (2, 64, 256), mod_shape, mod_shape)
    assert _block_d(256) == 256
    check(modulate, modulate_reference, [x, shift, scale], seed=4)


def test_even_heuristics():
    """Oracle: divisibility by hand; any remainder (rows or features) keeps the masks."""
    mod, sw, rms = kernels("modulate"), kernels("swiglu"), kernels("rmsnorm")
    assert mod._even_fwd({"tokens_per_group": 64, "BLOCK_R": 16, "hidden": 1536, "BLOCK_D": 512})
    assert not mod._even_fwd({"tokens_per_group": 65, "BLOCK_R": 1 << 4, "hidden": 1536, "BLOCK_D": 512})
    assert not mod._even_fwd({"tokens_per_group": 64, "BLOCK_R": 16, "hidden": 130, "BLOCK_D": 256})
    assert sw._even({"n_rows": 8192, "BLOCK_R": 32, "n_cols": 14336, "BLOCK_D": 1024})
    assert not sw._even({"n_rows": 8190, "BLOCK_R": 4, "n_cols": 14336, "BLOCK_D": 1024})
    assert not sw._even({"n_rows": 8192, "BLOCK_R": 4, "n_cols": 11000, "BLOCK_D": 1024})
    assert rms._even_fwd({"n_rows": 32760, "BLOCK_R": 8, "n_cols": 4096, "BLOCK_D": 4096})
    assert not rms._even_fwd({"n_rows": 32760, "BLOCK_R": 16, "n_cols": 4096, "BLOCK_D": 4096})
    assert not rms._even_fwd({"n_rows": 32, "BLOCK_R": 8, "n_cols": 1536, "BLOCK_D": 2048})


@pytest.mark.parametrize(("limit", "x_shape", "mod_shape"), [
    (4, (2, 16, 96), (2, 4, 96)),  # per frame: 8 groups > 4, 4 tiles of one token
    (4, (2, 18, 130), (2, 18, 130)),  # per token: 36 groups > 4
    (1, (2, 1, 96), (2, 96)),  # per sample (the 1-D kernel): 2 samples > 1, one block each
    (4, (3, 6, 64), (1, 6, 64)),  # per token, shared by the batch: 6 gradient rows x 2 partial sums > 4
], ids=["per_frame", "per_token", "per_sample", "per_token_broadcast"])
def test_modulate_groups_on_grid_axis_0(monkeypatch, limit, x_shape, mod_shape):
    """Oracle: float64 reference; with the axis-1 limit lowered, the groups (or samples) go on grid axis 0 in the
    forward and the gradient rows in the backward's partial sums: the paths of per-token modulation of a long
    sequence or a large batch."""
    from lf_kernels.triton import _layout

    monkeypatch.setattr(_layout, "MAX_GRID_YZ", limit)  # the forward's groups and the backward's gradient rows
    batch, tokens, hidden = x_shape
    groups = 1 if len(mod_shape) == 2 else mod_shape[1]
    if mod_shape[0] == batch:
        assert _layout.grid_axis(batch * groups, max(1, tokens // groups) * -(-hidden // 128)) == 0
    gen = torch.Generator().manual_seed(14 + limit + groups)
    x, shift, scale = leaves(gen, x_shape, mod_shape, mod_shape)
    check(modulate, modulate_reference, [x, shift, scale], seed=5)


def test_modulate_grid_axis_choice():
    """Oracle: CUDA's 65,535 limit on grid axis 1, by hand."""
    from lf_kernels.triton._layout import grid_axis

    assert grid_axis(65535, 10**6) == 1
    assert grid_axis(65536, 65535) == 0
    with pytest.raises(ValueError, match="exceeds CUDA's grid limits"):
        grid_axis(65536, 65536)


def test_flat_modulate_offsets_of_samples_past_int32():
    """Oracle: Python integers. The per-sample kernel's offsets for a block past 2**31 elements (a sample of
    2**31 or more, ``WIDE``): computed in int64 before the multiply, so they do not wrap negative."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.empty(128, dtype=torch.int64, device=device)
    pid = 2**31 // 128 + 1
    probe[(1,)](out, pid, BLOCK=128, WIDE=True)
    assert out.cpu().tolist() == [pid * 128 + i for i in range(128)]
    probe[(1,)](out, 5, BLOCK=128, WIDE=False)
    assert out.cpu().tolist() == [5 * 128 + i for i in range(128)]
