"""The plan of a family run: searched (``parallel.plan = "auto"``) or parsed and checked (``manual``).

``auto`` runs lf-parallel's :func:`search_plans` on the detected cluster (CUDA), or,
on a CPU job, on a nominal cluster of ``world_size`` H100s: the cost model needs a
GPU, so on the CPU the ranking only orders the plans, its times are not CPU times
(logged as such). The recipe trainer runs data parallel, ZeRO 0-3 and tensor (+
sequence) parallel plans, pipeline parallel (``pp > 1``, any schedule, with tp / sp /
dp / ZeRO) for the llm family (llama3), and context parallel (``cp > 1``, ring or Ulysses,
``parallel.cp_kind``, with dp / ZeRO) for the video and llm families
(:mod:`lf_orchestrator.families._context`). Not wired: pipeline stages that would run encoders
(vlm / video / vla graphs, until lf-parallel's multimodal first stage exists), cp for the vlm
family, cp with tp or pp: such manual plans are refused before launch. The search result is the
fastest plan with ``pp = cp = 1`` (pipeline and context-parallel plans are chosen by hand).
"""

from __future__ import annotations

import msgspec

from lf_orchestrator.families._context import cp_unsupported, with_cp_kind
from lf_parallel import Plan, PlanError, check_plan, choose_plan, parse_plan


def _supported(plan: Plan, lora: bool, recipe: str) -> str | None:
    why = cp_unsupported(plan, recipe)
    if why:
        return why
    if lora and plan.tp > 1:
        return "train.lora_rank > 0 with tp > 1 is not supported (LoRA wraps the linears tensor parallelism splits)"
    return None


def _pipeline_unsupported(plan: Plan, cfg, graph) -> str | None:
    """Why the recipe trainer cannot run ``plan.pp > 1`` for this config and graph (None: it can)."""
    import torch

    from lf_kernels import MaskSpec
    from lf_orchestrator.families._pipeline_step import SIDE
    from lf_parallel._pipeline import build_stage_module
    from lf_parallel._stages import split_stages

    if cfg.model.recipe != "llama3":
        return (f"pp > 1 is wired into the recipe trainer for the llm family (model.recipe = 'llama3') only, "
                f"got model.recipe = {cfg.model.recipe!r}")
    try:
        specs = split_stages(graph, plan.pp, virtual_stages=plan.pp_virtual_stages)
        for spec in specs:  # on the meta device: no memory, raises what the real build would
            with torch.device("meta"):
                build_stage_module(graph, spec, MaskSpec(kind="causal"), SIDE)
    except ValueError as err:
        return f"pp={plan.pp}: {err}"
    if cfg.train.lora_rank > 0 or cfg.train.freeze:
        return "train.lora_rank > 0 and train.freeze are not supported with pp > 1"
    return None


def resolve_plan(cfg, graph, *, world_size: int, device_type: str, seq: int, precision: str
                 ) -> tuple[Plan, dict]:
    """(plan, info for plan.json / the log) for this job.

    Raises:
        PlanError: an invalid or unsupported manual plan, or no feasible plan (the message says why).
    """
    p, t = cfg.parallel, cfg.train
    lora = t.lora_rank > 0
    if p.plan == "manual":
        if p.spec:
            plan = with_cp_kind(parse_plan(p.spec), p.spec, p.cp_kind)
            if "micro_batch" not in p.spec and "mb=" not in p.spec:
                per = t.global_batch // max(plan.dp, 1)
                accum = plan.grad_accum if "grad_accum" in p.spec else p.grad_accum
                plan = msgspec.structs.replace(plan, grad_accum=accum, micro_batch=max(per // accum, 1))
        else:
            plan = Plan(dp=p.dp, micro_batch=p.micro_batch, grad_accum=p.grad_accum)
        plan = check_plan(plan, world_size=world_size, global_batch=t.global_batch, graph=graph)
        why = _supported(plan, lora, cfg.model.recipe) or (
            _pipeline_unsupported(plan, cfg, graph) if plan.pp > 1 else None)
        if why:
            raise PlanError(f"parallel.spec {p.spec!r}: {why}")
        return plan, {"source": "manual", "spec": p.spec}
    return _search(cfg, graph, world_size=world_size, device_type=device_type, seq=seq, precision=precision)


def _search(cfg, graph, *, world_size: int, device_type: str, seq: int, precision: str) -> tuple[Plan, dict]:
    from lf_parallel import detect_cluster, make_cluster, search_plans

    t = cfg.train
    if device_type == "cuda":
        cluster, nominal = detect_cluster(), False
    else:
        cluster, nominal = make_cluster(gpus=world_size, gpu="h100"), True
    prec = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(precision, "bf16")
    try:
        result = search_plans(graph, cluster, global_batch=t.global_batch, seq=seq, precision=prec, top=200,
                              max_micro_batch=cfg.parallel.micro_batch)
    except PlanError:
        raise
    ok = [c for c in result.ranked
          if c.plan.pp == 1 and c.plan.cp == 1 and _supported(c.plan, t.lora_rank > 0, cfg.model.recipe) is None]
    if not ok:  # the search found only pp / cp plans: fall back to data parallel
        plan = choose_plan(world_size=world_size, global_batch=t.global_batch, max_micro_batch=cfg.parallel.micro_batch)
        return plan, {"source": "auto (fallback: data parallel)", "cluster": cluster.describe(), "nominal": nominal}
    best = ok[0]
    plan = msgspec.structs.replace(best.plan, precision="fp32")  # autocast, not FSDP casts, sets compute dtype
    plan = check_plan(plan, world_size=world_size, global_batch=t.global_batch, graph=graph)
    return plan, {"source": "auto", "cluster": cluster.describe(), "nominal_cluster": nominal,
                  "predicted_step_s": best.cost.step_s, "recompute": best.recompute,
                  "considered": result.considered}
