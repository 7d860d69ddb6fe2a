"""``bench/autotune_check.py --dry``: the auto-tuner check's code paths on the CPU (tiny models, 2 gloo processes).

Oracles: the written JSON (every plan of the sweep measured, finite losses, 3 timed steps after 2 warm-up
ones), lf-parallel's own ``search_plans`` / ``step_cost`` on the same tiny graph (the predictions the file
records and the plan order), and the sweep definition (ZeRO 0 / 3 x full recompute x micro-batch 1 on 2 GPUs:
dp, tp + sp, ring and Ulysses cp; pp plans listed as skipped with the reason). ``--estimate`` lists plans and
the estimated GPU time without measuring.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "autotune_check.py"


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "autotune_dry.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--gpus", "2", "--model", "llama3", "--exhaustive",
                           "--sweep", "tiny", "--out", str(out)], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "estimated GPU time" in proc.stdout
    return json.loads(out.read_text())


def test_every_plan_of_the_sweep_ran_on_two_processes(result):
    """The tiny sweep on 2 ranks holds dp (ZeRO 0 and 3), tp + sp, ring and Ulysses cp, each measured: 5 finite
    losses (2 warm-up + 3 timed steps), and predicted vs measured recorded; pp plans are skipped with a reason."""
    plans = result["plans"]
    names = " | ".join(r["plan"] for r in plans)
    for part in ("dp=2 zero_stage=3", "tp=2 sp=true", "cp=2 precision", "cp=2 cp_kind=ulysses"):
        assert part in names, (part, names)
    assert len(plans) == 8 and result["gpus"] == 2 and result["warmup"] == 2 and result["steps"] == 3
    for row in plans:
        m = row["measured"]
        assert row["recompute"] == "full" and "micro_batch=1" in row["plan"]
        assert m["loss_finite"] and len(m["losses"]) == 5 and len(m["step_s_timed"]) == 3, row
        assert m["step_s"] > 0 and row["error"]["step_default"] == pytest.approx(
            row["predicted_default"]["step_s"] / m["step_s"] - 1)
    assert result["skipped"] and all(s["why"].startswith("pp > 1") for s in result["skipped"])
    s = result["summary"]
    assert s["measured"] == 8 and 0 < s["chosen_fraction_of_best"] <= 1
    assert s["chosen"]["plan"] == plans[0]["plan"]
    assert s["best"]["step_s"] == min(r["measured"]["step_s"] for r in plans)


def test_predictions_are_the_tuners_own(result):
    """The recorded predictions and their order are ``search_plans``'s on the same tiny graph and nominal H200s."""
    spec = importlib.util.spec_from_file_location("autotune_check_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from lf_parallel import make_cluster

    args = bench._args(["--dry", "--gpus", "2", "--exhaustive", "--sweep", "tiny"])
    work = bench.MODELS.WORKLOADS["llama3"](None, None, True)
    _, cands, _, _ = bench._plans(args, work, make_cluster(gpus=2, gpu="h200"))
    assert [(c.plan.describe(), c.recompute) for c in cands] == [(r["plan"], r["recompute"]) for r in result["plans"]]
    for cand, row in zip(cands, result["plans"], strict=True):
        assert cand.cost.step_s == pytest.approx(row["predicted_default"]["step_s"], rel=1e-9)


def test_estimate_lists_full_size_plans_without_measuring(tmp_path):
    """``--estimate`` for Wan2.1-1.3B at 81x480x832 on 2 H200s: the plan list and the GPU-time estimate, no JSON."""
    out = tmp_path / "none.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gpus", "2", "--model", "wan_dit", "--exhaustive",
                           "--sweep", "tiny", "--estimate", "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "32760 tokens (81x480x832)" in proc.stdout and "estimated GPU time" in proc.stdout
    assert "cp=2" in proc.stdout and not out.exists()
