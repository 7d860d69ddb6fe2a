"""`lf parallel check`: train a recipe's tiny model with `lf run` under a plan and compare with one process.

The checker is the trainer. The command writes one small run config for the recipe
(:mod:`lf_orchestrator._check_configs`: its tiny model, the smallest data its family trains on, float32 on the CPU,
``train.grad_clip`` low enough that every step clips, no evaluation) and trains it twice with ``lf run``, in
subprocesses, exactly as a user would:

1. the oracle: one process, ``parallel.spec = "dp=1"`` with the plan's ``grad_accum`` (the same micro-batch
   split of the same global batch);
2. the plan: ``torchrun --nproc-per-node N -m lf_orchestrator run CONFIG --set parallel.spec=PLAN`` (gloo).

It then compares, step by step, the losses and the gradient norms before clipping (``metrics.jsonl``) and the
parameters after the last step (the last DCP checkpoints, read to full tensors on the CPU), prints a table of the
largest relative differences (:mod:`lf_orchestrator._check_compare`) and exits 1 when one exceeds ``--tol``, 0
otherwise. Pipeline schedules, gradient accumulation, clipping on any mesh, ZeRO, tensor / sequence / context
parallel and the optimizer all run as in ``lf run``, because it is ``lf run``.

A plan that ``lf run`` would refuse is refused here by name, exit 2, before any process starts: the config's own
checks (``load_config``), the trainer's plan resolution (``families._plan.resolve_plan``: ``check_plan`` against
the model and what the trainer wires) and a recipe that ``lf run`` does not train under parallel plans.
``--reshard-to PLAN2`` resumes the plan's checkpoint of step ``steps - 1`` under PLAN2 for the last step
(``lf run RUN/config.toml --run-dir RUN --set parallel.spec=PLAN2`` on the same ``--nproc``: DCP reshards) and
compares that. Each run's ``plan.json`` must name the checked plan (a plan the run did not train is never passed).

The config, the run folders (``reference``, ``plan``, ``resharded``) and their logs go to ``--work-dir`` (kept;
an earlier check's run folders there are removed first, since ``lf run --run-dir`` would resume them), else to a
temporary folder that is removed when the check passes. The data caches go to ``--cache-dir``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from lf_orchestrator._check_configs import CLIP
from lf_orchestrator._console import fail, make_console
from lf_orchestrator._options import SetOpt

parallel_app = typer.Typer(help="Check hybrid parallel plans on CPU processes.", no_args_is_help=True)
console = make_console(stderr=True)

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
             "ROLE_RANK", "TORCHELASTIC_RUN_ID")
"""torchrun's variables: a check started inside a worker must not make its runs join that job."""


def _fail(message: str, code: int = 2) -> None:
    fail(console, message, code)


def _spec_set(spec: str) -> list[str]:
    return ["--set", f"parallel.spec={json.dumps(spec)}"]


def plan_refusal(cfg_path: Path, spec: str, nproc: int):
    """``(plan, None)`` when ``lf run CONFIG --set parallel.spec=SPEC`` on ``nproc`` processes trains ``spec``
    (the resolved :class:`lf_parallel.Plan`), ``(None, why)`` when it would refuse it or not train it as a plan.

    The reasons are the trainer's own: ``load_config``'s checks, :func:`lf_orchestrator.families._plan.resolve_plan`
    (``check_plan`` against the model's graph, then what the trainer wires), and
    :func:`~lf_orchestrator.families._plan.trainer_unsupported` where the family knows its tokens per sample from
    the config alone.
    """
    import torch

    from lf_ir import recipe_spec
    from lf_orchestrator.config import ConfigError, load_config
    from lf_orchestrator.families import family_module
    from lf_orchestrator.families._plan import resolve_plan, trainer_unsupported
    from lf_orchestrator.families.recipes import recipe_overrides
    from lf_parallel import DistContext, PlanError

    try:
        cfg = load_config(cfg_path, ["parallel.plan='manual'", f"parallel.spec={json.dumps(spec)}"],
                          check_paths=False)
    except ConfigError as err:  # the check's own config file is no news to the user: the key and the reason are
        return None, str(err).removeprefix(f"{cfg_path} with --set: ")
    recipe = cfg.model.recipe
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    family = family_module(recipe).make_family(cfg, cfg_path.parent, ctx)
    graph = family.graph
    if graph is None:  # a family whose recipe config follows its data (the VLA's vocabularies): nominal sizes
        spec = recipe_spec(recipe)
        graph = spec.build_graph(spec.config(cfg.model.size, **recipe_overrides(spec.config_class,
                                                                                cfg.model.overrides, recipe)))
    try:
        plan, _ = resolve_plan(cfg, graph, world_size=nproc, device_type="cpu", seq=0, precision="fp32")
    except (PlanError, ValueError) as err:
        return None, str(err)
    try:  # some families know their tokens per sample from the config, others once their data is prepared
        seq = family.seq_len
    except AttributeError:
        seq = 0
    why = trainer_unsupported(plan, cfg, graph, seq) if seq else None
    if why is None and plan.precision != "fp32":
        why = (f"precision={plan.precision}: the check compares float32 runs (memory.precision = 'fp32'); "
               f"mixed-precision round-off is larger than any useful tolerance")
    return (None, f"parallel.spec {spec!r}: {why}") if why else (plan, None)


def _lf_run(work: Path, name: str, nproc: int, config: Path, run_dir: Path, sets: list[str]) -> None:
    """``lf run CONFIG --run-dir RUN_DIR`` on ``nproc`` processes (torchrun when > 1), its output in
    ``WORK/NAME.log``; exits 2 when ``lf run`` refused the config (its ``error:`` line), 1 when it failed."""
    launch = [sys.executable, "-m", "lf_orchestrator"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
        "-m", "lf_orchestrator"]
    cmd = [*launch, "run", str(config), "--run-dir", str(run_dir), *sets]
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"
    log = work / f"{name}.log"
    console.print(f"{name}: {shlex.join(cmd)}", highlight=False, soft_wrap=True)
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        refused = [ln for ln in lines if ln.lstrip().startswith("error:")]
        if refused:
            _fail(f"lf run refused the {name} run: {refused[0].strip().removeprefix('error:').strip()} ({log})")
        tail = "\n".join(lines[-30:])
        _fail(f"the {name} run failed (exit {done.returncode}); the last lines of {log}:\n{tail}", code=1)


_RUNS = ("reference", "plan", "resharded")
"""The run folders of a check inside its work folder."""


def _clear_work_dir(work: Path) -> None:
    """Make ``work`` ready for a check: created when missing; an earlier check's run folders removed (``lf run
    --run-dir`` would resume them, and the check would compare old runs). Exits 2 for a folder that holds other
    things and no ``check.toml`` (not a check's folder: nothing is deleted)."""
    if work.exists() and any(work.iterdir()) and not (work / "check.toml").is_file():
        _fail(f"--work-dir {work}: not empty and not the folder of an earlier check (no check.toml); give an empty "
              f"or new folder")
    work.mkdir(parents=True, exist_ok=True)
    for name in _RUNS:
        shutil.rmtree(work / name, ignore_errors=True)


def _check_ran(run_dir: Path, plan) -> None:
    """Exit 1 unless the run's ``plan.json`` names ``plan``: a plan the run did not train is never passed."""
    ran = json.loads((run_dir / "plan.json").read_text())["plan"]
    if ran != plan.describe():
        _fail(f"lf run trained plan {ran!r}, not the checked {plan.describe()!r} ({run_dir / 'plan.json'})", code=1)


def _stopped_copy(run_dir: Path, dst: Path, step: int) -> Path:
    """``run_dir`` copied to ``dst`` as a run stopped after its step-``step`` checkpoint leaves it: later
    checkpoints and later rows of ``metrics.jsonl`` removed."""
    from lf_orchestrator._atomic import write_text_atomic
    from lf_orchestrator.checkpoint import latest_checkpoint

    shutil.copytree(run_dir, dst)
    for later in sorted((dst / "checkpoints").glob("step-*")):
        if later.is_dir() and int(later.name.split("-")[1].split(".")[0]) > step:
            shutil.rmtree(later)
    ckpt = latest_checkpoint(dst)
    if ckpt is None or ckpt.name != f"step-{step:08d}":
        raise FileNotFoundError(f"{run_dir / 'checkpoints'}: no complete checkpoint of step {step} to reshard")
    write_text_atomic(dst / "checkpoints" / "latest", ckpt.name)
    rows = (dst / "metrics.jsonl").read_text().splitlines()
    write_text_atomic(dst / "metrics.jsonl", "".join(r + "\n" for r in rows if json.loads(r).get("step", 0) <= step))
    return dst


@parallel_app.command("check")
def check(recipe: Annotated[str, typer.Option(
              help="Recipe: a registered recipe of the llm, vlm, video or VLA families (llama3, qwen2_vl, "
                   "wan_dit, vla, vla_flow, ...).")],
          plan: Annotated[str, typer.Option(help='Plan, e.g. "tp=2,sp=1,dp=2,zero=3,vision.tp=1" or '
                                                 '"pp=2,grad_accum=2" (parallel.spec).')],
          nproc: Annotated[int, typer.Option(help="Processes (gloo, CPU); must equal the plan's degrees.")],
          size: Annotated[str, typer.Option(help="Named model size (model.size).")] = "tiny",
          steps: Annotated[int, typer.Option(help="Optimizer steps (AdamW) of both runs.")] = 3,
          global_batch: Annotated[int, typer.Option(help="Samples per step (train.global_batch).")] = 8,
          reshard_to: Annotated[Optional[str], typer.Option(
              help="Resume the plan's checkpoint of step steps-1 under this plan, on the same --nproc, for the "
                   "last step (DCP reshards) and compare that.")] = None,
          tol: Annotated[float, typer.Option(
              help="Largest relative difference of a step's loss or gradient norm, or of the final parameters "
                   "(the model's 1-norm).")] = 1e-5,
          grad_clip: Annotated[float, typer.Option(
              help="train.grad_clip of both runs; the default is below the tiny models' gradient norms, so every "
                   "step clips.")] = CLIP,
          cache_dir: Annotated[Path, typer.Option(
              help="Data caches (corpus, Meta-World episodes), reused by later checks.")]
          = Path(".lf-cache/parallel-check"),
          work_dir: Annotated[Optional[Path], typer.Option(
              help="Folder for the check's config, run folders and logs (kept); default: a temporary folder, "
                   "removed when the check passes.")] = None,
          overrides: SetOpt = None,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Only validate the plan against the model.")]
          = False):
    """Train the recipe's tiny model with `lf run` under --plan on --nproc processes and compare it with one process.

    The oracle is the single-process `lf run` of the same config (same seed, global batch and micro-batches): per
    step the losses and gradient norms, and the parameters after the last step, within --tol (relative). --set
    changes the check's config for both runs (e.g. model.overrides.layers=4). Exit 0
    within, 1 beyond (or a run that failed), 2 for a plan or config that `lf run` refuses (before any process).
    """
    from lf_orchestrator._atomic import write_text_atomic
    from lf_orchestrator._check_compare import check_runs
    from lf_orchestrator._check_configs import check_config

    if nproc < 2 or steps < 1:
        _fail(f"--nproc must be >= 2 and --steps >= 1, got {nproc} and {steps}")
    if reshard_to and steps < 2:
        _fail(f"--reshard-to needs --steps >= 2 (the plan trains steps 1..steps-1), got {steps}")
    if not grad_clip > 0:
        _fail(f"--grad-clip must be > 0 (the check runs the trainer's clipping), got {grad_clip}")
    if not tol > 0:
        _fail(f"--tol must be > 0, got {tol}")
    import msgspec

    temporary = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="lf-parallel-check-")) if temporary else work_dir.resolve()
    if not temporary:
        _clear_work_dir(work)
    try:
        sections = check_config(recipe, size, cache_dir, steps=steps, global_batch=global_batch,
                                grad_clip=grad_clip, ckpt_every=1 if reshard_to else steps)
    except ValueError as err:
        _fail(str(err))
    cfg_path = work / "check.toml"
    write_text_atomic(cfg_path, msgspec.toml.encode(sections).decode())
    if overrides:  # e.g. --set model.overrides.layers=4 (interleaved schedules need blocks for every stage)
        from lf_orchestrator.config import ConfigError, load_config, to_toml

        try:
            write_text_atomic(cfg_path, to_toml(load_config(cfg_path, overrides, check_paths=False)))
        except ConfigError as err:
            _fail(str(err).removeprefix(f"{cfg_path} with --set: "))
    checked = {}
    for option, text in [("--plan", plan)] + ([("--reshard-to", reshard_to)] if reshard_to else []):
        resolved, why = plan_refusal(cfg_path, text, nproc)
        if why is not None:
            if temporary:
                shutil.rmtree(work, ignore_errors=True)
            _fail(f"{option} {text!r}: {why}")
        checked[option] = resolved
        console.print(f"plan ({option}): {resolved.describe()}", highlight=False)
    if dry_run:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
        return
    accum = checked["--plan"].grad_accum
    _lf_run(work, "reference", 1, cfg_path, work / "reference", _spec_set(f"dp=1,grad_accum={accum}"))
    _lf_run(work, "plan", nproc, cfg_path, work / "plan", _spec_set(plan))
    _check_ran(work / "plan", checked["--plan"])
    compared = work / "plan"
    if reshard_to:
        compared = _stopped_copy(work / "plan", work / "resharded", steps - 1)
        _lf_run(work, "resharded", nproc, compared / "config.toml", compared, _spec_set(reshard_to))
        _check_ran(compared, checked["--reshard-to"])
    what = f"{plan!r}" + (f", step {steps} resharded to {reshard_to!r}" if reshard_to else "")
    code = check_runs(work / "reference", compared, steps=steps, tol=tol, grad_clip=grad_clip,
                      title=f"{recipe} {size}: {what} on {nproc} processes vs. one process (lf run), {steps} steps")
    if code:
        console.print(f"runs kept in {work}", highlight=False)
        raise typer.Exit(code)
    if temporary:
        shutil.rmtree(work, ignore_errors=True)
