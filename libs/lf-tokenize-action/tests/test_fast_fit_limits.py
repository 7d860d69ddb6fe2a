"""FastTokenizer.fit limits: the coefficient alphabet, the measured reconstruction error, the tolerance.

Oracles: the character mapping's documented limit (``0xD800 - 0x100`` code points
below the UTF-16 surrogate block), a float64 DCT-II matrix built here from its
definition (not scipy) for the reconstruction error, and the JSON file written by
``save``.
"""

import json

import numpy as np
import pytest

from lf_tokenize_action import (
    CoefficientRangeError,
    FastTokenizer,
    ReconstructionStats,
    ReconstructionToleranceError,
)

MAX_ALPHABET = 0xD800 - 0x100


def _chunks(n=40, horizon=10, dim=3, seed=0):
    """Random walks (n, horizon, dim) float64 with per-dimension offsets and scales (action units)."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(size=(n, horizon, dim)) * np.array([0.1, 2.0, 30.0])[:dim]
    return steps.cumsum(axis=1) + np.array([5.0, -1.0, 100.0])[:dim]


def _dct_matrix(h):
    """Orthonormal DCT-II matrix (h, h) in float64: C[k, t] = a_k cos(pi (2t + 1) k / (2h))."""
    k, t = np.meshgrid(np.arange(h), np.arange(h), indexing="ij")
    c = np.sqrt(2.0 / h) * np.cos(np.pi * (2 * t + 1) * k / (2 * h))
    c[0] /= np.sqrt(2.0)
    return c


def test_coefficient_range_beyond_alphabet_raises_named_error():
    """A scale whose coefficients span more than the alphabet raises CoefficientRangeError (was UnicodeDecodeError).

    Oracle: the alphabet limit 0xD800 - 0x100 and the coefficient range computed here (min_max bounds,
    orthonormal DCT); the suggested scale must fit: 2 * sqrt(H) * scale + 2 <= limit.
    """
    x = _chunks()
    scale = 1e5
    norm = 2 * (x - x.min(axis=(0, 1))) / (x.max(axis=(0, 1)) - x.min(axis=(0, 1))) - 1
    coeffs = np.rint(np.einsum("kt,ntd->nkd", _dct_matrix(10), norm) * scale)
    assert coeffs.max() - coeffs.min() + 1 > MAX_ALPHABET  # the case under test
    with pytest.raises(CoefficientRangeError) as info:
        FastTokenizer.fit(x, scale=scale, vocab_size=1_000_000, bounds="min_max")
    err = info.value
    assert isinstance(err, ValueError) and not isinstance(err, UnicodeError)
    assert (err.min_coeff, err.max_coeff) == (int(coeffs.min()), int(coeffs.max()))
    assert err.limit == MAX_ALPHABET and err.scale == scale
    msg = str(err)
    assert f"{err.min_coeff}..{err.max_coeff}" in msg and f"at most {MAX_ALPHABET} values" in msg
    assert "lower scale" in msg
    assert 2 * np.sqrt(10) * err.max_scale + 2 <= MAX_ALPHABET
    # the suggested scale does fit, also for the worst case (constant chunks at the bounds)
    worst = np.concatenate([x, np.broadcast_to(x.max(axis=(0, 1)), (1, 10, 3)),
                            np.broadcast_to(x.min(axis=(0, 1)), (1, 10, 3))])
    tok = FastTokenizer.fit(worst, scale=err.max_scale, vocab_size=1_000_000, bounds="min_max", min_frequency=10**9)
    assert tok.alphabet_size <= MAX_ALPHABET
    # the range check comes before the vocabulary check, whose advice (raise vocab_size) could not help
    with pytest.raises(CoefficientRangeError):
        FastTokenizer.fit(x, scale=scale, vocab_size=1024, bounds="min_max")


def test_coefficient_range_message_separates_measured_range_from_theoretical_bound():
    """The message says which numbers are measured on the data and which are the theoretical bound.

    Oracle: the coefficient range computed here (min_max bounds, float64 DCT-II matrix) and the bound
    sqrt(H) * scale for normalized actions in [-1, 1]; a chunk constant at the upper bound reaches it,
    random walks inside the bounds do not reach it from below.
    """
    x = _chunks()
    top = np.broadcast_to(x.max(axis=(0, 1)), (1, 10, 3))  # constant at the max: normalized +1 throughout
    x = np.concatenate([x, top])
    scale = 1e5
    norm = 2 * (x - x.min(axis=(0, 1))) / (x.max(axis=(0, 1)) - x.min(axis=(0, 1))) - 1
    coeffs = np.rint(np.einsum("kt,ntd->nkd", _dct_matrix(10), norm) * scale).astype(int)
    bound = int(np.rint(np.sqrt(10) * scale))
    assert coeffs.max() == bound and coeffs.min() > -bound  # the case under test
    with pytest.raises(CoefficientRangeError) as info:
        FastTokenizer.fit(x, scale=scale, vocab_size=1_000_000, bounds="min_max")
    err, msg = info.value, str(info.value)
    assert (err.horizon, err.bound) == (10, bound)
    assert f"range measured on the fitting chunks is {coeffs.min()}..{coeffs.max()}" in msg
    assert f"theoretical bound for actions normalized to [-1, 1] at horizon 10 is -{bound}..{bound}" in msg
    assert f"{bound} reaches that bound" in msg and f"{coeffs.min()} reaches" not in msg


@pytest.mark.parametrize("bounds", ["min_max", "q01_q99"])
def test_reconstruction_error_matches_float64_reference(bounds):
    """reconstruction_error == per-dimension max |err| and RMS of a float64 DCT round trip computed here.

    Oracle: normalize with the fitted bounds (clip to [-1, 1]), DCT-II by an explicit float64 matrix,
    round(scale * c), inverse by the transposed matrix, unnormalize; also equal to decode(encode(x)) - x.
    """
    x, scale = _chunks(), 7.0
    tok = FastTokenizer.fit(x, scale=scale, vocab_size=512, bounds=bounds)
    low, high = (np.quantile(x.reshape(-1, 3), q, axis=0) for q in (0.01, 0.99)) if bounds == "q01_q99" else (
        x.min(axis=(0, 1)), x.max(axis=(0, 1)))
    np.testing.assert_allclose(tok.low, low, rtol=1e-12)
    c = _dct_matrix(10)
    norm = np.clip(2 * (x - low) / (high - low) - 1, -1, 1)
    q = np.rint(np.einsum("kt,ntd->nkd", c, norm) * scale)
    rec = (np.einsum("kt,nkd->ntd", c, q / scale) + 1) / 2 * (high - low) + low
    err = rec - x
    stats = tok.reconstruction_error
    assert isinstance(stats, ReconstructionStats) and stats.chunks == 40
    np.testing.assert_allclose(stats.max_abs, np.abs(err).max(axis=(0, 1)), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.rms, np.sqrt((err**2).mean(axis=(0, 1))), rtol=1e-9, atol=1e-12)
    round_trip = tok.decode(tok.encode(x)) - x
    np.testing.assert_allclose(stats.max_abs, np.abs(round_trip).max(axis=(0, 1)), rtol=1e-12)
    assert stats.max_abs.shape == stats.rms.shape == (3,) and (stats.rms <= stats.max_abs).all()


def test_reconstruction_error_saved_and_loaded(tmp_path):
    """save writes reconstruction_error in the JSON; load restores it; a file without it loads with None.

    Oracle: the written JSON file.
    """
    tok = FastTokenizer.fit(_chunks(), scale=7.0, vocab_size=512, bounds="min_max")
    path = tmp_path / "fast.json"
    tok.save(path)
    d = json.loads(path.read_text())
    assert d["version"] == 1
    assert d["reconstruction_error"] == {"max_abs": tok.reconstruction_error.max_abs.tolist(),
                                         "rms": tok.reconstruction_error.rms.tolist(), "chunks": 40}
    back = FastTokenizer.load(path)
    assert back == tok
    np.testing.assert_array_equal(back.reconstruction_error.max_abs, tok.reconstruction_error.max_abs)
    del d["reconstruction_error"]
    path.write_text(json.dumps(d))
    assert FastTokenizer.load(path).reconstruction_error is None
    d["reconstruction_error"] = {"max_abs": [0.1], "rms": [0.1, 0.1, 0.1], "chunks": 40}
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"fast\.json: field 'reconstruction_error\.max_abs' must be 3 finite"):
        FastTokenizer.load(path)


def test_max_reconstruction_error_raises_when_exceeded():
    """max_reconstruction_error below the measured error raises, naming the dimension; at the measured error it passes.

    Oracle: the reconstruction_error of the same fit without a tolerance.
    """
    x = _chunks()
    measured = FastTokenizer.fit(x, scale=7.0, vocab_size=512, bounds="min_max").reconstruction_error.max_abs
    FastTokenizer.fit(x, scale=7.0, vocab_size=512, bounds="min_max", max_reconstruction_error=measured)
    limit = measured.copy()
    limit[1] *= 0.5
    with pytest.raises(ReconstructionToleranceError, match=r"action dimension 1 .*raise scale") as info:
        FastTokenizer.fit(x, scale=7.0, vocab_size=512, bounds="min_max", max_reconstruction_error=limit)
    assert info.value.dim == 1 and info.value.max_abs == pytest.approx(measured[1])
    with pytest.raises(ReconstructionToleranceError, match=r"widen the bounds"):  # q01/q99 clips 2 % of the values
        FastTokenizer.fit(x, scale=200.0, vocab_size=4096, max_reconstruction_error=float(measured.min()))
    with pytest.raises(ValueError, match="max_reconstruction_error must be a number or 3 numbers"):
        FastTokenizer.fit(x, scale=7.0, vocab_size=512, max_reconstruction_error=[0.1, 0.2])
