"""Plan validation before launch: every constraint a plan must meet, with a valid nearby plan.

Checks, in order: positive degrees and known choices; the ZeRO/HSDP split; the
degrees multiplying to the number of processes; the batch sizes multiplying out;
sequence parallel and per-component overrides; and, given the model's IR graph,
that each component's tp divides every dimension tensor parallelism splits
(heads, kv_heads, FFN hidden width, vocabulary: read from each node's
``tp_dims()``), that Ulysses context parallel divides the local heads, and that
the pipeline has no more stages than blocks. The message names the constraint,
the value received, and a plan for the same job that passes every check.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from lf_parallel._plan import Plan, PlanError, choose_plan

_POSITIVE = ("dp", "dp_replicate", "tp", "pp", "pp_virtual_stages", "cp", "micro_batch", "grad_accum")


def check_plan(plan: Plan, *, world_size: int, global_batch: int, graph=None) -> Plan:
    """Validate ``plan`` for a job of ``world_size`` processes; returns it unchanged.

    Args:
        plan: the plan to check.
        world_size: processes in the job.
        global_batch: samples per optimizer step.
        graph: the model's ``lf_ir.Graph`` (optional): enables the divisibility checks
            against heads, kv_heads, hidden widths and vocabulary, and the block count.

    Raises:
        PlanError: the first constraint that broke (field, value, what it must satisfy),
            followed by ``try <a valid nearby plan>``.
    """
    problem = _problem(plan, world_size, global_batch, graph)
    if problem:
        near = _nearby(plan, world_size, global_batch, graph)
        if isinstance(near, PlanError):  # no valid plan for this job: say why instead of "try <an error>"
            raise PlanError(f"{problem}; and no plan of {world_size} processes fits: {near}")
        raise PlanError(f"{problem}; try {near}")
    return plan


def _problem(plan: Plan, world: int, batch: int, graph) -> str | None:
    for key in _POSITIVE:
        if getattr(plan, key) < 1:
            return f"parallel.{key} must be >= 1, got {getattr(plan, key)}"
    if plan.zero_stage not in (0, 1, 2, 3):
        return f"parallel.zero_stage must be 0, 1, 2 or 3, got {plan.zero_stage}"
    if plan.zero_stage < 2 and plan.dp_replicate != 1:
        return (f"parallel.dp_replicate={plan.dp_replicate} needs zero_stage 2 or 3 (HSDP); with "
                f"zero_stage={plan.zero_stage} every data-parallel rank already holds the parameters")
    if plan.dp % plan.dp_replicate:
        return f"parallel.dp_replicate={plan.dp_replicate} must divide parallel.dp={plan.dp}"
    if plan.world_size != world:
        if (plan.tp, plan.pp, plan.cp) == (1, 1, 1):
            return f"parallel.dp={plan.dp} must equal the number of processes ({world})"
        return (f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.world_size} must equal "
                f"the number of processes ({world})")
    if plan.global_batch != batch:
        return f"dp*micro_batch*grad_accum = {plan.global_batch} but train.global_batch = {batch}"
    if plan.sp and plan.tp == 1:
        return "parallel.sp=true needs tp > 1 (sequence parallel splits what tensor parallel replicates)"
    for name, override in plan.components.items():
        if override.tp is not None and override.tp not in (1, plan.tp):
            return (f"parallel.components.{name}.tp={override.tp} must be 1 (replicated) or the plan's "
                    f"tp={plan.tp}: the mesh has one tp dimension")
    if plan.tp > 1 and plan.dp > 1 and plan.zero_stage < 2:
        return (f"zero_stage={plan.zero_stage} with tp={plan.tp} and dp={plan.dp}: DDP cannot wrap "
                f"tensor-parallel (DTensor) parameters; use zero_stage 2 or 3 (FSDP2 on the 2-D mesh)")
    if plan.pp_virtual_stages > 1 and plan.pp_schedule not in ("interleaved_1f1b", "zero_bubble"):
        return (f"parallel.pp_virtual_stages={plan.pp_virtual_stages} needs pp_schedule interleaved_1f1b or "
                f"zero_bubble, got {plan.pp_schedule!r}")
    if plan.pp > 1 and plan.pp_schedule != "gpipe" and plan.grad_accum < plan.pp:
        return (f"parallel.grad_accum={plan.grad_accum} micro-batches cannot fill pp={plan.pp} stages "
                f"under {plan.pp_schedule}; use grad_accum >= {plan.pp}")
    return _graph_problem(plan, graph) if graph is not None else None


def _graph_problem(plan: Plan, graph) -> str | None:
    names = {c.name for c in graph.components}
    for name in plan.components:
        if name not in names:
            return (f"parallel.components.{name}: graph {graph.name!r} has no such component; "
                    f"components: {sorted(names)}")
    for comp in graph.components:
        tp = plan.component_tp(comp.name)
        for node in _walk(comp.nodes):
            heads = getattr(node, "heads", None)
            kv_heads = getattr(node, "kv_heads", None)
            for key, value in (("heads", heads), ("kv_heads", kv_heads)):
                if isinstance(value, int) and value % tp:
                    return (f"parallel.tp={tp} does not divide {key}={value} of node {node.name!r} "
                            f"(component {comp.name!r})")
            if plan.cp > 1 and plan.cp_kind == "ulysses" and isinstance(heads, int):
                for key, value in (("heads", heads), ("kv_heads", kv_heads)):
                    if isinstance(value, int) and (value // tp) % plan.cp:
                        return (f"parallel.cp={plan.cp} (ulysses) does not divide the {value // tp} local {key} "
                                f"of node {node.name!r} (component {comp.name!r}, {key}={value}, tp={tp})")
            shapes = node.param_shapes()
            for param, dim in node.tp_dims().items():
                if dim is not None and shapes[param][dim] % tp:
                    return (f"parallel.tp={tp} does not divide {param} dim {dim} = {shapes[param][dim]} of node "
                            f"{node.name!r} (component {comp.name!r})")
    blocks = max((len(c.blocks()) for c in graph.components), default=0)
    stages = plan.pp * plan.pp_virtual_stages
    if stages > 1 and stages > blocks:
        return (f"pp*pp_virtual_stages = {plan.pp}*{plan.pp_virtual_stages} = {stages} pipeline stages but the "
                f"model's longest component has only {blocks} transformer blocks")
    return None


def _walk(nodes) -> Iterator:
    for node in nodes:
        children = getattr(node, "children", None)
        if callable(children):
            kids = children()
            yield from _walk(kids.values() if isinstance(kids, dict) else kids)
        else:
            yield node


def _divisors_down(n: int, start: int) -> list[int]:
    return [d for d in range(min(n, start), 0, -1) if n % d == 0]


def _nearby(plan: Plan, world: int, batch: int, graph) -> str | PlanError:
    """A plan for the same job that passes every check: the given degrees where possible, else smaller; the
    PlanError of :func:`choose_plan` when none exists."""
    known = {c.name for c in graph.components} if graph is not None else set(plan.components)
    keep = dict(zero_stage=min(max(plan.zero_stage, 0), 3), precision=plan.precision, sp=plan.sp,
                pp_schedule=plan.pp_schedule, cp_kind=plan.cp_kind)
    for tp in _divisors_down(world, max(plan.tp, 1)):
        for pp in _divisors_down(world // tp, max(plan.pp, 1)):
            for cp in _divisors_down(world // (tp * pp), max(plan.cp, 1)):
                dp = world // (tp * pp * cp)
                if batch % dp:
                    continue
                per_rank = batch // dp
                accum = 1
                if pp > 1 and keep["pp_schedule"] != "gpipe":
                    accum = next((a for a in range(pp, per_rank + 1) if per_rank % a == 0), 1)
                fields = dict(keep, dp=dp, tp=tp, pp=pp, cp=cp, sp=keep["sp"] and tp > 1,
                              micro_batch=per_rank // accum, grad_accum=accum,
                              pp_virtual_stages=plan.pp_virtual_stages if pp > 1 else 1,
                              components={k: msgspec.structs.replace(v, tp=None if v.tp not in (1,) else 1)
                                          for k, v in plan.components.items() if k in known})
                if tp > 1 and dp > 1 and fields["zero_stage"] < 2:
                    fields["zero_stage"] = 3
                if fields["zero_stage"] >= 2 and plan.dp_replicate > 1 and dp % plan.dp_replicate == 0:
                    fields["dp_replicate"] = plan.dp_replicate
                try:
                    candidate = Plan(**fields)
                except (TypeError, msgspec.ValidationError):
                    continue
                if _problem(candidate, world, batch, graph) is None:
                    return candidate.describe()
    try:
        return choose_plan(world_size=world, global_batch=batch, max_micro_batch=batch).describe()
    except PlanError as err:
        return err
