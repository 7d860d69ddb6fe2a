"""Action-expert nodes of a flow-matching VLA (pi0): the action/time input MLP and the joint-attention block.

pi0 (Black et al. 2024, "pi0: A Vision-Language-Action Flow Model for General Robot
Control", arXiv 2410.24164) runs two sets of transformer weights over one sequence:
the VLM backbone over the prefix (image, instruction and state tokens) and a smaller
*action expert* over the suffix (the noisy action chunk). Each layer attends jointly:
queries, keys and values come from each expert's own projections and are concatenated
along the sequence, under pi0's block mask (the prefix sees only the prefix,
bidirectionally; the suffix sees the prefix and the whole action chunk).

Torch-free; the lowerings live in :mod:`lf_ir._lower_expert`.

Legend: ``P`` prefix tokens, ``H`` suffix (action) tokens, ``T = batch * tokens``,
``d`` backbone width, ``e`` expert width, ``a = heads * head_dim``, ``kv = kv_heads * head_dim``,
``db`` bytes per activation element.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from lf_ir import _bytes
from lf_ir._base import SeqSplit, _Node
from lf_ir._nodes import MLP

LSE_BYTES = 4
"""SDPA's log-sum-exp is float32 for float16 / bfloat16 / float32 inputs."""


class ActionTimeEmbed(_Node, frozen=True, kw_only=True, tag="action_time_embed"):
    """pi0's suffix input: noisy actions (batch, H, action_dim) and flow time (batch,) -> (batch, H, width).

    ``x = action_in(actions)``; ``t = sincos(sigma)`` (width features, periods from
    ``4e-3`` to ``4``, pi0's ``posemb_sincos``); ``out = mlp_out(silu(mlp_in([x, t])))``
    (pi0's ``action_time_mlp_in/out``, section 3 / appendix B). ``seq`` is the action
    horizon ``H``. The noisy actions are data, so the backward of ``action_in``
    computes only the weight gradient.

    Example:
        >>> sorted(ActionTimeEmbed(name="embed", action_dim=4, width=16).param_shapes())[:2]
        ['action_in.bias', 'action_in.weight']
    """

    action_dim: int
    """Action features per time step."""
    width: int
    """Action-expert width (output features)."""

    def __post_init__(self) -> None:
        self._positive(action_dim=self.action_dim, width=self.width)
        if self.width % 2:
            self._fail(f"width must be even (sin and cos halves of the time embedding), got {self.width}")

    @property
    def in_dim(self) -> int:
        return self.action_dim

    @property
    def out_dim(self) -> int:
        return self.width

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        a, w = self.action_dim, self.width
        return {"action_in.weight": (w, a), "action_in.bias": (w,), "mlp_in.weight": (w, 2 * w),
                "mlp_in.bias": (w,), "mlp_out.weight": (w, w), "mlp_out.bias": (w,)}

    def forward_flops(self, batch: int, seq: int) -> int:
        a, w = self.action_dim, self.width
        return 2 * batch * seq * (a * w + 2 * w * w + w * w)

    def backward_flops(self, batch: int, seq: int) -> int:
        """Twice the forward, less the input gradient of ``action_in`` (its input is data)."""
        return 2 * self.forward_flops(batch, seq) - 2 * batch * seq * self.action_dim * self.width

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Unfused: the three linears, the concatenation and the SiLU read inputs and write outputs once."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        t, a, w = batch * seq, self.action_dim, self.width
        elems = t * (a + w) + 2 * (2 * t * w) + t * (2 * w + w) + 2 * t * w + 2 * t * w
        return elems * dtype_bytes + _bytes.params_bytes(self, dtype_bytes)

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The noisy actions (action_in's input), the concatenation, the SiLU input and output: T*(a + 4w)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * (self.action_dim + 4 * self.width) * dtype_bytes


class JointAttentionBlock(_Node, frozen=True, kw_only=True, tag="joint_attention_block"):
    """One pi0 layer: a backbone (prefix) and an action-expert (suffix) pre-norm block with joint attention.

    Each stream has its own LayerNorms, q/k/v/o projections (no bias) and MLP (GELU with
    biases, or SwiGLU without: the shapes and FLOPs of Gemma's GeGLU, :class:`~lf_ir._nodes.MLP`); both
    use ``heads`` query heads, ``kv_heads`` key/value heads of ``head_dim`` features,
    so their keys and values concatenate along the sequence. Mask (pi0's blocks):
    prefix queries see the ``P`` prefix keys (bidirectional, key padding applied);
    suffix queries see all ``P + H`` keys. ``seq`` is ``P + H`` tokens per sample,
    ``H = suffix_len``. ``in_dim``/``out_dim`` are the backbone width ``dim`` (the
    prefix stream); the suffix stream runs at ``expert_dim``.

    ``prefix_kv_only`` (the last layer): the prefix's outputs are never read, so the
    prefix stream only computes its keys and values (no q, o, MLP: no parameters
    either). Parameter names: ``prefix.*`` and ``suffix.*`` with ``attn_norm``, ``q``,
    ``k``, ``v``, ``o``, ``mlp_norm``, ``mlp.up``, ``mlp.down``.

    FLOPs count exactly the score entries the block mask keeps, ``P*P + H*(P+H)`` per
    head (``H*(P+H)`` with ``prefix_kv_only``), which is what the lowering computes (two
    attention calls, not one masked dense one).

    Example:
        >>> blk = JointAttentionBlock(name="b", dim=32, expert_dim=16, heads=4, kv_heads=2, head_dim=8,
        ...                           hidden=64, expert_hidden=32, suffix_len=4)
        >>> blk.param_shapes()["suffix.q.weight"], blk.param_shapes()["prefix.o.weight"]
        ((32, 16), (32, 32))
    """

    dim: int
    """Backbone (prefix) width."""
    expert_dim: int
    """Action-expert (suffix) width."""
    heads: int
    """Query heads of both streams."""
    kv_heads: int
    """Key/value heads of both streams; must divide ``heads`` (GQA / MQA)."""
    head_dim: int
    """Features per head (both streams)."""
    hidden: int
    """Backbone MLP hidden width."""
    expert_hidden: int
    """Action-expert MLP hidden width."""
    suffix_len: int
    """Action tokens ``H`` at the end of the joint sequence."""
    prefix_kv_only: bool = False
    """Last layer: the prefix stream computes only keys and values."""
    mlp_activation: Literal["gelu", "swiglu"] = "gelu"
    """MLP of both streams: ``"gelu"`` (up, down, biases) or ``"swiglu"`` (gate, up, down, no biases)."""

    seq_split: ClassVar[SeqSplit] = "context"

    is_block: ClassVar[bool] = True
    """A repeated block: what ``Component.blocks()`` returns to recompute and pipeline planners."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, expert_dim=self.expert_dim, heads=self.heads, kv_heads=self.kv_heads,
                       head_dim=self.head_dim, hidden=self.hidden, expert_hidden=self.expert_hidden,
                       suffix_len=self.suffix_len)
        if self.heads % self.kv_heads:
            self._fail(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.mlp_activation not in ("gelu", "swiglu"):
            self._fail(f"mlp_activation must be 'gelu' or 'swiglu', got {self.mlp_activation!r}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    @property
    def stream_widths(self) -> tuple[int, int]:
        """Widths of the two input streams (prefix, suffix): what edges into the component may carry."""
        return (self.dim, self.expert_dim)

    def mlp(self, stream: Literal["prefix", "suffix"]) -> MLP:
        """The MLP node of one stream (its parameters are ``{stream}.mlp.*``)."""
        width, hidden = (self.dim, self.hidden) if stream == "prefix" else (self.expert_dim, self.expert_hidden)
        return MLP(name=f"{self.name}.{stream}.mlp", dim=width, hidden=hidden, activation=self.mlp_activation,
                   bias=self.mlp_activation == "gelu")

    def _stream_shapes(self, stream: Literal["prefix", "suffix"], kv_only: bool) -> dict[str, tuple[int, ...]]:
        width = self.dim if stream == "prefix" else self.expert_dim
        a, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"attn_norm.weight": (width,), "attn_norm.bias": (width,),
                                              "k.weight": (kv, width), "v.weight": (kv, width)}
        if not kv_only:
            shapes.update({"q.weight": (a, width), "o.weight": (width, a), "mlp_norm.weight": (width,),
                           "mlp_norm.bias": (width,)})
            shapes.update({f"mlp.{k}": v for k, v in self.mlp(stream).param_shapes().items()})
        return shapes

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        pre = self._stream_shapes("prefix", self.prefix_kv_only)
        suf = self._stream_shapes("suffix", False)
        return {**{f"prefix.{k}": v for k, v in pre.items()}, **{f"suffix.{k}": v for k, v in suf.items()}}

    def tp_dims(self) -> dict[str, int | None]:
        """q/k/v and MLP up column-parallel (dim 0, with the up bias), o and MLP down row-parallel (dim 1)."""
        dims: dict[str, int | None] = {}
        for key in self.param_shapes():
            leaf = key.split(".", 1)[1]
            if leaf in ("q.weight", "k.weight", "v.weight") or (leaf.startswith("mlp.") and leaf != "mlp.down.bias"
                                                                 and leaf != "mlp.down.weight"):
                dims[key] = 0
            elif leaf in ("o.weight", "mlp.down.weight"):
                dims[key] = 1
            else:
                dims[key] = None
        return dims

    def prefix_len(self, seq: int) -> int:
        """``P = seq - suffix_len``; IRError unless positive."""
        if seq <= self.suffix_len:
            self._fail(f"seq {seq} must exceed suffix_len {self.suffix_len} (a non-empty prefix)")
        return seq - self.suffix_len

    def _stream_flops(self, tokens: int, width: int, hidden: int, kv_only: bool) -> int:
        a, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if kv_only:
            return 2 * tokens * width * 2 * kv
        mats = 3 if self.mlp_activation == "swiglu" else 2
        return 2 * tokens * width * (a + 2 * kv + a) + 2 * tokens * mats * width * hidden

    def kept_pairs(self, seq: int) -> int:
        """(query, key) pairs per sample and head that the block mask keeps: ``P*P + H*(P+H)``."""
        p, h = self.prefix_len(seq), self.suffix_len
        return (0 if self.prefix_kv_only else p * p) + h * (p + h)

    def forward_flops(self, batch: int, seq: int) -> int:
        """Both streams' projections and MLPs plus ``4 * head_dim * heads`` per kept score entry."""
        p, h = self.prefix_len(seq), self.suffix_len
        proj = (self._stream_flops(batch * p, self.dim, self.hidden, self.prefix_kv_only)
                + self._stream_flops(batch * h, self.expert_dim, self.expert_hidden, False))
        return proj + 4 * batch * self.heads * self.head_dim * self.kept_pairs(seq)

    def _attn_saved(self, batch: int, q_len: int, kv_len: int, dtype_bytes: int) -> int:
        """One lf_kernels dense-mask attention call (key padding given): see ``lf_ir._bytes``."""
        a, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        kv_kept = batch * kv_len * (a if self.heads != self.kv_heads else kv)
        elems = batch * q_len * a + 2 * kv_kept + batch * q_len * a  # q, k and v (expanded), SDPA output
        elems += batch * q_len * kv_len + batch * q_len + batch * q_len * a  # float mask, row_any, o input
        return elems * dtype_bytes + batch * self.heads * q_len * LSE_BYTES

    def _stream_saved(self, tokens: int, width: int, hidden: int, dtype_bytes: int, kv_only: bool) -> int:
        """Norm inputs and statistics, the q/k/v projection input, the MLP input and its two hidden tensors."""
        saved = _bytes.norm_saved("layer", tokens, width, dtype_bytes)
        if kv_only:
            return saved + tokens * width * dtype_bytes
        saved += tokens * width * dtype_bytes + _bytes.norm_saved("layer", tokens, width, dtype_bytes)
        copies = 4 if self.mlp_activation == "swiglu" else 2
        return saved + (tokens * width + copies * tokens * hidden) * dtype_bytes

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """What autograd keeps through lf_kernels' CPU path (dense mask with key padding for both calls).

        Per stream: LayerNorm input and statistics, the input of the q/k/v projections, the
        MLP input and its up / GELU outputs; per attention call (prefix: P queries on P keys,
        suffix: H queries on P + H keys): q, k and v (expanded to ``heads`` under GQA; the
        suffix call's keys are the new concatenated tensor), the float mask, the empty-row
        guard, the SDPA output, the output-projection input and the log-sum-exp.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        p, h = self.prefix_len(seq), self.suffix_len
        total = (self._stream_saved(batch * p, self.dim, self.hidden, dtype_bytes, self.prefix_kv_only)
                 + self._stream_saved(batch * h, self.expert_dim, self.expert_hidden, dtype_bytes, False))
        if not self.prefix_kv_only:
            total += self._attn_saved(batch, p, p, dtype_bytes)
        return total + self._attn_saved(batch, h, p + h, dtype_bytes)
