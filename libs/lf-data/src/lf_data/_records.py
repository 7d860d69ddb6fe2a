"""Streamed records of jsonl, parquet and plain-text files, located by file and line/row, sharded by rank.

Shared by :class:`lf_data._text_readers.TextStream` and
:class:`lf_data._image_text.ImageTextStream`. Memory holds one line (jsonl), one
record batch of the needed columns (parquet, read row group by row group) or one
paragraph / file (plain text), never a whole dataset.

Locations: jsonl and plain text count **lines from 1** (as editors do), parquet
counts **rows from 0** inside the file; messages say which ("line 7", "row 6").

Sharding (``shard="record"``): every record (a non-blank jsonl line, a parquet
row, a paragraph or a text file) gets a global index in file order, and rank
``r`` keeps the records with ``index % world_size == r``. Indices count records
before they are parsed or checked, so they do not depend on bad input, and each
bad record is reported by the one rank that owns it. ``shard="file"`` gives rank
``r`` the files ``r::world_size`` (no rank reads another's files).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ._errors import DataError

__all__ = ["FORMATS", "Record", "Shard", "detect_format", "iter_jsonl", "iter_parquet", "list_files"]

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".txt": "text", ".md": "text"}
"""File suffix (before an optional ``.gz``) -> format."""

Record = tuple[int, "dict | DataError"]
"""(line from 1 or row from 0, the record's fields or the error that makes it unusable)."""


def detect_format(path: Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"text"`` from the suffix (``.gz`` allowed except for parquet).

    Raises:
        ValueError: unknown suffix (names the file and the known suffixes).
    """
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] == ".gz" and len(suffixes) == 2 and suffixes[0] != ".parquet":
        suffixes = suffixes[:1]
    fmt = FORMATS.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise ValueError(f"{path}: unknown file format (suffixes {sorted(FORMATS)}, optionally + .gz); pass format=")
    return fmt


def list_files(files: str | Path | Sequence[str | Path], owner: str) -> list[Path]:
    """The files to read, in order: given files as is, folders expanded to their known-format files (sorted, recursive).

    Raises:
        ValueError: no files, or a folder without any file of a known format.
    """
    items = [files] if isinstance(files, (str, Path)) else list(files)
    out: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file() and _known(p))
            if not found:
                raise ValueError(f"{owner}: folder {item} holds no {sorted(FORMATS)} file")
            out += found
        else:
            out.append(item)
    if not out:
        raise ValueError(f"{owner}: no files given")
    return out


def _known(path: Path) -> bool:
    try:
        detect_format(path)
    except ValueError:
        return False
    return True


class Shard:
    """Which records a reader keeps: rank ``rank`` of ``world_size``, then DataLoader worker ``worker`` of ``workers``.

    ``mode="record"``: keep global record ``i`` iff ``i % world_size == rank`` and ``i // world_size % workers ==
    worker``, i.e. ``i % (world_size * workers) == rank + world_size * worker`` (workers split the rank's share).
    ``mode="file"``: the same rule on file positions; every record of a kept file.
    """

    def __init__(self, mode: str, rank: int, world_size: int, owner: str, worker: int = 0, workers: int = 1) -> None:
        if mode not in ("record", "file"):
            raise ValueError(f"{owner}: shard must be 'record' or 'file', got {mode!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"{owner}: need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
        self.mode, self.rank, self.world_size = mode, int(rank), int(world_size)
        self.worker, self.workers = int(worker), int(workers)
        self.next_index = 0

    @property
    def _slot(self) -> tuple[int, int]:
        return self.rank + self.world_size * self.worker, self.world_size * self.workers

    def keeps_file(self, k: int) -> bool:
        """True when file ``k`` (position in the file list) is read by this reader."""
        me, n = self._slot
        return self.mode == "record" or k % n == me

    def take(self) -> bool:
        """Count one record; True when this reader owns it."""
        i, self.next_index = self.next_index, self.next_index + 1
        me, n = self._slot
        return self.mode == "file" or i % n == me


def open_binary(path: Path):
    """A binary file object, gunzipped when the name ends in ``.gz``."""
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def decode_line(raw: bytes, path: Path, line: int, field: str | None) -> str | DataError:
    """UTF-8 text of one line (a leading BOM on line 1 dropped), or the error naming the line and byte."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return DataError(f"{path}: line {line}: invalid UTF-8 at byte {e.start} of the line ({e.reason})",
                         file=path, record=line, field=field, reason="invalid_utf8")
    return text[1:] if line == 1 and text.startswith("\ufeff") else text


def iter_jsonl(path: Path, shard: Shard) -> Iterator[Record]:
    """(line, object or DataError) of this shard's non-blank lines; blank lines are not records.

    Errors: invalid UTF-8 (``invalid_utf8``), invalid JSON (``invalid_json``), a value that is not an
    object (``wrong_type``); a truncated gzip stream raises (``truncated``), ending the file.
    """
    line = 0
    try:
        with open_binary(path) as f:
            for line, raw in enumerate(f, start=1):
                if not raw.strip() or not shard.take():
                    continue
                text = decode_line(raw, path, line, None)
                if isinstance(text, DataError):
                    yield line, text
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    yield line, DataError(f"{path}: line {line}: invalid JSON at column {e.colno}: {e.msg}",
                                          file=path, record=line, reason="invalid_json")
                    continue
                if not isinstance(obj, dict):
                    yield line, DataError(f"{path}: line {line}: expected a JSON object, got {type(obj).__name__}",
                                          file=path, record=line, reason="wrong_type")
                    continue
                yield line, obj
    except (EOFError, gzip.BadGzipFile, OSError) as e:
        raise DataError(f"{path}: cannot read past line {line}: {e}", file=path, record=line,
                        reason="truncated") from e


def iter_parquet(path: Path, columns: Sequence[str], shard: Shard, batch_rows: int = 1024) -> Iterator[Record]:
    """(row, {column: value}) of this shard's rows, read row group by row group in batches of ``batch_rows``.

    Raises:
        DataError: unreadable file (``invalid``) or a missing column (``missing_field``): the whole file.
    """
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read parquet: {e}", file=path) from e
    names = pf.schema_arrow.names
    for col in columns:
        if col not in names:
            raise DataError(f"{path}: column {col!r} missing (columns: {names})", file=path, field=col,
                            reason="missing_field")
    row = 0
    try:
        for g in range(pf.num_row_groups):
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=list(columns)):
                mine = [i for i in range(batch.num_rows) if shard.take()]
                for at in range(0, len(mine), 64):  # Python objects of at most 64 rows at a time
                    part = mine[at:at + 64]
                    rows = batch.take(pa.array(part, pa.int64())).to_pylist()
                    yield from ((row + i, rec) for i, rec in zip(part, rows, strict=True))
                row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read parquet from row {row}: {e}", file=path, record=row) from e
