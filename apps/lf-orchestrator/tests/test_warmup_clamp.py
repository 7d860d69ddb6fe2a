"""``--set train.steps=N`` below the config's ``train.warmup_steps`` (issue 25: the default's 100 warm-up steps
refused ``--set train.steps=20``): warm-up is clamped to the steps with a note naming both keys, and the run's
config.toml records the clamped value, which a resumed run keeps. Oracles: the written config.toml, the logged
learning rates against :func:`lf_orchestrator.train.fit.lr_factor` with the clamped warm-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config
from lf_orchestrator.train.fit import lr_factor

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
pytestmark = pytest.mark.usefixtures("one_thread")


def test_short_run_clamps_warmup_with_a_note(capsys):
    """The default config (warm-up 100) with 20 steps: warm-up 20 and a note naming both keys; a config whose
    warm-up fits is left alone and prints nothing."""
    cfg = load_config(overrides=["train.steps=20"])
    assert (cfg.train.steps, cfg.train.warmup_steps) == (20, 20)
    err = capsys.readouterr().err
    assert err.startswith("note: <default metaworld_vla.toml> with --set: train.warmup_steps = 100 is more than "
                          "train.steps = 20; warm-up clamped to train.warmup_steps = 20")
    assert load_config(overrides=["train.steps=200"]).train.warmup_steps == 100
    assert capsys.readouterr().err == ""
    result = CliRunner().invoke(app, ["config", "show", "--set", "train.steps=20"])
    assert result.exit_code == 0 and "note: " in result.output and "\nwarmup_steps = 20\n" in result.output


def test_run_records_clamped_warmup_and_resume_keeps_it(tmp_path):
    """A tiny llama3 run of 3 steps from the example (warm-up 10): config.toml says warmup_steps = 3 and the logged
    learning rates follow a 3-step warm-up; resumed with train.steps=5 it keeps warm-up 3 (what the first steps
    used) in its config.toml and schedule, with no new note."""
    common = ["--set", f"corpus.cache_dir='{tmp_path / 'corpus'}'", "--set", "corpus.max_chars=20000",
              "--set", "corpus.seq_len=32", "--set", "train.global_batch=4", "--set", "parallel.micro_batch=4",
              "--set", "train.log_every=1", "--set", "run.threads=1", "--set", "eval.at_end=false",
              "--set", "run.device='cpu'"]
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(EXAMPLES / "llama3_pretrain.toml"), *common, "--set", "train.steps=3",
                                 "--set", "train.ckpt_every=3", "--set", f"run.out_dir='{tmp_path / 'runs'}'"])
    assert result.exit_code == 0, result.output
    assert "train.warmup_steps = 10 is more than train.steps = 3; warm-up clamped" in result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert load_config(run_dir / "config.toml").train.warmup_steps == 3
    result = runner.invoke(app, ["run", "--resume", str(run_dir), "--set", "train.steps=5"])
    assert result.exit_code == 0, result.output
    assert "note: " not in result.output
    cfg = load_config(run_dir / "config.toml")
    assert (cfg.train.steps, cfg.train.warmup_steps) == (5, 3)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["train/lr"] for r in rows if "train/lr" in r}
    assert lrs[3] == pytest.approx(cfg.train.lr)  # the last warm-up step: the peak (a 10-step warm-up: 0.3 x peak)
    assert lrs[5] == pytest.approx(cfg.train.lr * lr_factor(4, warmup=3, total=5, min_ratio=cfg.train.min_lr_ratio))
