"""Pinned bin layout, and how it relates to OpenVLA's ActionTokenizer.

Oracle for the pinned numbers: hand arithmetic. n_bins=4 gives w = 0.5, edges
[-1, -0.5, 0, 0.5, 1], centres [-0.75, -0.25, 0.25, 0.75].

Oracle for the OpenVLA comparison: ``openvla_encode``/``openvla_decode`` below
restate prismatic/vla/action_tokenizer.py (openvla/openvla, 2024): edges
``np.linspace(-1, 1, n_bins)``, ``np.digitize`` on the clipped value, decode by
``bin_centers[clip(d - 1, 0, n_bins - 2)]``. Token-id mapping is left out.
"""

import numpy as np
import pytest

from lf_tokenize_action import BinningTokenizer


def openvla_encode(x, n_bins):
    """OpenVLA: discretized = np.digitize(clip(x, -1, 1), linspace(-1, 1, n_bins)), values 1..n_bins."""
    edges = np.linspace(-1.0, 1.0, n_bins)
    return np.digitize(np.clip(x, -1.0, 1.0), edges)


def openvla_decode(d, n_bins):
    """OpenVLA: bin_centers[clip(d - 1, 0, len(bin_centers) - 1)] with n_bins - 1 centres."""
    edges = np.linspace(-1.0, 1.0, n_bins)
    centers = (edges[:-1] + edges[1:]) / 2.0
    return centers[np.clip(d - 1, 0, centers.shape[0] - 1)]


@pytest.mark.parametrize(
    ("value", "expected_bin"),
    [(-1.0, 0), (-0.75, 0), (-0.5000001, 0), (-0.5, 1), (-0.01, 1), (0.0, 2), (0.49, 2), (0.5, 3), (0.99, 3), (1.0, 3)],
)
def test_pinned_layout_n_bins_4(value, expected_bin):
    """n_bins=4 on [-1, 1]: bin i covers [-1 + 0.5 i, -0.5 + 0.5 i); +1 is bin 3, never bin 4."""
    tok = BinningTokenizer([-1.0], [1.0], n_bins=4)
    assert tok.encode([[value]])[0, 0] == expected_bin


def test_pinned_edges_centres_and_decode():
    """Edges, centres and decoded values for n_bins=4, bounds [0, 8] (action units = 4 * (n + 1))."""
    tok = BinningTokenizer([0.0], [8.0], n_bins=4)
    assert tok.bin_width == 0.5
    np.testing.assert_array_equal(tok.bin_edges, [-1.0, -0.5, 0.0, 0.5, 1.0])
    np.testing.assert_array_equal(tok.bin_centers, [-0.75, -0.25, 0.25, 0.75])
    np.testing.assert_array_equal(tok.decode(np.array([[0], [1], [2], [3]])).ravel(), [1.0, 3.0, 5.0, 7.0])
    # 5.96 -> normalized 0.49 -> bin 2 -> centre 0.25 -> 5.0
    np.testing.assert_array_equal(tok.encode([[5.96], [8.0], [0.0], [2.0]]).ravel(), [2, 3, 0, 1])


def test_openvla_256_has_255_effective_bins():
    """OpenVLA's ActionTokenizer(bins=256) decodes to only 255 distinct values; ours with n_bins=256 to 256."""
    grid = np.linspace(-1.0, 1.0, 100_001)
    assert np.unique(openvla_decode(openvla_encode(grid, 256), 256)).size == 255
    # digitize yields 1..256, and 256 only for exactly +1.0, which decode folds into the last centre.
    assert set(np.unique(openvla_encode(grid, 256)).tolist()) == set(range(1, 257))
    assert openvla_decode(openvla_encode(np.array([1.0]), 256), 256)[0] == openvla_decode(np.array([255]), 256)[0]
    tok = BinningTokenizer([-1.0], [1.0], n_bins=256)
    assert np.unique(tok.decode(tok.encode(grid[:, None]))).size == 256


@pytest.mark.parametrize("n_bins", [4, 255])
def test_ours_with_n_bins_equals_openvla_with_n_bins_plus_one(n_bins):
    """Ours(n_bins=N) == OpenVLA(bins=N+1): same edges linspace(-1, 1, N+1), bin = digitize - 1, same centres."""
    tok = BinningTokenizer([-1.0], [1.0], n_bins=n_bins)
    grid = np.concatenate([np.linspace(-1.0, 1.0, 20 * n_bins + 1), np.linspace(-1.0, 1.0, n_bins + 1), [-3.0, 3.0]])
    ours = tok.encode(grid[:, None]).ravel()
    theirs = np.minimum(openvla_encode(grid, n_bins + 1) - 1, n_bins - 1)
    np.testing.assert_array_equal(ours, theirs)
    # Centres agree to 1 ulp: ours go through unnormalize ((c + 1) / 2 * 2 - 1) on bounds [-1, 1].
    np.testing.assert_allclose(
        tok.decode(ours[:, None]).ravel(), openvla_decode(theirs + 1, n_bins + 1), rtol=0, atol=1e-15
    )
    np.testing.assert_array_equal(tok.bin_centers[ours], openvla_decode(theirs + 1, n_bins + 1))


def test_openvla_n_bins_4_pinned():
    """OpenVLA(bins=4): edges [-1, -1/3, 1/3, 1], 3 centres; 0.49 -> digitize 3 -> centre 2/3 (ours: bin 2, 0.25)."""
    assert openvla_encode(np.array([0.49]), 4)[0] == 3
    assert openvla_decode(np.array([3]), 4)[0] == pytest.approx(2.0 / 3.0)
    tok = BinningTokenizer([-1.0], [1.0], n_bins=4)
    assert tok.decode(tok.encode([[0.49]]))[0, 0] == 0.25
