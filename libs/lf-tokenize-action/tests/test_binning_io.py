"""Persistence of BinningTokenizer: to_dict/from_dict, atomic save, versioned load.

Oracles: the tokenizer that was saved (equality of fields and of encode output),
the directory listing after save, and the JSON text written by hand.
"""

import json
import os

import numpy as np
import pytest

from lf_tokenize_action import BinningTokenizer


def _tok():
    return BinningTokenizer([-0.1, 3.0, 0.0], [0.7, 3.0, 1.0], n_bins=17, normalize_mask=np.array([True, True, False]))


def test_to_dict_contents():
    """The dict carries format, version 1 and every field as plain JSON types."""
    d = _tok().to_dict()
    assert d == {
        "format": "lf-tokenize-action/binning",
        "version": 1,
        "n_bins": 17,
        "low": [-0.1, 3.0, 0.0],
        "high": [0.7, 3.0, 1.0],
        "normalize_mask": [True, True, False],
    }
    assert BinningTokenizer.from_dict(json.loads(json.dumps(d))) == _tok()


def test_save_load_round_trip_and_no_temp_file(tmp_path):
    """load(save(t)) == t bit for bit (same bounds, same encodings); the folder holds only the target file."""
    tok = _tok()
    path = tmp_path / "action_tokenizer.json"
    tok.save(path)
    assert sorted(os.listdir(tmp_path)) == ["action_tokenizer.json"]
    back = BinningTokenizer.load(path)
    assert back == tok
    x = np.random.default_rng(0).uniform(-1, 4, size=(50, 3))
    np.testing.assert_array_equal(back.encode(x), tok.encode(x))
    tok2 = BinningTokenizer([0.0], [1.0], n_bins=2)
    tok2.save(path)  # overwrite in place
    assert BinningTokenizer.load(path) == tok2
    assert sorted(os.listdir(tmp_path)) == ["action_tokenizer.json"]


def test_failed_save_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    """If os.replace fails, the previous file is untouched and the temp file is removed."""
    path = tmp_path / "tok.json"
    _tok().save(path)
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        BinningTokenizer([0.0], [1.0], n_bins=2).save(path)
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["tok.json"]


def test_load_refuses_other_version_and_format(tmp_path):
    """version 4 (unknown) / another format -> ValueError naming the file, the field and the expected values."""
    d = _tok().to_dict()
    path = tmp_path / "future.json"
    path.write_text(json.dumps({**d, "version": 4}))
    with pytest.raises(ValueError, match=r"future\.json: field 'version' must be 1 or 2 or 3; got 4"):
        BinningTokenizer.load(path)
    path.write_text(json.dumps({**d, "format": "other"}))
    with pytest.raises(ValueError, match=r"future\.json: field 'format' must be 'lf-tokenize-action/binning'"):
        BinningTokenizer.load(path)
    path.write_text(json.dumps({k: v for k, v in d.items() if k != "low"}))
    with pytest.raises(ValueError, match=r"future\.json: missing field 'low'"):
        BinningTokenizer.load(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"future\.json: not valid JSON"):
        BinningTokenizer.load(path)
