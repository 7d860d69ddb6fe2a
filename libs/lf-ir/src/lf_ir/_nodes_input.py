"""Input nodes: token embedding, linear projection, ViT patch embedding and learned positions.

Split out of ``_nodes.py`` (which re-exports every name here and builds the ``Node`` union).
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from lf_ir import _bytes
from lf_ir._base import SeqSplit, TPStyle, _Node

__all__ = ["Embedding", "LearnedPositional", "Linear", "PatchEmbed2D"]


class Embedding(_Node, frozen=True, kw_only=True, tag="embedding"):
    """Token embedding table: ids (batch, seq) int64 -> (batch, seq, dim), optionally times a constant ``scale``."""

    num_embeddings: int
    """Vocabulary size (rows of the table)."""
    dim: int
    """Embedding width."""
    tp: TPStyle = "replicate"
    """How tensor parallelism splits the table (vocab-parallel is ``"row"``)."""
    scale: float | msgspec.UnsetType = msgspec.UNSET
    """Multiply the looked-up rows by this constant, first rounded to the table's dtype as HF's Gemma does
    (Gemma: ``sqrt(dim)``; a tied head still uses the unscaled table). Unset (left out of the JSON): no scaling."""

    def __post_init__(self) -> None:
        self._positive(num_embeddings=self.num_embeddings, dim=self.dim)
        if self.scale is not msgspec.UNSET and not (isinstance(self.scale, (int, float)) and self.scale > 0):
            self._fail(f"scale must be a positive number, got {self.scale!r}")

    @property
    def in_dim(self) -> int | None:
        return None

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.num_embeddings, self.dim)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def tp_dims(self) -> dict[str, int | None]:
        return {"weight": 0 if self.tp == "row" else None}

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the int64 ids and the gathered rows, write the embeddings (with ``scale``: read and write them
        once more)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        scaled = 0 if self.scale is msgspec.UNSET else 2 * batch * seq * self.dim * dtype_bytes
        return batch * seq * (8 + 2 * self.dim * dtype_bytes) + scaled

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The int64 ids (the weight gradient scatters by them); with ``scale``, also the 0-d scale tensor."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * 8 + (0 if self.scale is msgspec.UNSET else dtype_bytes)


class Linear(_Node, frozen=True, kw_only=True, tag="linear"):
    """Affine map on the last dim: (..., in_features) -> (..., out_features)."""

    in_features: int
    """Input feature size."""
    out_features: int
    """Output feature size."""
    bias: bool = True
    """Whether the layer adds a bias."""
    tp: TPStyle = "replicate"
    """Tensor-parallel style: column splits outputs, row splits inputs."""

    def __post_init__(self) -> None:
        self._positive(in_features=self.in_features, out_features=self.out_features)

    @property
    def in_dim(self) -> int:
        return self.in_features

    @property
    def out_dim(self) -> int:
        return self.out_features

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"weight": (self.out_features, self.in_features)}
        if self.bias:
            shapes["bias"] = (self.out_features,)
        return shapes

    def tp_dims(self) -> dict[str, int | None]:
        split = {"column": 0, "row": 1, "replicate": None}[self.tp]
        dims: dict[str, int | None] = {"weight": split}
        if self.bias:
            dims["bias"] = 0 if self.tp == "column" else None
        return dims

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.in_features * self.out_features

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the input and the parameters, write the output."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens = batch * seq
        return tokens * (self.in_features + self.out_features) * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The input (batch, seq, in_features), for the weight gradient."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * self.in_features * dtype_bytes


class PatchEmbed2D(_Node, frozen=True, kw_only=True, tag="patch_embed_2d"):
    """ViT patch embedding: image (batch, channels, H, W) -> (batch, (H/p)*(W/p), dim).

    Follows Dosovitskiy et al., "An Image is Worth 16x16 Words" (arXiv 2010.11929).
    """

    in_channels: int
    """Image channels (3 for RGB)."""
    image_size: int
    """Square image side in pixels."""
    patch_size: int
    """Square patch side in pixels; must divide ``image_size``."""
    dim: int
    """Embedding width of each patch token."""

    def __post_init__(self) -> None:
        self._positive(in_channels=self.in_channels, image_size=self.image_size,
                       patch_size=self.patch_size, dim=self.dim)
        if self.image_size % self.patch_size:
            self._fail(f"patch_size {self.patch_size} must divide image_size {self.image_size}")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def in_dim(self) -> int | None:
        return None

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.patch_size
        return {"weight": (self.dim, self.in_channels, p, p), "bias": (self.dim,)}

    seq_split: ClassVar[SeqSplit] = "none"

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * self.num_patches * self.in_channels * self.patch_size ** 2 * self.dim

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the image and the parameters, write the patch tokens (``seq`` unused: the image fixes it)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        image = batch * self.in_channels * self.image_size ** 2
        return (image + batch * self.num_patches * self.dim) * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The image (batch, channels, H, W) in the activation dtype, for the weight gradient."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * self.in_channels * self.image_size ** 2 * dtype_bytes


class LearnedPositional(_Node, frozen=True, kw_only=True, tag="learned_positional"):
    """Learned absolute position embedding added to (batch, seq<=length, dim)."""

    length: int
    """Maximum sequence length."""
    dim: int
    """Embedding width."""

    def __post_init__(self) -> None:
        self._positive(length=self.length, dim=self.dim)

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.length, self.dim)}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the input and ``seq`` rows of the table, write the sum."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return (2 * batch * seq + seq) * self.dim * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Nothing: an add keeps no tensor for its backward."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return 0
