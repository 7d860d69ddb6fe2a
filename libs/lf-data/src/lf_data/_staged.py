"""Dataset folders written whole or not at all: a temporary sibling folder renamed into place at the end.

A writer that fails half-way (a corrupt input episode, a full disk, Ctrl-C) must
not leave a partial dataset behind: readers would find data files without
``meta/``, and the next attempt would refuse the non-empty folder.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["destination_of", "staged_output"]

F = TypeVar("F", bound=Callable[..., Path])


_TMP = ".tmp-"
"""Marker in a temporary folder's name: ``.<name>.tmp-<pid>-<hex>``."""


def destination_of(folder: Path) -> Path:
    """The ``out_dir`` a folder made by :func:`staged_output` will be renamed to (``folder`` itself otherwise),
    for messages that must name the folder the user asked for, not the temporary one."""
    name = folder.name
    if name.startswith(".") and _TMP in name:
        return folder.parent / name[1:name.rindex(_TMP)]
    return folder


def staged_output(fn: F) -> F:
    """Decorate ``fn(out_dir, ...)`` so that it writes into a temporary sibling of ``out_dir``, renamed at the end.

    The wrapper refuses an ``out_dir`` that exists and is not an empty folder
    (``FileExistsError`` naming the folder), creates ``<parent>/.<name>.tmp-<pid>-<hex>``,
    calls ``fn`` with that folder, then replaces the (absent or empty) ``out_dir``
    with it (``os.replace``, atomic on one file system) and returns ``Path(out_dir)``.
    If ``fn`` raises, the temporary folder is removed and the error propagates.
    """

    @functools.wraps(fn)
    def wrapper(out_dir: str | Path, *args: Any, **kwargs: Any) -> Path:
        out = Path(out_dir)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise FileExistsError(f"{out}: out_dir exists and is not empty (write into a new or empty folder)")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}{_TMP}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            fn(tmp, *args, **kwargs)
            if out.exists():
                out.rmdir()  # empty (checked above); fails if something was written there meanwhile
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    return wrapper  # type: ignore[return-value]
