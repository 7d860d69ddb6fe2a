"""ActionVocab: bins <-> token ids reserved after the text vocabulary.

Oracle: the documented mapping, token id = base_vocab_size + bin.
"""

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from lf_tokenize_action import ActionVocab


def test_mapping_round_trip():
    """Every bin maps to offset + bin and back; the range ends at vocab_size."""
    v = ActionVocab(base_vocab_size=1000, n_bins=256)
    assert (v.offset, v.vocab_size) == (1000, 1256)
    bins = np.arange(256).reshape(16, 16)
    ids = v.to_token_ids(bins)
    assert ids.dtype == np.int64 and ids.shape == (16, 16)
    np.testing.assert_array_equal(ids, bins + 1000)
    np.testing.assert_array_equal(v.to_bins(ids), bins)
    np.testing.assert_array_equal(v.to_bins(np.array([1000, 1255], dtype=np.int32)), [0, 255])


def test_is_action_token():
    """True exactly on [offset, vocab_size)."""
    v = ActionVocab(10, 4)
    np.testing.assert_array_equal(v.is_action_token([0, 9, 10, 13, 14, -1]), [False, False, True, True, False, False])


def test_errors():
    """Ids outside the action range and bins outside [0, n_bins) raise with the count and first offender."""
    v = ActionVocab(10, 4)
    with pytest.raises(ValueError, match=r"2 value\(s\) out of range, first is 9 at index \(1,\)"):
        v.to_bins([10, 9, 14])
    with pytest.raises(ValueError, match=r"1 value\(s\) out of range, first is 4"):
        v.to_token_ids([0, 4])
    with pytest.raises(TypeError, match="integer dtype"):
        v.to_bins([10.0])
    with pytest.raises(ValueError, match="base_vocab_size must be an int >= 0; got -1"):
        ActionVocab(-1, 4)
    with pytest.raises(ValueError, match="n_bins must be an int >= 1; got 0"):
        ActionVocab(10, 0)


def test_dict_round_trip():
    """from_dict(to_dict()) is equal; another version is refused naming the field."""
    v = ActionVocab(32000, 256)
    d = v.to_dict()
    assert d == {"format": "lf-tokenize-action/vocab", "version": 2, "base_vocab_size": 32000, "n_bins": 256,
                 "start": None, "descending": False}
    assert ActionVocab.from_dict(d) == v
    with pytest.raises(ValueError, match="field 'version' must be 1 or 2; got 3"):
        ActionVocab.from_dict({**d, "version": 3})


def test_from_tokenizer():
    """base_vocab_size = HF tokenizer size including added tokens (3 words + 2 added = 5)."""
    tok = Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.add_special_tokens(["<bos>", "<eos>"])
    v = ActionVocab.from_tokenizer(tok, n_bins=8)
    assert (v.offset, v.vocab_size) == (5, 13)
