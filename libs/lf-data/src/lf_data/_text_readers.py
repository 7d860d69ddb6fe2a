"""Stream tokenized text documents from jsonl, parquet and plain-text files (HF ``tokenizers``).

Each sample is ``{"modality": "text", "input_ids", "labels", "loss_mask", "file", "row", "piece"}``,
ready for :func:`lf_data._packing.pack_sequences` / ``iter_packed`` (which read ``input_ids`` and
``loss_mask``). Memory holds one batch of ``encode_batch`` documents and what
:mod:`lf_data._records` reads at a time (a line, a parquet record batch, a paragraph or a text file).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from ._errors import DataError, ErrorPolicy
from ._records import Record, Shard, decode_line, detect_format, iter_jsonl, iter_parquet, list_files, open_binary

__all__ = ["TextStream", "iter_text_file", "load_tokenizer"]


def load_tokenizer(tokenizer: Tokenizer | str | Path, owner: str) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` given as is or loaded from a ``tokenizer.json`` path.

    Raises:
        ValueError: the file is missing or is not a tokenizer (names the path).
    """
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    path = Path(tokenizer)
    if not path.is_file():
        raise ValueError(f"{owner}: tokenizer file {path} not found")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{owner}: {path} is not a tokenizers tokenizer.json: {e}") from e


def iter_text_file(path: Path, mode: str, shard: Shard) -> Iterator[Record]:
    """(line, {"text": str} or DataError) of this shard's documents of a plain-text file.

    ``mode="file"``: the whole file is one document (row 1). ``mode="paragraph"``: a document is a
    maximal run of non-blank lines (whitespace-only lines separate), its row the line it starts on; its
    text is its lines as written, without the last line break. Undecodable UTF-8 is an error naming the
    line and byte (``invalid_utf8``); a truncated ``.gz`` raises (``truncated``), ending the file.
    """
    para: list[bytes] = []
    start = line = 0

    def flush() -> Iterator[Record]:
        if not shard.take():
            return
        parts = []
        for k, raw in enumerate(para):
            text = decode_line(raw, path, start + k, "text")
            if isinstance(text, DataError):
                yield start, text
                return
            parts.append(text)
        doc = "".join(parts)
        yield start, {"text": doc[:-2] if doc.endswith("\r\n") else doc.removesuffix("\n")}

    try:
        with open_binary(path) as f:
            if mode == "file":
                para, start = f.readlines(), 1
                yield from flush()
                return
            for line, raw in enumerate(f, start=1):
                if raw.strip():
                    if not para:
                        start = line
                    para.append(raw)
                elif para:
                    yield from flush()
                    para = []
            if para:
                yield from flush()
    except (EOFError, OSError) as e:
        raise DataError(f"{path}: cannot read past line {line}: {e}", file=path, record=line,
                        reason="truncated") from e


class TextStream(torch.utils.data.IterableDataset):
    """Tokenized text documents streamed from jsonl, parquet and plain-text files, sharded by rank.

    Formats by suffix (optionally ``.gz``, except parquet), or ``format=``: ``.jsonl``/``.ndjson``
    (one JSON object per line, the document in ``text_field``), ``.parquet`` (the string or binary
    column ``text_field``, read row group by row group), ``.txt``/``.md`` (one document per file or
    per blank-line-separated paragraph: ``text_mode``). Folders are expanded to their files (sorted).

    Each sample: ``modality`` ``"text"``; ``input_ids`` int64 ``(n,)``; ``labels`` int64 ``(n,)``
    equal to ``input_ids`` (unshifted, the HF convention: the model shifts); ``loss_mask`` bool
    ``(n,)`` all True; ``file`` (str); ``row`` (jsonl/text: line from 1, parquet: row from 0);
    ``piece`` (0, 1, ... when ``max_tokens`` cuts a document). ``n`` >= 1.

    Bad input is a :class:`~lf_data._errors.DataError` naming file, line/row and field, raised
    (``on_error="raise"``) or skipped and counted in ``skipped`` by reason (``"skip"``):
    ``invalid_json``, ``missing_field`` (absent key, null value, absent parquet column: the file),
    ``wrong_type`` (not a string, line not an object), ``empty_document`` (blank, or no tokens),
    ``invalid_utf8`` (bytes, or lone surrogates from JSON escapes), ``missing_file``, ``truncated``
    (gzip cut short: the rest of the file), ``invalid`` (unreadable parquet: the file).

    Args:
        files: a file, a folder, or a list of them, read in order.
        tokenizer: a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json``.
        text_field: jsonl key / parquet column of the document.
        text_mode: plain text: ``"paragraph"`` or ``"file"``.
        format: ``"jsonl"``, ``"parquet"`` or ``"text"`` for every file, default by suffix.
        add_special_tokens: apply the tokenizer's post-processor (e.g. a BOS token).
        eos_token: a token appended to every document (must be in the vocabulary), default none.
        max_tokens: cut longer documents into consecutive pieces of at most this many tokens.
        rank / world_size / shard: which records this reader keeps (see :mod:`lf_data._records`);
            DataLoader workers split a rank's share further the same way.
        on_error: ``"raise"`` or ``"skip"``.
        batch_docs: documents per ``encode_batch`` call (memory vs. speed).

    Raises:
        ValueError: bad arguments, unknown suffix, tokenizer or ``eos_token`` not found.

    Example:
        >>> ds = TextStream("corpus/", "tokenizer.json", eos_token="<|endoftext|>", world_size=8)  # doctest: +SKIP
        >>> batches = iter_packed(ds, seq_len=4096)  # doctest: +SKIP
    """

    def __init__(self, files: str | Path | Sequence[str | Path], tokenizer: Tokenizer | str | Path, *,
                 text_field: str = "text", text_mode: str = "paragraph", format: str | None = None,
                 add_special_tokens: bool = True, eos_token: str | None = None, max_tokens: int | None = None,
                 rank: int = 0, world_size: int = 1, shard: str = "record", on_error: str = "raise",
                 batch_docs: int = 64) -> None:
        super().__init__()
        owner = type(self).__name__
        self.files = list_files(files, owner)
        self.formats = [format or detect_format(p) for p in self.files]
        bad = [f for f in self.formats if f not in ("jsonl", "parquet", "text")]
        if bad:
            raise ValueError(f"{owner}: format must be 'jsonl', 'parquet' or 'text', got {bad[0]!r}")
        if text_mode not in ("paragraph", "file"):
            raise ValueError(f"{owner}: text_mode must be 'paragraph' or 'file', got {text_mode!r}")
        if max_tokens is not None and int(max_tokens) < 1:
            raise ValueError(f"{owner}: max_tokens must be >= 1, got {max_tokens}")
        if int(batch_docs) < 1:
            raise ValueError(f"{owner}: batch_docs must be >= 1, got {batch_docs}")
        self.tokenizer = load_tokenizer(tokenizer, owner)
        self.eos_id = None if eos_token is None else self.tokenizer.token_to_id(eos_token)
        if eos_token is not None and self.eos_id is None:
            raise ValueError(f"{owner}: eos_token {eos_token!r} is not in the tokenizer's vocabulary")
        Shard(shard, rank, world_size, owner)  # validate now
        self.text_field, self.text_mode, self.add_special_tokens = text_field, text_mode, add_special_tokens
        self.max_tokens, self.batch_docs = max_tokens, int(batch_docs)
        self.rank, self.world_size, self.shard = int(rank), int(world_size), shard
        self._policy = ErrorPolicy(on_error)

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped records (or files) by reason (``on_error="skip"``)."""
        return dict(self._policy.skipped)

    @property
    def problems(self) -> list[str]:
        """Messages of the skipped items, in order."""
        return list(self._policy.problems)

    def _records(self, shard: Shard) -> Iterator[tuple[Path, int, dict | DataError]]:
        for k, (path, fmt) in enumerate(zip(self.files, self.formats, strict=True)):
            if not shard.keeps_file(k):
                continue
            if not path.is_file():
                self._policy.handle(DataError(f"{path}: file missing", file=path, reason="missing_file"))
                continue
            try:
                if fmt == "jsonl":
                    records = iter_jsonl(path, shard)
                elif fmt == "parquet":
                    records = iter_parquet(path, [self.text_field], shard)
                else:
                    records = iter_text_file(path, self.text_mode, shard)
                for row, rec in records:
                    yield path, row, rec
            except DataError as err:
                self._policy.handle(err)

    def _text(self, path: Path, fmt: str, row: int, rec: dict) -> str:
        where = f"{path}: {'row' if fmt == 'parquet' else 'line'} {row}"
        field = "text" if fmt == "text" else self.text_field
        if fmt != "text" and rec.get(field) is None:
            what = "is null" if field in rec else f"missing (keys: {sorted(rec)})"
            raise DataError(f"{where}: field {field!r} {what}", file=path, record=row, field=field,
                            reason="missing_field")
        value = rec[field]
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: field {field!r}: invalid UTF-8 at byte {e.start}", file=path, record=row,
                                field=field, reason="invalid_utf8") from e
        if not isinstance(value, str):
            raise DataError(f"{where}: field {field!r} must be a string, got {type(value).__name__} "
                            f"{str(value)[:40]!r}", file=path, record=row, field=field, reason="wrong_type")
        if not value.strip():
            raise DataError(f"{where}: field {field!r} is an empty document ({value[:20]!r})", file=path,
                            record=row, field=field, reason="empty_document")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(f"{where}: field {field!r}: lone surrogate at character {e.start} (not UTF-8)",
                            file=path, record=row, field=field, reason="invalid_utf8") from e
        return value

    def _encode(self, docs: list[tuple[str, int, str]]) -> Iterator[dict]:
        encs = self.tokenizer.encode_batch([d[2] for d in docs], add_special_tokens=self.add_special_tokens)
        for (file, row, _), enc in zip(docs, encs, strict=True):
            ids = enc.ids if self.eos_id is None else [*enc.ids, self.eos_id]
            if not ids:
                unit = "row" if file.endswith(".parquet") else "line"
                self._policy.handle(DataError(f"{file}: {unit} {row}: document gives no tokens", file=file,
                                              record=row, field=self.text_field, reason="empty_document"))
                continue
            ids = np.asarray(ids, np.int64)
            step = self.max_tokens or len(ids)
            for piece, at in enumerate(range(0, len(ids), step)):
                chunk = torch.from_numpy(ids[at:at + step].copy())
                yield {"modality": "text", "input_ids": chunk, "labels": chunk.clone(),
                       "loss_mask": torch.ones(len(chunk), dtype=torch.bool), "file": file, "row": row,
                       "piece": piece}

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        shard = Shard(self.shard, self.rank, self.world_size, type(self).__name__,
                      *((info.id, info.num_workers) if info is not None else ()))
        fmt_of = dict(zip(self.files, self.formats, strict=True))
        docs: list[tuple[str, int, str]] = []
        for path, row, rec in self._records(shard):
            try:
                if isinstance(rec, DataError):
                    raise rec
                docs.append((str(path), row, self._text(path, fmt_of[path], row, rec)))
            except DataError as err:
                self._policy.handle(err)
                continue
            if len(docs) >= self.batch_docs:
                yield from self._encode(docs)
                docs = []
        if docs:
            yield from self._encode(docs)
