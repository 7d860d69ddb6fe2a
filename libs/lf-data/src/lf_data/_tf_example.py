"""Decode ``tf.train.Example`` / ``SequenceExample`` from protobuf wire bytes (no TensorFlow).

A hand-written decoder for the few messages of TensorFlow's
``core/example/feature.proto`` and ``example.proto`` (no generated code):

    Example          { Features features = 1; }
    SequenceExample  { Features context = 1; FeatureLists feature_lists = 2; }
    Features         { map<string, Feature> feature = 1; }      # entries {key = 1; value = 2}
    FeatureLists     { map<string, FeatureList> feature_list = 1; }
    FeatureList      { repeated Feature feature = 1; }
    Feature          { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList        { repeated bytes value = 1; }
    FloatList        { repeated float value = 1 [packed = true]; }
    Int64List        { repeated int64 value = 1 [packed = true]; }

Packed and unpacked repeated scalars are both accepted (the protobuf spec
requires parsers to accept either). Unknown fields are skipped.

Decoded values: ``float_list`` -> ``float32`` numpy array, ``int64_list`` ->
``int64`` numpy array, ``bytes_list`` -> ``list[bytes]``; a Feature with no
kind set -> empty ``list``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["parse_example", "parse_sequence_example", "FeatureValue", "WireError"]

FeatureValue = np.ndarray | list
"""float32 array, int64 array, or list of bytes."""


class WireError(ValueError):
    """The bytes are not a valid protobuf message of the expected type."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _fields(buf: memoryview):
    """Yield ``(field_number, wire_type, value)``; value is an int or a memoryview slice."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise WireError(f"unsupported wire type {wire} for field {number}")
        if pos > n:
            raise WireError(f"field {number} runs past the end of the message")
        yield number, wire, value


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _floats(buf: bytes) -> np.ndarray:
    chunks = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if wire == 2:  # packed
            if len(value) % 4:
                raise WireError("packed float list length is not a multiple of 4")
            chunks.append(np.frombuffer(value, "<f4"))
        elif wire == 5:
            chunks.append(np.frombuffer(value, "<f4"))
        else:
            raise WireError(f"float_list value has wire type {wire}")
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


def _int64s(buf: bytes) -> np.ndarray:
    out: list[int] = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if wire == 2:  # packed varints
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                out.append(_signed64(v))
        elif wire == 0:
            out.append(_signed64(value))
        else:
            raise WireError(f"int64_list value has wire type {wire}")
    return np.array(out, dtype=np.int64)


def _bytes_list(buf: bytes) -> list[bytes]:
    return [bytes(v) for number, wire, v in _fields(buf) if number == 1 and wire == 2]


def _feature(buf: bytes) -> FeatureValue:
    value: FeatureValue = []
    for number, wire, v in _fields(buf):
        if wire != 2:
            continue
        if number == 1:
            value = _bytes_list(v)
        elif number == 2:
            value = _floats(v)
        elif number == 3:
            value = _int64s(v)
    return value


def _map_entries(buf: bytes, parse_value) -> dict:
    out = {}
    for number, wire, entry in _fields(buf):
        if number != 1 or wire != 2:
            continue
        key, value = "", None
        for n2, w2, v2 in _fields(entry):
            if n2 == 1 and w2 == 2:
                key = bytes(v2).decode("utf-8")
            elif n2 == 2 and w2 == 2:
                value = v2
        out[key] = parse_value(value if value is not None else b"")
    return out


def _features(buf: bytes) -> dict[str, FeatureValue]:
    return _map_entries(buf, _feature)


def parse_example(data: bytes) -> dict[str, FeatureValue]:
    """Features of a serialized ``tf.train.Example``: ``{name: values}``.

    Raises:
        WireError: ``data`` is not a valid Example (message says what is wrong).

    Example:
        >>> parse_example(b"")  # an empty Example
        {}
    """
    out: dict[str, FeatureValue] = {}
    for number, wire, value in _fields(memoryview(data)):  # slices of a memoryview are not copies
        if number == 1 and wire == 2:
            out.update(_features(value))
    return out


def parse_sequence_example(data: bytes) -> tuple[dict[str, FeatureValue], dict[str, list[FeatureValue]]]:
    """``(context, feature_lists)`` of a serialized ``tf.train.SequenceExample``.

    ``feature_lists[name]`` is the list of per-step feature values.
    """
    context: dict[str, FeatureValue] = {}
    lists: dict[str, list[FeatureValue]] = {}
    for number, wire, value in _fields(memoryview(data)):
        if wire != 2:
            continue
        if number == 1:
            context.update(_features(value))
        elif number == 2:
            lists.update(_map_entries(value, lambda b: [_feature(f) for n, w, f in _fields(b)
                                                         if n == 1 and w == 2]))
    return context, lists
