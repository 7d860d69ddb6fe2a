"""What each kind of IR block keeps for backward under each recompute option, and what that option re-runs.

A block is any lf-ir node whose class sets ``is_block`` (``TransformerBlock``,
``MMBlock``, ``DiTBlock``, ``JointAttentionBlock``, ...). Every block gets the
options ``"none"`` (its own ``saved_bytes``) and ``"full"`` (its inputs only;
the block re-runs its ``forward_flops``). The selective options need to know the
block's matmul and attention outputs; a rule for them is registered per node
type with :func:`register_block_rule` (subclasses inherit their parent's rule).
A block type without a rule is planned with ``"none"`` / ``"full"`` only.

A rule ``rule(node, batch, seq, dtype_bytes)`` returns a :class:`BlockProfile`
in bytes and FLOPs (legend: ``T = batch * seq`` tokens, ``db`` bytes per
activation element; the log-sum-exp is float32 whatever ``db``):

- ``inputs``: what a checkpointed block keeps (its activation inputs);
- ``matmul_outputs``: the outputs of every ``mm`` / ``addmm`` / ``bmm`` (kept by
  ``"selective"`` and ``"selective_attn"``, :data:`lf_memory.SAC_MATMUL_OPS`);
- ``attention_outputs``, ``attention_lse``: the fused attention's outputs and
  log-sum-exps (kept by ``"selective"`` only, :data:`lf_memory.SAC_SAVE_OPS`);
- ``attention_flops``: the FLOPs of the attention cores (score and value products),
  what ``"selective_attn"`` runs again.

Checked against ``saved_tensors_hooks`` (``lf_memory.measure_saved_bytes``) on the
CPU for every rule below: exact on the tiny recipes in float32 and bfloat16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lf_ir import DiTBlock, JointAttentionBlock, TransformerBlock

__all__ = ["BlockProfile", "block_profile", "register_block_rule"]

LSE_BYTES = 4
"""SDPA's log-sum-exp is float32 for float16 / bfloat16 / float32 inputs."""


@dataclass(frozen=True)
class BlockProfile:
    """Bytes and FLOPs of one block on ``batch`` samples of ``seq`` tokens (module docstring)."""

    inputs: int
    """Bytes a fully checkpointed block keeps: its activation inputs."""
    matmul_outputs: int
    """Bytes of every matmul output of the block."""
    attention_outputs: int
    """Bytes of the fused attention outputs (activation dtype)."""
    attention_lse: int
    """Bytes of their float32 log-sum-exps."""
    attention_flops: int
    """FLOPs of the attention cores (``4 * head_dim * heads`` per score entry computed)."""
    shared_inputs: int = 0
    """Bytes of inputs every block of a stack receives as the same tensor (DiT: the time embedding; joint
    blocks: the key padding), kept once when any block of the stack is checkpointed."""


Rule = Callable[[object, int, int, int], BlockProfile]
_RULES: dict[type, Rule] = {}


def register_block_rule(node_type: type, rule: Rule) -> Rule:
    """Give the selective recompute options to the blocks of ``node_type`` (and its subclasses).

    Raises:
        TypeError: ``node_type`` is not a block type (its class does not set ``is_block``).
    """
    if not getattr(node_type, "is_block", False):
        raise TypeError(f"{node_type.__name__} is not a block type (set is_block = True on the node class)")
    _RULES[node_type] = rule
    return rule


def block_profile(node, batch: int, seq: int, dtype_bytes: int) -> BlockProfile | None:
    """The registered :class:`BlockProfile` of ``node``, or None when its type has no rule."""
    for klass in type(node).__mro__:
        rule = _RULES.get(klass)
        if rule is not None:
            return rule(node, batch, seq, dtype_bytes)
    return None


def _transformer(node: TransformerBlock, batch: int, seq: int, db: int) -> BlockProfile:
    """q (T*a), k, v, o (T*d); MLP: T*(d + H) for GELU / quick-GELU, T*(d + 2H) for SwiGLU / GeGLU; one SDPA
    call. ``a = heads * head_dim`` (``d`` unless the attention sets its head width)."""
    att, mlp, tokens = node.attention, node.mlp, batch * seq
    kv, a = att.kv_heads * att.head_dim, att.heads * att.head_dim
    mats = 3 if getattr(mlp, "gated", getattr(mlp, "activation", None) == "swiglu") else 2
    matmul = tokens * (a + att.dim + 2 * kv) + tokens * (att.dim + (mats - 1) * mlp.hidden)
    return BlockProfile(
        inputs=tokens * node.in_dim * db, matmul_outputs=matmul * db,
        attention_outputs=tokens * a * db, attention_lse=batch * att.heads * seq * LSE_BYTES,
        attention_flops=4 * batch * seq * seq * a)


def _dit(node: DiTBlock, batch: int, seq: int, db: int) -> BlockProfile:
    """Self-attention q, k, v, o (T*d each); cross-attention q and o (T*d) and k, v of the text
    (batch * context_len * d each); FFN up (T*H) and down (T*d); two SDPA calls (self, cross).

    Shared inputs: the float32 time embedding (batch, 6, dim). The text context and the RoPE tables are
    shared too but kept without recomputation as well: ``DiTBlock.shared_saved_bytes``.
    """
    d, tokens, text = node.dim, batch * seq, batch * node.cross_attn.context_len
    matmul = 4 * tokens * d + 2 * tokens * d + 2 * text * d + tokens * (node.ffn.hidden + d)
    heads = node.self_attn.heads
    return BlockProfile(
        inputs=tokens * d * db, matmul_outputs=matmul * db,
        attention_outputs=2 * tokens * d * db, attention_lse=2 * batch * heads * seq * LSE_BYTES,
        attention_flops=4 * batch * seq * (seq + node.cross_attn.context_len) * d,
        shared_inputs=batch * 6 * d * 4)


def _joint(node: JointAttentionBlock, batch: int, seq: int, db: int) -> BlockProfile:
    """Both streams' inputs; per stream q (not for a kv-only prefix), k, v, o and MLP (up, down; SwiGLU gate);
    two attention calls (prefix on prefix, suffix on prefix + suffix), ``heads * head_dim`` wide outputs.

    Shared input: the (batch, P) bool key padding.
    """
    p, h = node.prefix_len(seq), node.suffix_len
    a, kv = node.heads * node.head_dim, node.kv_heads * node.head_dim
    mats = 3 if node.mlp_activation == "swiglu" else 2

    def stream(tokens: int, width: int, hidden: int, kv_only: bool) -> int:
        if kv_only:
            return 2 * tokens * kv
        return tokens * (a + 2 * kv + width) + tokens * ((mats - 1) * hidden + width)

    matmul = (stream(batch * p, node.dim, node.hidden, node.prefix_kv_only)
              + stream(batch * h, node.expert_dim, node.expert_hidden, False))
    q_rows = h + (0 if node.prefix_kv_only else p)
    return BlockProfile(
        inputs=batch * (p * node.dim + h * node.expert_dim) * db, matmul_outputs=matmul * db,
        attention_outputs=batch * q_rows * a * db, attention_lse=batch * node.heads * q_rows * LSE_BYTES,
        attention_flops=4 * batch * a * node.kept_pairs(seq), shared_inputs=batch * p)


register_block_rule(TransformerBlock, _transformer)
register_block_rule(DiTBlock, _dit)
register_block_rule(JointAttentionBlock, _joint)
