"""Quantile binning and mean +- k*std bounds of BinningTokenizer.

Oracles: hand arithmetic on small tables (quantiles in closed form), the
documented edge blend ``(1 - 1e-3) * quantiles + 1e-3 * uniform``, and, for the
property tests, the containing bin: decode returns the bin's centre, so the
round-trip error is at most half of that bin's width (normalized units).
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lf_tokenize_action import BinningTokenizer

SETTINGS = settings(max_examples=40, deadline=None)


def test_quantile_edges_pinned():
    """Data 0..100 on bounds min/max (normalized -1..1 in steps of 0.02), n_bins=4: quantile edges -0.5, 0, 0.5."""
    x = np.arange(101, dtype=np.float64)[:, None]
    tok = BinningTokenizer.from_actions(x, n_bins=4, bounds="min_max", binning="quantile")
    uniform = np.linspace(-1, 1, 5)
    np.testing.assert_allclose(tok.bin_edges, [(1 - 1e-3) * uniform + 1e-3 * uniform], atol=1e-15)
    # Skewed data: 90 % of the mass at 0..9, 10 % at 10..100 -> the first bins are narrow.
    x = np.concatenate([np.linspace(0, 9, 900), np.linspace(10, 100, 100)])[:, None]
    tok = BinningTokenizer.from_actions(x, n_bins=4, bounds="min_max", binning="quantile")
    q = np.quantile(2 * x[:, 0] / 100 - 1, [0.25, 0.5, 0.75])
    np.testing.assert_allclose(tok.bin_edges[0, 1:-1], (1 - 1e-3) * q + 1e-3 * np.array([-0.5, 0.0, 0.5]))
    assert tok.binning == "quantile" and tok.bin_widths.shape == (1, 4)
    with pytest.raises(ValueError, match="bin_width is defined for binning='uniform' only"):
        _ = tok.bin_width


def test_quantile_exactly_n_bins_with_atoms():
    """A gripper at exactly -1 or +1 (two atoms) still gets all n_bins reachable bins, strictly increasing edges."""
    rng = np.random.default_rng(0)
    x = np.stack([rng.choice([-1.0, 1.0], 500), rng.normal(size=500)], axis=1)
    tok = BinningTokenizer.from_actions(x, n_bins=16, bounds="min_max", binning="quantile")
    assert (np.diff(tok.bin_edges, axis=1) > 0).all()
    for d in range(2):
        grid = np.zeros((20001, 2))
        grid[:, d] = tok.unnormalize(np.stack([np.linspace(-1, 1, 20001)] * 2, axis=1))[:, d]
        # Also hit every centre exactly, so even the narrowest bin is sampled.
        centres = np.zeros((16, 2))
        centres[:, d] = tok.unnormalize(tok.bin_centers.T)[:, d]
        bins = tok.encode(np.concatenate([grid, centres]))[:, d]
        np.testing.assert_array_equal(np.unique(bins), np.arange(16))


def test_quantile_json_version_2_and_version_1_still_loads(tmp_path):
    """Quantile writes version 2 with 'binning' and 'edges' and loads back equal; a 0.1.0 (v1) dict loads as uniform."""
    x = np.random.default_rng(1).normal(size=(300, 3))
    tok = BinningTokenizer.from_actions(x, n_bins=8, binning="quantile")
    d = json.loads(json.dumps(tok.to_dict()))
    assert d["version"] == 2 and d["binning"] == "quantile" and np.array(d["edges"]).shape == (3, 9)
    path = tmp_path / "q.json"
    tok.save(path)
    back = BinningTokenizer.load(path)
    assert back == tok and back.binning == "quantile"
    np.testing.assert_array_equal(back.encode(x), tok.encode(x))
    v1 = {"format": "lf-tokenize-action/binning", "version": 1, "n_bins": 4, "low": [0.0], "high": [1.0],
          "normalize_mask": [True]}
    assert BinningTokenizer.from_dict(v1) == BinningTokenizer([0.0], [1.0], n_bins=4)
    with pytest.raises(ValueError, match="missing field 'edges'"):
        BinningTokenizer.from_dict({k: v for k, v in d.items() if k != "edges"})
    with pytest.raises(ValueError, match=r"edges\[0\] must be strictly increasing"):
        BinningTokenizer([0.0], [1.0], n_bins=2, edges=[[-1.0, 1.0, 1.0]])


def test_fit_quantile_needs_actions_and_mean_std():
    """fit(binning='quantile') without actions raises; mean_std uses mean -+ std_k * std (default k = 3)."""
    stats = {"mean": [1.0, 0.0], "std": [0.5, 2.0], "q01": [-1.0, -1.0], "q99": [1.0, 1.0]}
    with pytest.raises(ValueError, match="needs actions"):
        BinningTokenizer.fit(stats, binning="quantile")
    tok = BinningTokenizer.fit(stats, bounds="mean_std")
    np.testing.assert_array_equal(tok.low, [-0.5, -6.0])
    np.testing.assert_array_equal(tok.high, [2.5, 6.0])
    tok = BinningTokenizer.fit(stats, bounds="mean_std", std_k=1.0)
    np.testing.assert_array_equal(tok.high, [1.5, 2.0])
    with pytest.raises(ValueError, match="std_k must be a finite number > 0; got 0"):
        BinningTokenizer.fit(stats, bounds="mean_std", std_k=0)
    with pytest.raises(ValueError, match=r"std must be >= 0; got std\[0\]=-1.0"):
        BinningTokenizer.fit({"mean": [0.0], "std": [-1.0]}, bounds="mean_std")
    # from_actions: population std of [0, 2] is 1, mean 1 -> bounds [1 - 2, 1 + 2] with std_k = 2.
    tok = BinningTokenizer.from_actions([[0.0], [2.0]], bounds="mean_std", std_k=2.0)
    assert (tok.low.tolist(), tok.high.tolist()) == ([-1.0], [3.0])
    x = np.random.default_rng(2).normal(size=(200, 2))
    tok = BinningTokenizer.fit(stats, binning="quantile", actions=x, n_bins=8)
    assert tok.binning == "quantile" and tok.low.tolist() == [-1.0, -1.0]


@st.composite
def tables(draw):
    """(N, D) action tables with some repeated values (atoms), N 2..200, D 1..4."""
    dim, rows = draw(st.integers(1, 4)), draw(st.integers(2, 200))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dim)) * rng.uniform(1e-3, 1e3, size=dim) + rng.uniform(-1e3, 1e3, size=dim)
    if draw(st.booleans()):
        x[: rows // 2, 0] = x[0, 0]  # an atom holding half the mass
    return x


@SETTINGS
@given(x=tables(), n_bins=st.integers(2, 300), bounds=st.sampled_from(["q01_q99", "min_max", "mean_std"]),
       binning=st.sampled_from(["uniform", "quantile"]))
def test_round_trip_within_half_of_its_bin(x, n_bins, bounds, binning):
    """For in-range x: edges[b] <= n < edges[b+1] and |n(decode(b)) - n(x)| <= width[b] / 2 (normalized units)."""
    tok = BinningTokenizer.from_actions(x, n_bins=n_bins, bounds=bounds, binning=binning)
    inside = np.clip(x, tok.low, tok.high)
    bins, clipped = tok.encode(inside, return_clipped=True)
    assert not clipped.any() and ((bins >= 0) & (bins < n_bins)).all()
    edges = np.broadcast_to(tok.bin_edges, (tok.action_dim, n_bins + 1))
    n = tok.normalize(inside)
    dims = np.arange(tok.action_dim)
    lo, hi = edges[dims, bins], edges[dims, bins + 1]
    assert ((lo <= n) & ((n < hi) | (n == 1.0))).all()
    err = np.abs(tok.normalize(tok.decode(bins)) - n)
    # 1e-9: float64 rounding of unnormalize -> normalize with bounds up to ~1e4 and spans >= ~1e-3.
    assert (err <= (hi - lo) / 2 + 1e-9).all()
