"""The plan of a family run: searched (``parallel.plan = "auto"``) or parsed and checked (``manual``).

``auto`` runs lf-parallel's :func:`search_plans` on the detected cluster (CUDA), or,
on a CPU job, on a nominal cluster of ``world_size`` H100s: the cost model needs a
GPU, so on the CPU the ranking only orders the plans, its times are not CPU times
(logged as such). Its rates are :func:`lf_parallel.calibration_for`'s: this GPU's cached
measurement (``lf plan --calibrate``) when it is the cluster's model, else the defaults
(``calibration`` in ``plan.json`` says which). The trainer runs data parallel and ZeRO 0-3 for every recipe, and
what the recipe's :class:`lf_ir.RecipeSpec` declares: tensor parallel (``tensor_parallel``) with sequence parallel
(``sequence_parallel``), pipeline parallel (``pipeline``: any schedule, with tp / sp / dp / ZeRO; llama3 from its
graph, the token VLA with lf-parallel's multimodal stages) and context parallel (``context_parallel``: ring or
Ulysses, ``parallel.cp_kind``, with dp / ZeRO; :mod:`lf_orchestrator.families._context`). Not wired: cp with tp
or pp. A plan outside these is refused by name (:func:`capability_refusal` before launch and before any data,
:func:`trainer_unsupported` with the graph).

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
    if plan.tp > 1:
        from lf_ir import recipe_spec

        if not recipe_spec(recipe, where="model.recipe").tensor_parallel:
            return (f"tp > 1 (tensor parallel) is not supported for model.recipe = {recipe!r} (its RecipeSpec."
                    f"tensor_parallel is not set)")
    if plan.sp and plan.tp > 1:
        from lf_ir import recipe_spec

        if not recipe_spec(recipe, where="model.recipe").sequence_parallel:
            return (f"sp (sequence parallel) is not supported for model.recipe = {recipe!r} (its RecipeSpec."
                    f"sequence_parallel is not set); use tp without sp")
    if lora and plan.tp > 1:
        return "train.lora_rank > 0 with tp > 1 is not supported (LoRA wraps the linears tensor parallelism splits)"
    return None


def _pipeline_unsupported(plan: Plan, cfg, graph) -> str | None:
    """Why the trainer cannot run ``plan.pp > 1`` for this config and graph (None: it can)."""
    import torch

    from lf_ir import PIPELINE_GLUE, LMHead, recipe_spec
    from lf_kernels import MaskSpec
    from lf_orchestrator.train._pipeline_step import SIDE
    from lf_parallel import build_stage_module, split_stages

    why = _pipeline_undeclared(cfg.model.recipe)
    if why:
        return why
    spec = recipe_spec(cfg.model.recipe, where="model.recipe")
    # a model with lf-ir's pipeline glue: stage 0 runs its encoders (multimodal); else one trunk from the graph
    kind = "multimodal" if all(callable(getattr(spec.model, m, None)) for m in PIPELINE_GLUE) else "one trunk"
    try:
        specs = split_stages(graph, plan.pp, virtual_stages=plan.pp_virtual_stages)
        for stage in specs:  # on the meta device: no memory, raises what the real build would
            if kind == "one trunk":
                with torch.device("meta"):
                    build_stage_module(graph, stage, MaskSpec(kind="causal"), SIDE)
                continue
            nodes = graph.component(stage.trunk).nodes
            for node in nodes[stage.start:stage.stop]:  # a head tied to an embedding of another stage
                if isinstance(node, LMHead) and node.tied_to is not None and not any(
                        n.name == node.tied_to for n in nodes[stage.start:stage.stop]):
                    raise ValueError(f"stage {stage.index}: head {node.name!r} is tied to {node.tied_to!r} on "
                                     f"another stage")
    except ValueError as err:
        return f"pp={plan.pp}: {err}"
    if cfg.train.lora_rank > 0 or cfg.train.freeze:
        return "train.lora_rank > 0 and train.freeze are not supported with pp > 1"
    if cfg.memory.offload:
        return "memory.offload is not supported with pp > 1 (the schedule runs the stages' forwards)"
    if cfg.model.fused_ops:
        return "model.fused_ops is not supported with pp > 1 (the pipeline stages are built with the plain ops)"
    return None


def _pipeline_undeclared(recipe: str) -> str | None:
    """Why ``recipe`` takes no ``pp > 1`` (its RecipeSpec declares no pipeline), else None."""
    from lf_ir import RECIPES, recipe_spec

    if recipe_spec(recipe, where="model.recipe").pipeline:
        return None
    wired = sorted(name for name, s in RECIPES.items() if s.pipeline)
    return (f"pp > 1 is wired into the trainer for model.recipe in {wired} only (the recipes whose "
            f"RecipeSpec.pipeline is set), got model.recipe = {recipe!r}")


def capability_refusal(plan: Plan, cfg) -> str | None:
    """Why the trainer refuses ``plan`` for this config from the recipe's declared parallelisms and the config
    alone (no graph, no data: what ``lf launch`` and the trainer check before any worker or data), else None;
    the graph's own checks (heads dividing by tp, the pipeline split) come later in :func:`resolve_plan`."""
    why = _supported(plan, cfg.train.lora_rank > 0, cfg.model.recipe)
    if why is None and plan.pp > 1:
        why = _pipeline_undeclared(cfg.model.recipe)
    return why


_PP_CACHE: dict[tuple, str | None] = {}


def trainer_unsupported(plan: Plan, cfg, graph, seq: int) -> str | None:
    """Why ``lf run`` (the trainer) cannot run ``plan`` for this config, graph and ``seq`` tokens per
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


def spec_plan(spec: str, cfg, *, precision: str = "fp32") -> Plan:
    """An lf-parallel plan string read as ``lf run`` reads ``parallel.spec``: ``parallel.cp_kind`` applied, and,
    when the string gives no micro-batch, ``train.global_batch / dp`` samples per rank split into
    ``parallel.grad_accum`` micro-batches (the string's ``grad_accum`` when it has one). Not checked.

    Raises:
        PlanError: the string does not parse (names the key).
    """
    p, t = cfg.parallel, cfg.train
    plan = with_cp_kind(parse_plan(spec, precision=precision), spec, p.cp_kind)
    if "micro_batch" not in spec and "mb=" not in spec:
        per = t.global_batch // max(plan.dp, 1)
        accum = plan.grad_accum if "grad_accum" in spec else p.grad_accum
        plan = msgspec.structs.replace(plan, grad_accum=accum, micro_batch=max(per // accum, 1))
    return plan


def manual_plan(cfg, *, precision: str = "fp32") -> Plan:
    """The plan of ``parallel.plan = "manual"``: :func:`spec_plan` of ``parallel.spec``, else ``parallel.dp`` /
    ``micro_batch`` / ``grad_accum`` (not checked)."""
    p = cfg.parallel
    if p.spec:
        return spec_plan(p.spec, cfg, precision=precision)
    return Plan(dp=p.dp, micro_batch=p.micro_batch, grad_accum=p.grad_accum, precision=precision)


def rank_plans(cfg, graph, cluster, *, seq: int, precision: str, global_batch: int | None = None,
               top: int = 1 << 30, calibration=None):
    """lf-parallel's :func:`search_plans` ranking for a run config: ``train.global_batch`` samples per step
    (``global_batch`` overrides it) and micro-batches up to ``parallel.micro_batch``, the cap of
    ``parallel.plan = "auto"``. ``lf plan CONFIG`` and ``lf run`` rank with this one call, at ``calibration``'s
    rates (default :func:`lf_parallel.calibration_for`: this GPU's cached measurement when it is the cluster's
    model, else the defaults).

    Raises:
        NoFeasiblePlan: nothing fits or divides (the message says what).
    """
    from lf_parallel import calibration_for, search_plans

    return search_plans(graph, cluster, global_batch=global_batch or cfg.train.global_batch, seq=seq,
                        precision=precision, top=top, max_micro_batch=cfg.parallel.micro_batch,
                        calibration=calibration or calibration_for(cluster))


def resolve_plan(cfg, graph, *, world_size: int, device_type: str, seq: int, precision: str
                 ) -> tuple[Plan, dict]:
    """(plan, info for plan.json / the log) for this job.

    Raises:
        PlanError: an invalid or unsupported manual plan, or no feasible plan (the message says why).
    """
    p, t = cfg.parallel, cfg.train
    lora = t.lora_rank > 0
    if p.plan == "manual":
        plan = manual_plan(cfg)
        plan = check_plan(plan, world_size=world_size, global_batch=t.global_batch, graph=graph)
        why = _supported(plan, lora, cfg.model.recipe) or (
            _pipeline_unsupported(plan, cfg, graph) if plan.pp > 1 else None)
        if why:
            raise PlanError(f"parallel.spec {p.spec!r}: {why}")
        return with_fsdp_compute(plan, precision, device_type), {"source": "manual", "spec": p.spec}
    plan, info = _search(cfg, graph, world_size=world_size, device_type=device_type, seq=seq, precision=precision)
    return with_fsdp_compute(plan, precision, device_type), info


def with_fsdp_compute(plan: Plan, precision: str, device_type: str) -> Plan:
    """``plan`` with ``precision = "bf16"`` where FSDP2 should cast the parameters: bf16 compute on CUDA under a
    ZeRO-2/3 plan without pipeline stages. FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
    then all-gathers bf16 copies of the fp32 shards (half the bytes) and the blocks compute on bf16 weights,
    instead of all-gathering fp32 weights that autocast casts again at every op (and that leave the LM head and
    norms in fp32). The optimizer keeps its fp32 shards; gradients reduce in fp32. Measured on Llama-3-8B, 2 H200,
    ZeRO-3 (``examples/full/llama3_8b.toml``, profile in ``examples/results/full/``): the fp32 all-gathers and the
    fp32 LM-head GEMMs were most of the step. Every other plan keeps fp32 parameters under autocast (fp16 runs
    too: their loss scaler unscales fp32 gradients)."""
    if device_type == "cuda" and precision == "bf16" and plan.zero_stage >= 2 and plan.pp == 1:
        return msgspec.structs.replace(plan, precision="bf16")
    return plan


def search_cluster(device_type: str, world_size: int):
    """(cluster, nominal) the auto plan is searched on: the detected one on CUDA; on other devices a nominal
    cluster of ``world_size`` H100s (the ranking then only orders plans; nominal = True says so)."""
    from lf_parallel import detect_cluster, make_cluster

    if device_type == "cuda":
        return detect_cluster(), False
    return make_cluster(gpus=world_size, gpu="h100"), True


def _search(cfg, graph, *, world_size: int, device_type: str, seq: int, precision: str) -> tuple[Plan, dict]:
    cluster, nominal = search_cluster(device_type, world_size)
    prec = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(precision, "bf16")
    return auto_plan(cfg, graph, cluster, world_size=world_size, seq=seq, precision=prec, nominal=nominal)


def auto_plan(cfg, graph, cluster, *, world_size: int, seq: int, precision: str, nominal: bool = False
              ) -> tuple[Plan, dict]:
    """(plan, info) of ``parallel.plan = "auto"`` on ``cluster``: the fastest plan of :func:`rank_plans` that
    :func:`trainer_unsupported` lets run, else data parallel (the module docstring); ``precision = "fp32"`` on
    the plan (autocast sets the compute dtype).

    Raises:
        PlanError: the chosen plan fails :func:`check_plan` for ``world_size`` processes.
    """
    from lf_parallel import calibration_for

    t = cfg.train
    cal = calibration_for(cluster)
    result = rank_plans(cfg, graph, cluster, seq=seq, precision=precision, calibration=cal)
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
    info = {"cluster": cluster.describe(), "nominal_cluster": nominal, "calibration": cal.source,
            "considered": result.considered, "skipped": skipped}
    if best is None:  # nothing the search ranked runs here: fall back to data parallel
        plan = choose_plan(world_size=world_size, global_batch=t.global_batch, max_micro_batch=cfg.parallel.micro_batch)
        return plan, {"source": "auto (fallback: data parallel)", **info}
    plan = msgspec.structs.replace(best.plan, precision="fp32")  # autocast, not FSDP casts, sets compute dtype
    plan = check_plan(plan, world_size=world_size, global_batch=t.global_batch, graph=graph)
    return plan, {"source": "auto", "predicted_step_s": best.cost.step_s, "recompute": best.recompute, **info}


SKIPPED_LISTED = 5
"""Faster plans the trainer cannot run, listed in ``plan.json`` (the first ones of the ranking)."""
