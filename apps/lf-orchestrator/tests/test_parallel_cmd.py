"""`lf parallel check`. Oracle: the single-process run (the harness compares against it) and the plan
constraints (an invalid plan exits 2 before any process starts)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app

runner = CliRunner()


def test_invalid_plan_fails_before_launch():
    out = runner.invoke(app, ["parallel", "check", "--recipe", "llama3", "--plan", "tp=4", "--nproc", "4",
                              "--dry-run"])
    assert out.exit_code == 2
    assert "parallel.tp=4 does not divide kv_heads=2 of node 'layer0.attention'" in out.output
    assert "try dp=2 zero_stage=3 tp=2" in out.output
    bad = runner.invoke(app, ["parallel", "check", "--recipe", "llama3", "--plan", "tp=2,wat=1", "--nproc", "2"])
    assert bad.exit_code == 2 and "unknown key 'wat'" in bad.output
    ok = runner.invoke(app, ["parallel", "check", "--recipe", "vla", "--plan", "tp=2,dp=2,zero=3,vision.tp=1",
                             "--nproc", "4", "--dry-run"])
    assert ok.exit_code == 0 and "vision.tp=1" in ok.output


def test_check_tensor_parallel_plan_matches_single_process(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    out = runner.invoke(app, ["parallel", "check", "--recipe", "llama3", "--size", "tiny", "--plan", "tp=2,sp=1",
                              "--nproc", "2", "--steps", "2"])
    assert out.exit_code == 0, out.output
    found = re.search(r"max_rel_loss=(\S+) max_rel_grad=(\S+)", out.output)
    assert found and float(found[1]) <= 1e-5 and float(found[2]) <= 1e-5
    assert out.output.rstrip().endswith("OK")


def test_check_clips_tensor_parallel_x_zero3_like_one_process(monkeypatch):
    """``lf parallel check`` clips as the trainers do (default ``--grad-clip 1``, below the tiny llama3's gradient
    norm), so tp=2 x ZeRO-3, whose clipping crashed the trainer at the first step, is checked too. Oracle: the single
    process; losses, each step's gradient norm and the last clipped gradients within 1e-5 relative."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    out = runner.invoke(app, ["parallel", "check", "--recipe", "llama3", "--plan", "tp=2,dp=2,zero=3", "--nproc", "4",
                              "--steps", "2"])
    assert out.exit_code == 0, out.output
    found = re.search(r"max_rel_loss=(\S+) max_rel_grad=(\S+) max_rel_param=\S+ max_rel_grad_norm=(\S+)", out.output)
    assert found and max(float(found[1]), float(found[2]), float(found[3])) <= 1e-5, out.output
    assert out.output.rstrip().endswith("OK")


def test_plans_the_harness_does_not_run_are_refused_by_name():
    """Oracle: what the harness runs (lf_parallel.run_checks: no pipeline schedule, one backward per step, the
    job's dtype). A plan with pp > 1, grad_accum > 1 or a mixed precision, as --plan or
    --reshard-to, exits 2 before any process starts, naming the field; the library refuses it too."""
    from lf_parallel import CheckJob, PlanError, run_checks

    cases = [("pp=2,schedule=gpipe", "pp=2: lf parallel check does not run pipeline schedules"),
             ("pp=2,grad_accum=2", "pp=2: lf parallel check does not run pipeline schedules"),
             ("dp=2,grad_accum=2", "grad_accum=2: lf parallel check does not accumulate micro-batches"),
             ("dp=2,zero=1,precision=bf16", "precision=bf16: lf parallel check does not run mixed precision")]
    for plan, why in cases:
        for args in (["--plan", plan], ["--plan", "dp=2", "--reshard-to", plan]):
            out = runner.invoke(app, ["parallel", "check", "--recipe", "llama3", "--nproc", "2", *args])
            assert out.exit_code == 2, (args, out.output)
            text = " ".join(out.output.split())
            assert f"{args[-2]} {why}" in text and f"parallel.spec='{plan}'" in text, text
    with pytest.raises(PlanError, match="pp=2: lf parallel check does not run pipeline schedules"):
        run_checks([CheckJob(recipe="llama3", plan="pp=2,grad_accum=2")], nproc=2)
    helped = " ".join(runner.invoke(app, ["parallel", "check", "--help"]).output.split())
    assert "gradients clipped to --grad-clip" in helped and "pp > 1, grad_accum > 1" in helped, helped


@pytest.mark.parametrize("plan,nproc", [("cp=2,zero=3", 2), ("tp=2,dp=2,zero=3", 4)])
def test_check_output_is_not_buried_in_per_rank_warnings(monkeypatch, plan, nproc):
    """A context-parallel ZeRO-3 plan (cp=2 on 2 processes: dp_mesh slices the flattened dp_shard_cp dim) and a
    ZeRO-3 + TP plan (tp=2,dp=2 on 4: gathering a ``_StridedShard`` parameter) run as a user runs them, stdout and
    stderr redirected: the table and OK are there, and no warning line is printed by every rank (torch's "Slicing a
    flattened dim from root mesh" UserWarning was, and the ``torch.distributed.tensor._redistribute`` log warning
    "While redistributing from (_StridedShard...) ... sequential all_gather operations"; once per rank).
    Oracle: the single-process run (OK) and the captured output of the worker processes."""
    import subprocess
    import sys
    from collections import Counter

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    proc = subprocess.run([sys.executable, "-m", "lf_orchestrator", "parallel", "check", "--recipe", "llama3",
                           "--plan", plan, "--nproc", str(nproc), "--steps", "1", "--global-batch", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"llama3 tiny: {nproc} processes vs. 1, 1 AdamW steps" in proc.stdout
    assert proc.stdout.rstrip().endswith("OK")
    text = proc.stdout + proc.stderr
    assert "Slicing a flattened dim" not in text and "While redistributing" not in text, text
    repeated = [line for line, n in Counter(re.sub(r"^\[rank\d+\]:", "", ln) for ln in text.splitlines()).items()
                if n > 1 and ("Warning" in line or re.match(r"[WE]\d{4} ", line))]
    assert repeated == [], repeated
