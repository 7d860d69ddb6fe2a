"""Predict the activation bytes a transformer block keeps for backward, from the IR.

The rules are what PyTorch autograd (torch 2.11-2.13) actually saves for the
lowered ``lf_ir.TransformerBlockModule`` on the **CPU kernel path**, derived op
by op and checked against :func:`lf_memory.measure_saved_bytes` (exact on the
tiny VLA and Llama 3 recipes). Legend: ``T = batch * seq`` tokens, ``d`` model
width, ``kv = kv_heads * head_dim``, ``H`` MLP hidden width, ``h`` query heads;
sizes in elements of the activation dtype (``dtype_bytes``, 4 for float32):

- LayerNorm (``native_layer_norm``): its input, ``mean`` and ``rstd`` (T each).
  RMSNorm (``nn.RMSNorm``, decomposed on CPU): its input, ``rstd`` (T) and
  ``x * rstd`` (T*d, needed for the weight gradient). The norm output (T*d) is
  saved once by the q/k/v (or up/gate) projections that share it.
- Linear: its input (weights are parameters, not counted).
- RoPE: ``cos`` and ``sin`` (batch*seq*head_dim each, shared by q and k); the
  rotated q and k are saved by attention, the unrotated ones by nobody.
- Attention through ``lf_kernels.attention`` (backend by ``select_backend``):
  mask-free ``full`` / ``causal`` use SDPA's CPU flash kernel
  (``_scaled_dot_product_flash_attention_for_cpu``), which saves q, k, v (k/v at
  kv width: GQA via ``enable_gqa``), the output (T*d, laid out so the output
  projection's input is a view of it) and the float32 log-sum-exp (batch*h*seq).
  With ``key_padding`` or a ``prefix_lm`` mask (``sdpa_mask``), k and v are
  expanded to h heads first (T*d each), SDPA saves the boolean mask converted to
  a float mask (mask_batch*seq*seq, mask_batch = batch with key padding, else 1),
  and the empty-row fix saves ``row_any`` (mask_batch*seq) and makes a new
  output-projection input (T*d).
- GELU MLP: up output (T*H, GELU input) and GELU output (T*H, down input).
  SwiGLU: gate and up outputs, ``silu(gate)`` and the product (4*T*H).
- Residual adds save nothing; the block's output is not counted (the next
  block counts it as its input).

Modes: ``"full"`` keeps only the block input (T*d), ``"selective"`` keeps the
input plus the outputs of the ops in :data:`lf_memory.SAC_SAVE_OPS` (every
projection output, the SDPA output and log-sum-exp) and recomputes the rest.
A ``key_padding`` (batch, seq) bool input is kept by a checkpointed block too
(batch*seq bytes); being shared by all blocks it is counted once per stack.

Assumptions: every activation in one dtype (float32 by default), CPU kernels,
no dropout, ``seq_q == seq_kv``. CUDA differs (fused RMSNorm, fp32 GQA expands
k/v, the memory-efficient kernel saves other tensors): calibrate there.
"""

from __future__ import annotations

from collections.abc import Sequence

from lf_ir import TransformerBlock

from ._recompute_modes import recompute_flags

__all__ = ["block_saved_bytes", "block_saved_terms", "stack_saved_bytes"]

_BLOCK_MODES = ("none", "full", "selective")
_LSE_BYTES = 4  # SDPA's log-sum-exp is float32 for float16 / bfloat16 / float32 inputs


def _attention_backend(mask: str, key_padding: bool) -> str:
    """``lf_kernels.select_backend`` for ``seq_q == seq_kv`` and no log-sum-exp."""
    if not key_padding and mask == "full":
        return "sdpa"
    if not key_padding and mask == "causal":
        return "sdpa_causal"
    return "sdpa_mask"


def _norm_terms(prefix: str, kind: str, tokens: int, dim: int) -> dict[str, int]:
    extra = 2 * tokens if kind == "layer" else tokens + tokens * dim
    return {f"{prefix}.input": tokens * dim, f"{prefix}.stats": extra}


def block_saved_terms(
    node: TransformerBlock, batch: int, seq: int, mode: str = "none", *,
    key_padding: bool = False, dtype_bytes: int = 4,
) -> dict[str, int]:
    """Bytes kept for backward by one block, by named term (see module docstring).

    Args:
        node: the block's IR node (``module.lf_node`` of a ``TransformerBlockModule``).
        batch, seq: micro-batch size and tokens per sample.
        mode: ``"none"``, ``"full"`` or ``"selective"`` (``"every_k"`` is a
            per-stack choice: see :func:`stack_saved_bytes`).
        key_padding: whether the block gets a (batch, seq) key-padding mask.
        dtype_bytes: bytes per activation element (4 float32, 2 bf16 / fp16).

    Returns:
        ``{term: bytes}``; the sum is :func:`block_saved_bytes`.

    Raises:
        TypeError: ``node`` is not an ``lf_ir.TransformerBlock``.
        ValueError: unknown ``mode``, or a non-positive size.
    """
    if not isinstance(node, TransformerBlock):
        raise TypeError(f"node must be an lf_ir.TransformerBlock, got {type(node).__name__}")
    if mode not in _BLOCK_MODES:
        raise ValueError(f"mode must be one of {list(_BLOCK_MODES)} for one block, got {mode!r}")
    for name, value in (("batch", batch), ("seq", seq), ("dtype_bytes", dtype_bytes)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    att, mlp = node.attention, node.mlp
    tokens, d, hidden = batch * seq, att.dim, mlp.hidden
    kv = att.kv_heads * att.head_dim
    lse = batch * att.heads * seq * _LSE_BYTES
    pad = {"key_padding": batch * seq} if key_padding and mode != "none" else {}
    if mode == "full":
        return {"input": tokens * d * dtype_bytes, **pad}
    if mode == "selective":
        mats = 3 if mlp.activation == "swiglu" else 2
        elems = tokens * (2 * d + 2 * kv) + tokens * d + tokens * (d + (mats - 1) * hidden)
        return {"input": tokens * d * dtype_bytes, "matmul_outputs": elems * dtype_bytes, "lse": lse, **pad}
    backend = _attention_backend(att.mask, key_padding)
    expand = backend == "sdpa_mask" and att.heads != att.kv_heads
    elems = _norm_terms("attn_norm", node.attn_norm.kind, tokens, d)
    elems["attention.input"] = tokens * d
    if att.rope is not None:
        elems["attention.rope_cos_sin"] = 2 * batch * seq * att.head_dim
    elems["attention.qkv"] = tokens * d + 2 * tokens * (d if expand else kv)
    elems["attention.out"] = tokens * d
    if backend == "sdpa_mask":
        mask_batch = batch if key_padding else 1
        elems["attention.mask"] = mask_batch * seq * seq
        elems["attention.row_any"] = mask_batch * seq
        elems["attention.o_input"] = tokens * d
    elems.update(_norm_terms("mlp_norm", node.mlp_norm.kind, tokens, d))
    elems["mlp.input"] = tokens * d
    elems["mlp.hidden"] = (4 if mlp.activation == "swiglu" else 2) * tokens * hidden
    terms = {key: value * dtype_bytes for key, value in elems.items()}
    terms["attention.lse"] = lse
    return terms


def block_saved_bytes(
    node: TransformerBlock, batch: int, seq: int, mode: str = "none", *,
    key_padding: bool = False, dtype_bytes: int = 4,
) -> int:
    """Bytes one block keeps for backward under ``mode``; see :func:`block_saved_terms`.

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
