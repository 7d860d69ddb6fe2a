"""Graph-level cost passes: per-component totals and the readable table planners and `lf ir show` print.

Every number comes from the node rules (``lf_ir._cost``): parameters, forward
and backward FLOPs (dense attention, the MFU convention), forward FLOPs with
only the attention scores the mask keeps, forward memory traffic and the bytes
kept for backward, for ``batch`` samples at each component's ``seq_len`` (or an
override). A node family without a byte rule leaves the byte columns ``None``
instead of failing, so a graph with a new node still gets its FLOP table.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from lf_ir._cost import (
    node_forward_bytes,
    node_forward_flops,
    node_forward_flops_unmasked,
    node_params,
    node_saved_bytes,
)
from lf_ir._graph import Graph, component_backward_flops
from lf_ir._nodes import IRError

__all__ = ["ComponentCost", "GraphCost", "cost_table", "graph_cost"]

MIB = 1024 ** 2


class ComponentCost(msgspec.Struct, frozen=True, kw_only=True):
    """Costs of one component for ``batch`` samples of ``seq`` tokens (FLOPs: multiply-add = 2)."""

    component: str
    """Component name."""
    modality: str
    """What the component consumes."""
    seq: int
    """Tokens per sample the component ran on."""
    params: int
    """Parameters (tied weights once)."""
    forward_flops: int
    """Forward FLOPs, dense attention term."""
    backward_flops: int
    """Backward FLOPs (input and weight gradients)."""
    forward_flops_unmasked: int
    """Forward FLOPs counting only the attention scores the mask keeps."""
    forward_bytes: int | None
    """Forward memory traffic, bytes; None when a node has no byte rule."""
    saved_bytes: int | None
    """Bytes kept for backward without recomputation; None when a node has no byte rule."""


class GraphCost(msgspec.Struct, frozen=True, kw_only=True):
    """Per-component costs of a graph and their totals."""

    graph: str
    """Graph name."""
    batch: int
    """Samples the costs are for."""
    dtype_bytes: int
    """Bytes per activation element the byte columns assume."""
    components: list[ComponentCost]
    """One entry per component, in graph order."""

    def total(self, field: str) -> int | None:
        """Sum of ``field`` over the components (None if any is None).

        Raises:
            IRError: ``field`` is not a ComponentCost number.
        """
        if field not in ComponentCost.__struct_fields__ or field in ("component", "modality", "seq"):
            raise IRError(f"GraphCost.total: unknown field {field!r}")
        values = [getattr(c, field) for c in self.components]
        return None if any(v is None for v in values) else sum(values)


def _optional(rule, *args) -> int | None:
    try:
        return rule(*args)
    except NotImplementedError:
        return None


def graph_cost(graph: Graph, batch: int = 1, dtype_bytes: int = 2,
               seq: Mapping[str, int] | None = None) -> GraphCost:
    """Costs of every component of ``graph`` for ``batch`` samples.

    Args:
        graph: a validated graph.
        batch: samples (micro-batch size).
        dtype_bytes: bytes per activation element (2 bf16, 4 float32).
        seq: optional component name -> tokens per sample, overriding ``seq_len``.

    Raises:
        IRError: a non-positive batch / dtype_bytes / seq, or ``seq`` naming an unknown component.

    Example:
        >>> from lf_ir.recipes.vla import build_graph, vla_config
        >>> cost = graph_cost(build_graph(vla_config("tiny")), batch=2, dtype_bytes=4)
        >>> cost.total("params") == sum(c.params for c in cost.components)
        True
    """
    for key, value in (("batch", batch), ("dtype_bytes", dtype_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise IRError(f"graph {graph.name!r}: {key} must be a positive integer, got {value!r}")
    seq = dict(seq or {})
    unknown = set(seq) - {c.name for c in graph.components}
    if unknown:
        raise IRError(f"graph {graph.name!r}: seq overrides name unknown components {sorted(unknown)}")
    rows = []
    for comp in graph.components:
        s = seq.get(comp.name, comp.seq_len)
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
            raise IRError(f"component {comp.name!r}: seq must be a positive integer, got {s!r}")
        fwd_bytes = [_optional(node_forward_bytes, n, batch, s, dtype_bytes) for n in comp.nodes]
        saved = [_optional(node_saved_bytes, n, batch, s, dtype_bytes) for n in comp.nodes]
        rows.append(ComponentCost(
            component=comp.name, modality=comp.modality, seq=s,
            params=sum(node_params(n) for n in comp.nodes),
            forward_flops=sum(node_forward_flops(n, batch, s) for n in comp.nodes),
            backward_flops=component_backward_flops(graph, comp, batch, s),
            forward_flops_unmasked=sum(node_forward_flops_unmasked(n, batch, s) for n in comp.nodes),
            forward_bytes=None if None in fwd_bytes else sum(fwd_bytes),
            saved_bytes=None if None in saved else sum(saved)))
    return GraphCost(graph=graph.name, batch=batch, dtype_bytes=dtype_bytes, components=rows)


def cost_table(cost: GraphCost) -> str:
    """The per-component table as aligned text, with a total row.

    Columns: component, modality, seq, params, fwd GFLOPs, bwd GFLOPs, saved MiB
    (bytes kept for backward at ``cost.dtype_bytes``; ``-`` when unknown).
    """
    head = ("component", "modality", "seq", "params", "fwd GFLOPs", "bwd GFLOPs",
            f"saved MiB ({cost.dtype_bytes} B/elem)")

    def cells(name, modality, seq, params, fwd, bwd, saved):
        return (name, modality, f"{seq:,}" if seq is not None else "", f"{params:,}", f"{fwd / 1e9:,.3f}",
                f"{bwd / 1e9:,.3f}", "-" if saved is None else f"{saved / MIB:,.2f}")

    body = [cells(c.component, c.modality, c.seq, c.params, c.forward_flops, c.backward_flops, c.saved_bytes)
            for c in cost.components]
    body.append(cells("total", "", None, cost.total("params"), cost.total("forward_flops"),
                      cost.total("backward_flops"), cost.total("saved_bytes")))
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]

    def line(row):
        return "  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([f"{cost.graph}, batch {cost.batch}", line(head), rule, *map(line, body[:-1]), rule,
                      line(body[-1])])
