"""Stream image-text conversations (VLM SFT) from jsonl / parquet: images decoded, chat rendered to tokens.

A record holds an image field (one image or a list) and a conversation; see :class:`ImageTextStream`.
Legend: ``H``/``W`` image height/width, ``n`` tokens of the rendered conversation.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer

from ._chat_template import ChatTemplate, parse_conversation, qwen2_vl_image_tokens
from ._errors import DataError, ErrorPolicy, is_lfs_pointer
from ._records import Shard, detect_format, iter_jsonl, iter_parquet, list_files
from ._text_readers import load_tokenizer

__all__ = ["ImageTextStream", "decode_image"]

IGNORE_INDEX = -100


def decode_image(value: object, base_dir: Path, where: str) -> np.ndarray:
    """uint8 ``(H, W, 3)`` RGB of one image value, decoded with Pillow (alpha dropped, palettes expanded).

    ``value``: a path string (relative to ``base_dir``, the record file's folder, or absolute), a
    ``data:...;base64,`` URI, encoded bytes, or a dict with ``"bytes"`` (bytes or base64 text) and/or
    ``"path"`` (the layout of HF ``datasets.Image`` in parquet).

    Raises:
        DataError: ``missing_file``, ``lfs_pointer``, ``invalid_image`` (undecodable bytes or base64),
            ``wrong_type`` (another kind of value); the message starts with ``where``.
    """
    if isinstance(value, dict):
        if isinstance(value.get("bytes"), str):  # jsonl: base64 text
            value = {"b64": value["bytes"]}
        elif value.get("bytes") is not None:
            value = value["bytes"]
        elif value.get("path") is not None:
            value = value["path"]
        else:
            raise DataError(f"{where}: image object has neither 'bytes' nor 'path' (keys: {sorted(value)})",
                            reason="missing_field")
    if isinstance(value, str) and value.startswith("data:"):
        value = {"b64": value.partition("base64,")[2]}
    if isinstance(value, dict) and "b64" in value:
        try:
            value = base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError) as e:
            raise DataError(f"{where}: invalid base64 image data: {e}", reason="invalid_image") from e
    if isinstance(value, str):
        path = Path(value) if Path(value).is_absolute() else base_dir / value
        if not path.is_file():
            raise DataError(f"{where}: image file {path} not found", file=path, reason="missing_file")
        if is_lfs_pointer(path):
            raise DataError(f"{where}: image {path} is a Git LFS pointer (run `git lfs pull`)", file=path,
                            reason="lfs_pointer")
        source, name = path, str(path)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        source, name = io.BytesIO(bytes(value)), f"{len(value)} encoded bytes"
    else:
        raise DataError(f"{where}: image must be a path, bytes or {{'bytes', 'path'}}, got {type(value).__name__}",
                        reason="wrong_type")
    try:
        with Image.open(source) as im:
            im.load()
            rgb = np.array(im.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise DataError(f"{where}: cannot decode image ({name}): {e}", reason="invalid_image") from e
    return rgb


class ImageTextStream(torch.utils.data.IterableDataset):
    """Image-text SFT samples from jsonl / parquet records, rendered with a ChatML (Qwen2-VL) template.

    A record: ``image_field`` with one image or a list of images (see :func:`decode_image`; ``[]`` for a
    text-only conversation) and ``conversation_field`` with the messages (see
    :func:`lf_data._chat_template.parse_conversation`: ``{"role", "content"}`` or ``{"from", "value"}``,
    images at ``<image>`` markers or ``{"type": "image"}`` parts, else at the start of the first user turn).
    Files, formats, folders, sharding and DataLoader workers as in :class:`lf_data._text_readers.TextStream`.

    Each sample: ``modality`` ``"image_text"``; ``input_ids`` int64 ``(n,)``; ``loss_mask`` bool ``(n,)``,
    True exactly on assistant content and its ``<|im_end|>``; ``labels`` int64 ``(n,)`` = ``input_ids``
    there, -100 elsewhere (unshifted, the HF convention); ``images``: list of uint8 ``(H, W, 3)`` tensors;
    ``image_tokens``: placeholder count per image; ``file``; ``row`` (jsonl: line from 1, parquet: row from 0).
    :func:`lf_data._packing.pack_sequences` takes these samples (it reads ``input_ids`` and ``loss_mask``).

    Bad input is a :class:`~lf_data._errors.DataError` naming file, line/row and field, raised or skipped
    and counted per ``on_error``: ``invalid_json``, ``invalid_utf8``, ``missing_field`` (absent/null image or
    conversation field, parquet column), ``wrong_type``, ``invalid_conversation`` (not a list, bad message,
    unknown role, no assistant text, image places != images), ``missing_file`` (record file or image),
    ``lfs_pointer``, ``invalid_image`` (corrupt image or base64), ``too_long`` (over ``max_tokens``).

    Args:
        files: a file, a folder, or a list of them.
        tokenizer: ``tokenizers.Tokenizer`` or a ``tokenizer.json`` path holding the template's special tokens.
        template: the chat template strings (default Qwen2-VL's).
        image_field / conversation_field: record keys / parquet columns.
        image_tokens: placeholder tokens per image, an int or ``f(height, width) -> int`` (default Qwen2-VL's
            dynamic resolution, :func:`~lf_data._chat_template.qwen2_vl_image_tokens`).
        max_tokens: longer samples are a ``too_long`` error (cutting would break an image or a turn).
        format / rank / world_size / shard / on_error: as in ``TextStream``.

    Raises:
        ValueError: bad arguments; the tokenizer lacks a template token.

    Example:
        >>> ds = ImageTextStream("sft.jsonl", "qwen2_vl/tokenizer.json", on_error="skip")  # doctest: +SKIP
        >>> s = next(iter(ds)); s["images"][0].shape, s["input_ids"].shape  # doctest: +SKIP
        (torch.Size([480, 640, 3]), torch.Size([345]))
    """

    def __init__(self, files: str | Path | Sequence[str | Path], tokenizer: Tokenizer | str | Path, *,
                 template: ChatTemplate | None = None, image_field: str = "image",
                 conversation_field: str = "conversations",
                 image_tokens: int | Callable[[int, int], int] = qwen2_vl_image_tokens,
                 max_tokens: int | None = None, format: str | None = None, rank: int = 0, world_size: int = 1,
                 shard: str = "record", on_error: str = "raise") -> None:
        super().__init__()
        owner = type(self).__name__
        self.files = list_files(files, owner)
        self.formats = [format or detect_format(p) for p in self.files]
        bad = [f for f in self.formats if f not in ("jsonl", "parquet")]
        if bad:
            raise ValueError(f"{owner}: format must be 'jsonl' or 'parquet', got {bad[0]!r}")
        self.tokenizer = load_tokenizer(tokenizer, owner)
        self.template = template or ChatTemplate()
        self.template.special_ids(self.tokenizer)  # every template token must exist
        if isinstance(image_tokens, int) and image_tokens < 1:
            raise ValueError(f"{owner}: image_tokens must be >= 1, got {image_tokens}")
        if max_tokens is not None and int(max_tokens) < 1:
            raise ValueError(f"{owner}: max_tokens must be >= 1, got {max_tokens}")
        Shard(shard, rank, world_size, owner)
        self.image_field, self.conversation_field = image_field, conversation_field
        self.image_tokens, self.max_tokens = image_tokens, max_tokens
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

    def _sample(self, path: Path, fmt: str, row: int, rec: dict) -> dict:
        where = f"{path}: {'row' if fmt == 'parquet' else 'line'} {row}"
        for field in (self.image_field, self.conversation_field):
            if rec.get(field) is None:
                what = "is null" if field in rec else f"missing (keys: {sorted(rec)})"
                raise DataError(f"{where}: field {field!r} {what}", file=path, record=row, field=field,
                                reason="missing_field")
        raw = rec[self.image_field]
        raw = raw if isinstance(raw, list) else [raw]
        images = []
        for k, value in enumerate(raw):
            field = f"{self.image_field}[{k}]" if isinstance(rec[self.image_field], list) else self.image_field
            try:
                images.append(decode_image(value, path.parent, f"{where}: field {field!r}"))
            except DataError as e:
                raise DataError(str(e), file=path, record=row, field=field, reason=e.reason) from e
        try:
            messages = parse_conversation(rec[self.conversation_field], self.template, len(images))
        except ValueError as e:
            raise DataError(f"{where}: field {self.conversation_field!r} {e}", file=path, record=row,
                            field=self.conversation_field, reason="invalid_conversation") from e
        counts = [self._count(im, where) for im in images]
        ids, mask = self.template.render(self.tokenizer, messages, counts)
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            raise DataError(f"{where}: {len(ids)} tokens > max_tokens={self.max_tokens}", file=path, record=row,
                            field=self.conversation_field, reason="too_long")
        ids_t = torch.from_numpy(np.asarray(ids, np.int64))
        mask_t = torch.from_numpy(np.asarray(mask, bool))
        return {"modality": "image_text", "input_ids": ids_t, "loss_mask": mask_t,
                "labels": torch.where(mask_t, ids_t, IGNORE_INDEX), "images": [torch.from_numpy(im) for im in images],
                "image_tokens": counts, "file": str(path), "row": row}

    def _count(self, image: np.ndarray, where: str) -> int:
        if isinstance(self.image_tokens, int):
            return self.image_tokens
        n = int(self.image_tokens(image.shape[0], image.shape[1]))
        if n < 1:
            raise ValueError(f"{type(self).__name__}: image_tokens({image.shape[0]}, {image.shape[1]}) gave {n} "
                             f"({where})")
        return n

    def _records(self, shard: Shard) -> Iterator[tuple[Path, str, int, dict | DataError]]:
        columns = [self.image_field, self.conversation_field]
        for k, (path, fmt) in enumerate(zip(self.files, self.formats, strict=True)):
            if not shard.keeps_file(k):
                continue
            if not path.is_file():
                self._policy.handle(DataError(f"{path}: file missing", file=path, reason="missing_file"))
                continue
            try:
                records = iter_jsonl(path, shard) if fmt == "jsonl" else iter_parquet(path, columns, shard, 64)
                for row, rec in records:
                    yield path, fmt, row, rec
            except DataError as err:  # the rest of the file
                self._policy.handle(err)

    def __iter__(self) -> Iterator[dict]:
        info = torch.utils.data.get_worker_info()
        shard = Shard(self.shard, self.rank, self.world_size, type(self).__name__,
                      *((info.id, info.num_workers) if info is not None else ()))
        for path, fmt, row, rec in self._records(shard):
            try:
                if isinstance(rec, DataError):
                    raise rec
                sample = self._sample(path, fmt, row, rec)
            except DataError as err:
                self._policy.handle(err)
                continue
            yield sample
