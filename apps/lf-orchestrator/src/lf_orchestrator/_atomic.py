"""Atomic writes for everything lf-orchestrator writes: readers see the old file (or folder) or the new one, never half.

Every temporary gets a unique name in the destination's folder (``tempfile.mkstemp`` / ``mkdtemp``: two writers of
one path, two threads or two processes, never share a temporary) and, before the rename, the mode a plain ``open``
/ ``mkdir`` would have given it (``0o666`` / ``0o777`` less the process umask) instead of ``mkstemp``'s private
``0o600`` / ``0o700``. The temporary is fsynced, ``os.replace``-d onto the destination, and the folder fsynced
(best effort); on an error it is removed.

Temporaries are named ``.NAME.<random>.tmp.EXT`` (files, ``EXT`` the destination's extension) and
``.NAME.<random>.tmp`` (folders), hidden and beside ``NAME``; a hard kill can leave one behind.

- :func:`write_text_atomic` / :func:`write_bytes_atomic`: a string or bytes.
- :func:`atomic_path`: a temporary file path for writers that take a file name (matplotlib ``savefig``,
  safetensors ``save_file``, ``gzip.open``).
- :func:`atomic_dir`: a temporary folder filled by the caller and renamed onto a folder that must not exist yet
  (a cache entry); when another writer got there first its folder is kept and this one dropped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_dir", "atomic_path", "current_umask", "write_bytes_atomic", "write_text_atomic"]


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


def _fsync(path: Path, *, best_effort: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not best_effort:  # folders cannot be fsynced on every OS / file system
            raise
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A unique temporary file beside ``path``, renamed onto ``path`` when the block ends without an error.

    The caller writes the temporary (by name); it keeps ``path``'s extension last (``.loss_curve.<random>.tmp.png``)
    so that writers that infer the format from the name (``savefig``) still do.

    Args:
        path: the destination file; its folder must exist.

    Yields:
        The temporary file's path (it exists, empty, with mode ``0o666`` less the umask).

    Raises:
        OSError: the temporary cannot be made, written or renamed (the temporary is removed).
    """
    dest = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=f".tmp{dest.suffix}", dir=dest.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        os.close(fd)
        yield tmp
        _fsync(tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(dest.parent, best_effort=True)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically (see the module docstring)."""
    write_bytes_atomic(path, text.encode("utf-8"))


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A unique temporary folder beside ``path``, renamed to ``path`` when the block ends without an error.

    Args:
        path: the destination folder; made complete or not at all. Its parent is made if missing.

    Yields:
        The temporary folder (empty, mode ``0o777`` less the umask); the caller fills it.

    Raises:
        OSError: the temporary cannot be made (a rename refused because another writer made ``path`` first is no
            error: that folder is kept and the temporary removed).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                _fsync(f)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first: keep its copy
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _fsync(dest.parent, best_effort=True)
