"""`lf memory`: the per-GPU memory of one plan, by kind, and whether it fits the GPU.

The model comes from a run config or ``--recipe`` / ``--size`` (:func:`.plan_cmd.resolve_model`). With a run
config the plan, batch and recompute are the run's own, as ``lf run`` resolves them (:mod:`.families._plan`):
``parallel.spec`` (its micro-batch from ``train.global_batch`` when it gives none) or the manual ``dp`` /
``micro_batch`` / ``grad_accum``, or, with ``parallel.plan = "auto"``, the first plan of ``lf plan``'s ranking
the trainer can run on ``--gpus`` GPUs; ``train.global_batch``; ``memory.recompute`` (``auto``: lf-memory's
knapsack planner under ``memory.budget_gib``, :mod:`.families._recompute`). ``--plan`` / ``--recompute`` override them.

The table lists each kind and, separately, the sum of the kinds and the peak: the peak is what one GPU
holds at once, the larger of the start of backward (only the gradients written so far) and the optimizer
step (no activations), so it is less than the sum (``lf_memory.MemoryEstimate.total``).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Annotated, Literal, Optional

import msgspec
import typer
from rich.table import Table

from lf_orchestrator._console import make_console
from lf_orchestrator._options import SetOpt
from lf_orchestrator.plan_cmd import (
    GIB,
    ConfigArg,
    FramesOpt,
    GpuOpt,
    GpusOpt,
    HeightOpt,
    InterOpt,
    JsonOpt,
    PerNodeOpt,
    PrecisionOpt,
    RecipeOpt,
    SeqOpt,
    SizeOpt,
    WidthOpt,
    _fail,
    load_run_config,
    print_sample_and_legend,
    resolve_cluster,
    resolve_model,
)

PlanOpt = Annotated[Optional[str], typer.Option(
    help="Plan as key=value, e.g. 'dp=8,zero=3,tp=2,mb=1' (default: the config's, else dp=1).")]
RecomputeOpt = Annotated[Optional[Literal["none", "selective", "full", "every_k", "auto"]], typer.Option(
    help="Activation recomputation (default: the config's memory.recompute, else none).")]


def _plan(cfg, graph, spec: Optional[str], gpus: Optional[int], gpu: str, gpus_per_node, inter: float,
          tokens: int, precision: str):
    """(checked plan, global batch, cluster) of the command line and run config (see the module docstring)."""
    from lf_orchestrator.families._plan import auto_plan, manual_plan, spec_plan
    from lf_parallel import PlanError, check_plan, parse_plan

    if spec is not None:
        plan = spec_plan(spec, cfg, precision=precision) if cfg else parse_plan(spec, precision=precision)
    elif cfg is not None and cfg.parallel.plan == "manual":
        plan = manual_plan(cfg, precision=precision)
        if gpus is not None and gpus != plan.world_size:
            what = f"parallel.spec {cfg.parallel.spec!r}" if cfg.parallel.spec else f"parallel.dp = {cfg.parallel.dp}"
            raise PlanError(f"{what} is a plan for {plan.world_size} GPU(s), not --gpus {gpus}: pass --plan to "
                            f"estimate another plan on {gpus} GPUs")
    elif cfg is not None:  # parallel.plan = "auto": what the trainer picks on these GPUs
        world = gpus or 1
        cluster = resolve_cluster(world, gpus_per_node, gpu, inter)
        plan, _ = auto_plan(cfg, graph, cluster, world_size=world, seq=tokens, precision=precision)
        plan = msgspec.structs.replace(plan, precision=precision)
    else:  # no run config: data parallel over the GPUs asked for
        plan = parse_plan(f"dp={gpus or 1}", precision=precision)
    world = gpus or plan.world_size
    batch = cfg.train.global_batch if cfg is not None else plan.global_batch
    # the plan must run on these GPUs and divide this model (heads, widths, layers), as before a launch
    plan = check_plan(plan, world_size=world, global_batch=batch, graph=graph)
    return plan, batch, resolve_cluster(world, gpus_per_node, gpu, inter)


def _auto_estimate(cfg, graph, plan, tokens: int, precision: str):
    """(estimate, option -> blocks) under ``memory.recompute = "auto"``: the trainer's knapsack plan
    (:func:`.families._recompute.plan_family_recompute`) for the pipeline stage with the highest peak. The
    activations are :func:`lf_memory.estimate_memory`'s with every block kept, less the bytes the plan's
    recomputed blocks free by the planner's own byte model (its plan against the same planner keeping every
    block); temporaries are those of ``full`` when any block is recomputed (one block re-materialized). Planner and
    estimate count the same bytes (``kernels="cuda"``: fused RMSNorm, the plan's residual-stream dtype), so
    the activations equal :func:`lf_memory.estimate_memory`'s rule block by block for the chosen options (the
    planner's own total adds the few MiB all blocks share, a DiT's text context and RoPE tables).

    Raises:
        ValueError: no run config or ``memory.budget_gib`` <= 0 (names the field); ConfigError: the budget
            leaves no room (from the planner).
    """
    from lf_memory import estimate_memory
    from lf_orchestrator.families._recompute import plan_family_recompute

    if cfg is None or cfg.memory.budget_gib <= 0:
        got = "no run config" if cfg is None else f"memory.budget_gib = {cfg.memory.budget_gib}"
        raise ValueError(f"--recompute auto: lf-memory's planner picks per block under memory.budget_gib, so it "
                         f"needs memory.budget_gib > 0 in the run CONFIG (got {got}); or pass --recompute none, "
                         f"selective, full or every_k")
    none = estimate_memory(graph, plan, seq=tokens, precision=precision, recompute="none")
    family, dtype_bytes = SimpleNamespace(graph=graph, seq_len=tokens), 4 if precision == "fp32" else 2
    rplan = plan_family_recompute(cfg, family, plan, dtype_bytes, pp_rank=none.stage)
    counts = {k: v for k, v in rplan.counts().items() if v}
    if all(option == "none" for option in rplan.block_options()):
        return none, counts
    unbounded = msgspec.structs.replace(cfg, memory=msgspec.structs.replace(cfg.memory, budget_gib=1e12))
    keep_all = plan_family_recompute(unbounded, family, plan, dtype_bytes, pp_rank=none.stage)
    full = estimate_memory(graph, plan, seq=tokens, precision=precision, recompute="full", stage=none.stage)
    freed = keep_all.saved_bytes - rplan.saved_bytes
    return msgspec.structs.replace(none, activations=max(none.activations - freed, full.activations),
                                   temporaries=full.temporaries), counts


def memory_cmd(config: ConfigArg = None, recipe: RecipeOpt = None, size: SizeOpt = None, seq: SeqOpt = None,
               frames: FramesOpt = None, height: HeightOpt = None, width: WidthOpt = None, plan: PlanOpt = None,
               recompute: RecomputeOpt = None, gpus: GpusOpt = None, gpus_per_node: PerNodeOpt = None,
               gpu: GpuOpt = "h100", inter_node_gbps: InterOpt = 400.0, precision: PrecisionOpt = "bf16",
               as_json: JsonOpt = False, overrides: SetOpt = None):
    """Peak memory per GPU of one plan, by kind, and whether it fits the GPU (a run CONFIG's own plan,
    batch and recompute unless --plan / --recompute say otherwise; --set overrides its values, as for lf run)."""
    from lf_memory import estimate_memory
    from lf_orchestrator.config import ConfigError
    from lf_parallel import ClusterError, PlanError

    counts = None
    try:
        cfg, seq_from = load_run_config(config, overrides, recipe), []
        graph, tokens, _ = resolve_model(config, recipe, size, seq, frames, height, width, run_cfg=cfg,
                                         seq_from=seq_from)
        parsed, _, cluster = _plan(cfg, graph, plan, gpus, gpu, gpus_per_node, inter_node_gbps, tokens, precision)
        mode = recompute or (cfg.memory.recompute if cfg is not None else "none")
        if mode == "auto":
            est, counts = _auto_estimate(cfg, graph, parsed, tokens, precision)
        else:
            every = cfg.memory.recompute_every if cfg is not None else 2
            est = estimate_memory(graph, parsed, seq=tokens, precision=precision, recompute=mode,
                                  recompute_every=every)
    except (ConfigError, ClusterError, PlanError, ValueError) as err:
        _fail(str(err))
    have = cluster.memory_bytes
    rows = {k: v / GIB for k, v in est.breakdown().items()}
    kinds = {k: v for k, v in rows.items() if k != "total"}
    shown = mode + (f" ({', '.join(f'{k} {v}' for k, v in counts.items())} blocks)" if counts else "")
    if as_json:
        print(json.dumps({"model": graph.name, "plan": parsed.describe(), "recompute": mode, "stage": est.stage,
                          "tokens_per_sample": tokens, "tokens_per_sample_from": seq_from[0],
                          "recompute_blocks": counts, "gib": rows, "sum_gib": sum(kinds.values()),
                          "peak_gib": est.total / GIB, "gpu": cluster.gpu.name, "gpu_gib": have / GIB,
                          "fits": est.total <= have}))
        return
    table = Table(title=f"{graph.name}: {parsed.describe()}, recompute={shown}, "
                        f"pipeline stage {est.stage} of {parsed.pp}")
    table.add_column("kind")
    table.add_column("GiB per GPU", justify="right")
    for key, value in kinds.items():
        table.add_row(key, f"{value:.2f}")
    table.add_section()
    table.add_row("sum of the kinds", f"{sum(kinds.values()):.2f}")
    table.add_row("peak (held at once)", f"{est.total / GIB:.2f}")
    make_console().print(table)
    make_console().print("peak: the larger of the start of backward (only the gradients written so far) and the "
                         "optimizer step (no activations), not the sum of the kinds", highlight=False)
    from lf_orchestrator._plan_legend import zero_stage_line

    make_console().print(f"{zero_stage_line(parsed.zero_stage)}\npipeline stage {est.stage} of {parsed.pp}: the "
                         "figures are for the pipeline stage with the highest peak (pp = 1: the whole model)",
                         highlight=False)
    print_sample_and_legend(make_console(), tokens, seq_from[0], [parsed.describe()])
    verdict = "fits" if est.total <= have else f"does NOT fit: {est.total / GIB:.1f} GiB needed"
    make_console().print(f"{cluster.gpu.name} has {have / GIB:.1f} GiB: {verdict}", highlight=False)
    if est.total > have:
        raise typer.Exit(1)

