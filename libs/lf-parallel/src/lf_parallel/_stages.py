"""Pipeline stage split: a FLOP-balanced partition of an IR graph's blocks into stages.

Works on the IR alone (no model-specific code). The *trunk* is the component
with the most transformer blocks (the decoder of an LLM, the backbone of a
VLA); every other component (vision / state encoders, token embeddings used as
inputs) runs on the first stage. The trunk's node list is cut into work units,
one per transformer block: the nodes before the first block (embedding,
positional table) join the first unit and the nodes after the last block
(final norm, head) join the last, so the embedding lands on the first stage and
the head (and the loss) on the last. A unit costs its nodes' forward plus
backward FLOPs (``lf_ir.node_forward_flops`` / ``node_backward_flops``, the
IR's per-node counts) at the component's ``seq_len``.

Stages are contiguous runs of units; :func:`balanced_partition` finds the
split that minimizes the most expensive stage (exact dynamic program,
the "linear partition" problem). With ``virtual_stages = v`` there are
``pp * v`` stages and stage ``s`` lives on pipeline rank ``s % pp`` (the looped
placement ``torch.distributed.pipelining``'s interleaved schedules expect,
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021, sec. 2.2).
"""

from __future__ import annotations

import dataclasses

from lf_ir import Graph, node_backward_flops, node_forward_flops
from lf_memory import trunk_name

__all__ = ["StageSpec", "balanced_partition", "split_stages", "stage_ranks", "trunk_component"]


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: a slice of the trunk's nodes plus, on stage 0, the other components."""

    index: int
    """Stage index, 0..num_stages-1, in execution order."""
    rank: int
    """Pipeline rank that runs this stage (``index % pp``)."""
    trunk: str
    """Name of the trunk component."""
    start: int
    """First trunk node index of the stage (into ``component.nodes``)."""
    stop: int
    """One past the last trunk node index."""
    encoders: tuple[str, ...]
    """Non-trunk components this stage runs (all of them on stage 0, none elsewhere)."""
    flops: int
    """Forward + backward FLOPs of the stage per batch of the planning size."""


def trunk_component(graph: Graph) -> str:
    """Name of the trunk: the component the others feed (lf-memory's ``trunk_name``: by the graph's edges, then
    the most blocks). Qwen2-VL-7B's trunk is ``text`` although its vision tower has more blocks (32 vs 28).

    Raises:
        ValueError: the graph has no transformer block (nothing to pipeline).
    """
    name = trunk_name(graph)
    if not graph.component(name).blocks():
        raise ValueError(f"graph {graph.name!r}: no transformer blocks to split into pipeline stages")
    return name


def balanced_partition(costs: list[int | float], parts: int) -> list[int]:
    """Cut ``costs`` into ``parts`` contiguous non-empty runs minimizing the largest run sum.

    Returns the ``parts + 1`` boundaries ``[0, b1, ..., len(costs)]``; run ``i``
    is ``costs[b_i:b_{i+1}]``. Among optimal splits the one with the earliest
    cuts is returned (deterministic). O(parts * n^2).

    Raises:
        ValueError: ``parts`` < 1 or more than ``len(costs)`` (names both).

    Example:
        >>> balanced_partition([4, 1, 1, 1, 1], 2)
        [0, 1, 5]
    """
    n = len(costs)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} pipeline units into {parts} stages (need 1 <= stages <= {n})")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[p][i]: the smallest max-run cost of splitting costs[:i] into p runs.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for p in range(1, parts + 1):
        for i in range(p, n + 1):
            for j in range(p - 1, i):
                value = max(best[p - 1][j], prefix[i] - prefix[j])
                if value < best[p][i]:
                    best[p][i], cut[p][i] = value, j
    bounds = [n]
    for p in range(parts, 0, -1):
        bounds.append(cut[p][bounds[-1]])
    return bounds[::-1]


def stage_ranks(pp: int, virtual_stages: int = 1) -> list[list[int]]:
    """Stage indices per pipeline rank under the looped placement: rank r holds r, r + pp, ...

    Example:
        >>> stage_ranks(2, 2)
        [[0, 2], [1, 3]]
    """
    return [[r + v * pp for v in range(virtual_stages)] for r in range(pp)]


def split_stages(graph: Graph, pp: int, *, virtual_stages: int = 1, batch: int = 1) -> list[StageSpec]:
    """Partition ``graph`` into ``pp * virtual_stages`` FLOP-balanced pipeline stages.

    Args:
        graph: a validated IR graph.
        pp: pipeline-parallel degree (ranks), ``Plan.pp``.
        virtual_stages: stages per rank (``Plan.pp_virtual_stages``; > 1 for
            interleaved schedules).
        batch: samples per micro-batch used for the FLOP counts (the balance
            does not depend on it; it scales ``StageSpec.flops``).

    Returns:
        ``pp * virtual_stages`` stages in execution order; together they cover
        every trunk node exactly once, stage 0 also runs every other component.

    Raises:
        ValueError: ``pp`` or ``virtual_stages`` < 1, or more stages than trunk
            blocks (names the graph, the block count and the stage count).
    """
    if pp < 1 or virtual_stages < 1:
        raise ValueError(f"pipeline split needs pp >= 1 and virtual_stages >= 1, got pp={pp}, "
                         f"virtual_stages={virtual_stages}")
    name = trunk_component(graph)
    trunk = graph.component(name)
    encoders = tuple(c.name for c in graph.components if c.name != name)
    num_stages = pp * virtual_stages
    block_names = {n.name for n in trunk.blocks()}  # transformer blocks and every ``is_block`` node (DiT, MM)
    block_idx = [i for i, n in enumerate(trunk.nodes) if n.name in block_names]
    if num_stages > len(block_idx):
        raise ValueError(f"graph {graph.name!r}: pp={pp} x virtual_stages={virtual_stages} = {num_stages} "
                         f"stages but component {name!r} has only {len(block_idx)} transformer blocks")

    def cost(nodes, seq):
        return sum(node_forward_flops(n, batch, seq) + node_backward_flops(n, batch, seq) for n in nodes)

    encoder_flops = sum(cost(c.nodes, c.seq_len) for c in graph.components if c.name != name)
    # Unit u spans trunk nodes [unit_start[u], unit_start[u + 1]).
    unit_start = [0, *block_idx[1:], len(trunk.nodes)]
    unit_costs = [cost(trunk.nodes[a:b], trunk.seq_len) for a, b in zip(unit_start[:-1], unit_start[1:], strict=True)]
    unit_costs[0] += encoder_flops
    bounds = balanced_partition(unit_costs, num_stages)
    return [StageSpec(index=s, rank=s % pp, trunk=name, start=unit_start[bounds[s]],
                      stop=unit_start[bounds[s + 1]], encoders=encoders if s == 0 else (),
                      flops=int(sum(unit_costs[bounds[s]:bounds[s + 1]])))
            for s in range(num_stages)]
