"""block_causal / window_3d / document_ids masks and keep_fraction.

Oracles: matrices written by hand for tiny cases, a literal Python double loop
over (i, j) applying the rule from the task statement for larger ones, and
counting the dense mask for keep_fraction.
"""

import itertools

import pytest
import torch

from lf_kernels._keep import keep_fraction, kept_entries
from lf_kernels._mask import MaskSpec, dense_mask


def _rows(mask: torch.Tensor, b: int = 0) -> list[list[int]]:
    return mask[b, 0].int().tolist()


def test_block_causal_written_matrix():
    """Oracle: hand-written matrix, frames of 2 tokens, seq 5 (last frame partial)."""
    assert _rows(dense_mask(MaskSpec("block_causal", frame_tokens=2), 5, 5)) == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    # End-aligned queries: q_len 2 of kv_len 5 are positions 3 and 4.
    assert _rows(dense_mask(MaskSpec("block_causal", frame_tokens=2), 2, 5)) == [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]


def _loop_window(grid, window, causal_t):
    t_size, h_size, w_size = grid
    coords = list(itertools.product(range(t_size), range(h_size), range(w_size)))  # t-major
    rows = []
    for ti, hi, wi in coords:
        row = []
        for tj, hj, wj in coords:
            keep = abs(ti - tj) <= window[0] // 2 and abs(hi - hj) <= window[1] // 2 and abs(wi - wj) <= window[2] // 2
            row.append(int(keep and (not causal_t or tj <= ti)))
        rows.append(row)
    return rows


@pytest.mark.parametrize("causal_t", [False, True])
@pytest.mark.parametrize(("grid", "window"), [((3, 4, 5), (3, 3, 3)), ((2, 3, 7), (1, 3, 5)), ((4, 2, 3), (5, 1, 1))])
def test_window_3d_matches_python_loop(grid, window, causal_t):
    """Oracle: the rule |t_i - t_j| <= wt//2 (and h, w) written as a Python loop over t-major coordinates."""
    spec = MaskSpec("window_3d", grid=grid, window=window, causal_t=causal_t)
    seq = grid[0] * grid[1] * grid[2]
    assert _rows(dense_mask(spec, seq, seq)) == _loop_window(grid, window, causal_t)


def test_window_3d_written_matrix_1d():
    """Oracle: hand-written band matrix; grid (1, 1, 4) with ww = 3 is a 1-token sliding window."""
    spec = MaskSpec("window_3d", grid=(1, 1, 4), window=(1, 1, 3))
    assert _rows(dense_mask(spec, 4, 4)) == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]


def test_documents_combine_with_kind_and_padding():
    """Oracle: hand-written matrices; documents [0, 0, 1, 1, 1] with causal, and with padding."""
    doc = torch.tensor([[0, 0, 1, 1, 1], [7, 7, 7, 7, 7]])
    pad = torch.tensor([[True, True, True, True, False], [True, True, True, True, True]])
    mask = dense_mask(MaskSpec("causal"), 5, 5, document_ids=doc, key_padding=pad)
    assert mask.shape == (2, 1, 5, 5)
    assert _rows(mask, 0) == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 0],
    ]
    assert _rows(mask, 1) == _rows(dense_mask(MaskSpec("causal"), 5, 5))
    # Full + documents = block diagonal; the last 2 queries of 5 keys use the ids of positions 3, 4.
    full = dense_mask(MaskSpec("full"), 2, 5, document_ids=doc[:1])
    assert _rows(full) == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"kind": "block_causal"}, ["frame_tokens", "None"]),
        ({"kind": "block_causal", "frame_tokens": 0}, ["frame_tokens", ">= 1", "0"]),
        ({"kind": "block_causal", "frame_tokens": 2.5}, ["frame_tokens", "2.5"]),
        ({"kind": "causal", "frame_tokens": 4}, ["frame_tokens", "block_causal", "4"]),
        ({"kind": "window_3d", "window": (3, 3, 3)}, ["grid", "None"]),
        ({"kind": "window_3d", "grid": (2, 3), "window": (3, 3, 3)}, ["grid", "(2, 3)"]),
        ({"kind": "window_3d", "grid": (2, 3, 4), "window": (3, 4, 3)}, ["window", "odd", "(3, 4, 3)"]),
        ({"kind": "window_3d", "grid": (2, 3, 4), "window": (3, 0, 3)}, ["window", "(3, 0, 3)"]),
        ({"kind": "window_3d", "grid": (2, 3, 4), "window": (3, 3, 3), "causal_t": 1}, ["causal_t", "1"]),
        ({"kind": "full", "causal_t": True}, ["causal_t", "window_3d", "True"]),
        ({"kind": "prefix_lm", "prefix_len": 1, "grid": (1, 1, 1)}, ["grid", "prefix_lm"]),
    ],
)
def test_maskspec_rejects_bad_new_fields(kwargs, needles):
    """Oracle: the MaskSpec contract (error names MaskSpec.<field> and the value received)."""
    with pytest.raises(ValueError) as err:
        MaskSpec(**kwargs)
    for needle in needles:
        assert needle in str(err.value)


def test_dense_mask_rejects_bad_grid_and_documents():
    """Oracle: the dense_mask contract (grid must hold kv_len; document_ids integer (batch, kv_len))."""
    spec = MaskSpec("window_3d", grid=(2, 3, 4), window=(1, 1, 1))
    with pytest.raises(ValueError, match=r"grid=\(2, 3, 4\) holds 24 tokens, but kv_len=23"):
        dense_mask(spec, 23, 23)
    with pytest.raises(ValueError, match=r"document_ids must have shape \(batch, kv_len=4\), got \(1, 5\)"):
        dense_mask(MaskSpec("full"), 4, 4, document_ids=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids must be an integer tensor, got dtype torch.float32"):
        dense_mask(MaskSpec("full"), 4, 4, document_ids=torch.zeros(1, 4))
    with pytest.raises(ValueError, match="q_len <= kv_len.*5 > 4"):
        dense_mask(MaskSpec("causal"), 5, 4, document_ids=torch.zeros(1, 4, dtype=torch.long))


SPECS = [
    (MaskSpec("full"), 37),
    (MaskSpec("causal"), 37),
    (MaskSpec("prefix_lm", prefix_len=5), 37),
    (MaskSpec("prefix_lm", prefix_len=50), 37),
    (MaskSpec("block_causal", frame_tokens=6), 37),
    (MaskSpec("block_causal", frame_tokens=37), 37),
    (MaskSpec("window_3d", grid=(3, 5, 7), window=(3, 3, 5)), 105),
    (MaskSpec("window_3d", grid=(3, 5, 7), window=(5, 1, 3), causal_t=True), 105),
]


@pytest.mark.parametrize(("spec", "seq"), SPECS)
def test_keep_fraction_counts_dense_mask(spec, seq):
    """Oracle: the number of True entries of dense_mask (closed forms and the document count)."""
    dense = dense_mask(spec, seq, seq)
    assert kept_entries(spec, seq) == int(dense.sum())
    assert keep_fraction(spec, seq) == int(dense.sum()) / seq**2
    gen = torch.Generator().manual_seed(seq)
    doc = torch.randint(0, 4, (3, seq), generator=gen).sort(dim=-1).values
    dense_doc = dense_mask(spec, seq, seq, document_ids=doc)
    assert keep_fraction(spec, seq, document_ids=doc) == int(dense_doc.sum()) / (3 * seq**2)


def test_keep_fraction_bench_shapes():
    """Oracle: closed forms by hand; 21 frames of 1,560: (21 * 22 / 2) / 21^2; causal (S + 1) / 2S."""
    assert keep_fraction(MaskSpec("block_causal", frame_tokens=1560), 32760) == pytest.approx(231 / 441, abs=0)
    assert keep_fraction(MaskSpec("causal"), 8192) == 8193 / 16384
    with pytest.raises(ValueError, match="seq must be an int >= 1, got 0"):
        keep_fraction(MaskSpec("causal"), 0)
