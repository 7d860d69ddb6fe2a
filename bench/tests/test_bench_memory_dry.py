"""``bench/memory_check.py --dry``: the one-H200 memory / step-time check's code paths on the CPU, tiny models.

One run of the script (tiny llama3, qwen2_vl and wan_dit; 2 steps per recompute plan) writes the JSON the tests
read. Oracles: the ``none`` plan's losses (recomputation replays the same kernels, so every plan's losses are
bitwise the same); the planner's contract for the auto plan (fits its budget, recomputes fewer FLOPs than full,
the budget below what uniform selective needs); ``bench/report.py``'s table for the written file.
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
SCRIPT = REPO / "bench" / "memory_check.py"
WORKLOADS = ("llama3", "qwen2_vl", "wan_dit")
PLANS = ("none", "selective", "full", "auto")


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "memory_check_dry.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_workload_and_plan_ran_with_identical_losses(result):
    """Oracle: the none plan's losses; each plan ran 2 steps, finite losses that fall, predictions positive."""
    assert set(result["workloads"]) == set(WORKLOADS)
    for key, w in result["workloads"].items():
        assert set(w["plans"]) == set(PLANS), key
        reference = w["plans"]["none"]["losses"]
        for name, r in w["plans"].items():
            assert "error" not in r and "oom" not in r and "skipped" not in r, (key, name, r)
            assert len(r["step_s_timed"]) == 2 and r["loss_finite"] and r["loss_falling"], (key, name)
            assert r["losses"] == reference, (key, name)
            assert r["peak_gib_predicted"] > 0 and r["step_s_predicted"] > 0, (key, name)
        pred = {name: w["plans"][name]["peak_gib_predicted"] for name in PLANS}
        # the peak is the larger of two moments; where the optimizer step dominates (tiny qwen2_vl), plans tie
        assert pred["full"] <= pred["auto"] <= pred["selective"] <= pred["none"], (key, pred)
        acts = {name: w["predicted_breakdown_gib"][name]["activations"] for name in ("none", "selective", "full")}
        assert acts["full"] < acts["selective"] < acts["none"], (key, acts)


def test_auto_fits_a_budget_only_full_meets_uniformly(result):
    """Oracle: the planner's contract on each workload's graph."""
    for key, w in result["workloads"].items():
        a = w["auto"]
        assert a["fits"] and a["plan_activation_gib"] <= a["budget_activation_gib"], (key, a)
        assert not a["uniform_selective_fits"] and a["full_everywhere_gib"] <= a["budget_activation_gib"], (key, a)
        assert 0 < a["recompute_tflop"] < a["full_recompute_tflop"] and a["fewer_flops_than_full"], (key, a)
        assert a["counts"]["full"] < sum(a["counts"].values()), (key, a)


def test_report_renders_the_file(result):
    """Oracle: the written file; every workload and plan appears in the rendered section."""
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert any(k == "memory_check" for k in report.RENDERERS)
    text = "\n".join(report._memory_check(result))
    for w in result["workloads"].values():
        assert w["model"] in text
    assert text.count("| auto |") == len(WORKLOADS) and text.count("| none |") == len(WORKLOADS)
