"""`lf run` with ``model.recipe = "vla_flow"`` (pi0-style flow matching) on the tiny Meta-World dataset.

Oracles: the files the run must write (read back), a falling finite loss, the uninterrupted run's losses (a
resumed run and a recomputing run must reproduce them bit for bit: noise is drawn per sample from (seed, step,
index)), the decoded actions against the dataset statistics, and the config errors' messages.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import ConfigError, load_config

FLOW = ["model.recipe='vla_flow'"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows}


def test_lf_run_vla_flow_trains_and_evaluates(tiny_config):
    """Trains 8 steps (finite velocity MSE), then one closed-loop episode through `lf eval`'s path."""
    result = CliRunner().invoke(app, ["run", str(tiny_config), "--set", FLOW[0], "--set", "train.steps=8",
                                      "--set", "train.ckpt_every=4", "--set", "eval.episodes=1",
                                      "--set", "run.threads=1"])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in Path(load_config(tiny_config).run.out_dir).iterdir() if p.is_dir()]
    for name in ("config.toml", "model.json", "metrics.jsonl", "normalization.json", "instruction_tokenizer.json",
                 "eval.json", "checkpoints/latest"):
        assert (run_dir / name).is_file(), name
    assert not (run_dir / "action_tokenizer.json").exists()
    spec = json.loads((run_dir / "model.json").read_text())
    assert spec["recipe"] == "vla_flow" and spec["config"]["action_horizon"] == 2
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, 9)) and all(math.isfinite(v) for v in losses.values())
    (row,) = json.loads((run_dir / "eval.json").read_text())["tasks"]
    assert row["task"] == "reach-v3" and row["episodes"] == 1 and 0.0 <= row["vla_success"] <= 1.0
    assert "random_success" in row


def test_flow_loss_falls_and_policy_acts_in_action_units(tiny_config, tmp_path):
    """The velocity MSE on a fixed batch with fixed noise falls with training (per-step logged losses draw
    new noise: too noisy to compare over a few steps); the policy returns (n, H, A) chunks: the normalized
    samples times the dataset std plus its mean."""
    import torch

    from lf_orchestrator.families.vla.evaluate import VLAPolicy
    from lf_orchestrator.train import Trainer
    from lf_parallel import init_distributed

    cfg = load_config(tiny_config, [*FLOW, "eval.at_end=false", "train.steps=100", "train.warmup_steps=1",
                                    "train.ckpt_every=100"])
    trainer = Trainer(cfg, tmp_path, init_distributed("cpu"))
    family = trainer.family
    fixed = family.encoder.collate([family.dataset[i] for i in range(0, len(family.dataset), 3)])
    fixed["sample_seed"] = torch.arange(len(fixed["state"]))

    def fixed_loss() -> float:
        with torch.no_grad():
            loss, _ = trainer.model.training_loss(fixed)
        return float(loss / trainer.model.loss_normalizer(fixed))
    before = fixed_loss()
    trainer.fit()  # 100 tiny steps: ~5 s on one thread
    after = fixed_loss()
    assert math.isfinite(after) and after < 0.9 * before, (before, after)  # measured: 1.71 -> 1.33
    policy = VLAPolicy.from_run(tmp_path, torch.device("cpu"), cfg)
    sample = family.dataset[0]
    chunk = policy.act(np.stack([sample["image"]] * 2), np.stack([sample["state"]] * 2), [sample["task"]] * 2)
    assert chunk.shape == (2, 2, 4) and chunk.dtype == np.float64
    enc = policy.encoder
    again = VLAPolicy.from_run(tmp_path, torch.device("cpu"), cfg)  # same eval seed: same noise, same actions
    obs = enc.observation(np.stack([sample["image"]] * 2), np.stack([sample["state"]] * 2), [sample["task"]] * 2)
    normalized = again.model.sample_actions(*obs.values(), generator=torch.Generator().manual_seed(cfg.eval.seed))
    np.testing.assert_allclose(chunk, normalized.double().numpy() * enc.action_std + enc.action_mean, rtol=1e-6)
    stats = family.dataset.stats["action"]
    np.testing.assert_allclose(enc.action_mean, stats["mean"], rtol=1e-6)


def test_vla_flow_resume_and_recompute_are_exact(tiny_config, tmp_path):
    """Oracle: the uninterrupted run without recomputation; a resumed run and a fully recomputing run match it."""
    from lf_orchestrator.train import Trainer
    from lf_parallel import init_distributed

    ctx = init_distributed("cpu")
    cfg = load_config(tiny_config, [*FLOW, "eval.at_end=false"])
    dirs = {k: tmp_path / k for k in ("full", "cut", "recompute")}
    for d in dirs.values():
        d.mkdir()
    Trainer(cfg, dirs["full"], ctx).fit()

    class Killed(Exception):
        pass

    def kill_at_4(step, _):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        Trainer(cfg, dirs["cut"], ctx).fit(kill_at_4)
    resumed = Trainer(cfg, dirs["cut"], ctx, resume=True)
    assert resumed.step == 3
    resumed.fit()
    recompute = Trainer(load_config(tiny_config, [*FLOW, "eval.at_end=false", "memory.recompute='full'"]),
                        dirs["recompute"], ctx)
    assert recompute.plan_info["recomputed_blocks"] == list(range(len(recompute.model.blocks)))
    recompute.fit()
    full = _losses(dirs["full"])
    assert sorted(full) == list(range(1, 7))
    assert _losses(dirs["cut"]) == full and _losses(dirs["recompute"]) == full


def test_vla_flow_config_errors_name_the_key(tiny_config):
    cases = {"action_tokenizer.n_bins=128": "action_tokenizer.n_bins: model.recipe = 'vla_flow' (family vla_flow) "
                                            "does not read [action_tokenizer] (its actions are continuous",
             "model.overrides.n_action_bins=64": "model.overrides: unknown field 'n_action_bins' for recipe 'vla_flow'",
             "model.size='huge'": "model.size: unknown vla_flow size 'huge'; expected one of ['3B', 'small', 'tiny']",
             "model.overrides.sample_steps=0": "model: vla_flow: sample_steps must be >= 1, got 0"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(tiny_config, [*FLOW, override])
    unknown = ("model.recipe: unknown recipe 'vla_fast'; expected one of gemma, llama3, qwen2_vl, vla, vla_flow, "
               "wan_dit, wan_vae; did you mean 'vla_flow'?")
    with pytest.raises(ConfigError, match=re.escape(unknown)):
        load_config(tiny_config, ["model.recipe='vla_fast'"])
