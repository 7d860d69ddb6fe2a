"""Rich consoles for the CLI that do not wrap redirected output at 80 columns.

Rich sizes a console from the terminal; when the stream is a file or a pipe it falls back to 80
columns and wraps long lines (paths, errors, tables) mid-word in logs. Redirected consoles here
get :data:`REDIRECTED_WIDTH` columns instead (``COLUMNS`` still wins when set).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["REDIRECTED_WIDTH", "fail", "make_console"]

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


def fail(console: Console, message: str, code: int = 2):
    """Print ``error: MESSAGE`` on ``console`` and exit the command with ``code`` (typer.Exit; 2: refused input).

    The message is printed as text, not rich markup: messages quote user values and expected forms such as
    ``[first, last]`` or a config section ``[corpus]``, which rich would otherwise read as tags and drop.
    """
    import typer
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
