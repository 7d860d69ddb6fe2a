"""``model.fused_ops``: the recipe model runs lf-kernels' fused ops, and training with them works.

Oracles: lf-ir's own list of fused-capable modules (every one switched on, none when the key is off), the
parameter names of the default build (unchanged), the logged losses (finite) and the run folder's config.toml.
The fused ops take Triton under its CPU interpreter (``TRITON_INTERPRET=1``, set before the first fused call)
when triton is installed, else their PyTorch references; the equality of the two paths is lf-ir's test
(``libs/lf-ir/tests/test_fused_ops.py``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lf_ir import fused_modules
from lf_orchestrator.config import load_config
from lf_orchestrator.families.recipes import build_model, recipe_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


def test_model_fused_ops_defaults_off_and_switches_the_recipe_model():
    assert load_config(EXAMPLES / "llama3_pretrain.toml").model.fused_ops is False
    rcfg, graph = recipe_config("llama3", "tiny", {})
    plain = build_model("llama3", rcfg, graph, torch.device("cpu"), 0)
    fused = build_model("llama3", rcfg, graph, torch.device("cpu"), 0, fused_ops=True)
    assert len(fused_modules(fused)) == 4 * rcfg.layers + 1  # 2 norms, attention and MLP per block; final norm
    assert all(m.fused for m in fused_modules(fused)) and not any(m.fused for m in fused_modules(plain))
    assert list(fused.state_dict()) == list(plain.state_dict())


def test_lf_run_with_fused_ops_trains_with_finite_losses(tmp_path):
    """`lf run` of the tiny llama3 example with ``model.fused_ops = true``, 2 steps on the CPU, in a fresh process
    with ``TRITON_INTERPRET=1`` (it must be set before ``triton`` is first imported, which this process has done)."""
    cfg_path = tmp_path / "llama3.toml"
    cfg_path.write_text((EXAMPLES / "llama3_pretrain.toml").read_text())
    sets = ["model.fused_ops=true", f"run.out_dir='{tmp_path}/runs'", f"corpus.cache_dir='{tmp_path}/corpus'",
            "corpus.max_chars=20000", "corpus.seq_len=32", "corpus.eval_fraction=0.1", "train.steps=2",
            "train.global_batch=4", "parallel.micro_batch=4", "train.warmup_steps=1", "train.log_every=1",
            "train.ckpt_every=0", "eval.at_end=false", "run.device='cpu'", "run.threads=1"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "lf_orchestrator", "run", str(cfg_path),
                             *(a for s in sets for a in ("--set", s))],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "metrics.jsonl").is_file()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values()), losses
    assert "fused_ops = true" in (run_dir / "config.toml").read_text()
    rcfg, _ = recipe_config("llama3", "tiny", {})
    assert json.loads((run_dir / "plan.json").read_text())["fused_ops"] == 4 * rcfg.layers + 1


def test_vla_plan_json_counts_the_fused_modules(tiny_config, tmp_path):
    """The VLA family with model.fused_ops = true: plan.json counts the switched modules, as many as lf-ir lists
    in the same VLA rebuilt from the run's model.json; the run trains (CPU: the ops' PyTorch references)."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app
    from lf_orchestrator.families.vla import assembly

    run_dir = tmp_path / "vla"
    out = CliRunner().invoke(app, ["run", str(tiny_config), "--run-dir", str(run_dir), "--set", "model.fused_ops=true",
                                   "--set", "train.steps=2", "--set", "train.warmup_steps=1", "--set",
                                   "eval.at_end=false"])
    assert out.exit_code == 0, out.output
    rebuilt = assembly.build_model(assembly.load_model_config(run_dir), torch.device("cpu"), 0, fused_ops=True)
    expected = len(fused_modules(rebuilt))
    assert expected > 0 and json.loads((run_dir / "plan.json").read_text())["fused_ops"] == expected
