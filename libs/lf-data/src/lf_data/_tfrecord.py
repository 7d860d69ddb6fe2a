"""TFRecord files in pure Python, with both CRC checks (no TensorFlow).

Record framing (TensorFlow ``core/lib/io/record_writer.cc``), little endian::

    uint64 length
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

``masked_crc(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32), with
CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78). CRC-32C comes
from the ``crc32c`` package when it is installed (hardware accelerated,
``pip install 'lf-data[rlds]'``), else from a table-driven pure Python loop
(about 5 MB/s: fine for tests and small shards, slow for real datasets).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from ._errors import LFS_POINTER_PREFIX, DataError

__all__ = ["crc32c", "masked_crc32c", "iter_tfrecord", "read_tfrecord", "read_record_at", "HAVE_FAST_CRC"]

_POLY = 0x82F63B78
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)
del _n, _c


def _crc32c_py(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:  # the C/SSE4.2 implementation, when installed
    from crc32c import crc32c as _crc32c_fast  # type: ignore[import-not-found]

    HAVE_FAST_CRC = True
except ImportError:  # pragma: no cover - depends on the environment
    _crc32c_fast = None
    HAVE_FAST_CRC = False


def crc32c(data: bytes, *, pure_python: bool = False) -> int:
    """CRC-32C (Castagnoli) of ``data`` as an unsigned 32-bit int.

    Example:
        >>> hex(crc32c(b"123456789"))  # the standard check value
        '0xe3069283'
    """
    if _crc32c_fast is not None and not pure_python:
        return _crc32c_fast(data)
    return _crc32c_py(data)


def masked_crc32c(data: bytes, *, pure_python: bool = False) -> int:
    """TFRecord's masked CRC-32C: ``((c >> 15) | (c << 17)) + 0xa282ead8`` mod 2**32."""
    c = crc32c(data, pure_python=pure_python)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _check_lfs(path: Path, head: bytes) -> None:
    if head.startswith(LFS_POINTER_PREFIX):
        raise DataError(f"{path}: is a Git LFS pointer file, not TFRecord data (run 'git lfs pull' "
                        "or download the real shard)", file=path, record=0, offset=0, reason="lfs_pointer")


def _read_one(f, path: Path, index: int, offset: int, verify: bool, check_lfs: bool) -> bytes | DataError | None:
    """One record at the file's position; None at a clean end of file."""
    header = f.read(12)
    if not header:
        return None
    if check_lfs:
        _check_lfs(path, header + f.read(len(LFS_POINTER_PREFIX) - 12))
        f.seek(offset + 12)
    where = f"{path}: record {index} at byte {offset}"
    if len(header) < 12:
        raise DataError(f"{where}: truncated header ({len(header)} of 12 bytes)", file=path, record=index,
                        offset=offset, field="length", reason="truncated")
    length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
    if verify and masked_crc32c(length_bytes) != length_crc:
        raise DataError(f"{where}: length CRC mismatch (stored {length_crc:#010x}, computed "
                        f"{masked_crc32c(length_bytes):#010x}); the file is corrupt", file=path, record=index,
                        offset=offset, field="length", reason="crc")
    (length,) = struct.unpack("<Q", length_bytes)
    data = f.read(length)
    footer = f.read(4)
    if len(data) < length or len(footer) < 4:
        raise DataError(f"{where}: truncated data ({len(data)} of {length} bytes, footer {len(footer)} of 4); "
                        "the file was cut short", file=path, record=index, offset=offset, field="data",
                        reason="truncated")
    if verify:
        stored, computed = struct.unpack("<I", footer)[0], masked_crc32c(data)
        if stored != computed:
            return DataError(f"{where}: data CRC mismatch (stored {stored:#010x}, computed {computed:#010x})",
                             file=path, record=index, offset=offset, field="data", reason="crc")
    return data


def iter_tfrecord(path: str | Path, *, verify: bool = True) -> Iterator[tuple[int, int, bytes | DataError]]:
    """Yield ``(record_index, byte_offset, data)`` for each record of a TFRecord file.

    A record whose *data* CRC does not match is yielded as a :class:`DataError`
    in place of its bytes, and reading goes on (the framing is intact). A
    truncated file, a length CRC mismatch or a Git LFS pointer file raise
    :class:`DataError` (nothing after them can be located).

    Args:
        path: an uncompressed TFRecord file (TFDS shards are uncompressed).
        verify: check both CRCs (default); False only trusts the lengths.

    Raises:
        DataError: with ``file``, ``record``, ``offset`` and ``reason`` in
            ``{"truncated", "crc", "lfs_pointer"}``.
        FileNotFoundError: ``path`` does not exist.

    Example:
        >>> for i, off, data in iter_tfrecord("shard.tfrecord"):  # doctest: +SKIP
        ...     print(i, off, len(data))
    """
    path = Path(path)
    with open(path, "rb") as f:
        index, offset = 0, 0
        while True:
            item = _read_one(f, path, index, offset, verify, index == 0)
            if item is None:
                return
            yield index, offset, item
            offset = f.tell()
            index += 1


def read_tfrecord(path: str | Path, *, verify: bool = True) -> list[bytes]:
    """All records of a TFRecord file; raises :class:`DataError` on any bad record."""
    out = []
    for _, _, item in iter_tfrecord(path, verify=verify):
        if isinstance(item, DataError):
            raise item
        out.append(item)
    return out


def read_record_at(path: str | Path, offset: int, *, index: int = -1, verify: bool = True) -> bytes:
    """The record starting at byte ``offset`` (as given by :func:`iter_tfrecord`)."""
    path = Path(path)
    with open(path, "rb") as f:
        f.seek(offset)
        item = _read_one(f, path, index, offset, verify, False)
    if item is None:
        raise DataError(f"{path}: no record at byte {offset} (end of file)", file=path, record=index,
                        offset=offset, reason="truncated")
    if isinstance(item, DataError):
        raise item
    return item
