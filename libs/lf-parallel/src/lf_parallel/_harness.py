"""Correctness harness: a recipe's tiny model trained under parallel plans vs. one process.

A plan is correct when, on the same deterministic weights (``lf_ir.materialize``
with one seed) and the same fixed random global batch, the losses and gradient norms of
every step, the gradients of the last step (gathered to full tensors, after clipping) and
the parameters after the last AdamW step equal the single-process run's (DESIGN.md, "Testing on
machines without a GPU"). :func:`run_jobs` spawns one gloo CPU world and runs a
list of jobs in it (one world serves many plans: process start-up dominates on a
small machine); the reference runs in the calling process meanwhile.

Relative difference of a tensor: ``max|a - b| / max|b|`` (the worst element against
the tensor's scale, so entries near zero do not blow it up); of a run: the largest
over its tensors.

What it runs: the plan's tensor (+ sequence) parallel, context parallel, data parallel with ZeRO 0-3 and
HSDP, per-component overrides, and a DCP reshard (``Job.reshard_to``): one forward and backward of each dp
rank's share of the global batch per step, then AdamW, in ``Job.dtype``. What it does not run (refused by
:func:`harness_unsupported`, never run as something else): pipeline parallel (``pp > 1``: the harness has
no schedule, every pipeline rank would train the whole model), gradient accumulation (``grad_accum > 1``:
one backward per step, so each rank would see ``1 / grad_accum`` of its samples) and mixed precision
(``precision`` other than fp32). It clips gradients to ``Job.grad_clip``. The trainer runs all of those:
``lf parallel check`` (lf-orchestrator) trains a plan with ``lf run`` itself against one process; this harness
serves the library's own tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Literal

import msgspec
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from lf_parallel._checkpoint import load_checkpoint, save_checkpoint
from lf_parallel._context import context_parallel_of
from lf_parallel._grad_norm import clip_grad_norm_
from lf_parallel._harness_recipes import HARNESS_RECIPES, HarnessRecipe
from lf_parallel._mesh import build_mesh, flat_dp_group
from lf_parallel._parallelize import parallelize
from lf_parallel._plan import Plan, PlanError, parse_plan
from lf_parallel._plan_check import check_plan
from lf_parallel._tensor_parallel import loss_parallel_context
from lf_parallel._zero import build_optimizer


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One check: train ``recipe``/``size`` under ``plan`` for ``steps`` steps.

    With ``reshard_to`` set, the state after ``steps - 1`` steps is saved with DCP, loaded under the
    ``reshard_to`` plan, and the last step runs there.
    """

    recipe: str
    size: str = "tiny"
    plan: str
    steps: int = 3
    global_batch: int = 4
    reshard_to: str | None = None
    seed: int = 0
    lr: float = 1e-3
    eps: float = 1e-5
    """AdamW eps. Adam's update ``g / (|g| + eps)`` multiplies a gradient's float32 round-off by about
    ``lr / (4 eps)`` where ``|g|`` is near ``eps``; the default 1e-8 makes a few such entries (e.g. tied
    embedding rows of absent tokens, or value weights) dominate the comparison; 1e-5 keeps the check on
    the gradients (Adam is unchanged wherever |g| >> 1e-5)."""
    grad_clip: float = 0.0
    """Clip the gradients to this total norm after each backward, as the trainers do (``train.grad_clip``),
    with :func:`lf_parallel.clip_grad_norm_` on the plan's shards; 0: no clipping. The norm is computed and
    compared with the single process's either way."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameters, batch and compute dtype (the default dtype while the job builds and trains). float64
    separates a plan's errors from float32 round-off where gradients are near-cancelling sums."""


@dataclasses.dataclass
class CheckResult:
    """Differences of one job against the single-process run."""

    job: Job
    losses: list[float]
    """Per-step loss under the plan (mean over the global batch)."""
    ref_losses: list[float]
    """Per-step loss of the single-process run."""
    loss_rel: float
    """max over steps of |loss - ref| / |ref|."""
    grad_rel: float
    """max over parameters of max|g - g_ref| / max|g_ref| at the last step."""
    param_rel: float
    """Same for the parameters after the last optimizer step."""
    worst: str
    """Name of the parameter with the largest gradient difference."""
    grad_rel_model: float
    """max over parameters of max|g - g_ref| / (max over *all* parameters of max|g_ref|): the gradient error
    against the model's gradient scale. For a gradient that is a near-cancelling sum (a key bias: softmax
    ignores a shift shared by all keys, so its gradient sums terms that cancel to ~1e-2 of their size), the
    per-tensor ``grad_rel`` measures float32 round-off of the terms, not an error of the plan."""
    worst_param: str
    """Name of the parameter with the largest difference after the last step."""
    shard_fractions: dict[str, float]
    """On rank 0 after the last step: elements held locally / full elements, for ``params``, ``grads``
    (last step) and ``optim_state`` (AdamW moments): 1.0 replicated, 1/n sharded n ways."""
    grad_rels: dict[str, float] = dataclasses.field(default_factory=dict)
    """Parameter name -> max|g - g_ref| / max|g_ref| at the last step."""
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    """Per-step total gradient 2-norm under the plan (before clipping), the same on every rank."""
    ref_grad_norms: list[float] = dataclasses.field(default_factory=list)
    """Per-step total gradient 2-norm of the single-process run."""
    grad_norm_rel: float = 0.0
    """max over steps of |norm - ref| / ref."""

    @property
    def max_rel(self) -> float:
        return max(self.loss_rel, self.grad_rel, self.param_rel, self.grad_norm_rel)


def harness_unsupported(plan: Plan, text: str = "...") -> str | None:
    """Why the harness cannot check ``plan`` (the first plan field it does not run), or None.

    Args:
        plan: the parsed plan (:func:`parse_plan`; checking it against the model is not needed).
        text: the plan as the user wrote it, quoted in the suggested ``lf parallel check`` command.

    Returns:
        A message naming the field and its value and saying how to check the plan instead, or None.
    """
    instead = (f"; check it through the trainer instead: `lf parallel check --recipe RECIPE "
               f"--plan '{text}' --nproc {plan.world_size}` (lf-orchestrator) trains it with `lf run` and compares "
               f"with one process")
    if plan.pp > 1:
        return (f"pp={plan.pp}: the harness does not run pipeline schedules (every pipeline rank would train the "
                f"whole model){instead}")
    if plan.grad_accum > 1:
        return (f"grad_accum={plan.grad_accum}: the harness does not accumulate micro-batches (one backward per "
                f"step: each rank would train on 1/{plan.grad_accum} of its samples){instead}")
    if plan.precision != "fp32":
        return (f"precision={plan.precision}: the harness does not run mixed precision (it trains in "
                f"Job.dtype float32/float64 against a single process in that dtype){instead}")
    return None


def resolve_plan(text: str, *, world_size: int, global_batch: int, graph=None) -> Plan:
    """Parse ``text``, fill ``micro_batch`` from the batch and dp, and check it (raises PlanError)."""
    plan = parse_plan(text)
    if "micro_batch" not in text and "mb=" not in text and plan.dp and global_batch % plan.dp == 0:
        plan = msgspec.structs.replace(plan, micro_batch=global_batch // plan.dp // plan.grad_accum or 1)
    return check_plan(plan, world_size=world_size, global_batch=global_batch, graph=graph)


def _build(job: Job, device: str = "cpu"):
    from lf_ir import materialize

    recipe = HARNESS_RECIPES[job.recipe]
    with torch.device("meta"):
        model = recipe.build(job.size)
    return materialize(model, device, seed=job.seed), recipe


_REDISTRIBUTE_LOG = logging.getLogger("torch.distributed.tensor._redistribute")
"""torch logs a warning on it, in every rank, when gathering a ZeRO-3 + TP parameter (``_StridedShard``) takes
several sequential all-gathers; the harness gathers full tensors only to compare them, so it is noise there."""


def _full(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, DTensor):
        return t.detach().double().clone()
    level = _REDISTRIBUTE_LOG.level
    _REDISTRIBUTE_LOG.setLevel(logging.ERROR)  # only this logger's warnings, only for the comparison's gather
    try:
        return t.full_tensor().detach().double().clone()
    finally:
        _REDISTRIBUTE_LOG.setLevel(level)


def _local_numel(t) -> int:
    return (t.to_local() if isinstance(t, DTensor) else t).numel() if t is not None else 0


def _fractions(model, opt, grads: dict) -> dict[str, float]:
    full = sum(p.numel() for p in model.parameters())
    state = getattr(opt, "optim", opt).state.values()
    moments = sum(_local_numel(v) for s in state for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    return {"params": sum(_local_numel(p) for p in model.parameters()) / full,
            "grads": float(grads.pop("__local_numel__")) / full, "optim_state": moments / (2 * full)}


def _unwrap(model):
    return getattr(model, "module", model)


def _step(model, loss_fn, batch, opt, record_grads: bool, *, grad_clip: float = 0.0, norms: list | None = None):
    """One optimizer step; ``loss_fn`` is ``(model, batch) -> loss`` or a :class:`HarnessRecipe` (its ``loss``).
    The gradients are clipped to ``grad_clip`` (0: not clipped) and their norm is appended to ``norms``."""
    loss_fn = loss_fn.loss if isinstance(loss_fn, HarnessRecipe) else loss_fn
    with loss_parallel_context():
        loss = loss_fn(model, batch)
        loss.backward()
    norm = clip_grad_norm_(model.parameters(), grad_clip)
    if norms is not None:
        norms.append(float(norm))
    grads = {n: _full(p.grad) for n, p in _unwrap(model).named_parameters()} if record_grads else None
    if record_grads:
        grads["__local_numel__"] = torch.tensor(float(sum(_local_numel(p.grad) for p in model.parameters())))
    opt.step()
    opt.zero_grad()
    return _full(loss), grads


def _local_batch(batch: dict, plan: Plan, mesh) -> dict:
    rep, shard = mesh.get_coordinate()[1:3] if mesh is not None else (0, 0)
    dp_rank = rep * mesh["dp_shard"].size() + shard if mesh is not None else 0
    n = plan.micro_batch
    return {k: v[dp_rank * n:(dp_rank + 1) * n] for k, v in batch.items()}


def _train(job: Job, plan_text: str, steps: range, world: int, ckpt: Path | None, load: bool):
    """Run ``steps`` under a plan in this process's world; returns (losses, last grads, params, fractions,
    gradient norms)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, job.dtype))  # weights, batch and losses in the job's dtype
    try:
        return _train_in_dtype(job, plan_text, steps, world, ckpt, load)
    finally:
        torch.set_default_dtype(previous)


def _train_in_dtype(job: Job, plan_text: str, steps: range, world: int, ckpt: Path | None, load: bool):
    model, recipe = _build(job)
    plan = resolve_plan(plan_text, world_size=world, global_batch=job.global_batch, graph=model.graph)
    batch = recipe.batch(model, job.global_batch, job.seed + 1)
    mesh = build_mesh(plan) if world > 1 else None
    if mesh is not None:
        model = parallelize(model, mesh, plan)
    opt = build_optimizer(model, mesh, plan, lr=job.lr, eps=job.eps, foreach=False)
    if load:
        load_checkpoint(ckpt, model, opt)
    local = _local_batch(batch, plan, mesh)
    losses, grads, norms = [], None, []
    group = flat_dp_group(mesh, plan) if mesh is not None else None
    loss_fn = _loss_fn(job, recipe, plan, mesh)
    for step in steps:
        loss, grads = _step(model, loss_fn, local, opt, record_grads=step == job.steps - 1, grad_clip=job.grad_clip,
                            norms=norms)
        if mesh is not None and plan.dp * plan.cp > 1:  # mean over the data- and context-parallel ranks
            dist.all_reduce(loss, group=group)
            loss /= plan.dp * plan.cp
        losses.append(float(loss))
    if ckpt is not None and not load:
        save_checkpoint(ckpt, model, opt, extra={"plan": plan.describe()})
    fractions = _fractions(model, opt, grads) if grads is not None else {}
    params = {n: _full(p) for n, p in _unwrap(model).named_parameters()}
    return losses, grads, params, fractions, norms


def _loss_fn(job: Job, recipe, plan: Plan, mesh):
    """The recipe's loss; with cp > 1 its context-parallel share (this rank's sequence shard)."""
    if plan.cp == 1:
        return recipe.loss
    if recipe.cp_loss is None:
        raise ValueError(f"--recipe {job.recipe}: the harness has no context-parallel feeding for it; "
                         f"plan {job.plan!r} needs cp=1")
    cp = context_parallel_of(mesh, plan)
    return lambda model, batch: recipe.cp_loss(model, batch, cp)


def _run_job(job: Job, world: int, tmp: str, index: int):
    if job.reshard_to is None:
        return _train(job, job.plan, range(job.steps), world, None, False)
    ckpt = Path(tmp) / f"job{index}"
    first, *_, first_norms = _train(job, job.plan, range(job.steps - 1), world, ckpt, False)
    last, grads, params, fractions, norms = _train(job, job.reshard_to, range(job.steps - 1, job.steps), world, ckpt,
                                                   True)
    return first + last, grads, params, fractions, first_norms + norms


def _worker(rank: int, world: int, port: int, jobs: list[Job], out: str, tmp: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for i, job in enumerate(jobs):
            t0 = time.time()
            results.append(_run_job(job, world, tmp, i))
            if os.environ.get("LF_HARNESS_TIMING") and rank == 0:
                print(f"job {i} {job.plan}: {time.time() - t0:.1f}s", flush=True)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def reference(job: Job):
    """The single-process run of ``job`` (no process group): (losses, last grads, params, shard fractions,
    gradient norms)."""
    return _train(job, f"dp=1,micro_batch={job.global_batch}", range(job.steps), 1, None, False)


def _rel(a: dict, b: dict) -> tuple[float, str]:
    worst, name = 0.0, ""
    for key, ref in b.items():
        scale = ref.abs().max().clamp_min(1e-30)
        diff = float((a[key] - ref).abs().max() / scale)
        if diff > worst or not name:
            worst, name = diff, key
    return worst, name


def run_jobs(jobs: list[Job], nproc: int) -> list[CheckResult]:
    """Run every job in one spawned world of ``nproc`` gloo CPU processes and compare with one process.

    Raises:
        PlanError: a job's plan (or its ``reshard_to``) is invalid for ``nproc`` processes, or uses what the
            harness does not run (:func:`harness_unsupported`), before launch.
        ProcessRaisedException: a worker failed (its traceback is in the message).
    """
    for job in jobs:
        graph, _ = harness_graph(job)
        for text in filter(None, (job.plan, job.reshard_to)):
            why = harness_unsupported(parse_plan(text), text)
            if why is not None:
                raise PlanError(why)
            resolve_plan(text, world_size=nproc, global_batch=job.global_batch, graph=graph)
    with tempfile.TemporaryDirectory(prefix="lf-parallel-check-") as tmp:
        out = str(Path(tmp) / "results.pt")
        ctx = mp.start_processes(_worker, args=(nproc, _free_port(), jobs, out, tmp), nprocs=nproc,
                                 start_method="spawn", join=False)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            refs = [reference(job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
        while not ctx.join():
            pass
        runs = torch.load(out, weights_only=True)
    results = []
    for job, (losses, grads, params, fractions, norms), (rl, rg, rp, _, rn) in zip(jobs, runs, refs, strict=True):
        loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, rl, strict=True))
        grad_rel, worst = _rel(grads, rg)
        scale = max(float(g.abs().max()) for g in rg.values())
        grad_rel_model = max(float((grads[k] - g).abs().max()) for k, g in rg.items()) / max(scale, 1e-30)
        grad_rels = {k: float((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30)) for k, g in rg.items()}
        param_rel, worst_param = _rel(params, rp)
        norm_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(norms, rn, strict=True))
        results.append(CheckResult(job=job, losses=losses, ref_losses=rl, loss_rel=loss_rel, grad_rel=grad_rel,
                                   grad_rel_model=grad_rel_model, param_rel=param_rel, worst=worst,
                                   worst_param=worst_param, shard_fractions=fractions, grad_rels=grad_rels,
                                   grad_norms=norms, ref_grad_norms=rn, grad_norm_rel=norm_rel))
    return results


def harness_graph(job: Job):
    """The lf-ir graph and the meta-device model of ``job``'s recipe and size (no weights allocated).

    Raises:
        ValueError: ``job.recipe`` is not a recipe the harness knows.
    """
    if job.recipe not in HARNESS_RECIPES:
        raise ValueError(f"--recipe: unknown recipe {job.recipe!r}; expected one of {sorted(HARNESS_RECIPES)}")
    with torch.device("meta"):
        model = HARNESS_RECIPES[job.recipe].build(job.size)
    return model.graph, model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
