"""`lf parallel check`: the recipe's tiny config trained by `lf run` under a plan (torchrun, gloo) and by one process.

Oracle: the single-process run of the same config through `lf run` (same seed, same global batch and micro-batch
split): per-step losses and gradient norms (before clipping; every step clips) and the model's parameters after
the last step within 1e-5 relative. A plan that `lf run` refuses exits 2 before any process starts, with the
trainer's own reason; two runs that differ (another seed) fail the comparison (exit 1), so a pass means something.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app

runner = CliRunner()


def _check(tmp: Path, *args: str) -> tuple[int, str]:
    work = tmp / "work"
    out = runner.invoke(app, ["parallel", "check", *args, "--cache-dir", str(tmp.parent / "cache"),
                              "--work-dir", str(work)])
    return out.exit_code, " ".join(out.output.split())


def _assert_passed(code: int, text: str, steps: int = 3) -> None:
    assert code == 0, text[-4000:]
    found = re.search(r"max_rel_loss=(\S+) max_rel_grad_norm=(\S+) max_rel_param=(\S+)", text)
    assert found and max(float(x) for x in found.groups()) <= 1e-5, text[-2000:]
    assert all(f"step {s} loss" in text and f"step {s} gradient norm" in text for s in range(1, steps + 1)), text
    assert "did not clip" not in text and "missing:" not in text and text.endswith("OK"), text[-2000:]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One data cache (corpus) for the module's checks."""
    return tmp_path_factory.mktemp("check")


def test_refused_plans_exit_2_before_any_process(tmp_path):
    """Oracle: what `lf run` refuses (``check_plan`` against the model, the recipe trainer's wiring, the config's
    checks). Each plan, as --plan or --reshard-to, exits 2 naming the option and the reason, and no run folder is
    made; a plan the trainer runs passes --dry-run and prints its resolved form."""
    cases = [(["--recipe", "llama3", "--plan", "tp=4", "--nproc", "4"],
              "--plan 'tp=4': parallel.tp=4 does not divide kv_heads=2 of node 'layer0.attention'"),
             (["--recipe", "llama3", "--plan", "tp=2,wat=1", "--nproc", "2"], "unknown key 'wat'"),
             (["--recipe", "qwen2_vl", "--plan", "pp=2,grad_accum=2", "--nproc", "2"],
              "pp > 1 is wired into the trainer for model.recipe in ['llama3', 'vla'] only (the recipes whose "
              "RecipeSpec.pipeline is set), got model.recipe = 'qwen2_vl'"),
             (["--recipe", "qwen2_vl", "--plan", "dp=2", "--reshard-to", "pp=2,grad_accum=2", "--nproc", "2"],
              "--reshard-to 'pp=2,grad_accum=2': parallel.spec 'pp=2,grad_accum=2': pp > 1 is wired"),
             (["--recipe", "llama3", "--plan", "dp=2,precision=bf16", "--nproc", "2"],
              "precision=bf16: the check compares float32 runs"),
             (["--recipe", "wan_vae", "--plan", "dp=2", "--nproc", "2"], "no check config for recipe 'wan_vae'")]
    for i, (args, why) in enumerate(cases):
        code, text = _check(tmp_path / str(i), *args)
        assert code == 2 and why in text, (args, text)
        assert not (tmp_path / str(i) / "work" / "reference").exists()
    code, text = _check(tmp_path / "ok", "--recipe", "llama3", "--plan", "pp=2,grad_accum=2", "--nproc", "2",
                        "--dry-run")
    assert code == 0 and "plan (--plan): dp=1 pp=2 micro_batch=4 grad_accum=2 (global batch 8)" in text, text
    assert not (tmp_path / "ok" / "work" / "reference").exists()


@pytest.fixture(scope="module")
def llama3_pipeline(cache) -> tuple[Path, int, str]:
    """The check of llama3 under ``pp=2,grad_accum=2`` on 2 processes (1F1B over 2 micro-batches: a plan the
    harness-based checker refused): (work folder, exit code, output)."""
    tmp = cache / "pp2"
    code, text = _check(tmp, "--recipe", "llama3", "--plan", "pp=2,grad_accum=2", "--nproc", "2")
    return tmp / "work", code, text


def test_pipeline_with_grad_accum_matches_one_process(llama3_pipeline):
    """pp=2 with 2 micro-batches per step, through `lf run`: 3 steps' losses and gradient norms and the final
    parameters equal the single-process run's (same 2 micro-batches) within 1e-5; both ran the plans they name."""
    work, code, text = llama3_pipeline
    _assert_passed(code, text)
    assert json.loads((work / "plan" / "plan.json").read_text())["plan"].startswith("dp=1 pp=2 ")
    assert json.loads((work / "reference" / "plan.json").read_text())["plan"].startswith("dp=1 micro_batch=4 "
                                                                                          "grad_accum=2")


def test_check_fails_on_runs_that_differ(llama3_pipeline, capsys):
    """The comparison can fail: the reference run against the same config trained with another seed (other
    weights, other batches) prints the differences and FAIL and returns exit status 1; against itself, 0."""
    from lf_orchestrator._check_compare import check_runs

    work = llama3_pipeline[0]
    other = work / "seed1"
    done = subprocess.run([sys.executable, "-m", "lf_orchestrator", "run", str(work / "check.toml"), "--run-dir",
                           str(other), "--set", "run.seed=1", "--set", "parallel.spec='dp=1,grad_accum=2'"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    kw = dict(steps=3, tol=1e-5, title="seed 1 vs seed 0", grad_clip=0.01)
    assert check_runs(work / "reference", work / "reference", **kw) == 0
    capsys.readouterr()
    assert check_runs(work / "reference", other, **kw) == 1
    out = " ".join(capsys.readouterr().out.split())
    found = re.search(r"max_rel_loss=(\S+) max_rel_grad_norm=(\S+) max_rel_param=(\S+)", out)
    assert found and float(found[1]) > 1e-3 and float(found[3]) > 1e-2, out
    assert "FAIL: differences exceed --tol 1e-05" in out


def test_tensor_parallel_x_zero3_four_processes(cache):
    """tp=2 x ZeRO-3 over dp=2 (4 processes; clipping on the 2-D mesh) equals one process within 1e-5."""
    code, text = _check(cache / "tp2dp2", "--recipe", "llama3", "--plan", "tp=2,dp=2,zero=3", "--nproc", "4")
    _assert_passed(code, text)


def test_video_context_parallel_and_reshard(cache):
    """wan_dit (synthetic latents) under cp=2 x ZeRO-3 for steps 1-2, its step-2 checkpoint resumed under dp=2 x
    ZeRO-3 for step 3 (DCP reshards): equal to one process within 1e-5."""
    code, text = _check(cache / "wan", "--recipe", "wan_dit", "--plan", "cp=2,zero=3", "--reshard-to", "dp=2,zero=3",
                        "--nproc", "2")
    _assert_passed(code, text)
    log = (cache / "wan" / "work" / "resharded.log").read_text()
    assert "resharding it (DCP) to plan 'dp=2 zero_stage=3" in " ".join(log.split()), log[-2000:]


def test_vla_plans_are_checked_by_the_trainers_rules(cache):
    """The VLA recipes go through the same trainer: a token-VLA pipeline plan validates (the full comparison of
    VLA plans against one process is test_vla_parallel.py); vla_flow under pp = 2 is refused by name before any
    process starts (exit 2), with the trainer's reason."""
    code, text = _check(cache / "vla", "--recipe", "vla", "--plan", "pp=2,grad_accum=2", "--nproc", "2", "--dry-run")
    assert code == 0, text
    code, text = _check(cache / "vla_flow", "--recipe", "vla_flow", "--plan", "pp=2,grad_accum=2", "--nproc", "2",
                        "--dry-run")
    assert code == 2 and "model.recipe = 'vla_flow'" in " ".join(text.split()), text


def test_work_dir_and_trained_plan_guards(tmp_path):
    """Oracle: the files. A run whose ``plan.json`` names another plan than the checked one fails (exit 1: a
    plan the run did not train is never passed); an earlier check's run folders in --work-dir are removed before
    a check (``lf run --run-dir`` would resume them); a non-empty folder that is not a check's is refused (exit 2)
    and left as it was."""
    import typer

    from lf_orchestrator.parallel_cmd import _check_ran, _clear_work_dir
    from lf_parallel import parse_plan

    run = tmp_path / "plan"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"plan": "dp=2 micro_batch=4 grad_accum=1 (global batch 8)"}))
    _check_ran(run, parse_plan("dp=2,micro_batch=4"))
    with pytest.raises(typer.Exit) as stop:
        _check_ran(run, parse_plan("dp=2,zero=3,micro_batch=4"))
    assert stop.value.exit_code == 1
    (tmp_path / "check.toml").write_text("")
    _clear_work_dir(tmp_path)
    assert not run.exists() and (tmp_path / "check.toml").exists()
    other = tmp_path / "other"
    (other / "plan").mkdir(parents=True)
    with pytest.raises(typer.Exit) as stop:
        _clear_work_dir(other)
    assert stop.value.exit_code == 2 and (other / "plan").is_dir()
