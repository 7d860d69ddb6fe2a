"""`lf data metaworld|inspect|convert`: make, check and convert robot datasets (lf-data).

Registered in cli.py with ``app.add_typer(data_app, name="data")``. ``inspect``
prints a table (or ``--json``) and exits 1 when it found problems (among them a
LeRobot v3.0 dataset without ``meta/stats.json``, which ``lf run`` refuses; notes
are printed but do not fail it); ``convert``
writes a LeRobot v3.0 folder and lists what it skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lf_orchestrator._console import fail, make_console

data_app = typer.Typer(help="Make, inspect and convert datasets (robot demonstrations).", no_args_is_help=True)
console = make_console(stderr=True)


def _fail(message: str) -> None:
    fail(console, message)


@data_app.command("metaworld")
def data_metaworld(
        out: Annotated[Path, typer.Option(help="Output folder (LeRobot v3.0 dataset).")],
        tasks: Annotated[str, typer.Option(help="Comma-separated Meta-World tasks.")] = "reach-v3",
        episodes_per_task: Annotated[int, typer.Option(help="Episodes per task.")] = 20,
        image_size: Annotated[int, typer.Option(help="Camera image side, pixels.")] = 64,
        max_steps: Annotated[int, typer.Option(help="Episode step limit.")] = 150,
        workers: Annotated[int, typer.Option(help="Generation processes.")] = 2,
        seed: Annotated[int, typer.Option(help="Base reset seed.")] = 0):
    """Record Meta-World scripted-expert demonstrations as a LeRobot v3.0 dataset."""
    from rich.progress import Progress

    from lf_data import generate_metaworld

    with Progress(console=console) as progress:
        bar = progress.add_task("demonstrations", total=None)
        try:
            path = generate_metaworld(out, tasks=[t.strip() for t in tasks.split(",")],
                                      episodes_per_task=episodes_per_task, image_size=image_size,
                                      max_steps=max_steps, seed=seed, workers=workers,
                                      progress=lambda d, t: progress.update(bar, completed=d, total=t))
        except ValueError as err:
            _fail(str(err))
    console.print(f"dataset: {path}")


def _count(n: int, noun: str) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _fmt(values: list, n: int = 4) -> str:
    flat = [float(v) for v in (values if not isinstance(values[0], list) else [x for v in values for x in v])]
    text = ", ".join(f"{v:.3g}" for v in flat[:n])
    return f"[{text}{', ...' if len(flat) > n else ''}]"


@data_app.command("inspect")
def data_inspect(path: Annotated[Path, typer.Argument(help="Dataset folder (LeRobot v2.1/v3.0, RLDS, RLBench).")],
                 as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
                 tolerance_s: Annotated[float, typer.Option(
                     help="Accepted distance (seconds) of a LeRobot timestamp from frame_index / fps.")] = 1e-4):
    """Report format, episodes, frames, features, statistics, problems and notes; exit 1 if problems were found.

    Notes (e.g. failed generator episodes) are printed but do not fail the command."""
    from lf_data import inspect_dataset

    try:
        report = inspect_dataset(path, tolerance_s=tolerance_s)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        out = make_console()
        rate = "" if report["fps"] is None else f" at {report['fps']} fps"
        out.print(f"[bold]{path}[/]: {report['format']}, {report['episodes']} episodes, {report['frames']} frames"
                  f"{rate}, {report['tasks']} tasks", highlight=False)
        table = Table(title="features")
        for col in ("feature", "dtype", "shape", "mean", "std", "min", "max"):
            table.add_column(col)
        for key, ft in report["features"].items():
            st = report["stats"].get(key)
            cells = [_fmt(st[s]) for s in ("mean", "std", "min", "max")] if st else ["-"] * 4
            table.add_row(key, ft["dtype"], str(tuple(ft["shape"])), *cells)
        out.print(table)
        notes = report.get("notes", [])
        if report["problems"]:
            skipped = f" (skipped: {report['skipped']})" if report["skipped"] else ""
            out.print(f"[bold red]{_count(len(report['problems']), 'problem')}[/]{skipped}:")
            for p in report["problems"]:
                out.print(f"  - {p}", highlight=False, soft_wrap=True)
        else:
            out.print("no problems found" + (f", {_count(len(notes), 'note')}:" if notes else ""))
        if notes and report["problems"]:
            out.print(f"[bold yellow]{_count(len(notes), 'note')}[/] (not errors):")
        for n in notes:
            out.print(f"  - [yellow]note:[/] {n}", highlight=False, soft_wrap=True)
    if report["problems"]:
        raise typer.Exit(1)


@data_app.command("convert")
def data_convert(src: Annotated[Path, typer.Argument(help="Source dataset (RLDS, RLBench, LeRobot v2.1).")],
                 dst: Annotated[Path, typer.Argument(help="New folder for the converted dataset.")],
                 to: Annotated[str, typer.Option(help="Target format.")] = "lerobot-v3",
                 on_error: Annotated[str, typer.Option(help="raise or skip bad episodes.")] = "raise",
                 fps: Annotated[int, typer.Option(
                     help="Frame rate for sources that store none (RLDS, RLBench).")] = 10):
    """Convert a robot dataset to LeRobot v3.0."""
    from lf_data import convert_dataset

    try:
        result = convert_dataset(src, dst, to=to, on_error=on_error, fps=fps)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        _fail(str(err))
    console.print(f"converted {result['format']} -> {to}: {result['episodes']} episodes written to {dst}"
                  + (f"; skipped {result['skipped']}" if result["skipped"] else ""), highlight=False)
    for p in result["problems"]:
        console.print(f"  - {p}", highlight=False, soft_wrap=True)
