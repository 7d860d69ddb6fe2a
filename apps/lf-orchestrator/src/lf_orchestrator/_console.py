"""Rich consoles for the CLI that do not wrap redirected output at 80 columns.

Rich sizes a console from the terminal; when the stream is a file or a pipe it falls back to 80
columns and wraps long lines (paths, errors, tables) mid-word in logs. Redirected consoles here
get :data:`REDIRECTED_WIDTH` columns instead (``COLUMNS`` still wins when set).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["REDIRECTED_WIDTH", "make_console"]

REDIRECTED_WIDTH = 200
"""Columns of a console whose stream is not a terminal."""


def make_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or stderr) that is ``REDIRECTED_WIDTH`` wide when the stream is not a TTY.

    Args:
        stderr: write to standard error instead of standard output.
        width: a fixed width (columns) that wins over both the terminal and the redirect rule.
    """
    stream = sys.stderr if stderr else sys.stdout
    if width is None and "COLUMNS" not in os.environ and not stream.isatty():
        width = REDIRECTED_WIDTH
    return Console(stderr=stderr, width=width)
