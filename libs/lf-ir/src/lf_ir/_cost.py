"""Parameter and FLOP counts per IR node.

FLOPs count a multiply-add as 2 and use the dense attention term
(4 * seq^2 * dim per sample for scores and weighted values), the convention of
PaLM (arXiv 2204.02311, appendix B) and torchtitan. Backward is taken as twice
the forward. Element-wise ops (norms, activations, adds, rotary embeddings) count 0, as in
``torch.utils.flop_counter``.
"""

from __future__ import annotations

import math

from lf_ir._nodes import (
    MLP,
    Attention,
    Embedding,
    LearnedPositional,
    Linear,
    LMHead,
    Norm,
    PatchEmbed2D,
    TransformerBlock,
    _Node,
)


def node_params(node: _Node) -> int:
    """Number of parameters of ``node``."""
    return sum(math.prod(shape) for shape in node.param_shapes().values())


def node_forward_flops(node: _Node, batch: int, seq: int) -> int:
    """Forward FLOPs of ``node`` on ``batch`` samples of ``seq`` tokens.

    Raises:
        TypeError: for a node type this function does not know.
    """
    tokens = batch * seq
    if isinstance(node, (Embedding, LearnedPositional, Norm)):
        return 0
    if isinstance(node, Linear):
        return 2 * tokens * node.in_features * node.out_features
    if isinstance(node, LMHead):
        return 2 * tokens * node.dim * node.vocab_size
    if isinstance(node, PatchEmbed2D):
        k = node.in_channels * node.patch_size ** 2
        return 2 * batch * node.num_patches * k * node.dim
    if isinstance(node, Attention):
        kv = node.kv_heads * node.head_dim
        proj = 2 * tokens * node.dim * (2 * node.dim + 2 * kv)
        return proj + 4 * batch * seq * seq * node.dim
    if isinstance(node, MLP):
        mats = 3 if node.activation == "swiglu" else 2
        return 2 * tokens * node.dim * node.hidden * mats
    if isinstance(node, TransformerBlock):
        return sum(node_forward_flops(c, batch, seq) for c in node.children())
    raise TypeError(f"no FLOP rule for node type {type(node).__name__}")


def node_backward_flops(node: _Node, batch: int, seq: int) -> int:
    """Backward FLOPs: gradients w.r.t. inputs and weights, twice the forward."""
    return 2 * node_forward_flops(node, batch, seq)
