"""The auto-tuner: enumerate plans for a model, batch and cluster, prune, rank by predicted step time.

Search space (every combination that :func:`lf_parallel.check_plan`'s rules allow):
tp in the divisors of the GPUs per node (sequence parallel always on with tp > 1);
for multimodal graphs also tp = 1 for the non-main components; pp dividing the GPUs
left, with schedules 1F1B, interleaved 1F1B (v = 2, 4) and zero bubble; cp (ring or
Ulysses) while each rank keeps >= ``min_cp_tokens`` tokens; dp the rest; ZeRO
0-3 and, when the shard group would leave the node, HSDP with one node per shard
group; every micro-batch dividing the per-rank batch (the pipeline needs at least
``pp`` micro-batches); recompute ``none``, ``selective``, ``full``.

Pruning, cheapest first: divisibility (the graph checks once per structural
choice, the rest per plan), then memory (lf-memory's estimate against
``memory_fraction`` of the GPU; recompute modes are tried leanest first and a
micro-batch that does not fit even with full recompute ends the larger ones),
then the cost model ranks what is left.
"""

from __future__ import annotations

import math

import msgspec

from lf_memory import MemoryEstimate, estimate_memory
from lf_parallel._calibrate import Calibration, default_calibration
from lf_parallel._cluster import GIB, Cluster
from lf_parallel._cost_model import StepCost, step_cost
from lf_parallel._plan import ComponentPlan, Plan, PlanError
from lf_parallel._plan_check import _graph_problem, _problem

RECOMPUTE_CHOICES = ("none", "selective", "full")
_RECOMPUTE_ORDER = {"none": 0, "selective_attn": 1, "selective": 1, "every_k": 2, "full": 3}
"""Tie-break of equal predicted step times: the plan that recomputes less first."""


class NoFeasiblePlan(PlanError):
    """No plan fits the cluster's memory (or the batch divides no way); the message says what is missing."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A plan with its recompute mode and predicted cost."""

    plan: Plan
    """The parallel plan."""
    recompute: str
    """lf-memory's recompute mode for every block."""
    cost: StepCost
    """Predicted step time, throughput and memory."""


class SearchResult(msgspec.Struct, frozen=True, kw_only=True):
    """Ranked plans (fastest first) and what the search looked at."""

    ranked: list[Candidate]
    """The ``top`` fastest feasible plans."""
    considered: int
    """Plans that passed the divisibility checks."""
    over_memory: int
    """Of those, plans pruned for memory."""
    seconds: float = 0.0
    """Wall time of the search."""


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, min(n, limit or n) + 1) if n % d == 0]


def _structures(graph, cluster: Cluster, seq: int, min_cp_tokens: int, main: str):
    world = cluster.gpus
    blocks = max(len(c.blocks()) for c in graph.components)
    others = [c.name for c in graph.components if c.name != main]
    for tp in _divisors(cluster.gpus_per_node):
        if world % tp:
            continue
        comp_options = [{}] + ([{n: ComponentPlan(tp=1) for n in others}] if tp > 1 and others else [])
        for pp in _divisors(world // tp, blocks):
            schedules = [("1f1b", 1)] if pp == 1 else [("1f1b", 1), ("zero_bubble", 1)] + [
                ("interleaved_1f1b", v) for v in (2, 4) if blocks % (pp * v) == 0]
            for cp in _divisors(world // (tp * pp)):
                if cp > 1 and (seq // cp < min_cp_tokens or seq % cp):
                    continue
                for kind in (("ring", "ulysses") if cp > 1 else ("ring",)):
                    for schedule, v in schedules:
                        for comps in comp_options:
                            yield dict(tp=tp, sp=tp > 1, pp=pp, pp_schedule=schedule, pp_virtual_stages=v, cp=cp,
                                       cp_kind=kind, components=comps)


def search_plans(graph, cluster: Cluster, *, global_batch: int, seq: int | None = None, precision: str = "bf16",
                 top: int = 10, recompute_modes: tuple[str, ...] = RECOMPUTE_CHOICES,
                 calibration: Calibration | None = None, memory_fraction: float = 0.9,
                 min_cp_tokens: int = 2048, max_micro_batch: int = 16) -> SearchResult:
    """Ranked feasible plans for training ``graph`` with ``global_batch`` samples per step on ``cluster``.

    Args:
        graph: the model's ``lf_ir.Graph``.
        cluster: GPUs and links.
        global_batch: samples per optimizer step.
        seq: tokens per sample of the main component (default its ``seq_len``).
        precision: compute dtype (``bf16``, ``fp16``, ``fp32``).
        top: how many plans to return.
        recompute_modes: lf-memory modes to try.
        calibration: achieved rates (default: BENCH.md ratios for the GPU).
        memory_fraction: share of the GPU's memory a plan may use (the rest: CUDA context,
            NCCL, fragmentation).
        min_cp_tokens: smallest sequence share per context-parallel rank.
        max_micro_batch: largest micro-batch tried.

    Raises:
        NoFeasiblePlan: nothing fits; the message gives the memory per GPU the leanest
            plan needs and what the GPU offers, or why no plan divides the batch.
    """
    import time

    start = time.perf_counter()
    cal = calibration or default_calibration(cluster.gpu)
    from lf_memory import graph_view

    main = graph_view(graph).main
    seq = seq or graph.component(main).seq_len
    budget = cluster.memory_bytes * memory_fraction
    world = cluster.gpus
    ranked: list[Candidate] = []
    considered = over = 0
    leanest: tuple[int, Plan, str, MemoryEstimate] | None = None
    lean_order = {"full": 0, "every_k": 1, "selective": 2, "selective_attn": 2, "none": 3}
    modes = sorted(recompute_modes, key=lambda m: lean_order.get(m, 3))  # leanest first: prune the rest
    for fields in _structures(graph, cluster, seq, min_cp_tokens, main):
        probe = Plan(dp=1, **fields, micro_batch=1, grad_accum=max(fields["pp"], 1))
        if _graph_check(probe, graph) is not None:
            continue
        dp = world // (fields["tp"] * fields["pp"] * fields["cp"])
        if global_batch % dp:
            continue
        per_rank = global_batch // dp
        for zero in (0, 1, 2, 3):
            replicas = [1]
            shard_in_node = cluster.gpus_per_node // (fields["tp"] * fields["cp"])
            if zero >= 2 and dp > shard_in_node > 1 and dp % shard_in_node == 0:
                replicas.append(dp // shard_in_node)
            for rep in replicas:
                too_big = False  # a micro-batch over memory even with the leanest recompute: larger ones are too
                for micro in _divisors(per_rank, max_micro_batch):
                    if too_big:
                        break
                    accum = per_rank // micro
                    try:
                        plan = Plan(dp=dp, dp_replicate=rep, zero_stage=zero, micro_batch=micro, grad_accum=accum,
                                    precision=precision, **fields)
                    except (TypeError, msgspec.ValidationError):
                        continue
                    if _problem(plan, world, global_batch, None) is not None:
                        continue
                    for i, mode in enumerate(modes):
                        considered += 1
                        mem = estimate_memory(graph, plan, seq=seq, precision=precision, recompute=mode)
                        if mem.total > budget:
                            over += len(modes) - i
                            considered += len(modes) - i - 1
                            if leanest is None or mem.total < leanest[0]:
                                leanest = (mem.total, plan, mode, mem)
                            too_big = i == 0
                            break
                        cost = step_cost(graph, plan, cluster, recompute=mode, precision=precision, seq=seq,
                                         calibration=cal, memory=mem)
                        ranked.append(Candidate(plan=plan, recompute=mode, cost=cost))
    if not ranked:
        raise NoFeasiblePlan(_why_none(cluster, global_batch, leanest, memory_fraction))
    # the unrounded prediction: rounding made tiny models tie and ``full`` rank above ``none``; exact ties go to
    # less recompute, then the simpler plan, then less memory
    ranked.sort(key=lambda c: (c.cost.step_s, _RECOMPUTE_ORDER.get(c.recompute, len(_RECOMPUTE_ORDER)),
                               _complexity(c.plan), c.cost.memory.total))
    return SearchResult(ranked=ranked[:top], considered=considered, over_memory=over,
                        seconds=time.perf_counter() - start)


def _complexity(plan: Plan) -> int:
    """Ties go to the plan with fewer parallel dims in use (simpler to run, fewer failure modes)."""
    return sum(d > 1 for d in (plan.tp, plan.pp, plan.cp, plan.dp_replicate)) + (plan.pp_virtual_stages > 1)


def _walk(node):
    children = getattr(node, "children", None)
    if not callable(children):
        yield node
        return
    kids = children()
    for child in (kids.values() if isinstance(kids, dict) else kids):
        yield from _walk(child)


def _graph_check(plan: Plan, graph) -> str | None:
    """``check_plan``'s graph rules; nodes whose ``children()`` is a dict (``DiTBlock``) are walked here."""
    try:
        return _graph_problem(plan, graph)
    except AttributeError:
        pass
    for comp in graph.components:
        tp = plan.component_tp(comp.name)
        for node in (leaf for top in comp.nodes for leaf in _walk(top)):
            heads = [getattr(node, k, None) for k in ("heads", "kv_heads")]
            if any(isinstance(h, int) and (h % tp or plan.cp_kind == "ulysses" and (h // tp) % plan.cp)
                   for h in heads):
                return f"tp/cp do not divide the heads of {node.name!r}"
            shapes = node.param_shapes()
            if any(d is not None and shapes[k][d] % tp for k, d in node.tp_dims().items()):
                return f"tp={tp} does not divide a tensor-parallel dim of {node.name!r}"
    return None


def _why_none(cluster: Cluster, global_batch: int, leanest, fraction: float) -> str:
    if leanest is None:
        return (f"no plan for {cluster.describe()} divides train.global_batch={global_batch} and the model's "
                f"heads/widths; try a global batch that is a multiple of {cluster.gpus}")
    total, plan, mode, mem = leanest
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in mem.breakdown().items() if k != "total" and v)
    have = cluster.memory_bytes * fraction / GIB
    more = math.ceil(cluster.gpus * total / (cluster.memory_bytes * fraction))
    return (f"no plan fits: the leanest ({plan.describe()}, recompute={mode}) needs {total / GIB:.1f} GiB per GPU "
            f"but {cluster.gpu.name} offers {have:.1f} GiB ({fraction:.0%} of {cluster.gpu.memory_gib:g}); "
            f"GiB by kind: {parts}. Use GPUs with more memory, about {more} GPUs or more, "
            f"or a smaller micro-batch or sequence")
