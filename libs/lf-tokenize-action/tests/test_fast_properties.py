"""Property tests for FastTokenizer (hypothesis).

Oracles:
- Nested grids: with scales 10 | 50 | 200, every grid point of a coarser scale
  lies on the finer grids, so each rounded coefficient is at least as close at
  a finer scale; the orthonormal DCT keeps L2 distances, so the normalized RMS
  reconstruction error is non-increasing in scale and <= 0.5 / scale.
- The quantized grid: a chunk built as idct(K / scale) from integers K encodes
  to exactly K and decodes to itself (float64 precision).
- Malformed sequences: any sequence that does not give H * D coefficients
  raises ActionDecodeError, or is flagged (NaN row) with on_error="mask".
"""

import numpy as np
import pytest
import scipy.fft
from hypothesis import given, settings
from hypothesis import strategies as st

from lf_tokenize_action import ActionDecodeError, FastTokenizer

SETTINGS = settings(max_examples=15, deadline=None)


@st.composite
def smooth_chunks(draw):
    """(n, H, D) random smooth chunks in [-1, 1]: cumulative sums of small random steps, plus a random offset."""
    n, horizon, dim = draw(st.integers(2, 30)), draw(st.integers(2, 16)), draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = rng.normal(scale=draw(st.floats(0.001, 0.3)), size=(n, horizon, dim))
    x = np.cumsum(steps, axis=1) + rng.uniform(-0.5, 0.5, size=(n, 1, dim))
    return np.clip(x, -1.0, 1.0)


def _identity_fit(chunks, scale, vocab_size=8192):
    """Fit with bounds [-1, 1] (all dims pass through), so normalized units are action units."""
    dim = chunks.shape[-1]
    stats = {"min": [-1.0] * dim, "max": [1.0] * dim}
    return FastTokenizer.fit(chunks, scale=scale, vocab_size=vocab_size, stats=stats, bounds="min_max")


@SETTINGS
@given(chunks=smooth_chunks())
def test_error_non_increasing_in_scale(chunks):
    """RMS error at scales 10, 50, 200 is non-increasing and each <= 0.5 / scale (normalized units)."""
    errors = []
    for scale in (10, 50, 200):
        tok = _identity_fit(chunks, scale)
        out = tok.decode(tok.encode(chunks), horizon=chunks.shape[1])
        rms = float(np.sqrt(((out - chunks) ** 2).mean()))
        assert rms <= 0.5 / scale + 1e-12
        errors.append(rms)
    assert errors[0] + 1e-12 >= errors[1] and errors[1] + 1e-12 >= errors[2]


@SETTINGS
@given(data=st.data(), scale=st.sampled_from([1.0, 10.0, 37.5, 100.0]))
def test_exact_on_quantized_grid(data, scale):
    """x = idct(K / scale) with integer K: quantize(x) == K and decode(encode(x)) == x to float64 precision."""
    n, horizon, dim = data.draw(st.integers(1, 10)), data.draw(st.integers(1, 12)), data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    # |x_t| <= sum_k |K_k| / scale * sqrt(2 / H) <= k_max * sqrt(2 H) / scale < 1: x stays inside [-1, 1].
    k_max = int(0.999 * scale / np.sqrt(2 * horizon))
    coeffs = rng.integers(-k_max, k_max + 1, size=(n, horizon, dim))
    x = scipy.fft.idct(coeffs / scale, axis=1, norm="ortho")
    assert np.abs(x).max() < 1.0
    tok = _identity_fit(x, scale)
    q, clipped = tok.quantize(x)
    np.testing.assert_array_equal(q, coeffs)
    assert not clipped.any()
    np.testing.assert_allclose(tok.decode(tok.encode(x), horizon=horizon), x, rtol=0, atol=1e-13)


@SETTINGS
@given(chunks=smooth_chunks(), data=st.data())
def test_malformed_sequences_raise_or_mask(chunks, data):
    """Dropping, duplicating or corrupting tokens either still gives H*D coefficients or is caught, never zeros."""
    tok = _identity_fit(chunks, 20.0)
    tokens = tok.encode(chunks)
    row = data.draw(st.integers(0, len(tokens) - 1))
    bad = list(tokens[row])
    kind = data.draw(st.sampled_from(["drop", "dup", "oob", "empty"]))
    if kind == "drop":
        del bad[data.draw(st.integers(0, len(bad) - 1))]
    elif kind == "dup":
        bad.insert(0, bad[0])
    elif kind == "oob":
        bad[-1] = tok.vocab_size + data.draw(st.integers(0, 10))
    else:
        bad = []
    rows = list(tokens)
    rows[row] = bad
    # Every vocabulary piece holds >= 1 coefficient, so dropping/adding a token always changes the length.
    with pytest.raises(ActionDecodeError) as info:
        tok.decode(rows, horizon=chunks.shape[1])
    assert info.value.row == row and info.value.expected == chunks.shape[1] * chunks.shape[2]
    actions, failed = tok.decode(rows, horizon=chunks.shape[1], on_error="mask")
    assert failed.tolist() == [r == row for r in range(len(rows))]
    assert np.isnan(actions[row]).all() and np.isfinite(np.delete(actions, row, axis=0)).all()
