"""`lf run` end to end on a tiny Meta-World dataset, checkpoints and exact resume.

Oracles: the files a run must write (read back and checked), the uninterrupted run's
losses (a resumed run must reproduce them bit for bit in float32 on one CPU process),
and the checkpoint contents.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), f"duplicate or unordered steps: {steps}"
    return {r["step"]: r["train/loss"] for r in rows}


def test_lf_run_trains_checkpoints_and_evaluates(tiny_config):
    result = CliRunner().invoke(app, ["run", str(tiny_config)])
    assert result.exit_code == 0, result.output
    cfg = load_config(tiny_config)
    (run_dir,) = _run_dirs(Path(cfg.run.out_dir))
    for name in ("config.toml", "plan.json", "model.json", "metrics.jsonl", "loss_curve.png",
                 "instruction_tokenizer.json", "action_tokenizer.json", "normalization.json",
                 "summary.json", "eval.json", "checkpoints/latest"):
        assert (run_dir / name).is_file(), name
    assert any((run_dir / "tb").iterdir())
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, 7))
    assert all(math.isfinite(v) for v in losses.values())
    assert losses[6] < losses[1]  # it learns
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000006"
    assert json.loads((run_dir / "plan.json").read_text())["plan"].startswith(
        "dp=1 micro_batch=4 grad_accum=2")
    report = json.loads((run_dir / "eval.json").read_text())
    (row,) = report["tasks"]
    assert row["task"] == "reach-v3" and row["episodes"] == 2
    assert 0.0 <= row["vla_success"] <= 1.0 and 0.0 <= row["random_success"] <= 1.0
    assert "Closed-loop success" in result.output
    # `lf eval` adds its own report and never overwrites the end-of-training one
    again = CliRunner().invoke(app, ["eval", str(run_dir), "--episodes", "1", "--no-random"])
    assert again.exit_code == 0, again.output
    (extra,) = run_dir.glob("eval-*.json")
    assert json.loads(extra.read_text())["tasks"][0]["episodes"] == 1
    assert json.loads((run_dir / "eval.json").read_text()) == report
    # a second run with the same name in the same second gets its own folder
    from lf_orchestrator.run_folder import new_run_dir
    from lf_parallel import init_distributed

    ctx = init_distributed("cpu")
    a, b = new_run_dir(cfg, ctx), new_run_dir(cfg, ctx)
    assert a != b and a.is_dir() and b.is_dir()


@pytest.mark.parametrize("mode", ["full", "selective", "every_k"])
def test_recompute_modes_train_identically(tiny_config, tmp_path, mode):
    """Oracle: the same run without recomputation; recomputation changes memory, not numbers."""
    from lf_orchestrator.trainer import Trainer
    from lf_parallel import init_distributed

    ctx = init_distributed("cpu")
    losses = {}
    for m in ("none", mode):
        cfg = load_config(tiny_config, ["eval.at_end=false", "train.steps=2", "train.warmup_steps=1",
                                        f"memory.recompute='{m}'"])
        run_dir = tmp_path / m
        run_dir.mkdir()
        trainer = Trainer(cfg, run_dir, ctx)
        assert len(trainer.recomputed) == (0 if m == "none" else
                                           len(trainer.model.blocks) if m != "every_k" else 2)
        trainer.fit()
        losses[m] = _losses(run_dir)
    assert losses["none"] == losses[mode]


def test_auto_recompute_and_offload_train_identically(tiny_config, tmp_path, monkeypatch):
    """Oracle: the same run without recomputation or offload. The budget is set half-way between the
    activation bytes of all-full and of no recomputation (lf-memory's planner costs on the CPU rules, what the
    trainer plans with on a CPU device), so the plan mixes; on a CUDA device the trainer plans with
    ``kernels="cuda"`` (the keyword the trainer passes the planner, checked per device)."""
    from lf_memory import plan_recompute
    from lf_orchestrator.config import ConfigError
    from lf_orchestrator.trainer import Trainer, make_recompute_plan
    from lf_parallel import init_distributed

    ctx = init_distributed("cpu")
    base = ["eval.at_end=false", "train.steps=2", "train.warmup_steps=1"]
    with pytest.raises(ConfigError, match='memory.budget_gib: expected a number > 0 with memory.recompute = "auto"'):
        load_config(tiny_config, [*base, "memory.recompute='auto'"])
    (tmp_path / "none").mkdir()
    ref = Trainer(load_config(tiny_config, base), tmp_path / "none", ctx)
    graph, mb = ref.model.graph, ref.plan.micro_batch
    bytes_of = [plan_recompute(graph, 2**50, mb, None, 4, key_padding={"backbone"}, options=opts,
                               kernels="cpu").saved_bytes for opts in (("full",), ("none", "full"))]
    params = sum(p.numel() for p in ref.model.parameters())
    gib = (16 * params + sum(bytes_of) / 2) / 2**30
    ref.fit()
    cfg = load_config(tiny_config, [*base, "memory.recompute='auto'", f"memory.budget_gib={gib!r}",
                                    "memory.offload=true"])
    (tmp_path / "auto").mkdir()
    trainer = Trainer(cfg, tmp_path / "auto", ctx)
    assert trainer.recompute_plan.fits and 0 < len(trainer.recomputed) <= len(trainer.model.blocks)
    assert set(trainer.recompute_plan.block_options()) != {"full"}
    # the plan's bytes follow the run's device: the CPU rules here, fused RMSNorm (kernels="cuda") on a GPU
    import lf_orchestrator.trainer as trainer_mod

    seen = []
    monkeypatch.setattr(trainer_mod, "plan_recompute", lambda *a, **kw: seen.append(kw["kernels"]) or
                        plan_recompute(*a, **kw))
    for device in ("cpu", "cuda", None):  # None: the model's device (the CPU here)
        make_recompute_plan(cfg, trainer.model, mb, trainer.precision, device)
    assert seen == ["cpu", "cuda", "cpu"]
    trainer.fit()
    assert _losses(tmp_path / "none") == _losses(tmp_path / "auto")


@pytest.mark.parametrize("kind", ["binning", "fast"])
def test_resume_continues_exactly(tiny_config, tmp_path, kind):
    """Stop after step 4 (checkpoint at 3), resume: steps 4..6 equal the uninterrupted run (binning and FAST
    action tokens: the resumed run reloads the fitted tokenizer from the run folder)."""
    from lf_orchestrator.trainer import Trainer
    from lf_parallel import init_distributed

    cfg = load_config(tiny_config, ["eval.at_end=false", f"action_tokenizer.kind='{kind}'"])
    ctx = init_distributed("cpu")
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir()
    cut_dir.mkdir()
    Trainer(cfg, full_dir, ctx).fit()

    class Killed(Exception):
        pass

    def kill_at_4(step, _):
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        Trainer(cfg, cut_dir, ctx).fit(kill_at_4)
    assert (cut_dir / "checkpoints" / "latest").read_text() == "step-00000003"
    resumed = Trainer(cfg, cut_dir, ctx, resume=True)
    assert resumed.step == 3
    resumed.fit()
    full, cut = _losses(full_dir), _losses(cut_dir)
    assert sorted(cut) == list(range(1, 7))
    assert cut == full  # bitwise: same data order, same weights, same optimizer state


def test_sigkill_mid_training_then_resume_from_cli(tiny_config, tmp_path):
    """A real `lf run` process killed with SIGKILL resumes from its last complete checkpoint."""
    env = dict(os.environ, MUJOCO_GL="osmesa")
    args = [sys.executable, "-m", "lf_orchestrator", "run", str(tiny_config),
            "--set", "train.steps=200", "--set", "train.ckpt_every=20", "--set", "eval.at_end=false"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out_root = Path(load_config(tiny_config).run.out_dir)
    deadline = time.time() + 600
    latest = None
    while time.time() < deadline and proc.poll() is None:
        found = list(out_root.glob("*/checkpoints/latest")) if out_root.exists() else []
        if found and found[0].read_text() >= "step-00000040":
            latest = found[0]
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert latest is not None, "no checkpoint appeared before the deadline"
    run_dir = latest.parent.parent
    resume = subprocess.run([sys.executable, "-m", "lf_orchestrator", "run", "--resume",
                             str(run_dir)], env=env, capture_output=True, text=True, timeout=900)
    assert resume.returncode == 0, resume.stderr[-2000:]
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(1, 201))
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000200"


def test_fp16_survives_an_injected_inf_gradient(tiny_config, tmp_path):
    """fp16 with dynamic loss scaling: an inf gradient at step 2 skips that update (weights unchanged,
    scale halved, counted in the logs) and training goes on with finite losses.

    Oracle: Micikevicius et al. 2018's rule as implemented by torch.amp.GradScaler (backoff 0.5)."""
    import torch

    from lf_orchestrator.trainer import Trainer
    from lf_parallel import init_distributed

    cfg = load_config(tiny_config, ["eval.at_end=false", "train.steps=4", "train.warmup_steps=1",
                                    "memory.precision='fp16'"])
    trainer = Trainer(cfg, tmp_path, init_distributed("cpu"))
    assert trainer.scaler.enabled
    real_scale = trainer.scaler.scale

    def poisoned(loss):
        return real_scale(loss) * (float("inf") if trainer.step == 1 else 1.0)  # during step 2

    trainer.scaler.scale = poisoned
    before: dict[str, torch.Tensor] = {}

    def snapshot(step, _):
        if step == 1:
            before.update({k: v.clone() for k, v in trainer.model.state_dict().items()})
        if step == 2:
            after = trainer.model.state_dict()
            assert all(torch.equal(before[k], after[k]) for k in before), "the skipped step changed weights"

    trainer.fit(snapshot)
    rows = {r["step"]: r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert [rows[s]["train/skipped_steps"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert rows[2]["train/loss_scale"] == rows[1]["train/loss_scale"] / 2
    assert all(math.isfinite(rows[s]["train/loss"]) for s in (1, 3, 4))
