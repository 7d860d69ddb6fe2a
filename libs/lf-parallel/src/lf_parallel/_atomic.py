"""Atomic file writes of lf-parallel: readers see the old file or the new one, never half.

The text goes to a uniquely named temporary in the destination's folder (``tempfile.mkstemp``: two writers of one
file never share a temporary), gets the mode a plain ``open`` would give it (``0o666`` less the process umask,
not ``mkstemp``'s private ``0o600``), is fsynced and ``os.replace``-d onto the destination; on an error the
temporary is removed. (lf-orchestrator has the same rule in its ``_atomic`` module; libraries do not import it.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc/self/status``)."""
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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) atomically; returns the path.

    Raises:
        OSError: the folder is missing or not writable (no temporary is left).
    """
    dest = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(name, dest)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return dest
