"""Language-model output nodes: the vocabulary projection (optionally tied to the embedding)."""

from __future__ import annotations

from lf_ir._base import TPStyle, _Node


class LMHead(_Node, frozen=True, kw_only=True, tag="lm_head"):
    """Vocabulary projection without bias: (batch, seq, dim) -> (batch, seq, vocab_size) logits.

    With ``tied_to`` set, the head multiplies by the (vocab_size, dim) weight of
    that earlier ``Embedding`` node of the same component (weight tying, Press &
    Wolf 2017, arXiv 1608.05859) and owns no parameter, so parameter totals count
    the table once. ``validate`` checks that the named node exists, comes first
    and has the same shape.

    Example:
        >>> LMHead(name="head", dim=64, vocab_size=256, tied_to="embed").param_shapes()
        {}
    """

    dim: int
    """Input width (model width)."""
    vocab_size: int
    """Output logits per token."""
    tied_to: str | None = None
    """Name of the ``Embedding`` node whose weight is shared; None for an own weight."""
    tp: TPStyle = "column"
    """Tensor-parallel style: column-parallel splits the vocabulary."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, vocab_size=self.vocab_size)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.vocab_size

    def weight_shape(self) -> tuple[int, int]:
        """Shape of the weight the head multiplies by, owned or shared: (vocab_size, dim)."""
        return (self.vocab_size, self.dim)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {} if self.tied_to is not None else {"weight": self.weight_shape()}

    def tp_dims(self) -> dict[str, int | None]:
        return {} if self.tied_to is not None else {"weight": 0 if self.tp == "column" else None}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.dim * self.vocab_size

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the input and the (owned or shared) weight, write the logits."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        return (batch * seq * (self.dim + self.vocab_size) + self.vocab_size * self.dim) * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The input (batch, seq, dim), for the weight gradient (the logits are kept by the loss, not here)."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        return batch * seq * self.dim * dtype_bytes
