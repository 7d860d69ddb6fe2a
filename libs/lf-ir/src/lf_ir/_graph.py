"""Model graphs: components per modality, joined by edges, with checks and totals.

A :class:`Graph` is the unit every planner reads. Components hold an ordered
list of nodes applied one after another; an :class:`Edge` says that the output
tokens of one component enter another (e.g. projected image tokens become the
prefix of the backbone sequence). ``validate`` is the shape-inference pass: it
walks each component and every edge and raises :class:`IRError` naming the node
that does not fit.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from lf_ir._cost import node_backward_flops, node_forward_flops, node_params
from lf_ir._nodes import Embedding, IRError, Linear, LMHead, Node, PatchEmbed2D

Modality = Literal["image", "text", "state", "action", "sequence", "video"]


class Component(msgspec.Struct, frozen=True, kw_only=True):
    """An ordered chain of nodes for one modality (or the shared sequence model)."""

    name: str
    """Component name, unique in the graph (e.g. ``"vision"``, ``"backbone"``)."""
    modality: Modality
    """What the component consumes."""
    seq_len: int
    """Tokens per sample this component runs on (for FLOPs and activation sizes)."""
    nodes: list[Node]
    """Nodes in application order."""

    def blocks(self) -> list[Node]:
        """The repeated blocks of the component, in order: the nodes whose class sets ``is_block``
        (``TransformerBlock``, ``MMBlock``, ``DiTBlock``, ``JointAttentionBlock``), what recompute and pipeline
        planners work on."""
        return [n for n in self.nodes if type(n).is_block]


class Edge(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens of component ``src`` (from node ``src_node``) enter component ``dst``."""

    src: str
    """Producing component."""
    src_node: str
    """Node of ``src`` whose output is taken."""
    dst: str
    """Consuming component."""
    kind: Literal["prefix_tokens", "tokens", "context"] = "tokens"
    """``prefix_tokens``: inserted in the bidirectional prefix of ``dst``; ``context``: read by the
    cross-attention of ``dst`` (keys/values), not part of its sequence."""


class Graph(msgspec.Struct, frozen=True, kw_only=True):
    """A whole model: components per modality and the edges between them."""

    name: str
    """Model name (recipe and size, e.g. ``"vla-tiny"``)."""
    recipe: str
    """Recipe that built the graph."""
    components: list[Component]
    """Components in execution order."""
    edges: list[Edge] = []
    """Data flow between components."""

    def component(self, name: str) -> Component:
        """The component called ``name``; IRError listing the names otherwise."""
        for comp in self.components:
            if comp.name == name:
                return comp
        raise IRError(f"graph {self.name!r} has no component {name!r}; "
                      f"components: {[c.name for c in self.components]}")


def validate(graph: Graph) -> Graph:
    """Shape inference over every component and edge.

    Checks unique names, that each node's input width equals the previous node's
    output width, and that each edge's source width equals the destination's
    model width. Returns the graph unchanged so calls chain.

    Raises:
        IRError: naming the graph, component and node that does not fit.
    """
    seen: set[str] = set()
    for comp in graph.components:
        if comp.name in seen:
            raise IRError(f"graph {graph.name!r}: duplicate component name {comp.name!r}")
        seen.add(comp.name)
        if comp.seq_len <= 0:
            raise IRError(f"component {comp.name!r}: seq_len must be positive, got {comp.seq_len}")
        names: set[str] = set()
        width: int | None = None
        prev = "<input>"
        for i, node in enumerate(comp.nodes):
            if node.name in names:
                raise IRError(f"component {comp.name!r}: duplicate node name {node.name!r}")
            names.add(node.name)
            if node.in_dim is not None and width is not None and node.in_dim != width:
                raise IRError(
                    f"component {comp.name!r}, node {node.name!r}: expects input width "
                    f"{node.in_dim} but {prev!r} produces {width}")
            if isinstance(node, LMHead) and node.tied_to is not None:
                _check_tie(comp, i, node)
            width, prev = node.out_dim, node.name
    for edge in graph.edges:
        src, dst = graph.component(edge.src), graph.component(edge.dst)
        src_nodes = {n.name: n for n in src.nodes}
        if edge.src_node not in src_nodes:
            raise IRError(f"edge {edge.src}->{edge.dst}: component {edge.src!r} has no node "
                          f"{edge.src_node!r}")
        out = src_nodes[edge.src_node].out_dim
        widths = _model_widths(dst)
        if widths is not None and out not in widths:
            shown = widths[0] if len(widths) == 1 else " or ".join(map(str, widths))
            raise IRError(f"edge {edge.src}->{edge.dst}: node {edge.src!r}.{edge.src_node!r} "
                          f"produces width {out} but {edge.dst!r} runs at width {shown}")
    return graph


def _check_tie(comp: Component, index: int, head: LMHead) -> None:
    earlier = {n.name: n for n in comp.nodes[:index]}
    table = earlier.get(head.tied_to)
    where = f"component {comp.name!r}, node {head.name!r}"
    if not isinstance(table, Embedding):
        raise IRError(f"{where}: tied_to {head.tied_to!r} must name an earlier Embedding node of the "
                      f"component; earlier nodes: {list(earlier)}")
    if (table.num_embeddings, table.dim) != head.weight_shape():
        raise IRError(f"{where}: tied to {head.tied_to!r} of shape {(table.num_embeddings, table.dim)} "
                      f"but the head needs {head.weight_shape()}")


def _model_widths(comp: Component) -> tuple[int, ...] | None:
    """The widths the component's blocks take (a joint block: one per stream); None without blocks."""
    blocks = comp.blocks()
    return getattr(blocks[0], "stream_widths", (blocks[0].in_dim,)) if blocks else None


def param_count(graph: Graph, *, component: str | None = None) -> int:
    """Number of parameters (all components, or one)."""
    comps = [graph.component(component)] if component else graph.components
    return sum(node_params(n) for c in comps for n in c.nodes)


def forward_flops(graph: Graph, batch: int = 1) -> int:
    """Forward FLOPs (multiply-add = 2) for ``batch`` samples, dense attention term."""
    return sum(node_forward_flops(n, batch, c.seq_len) for c in graph.components for n in c.nodes)


def component_backward_flops(graph: Graph, comp: Component, batch: int, seq: int | None = None) -> int:
    """Backward FLOPs of one component for ``batch`` samples of ``seq`` tokens (default ``comp.seq_len``).

    Each node's ``backward_flops`` (input and weight gradients), except the first node of a
    component no edge feeds when it is a ``Linear`` or ``PatchEmbed2D``: its input is data
    that needs no gradient, so only the weight gradient (1x forward) is computed, as autograd does.
    """
    seq = comp.seq_len if seq is None else seq
    total = sum(node_backward_flops(n, batch, seq) for n in comp.nodes)
    fed = {e.dst for e in graph.edges}
    if comp.nodes and comp.name not in fed and isinstance(comp.nodes[0], (Linear, PatchEmbed2D)):
        first = comp.nodes[0]
        total += node_forward_flops(first, batch, seq) - node_backward_flops(first, batch, seq)
    return total


def backward_flops(graph: Graph, batch: int = 1) -> int:
    """Backward FLOPs for ``batch`` samples, dense attention term (see :func:`component_backward_flops`)."""
    return sum(component_backward_flops(graph, c, batch) for c in graph.components)


def to_json(graph: Graph) -> bytes:
    """Serialize a graph to JSON bytes (nodes carry their ``op`` tag)."""
    return msgspec.json.encode(graph)


def from_json(data: bytes | str) -> Graph:
    """Decode and validate a graph; msgspec.ValidationError or IRError on bad input."""
    return validate(msgspec.json.decode(data, type=Graph))


def summary_rows(graph: Graph, batch: int = 1) -> list[tuple[str, str, int, int, int]]:
    """Per-component rows (name, modality, seq_len, params, forward FLOPs per batch)."""
    return [(c.name, c.modality, c.seq_len, sum(node_params(n) for n in c.nodes),
             sum(node_forward_flops(n, batch, c.seq_len) for n in c.nodes)) for c in graph.components]
