"""Transformer nodes: norm, grouped-query attention, MLP and the pre-norm residual block.

Split out of ``_nodes.py`` (which re-exports every name here and builds the ``Node`` union);
``_nodes_mm.py`` and ``_nodes_expert.py`` build on these classes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from lf_ir import _bytes
from lf_ir._base import SeqSplit, _Node
from lf_ir._mask import Mask, as_mask
from lf_ir._rope import RoPE

__all__ = ["MLP", "Attention", "MaskKind", "Norm", "TransformerBlock"]

MaskKind = Literal["full", "causal", "prefix_lm"]
"""Mask kinds an ``Attention`` node may give as a bare string; the others need a :class:`Mask`."""


class Norm(_Node, frozen=True, kw_only=True, tag="norm"):
    """LayerNorm or RMSNorm over the last dim (shape preserving).

    Example:
        >>> Norm(name="n", dim=8, kind="rms", zero_centered_gamma=True).param_shapes()
        {'weight': (8,)}
    """

    dim: int
    """Normalized feature size."""
    kind: Literal["layer", "rms"] = "layer"
    """``"layer"`` (Ba et al. 2016) or ``"rms"`` (Zhang & Sennrich 2019)."""
    eps: float = 1e-5
    """Added to the variance for stability."""
    zero_centered_gamma: bool | msgspec.UnsetType = msgspec.UNSET
    """RMSNorm only: scale by ``1 + weight`` with the weight initialized to 0 (Gemma; Transformer Engine's
    ``zero_centered_gamma``), computed as HF's ``GemmaRMSNorm``: in float32 (float64 inputs: float64),
    ``x * rsqrt(mean(x^2) + eps) * (1 + weight)``, then cast to the input's dtype. Unset (left out of the
    JSON) or False: ``x * rstd * weight``."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim)
        if self.kind not in ("layer", "rms"):
            self._fail(f"kind must be 'layer' or 'rms', got {self.kind!r}")
        if self.zero_centered_gamma and self.kind != "rms":
            self._fail("zero_centered_gamma is implemented for kind='rms' only")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {"weight": (self.dim,)}
        if self.kind == "layer":
            shapes["bias"] = (self.dim,)
        return shapes

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the input and the parameters, write the output."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return 2 * batch * seq * self.dim * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, kernels: str = "cpu") -> int:
        """Bytes kept for backward (see :func:`lf_ir._bytes.norm_saved`): LayerNorm: input, mean, rstd; RMSNorm on
        the CPU: float32 input, ``x * rstd`` and rstd; RMSNorm with ``kernels="cuda"`` (``aten::_fused_rms_norm``):
        the input and a float32 rstd. ``dtype_bytes`` is the input's (a decoder's residual stream is float32 under
        autocast over float32 weights).

        Raises:
            IRError: a non-positive size.
            ValueError: ``kernels`` not ``"cpu"`` or ``"cuda"``.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        if self.zero_centered_gamma:  # computed op by op in float32 on every device
            return _bytes.zero_centered_rms_saved(batch * seq, self.dim, dtype_bytes, kernels=kernels)
        return _bytes.norm_saved(self.kind, batch * seq, self.dim, dtype_bytes, kernels=kernels)


class Attention(_Node, frozen=True, kw_only=True, tag="attention"):
    """Multi-head self-attention with grouped-query heads (GQA) and a mask kind.

    (batch, seq, dim) -> (batch, seq, dim). q/k/v projections are column-parallel,
    the output projection row-parallel (Megatron-LM, arXiv 1909.08053).
    """

    dim: int
    """Model width."""
    heads: int
    """Query heads; must divide ``dim`` unless ``kv_channels`` is set."""
    kv_heads: int
    """Key/value heads; must divide ``heads`` (GQA, arXiv 2305.13245)."""
    mask: MaskKind | Mask = "causal"
    """Which positions may attend to which: a bare kind or a :class:`Mask` with parameters
    (same kinds as lf_kernels.MaskSpec)."""
    bias: bool = False
    """Whether the q/k/v/o projections carry biases."""
    rope: RoPE | None = None
    """Rotary position embedding applied to q and k (None: no rotary embedding)."""
    kv_channels: int | msgspec.UnsetType = msgspec.UNSET
    """Features per head (HF ``head_dim``, Megatron-LM ``kv_channels``) when it is not ``dim / heads`` (Gemma 7B:
    16 heads of 256 over a width of 3072): q is then ``heads * kv_channels`` wide. Unset (left out of the JSON):
    ``dim / heads``. Read :attr:`head_dim` for the value in effect."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, heads=self.heads, kv_heads=self.kv_heads)
        if self.kv_channels is not msgspec.UNSET:
            self._positive(kv_channels=self.kv_channels)
        elif self.dim % self.heads:
            self._fail(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            self._fail(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        try:
            mask = as_mask(self.mask)
        except ValueError as err:
            self._fail(str(err))
        problem = mask.problem()
        if problem:
            self._fail(f"mask: {problem}")
        if self.rope is not None:
            problem = self.rope.problem(self.head_dim)
            if problem:
                self._fail(f"rope: {problem}")

    @property
    def head_dim(self) -> int:
        """Features per head: ``kv_channels`` if set, else ``dim / heads``."""
        return self.dim // self.heads if self.kv_channels is msgspec.UNSET else self.kv_channels

    @property
    def inner_dim(self) -> int:
        """Width of the queries and of the attention output (the o projection's input): ``heads * head_dim``."""
        return self.heads * self.head_dim

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        kv, inner = self.kv_heads * self.head_dim, self.inner_dim
        shapes = {"q.weight": (inner, self.dim), "k.weight": (kv, self.dim),
                  "v.weight": (kv, self.dim), "o.weight": (self.dim, inner)}
        if self.bias:
            shapes.update({"q.bias": (inner,), "k.bias": (kv,), "v.bias": (kv,), "o.bias": (self.dim,)})
        return shapes

    seq_split: ClassVar[SeqSplit] = "context"

    def tp_dims(self) -> dict[str, int | None]:
        dims: dict[str, int | None] = {"q.weight": 0, "k.weight": 0, "v.weight": 0, "o.weight": 1}
        if self.bias:
            dims.update({"q.bias": 0, "k.bias": 0, "v.bias": 0, "o.bias": None})
        return dims

    @property
    def mask_spec(self) -> Mask:
        """The mask as a :class:`Mask` (a bare ``"prefix_lm"`` has prefix 0: see ``lf_ir._mask``)."""
        return as_mask(self.mask)

    def _proj_flops(self, batch: int, seq: int) -> int:
        return 2 * batch * seq * self.dim * (2 * self.inner_dim + 2 * self.kv_heads * self.head_dim)

    def forward_flops(self, batch: int, seq: int) -> int:
        """Projections plus the dense score and value terms (4 * seq^2 * heads * head_dim per sample, i.e.
        4 * seq^2 * dim when ``head_dim = dim / heads``), the MFU convention."""
        return self._proj_flops(batch, seq) + 4 * batch * seq * seq * self.inner_dim

    def forward_flops_unmasked(self, batch: int, seq: int, doc_lens: list[int] | None = None) -> int:
        """Like :meth:`forward_flops` but counting only the score entries the mask keeps.

        ``doc_lens``: packed masks only, the document lengths of a sample (see
        :meth:`Mask.kept_pairs`); None counts one document per sample.
        """
        return self._proj_flops(batch, seq) + 4 * batch * self.inner_dim * self.mask_spec.kept_pairs(seq, doc_lens)

    def keep_fraction(self, seq: int, doc_lens: list[int] | None = None) -> float:
        """Exact fraction of the (seq, seq) score matrix the mask keeps (see :meth:`Mask.keep_fraction`)."""
        return self.mask_spec.keep_fraction(seq, doc_lens)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False) -> int:
        """Projections, RoPE and a flash-style core (no score matrix); see ``lf_ir._bytes``."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes.attention_forward(self, self.mask_spec, batch, seq, dtype_bytes, key_padding)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False) -> int:
        """What autograd keeps through lf_kernels' CPU path, by backend (see ``lf_ir._bytes``).

        ``key_padding``: whether the call gets a (batch, seq) key-padding mask.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes.attention_saved(self, self.mask_spec, batch, seq, dtype_bytes, key_padding)


MLP_ACTIVATIONS = ("gelu", "swiglu", "geglu_tanh")
"""The activations an :class:`MLP` node implements."""


class MLP(_Node, frozen=True, kw_only=True, tag="mlp"):
    """Feed-forward block: GELU MLP, or a gated linear unit (Shazeer 2020, arXiv 2002.05202): SwiGLU or GeGLU."""

    dim: int
    """Model width (input and output)."""
    hidden: int
    """Hidden width."""
    activation: Literal["gelu", "swiglu", "geglu_tanh"] = "gelu"
    """``"gelu"``: up -> GELU -> down; ``"swiglu"``: (silu(gate) * up) -> down; ``"geglu_tanh"``:
    (gelu_tanh(gate) * up) -> down, GELU in its tanh approximation (Gemma; HF ``gelu_pytorch_tanh``)."""
    bias: bool = True
    """Whether the projections carry biases."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, hidden=self.hidden)
        if self.activation not in MLP_ACTIVATIONS:
            self._fail(f"activation must be one of {list(MLP_ACTIVATIONS)}, got {self.activation!r}")

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate projection (SwiGLU, GeGLU): three matrices instead of two."""
        return self.activation != "gelu"

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        names = ["up", "down"] + (["gate"] if self.gated else [])
        shapes: dict[str, tuple[int, ...]] = {}
        for n in names:
            shape = (self.dim, self.hidden) if n == "down" else (self.hidden, self.dim)
            shapes[f"{n}.weight"] = shape
            if self.bias:
                shapes[f"{n}.bias"] = (shape[0],)
        return shapes

    def tp_dims(self) -> dict[str, int | None]:
        return {key: (1 if key == "down.weight" else None if key == "down.bias" else 0)
                for key in self.param_shapes()}

    def forward_flops(self, batch: int, seq: int) -> int:
        mats = 3 if self.gated else 2
        return 2 * batch * seq * self.dim * self.hidden * mats

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The projections, the activation and (gated) the product, unfused; see ``lf_ir._bytes``."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes.mlp_forward(self, batch * seq, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Input plus 2 (GELU) or 4 (SwiGLU, GeGLU) hidden-width tensors; see ``lf_ir._bytes``."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes.mlp_saved(self, batch * seq, dtype_bytes)


class TransformerBlock(_Node, frozen=True, kw_only=True, tag="transformer_block"):
    """Pre-norm residual block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    attn_norm: Norm
    """Norm before attention."""
    attention: Attention
    """Self-attention."""
    mlp_norm: Norm
    """Norm before the MLP."""
    mlp: MLP
    """Feed-forward."""

    def __post_init__(self) -> None:
        dims = {self.attn_norm.dim, self.attention.dim, self.mlp_norm.dim, self.mlp.dim}
        if len(dims) != 1:
            self._fail(f"sub-node widths disagree: {sorted(dims)}")

    @property
    def in_dim(self) -> int:
        return self.attention.dim

    @property
    def out_dim(self) -> int:
        return self.attention.dim

    def children(self) -> tuple[Norm, Attention, Norm, MLP]:
        return (self.attn_norm, self.attention, self.mlp_norm, self.mlp)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for key, child in zip(("attn_norm", "attention", "mlp_norm", "mlp"), self.children(), strict=True):
            shapes.update({f"{key}.{k}": v for k, v in child.param_shapes().items()})
        return shapes

    seq_split: ClassVar[SeqSplit] = "context"

    is_block: ClassVar[bool] = True
    """A repeated block: what ``Component.blocks()`` returns to recompute and pipeline planners."""

    def tp_dims(self) -> dict[str, int | None]:
        dims: dict[str, int | None] = {}
        for key, child in zip(("attn_norm", "attention", "mlp_norm", "mlp"), self.children(), strict=True):
            dims.update({f"{key}.{k}": v for k, v in child.tp_dims().items()})
        return dims

    def forward_flops(self, batch: int, seq: int) -> int:
        return sum(c.forward_flops(batch, seq) for c in self.children())

    def forward_flops_unmasked(self, batch: int, seq: int, doc_lens: list[int] | None = None) -> int:
        """:meth:`forward_flops` with the attention scores the mask drops left out."""
        return self.forward_flops(batch, seq) - self.attention.forward_flops(batch, seq) + \
            self.attention.forward_flops_unmasked(batch, seq, doc_lens)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False) -> int:
        """The children's traffic plus the two residual adds (read 2, write 1 each)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        adds = 2 * 3 * batch * seq * self.attention.dim * dtype_bytes
        return adds + self.attention.forward_bytes(batch, seq, dtype_bytes, key_padding=key_padding) + sum(
            c.forward_bytes(batch, seq, dtype_bytes) for c in (self.attn_norm, self.mlp_norm, self.mlp))

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False) -> int:
        """The sum over the four children (residual adds keep nothing); no recomputation."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return self.attention.saved_bytes(batch, seq, dtype_bytes, key_padding=key_padding) + sum(
            c.saved_bytes(batch, seq, dtype_bytes) for c in (self.attn_norm, self.mlp_norm, self.mlp))
