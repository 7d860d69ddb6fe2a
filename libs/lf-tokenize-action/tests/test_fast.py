"""FastTokenizer (FAST, arXiv:2501.09747): round trips, errors, persistence, torch.

Oracles: scipy's orthonormal DCT computed here by hand (coefficients =
round(scale * dct(normalized, axis=time))), the public processor's flattening
order (C order of the (H, D) coefficient matrix), and the documented
ActionDecodeError contract (row, decoded length, expected length).
"""

import json

import numpy as np
import pytest
import scipy.fft

from lf_tokenize_action import ActionDecodeError, ActionVocab, FastTokenizer


def smooth_chunks(n, horizon=10, dim=3, seed=0):
    """Sums of two random sinusoids per dimension, amplitude <= 1: (n, horizon, dim) float64."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, horizon)[None, :, None]
    f, p, a = (rng.uniform(lo, hi, size=(n, 2, 1, dim)) for lo, hi in ((0.1, 2.0), (0, 6.3), (0.0, 0.5)))
    return (a * np.sin(2 * np.pi * f * t[:, None] + p)).sum(axis=1)


@pytest.fixture(scope="module")
def fitted():
    chunks = smooth_chunks(300)
    return FastTokenizer.fit(chunks, scale=10, vocab_size=256, bounds="min_max"), chunks


def test_coefficients_match_hand_dct_and_order(fitted):
    """quantize == round(10 * dct_ortho(normalize(x), axis=time)); encode's string is that matrix in C order."""
    tok, chunks = fitted
    norm = np.clip(2 * (chunks - tok.low) / (tok.high - tok.low) - 1, -1, 1)
    expected = np.rint(10 * scipy.fft.dct(norm, axis=1, norm="ortho")).astype(np.int64)
    coeffs, clipped = tok.quantize(chunks)
    assert not clipped.any()
    np.testing.assert_array_equal(coeffs, expected)
    pieces = {i: p for p, i in tok.bpe.get_vocab().items()}
    text = "".join(pieces[i] for i in tok.encode(chunks[:1])[0])
    codes = np.array([ord(c) for c in text]) - 0x100 + tok.min_coeff
    np.testing.assert_array_equal(codes, expected[0].ravel())  # f0d0, f0d1, f0d2, f1d0, ...


def test_round_trip_and_compression(fitted):
    """decode(encode(x)) == reconstruct(quantize(x)) exactly; fewer tokens than H * D; error <= 0.5/scale per coeff."""
    tok, chunks = fitted
    tokens = tok.encode(chunks)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for t in tokens for i in t)
    assert np.mean([len(t) for t in tokens]) < 30  # H * D = 30 values per chunk
    out = tok.decode(tokens, horizon=10, action_dim=3)
    np.testing.assert_array_equal(out, tok.reconstruct(tok.quantize(chunks)[0]))
    norm_err = 2 * (out - chunks) / (tok.high - tok.low)
    rms = np.sqrt((norm_err**2).mean(axis=(1, 2)))
    assert (rms <= 0.5 / 10 + 1e-12).all()  # orthonormal DCT: rms error <= max rounding error 0.5 / scale


def test_decode_errors_raise_or_mask(fitted):
    """Short sequence / bad id -> ActionDecodeError naming row and lengths; mask mode gives NaN rows, never zeros."""
    tok, chunks = fitted
    tokens = tok.encode(chunks[:3])
    with pytest.raises(ActionDecodeError, match=r"token sequence 1: .*expected 30\)") as info:
        tok.decode([tokens[0], tokens[1][:-1], tokens[2]])
    assert info.value.row == 1 and info.value.expected == 30 and info.value.got < 30
    assert isinstance(info.value, ValueError)
    with pytest.raises(ActionDecodeError, match=r"token id 9999 at position 0 is outside \[0, "):
        tok.decode([[9999]])
    with pytest.raises(ActionDecodeError, match="token sequence 0"):
        tok.decode([tokens[0] + tokens[0]])
    actions, failed = tok.decode([tokens[0], [], tokens[2] + [-1]], on_error="mask")
    assert failed.tolist() == [False, True, True]
    assert np.isnan(actions[1:]).all() and np.isfinite(actions[0]).all()
    with pytest.raises(ActionDecodeError, match="expected 60"):
        tok.decode(tokens[:1], horizon=20)
    with pytest.raises(ValueError, match="action_dim must be 3"):
        tok.decode(tokens, action_dim=4)
    with pytest.raises(ValueError, match="on_error must be"):
        tok.decode(tokens, on_error="zeros")


def test_padded_array_input_and_vocab(fitted):
    """A padded (n, L) int array decodes with pad_id; ActionVocab maps FAST ids after a text vocabulary."""
    tok, chunks = fitted
    tokens = tok.encode(chunks[:4])
    width = max(len(t) for t in tokens)
    padded = np.full((4, width), -7, dtype=np.int64)
    for r, t in enumerate(tokens):
        padded[r, : len(t)] = t
    np.testing.assert_array_equal(tok.decode(padded, pad_id=-7), tok.decode(tokens))
    vocab = ActionVocab(32000, tok.vocab_size)
    ids = vocab.to_token_ids(np.array(tokens[0]))
    assert ids.min() >= 32000 and vocab.to_bins(ids).tolist() == tokens[0]


def test_clipping_is_reported(fitted):
    """Actions beyond the bounds, or coefficients beyond the fitted alphabet, mark the row clipped."""
    tok, chunks = fitted
    far = chunks[:2].copy()
    far[1, 0, 0] = tok.high[0] + 10.0
    _, clipped = tok.encode(far, return_clipped=True)
    assert clipped.tolist() == [False, True]
    coeffs, clipped = tok.quantize(np.broadcast_to(tok.high, (1, 10, 3)))  # DC = 10 * sqrt(10) > alphabet
    assert clipped.tolist() == [True] and coeffs.max() == tok.max_coeff


def test_fit_validation():
    """vocab_size below the alphabet, and bad chunk shapes, raise with the values."""
    chunks = smooth_chunks(20)
    with pytest.raises(ValueError, match=r"vocab_size must be >= the coefficient alphabet size \d+ .*got vocab_size=8"):
        FastTokenizer.fit(chunks, vocab_size=8)
    with pytest.raises(ValueError, match=r"shape \(n, H, D\)"):
        FastTokenizer.fit(chunks[0])
    with pytest.raises(ValueError, match="scale must be a finite number > 0; got 0"):
        FastTokenizer.fit(chunks, scale=0)


def test_save_load(tmp_path, fitted):
    """load(save(t)) == t and gives the same tokens; the BPE JSON is embedded; other versions are refused."""
    tok, chunks = fitted
    path = tmp_path / "fast.json"
    tok.save(path)
    d = json.loads(path.read_text())
    assert d["format"] == "lf-tokenize-action/fast" and d["version"] == 1 and d["bpe"]["model"]["type"] == "BPE"
    back = FastTokenizer.load(path)
    assert back == tok
    assert back.encode(chunks[:20]) == tok.encode(chunks[:20])
    path.write_text(json.dumps({**d, "version": 2}))
    with pytest.raises(ValueError, match=r"fast\.json: field 'version' must be 1; got 2"):
        FastTokenizer.load(path)
    path.write_text(json.dumps({k: v for k, v in d.items() if k != "bpe"}))
    with pytest.raises(ValueError, match="missing field 'bpe'"):
        FastTokenizer.load(path)


def test_torch_inputs(fitted):
    """torch chunks encode like numpy; token tensors decode to float32 tensors (mask too)."""
    torch = pytest.importorskip("torch")
    tok, chunks = fitted
    tokens = tok.encode(torch.tensor(chunks[:3], dtype=torch.float32))
    assert tokens == tok.encode(chunks[:3].astype(np.float32).astype(np.float64))
    out, failed = tok.decode([torch.tensor(t) for t in tokens], on_error="mask")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (3, 10, 3)
    assert failed.dtype == torch.bool and not failed.any()
    np.testing.assert_allclose(out.numpy(), tok.decode(tokens).astype(np.float32))
