"""Building BinningTokenizer (fit, from_actions, validation) and its edge cases.

Oracles: hand-written stats dicts, a table whose quantiles are known in closed
form, and hand arithmetic on the documented layout (w = 2 / n_bins).
"""

import numpy as np
import pytest

from lf_tokenize_action import BinningTokenizer

STATS = {  # LeRobot meta/stats.json "action" entry, D = 3
    "mean": [0.1, 0.0, 0.5],
    "std": [0.2, 0.3, 0.5],
    "min": [-1.0, -2.0, 0.0],
    "max": [1.0, 2.0, 1.0],
    "q01": [-0.5, -1.5, 0.0],
    "q99": [0.5, 1.0, 1.0],
    "count": [1000],
}


def test_fit_q01_q99_default():
    """Default bounds are q01/q99; x = q99 -> last bin, x = q01 -> bin 0, midpoint -> bin n_bins/2."""
    tok = BinningTokenizer.fit(STATS, n_bins=8)
    np.testing.assert_array_equal(tok.low, [-0.5, -1.5, 0.0])
    np.testing.assert_array_equal(tok.high, [0.5, 1.0, 1.0])
    assert tok.low.dtype == np.float64 and tok.action_dim == 3 and tok.n_bins == 8
    np.testing.assert_array_equal(tok.encode([[0.5, -1.5, 0.5]]), [[7, 0, 4]])


def test_fit_min_max():
    """bounds='min_max' reads stats['min'] / stats['max']."""
    tok = BinningTokenizer.fit(STATS, bounds="min_max")
    np.testing.assert_array_equal(tok.low, [-1.0, -2.0, 0.0])
    np.testing.assert_array_equal(tok.high, [1.0, 2.0, 1.0])
    assert tok.n_bins == 256


def test_fit_missing_key_and_bad_bounds():
    """A missing key is named in the message; unknown bounds are rejected with the value."""
    stats = {k: v for k, v in STATS.items() if k != "q99"}
    with pytest.raises(ValueError, match="'q99'"):
        BinningTokenizer.fit(stats)
    with pytest.raises(ValueError, match="'median'"):
        BinningTokenizer.fit(STATS, bounds="median")


def test_from_actions_quantiles():
    """Column 0..100 (101 rows): linear-interpolated q01 = 1, q99 = 99; min/max = 0 and 100."""
    col = np.arange(101, dtype=np.float64)
    actions = np.stack([col, -2 * col], axis=1)
    tok = BinningTokenizer.from_actions(actions)
    np.testing.assert_allclose(tok.low, [1.0, -198.0])
    np.testing.assert_allclose(tok.high, [99.0, -2.0])
    tok = BinningTokenizer.from_actions(actions, bounds="min_max", n_bins=16)
    np.testing.assert_array_equal(tok.low, [0.0, -200.0])
    np.testing.assert_array_equal(tok.high, [100.0, 0.0])
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        BinningTokenizer.from_actions(col)


def test_constant_dimension():
    """low == high == 5: 5 normalizes to 0 (bin n_bins/2), every bin decodes to 5, off-values clip and are flagged."""
    tok = BinningTokenizer([5.0, 0.0], [5.0, 1.0], n_bins=4)
    np.testing.assert_array_equal(tok.normalize([[5.0, 0.5]]), [[0.0, 0.0]])
    bins, clipped = tok.encode([[5.0, 0.5], [4.0, 0.5], [6.0, 0.5]], return_clipped=True)
    np.testing.assert_array_equal(bins[:, 0], [2, 0, 3])
    np.testing.assert_array_equal(clipped[:, 0], [False, True, True])
    np.testing.assert_array_equal(tok.decode([[0, 0], [1, 1], [3, 3]])[:, 0], [5.0, 5.0, 5.0])


def test_normalize_mask_passes_dimension_through():
    """A mask=False dim ignores low/high: raw 0.49 -> bin 2 of 4, bin 2 -> 0.25, |x| > 1 clipped and flagged."""
    tok = BinningTokenizer([0.0, 0.0], [100.0, 100.0], n_bins=4, normalize_mask=np.array([True, False]))
    np.testing.assert_allclose(tok.normalize([[49.0, 0.49]]), [[-0.02, 0.49]], rtol=0, atol=1e-15)
    bins, clipped = tok.encode([[49.0, 0.49], [50.0, 1.5], [50.0, -1.0]], return_clipped=True)
    np.testing.assert_array_equal(bins, [[1, 2], [2, 3], [2, 0]])
    np.testing.assert_array_equal(clipped[:, 1], [False, True, False])
    np.testing.assert_array_equal(tok.decode([[2, 2]]), [[62.5, 0.25]])
    np.testing.assert_array_equal(tok.unnormalize([[0.0, -0.3]]), [[50.0, -0.3]])


def test_shapes_are_preserved():
    """encode/decode keep any leading shape (batch, time, D)."""
    tok = BinningTokenizer(np.zeros(3), np.ones(3), n_bins=10)
    x = np.full((2, 5, 3), 0.55)
    bins = tok.encode(x)
    assert bins.shape == (2, 5, 3) and bins.dtype == np.int64 and (bins == 5).all()
    out = tok.decode(bins)
    assert out.shape == (2, 5, 3) and out.dtype == np.float64
    np.testing.assert_allclose(out, 0.55)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"low": [0.0, 1.0], "high": [1.0]}, "same shape"),
        ({"low": [[0.0]], "high": [[1.0]]}, "1-D"),
        ({"low": [0.0, 2.0], "high": [1.0, 1.0]}, r"low\[1\]=2.0 > high\[1\]=1.0"),
        ({"low": [0.0], "high": [float("inf")]}, "high must be finite; got inf"),
        ({"low": [0.0], "high": [1.0], "n_bins": 1}, "n_bins must be an int >= 2; got 1"),
        ({"low": [0.0], "high": [1.0], "n_bins": 2.5}, "got 2.5"),
        ({"low": [0.0], "high": [1.0], "normalize_mask": [1]}, "normalize_mask"),
    ],
)
def test_constructor_validation(kwargs, match):
    """Each bad argument gives a ValueError naming the field and value."""
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        BinningTokenizer(kwargs.pop("low"), kwargs.pop("high"), **kwargs)


def test_nan_and_inf_raise_with_index():
    """NaN/inf in encode input -> ValueError naming the first bad index."""
    tok = BinningTokenizer(np.zeros(2), np.ones(2))
    x = np.zeros((3, 2))
    x[1, 1] = np.nan
    x[2, 0] = np.inf
    with pytest.raises(ValueError, match=r"got nan at index \(1, 1\) \(2 non-finite"):
        tok.encode(x)
    with pytest.raises(ValueError, match=r"index \(0,\)"):
        tok.normalize([-np.inf, 0.0])


def test_decode_out_of_range_raises():
    """Bins outside [0, n_bins) raise (never clipped), naming the count and the first bad value."""
    tok = BinningTokenizer(np.zeros(2), np.ones(2), n_bins=4)
    with pytest.raises(ValueError, match=r"2 value\(s\) out of range, first is 4 at index \(0, 1\)"):
        tok.decode([[0, 4], [-1, 3]])
    with pytest.raises(TypeError, match="integer dtype"):
        tok.decode(np.array([[0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 2\)"):
        tok.decode([0, 1, 2])
