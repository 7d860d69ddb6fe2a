"""A run folder's metrics as a committable result: one JSON summary and the loss-curve PNG.

``python -m lf_orchestrator.results RUN_DIR --name llama3_8b_h200x2 --out examples/results`` writes
``examples/results/llama3_8b_h200x2.json`` and ``..._loss.png`` (the curve of
:func:`lf_orchestrator.metrics.plot_loss_curve`; skipped with a note where matplotlib is missing, e.g. on the GPU
image) and prints the key numbers. Without ``--out`` both files go into ``RUN_DIR`` itself, next to the files
they summarize (a run file of the same name is never overwritten). It reads only the files every `lf run`
writes: ``metrics.jsonl`` (one record per logged step), and where present ``plan.json``, ``summary.json``
(absent when a run was stopped, e.g. by ``timeout``: the numbers then come from the metrics alone and
``finished`` is false), ``corpus.json`` and ``config.toml``; a folder with neither ``metrics.jsonl`` nor
``config.toml`` is not an `lf run` folder and is refused. No torch import.

Summary fields: ``steps_logged``, ``last_step``, ``first_loss`` / ``last_loss`` (the first and last logged
``train/loss``), ``loss_first10_mean`` / ``loss_last10_mean`` (means over the first and last 10% of logged steps,
at least one), ``loss_falls`` (the last mean below the first), ``median_step_s`` (median of the logged
``step_s`` after the first record, which holds warm-up and allocator growth; the first when it is the only
one), ``peak_mem_gib`` (the largest logged, main rank), ``eval`` (the summary's held-out metrics).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from lf_orchestrator.metrics import METRICS_FILE, plot_loss_curve, read_metrics


def summarize(run_dir: Path) -> dict[str, Any]:
    """The key numbers of ``run_dir`` (see the module docstring) and its full per-step metrics.

    Raises:
        FileNotFoundError: ``run_dir`` is missing, is not an `lf run` folder (no ``metrics.jsonl`` and no
            ``config.toml``), or has no ``metrics.jsonl`` record with ``train/loss`` (names the folder).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder")
    if not (run_dir / METRICS_FILE).is_file() and not (run_dir / "config.toml").is_file():
        raise FileNotFoundError(f"{run_dir}: not an `lf run` folder (no {METRICS_FILE} or config.toml)")
    records = read_metrics(run_dir)
    train = [r for r in records if "train/loss" in r]
    if not train:
        raise FileNotFoundError(f"run folder {run_dir}: no train/loss record in {run_dir / 'metrics.jsonl'}")
    losses = [r["train/loss"] for r in train]
    k = max(1, len(losses) // 10)
    step_s = [r["step_s"] for r in train if "step_s" in r]
    mems = [r["peak_mem_gib"] for r in train if "peak_mem_gib" in r]
    out: dict[str, Any] = {"run_dir": run_dir.name, "finished": (run_dir / "summary.json").is_file(),
                           "steps_logged": len(train), "last_step": train[-1]["step"],
                           "first_loss": losses[0], "last_loss": losses[-1],
                           "loss_first10_mean": statistics.fmean(losses[:k]),
                           "loss_last10_mean": statistics.fmean(losses[-k:]),
                           "median_step_s": statistics.median(step_s[1:] or step_s) if step_s else None,
                           "peak_mem_gib": max(mems) if mems else None}
    out["loss_falls"] = out["loss_last10_mean"] < out["loss_first10_mean"]
    for name in ("plan.json", "summary.json", "corpus.json"):
        path = run_dir / name
        if path.is_file():
            out[name.removesuffix(".json")] = json.loads(path.read_text())
    if "summary" in out:
        out["eval"] = out["summary"].get("eval", {})
        out["seconds"] = out["summary"].get("seconds")
    if (run_dir / "config.toml").is_file():
        out["config_toml"] = (run_dir / "config.toml").read_text()
    out["metrics"] = records
    return out


def key_line(name: str, s: dict[str, Any]) -> str:
    """One printed line: steps, first -> last loss, median step time, peak memory."""
    step = f"{s['median_step_s']:.3f}" if s["median_step_s"] is not None else "-"
    mem = f"{s['peak_mem_gib']:.1f}" if s["peak_mem_gib"] is not None else "-"
    return (f"{name}: {s['last_step']} steps ({'finished' if s['finished'] else 'NOT finished'}), loss "
            f"{s['first_loss']:.4f} -> {s['last_loss']:.4f} (first/last 10% means {s['loss_first10_mean']:.4f} / "
            f"{s['loss_last10_mean']:.4f}, falls: {s['loss_falls']}), median step {step} s, peak {mem} GiB")


def write_results(run_dir: Path, name: str, out_dir: Path | None = None, extra: dict[str, Any] | None = None
                  ) -> tuple[Path, Path | None]:
    """Write ``out_dir/{name}.json`` (``extra`` fields first, then :func:`summarize`) and ``out_dir/{name}_loss.png``;
    ``out_dir`` defaults to ``run_dir``.

    Returns:
        (JSON path, PNG path or None without matplotlib).

    Raises:
        FileNotFoundError: as :func:`summarize` (nothing is written).
        FileExistsError: ``out_dir/{name}.json`` is a file other than an earlier result of this name (e.g. the
            run's own ``summary.json`` for ``name = "summary"``).
        ValueError: ``name`` is not a plain file stem (empty, starts with a dot, or holds a path separator).
    """
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise ValueError(f"--name {name!r}: expected a plain file stem such as llama3_8b_h200x2 (no folders, not "
                         f"empty, no leading dot); --out chooses the folder")
    out_dir = Path(run_dir if out_dir is None else out_dir)
    summary = {"name": name, **(extra or {}), **summarize(run_dir)}
    json_path = out_dir / f"{name}.json"
    if json_path.is_file() and not _is_result(json_path, name):
        raise FileExistsError(f"{json_path} exists and is not a result of this module; choose another --name "
                              f"or --out")
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    ylabel = "training loss"
    png = plot_loss_curve(run_dir, ylabel, out=out_dir / f"{name}_loss.png", title=name)
    return json_path, png


def _is_result(path: Path, name: str) -> bool:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and old.get("name") == name and "steps_logged" in old and "metrics" in old


def main(argv: list[str] | None = None) -> int:
    """``python -m lf_orchestrator.results RUN_DIR --name NAME [--out DIR] [--set KEY=VALUE ...]``."""
    parser = argparse.ArgumentParser(prog="python -m lf_orchestrator.results", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run folder written by `lf run` (finished or stopped)")
    parser.add_argument("--name", required=True, help="file stem of the result, e.g. llama3_8b_h200x2")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for NAME.json and NAME_loss.png (default: RUN_DIR itself; e.g. examples/results "
                             "to commit them)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra string fields for the JSON (e.g. device=..., command=...)")
    args = parser.parse_args(argv)
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item}: expected KEY=VALUE")
        extra[key] = value
    try:
        json_path, png = write_results(args.run_dir, args.name, args.out, extra)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = json.loads(json_path.read_text())
    print(key_line(args.name, s))
    print(f"wrote {json_path}" + (f" and {png}" if png else " (no PNG: matplotlib is not installed)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
