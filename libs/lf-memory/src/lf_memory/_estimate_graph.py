"""A graph seen by planners: components split into pre-nodes, repeated blocks and post-nodes, per pipeline stage.

The memory estimator (:mod:`lf_memory._estimate`) and lf-parallel's cost model
evaluate thousands of plans on one graph. Blocks of a component are usually
identical but for their names, so each node is mapped to a *representative*
(the first node with the same fields, names ignored) and per-node rules are
memoized on the representative. Pipeline stages split each component's blocks
evenly (the first ``blocks % stages`` stages take one more); nodes before the
first block run on stage 0, nodes after the last block on the last stage, and
components without blocks on stage 0.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import msgspec


def _strip_names(value):
    if isinstance(value, dict):
        return {k: _strip_names(v) for k, v in value.items() if k != "name"}
    if isinstance(value, list):
        return [_strip_names(v) for v in value]
    return value


def is_block(node) -> bool:
    """Whether ``node`` is a repeated block (recomputed and split by pipeline stages): its class sets lf-ir's
    ``is_block``."""
    return bool(getattr(type(node), "is_block", False))


@dataclass
class ComponentView:
    """One component: representatives of its nodes, and where its blocks are."""

    name: str
    seq_len: int
    pre: list = field(default_factory=list)
    """Representatives of the nodes before the first block."""
    blocks: list = field(default_factory=list)
    """Representatives of the blocks, in order (repeats share one object)."""
    post: list = field(default_factory=list)
    """Representatives of the nodes after the last block."""


@dataclass
class GraphView:
    """The components of a graph as :class:`ComponentView` and the main component's name."""

    graph: object
    components: list[ComponentView]
    main: str
    _stages: dict = field(default_factory=dict)

    def component(self, name: str) -> ComponentView:
        return next(c for c in self.components if c.name == name)

    def stage_nodes(self, comp: ComponentView, stage: int, stages: int) -> tuple[Counter, Counter]:
        """(block representative -> count, other node representative -> count) of ``comp`` on ``stage``."""
        key = (comp.name, stage, stages)
        if key not in self._stages:
            n = len(comp.blocks)
            if not n:
                own = Counter(comp.pre + comp.post) if stage == 0 else Counter()
                self._stages[key] = (Counter(), own)
            else:
                base, extra = divmod(n, stages)
                start = stage * base + min(stage, extra)
                stop = start + base + (1 if stage < extra else 0)
                other = Counter(comp.pre if stage == 0 else []) + Counter(comp.post if stage == stages - 1 else [])
                self._stages[key] = (Counter(comp.blocks[start:stop]), other)
        return self._stages[key]


_VIEWS: dict[int, GraphView] = {}


def trunk_name(graph) -> str:
    """The graph's trunk (main) component: the one the other components feed.

    lf-ir marks the trunk by the data flow: its edges carry each encoder's tokens into the trunk (Qwen2-VL's
    ``vision -> text``, the VLA's ``vision / tokens / state -> backbone``, Wan's ``text -> video``). Among the
    components with blocks the trunk has the most incoming edges net of outgoing ones, then the most blocks,
    then the longest ``seq_len``; a graph without blocks (the Wan VAE) takes the longest ``seq_len`` (the
    first on ties). Before this rule the component with the most blocks won, which made Qwen2-VL-7B's
    32-block vision tower (28 text blocks) the main component.

    Example:
        >>> from lf_ir.recipes import qwen2_vl
        >>> trunk_name(qwen2_vl.build_graph(qwen2_vl.qwen2_vl_config("7B")))
        'text'
    """
    net = Counter()
    for edge in getattr(graph, "edges", ()):
        net[edge.dst] += 1
        net[edge.src] -= 1

    def key(comp):
        blocks = len(comp.blocks())
        return (blocks > 0, net[comp.name] if blocks else 0, blocks, comp.seq_len)

    return max(graph.components, key=key).name


def graph_view(graph) -> GraphView:
    """The (cached) :class:`GraphView` of an ``lf_ir.Graph``; its ``main`` component is :func:`trunk_name`."""
    view = _VIEWS.get(id(graph))
    if view is not None and view.graph is graph:
        return view
    reps: dict[tuple, object] = {}
    comps = []
    for comp in graph.components:
        cv = ComponentView(name=comp.name, seq_len=comp.seq_len)
        idx = [i for i, n in enumerate(comp.nodes) if is_block(n)]
        for i, node in enumerate(comp.nodes):
            key = (type(node).__name__, json.dumps(_strip_names(msgspec.to_builtins(node)), sort_keys=True))
            rep = reps.setdefault(key, node)
            if idx and idx[0] <= i <= idx[-1]:
                (cv.blocks if is_block(node) else cv.pre).append(rep)
            elif idx and i > idx[-1]:
                cv.post.append(rep)
            else:
                cv.pre.append(rep)
        comps.append(cv)
    view = GraphView(graph=graph, components=comps, main=trunk_name(graph))
    if len(_VIEWS) > 16:
        _VIEWS.clear()
    _VIEWS[id(graph)] = view
    return view
