"""`lf run` owns its run folder: one process at a time (flock on RUN/.lock), no empty folders after early failures.

Oracles: a second process that holds the lock (its PID known to the test), the folder's listing on disk
before and after the failed run, and the checker's message of a plan that does not fit the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.run_folder import LOCK_NAME, RunFolder, RunFolderLocked
from lf_parallel import init_distributed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from lf_orchestrator.run_folder import RunFolder
    from lf_parallel import init_distributed
    folder = RunFolder(init_distributed("cpu"))
    folder.claim(Path(sys.argv[1]), created=False)
    print("locked", flush=True)
    sys.stdin.read()  # hold until the test closes stdin
    folder.release()
""")


@pytest.fixture
def holder(tmp_path):
    """A second process that holds ``tmp_path/run``'s lock; yields (folder, its PID)."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield run, proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=120)


def _fake_run(run: Path) -> None:
    """A run folder `lf run --resume` accepts up to the lock: a valid config and a complete checkpoint marker."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.toml").write_text('[run]\ndevice = "cpu"\nthreads = 1\n')
    step = run / "checkpoints" / "step-00000003"
    step.mkdir(parents=True)
    (step / ".lf_complete").write_text("")


def test_second_claim_fails_naming_folder_and_pid(holder):
    """Oracle: the holder process's PID; the lock is free again once it exits."""
    run, pid = holder
    folder = RunFolder(init_distributed("cpu"))
    with pytest.raises(RunFolderLocked, match=rf"run folder {run} is in use .*PID {pid} on host"):
        folder.claim(run, created=False)
    assert (run / LOCK_NAME).read_text().split()[0] == str(pid)


def test_lock_is_released_and_reusable(tmp_path):
    """Oracle: a claim after the first RunFolder exits succeeds, and the lock file names this process."""
    ctx = init_distributed("cpu")
    with RunFolder(ctx) as first:
        first.claim(tmp_path / "run", created=True)
        with pytest.raises(RunFolderLocked, match=f"PID {os.getpid()}"):
            RunFolder(ctx).claim(tmp_path / "run", created=False)
    assert (tmp_path / "run").is_dir()  # no exception: kept even though it is empty
    with RunFolder(ctx) as again:
        again.claim(tmp_path / "run", created=False)
    assert (tmp_path / "run" / LOCK_NAME).read_text().split()[0] == str(os.getpid())


def test_lock_of_a_killed_run_does_not_block(tmp_path):
    """Oracle: the lock file a SIGKILLed holder leaves behind (naming its PID) does not stop a later claim, which
    then names this process (flock locks die with their process; the file's content is only a label)."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    proc.kill()
    proc.wait(timeout=120)
    assert (run / LOCK_NAME).read_text().split()[0] == str(proc.pid)  # stale file left behind
    with RunFolder(init_distributed("cpu")) as folder:
        folder.claim(run, created=False)
        assert (run / LOCK_NAME).read_text().split()[0] == str(os.getpid())


def test_lf_run_resume_twice_is_refused(holder):
    """Oracle: `lf run --resume RUN` while another process holds RUN exits 2 naming RUN and that PID, and leaves
    the folder (a --resume folder is never removed) as it was."""
    run, pid = holder
    _fake_run(run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    result = CliRunner().invoke(app, ["run", "--resume", str(run)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"run folder {run} is in use" in text and f"PID {pid}" in text
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_discard_keeps_folders_with_results(tmp_path):
    """Oracle: the listing on disk; only a created folder holding just config.toml and set-up files (lock,
    tokenizer, empty dirs) goes."""
    ctx = init_distributed("cpu")
    for name, files, created, gone in [("only_config", ["config.toml", "tokenizer.json", "logs/"], True, True),
                                       ("with_ckpt", ["config.toml", "checkpoints/step-1/x"], True, False),
                                       ("with_metrics", ["config.toml", "metrics.jsonl"], True, False),
                                       ("user_given", ["config.toml"], False, False)]:
        run = tmp_path / name
        if not created:
            run.mkdir()  # a folder that did not exist counts as created by the claim
        with pytest.raises(RuntimeError):
            with RunFolder(ctx) as folder:
                folder.claim(run, created=created)
                for f in files:
                    (run / f).parent.mkdir(parents=True, exist_ok=True)
                    (run / f).mkdir() if f.endswith("/") else (run / f).write_text("x")
                raise RuntimeError("plan failed")
        assert run.exists() != gone, name


def test_failed_plan_leaves_no_run_folder(tmp_path):
    """Oracle: the plan checker's message (tp=2 on one process), the output (no "run folder:" line) and the
    listing of tmp_path afterwards: no run folder (before, one with only config.toml stayed) and no runs/ parent
    (made by this run, left empty)."""
    cfg_path = tmp_path / "bad.toml"
    cfg_path.write_text((EXAMPLES / "llama3_pretrain.toml").read_text())
    result = CliRunner().invoke(app, ["run", str(cfg_path), "--set", "parallel.plan='manual'",
                                      "--set", "parallel.spec='tp=2'", "--set", f"run.out_dir='{tmp_path}/runs'",
                                      "--set", f"corpus.cache_dir='{tmp_path}/corpus'", "--set",
                                      "corpus.max_chars=60000", "--set", "corpus.seq_len=64", "--set",
                                      "run.device='cpu'"])
    assert result.exit_code == 2
    assert "must equal the number of processes (1)" in result.output
    # refused before it started: no "run folder:" line for a folder that is gone, and no empty runs/ made for it
    assert "run folder" not in result.output and not (tmp_path / "runs").exists(), result.output


def test_vla_run_failing_before_its_first_step_leaves_no_folder(tiny_config, tmp_path):
    """The VLA family's path: a manual plan for 2 processes on 1 fails before the data and the set-up files, and
    too few samples for the batch fails after model.json / the tokenizers were written; both exit 2 with the
    checker's message and leave no run folder (before, plan.json-free folders with model.json stayed).
    Oracle: the checker's messages and the listing of run.out_dir."""
    runs = tmp_path / "runs"
    for sets, message in [(["parallel.plan='manual'", "parallel.dp=2"], "must equal the number of processes (1)"),
                          (["train.global_batch=4096", "parallel.micro_batch=4096"], "training sample(s)")]:
        result = CliRunner().invoke(app, ["run", str(tiny_config), *[a for s in sets for a in ("--set", s)]])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split()), result.output
        assert not runs.exists(), sorted(runs.rglob("*"))
        assert "run folder" not in result.output, result.output


def test_run_that_starts_names_its_folder(tiny_config, tmp_path):
    """Oracle: the listing of run.out_dir: a run that starts prints `run folder: RUN` once, for the folder that
    exists afterwards (the line now comes once the trainer is set up)."""
    result = CliRunner().invoke(app, ["run", str(tiny_config), "--set", "train.steps=1", "--set", "eval.at_end=false"])
    assert result.exit_code == 0, result.output
    (run,) = (tmp_path / "runs").iterdir()
    assert " ".join(result.output.split()).count(f"run folder: {run}") == 1, result.output


def test_resume_past_train_steps_prints_one_clear_line(vla_run, tmp_path, one_thread):
    """`lf run --resume RUN --set train.steps=1` on a checkpoint at step 2: one line says the checkpoint is past
    train.steps and there is nothing to train (before: "resumed from step 2 of 1" then "already finished").
    Oracle: the checkpoint's step (the vla_run fixture trains 2 steps) and the run's metrics, unchanged."""
    import shutil

    run = Path(shutil.copytree(vla_run, tmp_path / "run"))
    before = (run / "metrics.jsonl").read_bytes()
    assert b'"step": 2' in before.replace(b'"step":2', b'"step": 2')  # the checkpoint's run reached step 2
    result = CliRunner().invoke(app, ["run", "--resume", str(run), "--set", "train.steps=1"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert ("the checkpoint is at step 2, past train.steps = 1: nothing to train; raise train.steps with --set "
            "to continue") in out, out
    assert "resumed from step" not in out and "already finished" not in out, out
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing trained
