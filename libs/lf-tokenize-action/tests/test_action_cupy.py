"""cupy batches: the FAST DCT on the GPU (cupyx) and the binning maps return cupy arrays.

Oracle: the same tokenizer on the same values as numpy arrays (the CPU path, itself
tested against scipy and hand-computed layouts). Skipped where cupy or a GPU is missing
(CI); run on the GPU machine with ``pytest -m gpu``.
"""

import numpy as np
import pytest

from lf_tokenize_action import BinningTokenizer, FastTokenizer

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu
try:
    _HAS_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # cupy installed without a driver
    _HAS_GPU = False
if not _HAS_GPU:
    pytest.skip("no CUDA device for cupy", allow_module_level=True)


def _chunks(n=64, horizon=10, dims=4, seed=0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, horizon)[None, :, None]
    return np.sin(2 * np.pi * (t * rng.uniform(0.5, 2, (n, 1, dims)) + rng.uniform(0, 1, (n, 1, dims))))


def test_fast_quantize_and_encode_on_cupy_match_numpy():
    """cupyx DCT coefficients and token ids equal the scipy path on the same chunks."""
    x = _chunks()
    tok = FastTokenizer.fit(x, scale=20.0, vocab_size=512)
    coeffs_np, clipped_np = tok.quantize(x)
    coeffs_cp, clipped_cp = tok.quantize(cupy.asarray(x))
    np.testing.assert_array_equal(coeffs_cp, coeffs_np)
    np.testing.assert_array_equal(clipped_cp, clipped_np)
    assert tok.encode(cupy.asarray(x)) == tok.encode(x)


def test_binning_encode_decode_on_cupy_returns_cupy_and_matches_numpy():
    """Bins and decoded actions equal numpy's and come back as cupy arrays on the GPU."""
    x = _chunks(n=32).reshape(-1, 4) * 1.3
    tok = BinningTokenizer.from_actions(x, n_bins=256)
    bins = tok.encode(cupy.asarray(x))
    assert isinstance(bins, cupy.ndarray) and bins.dtype == cupy.int64
    np.testing.assert_array_equal(bins.get(), tok.encode(x))
    decoded = tok.decode(bins)
    assert isinstance(decoded, cupy.ndarray)
    np.testing.assert_array_equal(decoded.get(), tok.decode(tok.encode(x)))


def test_fast_decode_on_cupy_returns_float64_cupy_equal_to_numpy():
    """FAST decode of the same ids: cupy in, float64 cupy out, equal to the numpy path."""
    x = _chunks()
    tok = FastTokenizer.fit(x, scale=20.0, vocab_size=512)
    ids = tok.encode(x)
    want = tok.decode(ids, horizon=x.shape[1])
    got = tok.decode([cupy.asarray(i) for i in ids], horizon=x.shape[1])
    assert isinstance(got, cupy.ndarray) and got.dtype == cupy.float64
    np.testing.assert_array_equal(got.get(), want)
