"""Versioned JSON files written atomically (temp file in the same folder, fsync, os.replace)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def check_header(d: Mapping[str, Any], *, fmt: str, version: int | tuple[int, ...], where: str) -> int:
    """Raise ValueError unless ``d["format"] == fmt`` and ``d["version"]`` is ``version`` (or one of them).

    ``where`` says where ``d`` came from (a file name or "dict") and starts the
    message. Returns the version read.
    """
    if not isinstance(d, Mapping):
        raise TypeError(f"{where}: expected a JSON object (mapping); got {type(d).__name__}")
    got = d.get("format", "<missing>")
    if got != fmt:
        raise ValueError(f"{where}: field 'format' must be {fmt!r}; got {got!r}")
    versions = version if isinstance(version, tuple) else (version,)
    got = d.get("version", "<missing>")
    if isinstance(got, bool) or not isinstance(got, int) or got not in versions:
        expected = " or ".join(repr(v) for v in versions)
        raise ValueError(f"{where}: field 'version' must be {expected}; got {got!r}")
    return got


def write_json_atomic(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as JSON to ``path`` so that readers see the old file or the new one, never half.

    The text goes to a temporary file in the destination folder, is flushed and
    fsynced, then ``os.replace``-d onto ``path``; the temporary file is removed
    if anything fails. The file gets the mode a plain ``open`` would give it
    (``0o666`` less the process umask), not ``mkstemp``'s private ``0o600``.
    Returns the destination path.
    """
    dest = Path(path)
    text = json.dumps(payload, indent=2, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(dest.parent)
    return dest


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc/self/status``).

    Elsewhere it is read by setting and restoring it (``os.umask``), which is not atomic across threads.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; ValueError naming the file when it is not valid JSON."""
    p = Path(path)
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{p}: not valid JSON: {err}") from err


def _fsync_dir(folder: Path) -> None:
    """Best-effort fsync of a folder so the rename itself is durable (not possible on every OS)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
