"""The base of every IR node: the tagged msgspec struct, its error type and helpers.

Kept apart from ``_nodes.py`` so node families in other modules (``_nodes_lm.py``)
share it without import cycles.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

TPStyle = Literal["column", "row", "replicate"]

SeqSplit = Literal["local", "context", "none"]
"""How a node tolerates its token dimension being split across ranks.

``"local"``: token-wise (linear, norm, MLP); sequence parallel splits it freely.
``"context"``: tokens interact (attention); splitting needs context-parallel
communication (ring or Ulysses). ``"none"``: the node must see every token of
a sample (e.g. a patch merger across rows, a convolution without halo exchange).
"""


class IRError(ValueError):
    """A malformed IR node, component or graph; the message names the node."""


class _Node(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    """Base of every IR node.

    The planner protocol every node implements (``batch`` samples of ``seq``
    tokens of the node's component; FLOPs count a multiply-add as 2):

    - ``in_dim`` / ``out_dim``: feature widths for shape inference (``in_dim``
      None when the node takes no feature input, e.g. an embedding of ids);
    - ``param_shapes()``: parameter name -> shape, names as in the lowered module;
    - ``tp_dims()``: parameter name -> the dim tensor parallelism splits (None:
      replicated);
    - ``seq_split``: class-level :data:`SeqSplit`;
    - ``forward_flops(batch, seq)`` and ``backward_flops(batch, seq)``;
    - ``forward_bytes(batch, seq, dtype_bytes)``: memory traffic of one forward
      (activations read and written plus parameters read), for memory-bound ops;
    - ``saved_bytes(batch, seq, dtype_bytes)``: bytes the autograd graph keeps
      alive for the backward.
    """

    name: str
    """Unique name of the node inside its component (dotted paths are allowed)."""

    seq_split: ClassVar[SeqSplit] = "local"

    is_block: ClassVar[bool] = False
    """Whether the node is a repeated block: a unit of activation recomputation (lf-memory's planner and
    ``apply_recompute``) and of pipeline splitting, what ``Component.blocks()`` returns. A block type opts in
    by setting it True; it must then give ``saved_bytes`` and ``forward_flops``, and its lowered module
    is listed, in graph order, in its model's ``blocks``."""

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter name -> shape, as registered by the lowered module."""
        raise NotImplementedError(f"{type(self).__name__} does not define param_shapes")

    def tp_dims(self) -> dict[str, int | None]:
        """Parameter name -> dim split by tensor parallelism (None: replicated). Default: all replicated."""
        return {key: None for key in self.param_shapes()}

    def forward_flops(self, batch: int, seq: int) -> int:
        """Forward FLOPs on ``batch`` samples of ``seq`` tokens (multiply-add = 2)."""
        raise NotImplementedError(f"{type(self).__name__} has no FLOP rule")

    def backward_flops(self, batch: int, seq: int) -> int:
        """Backward FLOPs: input and weight gradients, twice the forward unless a node says otherwise."""
        return 2 * self.forward_flops(batch, seq)

    def _fail(self, message: str) -> None:
        raise IRError(f"node {self.name!r} ({type(self).__name__}): {message}")

    def _positive(self, **fields: int) -> None:
        for key, value in fields.items():
            if not isinstance(value, int) or value <= 0:
                self._fail(f"{key} must be a positive integer, got {value!r}")
