"""Saved-activation bytes of one node on one rank: recompute mode, tensor/sequence/context split.

Legend: ``T = batch * seq / cp`` local tokens, ``d`` width, ``H`` MLP hidden width,
``db`` bytes per activation element.

- ``lf_ir.TransformerBlock`` (and subclasses), no recompute: its children's
  ``saved_bytes``. Tensor parallelism divides what the attention and the MLP keep
  beyond their input (q/k/v, the attention output, the log-sum-exp, the MLP hidden
  tensors); sequence parallelism divides the rest (norm inputs and statistics,
  projection inputs) except the RoPE tables, which every rank keeps (Korthikanti et
  al. 2022, arXiv 2205.05198, section 4). ``"full"`` keeps the block input
  (divided by sp); other modes (``"selective"``...) keep
  :func:`lf_memory.block_saved_bytes` of the mode: the input divided by sp, the
  rest (matmul outputs) by tp.
- Other blocks (``DiTBlock``, ``JointAttentionBlock``: any node class with
  ``is_block``): without recompute their ``saved_bytes``, 70% of it divided by tp
  as for a transformer block; recomputed, :func:`lf_memory.block_saved_terms` of the
  mode (the input divided by sp, matmul and attention outputs by tp).
- ``kernels="cuda"``: RMSNorm runs fused (``aten::_fused_rms_norm``), which keeps its
  input and a float32 ``rstd`` only (:func:`lf_ir._bytes.fused_rms_norm_saved`), not the CPU
  decomposition's float32 input and ``x * rstd``. A decoder's norms (a transformer block's two, a
  standalone ``Norm`` such as the final one) read the residual stream, ``stream_db`` bytes per
  element (float32 under autocast over float32 weights); the DiT's q/k norms read the projections'
  outputs (``db``; nodes whose ``saved_bytes`` takes ``kernels``).
- Any other node: its ``saved_bytes`` (nodes without one: ``T * out_dim * db``),
  divided by tp only with sequence parallelism. Nodes whose ``seq_split`` is
  ``"none"`` see the whole sequence (cp does not divide their tokens).
"""

from __future__ import annotations

from functools import lru_cache

from lf_ir import Norm, TransformerBlock

from ._saved_bytes import block_saved_bytes, block_saved_terms, is_block, node_saved_bytes, norm_saved_bytes

_TP_TERMS = frozenset({"attention.qkv", "mlp.hidden", "matmul_outputs", "attention.lse", "attention.out"})
_KEPT_TERMS = frozenset({"attention.rope"})


def _split(terms: dict[str, float], tp: int, sp: bool) -> float:
    total = 0.0
    for key, value in terms.items():
        if key in _TP_TERMS:
            total += value / tp
        elif key in _KEPT_TERMS:
            total += value
        else:
            total += value / tp if sp else value
    return total


def _own_saved(node, batch: int, seq: int, db: int, kernels: str, stream_db: int) -> int | None:
    """``node.saved_bytes`` on the ``kernels`` path (:func:`lf_memory._saved_bytes.node_saved_bytes`, the
    planner's rule too); None if the node has no rule (or raises NotImplementedError)."""
    if not isinstance(node, Norm) and getattr(node, "saved_bytes", None) is None:
        return None
    try:
        return node_saved_bytes(node, batch, seq, db, kernels, stream_db)
    except NotImplementedError:
        return None


def _block_terms(node, batch: int, seq: int, db: int, mode: str, kernels: str,
                 stream_db: int) -> dict[str, float]:
    tokens = batch * seq
    width = tokens * node.in_dim * db
    if mode == "full":
        return {"input": width}
    if mode != "none":
        kept = block_saved_bytes(node, batch, seq, mode, dtype_bytes=db, kernels=kernels, stream_db=stream_db)
        return {"input": width, "matmul_outputs": kept - width}
    att = node.attention
    rope = 2 * tokens * att.head_dim * db if getattr(att, "rope", None) is not None else 0
    return {"norms": norm_saved_bytes(node.attn_norm, batch, seq, db, kernels, stream_db)
            + norm_saved_bytes(node.mlp_norm, batch, seq, db, kernels, stream_db),
            "input": 2 * width, "attention.rope": rope,
            "attention.qkv": att.saved_bytes(batch, seq, db) - width - rope,
            "mlp.hidden": node.mlp.saved_bytes(batch, seq, db) - width}


@lru_cache(maxsize=65536)
def node_saved(node, batch: int, seq: int, db: int, mode: str, tp: int, sp: bool, cp: int,
               kernels: str = "cpu", stream_db: int | None = None) -> float:
    """Bytes ``node`` keeps for backward on one rank (see the module docstring).

    Args:
        node: an IR node (a representative: the result is memoized on it).
        batch, seq: micro-batch samples and tokens per sample before the cp split.
        db: bytes per activation element.
        mode: ``"none"``, ``"full"`` or ``"selective"`` (blocks; other nodes ignore it).
        tp, sp, cp: the component's tensor-parallel degree, sequence parallel, context-parallel degree.
        kernels: ``"cpu"`` (lf-ir's measured CPU rules) or ``"cuda"`` (fused RMSNorm).
        stream_db: bytes per element of the residual stream the decoder norms read on CUDA (None: ``db``).
    """
    stream_db = db if stream_db is None else stream_db
    local = seq if node.seq_split == "none" else max(seq // cp, 1)
    if isinstance(node, TransformerBlock):
        try:
            return _split(_block_terms(node, batch, local, db, mode, kernels, stream_db), tp, sp)
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            pass
    if is_block(node) and mode != "none" and not isinstance(node, TransformerBlock):
        try:
            return _split(block_saved_terms(node, batch, local, mode, dtype_bytes=db, kernels=kernels,
                                            stream_db=stream_db), tp, sp)
        except ValueError:  # no selective rule for this block type: the full recompute bytes
            return _split(block_saved_terms(node, batch, local, "full", dtype_bytes=db, kernels=kernels,
                                            stream_db=stream_db), tp, sp)
    saved = _own_saved(node, batch, local, db, kernels, stream_db)
    if saved is None:
        saved = batch * local * node.out_dim * db
    if is_block(node):
        return saved * (0.3 * (1 / tp if sp else 1) + 0.7 / tp)
    return saved / tp if sp else saved


RING_SCORE_BYTES = 12
"""Bytes per score entry while a ring-attention block runs lf-kernels' explicit-softmax path: the float32
scores, the float32 probabilities and their float32 gradient when the backward recomputes the block (the
dense bool mask adds one more byte per entry, shared by the heads)."""


def ring_block_scores(node, batch: int, seq: int, cp: int, tp: int) -> float:
    """Peak bytes of one ring-attention block of ``node``'s self-attention under ring context parallelism.

    lf-parallel's ring attention runs a ``full`` mask without packed documents on cuDNN / flash kernels
    (O(seq) memory per block), but every other mask on an explicit softmax over the block: ``batch x heads /
    tp x (seq / cp)^2`` entries of :data:`RING_SCORE_BYTES` (75,660 tokens per rank x 12 heads: 275 GB of
    float32 scores alone). Only one block is live at a time, so this is a temporary, not an activation.
    0 for nodes without a self-attention child (``node.attention``) or with a plain full mask.
    """
    from lf_ir import as_mask

    att = getattr(node, "attention", None)
    if att is None or not hasattr(att, "heads") or not hasattr(att, "mask"):
        return 0.0
    mask = as_mask(att.mask)
    if mask.kind == "full" and not mask.packed:
        return 0.0
    local = seq / cp
    return batch * att.heads / tp * local * local * RING_SCORE_BYTES
