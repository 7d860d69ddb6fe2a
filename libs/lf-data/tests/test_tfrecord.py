"""TFRecord framing, CRC-32C and tf.train.Example decoding against the `tfrecord` package's writer."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from lf_data import DataError
from lf_data._tf_example import WireError, parse_example, parse_sequence_example
from lf_data._tfrecord import crc32c, iter_tfrecord, masked_crc32c, read_record_at, read_tfrecord


def test_crc32c_check_value_and_fast_path_agree():
    """Oracle: the CRC-32C check value of b"123456789" (0xE3069283, RFC 3720 / iSCSI) and the
    `crc32c` package on random bytes."""
    assert crc32c(b"123456789", pure_python=True) == 0xE3069283
    assert crc32c(b"", pure_python=True) == 0
    data = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    fast = pytest.importorskip("crc32c")
    assert crc32c(data, pure_python=True) == fast.crc32c(data)
    c = fast.crc32c(data)
    assert masked_crc32c(data, pure_python=True) == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32


def _write(path, records):
    from tfrecord.writer import TFRecordWriter

    w = TFRecordWriter(str(path))
    for datum in records:
        w.write(datum)
    w.close()


def test_examples_written_by_tfrecord_package_read_back_equal(tmp_path):
    """Oracle: the values given to tfrecord.writer.TFRecordWriter (packed float/int64 lists, bytes lists,
    negative and 64-bit ints)."""
    pytest.importorskip("tfrecord")
    rng = np.random.default_rng(1)
    records = []
    for i in range(4):
        records.append({
            "f": (rng.normal(size=7 + i).astype(np.float32), "float"),
            "i": ([-1, 0, 2**40, -(2**62), i], "int"),
            "b": ([b"abc", bytes(range(256)) * 3, b""], "byte"),
            "one": (3.5, "float"),
        })
    path = tmp_path / "x.tfrecord"
    _write(path, records)
    got = list(iter_tfrecord(path))
    assert [i for i, _, _ in got] == [0, 1, 2, 3]
    for (_, offset, data), want in zip(got, records, strict=True):
        ex = parse_example(data)
        np.testing.assert_array_equal(ex["f"], want["f"][0])
        assert ex["f"].dtype == np.float32
        np.testing.assert_array_equal(ex["i"], np.array(want["i"][0], np.int64))
        assert ex["b"] == want["b"][0]
        np.testing.assert_array_equal(ex["one"], [3.5])
        assert read_record_at(path, offset) == data
    assert read_tfrecord(path) == [d for _, _, d in got]


def test_sequence_example_written_by_tfrecord_package(tmp_path):
    """Oracle: the context and per-step feature lists given to TFRecordWriter.write(datum, sequence_datum)."""
    pytest.importorskip("tfrecord")
    from tfrecord.writer import TFRecordWriter

    path = tmp_path / "seq.tfrecord"
    w = TFRecordWriter(str(path))
    w.write({"length": (3, "int")}, {"tokens": ([[1, 2], [3], [-4, 5, 6]], "int"),
                                     "frames": ([b"a", b"bb", b"ccc"], "byte")})
    w.close()
    (data,) = read_tfrecord(path)
    context, lists = parse_sequence_example(data)
    np.testing.assert_array_equal(context["length"], [3])
    assert [x.tolist() for x in lists["tokens"]] == [[1, 2], [3], [-4, 5, 6]]
    assert lists["frames"] == [[b"a"], [b"bb"], [b"ccc"]]


def _varint(v: int) -> bytes:
    out = b""
    v &= (1 << 64) - 1
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def test_unpacked_repeated_scalars_decode_like_packed():
    """Oracle: the protobuf encoding spec (parsers accept unpacked repeated scalars); bytes built by hand."""
    floats = b"".join(_varint(1 << 3 | 5) + struct.pack("<f", v) for v in (1.5, -2.0))
    ints = b"".join(_varint(1 << 3 | 0) + _varint(v) for v in (7, -3))
    feats = _ld(1, _ld(1, b"x") + _ld(2, _ld(2, floats))) + _ld(1, _ld(1, b"y") + _ld(2, _ld(3, ints)))
    ex = parse_example(_ld(1, feats))
    np.testing.assert_array_equal(ex["x"], [1.5, -2.0])
    np.testing.assert_array_equal(ex["y"], [7, -3])
    with pytest.raises(WireError, match="past the end"):
        parse_example(_ld(1, feats)[:-3])


def _three_records(tmp_path):
    pytest.importorskip("tfrecord")
    path = tmp_path / "r.tfrecord"
    _write(path, [{"v": ([float(i)] * 10, "float")} for i in range(3)])
    return path, [off for _, off, _ in iter_tfrecord(path)]


def test_truncated_file_raises_with_record_and_offset(tmp_path):
    """Oracle: the file cut 5 bytes before its end; the last record (index 2) is truncated."""
    path, offsets = _three_records(tmp_path)
    path.write_bytes(path.read_bytes()[:-5])
    items = []
    with pytest.raises(DataError, match=rf"r\.tfrecord: record 2 at byte {offsets[2]}: truncated data") as e:
        items.extend(iter_tfrecord(path))
    assert len(items) == 2 and e.value.reason == "truncated" and e.value.record == 2


def test_crc_mismatch_of_data_and_length(tmp_path):
    """Oracle: one data byte of record 1 flipped -> data CRC mismatch yielded for record 1 only;
    a length byte of record 0 flipped -> length CRC mismatch raised."""
    path, offsets = _three_records(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[offsets[1] + 12 + 3] ^= 0xFF
    path.write_bytes(bytes(raw))
    items = list(iter_tfrecord(path))
    assert [type(x).__name__ for _, _, x in items] == ["bytes", "DataError", "bytes"]
    assert "record 1" in str(items[1][2]) and "data CRC mismatch" in str(items[1][2])
    with pytest.raises(DataError, match="data CRC mismatch"):
        read_tfrecord(path)
    raw[offsets[0]] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="record 0 at byte 0: length CRC mismatch"):
        list(iter_tfrecord(path))


def test_lfs_pointer_in_place_of_tfrecord(tmp_path):
    """Oracle: a Git LFS pointer file (spec v1 header)."""
    path = tmp_path / "p.tfrecord"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 123\n")
    with pytest.raises(DataError, match="Git LFS pointer") as e:
        list(iter_tfrecord(path))
    assert e.value.reason == "lfs_pointer" and e.value.file == str(path)


def test_pure_python_crc_path_reads_the_same(tmp_path, monkeypatch):
    """Oracle: records read with the `crc32c` package's CRC; the fallback must accept (and check) them too."""
    path, _ = _three_records(tmp_path)
    want = read_tfrecord(path)
    import lf_data._tfrecord as tfr

    monkeypatch.setattr(tfr, "_crc32c_fast", None)
    assert read_tfrecord(path) == want
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="record 0 at byte 0: data CRC mismatch"):
        read_tfrecord(path)


def test_data_error_survives_pickling():
    """Oracle: DataLoader workers pickle exceptions; message and attributes must come back."""
    import pickle

    e = DataError("f: bad", file="f", episode=3, field="steps/action", record=1, offset=9, reason="crc")
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.file, back.episode, back.field, back.record, back.offset, back.reason) == \
        ("f: bad", "f", 3, "steps/action", 1, 9, "crc")
