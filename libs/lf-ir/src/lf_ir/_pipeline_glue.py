"""Pipeline glue: how a multi-component recipe model's forward is cut at its trunk's blocks.

A model whose graph has several components (a vision tower or text encoder feeding
the trunk) keeps its glue (merging image tokens into the text sequence, M-RoPE or
3D positions, timestep conditioning) in the recipe. For pipeline parallelism the
recipe's model class exposes its forward as three methods, so a pipeline stage
(lf-parallel) can run any slice of the trunk without model-specific code:

- ``embed_inputs(*forward_inputs) -> (hidden_bsd, *side)``: every non-trunk
  component, the glue, and the trunk's nodes before its first block;
- ``trunk_blocks(hidden_bsd, *side, start=0, stop=None) -> hidden_bsd``: the
  trunk's blocks whose node index is in ``[start, stop)`` (other nodes skipped);
- ``trunk_head(hidden_bsd, *side) -> output``: the trunk's nodes after its last
  block and any reshaping, i.e. what ``forward`` returns.

``forward(*inputs) == trunk_head(trunk_blocks(*embed_inputs(*inputs)), *side)`` (the
recipes' ``forward`` is written that way). ``side`` tensors are what every block
needs besides the hidden states (positions, key padding, the text context of
cross-attention, the timestep modulation); each has the sample on dim 0, so a
pipeline schedule can cut micro-batches along dim 0 and send them between stages.

Legend: ``x_bsd`` (batch, seq, dim).
"""

from __future__ import annotations

from torch import nn

from lf_ir._lower import ComponentModule

PIPELINE_GLUE = ("embed_inputs", "trunk_blocks", "trunk_head")
"""Method names a multi-component model provides to be pipelined."""


def block_span(component: ComponentModule) -> tuple[int, int]:
    """(index of the first block, one past the last block) among ``component.layers``.

    Raises:
        ValueError: the component has no block (names the component).
    """
    names = {n.name for n in component.lf_component.blocks()}
    idx = [i for i, n in enumerate(component.lf_component.nodes) if n.name in names]
    if not idx:
        raise ValueError(f"component {component.lf_component.name!r} has no blocks")
    return idx[0], idx[-1] + 1


def blocks_between(component: ComponentModule, start: int = 0, stop: int | None = None) -> list[nn.Module]:
    """The block modules of ``component`` whose node index is in ``[start, stop)``, in order."""
    names = {n.name for n in component.lf_component.blocks()}
    nodes = component.lf_component.nodes
    stop = len(nodes) if stop is None else stop
    return [component.layers[i] for i in range(max(start, 0), min(stop, len(nodes))) if nodes[i].name in names]
