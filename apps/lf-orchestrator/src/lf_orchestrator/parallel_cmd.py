"""`lf parallel check`: train a recipe's tiny model under a parallel plan and compare with one process.

Spawns ``--nproc`` gloo CPU processes (lf-parallel's harness), runs ``--steps`` AdamW
steps under the plan on fixed random data with deterministic weights, clipping the
gradients to ``--grad-clip`` as the trainers do, runs the same steps in a single process,
and prints the largest relative differences of the losses, the gradient norms, the last
step's gradients (gathered to full tensors) and the parameters. Exit status 1 when a loss,
gradient norm or gradient differs by more than ``--tol``; 2 for an invalid plan (rejected
before any process starts).

The harness is not the recipe trainer: it runs tensor / sequence / context parallel and data parallel with
ZeRO 0-3 (HSDP) with one backward per step, and refuses by name (exit 2) the plan
fields it does not run: ``pp > 1``, ``grad_accum > 1`` and mixed ``precision`` (see
:func:`lf_parallel.harness_unsupported`); train those with ``lf launch ... --device cpu`` and compare
with one process.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from lf_orchestrator._console import make_console

parallel_app = typer.Typer(help="Check hybrid parallel plans on CPU processes.", no_args_is_help=True)
console = make_console(stderr=True)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@parallel_app.command("check")
def check(recipe: Annotated[str, typer.Option(
              help="Recipe: llama3, vla, qwen2_vl, wan_dit or llama3_tied_vocab_parallel.")],
          plan: Annotated[str, typer.Option(help='Plan, e.g. "tp=2,sp=1,dp=2,zero=3,vision.tp=1".')],
          nproc: Annotated[int, typer.Option(help="Processes (gloo, CPU); must equal the plan's degrees.")],
          size: Annotated[str, typer.Option(help="Named model size.")] = "tiny",
          steps: Annotated[int, typer.Option(help="AdamW steps.")] = 3,
          global_batch: Annotated[int, typer.Option(help="Samples per step (split over dp).")] = 4,
          reshard_to: Annotated[Optional[str], typer.Option(
              help="Save a DCP checkpoint before the last step and run that step under this plan.")] = None,
          tol: Annotated[float, typer.Option(help="Largest relative difference of losses and gradients.")] = 1e-5,
          grad_clip: Annotated[float, typer.Option(
              help="Clip the gradients to this total norm each step, as train.grad_clip (0: no clipping).")] = 1.0,
          dtype: Annotated[str, typer.Option(
              help="float32, or float64 (gradients that are near-cancelling sums, such as Wan's cross-attention "
                   "key bias, differ by float32 round-off alone)")] = "float32",
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Only validate the plan against the model.")]
          = False):
    """Max relative difference of losses and gradients of a plan vs. the single-process run.

    Runs lf-parallel's harness, not the recipe trainer: tensor / sequence / context parallel and data parallel
    (ZeRO 0-3, HSDP), one backward per step, gradients clipped to --grad-clip. Plans with pp > 1, grad_accum > 1 or a
    mixed precision are refused (exit 2): check those with `lf launch ... --device cpu` against one process.
    """
    from lf_parallel import (
        CheckJob,
        PlanError,
        harness_graph,
        harness_unsupported,
        parse_plan,
        resolve_plan,
        run_checks,
    )

    if nproc < 2 or steps < 1:
        _fail(f"--nproc must be >= 2 and --steps >= 1, got {nproc} and {steps}")
    if not grad_clip >= 0:
        _fail(f"--grad-clip must be >= 0, got {grad_clip}")
    if dtype not in ("float32", "float64"):
        _fail(f"--dtype must be float32 or float64, got {dtype!r}")
    job = CheckJob(recipe=recipe, size=size, plan=plan, steps=steps, global_batch=global_batch, reshard_to=reshard_to,
              dtype=dtype, grad_clip=grad_clip)
    try:
        texts = [("--plan", plan)] + ([("--reshard-to", reshard_to)] if reshard_to else [])
        for option, text in texts:
            why = harness_unsupported(parse_plan(text), text)
            if why is not None:
                _fail(f"{option} {why}")
        graph, _ = harness_graph(job)
        plans = [resolve_plan(text, world_size=nproc, global_batch=global_batch, graph=graph) for _, text in texts]
    except (PlanError, ValueError) as err:
        _fail(str(err))
    for p in plans:
        console.print(f"plan: {p.describe()}", highlight=False)
    if dry_run:
        return
    (result,) = run_checks([job], nproc=nproc)
    table = Table(title=f"{recipe} {size}: {nproc} processes vs. 1, {steps} AdamW steps")
    for col in ("quantity", "max relative difference"):
        table.add_column(col)
    table.add_row("loss (every step)", f"{result.loss_rel:.2e}")
    table.add_row("gradient norm (every step, before clipping)", f"{result.grad_norm_rel:.2e}")
    table.add_row(f"gradients (step {steps}, worst: {result.worst})", f"{result.grad_rel:.2e}")
    table.add_row("gradients against the model's largest gradient", f"{result.grad_rel_model:.2e}")
    table.add_row(f"parameters (after step {steps}, worst: {result.worst_param})", f"{result.param_rel:.2e}")
    make_console().print(table)
    print(f"(harness: one backward per step, gradients clipped to {grad_clip:g})")
    print("losses:    " + " ".join(f"{x:.6f}" for x in result.losses))
    print("reference: " + " ".join(f"{x:.6f}" for x in result.ref_losses))
    print(f"max_rel_loss={result.loss_rel:.3e} max_rel_grad={result.grad_rel:.3e} "
          f"max_rel_param={result.param_rel:.3e} max_rel_grad_norm={result.grad_norm_rel:.3e}")
    if max(result.loss_rel, result.grad_rel, result.grad_norm_rel) > tol:
        console.print(f"[bold red]FAIL:[/] differences exceed --tol {tol:g}", highlight=False)
        raise typer.Exit(1)
    print("OK")
