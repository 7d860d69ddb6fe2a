"""Bytes a block keeps for backward under each recompute option, from the IR.

Any lf-ir node whose class sets ``is_block`` is a block; the per-type rules
(``TransformerBlock``, ``MMBlock``, ``DiTBlock``, ``JointAttentionBlock``) live in
:mod:`lf_memory._block_rules`; the transformer block's are spelled out here.

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
(batch*seq bytes); being shared by all blocks it is counted once per stack, as are
the other inputs every block receives as one tensor (the ``shared_inputs`` term: a
DiT's time embedding, a joint block's key padding), and, in every mode, a DiT
stack's text context and RoPE tables (``DiTBlock.shared_saved_bytes``).
Rotary tables passed into a block (Qwen2-VL's M-RoPE) are the caller's tensors,
kept once per stack in every mode (:func:`stack_shared_bytes`).

Kernel path (``kernels``, as :func:`lf_memory.estimate_memory`'s): ``"cpu"`` (the default of these
byte rules, the IR's own: what ``measure_saved_bytes`` sees on the CPU) or ``"cuda"``, where RMSNorm runs
``aten::_fused_rms_norm`` and keeps its input and a float32 rstd only
(:func:`lf_ir._bytes.fused_rms_norm_saved`): a transformer block's two norms read the residual stream,
``stream_db`` bytes per element (:data:`STREAM_BYTES`, float32, under autocast over float32 weights; the
activation dtype when FSDP2 casts the parameters), and nodes whose ``saved_bytes`` takes ``kernels`` (the Wan
DiT block's q/k norms, which read the projections' ``dtype_bytes`` outputs) get it. Only ``"none"`` keeps
norm statistics, so the checkpointed modes are the same on both paths.

Assumptions: one activation dtype, no dropout, ``seq_q == seq_kv``;
a ViT attention split into several segments takes a dense-mask path the IR's
``MMAttention`` rule does not model. CUDA's memory-efficient attention kernel is not modelled: calibrate there.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import lru_cache

from lf_ir import Norm, TransformerBlock

from ._block_rules import block_profile
from ._recompute_modes import recompute_flags

__all__ = ["BLOCK_OPTIONS", "KERNELS", "STREAM_BYTES", "block_options", "block_saved_bytes", "block_saved_terms",
           "is_block", "node_saved_bytes", "stack_saved_bytes"]

KERNELS: tuple[str, ...] = ("cpu", "cuda")
"""Kernel paths of the byte rules (see the module docstring)."""

STREAM_BYTES = 4
"""Bytes per element of a decoder's residual stream on CUDA when the caller gives no ``stream_db``: float32, what
autocast over float32 weights carries between blocks (FSDP2 with bf16 / fp16 ``param_dtype``: pass ``stream_db``
equal to the activation dtype's bytes, as :func:`lf_memory.estimate_memory` does for ZeRO-2/3 plans)."""

BLOCK_OPTIONS: tuple[str, ...] = ("none", "selective_attn", "selective", "full")
"""What recomputation can do to one block, by increasing recomputed FLOPs (see :func:`block_saved_terms`):
``"none"``, ``"selective"`` (keep matmul and attention outputs), ``"selective_attn"`` (keep matmul
outputs only) and ``"full"`` (keep the input only)."""

SHARED_TERMS: tuple[str, ...] = ("key_padding", "shared_inputs")
"""Terms of :func:`block_saved_terms` that are the same tensor in every block of a stack (counted once)."""


def is_block(node) -> bool:
    """Whether ``node`` is a repeated block (its class sets lf-ir's ``is_block``): a recompute unit."""
    return bool(getattr(type(node), "is_block", False))


def block_options(node) -> tuple[str, ...]:
    """The options of :data:`BLOCK_OPTIONS` a block can take: all with a rule in :mod:`lf_memory._block_rules`,
    else ``("none", "full")``."""
    return BLOCK_OPTIONS if block_profile(node, 1, _probe_seq(node), 1) is not None else ("none", "full")


def _probe_seq(node) -> int:
    return getattr(node, "suffix_len", 0) + 1


def check_kernels(kernels: str) -> None:
    """Raise ValueError unless ``kernels`` is one of :data:`KERNELS`."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be 'cpu' or 'cuda', got {kernels!r}")


def norm_saved_bytes(norm, batch: int, seq: int, db: int, kernels: str = "cpu", stream_db: int | None = None) -> int:
    """A residual-stream norm (a transformer block's two, a standalone ``Norm``): on CUDA an RMSNorm keeps its
    ``stream_db`` input (None: :data:`STREAM_BYTES`) and a float32 rstd; otherwise ``norm.saved_bytes`` at ``db``."""
    if kernels == "cuda" and norm.kind == "rms":
        return norm.saved_bytes(batch, seq, STREAM_BYTES if stream_db is None else stream_db, kernels="cuda")
    return norm.saved_bytes(batch, seq, db)


@lru_cache(maxsize=256)
def _takes_kernels(cls: type) -> bool:
    rule = getattr(cls, "saved_bytes", None)
    return rule is not None and "kernels" in inspect.signature(rule).parameters


def node_saved_bytes(node, batch: int, seq: int, db: int, kernels: str = "cpu",
                     stream_db: int | None = None) -> int:
    """``node.saved_bytes`` on the ``kernels`` path: a ``Norm`` by :func:`norm_saved_bytes`, a node whose rule
    takes ``kernels`` with it, any other node its plain rule (no CUDA rule: the CPU bytes).

    Raises:
        AttributeError: the node has no ``saved_bytes``; what the node's rule raises.
    """
    if isinstance(node, Norm):
        return norm_saved_bytes(node, batch, seq, db, kernels, stream_db)
    if kernels != "cpu" and _takes_kernels(type(node)):
        return node.saved_bytes(batch, seq, db, kernels=kernels)
    return node.saved_bytes(batch, seq, db)


def _none_terms(node, batch: int, seq: int, key_padding: bool, db: int, kernels: str,
                stream_db: int | None) -> dict[str, int]:
    if isinstance(node, TransformerBlock):
        return {
            "attn_norm": norm_saved_bytes(node.attn_norm, batch, seq, db, kernels, stream_db),
            "attention": node.attention.saved_bytes(batch, seq, db, key_padding=key_padding),
            "mlp_norm": norm_saved_bytes(node.mlp_norm, batch, seq, db, kernels, stream_db),
            "mlp": node.mlp.saved_bytes(batch, seq, db),
        }
    return {"block": node_saved_bytes(node, batch, seq, db, kernels, stream_db)}


def block_saved_terms(
    node, batch: int, seq: int, mode: str = "none", *, key_padding: bool = False, dtype_bytes: int = 4,
    kernels: str = "cpu", stream_db: int | None = None,
) -> dict[str, int]:
    """Bytes kept for backward by one block, by named term (see module docstring).

    Args:
        node: the block's IR node (``module.lf_node`` of a lowered block): any node whose class
            sets ``is_block`` (``TransformerBlock``, ``MMBlock``, ``DiTBlock``, ``JointAttentionBlock``).
        batch, seq: micro-batch size and tokens per sample (a joint block: prefix + suffix).
        mode: one of :func:`block_options` of the node (``"every_k"`` is a per-stack
            choice: see :func:`stack_saved_bytes`).
        key_padding: whether a transformer block gets a (batch, seq) key-padding mask (other blocks
            count the masks they take themselves and ignore it).
        dtype_bytes: bytes per activation element (4 float32, 2 bf16 / fp16).
        kernels: ``"cpu"`` (the IR's CPU rules) or ``"cuda"`` (fused RMSNorm; see the module docstring).
        stream_db: bytes per element of the residual stream a transformer block's norms read with
            ``kernels="cuda"`` (None: :data:`STREAM_BYTES`); ignored on the CPU path.

    Returns:
        ``{term: bytes}``; the sum is :func:`block_saved_bytes`. ``"none"`` of a transformer block has one
        term per child node (``attn_norm``, ``attention``, ``mlp_norm``, ``mlp``), each the child's
        ``saved_bytes`` on the ``kernels`` path; of another block one term ``block``, its ``saved_bytes``.
        Checkpointed: ``input``, ``matmul_outputs``, ``attention.out``, ``attention.lse`` as the mode keeps
        them, and the :data:`SHARED_TERMS`.

    Raises:
        TypeError: ``node`` is not a block.
        ValueError: unknown ``mode`` or one the block has no rule for, a non-positive size, or unknown
            ``kernels``.
    """
    check_kernels(kernels)
    if not is_block(node):
        raise TypeError(f"node must be an lf-ir block (a node class with is_block), got {type(node).__name__}")
    if mode not in BLOCK_OPTIONS:
        raise ValueError(f"mode must be one of {list(BLOCK_OPTIONS)} for one block, got {mode!r}")
    for name, value in (("batch", batch), ("seq", seq), ("dtype_bytes", dtype_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if mode == "none":
        return _none_terms(node, batch, seq, key_padding, dtype_bytes, kernels, stream_db)
    profile = block_profile(node, batch, seq, dtype_bytes)
    if profile is None:
        if mode != "full":
            raise ValueError(f"block {node.name!r} ({type(node).__name__}) has no selective recompute rule "
                             f"(lf_memory._block_rules.register_block_rule); options: none, full; got {mode!r}")
        terms = {"input": batch * seq * node.in_dim * dtype_bytes}
    else:
        terms = {"input": profile.inputs}
        if mode in ("selective", "selective_attn"):
            terms["matmul_outputs"] = profile.matmul_outputs
        if mode == "selective":
            terms["attention.out"] = profile.attention_outputs
            terms["attention.lse"] = profile.attention_lse
        if profile.shared_inputs:
            terms["shared_inputs"] = profile.shared_inputs
    if key_padding and isinstance(node, TransformerBlock):  # other blocks count their own (shared_inputs)
        terms["key_padding"] = batch * seq
    return terms


def block_saved_bytes(
    node, batch: int, seq: int, mode: str = "none", *, key_padding: bool = False, dtype_bytes: int = 4,
    kernels: str = "cpu", stream_db: int | None = None,
) -> int:
    """Bytes one block keeps for backward under ``mode``; see :func:`block_saved_terms`.

    ``mode="none"`` with ``kernels="cpu"`` equals the IR's ``node.saved_bytes(batch, seq, dtype_bytes)`` (with
    ``key_padding=`` for a transformer block). Shared terms are counted here; :func:`stack_saved_bytes` counts
    them once.

    Example:
        >>> from lf_ir import llama3_config
        >>> from lf_ir.recipes.llama3 import build_graph
        >>> block = build_graph(llama3_config("tiny")).components[0].nodes[1]
        >>> block_saved_bytes(block, 2, 24, "none"), block_saved_bytes(block, 2, 24, "full")
        (240768, 12288)
    """
    return sum(block_saved_terms(node, batch, seq, mode, key_padding=key_padding, dtype_bytes=dtype_bytes,
                                 kernels=kernels, stream_db=stream_db).values())


def stack_shared_bytes(node, batch: int, seq: int, dtype_bytes: int) -> int:
    """Caller tensors a stack of such blocks keeps once in every mode: a DiT's text context and RoPE tables
    (``shared_saved_bytes``), a Qwen2-VL block's rotary tables (``attention.rope_table_bytes``); else 0.
    No norm statistics: the same on the CPU and CUDA kernel paths."""
    rule = getattr(node, "shared_saved_bytes", None)
    if rule is None:
        rule = getattr(getattr(node, "attention", None), "rope_table_bytes", None)
    return rule(batch, seq, dtype_bytes) if rule is not None else 0


def stack_terms(per_block: Sequence[dict[str, int]]) -> int:
    """Sum of a stack's block terms with each of :data:`SHARED_TERMS` counted once (its largest value)."""
    total = sum(v for terms in per_block for k, v in terms.items() if k not in SHARED_TERMS)
    return total + sum(max((terms.get(k, 0) for terms in per_block), default=0) for k in SHARED_TERMS)


def stack_saved_bytes(
    nodes: Sequence, batch: int, seq: int, mode: str, *, every: int = 2,
    key_padding: bool = False, dtype_bytes: int = 4, kernels: str = "cpu", stream_db: int | None = None,
) -> int:
    """Bytes a stack of blocks keeps for backward under any mode, ``"every_k"`` included.

    Blocks are chosen as :func:`lf_memory.apply_recompute` chooses them; the shared
    inputs (:data:`SHARED_TERMS`, :func:`stack_shared_bytes`) are counted once. ``kernels`` / ``stream_db``: as
    :func:`block_saved_terms`.

    Raises:
        ValueError: unknown ``mode`` or bad ``every`` (see :func:`recompute_flags`).
    """
    flags = recompute_flags(len(nodes), mode, every=every)
    block_mode = "selective" if mode == "selective" else "full"
    per_block = [block_saved_terms(node, batch, seq, block_mode if flag else "none",
                                   key_padding=key_padding, dtype_bytes=dtype_bytes, kernels=kernels,
                                   stream_db=stream_db)
                 for node, flag in zip(nodes, flags, strict=True)]
    shared = stack_shared_bytes(nodes[0], batch, seq, dtype_bytes) if nodes else 0
    return stack_terms(per_block) + shared
