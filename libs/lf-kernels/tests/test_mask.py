"""MaskSpec validation and dense_mask against explicitly written matrices."""

import pytest
import torch

from lf_kernels import MaskSpec, dense_mask


def _rows(mask: torch.Tensor) -> list[list[int]]:
    return mask[0, 0].int().tolist()


def test_prefix_lm_dense_mask_matches_written_matrix():
    """Oracle: the prefix-LM matrix written by hand for prefix_len=2, seq=5.

    Positions 0-1 see each other (bidirectional prefix); 2-4 see the prefix and
    themselves causally.
    """
    expected = [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    mask = dense_mask(MaskSpec("prefix_lm", prefix_len=2), 5, 5)
    assert mask.dtype == torch.bool
    assert mask.shape == (1, 1, 5, 5)
    assert _rows(mask) == expected


def test_prefix_lm_end_aligned_and_edge_prefixes():
    """Oracle: hand-written rows; prefix_len 0 == causal, prefix_len >= kv_len == full."""
    # q_len=2 < kv_len=5: queries are positions 3 and 4.
    assert _rows(dense_mask(MaskSpec("prefix_lm", prefix_len=4), 2, 5)) == [
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    causal = dense_mask(MaskSpec("causal"), 6, 6)
    assert torch.equal(dense_mask(MaskSpec("prefix_lm", prefix_len=0), 6, 6), causal)
    full = dense_mask(MaskSpec("full"), 6, 6)
    assert torch.equal(dense_mask(MaskSpec("prefix_lm", prefix_len=9), 6, 6), full)
    # q_len > kv_len: query 0 sits at position -1 and sees nothing.
    assert _rows(dense_mask(MaskSpec("prefix_lm", prefix_len=1), 3, 2)) == [
        [0, 0],
        [1, 0],
        [1, 1],
    ]


def test_causal_end_alignment():
    """Oracle: hand-written rows; query i is position kv_len - q_len + i (FlashAttention)."""
    assert _rows(dense_mask(MaskSpec("causal"), 2, 4)) == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert _rows(dense_mask(MaskSpec("causal"), 1, 3)) == [[1, 1, 1]]
    assert _rows(dense_mask(MaskSpec("causal"), 3, 2)) == [[0, 0], [1, 0], [1, 1]]
    assert _rows(dense_mask(MaskSpec("full"), 2, 3)) == [[1, 1, 1], [1, 1, 1]]


def test_key_padding_shape_and_values():
    """Oracle: causal rows ANDed with the hand-written padding per batch element."""
    key_padding = torch.tensor([[True, True, False], [False, True, True]])
    mask = dense_mask(MaskSpec("causal"), 3, 3, key_padding=key_padding)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert mask[1, 0].int().tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 1]]


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"kind": "sliding"}, ["kind", "'sliding'"]),
        ({"kind": "prefix_lm"}, ["prefix_len", "None"]),
        ({"kind": "prefix_lm", "prefix_len": -1}, ["prefix_len", "-1"]),
        ({"kind": "prefix_lm", "prefix_len": 2.0}, ["prefix_len", "2.0"]),
        ({"kind": "causal", "prefix_len": 3}, ["prefix_len", "3", "causal"]),
        ({"kind": "full", "prefix_len": 0}, ["prefix_len", "0", "full"]),
    ],
)
def test_maskspec_rejects_bad_fields(kwargs, needles):
    """Oracle: the MaskSpec contract (error names the field and the value)."""
    with pytest.raises(ValueError) as err:
        MaskSpec(**kwargs)
    for needle in needles:
        assert needle in str(err.value)


def test_dense_mask_rejects_bad_inputs():
    """Oracle: the dense_mask contract (bool (batch, kv_len) padding, lengths >= 0)."""
    spec = MaskSpec("full")
    with pytest.raises(ValueError, match=r"kv_len=4.*\(2, 3\)"):
        dense_mask(spec, 4, 4, key_padding=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="torch.int64"):
        dense_mask(spec, 4, 4, key_padding=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="q_len.*-1"):
        dense_mask(spec, -1, 4)


def test_maskspec_is_frozen_and_hashable():
    """Oracle: dataclass(frozen=True) semantics (usable as a dict key in the IR)."""
    spec = MaskSpec("prefix_lm", prefix_len=3)
    assert {spec: 1}[MaskSpec("prefix_lm", prefix_len=3)] == 1
    with pytest.raises(AttributeError):
        spec.kind = "full"  # type: ignore[misc]
