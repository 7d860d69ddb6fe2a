"""Typed errors of lf-tokenize-action."""

from __future__ import annotations


class ActionDecodeError(ValueError):
    """A token sequence does not decode to an action chunk of the expected shape.

    Raised by ``FastTokenizer.decode`` (with ``on_error="raise"``) instead of
    returning zeros. Subclass of ``ValueError``.

    Attributes:
        row: index of the failing sequence in the batch.
        got: number of DCT coefficients the sequence decoded to (``-1`` when an
            id was invalid and nothing could be decoded).
        expected: ``horizon * action_dim``.
        reason: one line saying what went wrong.
    """

    def __init__(self, row: int, got: int, expected: int, reason: str) -> None:
        self.row, self.got, self.expected, self.reason = row, got, expected, reason
        super().__init__(f"token sequence {row}: {reason} (decoded {got} coefficients, expected {expected})")
