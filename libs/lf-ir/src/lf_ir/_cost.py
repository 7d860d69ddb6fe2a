"""Parameter and FLOP counts per IR node.

FLOPs count a multiply-add as 2 and use the dense attention term
(4 * seq^2 * dim per sample for scores and weighted values), the convention of
PaLM (arXiv 2204.02311, appendix B) and torchtitan. Backward is twice the
forward unless a node says otherwise. Element-wise ops (norms, activations,
adds, rotary embeddings) count 0, as in ``torch.utils.flop_counter``.

The rules live on the node classes (``forward_flops`` / ``backward_flops``);
these functions are the stable entry points planners call.
"""

from __future__ import annotations

import math

from lf_ir._base import _Node


def node_params(node: _Node) -> int:
    """Number of parameters of ``node``."""
    return sum(math.prod(shape) for shape in node.param_shapes().values())


def node_forward_flops(node: _Node, batch: int, seq: int) -> int:
    """Forward FLOPs of ``node`` on ``batch`` samples of ``seq`` tokens.

    Raises:
        NotImplementedError: for a node type without a FLOP rule.
    """
    return node.forward_flops(batch, seq)


def node_backward_flops(node: _Node, batch: int, seq: int) -> int:
    """Backward FLOPs (gradients w.r.t. inputs and weights) of ``node``."""
    return node.backward_flops(batch, seq)


def _rule(node: _Node, method: str):
    rule = getattr(node, method, None)
    if rule is None:
        raise NotImplementedError(f"node {node.name!r}: {type(node).__name__} does not define {method}")
    return rule


def node_forward_flops_unmasked(node: _Node, batch: int, seq: int) -> int:
    """Forward FLOPs counting only the attention scores the mask keeps (packed: one document per sample).

    Nodes without attention (no ``forward_flops_unmasked`` method) give their ``forward_flops``.
    """
    rule = getattr(node, "forward_flops_unmasked", None)
    return rule(batch, seq) if rule is not None else node.forward_flops(batch, seq)


def node_forward_bytes(node: _Node, batch: int, seq: int, dtype_bytes: int) -> int:
    """Memory traffic of one forward of ``node`` in bytes (see :mod:`lf_ir._bytes`).

    Raises:
        NotImplementedError: the node type has no byte rule.
    """
    return _rule(node, "forward_bytes")(batch, seq, dtype_bytes)


def node_saved_bytes(node: _Node, batch: int, seq: int, dtype_bytes: int) -> int:
    """Bytes autograd keeps for the backward of ``node`` (see :mod:`lf_ir._bytes`).

    Raises:
        NotImplementedError: the node type has no byte rule.
    """
    return _rule(node, "saved_bytes")(batch, seq, dtype_bytes)
