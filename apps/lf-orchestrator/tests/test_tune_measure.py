"""`lf run --tune measure`: short trials of the auto-tuner's top runnable plans, then training with the fastest.

Oracles: the trials' own measurements (the run trains with the argmin of the measured step times, recorded in
plan.json next to each prediction), a `parallel.plan = "manual"` run of the chosen plan (the tuned run's losses
equal it bit for bit: trying plans first changes nothing about the run), and the resume path (the plan is read
back from plan.json, not tried again).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

pytestmark = pytest.mark.usefixtures("one_thread")


def _sets(tmp_path: Path, *extra: str) -> list[str]:
    return [f"corpus.cache_dir='{tmp_path / 'corpus'}'", "corpus.max_chars=60000", "corpus.seq_len=64",
            "corpus.eval_fraction=0.1", "train.global_batch=8", "parallel.micro_batch=4", "run.device='cpu'",
            "run.threads=1", "memory.precision='fp32'", "train.steps=4", "train.warmup_steps=1", "train.log_every=1",
            "eval.at_end=false", *extra]


def _run(config: Path, run_dir: Path, sets: list[str], *options: str):
    args = ["run", str(config), "--run-dir", str(run_dir), *options]
    for item in sets:
        args += ["--set", item]
    return CliRunner().invoke(app, args)


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_tune_measure_trains_with_the_measured_fastest_plan_and_matches_a_manual_run(tmp_path):
    """Tiny llama3 on one process: 3 plans tried for 2 timed steps each; plan.json lists them with predicted and
    measured step times, the run's plan is the measured fastest, its losses equal the manual run of that plan;
    the trial folders are gone; a resume reads the plan back without trying again."""
    config = EXAMPLES / "llama3_pretrain.toml"
    tuned = tmp_path / "tuned"
    out = _run(config, tuned, _sets(tmp_path, "parallel.tune_top=3", "parallel.tune_steps=2",
                                    "train.ckpt_every=2"), "--tune", "measure")
    assert out.exit_code == 0, out.output
    info = json.loads((tuned / "plan.json").read_text())
    rows = info["tune"]
    assert len(rows) == 3 and len({(r["plan"], r["recompute"]) for r in rows}) == 3
    for row in rows:
        assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0 and row["peak_gib"] is None
        assert row["prediction_error"] == pytest.approx(row["predicted_step_s"] / row["measured_step_s"] - 1)
    best = min(rows, key=lambda r: r["measured_step_s"])
    assert info["source"] == "auto, measured" and info["plan"] == best["plan"]
    assert info["recompute"] == best["recompute"] and info["measured_step_s"] == best["measured_step_s"]
    assert f"tune 3/3: {rows[2]['plan']}" in " ".join(out.output.split())
    assert not (tuned / "tune").exists()

    spec = best["plan"].split(" (")[0].replace(" ", ",")
    manual = tmp_path / "manual"
    out = _run(config, manual, _sets(tmp_path, "parallel.plan='manual'", f"parallel.spec='{spec}'",
                                     f"memory.recompute='{best['recompute']}'", "train.ckpt_every=100"))
    assert out.exit_code == 0, out.output
    assert json.loads((manual / "plan.json").read_text())["plan"] == best["plan"]
    assert _losses(tuned) == _losses(manual) and len(_losses(tuned)) == 4

    out = CliRunner().invoke(app, ["run", "--resume", str(tuned), "--set", "train.steps=6"])
    assert out.exit_code == 0, out.output
    assert "tune 1/" not in out.output and "resumed from step 4" in out.output
    resumed = json.loads((tuned / "plan.json").read_text())
    assert resumed["plan"] == best["plan"] and resumed["source"] == "auto, measured before the resume"
    for key in ("tune", "predicted_step_s", "measured_step_s", "cluster", "considered"):  # kept through the resume
        assert resumed[key] == info[key], key
    assert sorted(_losses(tuned)) == [1, 2, 3, 4, 5, 6]


def test_tune_measure_needs_the_auto_plan_and_a_family_recipe(tmp_path, tiny_config):
    """tune = 'measure' with a manual plan is refused by name at load, and so is tune_top = 0."""
    with pytest.raises(ConfigError, match=r"parallel.tune: expected \"predict\" with parallel.plan = \"manual\""):
        load_config(EXAMPLES / "llama3_pretrain.toml", ["parallel.plan='manual'", "parallel.tune='measure'"])
    with pytest.raises(ConfigError, match=r"parallel.tune_top: expected an integer >= 1, got 0"):
        load_config(EXAMPLES / "llama3_pretrain.toml", ["parallel.tune_top=0"])


def test_tune_measure_in_a_two_process_job_agrees_across_ranks(tmp_path):
    """torchrun, 2 gloo processes: the trials build one mesh per plan; both ranks choose the same plan (the slowest
    rank's time decides), rank 0 writes it with the trials, and the run trains 3 steps with finite losses within
    1e-5 of the one-process run of that plan (its global batch and samples are the same)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sets = _sets(tmp_path, "parallel.tune_top=2", "parallel.tune_steps=1", "train.steps=3", "train.ckpt_every=100")
    run_dir = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), "-m",
           "lf_orchestrator", "run", str(EXAMPLES / "llama3_pretrain.toml"), "--run-dir", str(run_dir), "--tune",
           "measure", *[a for item in sets for a in ("--set", item)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((run_dir / "plan.json").read_text())
    assert len(info["tune"]) == 2 and info["world_size"] == 2
    best = min(info["tune"], key=lambda r: r["measured_step_s"])
    assert info["plan"] == best["plan"] and (done.stdout + done.stderr).count("tune 2/2") == 1  # rank 0 only
    spec = best["plan"].split(" (")[0].replace(" ", ",")
    one = tmp_path / "one"
    out = _run(EXAMPLES / "llama3_pretrain.toml", one, [*sets, "parallel.plan='manual'", "parallel.spec='dp=1'",
                                                        f"memory.recompute='{best['recompute']}'"])
    assert out.exit_code == 0, out.output
    two, ref = _losses(run_dir), _losses(one)
    assert sorted(two) == [1, 2, 3] and spec.startswith(("dp=2", "dp=1"))
    for step, loss in two.items():
        assert abs(loss - ref[step]) <= 1e-5 * abs(ref[step]), (best, two, ref)
