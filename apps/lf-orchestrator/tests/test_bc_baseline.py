"""`lf eval RUN --baseline bc-mlp`: the behaviour-cloning MLP baseline next to the VLA and the random policy.

Oracles: the eval JSON and ``bc_mlp/bc_mlp.json`` the command must write (read back: three policies per task,
rates in [0, 1] that equal the stored per-episode flags, the training budget taken from ``summary.json``), the
BC MLP's own loss curve (it must fall), a float64 numpy reference of the action (un)normalization, and the
progress lines of a redirected stdout (the BC MLP at each tenth of its step budget, the VLA's task).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def trained_runs(dataset_dir, tmp_path_factory) -> dict[str, Path]:
    """One 4-step run per recipe on the tiny dataset, shared by this module (tests work on copies)."""
    from conftest import TINY

    runs = {}
    for recipe in ("vla", "vla_flow"):
        base = tmp_path_factory.mktemp(recipe)
        cfg = base / "tiny.toml"
        cfg.write_text(TINY.format(out=base / "runs", data=dataset_dir))
        sets = ["train.steps=4", "train.ckpt_every=4", "eval.at_end=false", "run.threads=1",
                f"model.recipe='{recipe}'"]
        result = CliRunner().invoke(app, ["run", str(cfg), *[a for s in sets for a in ("--set", s)]])
        assert result.exit_code == 0, result.output
        (runs[recipe],) = [p for p in Path(load_config(cfg).run.out_dir).iterdir() if p.is_dir()]
    return runs


def _trained_run(trained_runs: dict[str, Path], tmp_path: Path, recipe: str = "vla") -> Path:
    return Path(shutil.copytree(trained_runs[recipe], tmp_path / recipe))


@pytest.mark.parametrize("recipe", ["vla", "vla_flow"])
def test_lf_eval_bc_mlp_reports_three_policies(trained_runs, tmp_path, recipe):
    """With --bc-budget time the BC MLP trains for the VLA's training time (summary.json, set to 2 s here; for
    the flow run given by --bc-seconds 2 instead), and the eval JSON holds VLA, random and BC MLP success per
    task, each the mean of its stored episode flags."""
    run_dir = _trained_run(trained_runs, tmp_path, recipe)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["seconds"] = 2.0 if recipe == "vla" else 1000.0
    (run_dir / "summary.json").write_text(json.dumps(summary))
    bc_seconds = ["--bc-seconds", "2"] if recipe == "vla_flow" else ["--bc-budget", "time"]
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--episodes", "2", "--baseline", "bc-mlp",
                                      *bc_seconds, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "BC MLP" in result.output
    (report_path,) = run_dir.glob("eval-*.json")
    report = json.loads(report_path.read_text())
    (row,) = report["tasks"]
    assert row["task"] == "reach-v3" and row["episodes"] == 2
    for policy in ("vla", "random", "bc_mlp"):
        assert 0.0 <= row[f"{policy}_success"] <= 1.0, policy
    assert row["bc_mlp_success"] == sum(row["bc_mlp_successes"]) / 2 and len(row["bc_mlp_successes"]) == 2
    record = json.loads((run_dir / "bc_mlp" / "bc_mlp.json").read_text())
    assert record["vla_seconds"] == 2.0 and 2.0 <= record["seconds"] < 10.0
    assert report["bc_mlp"]["steps"] == record["steps"] >= 1
    assert record["normalization"] == ("mean_std" if recipe == "vla_flow" else "bounds")
    assert report["bc_mlp"]["budget"] == "time" and "wall-clock" in report["bc_mlp"]["budget_rule"]


def test_lf_eval_bc_mlp_steps_budget(trained_runs, tmp_path):
    """The default budget: as many optimizer steps as the VLA (summary.json ``steps``, set to 37 here) at the
    VLA's global batch (config.toml), stated in the eval JSON; a saved BC MLP of another rule (time) is
    retrained, one of the same rule is reused (its record is unchanged)."""
    from lf_orchestrator.families.vla.baselines import train_bc_mlp

    run_dir = _trained_run(trained_runs, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["steps"] = 37
    (run_dir / "summary.json").write_text(json.dumps(summary))
    train_bc_mlp(run_dir, seconds=0.2)  # a time-budget BC MLP already in RUN/bc_mlp/
    args = ["eval", str(run_dir), "--episodes", "1", "--no-random", "--baseline", "bc-mlp", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # progress on a redirected stdout: the BC MLP at each tenth of its 37 steps, then the VLA's task
    lines = result.stdout.splitlines()
    bc_steps = [int(m[1]) for m in (re.fullmatch(r"bc-mlp step (\d+)/37 loss \d+\.\d{4} ETA \d+:\d\d:\d\d", x)
                                    for x in lines) if m]
    assert bc_steps == [s for s in range(1, 38) if 10 * s // 37 > 10 * (s - 1) // 37], lines
    assert any(re.fullmatch(r"eval vla reach-v3: success [01]/1 \(task 1/1, 1/1 episodes, .* ETA 0:00:00\)", x)
               for x in lines), lines
    record = json.loads((run_dir / "bc_mlp" / "bc_mlp.json").read_text())
    batch = load_config(run_dir / "config.toml").train.global_batch
    assert (record["budget"], record["vla_steps"], record["steps"], record["batch_size"]) == ("steps", 37, 37, batch)
    assert record["loss_curve"][-1][0] == 37
    (report_path,) = run_dir.glob("eval-*.json")
    report = json.loads(report_path.read_text())
    assert report["bc_mlp"]["budget"] == "steps" and "as many optimizer steps" in report["bc_mlp"]["budget_rule"]
    report_path.unlink()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((run_dir / "bc_mlp" / "bc_mlp.json").read_text()) == record


def test_bc_budget_arguments(trained_runs, tmp_path):
    """Both seconds and steps, an unknown rule or a bad --bc-budget are refused with messages naming them."""
    from lf_orchestrator.families.vla.baselines import train_bc_mlp

    run_dir = _trained_run(trained_runs, tmp_path)
    with pytest.raises(ValueError, match="not both"):
        train_bc_mlp(run_dir, seconds=1.0, steps=3)
    with pytest.raises(ValueError, match="unknown rule 'flops'"):
        train_bc_mlp(run_dir, budget="flops")
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--baseline", "bc-mlp", "--bc-budget", "epochs"])
    assert result.exit_code == 2 and "--bc-budget must be steps or time, got 'epochs'" in result.output
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--baseline", "bc-mlp", "--bc-budget", "steps",
                                      "--bc-seconds", "2"])
    assert result.exit_code == 2 and "cannot go with --bc-budget steps" in result.output


@pytest.mark.parametrize("recipe", ["vla", "vla_flow"])
def test_bc_mlp_loss_falls(trained_runs, tmp_path, recipe):
    """The BC MLP's logged MSE (mean of 20 steps) falls to under half its first value within 200 steps (at
    least 200 steps, whatever the machine's load: ``min_steps``)."""
    from lf_orchestrator.families.vla.baselines import train_bc_mlp

    run_dir = _trained_run(trained_runs, tmp_path, recipe)
    record = train_bc_mlp(run_dir, seconds=0.1, min_steps=200, log_every=20)
    curve = [loss for _, loss in record["loss_curve"]]
    assert record["steps"] >= 200 and record["loss_curve"][0][0] == 20
    assert curve[-1] < 0.5 * curve[0], curve


def test_bc_policy_acts_in_action_units(trained_runs, tmp_path):
    """A saved BC MLP reloads as a policy whose chunks (n, H, A) are the network's normalized output mapped back
    through the run's tokenizer bounds: ``low + (x + 1) / 2 * (high - low)`` in float64 numpy."""
    import torch

    from lf_orchestrator.families.vla.baselines import BCMLPPolicy, train_bc_mlp

    run_dir = _trained_run(trained_runs, tmp_path)
    record = train_bc_mlp(run_dir, seconds=0.5)
    policy = BCMLPPolicy.from_run(run_dir)
    states = np.random.default_rng(0).normal(size=(3, record["sizes"]["state_dim"]))
    texts = [record["tasks"][0]] * 3
    chunk = policy.act(np.empty((3, 0)), states, texts)
    assert chunk.shape == (3, policy.horizon, record["sizes"]["action_dim"])
    enc = policy.encoder
    with torch.no_grad():
        x = policy.model(torch.from_numpy(((states - enc.state_mean) / enc.state_std).astype(np.float32)),
                         torch.ones(3, 1)).numpy().astype(np.float64)
    tok = enc.action_tokenizer
    expected = tok.low + (np.clip(x, -1, 1) + 1) / 2 * (tok.high - tok.low)
    np.testing.assert_allclose(chunk, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not one of its training tasks"):
        policy.act(np.empty((1, 0)), states[:1], ["fly to the moon"])


def test_lf_eval_unknown_baseline_and_missing_summary(trained_runs, tmp_path):
    """An unknown --baseline name and a run without summary.json fail with messages that name them."""
    run_dir = _trained_run(trained_runs, tmp_path)
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--baseline", "bc-transformer", "--device", "cpu"])
    assert result.exit_code == 2 and "unknown baseline 'bc-transformer'" in result.output
    (run_dir / "summary.json").unlink()
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--baseline", "bc-mlp", "--device", "cpu"])
    assert result.exit_code == 2 and "no summary.json" in result.output
