"""`lf plan` and `lf memory`. Oracles: the library calls they print (``search_plans``,
``estimate_memory`` on the same graph and plan), the ranking order, and the "cannot fit"
message naming the memory needed and available."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lf_ir.recipes import llama3
from lf_memory import estimate_memory
from lf_orchestrator.cli import app
from lf_parallel import parse_plan

runner = CliRunner()
GIB = 1024 ** 3


def test_plan_json_ranks_feasible_plans():
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "8B", "--seq", "8192", "--gpus", "8",
                              "--gpu", "h100", "--global-batch", "16", "--top", "4", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    plans = d["plans"]
    assert len(plans) == 4 and d["tokens_per_sample"] == 8192 and d["global_batch"] == 16
    assert [p["step_s"] for p in plans] == sorted(p["step_s"] for p in plans)
    for p in plans:
        assert p["peak_gib"] <= 0.9 * 79.1
        parts = p["breakdown_s"]
        assert parts["compute"] + parts["recompute"] + parts["exposed_comm"] + parts["bubble"] + \
            parts["optimizer"] == pytest.approx(p["step_s"])


def test_plan_table_and_winner_breakdown():
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "tiny", "--seq", "256", "--gpus", "2",
                              "--gpu", "h200", "--top", "2"])
    assert out.exit_code == 0, out.output
    assert "tokens/s/GPU" in out.output and "winner, seconds per step: compute" in out.output
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "tiny", "--seq", "256", "--gpus", "2",
                              "--gpu", "h200", "--top", "2", "--json"])
    best = json.loads(out.output)["plans"][0]
    parts = best["breakdown_s"]
    # A tiny model is host-bound: issuing its kernels takes longer than running them, and the step holds that
    # launch time (overlapped with the GPU work) instead of the compute.
    assert parts["host_launch"] > parts["compute"] + parts["recompute"] > 0
    assert best["step_s"] >= parts["host_launch"]


def test_plan_cannot_fit_names_memory():
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "70B", "--seq", "8192", "--gpus", "2",
                              "--gpu", "a100-40g"])
    assert out.exit_code == 2
    assert "no plan fits" in out.output and "GiB per GPU" in out.output and "a100-40g offers 35.5 GiB" in out.output


def test_plan_errors():
    out = runner.invoke(app, ["plan", "--gpus", "8"])
    assert out.exit_code == 2 and "--recipe and --size" in out.output
    out = runner.invoke(app, ["plan", "--recipe", "llama3", "--size", "8B", "--gpus", "8", "--gpu", "tpu-v5"])
    assert out.exit_code == 2 and "unknown GPU 'tpu-v5'" in out.output


def test_memory_matches_estimator():
    args = ["memory", "--recipe", "llama3", "--size", "8B", "--seq", "8192", "--plan", "dp=2,zero=3",
            "--recompute", "full", "--gpu", "h200", "--json"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    graph = llama3.build_graph(llama3.llama3_config("8B"), 8192)
    est = estimate_memory(graph, parse_plan("dp=2,zero=3", precision="bf16"), recompute="full")
    assert d["gib"]["total"] == pytest.approx(est.total / GIB) and d["fits"] is True
    out = runner.invoke(app, ["memory", "--recipe", "llama3", "--size", "70B", "--seq", "8192", "--gpu", "h100"])
    assert out.exit_code == 1 and "does NOT fit" in out.output


def test_memory_refuses_plans_that_cannot_run_and_exits_1_when_over_memory():
    """Oracle: check_plan's constraints (degrees multiply to the GPUs; tp divides heads) and the contract
    that a plan over the GPU's memory exits 1."""
    from typer.testing import CliRunner

    from lf_orchestrator.cli import app

    base = ["memory", "--recipe", "llama3", "--size", "8B", "--seq", "8192", "--gpu", "h100"]
    r = CliRunner().invoke(app, [*base, "--gpus", "8", "--plan", "tp=16"])
    assert r.exit_code == 2 and "must equal the number of processes (8)" in r.output
    r = CliRunner().invoke(app, [*base, "--gpus", "3", "--plan", "tp=3"])
    assert r.exit_code == 2 and "tp=3 does not divide" in r.output
    r = CliRunner().invoke(app, [*base, "--gpus", "1", "--plan", "dp=1"])
    assert r.exit_code == 1 and "does NOT fit" in r.output
