"""The `lf` command line (Typer + rich).

Heavy imports (torch, the libraries) happen inside the commands, after the
config is validated, so a bad config fails in well under a second.
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Optional

import typer

from lf_orchestrator import __version__
from lf_orchestrator._console import fail, make_console
from lf_orchestrator._cpu_numerics import pin_cpu_isa
from lf_orchestrator._options import SetOpt
from lf_orchestrator.config import DEFAULT_NAME, ConfigError, check_resume_overrides, json_schema, load_config, to_toml
from lf_orchestrator.convert_cmd import convert_app
from lf_orchestrator.data_cmd import data_app
from lf_orchestrator.ir_cmd import ir_app
from lf_orchestrator.launch_cmd import launch
from lf_orchestrator.memory_cmd import memory_cmd
from lf_orchestrator.parallel_cmd import parallel_app
from lf_orchestrator.plan_cmd import plan_cmd
from lf_orchestrator.sample_cmd import sample_cmd
from lf_orchestrator.tokenize_cmd import tokenize_app

app = typer.Typer(help="LoongForge: train multimodal models from one config file.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
config_app = typer.Typer(help="Show or describe run configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")
app.add_typer(tokenize_app, name="tokenize")
app.add_typer(ir_app, name="ir")
app.add_typer(convert_app, name="convert")
app.add_typer(parallel_app, name="parallel")
app.command("plan")(plan_cmd)
app.command("memory")(memory_cmd)
app.command()(launch)
app.command("sample")(sample_cmd)
console = make_console(stderr=True)

PREEMPTED_EXIT = 143
"""Exit code of a run stopped by SIGTERM after saving (128 + SIGTERM, as a shell reports it; SIGINT: 130)."""


def _fail(message: str) -> None:
    fail(console, message)


def _version(value: bool) -> None:
    if value:
        print(f"lf {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                              help="Print the version and exit.")] = False):
    """LoongForge (lf)."""
    try:  # before any command imports torch: repeatable CPU numerics across machines of one kind
        pin_cpu_isa()
    except ValueError as err:
        _fail(str(err))


def _threads(n: int) -> None:
    import torch

    torch.set_num_threads(n or os.cpu_count() or 1)


class TuneMode(StrEnum):
    """``lf run --tune``: how ``parallel.plan = "auto"`` settles on a plan."""

    predict = "predict"
    measure = "measure"


@app.command()
def run(config: Annotated[Optional[Path], typer.Argument(
            help="Run config (TOML). Omitted: the embedded Meta-World VLA default.")] = None,
        overrides: SetOpt = None,
        resume: Annotated[Optional[Path], typer.Option(
            help="Continue the run in this folder from its latest checkpoint.")] = None,
        run_dir: Annotated[Optional[Path], typer.Option(
            help="Run in this folder: continue it from its latest checkpoint if it has one, else start "
                 "it there (`lf launch` workers use it, so restarts resume the run).")] = None,
        tune: Annotated[Optional[TuneMode], typer.Option(
            help="parallel.tune: 'measure' trains the auto-tuner's top plans for a few steps each first and "
                 "keeps the measured fastest; 'predict' trusts the cost model (the default).")] = None):
    """Train a model from one config file, then evaluate it."""
    try:
        if resume is not None and run_dir is not None:
            _fail("give either --resume or --run-dir, not both")
        if tune is not None and resume is None:
            overrides = [*(overrides or []), f"parallel.tune='{tune.value}'"]
        if resume is not None:
            if config is not None:
                _fail(f"give either a CONFIG or --resume, not both (a resumed run uses "
                      f"{resume / 'config.toml'})")
            if not (resume / "config.toml").is_file():
                _fail(f"--resume {resume}: not a run folder (no config.toml)")
            if tune is not None:
                _fail(f"--resume {resume}: --tune cannot be given with --resume: the run keeps the plan its "
                      f"checkpoint was trained with ({resume / 'plan.json'})")
            check_resume_overrides(overrides)
            cfg = load_config(resume / "config.toml", overrides)
            from lf_orchestrator.checkpoint import latest_checkpoint

            if latest_checkpoint(resume) is None:
                _fail(f"--resume {resume}: no complete checkpoint to resume from under "
                      f"{resume / 'checkpoints'}")
        else:
            cfg = load_config(config, overrides)
    except ConfigError as err:
        _fail(str(err))
    _threads(cfg.run.threads)
    from lf_ir import IRError
    from lf_parallel import PlanError, init_distributed, shutdown

    try:
        ctx = init_distributed(cfg.run.device)
    except ValueError as err:
        _fail(str(err))
    from lf_orchestrator.run_folder import RunFolder, missing_dirs, new_run_dir

    exit_code = 0
    try:  # the folder is locked for the run (rank 0) and removed if the run fails leaving only its config
        try:
            with RunFolder(ctx) as folder:
                if run_dir is not None:
                    folder.claim(run_dir, created=False)
                    resume = _resume_point(run_dir, ctx)
                elif resume is not None:
                    folder.claim(resume, created=False)
                else:
                    made = missing_dirs(Path(cfg.run.out_dir)) if ctx.is_main else []
                    run_dir = folder.claim(new_run_dir(cfg, ctx), created=True)
                    folder.made_parents += made
                from lf_orchestrator.train.run import run_family

                run_family(cfg, ctx, resume, run_dir, console)
        except ConfigError as err:  # found while running: name the config file as load_config's errors do
            source = str(resume / "config.toml") if resume is not None else str(config or f"<default {DEFAULT_NAME}>")
            _fail(str(err) if str(err).startswith(source) else f"{source}: {err}")
        except (PlanError, IRError, ValueError, FileNotFoundError) as err:
            _fail(str(err))
    except typer.Exit as stop:  # a refused run (2) or a preempted one (143 / 130)
        exit_code = stop.exit_code
    finally:
        shutdown(ctx)
    _leave(ctx, exit_code)


def _leave(ctx, code: int) -> None:
    """End `lf run` with ``code``. A multi-process CPU (gloo) run leaves without interpreter finalization: there
    gloo's threads can still hold tensors and abort the process ("terminate called without an active exception",
    SIGABRT) after a run that succeeded, seen with torch 2.13 on CPU (pytorch/pytorch#179291 describes the
    finalization crash). Everything is written, the process group destroyed and the output flushed by then."""
    if ctx.distributed and ctx.device.type == "cpu":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)


def _resume_point(run_dir: Path, ctx) -> Optional[Path]:
    """``run_dir`` when it holds a complete checkpoint (rank 0 decides for every rank), else None."""
    from lf_orchestrator.checkpoint import latest_checkpoint

    found = [latest_checkpoint(run_dir) is not None]
    if ctx.distributed:
        import torch.distributed as dist

        dist.broadcast_object_list(found, src=0)
    return run_dir if found[0] else None


@app.command("eval")
def eval_cmd(run_dir: Annotated[Path, typer.Argument(help="A run folder made by `lf run`.")],
             episodes: Annotated[Optional[int], typer.Option(
                 help="Episodes per task (default: the run's eval.episodes).")] = None,
             tasks: Annotated[Optional[str], typer.Option(help="Comma-separated tasks.")] = None,
             random: Annotated[Optional[bool], typer.Option(
                 "--random/--no-random",
                 help="Measure the random baseline (default: yes; --set eval.random_baseline=... is the same).")
             ] = None,
             baseline: Annotated[Optional[list[str]], typer.Option(
                 help="Also measure this baseline (repeatable): bc-mlp, a behaviour-cloning MLP on state + task "
                      "one-hot, trained on the run's data for the VLA's budget (--bc-budget; kept in RUN/bc_mlp/).")
             ] = None,
             bc_budget: Annotated[Optional[str], typer.Option(
                 help="The BC MLP's training budget: steps (the VLA's optimizer steps at its batch size, whatever "
                      "hardware trained it; the default) or time (the VLA's training wall-clock time, on this "
                      "machine; the default with --bc-seconds).")
             ] = None,
             bc_seconds: Annotated[Optional[float], typer.Option(
                 help="Train the BC MLP this many seconds instead of summary.json's VLA training time (a run "
                      "trained over several sessions: the summary times only the last); implies --bc-budget time."
             )] = None,
             device: Annotated[Optional[str], typer.Option(
                 help="auto, cpu or cuda (default: auto, not the training machine's run.device; --set "
                      "run.device=... is the same).")] = None,
             overrides: SetOpt = None):
    """Run a trained VLA closed-loop in Meta-World and report success per task.

    --set changes, in memory only, the keys of the run's config.toml that do not change the trained model:
    eval.episodes, eval.max_steps, eval.seed, eval.random_baseline, run.device, run.threads (any other key is
    refused by name; a key that an option given here also sets, e.g. --episodes with --set eval.episodes, too)."""
    if not (run_dir / "config.toml").is_file():
        _fail(f"{run_dir}: not a run folder (no config.toml)" if run_dir.exists()
              else f"{run_dir}: no such folder")
    if episodes is not None and episodes < 1:
        _fail(f"--episodes must be >= 1, got {episodes}")
    if bc_seconds is not None and not bc_seconds > 0:
        _fail(f"--bc-seconds must be > 0, got {bc_seconds}")
    if bc_budget not in (None, "steps", "time"):
        _fail(f"--bc-budget must be steps or time, got {bc_budget!r}")
    if bc_budget == "steps" and bc_seconds is not None:
        _fail("--bc-seconds sets a time budget; it cannot go with --bc-budget steps")
    bc_budget = bc_budget or ("time" if bc_seconds is not None else "steps")
    from lf_orchestrator._options import EVAL_KEYS, load_trained_run, set_keys

    try:
        cfg = load_trained_run(run_dir, overrides, EVAL_KEYS, "lf eval", {
            "eval.episodes": ("--episodes", episodes), "run.device": ("--device", device),
            "eval.random_baseline": ("--random" if random else "--no-random", random)})
    except ConfigError as err:
        _fail(str(err))
    keys, recipe = set_keys(overrides), cfg.model.recipe
    if recipe not in ("vla", "vla_flow"):
        _fail(f"{run_dir / 'config.toml'}: model.recipe = {recipe!r}: `lf eval` runs VLA policies in Meta-World; "
              f"{recipe} runs evaluate during training (eval/* in metrics.jsonl)"
              + ("; `lf sample` makes clips" if recipe == "wan_dit" else ""))
    _threads(cfg.run.threads if "run.threads" in keys else 0)
    from lf_orchestrator.families.vla.evaluate import evaluate_run
    from lf_orchestrator.progress import LineReporter
    from lf_parallel import resolve_device

    if random is None:
        random = cfg.eval.random_baseline if "eval.random_baseline" in keys else True
    try:
        dev = resolve_device(device or (cfg.run.device if "run.device" in keys else "auto"))
    except ValueError as err:
        _fail(f"--device: {err}")
    out_name = f"eval-{time.strftime('%Y%m%d-%H%M%S')}.json"
    try:
        report = evaluate_run(run_dir, device=dev, episodes=episodes, cfg=cfg,
                              tasks=tasks.split(",") if tasks else None, random_baseline=random,
                              out_name=out_name, baselines=baseline or (), bc_seconds=bc_seconds,
                              bc_budget=bc_budget, report=LineReporter(console))
    except (FileNotFoundError, ConfigError, ValueError) as err:
        _fail(str(err))
    from lf_orchestrator.families.vla.report import print_eval

    print_eval(report)
    if "bc_mlp" in report:
        bc = report["bc_mlp"]
        console.print(f"BC MLP: {bc['steps']} steps of batch {bc['batch_size']} in {bc['seconds']:.0f} s; "
                      f"{bc.get('budget_rule', 'the budget was the VLA training time')}", highlight=False)
    console.print(f"report: {run_dir / out_name}")


@config_app.command("show")
def config_show(config: Annotated[Optional[Path], typer.Argument(help="Run config.")] = None,
                overrides: SetOpt = None):
    """Print the resolved config (defaults filled in, overrides applied)."""
    try:
        print(to_toml(load_config(config, overrides)), end="")
    except ConfigError as err:
        _fail(str(err))


@config_app.command("schema")
def config_schema(keys: Annotated[bool, typer.Option(
        "--keys", help="List every key (section.key) with its type, default and description instead.")] = False):
    """Print the JSON Schema of run configs, each field's description included (or, with --keys, a list)."""
    if keys:
        from lf_orchestrator.config import Config
        from lf_orchestrator.config_schema import describe_keys

        for key, kind, default, doc in describe_keys(Config):
            print(f"{key}: {kind} = {default}\n" + "\n".join(f"    {line}" for line in doc.splitlines()))
        return
    print(json.dumps(json_schema(), indent=1))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
