"""Attention and block nodes of multimodal models: separate q/k/v and output biases, M-RoPE or 2D RoPE.

:class:`MMAttention` is the attention of the Qwen2-VL LLM (q/k/v with bias, output
without, M-RoPE, causal) and of its ViT (all biases, 2D RoPE, full attention
restricted to each image); :class:`MMBlock` is a :class:`~lf_ir.TransformerBlock`
holding one, so planners that look for transformer blocks (recompute, pipeline
splits, saved-activation estimates) find it.

Imported at the bottom of ``_nodes.py`` (it subclasses ``TransformerBlock``), so
the ``Node`` union can list these classes without an import cycle.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from lf_ir import _bytes
from lf_ir._base import SeqSplit, _Node
from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._nodes import MLP, Attention, Norm, TransformerBlock
from lf_ir._nodes_vision import FeedForward
from lf_ir._rope import RoPE


class MMAttention(_Node, frozen=True, kw_only=True, tag="mm_attention"):
    """Multi-head self-attention with GQA, per-projection biases and a multimodal rotary embedding.

    (batch, seq, dim) -> (batch, seq, dim). q/k/v column-parallel, o row-parallel
    (Megatron-LM, arXiv 1909.08053). With ``mask="full"`` the lowered module may be
    given ``segments`` (token counts along ``seq``, e.g. one per image frame):
    attention then stays inside each segment (HF's ``cu_seqlens``); the FLOP rules
    count ``seq`` tokens attending densely, so for a ViT ``seq`` is the patches of
    one image and ``batch`` counts images.

    Example:
        >>> MMAttention(name="attn", dim=64, heads=4, kv_heads=2, rope=MRoPE(sections=(2, 3, 3))).head_dim
        16
    """

    dim: int
    """Model width."""
    heads: int
    """Query heads; must divide ``dim``."""
    kv_heads: int
    """Key/value heads; must divide ``heads`` (GQA, arXiv 2305.13245)."""
    mask: Literal["full", "causal"] = "causal"
    """``"causal"`` (decoder) or ``"full"`` (encoder; inside each segment when segments are given)."""
    qkv_bias: bool = True
    """Whether the q, k and v projections carry biases."""
    o_bias: bool = False
    """Whether the output projection carries a bias."""
    rope: MRoPE | VisionRoPE | None = None
    """M-RoPE (positions (3, batch, seq)), vision 2D RoPE (positions (tokens, 2)) or none."""

    seq_split: ClassVar[SeqSplit] = "context"

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, heads=self.heads, kv_heads=self.kv_heads)
        if self.dim % self.heads:
            self._fail(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            self._fail(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}")
        if self.mask not in ("full", "causal"):
            self._fail(f"unknown mask kind {self.mask!r}; expected full or causal")
        if self.rope is not None:
            problem = self.rope.problem(self.head_dim)
            if problem:
                self._fail(f"rope: {problem}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        kv = self.kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"q.weight": (self.dim, self.dim), "k.weight": (kv, self.dim),
                                              "v.weight": (kv, self.dim), "o.weight": (self.dim, self.dim)}
        if self.qkv_bias:
            shapes.update({"q.bias": (self.dim,), "k.bias": (kv,), "v.bias": (kv,)})
        if self.o_bias:
            shapes["o.bias"] = (self.dim,)
        return shapes

    def tp_dims(self) -> dict[str, int | None]:
        split = {"q": 0, "k": 0, "v": 0, "o": 1}
        return {key: (None if key == "o.bias" else 0 if key.endswith("bias") else split[key[0]])
                for key in self.param_shapes()}

    def forward_flops(self, batch: int, seq: int) -> int:
        kv = self.kv_heads * self.head_dim
        proj = 2 * batch * seq * self.dim * (2 * self.dim + 2 * kv)
        return proj + 4 * batch * seq * seq * self.dim

    def forward_flops_unmasked(self, batch: int, seq: int, doc_lens: list[int] | None = None) -> int:
        """Like :meth:`forward_flops` counting only kept scores: seq*(seq+1)/2 pairs when causal.

        ``doc_lens``: lengths of the segments (documents, frames) of a sample; None: one segment.
        """
        kv = self.kv_heads * self.head_dim
        lens = doc_lens if doc_lens is not None else [seq]
        pairs = sum(n * (n + 1) // 2 if self.mask == "causal" else n * n for n in lens)
        return 2 * batch * seq * self.dim * (2 * self.dim + 2 * kv) + 4 * batch * self.dim * pairs

    def as_attention(self) -> Attention:
        """The plain :class:`~lf_ir.Attention` of the same shape and mask, without biases or rotary embedding
        (the byte rules start from its rules and add what differs)."""
        return Attention(name=self.name, dim=self.dim, heads=self.heads, kv_heads=self.kv_heads, mask=self.mask)

    def rope_table_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Bytes of the rotary cos and sin tables the rotation keeps: M-RoPE (batch, seq, head_dim) each in the
        activation dtype, vision 2D RoPE (batch * seq, head_dim) each in float32; 0 without a rotary embedding.

        The recipe computes them once per model call and every block keeps the same tensors, so they are
        not in :meth:`saved_bytes`: count them once per component.
        """
        self._positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
        if self.rope is None:
            return 0
        return 2 * batch * seq * self.head_dim * (4 if isinstance(self.rope, VisionRoPE) else dtype_bytes)

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False) -> int:
        """Memory traffic of one forward: the plain :class:`~lf_ir.Attention` traffic (RoPE included when the
        node has one) with this node's parameters (see ``lf_ir._bytes``)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        att = self.as_attention()
        if self.rope is not None:
            att = Attention(name=self.name, dim=self.dim, heads=self.heads, kv_heads=self.kv_heads,
                            mask=self.mask, rope=RoPE())
        return (_bytes.attention_forward(att, att.mask_spec, batch, seq, dtype_bytes, key_padding)
                + _bytes.params_bytes(self, dtype_bytes) - _bytes.params_bytes(att, dtype_bytes))

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, key_padding: bool = False,
                    segmented: bool | None = None, own_tables: bool = False) -> int:
        """Bytes kept for the backward through lf_kernels' CPU path: the plain Attention's (``lf_ir._bytes``;
        flash path for full / causal without key padding) without rotary tables, plus:

        - ``segmented`` (attention per segment, the ``segments`` argument; default: True for a vision
          2D RoPE node, since the Qwen2-VL ViT is always called with segments): the per-segment outputs
          are concatenated into a new output-projection input (T*dim). Segments with key padding are not
          modelled.
        - ``own_tables``: the module computes the M-RoPE tables itself (called without ``cos_sin``):
          :meth:`rope_table_bytes` more. Otherwise the tables are the caller's, shared by all blocks.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        att = self.as_attention()
        total = _bytes.attention_saved(att, att.mask_spec, batch, seq, dtype_bytes, key_padding)
        if segmented is None:
            segmented = isinstance(self.rope, VisionRoPE)
        if segmented:
            total += batch * seq * self.dim * dtype_bytes
        if own_tables:
            total += self.rope_table_bytes(batch, seq, dtype_bytes)
        return total


class MMBlock(TransformerBlock, frozen=True, kw_only=True, tag="mm_block"):
    """Pre-norm residual block ``x + attn(norm1(x))``, ``x + mlp(norm2(x))`` with an :class:`MMAttention`.

    The MLP is a SwiGLU / GELU :class:`~lf_ir.MLP` (LLM) or a :class:`FeedForward`
    (e.g. quick-GELU in the Qwen2-VL ViT).
    """

    attn_norm: Norm
    """Norm before attention."""
    attention: MMAttention
    """Self-attention."""
    mlp_norm: Norm
    """Norm before the MLP."""
    mlp: MLP | FeedForward
    """Feed-forward."""

    is_block: ClassVar[bool] = True
    """A repeated block: what ``Component.blocks()`` returns to recompute and pipeline planners."""
