"""Typed errors and the ``on_error`` policy shared by the dataset readers.

A reader that finds bad input (truncated or corrupt file, Git LFS pointer in
place of data, NaN/inf values, missing instruction, frame-count mismatch)
builds a :class:`DataError` naming the file, the episode and the field. With
``on_error="raise"`` it is raised; with ``"skip"`` the episode (or the rest of
the file) is skipped, counted under a reason in ``skipped`` and logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["DataError", "ErrorPolicy", "LFS_POINTER_PREFIX", "is_lfs_pointer"]

log = logging.getLogger("lf_data")

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
"""First bytes of a Git LFS pointer file (the data itself was never fetched)."""


class DataError(ValueError):
    """Bad input data, located by file, episode, field, record and byte offset.

    Attributes (``None`` when not applicable): ``file`` (str), ``episode``
    (episode index or name), ``field`` (feature name), ``record`` (record index
    in the file), ``offset`` (byte offset of the record in the file),
    ``reason`` (short key such as ``"crc"``, ``"truncated"``, ``"lfs_pointer"``,
    ``"non_finite"``, ``"missing_instruction"``, ``"forbidden_class"``).

    Example:
        >>> e = DataError("x.tfrecord: bad CRC", file="x.tfrecord", record=3, reason="crc")
        >>> isinstance(e, ValueError), e.record
        (True, 3)
    """

    def __init__(self, message: str, *, file: str | Path | None = None, episode: object = None,
                 field: str | None = None, record: int | None = None, offset: int | None = None,
                 reason: str = "invalid") -> None:
        super().__init__(message)
        self.file = None if file is None else str(file)
        self.episode = episode
        self.field = field
        self.record = record
        self.offset = offset
        self.reason = reason


def is_lfs_pointer(path: str | Path) -> bool:
    """True when the file starts with the Git LFS pointer header."""
    with open(path, "rb") as f:
        return f.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX


class ErrorPolicy:
    """Raise or count-and-skip, per ``on_error`` (``"raise"`` or ``"skip"``)."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.skipped: dict[str, int] = {}
        self.problems: list[str] = []
        self.errors: list[DataError] = []
        """The skipped errors themselves, in order (``problems`` holds their messages)."""

    def handle(self, err: DataError) -> None:
        """Raise ``err`` (policy "raise") or count it under ``err.reason`` and log it."""
        if self.on_error == "raise":
            raise err
        self.skipped[err.reason] = self.skipped.get(err.reason, 0) + 1
        self.problems.append(str(err))
        self.errors.append(err)
        log.warning("skipped: %s", err)
