"""``memory.recompute = "auto"`` in the trainer: lf-memory's knapsack planner on the family's graph.

:func:`plan_family_recompute` plans one option per block (``none`` / ``selective`` / ``selective_attn`` /
``full``, :func:`lf_memory.plan_recompute`) for the blocks this rank runs, at the plan's micro-batch and the
family's sequence length (its main component's tokens per sample; other components keep their graph
``seq_len``), in the compute dtype's bytes. The activation budget is ``memory.budget_gib`` less everything else
this rank holds with its activations at the start of backward (:attr:`lf_memory.MemoryEstimate.backward_peak`
less the activations, under the plan: weights, the gradients written by then, AdamW state, low-precision
working copies, communication buffers, and the temporaries of a recomputed block and the loss head), so the
peak that ``lf memory`` predicts for the chosen plan stays within the budget.

Under pipeline parallel (``plan.pp > 1``) the planned graph is this pipeline rank's stages only (its slices
of the trunk, and the encoders on stage 0), with the micro-batches its schedule keeps in flight
(:func:`lf_memory.in_flight_micro_batches`); :func:`stage_plan` cuts the plan down to one stage's blocks.

Context parallel (``plan.cp > 1``): each rank's blocks hold ``seq_len / cp`` tokens, so the planner gets that
sequence length.

Kernels: the planner and the estimator count the same bytes, ``kernels="cuda"`` by default (fused RMSNorm keeps
its input and a float32 rstd; a decoder's norms read the residual stream of
:func:`lf_memory._estimate.residual_stream_bytes`: bf16 under FSDP2 with bf16 parameters, else float32);
``kernels="cpu"`` for a run on the CPU.

Not modelled: tensor and sequence parallel split activations too (the plan keeps the unsplit bytes, so it
recomputes more than needed, never less).
"""

from __future__ import annotations

import math

import msgspec
from torch import nn

from lf_memory import RecomputePlan, estimate_memory, in_flight_micro_batches, plan_recompute, residual_stream_bytes


def _prec(dtype_bytes: int) -> str:
    return "fp32" if dtype_bytes >= 4 else "bf16"


def _rank_graph(graph, plan, pp_rank: int):
    """The part of ``graph`` pipeline rank ``pp_rank`` runs: its trunk slices, plus the encoders on stage 0."""
    from lf_parallel import split_stages

    specs = [s for s in split_stages(graph, plan.pp, virtual_stages=plan.pp_virtual_stages) if s.rank == pp_rank]
    trunk = specs[0].trunk
    encoders = {e for s in specs for e in s.encoders}
    comps = []
    for comp in graph.components:
        if comp.name == trunk:
            nodes = [n for s in specs for n in comp.nodes[s.start:s.stop]]
            comps.append(msgspec.structs.replace(comp, nodes=nodes))
        elif comp.name in encoders:
            comps.append(comp)
    return msgspec.structs.replace(graph, components=comps)


def plan_family_recompute(cfg, family, plan, dtype_bytes: int, *, pp_rank: int = 0,
                          kernels: str = "cuda") -> RecomputePlan:
    """The recompute plan of this rank's blocks for ``memory.recompute = "auto"`` (see the module docstring).

    Args:
        cfg: the run config (``memory.budget_gib``).
        family: the run's family (``graph``, ``seq_len``: tokens per sample of the main component; optionally
            ``recompute_key_padding``: components whose blocks keep a key-padding mask, none when absent).
        plan: the checked parallel plan (``micro_batch``; ``pp``, ``pp_schedule``, ``grad_accum`` for pipelines).
        dtype_bytes: bytes per activation element (2 under bf16 / fp16 autocast, 4 in float32).
        pp_rank: this rank's pipeline rank (``plan.pp > 1``).
        kernels: ``"cuda"`` (a GPU run, ``lf memory``) or ``"cpu"`` (a CPU run): the byte rules of both the
            estimate and the planner (see the module docstring).

    Returns:
        A fitting :class:`lf_memory.RecomputePlan` (blocks in graph order: ``model.blocks`` order).

    Raises:
        ConfigError: ``memory.budget_gib`` leaves no room, or not even full recomputation fits (names the
            budget, the bytes left for activations and the least the plan can keep).
    """
    from lf_orchestrator.config import ConfigError
    from lf_parallel import trunk_component

    graph = family.graph
    seq = {trunk_component(graph): int(family.seq_len) // plan.cp}  # a cp rank holds 1/cp of the tokens
    # recompute="full": the temporaries then include one re-materialized block, the most any plan holds
    states = estimate_memory(graph, plan, seq=int(family.seq_len), precision=_prec(dtype_bytes),
                             recompute="full", stage=pp_rank if plan.pp > 1 else None, kernels=kernels)
    fixed = states.backward_peak - states.activations
    total = int(cfg.memory.budget_gib * 2**30)
    if states.optimizer_peak > total:
        raise ConfigError(f"memory.budget_gib: {cfg.memory.budget_gib} GiB is less than the optimizer step's "
                          f"{states.optimizer_peak / 2**30:.4f} GiB of weights, gradients, AdamW state and "
                          f"communication buffers, which no recompute mode reduces")
    budget = total - fixed
    in_flight = 1
    if plan.pp > 1:
        graph = _rank_graph(graph, plan, pp_rank)
        in_flight = math.ceil(in_flight_micro_batches(plan.pp_schedule, plan.pp, pp_rank, plan.grad_accum,
                                                      plan.pp_virtual_stages))
    result = plan_recompute(graph, max(budget, 0), plan.micro_batch, seq, dtype_bytes, in_flight=in_flight,
                            key_padding=getattr(family, "recompute_key_padding", frozenset()),
                            kernels=kernels, stream_db=residual_stream_bytes(plan, dtype_bytes))
    if not result.fits:
        raise ConfigError(f"memory.budget_gib: {cfg.memory.budget_gib} GiB leaves {budget / 2**30:.4f} GiB for "
                         f"activations after {fixed / 2**30:.4f} GiB of weights, gradients, AdamW state, working "
                         f"copies, temporaries and buffers, but "
                         f"even full recomputation keeps {result.saved_bytes / 2**30:.4f} GiB (micro-batch "
                         f"{plan.micro_batch}, {seq} tokens per sample)")
    return result


def stage_plan(plan: RecomputePlan, blocks: list[nn.Module]) -> RecomputePlan:
    """``plan`` cut down to ``blocks`` (one pipeline stage's, in order; matched by their IR node names).

    Raises:
        ValueError: a block without an IR node, or one the plan does not hold.
    """
    by_name = {}
    for comp, names in plan.names.items():
        for name, option in zip(names, plan.options[comp], strict=True):
            by_name[name] = (comp, option)
    options: dict[str, list[str]] = {}
    names: dict[str, list[str]] = {}
    for block in blocks:
        node = getattr(block, "lf_node", None)
        if node is None or node.name not in by_name:
            raise ValueError(f"block {type(block).__name__} ({getattr(node, 'name', 'no IR node')}) is not in the "
                             f"recompute plan's blocks {sorted(by_name)}")
        comp, option = by_name[node.name]
        options.setdefault(comp, []).append(option)
        names.setdefault(comp, []).append(node.name)
    return msgspec.structs.replace(plan, options=options, names=names)


def describe_plan(plan: RecomputePlan) -> dict:
    """The plan for ``plan.json`` and the log: per-component options, counts, predicted saved bytes."""
    return {"options": plan.options, "counts": {k: v for k, v in plan.counts().items() if v},
            "saved_bytes": plan.saved_bytes, "budget_bytes": plan.budget_bytes,
            "recompute_flops": plan.recompute_flops, **({"unpredicted": plan.unpredicted} if plan.unpredicted else {})}


def plan_line(info: dict) -> str:
    """One log line of :func:`describe_plan`'s dict."""
    opts = "; ".join(f"{comp}: {' '.join(o)}" for comp, o in info["options"].items())
    return (f"recompute (auto): {opts}; predicted saved activations {info['saved_bytes'] / 2**20:.2f} MiB of "
            f"{info['budget_bytes'] / 2**20:.2f} MiB budget, {info['recompute_flops'] / 1e9:.3f} GFLOP recomputed "
            f"per micro-batch")
