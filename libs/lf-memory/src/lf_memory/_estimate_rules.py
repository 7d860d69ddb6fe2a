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
- ``DiTBlock`` (no ``saved_bytes`` rule in lf-ir yet): an estimate counted like
  the transformer block from the Wan2.1 forward: self-attention 13 ``T*d`` tensors
  (the float32 norm input counts 2 at bf16), cross-attention 5, the modulated
  feed-forward 3 plus ``2*T*H`` hidden, and two float32 log-sum-exps; ``full``
  keeps the input, ``selective`` the input and the matmul outputs (``9*T*d + T*H``).
- ``kernels="cuda"``: RMSNorm runs fused (``torch._fused_rms_norm``), which keeps its
  input and a float32 ``rstd`` only, not the CPU decomposition's float32 input and ``x * rstd``.
- Any other node: its ``saved_bytes`` (nodes without one: ``T * out_dim * db``),
  divided by tp only with sequence parallelism. Nodes whose ``seq_split`` is
  ``"none"`` see the whole sequence (cp does not divide their tokens).
"""

from __future__ import annotations

from functools import lru_cache

from lf_ir import TransformerBlock
from lf_ir._nodes_dit import DiTBlock

from ._saved_bytes import block_saved_bytes

_TP_TERMS = frozenset({"attention.qkv", "mlp.hidden", "matmul_outputs", "attention.lse"})
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


def _norm_saved(norm, batch: int, seq: int, db: int, kernels: str) -> int:
    if kernels == "cuda" and norm.kind == "rms":
        return batch * seq * (norm.dim * db + 4)
    return norm.saved_bytes(batch, seq, db)


def _block_terms(node, batch: int, seq: int, db: int, mode: str, kernels: str) -> dict[str, float]:
    tokens = batch * seq
    width = tokens * node.in_dim * db
    if mode == "full":
        return {"input": width}
    if mode != "none":
        return {"input": width, "matmul_outputs": block_saved_bytes(node, batch, seq, mode, dtype_bytes=db) - width}
    att = node.attention
    rope = 2 * tokens * att.head_dim * db if getattr(att, "rope", None) is not None else 0
    return {"norms": _norm_saved(node.attn_norm, batch, seq, db, kernels)
            + _norm_saved(node.mlp_norm, batch, seq, db, kernels),
            "input": 2 * width, "attention.rope": rope,
            "attention.qkv": att.saved_bytes(batch, seq, db) - width - rope,
            "mlp.hidden": node.mlp.saved_bytes(batch, seq, db) - width}


def _dit_terms(node: DiTBlock, tokens: int, batch: int, seq: int, db: int, mode: str) -> dict[str, int]:
    d, hidden, heads = node.dim, node.ffn.hidden, node.self_attn.heads
    if mode == "full":
        return {"input": tokens * d * db}
    lse = 2 * batch * heads * seq * 4
    if mode == "selective":
        return {"input": tokens * d * db, "matmul_outputs": (9 * tokens * d + tokens * hidden) * db, "lse": lse}
    return {"input": 4 * tokens * d * db, "attention.qkv": 11 * tokens * d * db,
            "norm": 6 * tokens * d * db, "mlp.hidden": 2 * tokens * hidden * db, "attention.lse": lse}


@lru_cache(maxsize=65536)
def node_saved(node, batch: int, seq: int, db: int, mode: str, tp: int, sp: bool, cp: int,
               kernels: str = "cpu") -> float:
    """Bytes ``node`` keeps for backward on one rank (see the module docstring).

    Args:
        node: an IR node (a representative: the result is memoized on it).
        batch, seq: micro-batch samples and tokens per sample before the cp split.
        db: bytes per activation element.
        mode: ``"none"``, ``"full"`` or ``"selective"`` (blocks; other nodes ignore it).
        tp, sp, cp: the component's tensor-parallel degree, sequence parallel, context-parallel degree.
        kernels: ``"cpu"`` (lf-ir's measured CPU rules) or ``"cuda"`` (fused RMSNorm).
    """
    local = seq if node.seq_split == "none" else max(seq // cp, 1)
    if isinstance(node, TransformerBlock):
        try:
            return _split(_block_terms(node, batch, local, db, mode, kernels), tp, sp)
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            pass
    if isinstance(node, DiTBlock):
        return _split(_dit_terms(node, batch * local, batch, local, db, mode), tp, sp)
    rule = getattr(node, "saved_bytes", None)
    try:
        saved = rule(batch, local, db) if rule is not None else None
    except NotImplementedError:
        saved = None
    if saved is None:
        saved = batch * local * node.out_dim * db
    if isinstance(node, TransformerBlock):
        return saved * (0.3 * (1 / tp if sp else 1) + 0.7 / tp)
    return saved / tp if sp else saved
