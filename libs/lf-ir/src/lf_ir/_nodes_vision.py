"""Vision-tower nodes: 3D patch embedding, patch merger, and a two-matrix MLP with a chosen activation.

Follow the Qwen2-VL ViT (Wang et al. 2024, arXiv 2409.12191) as implemented by HF
``transformers``: patches are flattened by the image processor, embedded by a
bias-free ``(temporal, patch, patch)`` convolution, and after the ViT blocks every
``merge x merge`` block of patch tokens is fused into one LLM token.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from lf_ir import _bytes_video
from lf_ir._base import SeqSplit, _Node

Activation = Literal["gelu", "gelu_tanh", "quick_gelu", "silu"]
"""``gelu``: exact erf GELU; ``gelu_tanh``: tanh approximation; ``quick_gelu``: ``x * sigmoid(1.702 x)``
(CLIP, Radford et al. 2021); ``silu``: ``x * sigmoid(x)``."""


class PatchEmbed3D(_Node, frozen=True, kw_only=True, tag="patch_embed_3d"):
    """Spatio-temporal patch embedding: flattened patches (..., C*T*p*p) -> (..., dim).

    The weight is that of a ``Conv3d(C, dim, (T, p, p), stride=(T, p, p))`` applied
    to one patch, i.e. a linear map of the flattened ``(C, T, p, p)`` patch. ``seq``
    in the FLOP rules counts patches (one token per patch); frames of a still image
    are repeated ``T`` times by the processor.

    Example:
        >>> PatchEmbed3D(name="patch_embed", dim=1280).param_shapes()
        {'proj.weight': (1280, 3, 2, 14, 14)}
    """

    dim: int
    """Embedding width of each patch token."""
    in_channels: int = 3
    """Image channels."""
    patch_size: int = 14
    """Square patch side in pixels."""
    temporal_patch_size: int = 2
    """Frames per patch."""
    bias: bool = False
    """Whether the projection adds a bias (Qwen2-VL: no)."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, in_channels=self.in_channels, patch_size=self.patch_size,
                       temporal_patch_size=self.temporal_patch_size)

    @property
    def patch_features(self) -> int:
        """Values per flattened patch: C * T * p * p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def in_dim(self) -> int | None:
        return None

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        p = self.patch_size
        shapes = {"proj.weight": (self.dim, self.in_channels, self.temporal_patch_size, p, p)}
        if self.bias:
            shapes["proj.bias"] = (self.dim,)
        return shapes

    def forward_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.patch_features * self.dim

    def backward_flops(self, batch: int, seq: int) -> int:
        """Weight gradient only (pixels need no gradient): equal to the forward."""
        return self.forward_flops(batch, seq)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the patches and the weight, write the tokens."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        params = sum(math.prod(s) for s in self.param_shapes().values())
        return (batch * seq * (self.patch_features + self.dim) + params) * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The patches (batch * seq, C*T*p*p), for the weight gradient."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        return batch * seq * self.patch_features * dtype_bytes


class PatchMerger(_Node, frozen=True, kw_only=True, tag="patch_merger"):
    """Fuses each ``merge x merge`` block of patch tokens into one token of the LLM width.

    (tokens, in_features) -> LayerNorm -> view (tokens / merge**2, in_features * merge**2)
    -> Linear -> GELU -> Linear -> (tokens / merge**2, out_features). The block's
    tokens must be consecutive (Qwen2-VL's processor order). ``seq`` in the FLOP rules
    counts the patch tokens entering the merger.

    Example:
        >>> PatchMerger(name="merger", in_features=1280, out_features=3584).hidden
        5120
    """

    in_features: int
    """Width of the ViT tokens (HF ``embed_dim``)."""
    out_features: int
    """Width of the merged tokens: the LLM's model width (HF vision ``hidden_size``)."""
    merge: int = 2
    """Patches merged per side (HF ``spatial_merge_size``)."""
    eps: float = 1e-6
    """LayerNorm epsilon."""

    seq_split: ClassVar[SeqSplit] = "none"

    def __post_init__(self) -> None:
        self._positive(in_features=self.in_features, out_features=self.out_features, merge=self.merge)

    @property
    def hidden(self) -> int:
        """Width of a fused block: in_features * merge**2."""
        return self.in_features * self.merge ** 2

    @property
    def in_dim(self) -> int:
        return self.in_features

    @property
    def out_dim(self) -> int:
        return self.out_features

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"norm.weight": (self.in_features,), "norm.bias": (self.in_features,),
                "fc1.weight": (self.hidden, self.hidden), "fc1.bias": (self.hidden,),
                "fc2.weight": (self.out_features, self.hidden), "fc2.bias": (self.out_features,)}

    def tp_dims(self) -> dict[str, int | None]:
        return {"norm.weight": None, "norm.bias": None, "fc1.weight": 0, "fc1.bias": 0,
                "fc2.weight": 1, "fc2.bias": None}

    def forward_flops(self, batch: int, seq: int) -> int:
        if seq % self.merge ** 2:
            self._fail(f"seq {seq} patch tokens is not a multiple of merge**2 = {self.merge ** 2}")
        return 2 * batch * (seq // self.merge ** 2) * self.hidden * (self.hidden + self.out_features)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """LayerNorm (read, write), fc1 (read, write), GELU (read, write), fc2 (read, write), parameters."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        tokens, merged = batch * seq, batch * seq // self.merge ** 2
        params = sum(math.prod(s) for s in self.param_shapes().values())
        elems = 2 * tokens * self.in_features + 4 * merged * self.hidden + merged * (self.hidden + self.out_features)
        return (elems + params) * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """LayerNorm input and stats, fc1 input, GELU input, fc2 input."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        tokens, merged = batch * seq, batch * seq // self.merge ** 2
        return (tokens * self.in_features + 2 * tokens + 3 * merged * self.hidden) * dtype_bytes


class FeedForward(_Node, frozen=True, kw_only=True, tag="feed_forward"):
    """Two-matrix MLP ``down(act(up(x)))`` with a chosen activation: (..., dim) -> (..., dim).

    Example:
        >>> FeedForward(name="mlp", dim=8, hidden=32, activation="quick_gelu").param_shapes()["up.weight"]
        (32, 8)
    """

    dim: int
    """Model width (input and output)."""
    hidden: int
    """Hidden width."""
    activation: Activation = "gelu"
    """Activation between the two matrices (see :data:`Activation`)."""
    bias: bool = True
    """Whether the projections carry biases."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, hidden=self.hidden)
        if self.activation not in ("gelu", "gelu_tanh", "quick_gelu", "silu"):
            self._fail(f"activation must be gelu, gelu_tanh, quick_gelu or silu, got {self.activation!r}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"up.weight": (self.hidden, self.dim),
                                              "down.weight": (self.dim, self.hidden)}
        if self.bias:
            shapes.update({"up.bias": (self.hidden,), "down.bias": (self.dim,)})
        return shapes

    def tp_dims(self) -> dict[str, int | None]:
        return {k: (1 if k == "down.weight" else None if k == "down.bias" else 0) for k in self.param_shapes()}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 4 * batch * seq * self.dim * self.hidden

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """up (read, write), the activation's elementwise ops (quick-GELU: scale, sigmoid, product), down, weights."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        params = sum(math.prod(s) for s in self.param_shapes().values())
        return _bytes_video.ffn_forward(batch * seq, self.dim, self.hidden, self.activation, dtype_bytes, params)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The input (T*dim) and 2 hidden-width tensors (up output, activation output; quick-GELU 3: up output,
        sigmoid, product); see :mod:`lf_ir._bytes_video`."""
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        return _bytes_video.ffn_saved(batch * seq, self.dim, self.hidden, self.activation, dtype_bytes)
