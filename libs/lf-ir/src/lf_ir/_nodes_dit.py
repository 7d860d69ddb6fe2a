"""Diffusion-transformer block nodes: q/k-normed self- and cross-attention and the adaLN-modulated
block that joins them to a tanh-GELU :class:`~lf_ir._nodes_vision.FeedForward` (Wan2.1, arXiv
2503.20314; DiT, arXiv 2212.09748).

``seq`` is the latent video tokens per sample; cross-attention reads ``context_len``
text tokens per sample (a node field, since the FLOPs depend on it).

Torch-free: lowering rules live in ``_lower_video.py``.
"""

from __future__ import annotations

from typing import ClassVar

from lf_ir import _bytes, _bytes_video
from lf_ir._base import SeqSplit, _Node
from lf_ir._nodes_video import AdaLNModulation, RoPE3D
from lf_ir._nodes_vision import FeedForward


class DiTAttention(_Node, frozen=True, kw_only=True, tag="dit_attention"):
    """Full (unmasked) multi-head attention with biases and q/k RMSNorm over the whole width.

    Self-attention (``cross=False``): (batch, seq, dim) -> (batch, seq, dim), q and k
    rotated by :class:`RoPE3D` over the latent grid. Cross-attention (``cross=True``):
    queries from the video tokens, keys/values from ``context_len`` text tokens of
    width ``dim``, no rotation. ``q = rms_norm(to_q(x))`` normalizes over all heads
    together (diffusers ``qk_norm="rms_norm_across_heads"``): tensor parallelism
    splits the norm weights with q/k (dim 0) but must all-reduce the mean square.
    """

    dim: int
    """Model width."""
    heads: int
    """Attention heads; must divide ``dim``."""
    cross: bool = False
    """True: keys/values come from the text context."""
    context_len: int = 0
    """Cross-attention only: text tokens per sample (for FLOPs)."""
    rope: RoPE3D | None = None
    """Self-attention only: 3D rotary settings (None: no rotation)."""
    eps: float = 1e-6
    """RMSNorm epsilon."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim, heads=self.heads)
        if self.dim % self.heads:
            self._fail(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.cross:
            self._positive(context_len=self.context_len)
            if self.rope is not None:
                self._fail("cross-attention takes no rope")
        if self.rope is not None:
            problem = self.rope.problem(self.head_dim)
            if problem:
                self._fail(f"rope: {problem}")
        if not self.eps > 0:
            self._fail(f"eps must be positive, got {self.eps!r}")

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
        d = self.dim
        shapes: dict[str, tuple[int, ...]] = {}
        for proj in ("q", "k", "v", "o"):
            shapes[f"{proj}.weight"] = (d, d)
            shapes[f"{proj}.bias"] = (d,)
        shapes["norm_q.weight"] = (d,)
        shapes["norm_k.weight"] = (d,)
        return shapes

    seq_split: ClassVar[SeqSplit] = "context"

    def tp_dims(self) -> dict[str, int | None]:
        dims: dict[str, int | None] = {f"{p}.{w}": 0 for p in "qkv" for w in ("weight", "bias")}
        dims.update({"o.weight": 1, "o.bias": None, "norm_q.weight": 0, "norm_k.weight": 0})
        return dims

    def forward_flops(self, batch: int, seq: int) -> int:
        d = self.dim
        kv_len = self.context_len if self.cross else seq
        proj = 2 * batch * (2 * seq + 2 * kv_len) * d * d
        return proj + 4 * batch * seq * kv_len * d

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Projections, q/k RMSNorms, RoPE and a flash-style core (no score matrix); see ``lf_ir._bytes_video``."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes_video.dit_attention_forward(self, batch, seq, dtype_bytes, _bytes.params_bytes(self, 1))

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, kernels: str = "cpu") -> int:
        """Through lf_kernels' CPU flash path: the q projection's input (T*dim), q, the output (T*dim each), k and
        v (batch * kv_len * dim each; kv_len = ``context_len`` or ``seq``), the q and k RMSNorms (``kernels="cpu"``:
        float32 input, ``x * rstd`` and rstd; ``"cuda"``: torch's fused kernel keeps the input and a float32 rstd,
        :func:`lf_ir._bytes.fused_rms_norm_saved`) and the float32 log-sum-exp (batch*heads*seq*4). Bytes.

        Not counted (see :meth:`shared_saved_bytes`): the text context the cross-attention's k/v projections
        keep and the 3D RoPE tables the rotation keeps, tensors every block shares.

        Raises:
            ValueError: ``kernels`` not ``"cpu"`` or ``"cuda"``.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return _bytes_video.dit_attention_saved(self, batch, seq, dtype_bytes, kernels)

    def shared_saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Caller tensors this node keeps that every block of the model shares (count once per model).

        Cross-attention: the projected text context (batch, context_len, dim). Self-attention with RoPE: the
        float32 cos and sin tables (seq, head_dim) each (shared by the batch). Otherwise 0.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        if self.cross:
            return batch * self.context_len * self.dim * dtype_bytes
        return 2 * seq * self.head_dim * 4 if self.rope is not None else 0


class DiTBlock(_Node, frozen=True, kw_only=True, tag="dit_block"):
    """Wan2.1 block on (batch, seq, dim) video tokens, conditioned on time and text.

    With ``shift, scale, gate, c_shift, c_scale, c_gate`` from the block's
    :class:`AdaLNModulation` of the shared time projection (float32):

        x = x + self_attn(ln(x) * (1 + scale) + shift) * gate
        x = x + cross_attn(norm2(x), text)
        x = x + ffn(ln(x) * (1 + c_scale) + c_shift) * c_gate

    ``ln`` has no affine parameters; ``norm2`` is an affine LayerNorm when
    ``cross_attn_norm`` (Wan2.1), the identity otherwise. Norms run in float32.
    """

    modulation: AdaLNModulation
    """The block's (1, 6, dim) table."""
    self_attn: DiTAttention
    """Self-attention over the video tokens (with 3D RoPE)."""
    cross_attn: DiTAttention
    """Cross-attention to the projected text tokens."""
    ffn: FeedForward
    """Feed-forward (Wan: ``activation="gelu_tanh"``, with biases)."""
    cross_attn_norm: bool = True
    """Whether an affine LayerNorm precedes the cross-attention."""
    eps: float = 1e-6
    """LayerNorm epsilon."""

    def __post_init__(self) -> None:
        dims = {self.modulation.dim, self.self_attn.dim, self.cross_attn.dim, self.ffn.dim}
        if len(dims) != 1:
            self._fail(f"sub-node widths disagree: {sorted(dims)}")
        if self.modulation.chunks != 6:
            self._fail(f"modulation must have 6 chunks, got {self.modulation.chunks}")
        if self.self_attn.cross or not self.cross_attn.cross:
            self._fail("self_attn must have cross=False and cross_attn cross=True")
        if not self.eps > 0:
            self._fail(f"eps must be positive, got {self.eps!r}")

    @property
    def dim(self) -> int:
        return self.self_attn.dim

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return self.dim

    def children(self) -> dict[str, _Node]:
        """Sub-nodes by the attribute name of their lowered module."""
        return {"modulation": self.modulation, "self_attn": self.self_attn, "cross_attn": self.cross_attn,
                "ffn": self.ffn}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for key, child in self.children().items():
            shapes.update({f"{key}.{k}": v for k, v in child.param_shapes().items()})
        if self.cross_attn_norm:
            shapes.update({"norm2.weight": (self.dim,), "norm2.bias": (self.dim,)})
        return shapes

    seq_split: ClassVar[SeqSplit] = "context"

    is_block: ClassVar[bool] = True
    """A repeated block: what ``Component.blocks()`` returns to recompute and pipeline planners."""

    def tp_dims(self) -> dict[str, int | None]:
        dims: dict[str, int | None] = {}
        for key, child in self.children().items():
            dims.update({f"{key}.{k}": v for k, v in child.tp_dims().items()})
        if self.cross_attn_norm:
            dims.update({"norm2.weight": None, "norm2.bias": None})
        return dims

    def forward_flops(self, batch: int, seq: int) -> int:
        return sum(c.forward_flops(batch, seq) for c in self.children().values())

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The children's traffic plus the float32 norms, modulations, gated residuals and casts (T*dim each op)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        tokens, d = batch * seq, self.dim
        f32_ops = 3 * 2 + 2 * 3 + 1 * 2 + 3 * 3  # three norms, two modulations (mul, add), gated residuals
        casts = 8 * tokens * d * dtype_bytes  # into and out of float32 around each of the four steps
        children = sum(c.forward_bytes(batch, seq, dtype_bytes) for c in self.children().values())
        return children + f32_ops * tokens * d * 4 + casts

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int, *, kernels: str = "cpu") -> int:
        """The children's bytes (self- and cross-attention with ``kernels``, see
        :meth:`DiTAttention.saved_bytes`, and the FFN) plus, in float32 unless said: the block's
        modulation (batch*6*dim; the gates are views of it) and ``1 + scale`` twice (batch*dim each); the
        input and stats of the three LayerNorms (T*dim + 2T each; the affine ``norm2`` of a non-float32
        model adds its weights' float32 copies, 2*dim) and the outputs of norm1 and norm3 (T*dim each); the
        attention output (T*dim, activation dtype) and the float32 FFN output (T*dim) kept by the gates.

        Shared tensors (the text context, the RoPE tables) are not counted: :meth:`shared_saved_bytes`.
        """
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        kids = (self.self_attn.saved_bytes(batch, seq, dtype_bytes, kernels=kernels)
                + self.cross_attn.saved_bytes(batch, seq, dtype_bytes, kernels=kernels)
                + self.ffn.saved_bytes(batch, seq, dtype_bytes))
        return kids + _bytes_video.dit_block_extra_saved(self, batch, seq, dtype_bytes)

    def shared_saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The text context and the RoPE tables every block keeps (count once per block stack)."""
        return (self.self_attn.shared_saved_bytes(batch, seq, dtype_bytes)
                + self.cross_attn.shared_saved_bytes(batch, seq, dtype_bytes))
