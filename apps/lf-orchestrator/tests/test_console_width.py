"""Redirected CLI output is not wrapped at rich's 80-column fallback."""

from __future__ import annotations

import io
import sys

from lf_orchestrator._console import REDIRECTED_WIDTH, make_console


def test_redirected_console_keeps_long_lines(monkeypatch):
    """Oracle: a 150-character line printed to a non-TTY stream comes out as one line."""
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    console = make_console()
    assert console.width == REDIRECTED_WIDTH
    line = "error: " + "x" * 143
    console.print(line, highlight=False)
    assert buf.getvalue() == line + "\n"


def test_columns_and_explicit_width_win(monkeypatch):
    """Oracle: COLUMNS and an explicit width are honoured as given."""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("COLUMNS", "90")
    assert make_console(stderr=True).width == 90
    assert make_console(stderr=True, width=120).width == 120
