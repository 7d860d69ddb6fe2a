"""Bytes a transformer block keeps for backward under each recompute option, from the IR.

Without recomputation the numbers are the IR's own: each node's
``saved_bytes(batch, seq, dtype_bytes)`` (``lf_ir._bytes`` states the rules:
what PyTorch autograd keeps on the CPU kernel path, checked against
``saved_tensors_hooks``); a ``TransformerBlock`` (and ``MMBlock``) is the sum of
its four children. Recomputation changes what survives the forward, and these
rules add that (legend: ``T = batch * seq`` tokens, ``d`` model width,
``kv = kv_heads * head_dim``, ``H`` MLP hidden width, ``h`` query heads,
``db = dtype_bytes``; all results in bytes):

- ``"full"``: the block input (T*d*db) only; the block re-runs its forward.
- ``"selective"`` (PyTorch selective activation checkpointing, see
  :data:`lf_memory.SAC_SAVE_OPS`): the input plus every matmul output (q, k, v,
  o: T*(2d + 2kv); MLP: T*(d + H) for GELU / quick-GELU, T*(d + 2H) for SwiGLU),
  the SDPA output (T*d) and its float32 log-sum-exp (batch*h*seq*4). Norms,
  activations, RoPE and masks are recomputed.
- ``"selective_attn"``: as ``"selective"`` but the attention core is recomputed
  too (only matmul outputs are kept): the SDPA output and log-sum-exp are not kept.

A ``key_padding`` (batch, seq) bool input is kept by a checkpointed block too
(batch*seq bytes); being shared by all blocks it is counted once per stack.
Rotary tables passed into a block (Qwen2-VL's M-RoPE) are the caller's tensors
and are not counted under recomputation, as measured.

Assumptions: one activation dtype, CPU kernels, no dropout, ``seq_q == seq_kv``;
a ViT attention split into several segments takes a dense-mask path the IR's
``MMAttention`` rule does not model. CUDA differs (fused RMSNorm, the
memory-efficient kernel): calibrate there.
"""

from __future__ import annotations

from collections.abc import Sequence

from lf_ir import TransformerBlock

from ._recompute_modes import recompute_flags

__all__ = ["BLOCK_OPTIONS", "block_saved_bytes", "block_saved_terms", "stack_saved_bytes"]

BLOCK_OPTIONS: tuple[str, ...] = ("none", "selective_attn", "selective", "full")
"""What recomputation can do to one block, by increasing recomputed FLOPs (see :func:`block_saved_terms`):
``"none"``, ``"selective"`` (keep matmul and attention outputs), ``"selective_attn"`` (keep matmul
outputs only) and ``"full"`` (keep the input only)."""

_LSE_BYTES = 4  # SDPA's log-sum-exp is float32 for float16 / bfloat16 / float32 inputs


def _matmul_output_elems(node: TransformerBlock, tokens: int) -> int:
    """Elements of every matmul output of a block: q, k, v, o and the MLP projections."""
    att, mlp = node.attention, node.mlp
    kv = att.kv_heads * att.head_dim
    mats = 3 if getattr(mlp, "activation", None) == "swiglu" else 2
    return tokens * (2 * att.dim + 2 * kv) + tokens * (att.dim + (mats - 1) * mlp.hidden)


def block_saved_terms(
    node: TransformerBlock, batch: int, seq: int, mode: str = "none", *,
    key_padding: bool = False, dtype_bytes: int = 4,
) -> dict[str, int]:
    """Bytes kept for backward by one block, by named term (see module docstring).

    Args:
        node: the block's IR node (``module.lf_node`` of a lowered block): an
            ``lf_ir.TransformerBlock`` or a subclass (``MMBlock``).
        batch, seq: micro-batch size and tokens per sample.
        mode: one of :data:`BLOCK_OPTIONS` (``"every_k"`` is a per-stack
            choice: see :func:`stack_saved_bytes`).
        key_padding: whether the block gets a (batch, seq) key-padding mask.
        dtype_bytes: bytes per activation element (4 float32, 2 bf16 / fp16).

    Returns:
        ``{term: bytes}``; the sum is :func:`block_saved_bytes`. ``"none"`` has one
        term per child node (``attn_norm``, ``attention``, ``mlp_norm``, ``mlp``),
        each the child's ``saved_bytes``.

    Raises:
        TypeError: ``node`` is not an ``lf_ir.TransformerBlock``.
        ValueError: unknown ``mode``, or a non-positive size.
    """
    if not isinstance(node, TransformerBlock):
        raise TypeError(f"node must be an lf_ir.TransformerBlock, got {type(node).__name__}")
    if mode not in BLOCK_OPTIONS:
        raise ValueError(f"mode must be one of {list(BLOCK_OPTIONS)} for one block, got {mode!r}")
    for name, value in (("batch", batch), ("seq", seq), ("dtype_bytes", dtype_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if mode == "none":
        return {
            "attn_norm": node.attn_norm.saved_bytes(batch, seq, dtype_bytes),
            "attention": node.attention.saved_bytes(batch, seq, dtype_bytes, key_padding=key_padding),
            "mlp_norm": node.mlp_norm.saved_bytes(batch, seq, dtype_bytes),
            "mlp": node.mlp.saved_bytes(batch, seq, dtype_bytes),
        }
    tokens = batch * seq
    terms = {"input": tokens * node.in_dim * dtype_bytes}
    if mode in ("selective", "selective_attn"):
        terms["matmul_outputs"] = _matmul_output_elems(node, tokens) * dtype_bytes
    if mode == "selective":
        terms["attention.out"] = tokens * node.attention.dim * dtype_bytes
        terms["attention.lse"] = batch * node.attention.heads * seq * _LSE_BYTES
    if key_padding:
        terms["key_padding"] = tokens
    return terms


def block_saved_bytes(
    node: TransformerBlock, batch: int, seq: int, mode: str = "none", *,
    key_padding: bool = False, dtype_bytes: int = 4,
) -> int:
    """Bytes one block keeps for backward under ``mode``; see :func:`block_saved_terms`.

    ``mode="none"`` equals the IR's ``node.saved_bytes(batch, seq, dtype_bytes, key_padding=...)``.

    Example:
        >>> from lf_ir import llama3_config
        >>> from lf_ir.recipes.llama3 import build_graph
        >>> block = build_graph(llama3_config("tiny")).components[0].nodes[1]
        >>> block_saved_bytes(block, 2, 24, "none"), block_saved_bytes(block, 2, 24, "full")
        (240768, 12288)
    """
    return sum(block_saved_terms(node, batch, seq, mode, key_padding=key_padding,
                                 dtype_bytes=dtype_bytes).values())


def stack_saved_bytes(
    nodes: Sequence[TransformerBlock], batch: int, seq: int, mode: str, *, every: int = 2,
    key_padding: bool = False, dtype_bytes: int = 4,
) -> int:
    """Bytes a stack of blocks keeps for backward under any mode, ``"every_k"`` included.

    Blocks are chosen as :func:`lf_memory.apply_recompute` chooses them; the
    shared ``key_padding`` input is counted once.

    Raises:
        ValueError: unknown ``mode`` or bad ``every`` (see :func:`recompute_flags`).
    """
    flags = recompute_flags(len(nodes), mode, every=every)
    block_mode = "selective" if mode == "selective" else "full"
    total = sum(block_saved_bytes(node, batch, seq, block_mode if flag else "none",
                                  key_padding=key_padding, dtype_bytes=dtype_bytes)
                for node, flag in zip(nodes, flags, strict=True))
    checkpointed = sum(flags)
    if key_padding and checkpointed > 1:
        total -= (checkpointed - 1) * batch * seq
    return total
