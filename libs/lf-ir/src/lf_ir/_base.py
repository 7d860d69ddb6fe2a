"""The base of every IR node: the tagged msgspec struct, its error type and helpers.

Kept apart from ``_nodes.py`` so node families in other modules (``_nodes_lm.py``)
share it without import cycles.
"""

from __future__ import annotations

from typing import Literal

import msgspec

TPStyle = Literal["column", "row", "replicate"]


class IRError(ValueError):
    """A malformed IR node, component or graph; the message names the node."""


class _Node(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    name: str
    """Unique name of the node inside its component (dotted paths are allowed)."""

    def _fail(self, message: str) -> None:
        raise IRError(f"node {self.name!r} ({type(self).__name__}): {message}")

    def _positive(self, **fields: int) -> None:
        for key, value in fields.items():
            if not isinstance(value, int) or value <= 0:
                self._fail(f"{key} must be a positive integer, got {value!r}")
