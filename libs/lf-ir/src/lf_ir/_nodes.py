"""Typed IR nodes: the operations a model graph is made of.

Every node is a frozen msgspec struct tagged by its ``op`` so that a graph
round-trips through JSON. A node knows its input and output feature sizes
(for shape inference), its parameter shapes and, through ``tp``, how tensor
parallelism would split it: ``"column"`` splits the output features,
``"row"`` splits the input features, ``"replicate"`` keeps a full copy.

Validation runs in ``__post_init__`` so a malformed node fails where it is
built, with an :class:`IRError` that names the node.

The node families live in ``_nodes_*.py`` modules (``_nodes_input.py``,
``_nodes_transformer.py``, ...); this module re-exports the core ones and
gathers every family into the :data:`Node` union.
"""

from __future__ import annotations

from lf_ir._base import IRError, TPStyle, _Node
from lf_ir._mask import Mask
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_flow import FlowMatchingLoss
from lf_ir._nodes_input import Embedding, LearnedPositional, Linear, PatchEmbed2D
from lf_ir._nodes_lm import LMHead
from lf_ir._nodes_transformer import MLP, Attention, MaskKind, Norm, TransformerBlock
from lf_ir._nodes_vae import CausalConv3D, ChannelRMSNorm, VAEAttention, VAEResample, VAEResBlock
from lf_ir._nodes_video import (
    AdaLNHead,
    AdaLNModulation,
    TextProjection,
    TimestepEmbedding,
    VideoPatchEmbed,
)
from lf_ir._nodes_vision import FeedForward, PatchEmbed3D, PatchMerger
from lf_ir._rope import RoPE

__all__ = ["MLP", "Attention", "Embedding", "IRError", "LMHead", "LearnedPositional", "Linear", "Mask",
           "MaskKind", "Node", "Norm", "PatchEmbed2D", "RoPE", "TPStyle", "TransformerBlock", "_Node"]

from lf_ir._nodes_expert import ActionTimeEmbed, JointAttentionBlock  # noqa: E402  (uses MLP)
from lf_ir._nodes_mm import MMAttention, MMBlock  # noqa: E402  (subclasses TransformerBlock)

Node = (Embedding | Linear | PatchEmbed2D | LearnedPositional | Norm | Attention | MLP | TransformerBlock
        | LMHead | CausalConv3D | ChannelRMSNorm | VAEResBlock | VAEAttention | VAEResample
        | PatchEmbed3D | PatchMerger | FeedForward | MMAttention | MMBlock
        | VideoPatchEmbed | TimestepEmbedding | TextProjection | AdaLNModulation | AdaLNHead | DiTAttention
        | DiTBlock | FlowMatchingLoss | ActionTimeEmbed | JointAttentionBlock)
"""Any IR node (a tagged union: JSON carries the ``op`` field)."""
