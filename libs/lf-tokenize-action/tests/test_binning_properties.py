"""Property tests for BinningTokenizer (hypothesis).

Oracle: the documented layout. With w = 2 / n_bins, bin i covers normalized
[-1 + i*w, -1 + (i+1)*w), +1 maps to bin n_bins - 1, and decode returns the
centre -1 + (i + 0.5)*w mapped back linearly to [low, high].
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lf_tokenize_action import BinningTokenizer

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def tokenizers(draw, *, allow_constant=True):
    """Random bounds (some dims constant), dims 1..6, n_bins 2..1024."""
    dim = draw(st.integers(1, 6))
    n_bins = draw(st.integers(2, 1024))
    low = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=dim, max_size=dim)))
    widths = st.one_of(st.just(0.0), st.floats(1e-3, 1e3)) if allow_constant else st.floats(1e-3, 1e3)
    width = np.array(draw(st.lists(widths, min_size=dim, max_size=dim)))
    return BinningTokenizer(low, low + width, n_bins=n_bins)


@st.composite
def in_range_actions(draw, tok):
    """(rows, D) actions inside [low, high], including the exact bounds."""
    rows = draw(st.integers(1, 20))
    u = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=rows * tok.action_dim, max_size=rows * tok.action_dim)))
    u = u.reshape(rows, tok.action_dim)
    u[0] = draw(st.sampled_from([0.0, 1.0]))  # always hit one bound exactly
    return np.clip(tok.low + u * (tok.high - tok.low), tok.low, tok.high)


@SETTINGS
@given(data=st.data())
def test_round_trip_within_half_bin(data):
    """|normalize(decode(encode(x))) - normalize(x)| <= w/2 for every in-range x (w = 2/n_bins)."""
    tok = data.draw(tokenizers())
    x = data.draw(in_range_actions(tok))
    bins, clipped = tok.encode(x, return_clipped=True)
    assert not clipped.any()
    err = np.abs(tok.normalize(tok.decode(bins)) - tok.normalize(x))
    # 1e-9: float64 rounding of unnormalize->normalize with |low| <= 1e3 and width >= 1e-3.
    assert err.max() <= tok.bin_width / 2 + 1e-9
    # The same bound in action units: half a bin is (high - low) / (2 n_bins).
    err_units = np.abs(tok.decode(bins) - x)
    assert (err_units <= (tok.high - tok.low) / (2 * tok.n_bins) + 1e-9).all()


@SETTINGS
@given(data=st.data())
def test_bin_contains_its_value(data):
    """edges[b] <= normalize(x) < edges[b+1], except normalize(x) == +1 which is in bin n_bins-1."""
    tok = data.draw(tokenizers())
    x = data.draw(in_range_actions(tok))
    n, b = tok.normalize(x), tok.encode(x)
    edges = tok.bin_edges
    assert ((b >= 0) & (b < tok.n_bins)).all() and b.dtype == np.int64
    top = n == 1.0
    assert (b[top] == tok.n_bins - 1).all()
    assert (edges[b[~top]] <= n[~top]).all() and (n[~top] < edges[b[~top] + 1]).all()


@SETTINGS
@given(data=st.data())
def test_out_of_range_clips_to_end_bins_and_is_reported(data):
    """Below low -> bin 0, above high -> bin n_bins-1, both flagged; in-range values not flagged."""
    tok = data.draw(tokenizers())
    margin = data.draw(st.floats(1e-6, 1e6))
    below = tok.low - margin * np.maximum(1.0, np.abs(tok.low))
    above = tok.high + margin * np.maximum(1.0, np.abs(tok.high))
    mid = (tok.low + tok.high) / 2
    bins, clipped = tok.encode(np.stack([below, above, mid]), return_clipped=True)
    assert (bins[0] == 0).all() and (bins[1] == tok.n_bins - 1).all()
    assert clipped[0].all() and clipped[1].all() and not clipped[2].any()


@SETTINGS
@given(n_bins=st.integers(2, 2048))
def test_exactly_n_bins_reachable(n_bins):
    """A dense grid over [-1, 1] (10 points per bin) reaches every bin 0..n_bins-1 and nothing else."""
    tok = BinningTokenizer([-1.0], [1.0], n_bins=n_bins)
    grid = np.linspace(-1.0, 1.0, 10 * n_bins + 1)[:, None]
    bins = tok.encode(grid)
    np.testing.assert_array_equal(np.unique(bins), np.arange(n_bins))
    assert tok.encode([[1.0]])[0, 0] == n_bins - 1
    assert tok.encode([[-1.0]])[0, 0] == 0
    # Counts per bin are 10 (the +1 endpoint adds one to the last bin); rounding may move one point.
    counts = np.bincount(bins.ravel(), minlength=n_bins)
    assert counts.min() >= 9 and counts.max() <= 12


@SETTINGS
@given(data=st.data())
def test_dense_grid_in_action_units_reaches_all_bins(data):
    """Same as above on random non-constant bounds: a grid from low to high hits all n_bins bins per dim."""
    tok = data.draw(tokenizers(allow_constant=False))
    grid = np.linspace(tok.low, tok.high, 10 * tok.n_bins + 1)
    bins = tok.encode(grid)
    for d in range(tok.action_dim):
        np.testing.assert_array_equal(np.unique(bins[:, d]), np.arange(tok.n_bins))
