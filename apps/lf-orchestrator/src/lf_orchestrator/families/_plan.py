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
family, cp with tp or pp: such manual plans are refused before launch.

``auto`` takes the fastest plan of the ranking that ``lf plan`` prints (the same :func:`search_plans` call)
that this trainer can run (:func:`trainer_unsupported`: the rules above, ``parallel.cp_kind`` when set, and
the zigzag split of the tokens by ``2 * cp``); the faster plans it skips are logged with the reason and listed
in ``plan.json`` (``skipped``), and ``lf plan CONFIG`` shows the same reason per plan.
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


_PP_CACHE: dict[tuple, str | None] = {}


def trainer_unsupported(plan: Plan, cfg, graph, seq: int) -> str | None:
    """Why ``lf run`` (the recipe trainer) cannot run ``plan`` for this config, graph and ``seq`` tokens per
    sample; None when it can. Pipeline plans are checked by building their stages on the meta device (cached
    per model, LoRA / freezing and ``(pp, virtual stages)``)."""
    why = _supported(plan, cfg.train.lora_rank > 0, cfg.model.recipe)
    if why is None and plan.cp > 1:
        kind = cfg.parallel.cp_kind
        if kind and plan.cp_kind != kind:
            why = f"parallel.cp_kind = {kind!r} (this plan uses {plan.cp_kind})"
        elif seq % (2 * plan.cp):
            why = f"{seq} tokens per sample do not divide by 2 * cp = {2 * plan.cp} (zigzag split)"
    if why is None and plan.pp > 1:
        key = (cfg.model.recipe, cfg.model.size, repr(cfg.model.overrides), cfg.train.lora_rank,
               bool(cfg.train.freeze), plan.pp, plan.pp_virtual_stages)
        if key not in _PP_CACHE:
            _PP_CACHE[key] = _pipeline_unsupported(plan, cfg, graph)
        why = _PP_CACHE[key]
    return why


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
    result = search_plans(graph, cluster, global_batch=t.global_batch, seq=seq, precision=prec, top=1 << 30,
                          max_micro_batch=cfg.parallel.micro_batch)
    skipped: list[dict] = []
    best = None
    for cand in result.ranked:
        why = trainer_unsupported(cand.plan, cfg, graph, seq)
        if why is None:
            best = cand
            break
        if len(skipped) < SKIPPED_LISTED:
            skipped.append({"plan": cand.plan.describe(), "recompute": cand.recompute,
                            "predicted_step_s": cand.cost.step_s, "why": why})
    info = {"cluster": cluster.describe(), "nominal_cluster": nominal, "considered": result.considered,
            "skipped": skipped}
    if best is None:  # nothing the search ranked runs here: fall back to data parallel
        plan = choose_plan(world_size=world_size, global_batch=t.global_batch, max_micro_batch=cfg.parallel.micro_batch)
        return plan, {"source": "auto (fallback: data parallel)", **info}
    plan = msgspec.structs.replace(best.plan, precision="fp32")  # autocast, not FSDP casts, sets compute dtype
    plan = check_plan(plan, world_size=world_size, global_batch=t.global_batch, graph=graph)
    return plan, {"source": "auto", "predicted_step_s": best.cost.step_s, "recompute": best.recompute, **info}


SKIPPED_LISTED = 5
"""Faster plans the trainer cannot run, listed in ``plan.json`` (the first ones of the ranking)."""
