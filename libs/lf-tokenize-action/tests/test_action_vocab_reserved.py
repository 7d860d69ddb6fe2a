"""ActionVocab taking over a reserved id range, OpenVLA's id layout, and action labels.

Oracles: OpenVLA's published formula (token id = vocab_size - digitize(x, linspace(-1, 1, 256)))
restated in numpy, and hand-written id tables.
"""

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from lf_tokenize_action import ActionVocab, BinningTokenizer


def test_openvla_token_ids_reproduced_below_the_upper_bound():
    """BinningTokenizer(n_bins=255) + ActionVocab(32000, 255, start=31745, descending) == OpenVLA ids
    for every normalized value below +1. At exactly +1 (every value clipped at the upper bound)
    np.digitize returns 256, so OpenVLA emits one more id, 31744, which its decoder maps back to
    the last bin centre; we keep +1 in the last of exactly 255 bins (pinned below)."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-1, 1, size=5000), np.linspace(-1, 1, 2001), [-1.0, 1.0, 0.0]])
    openvla_ids = 32000 - np.digitize(np.clip(x, -1, 1), np.linspace(-1, 1, 256))
    tok = BinningTokenizer(low=[-1.0], high=[1.0], n_bins=255)
    vocab = ActionVocab(32000, 255, start=32000 - 255, descending=True)
    ours = vocab.to_token_ids(tok.encode(x[:, None]))[:, 0]
    below = x < 1.0
    np.testing.assert_array_equal(ours[below], openvla_ids[below])
    assert set(openvla_ids[~below]) == {31744} and set(ours[~below]) == {31745}
    assert vocab.vocab_size == 32000  # nothing appended


def _openvla_reference(x, vocab_size=32000, n_bins=256):
    """OpenVLA's ActionTokenizer restated: encode and decode (prismatic/vla/action_tokenizer.py)."""
    bins = np.linspace(-1, 1, n_bins)
    centers = (bins[:-1] + bins[1:]) / 2.0
    ids = vocab_size - np.digitize(np.clip(x, -1, 1), bins)
    decoded = centers[np.clip(vocab_size - ids - 1, 0, centers.shape[0] - 1)]
    return ids, decoded


@pytest.mark.parametrize("n_bins", [256, 3, 17])
def test_openvla_layout_reproduces_ids_and_decoding_exactly(tmp_path, n_bins):
    """layout="openvla" + ActionVocab(32000, n, start=32000 - n, descending) == OpenVLA for every value,
    +1 (id 32000 - n) and out-of-range values included; decoding equals OpenVLA's bin centres (to
    float64 rounding of the unnormalize map); the
    layout survives save/load (format version 3)."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-1.2, 1.2, size=5000), np.linspace(-1, 1, 2001), [-1.0, 1.0, 0.0, 3.0]])
    ref_ids, ref_decoded = _openvla_reference(x, n_bins=n_bins)
    tok = BinningTokenizer(low=[-1.0], high=[1.0], n_bins=n_bins, layout="openvla")
    vocab = ActionVocab(32000, n_bins, start=32000 - n_bins, descending=True)
    ids = vocab.to_token_ids(tok.encode(x[:, None]))
    np.testing.assert_array_equal(ids[:, 0], ref_ids)
    assert (ref_ids == 32000 - n_bins).any()  # the +1 id is exercised
    # decoded centres pass through the [low, high] -> [-1, 1] inverse map: equal up to float64 rounding
    np.testing.assert_allclose(tok.decode(vocab.to_bins(ids))[:, 0], ref_decoded, rtol=0, atol=1e-15)
    path = tmp_path / "openvla.json"
    tok.save(path)
    back = BinningTokenizer.load(path)
    assert back == tok and back.layout == "openvla"
    np.testing.assert_array_equal(back.encode(x[:, None]), tok.encode(x[:, None]))


def test_openvla_layout_rejects_quantile_edges_and_tiny_bins():
    with pytest.raises(ValueError, match="layout='openvla' needs uniform bins"):
        BinningTokenizer.from_actions(np.random.default_rng(0).normal(size=(50, 1)), n_bins=8,
                                      binning="quantile", layout="openvla")
    with pytest.raises(ValueError, match="n_bins >= 3"):
        BinningTokenizer([0.0], [1.0], n_bins=2, layout="openvla")
    with pytest.raises(ValueError, match="layout must be one of"):
        BinningTokenizer([0.0], [1.0], n_bins=8, layout="edges")


def test_reserved_range_mapping_and_errors():
    v = ActionVocab(100, 4, start=10)
    np.testing.assert_array_equal(v.to_token_ids([0, 1, 2, 3]), [10, 11, 12, 13])
    np.testing.assert_array_equal(v.to_bins([13, 10]), [3, 0])
    np.testing.assert_array_equal(v.is_action_token([9, 10, 13, 14, 99]), [False, True, True, False, False])
    d = ActionVocab(100, 4, start=10, descending=True)
    np.testing.assert_array_equal(d.to_token_ids([0, 3]), [13, 10])
    np.testing.assert_array_equal(d.to_bins([13, 10]), [0, 3])
    with pytest.raises(ValueError, match="start \\+ n_bins = 104 exceeds base_vocab_size 100"):
        ActionVocab(100, 4, start=100)
    with pytest.raises(ValueError, match=r"out of range, first is 14"):
        v.to_bins([14])
    assert ActionVocab.from_dict(d.to_dict()) == d


def test_from_tokenizer_takes_over_reserved_tokens():
    vocab = {"[PAD]": 0, "a": 1, "b": 2, **{f"<r{i}>": 3 + i for i in range(4)}, "c": 7}
    hf = Tokenizer(WordLevel(vocab, unk_token="[PAD]"))
    v = ActionVocab.from_tokenizer(hf, 4, reserved_tokens=[f"<r{i}>" for i in range(4)])
    assert (v.offset, v.vocab_size) == (3, 8)
    np.testing.assert_array_equal(v.to_token_ids([0, 3]), [3, 6])
    with pytest.raises(ValueError, match="consecutive ids"):
        ActionVocab.from_tokenizer(hf, 4, reserved_tokens=["<r0>", "<r1>", "c", "<r3>"])
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        ActionVocab.from_tokenizer(hf, 4, reserved_tokens=["<r0>", "<r1>", "<r2>", "zzz"])


def test_action_labels_mask_everything_but_actions():
    v = ActionVocab(10, 4)
    ids = np.array([[1, 2, 10, 13], [5, 11, 0, 12]])
    np.testing.assert_array_equal(v.action_labels(ids), [[-100, -100, 10, 13], [-100, 11, -100, 12]])
    torch = pytest.importorskip("torch")
    out = v.action_labels(torch.tensor(ids), ignore_index=-1)
    assert isinstance(out, torch.Tensor) and out.tolist() == [[-1, -1, 10, 13], [-1, 11, -1, 12]]


def test_version_1_files_still_load():
    v1 = {"format": "lf-tokenize-action/vocab", "version": 1, "base_vocab_size": 7, "n_bins": 3}
    assert ActionVocab.from_dict(v1) == ActionVocab(7, 3)
