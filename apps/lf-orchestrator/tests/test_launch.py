"""`lf launch`: the torchrun command, elastic restart after SIGKILL of one rank.

Oracles: torchrun's own argument parser (``torch.distributed.run.get_args_parser``) reading the
command we print, and for the restart test the uninterrupted 2-process run's losses (the restarted
run must reproduce every step exactly once with the same values: same world size, same data order,
resumed from a complete checkpoint).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from lf_orchestrator.cli import app


def _torchrun_args(argv: list[str]):
    from torch.distributed.run import get_args_parser

    i = argv.index("torch.distributed.run")
    return get_args_parser().parse_args(argv[i + 1:])


def test_torchrun_dry_run_is_what_torchrun_parses(tiny_config):
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--nproc-per-node", "2", "--device", "cpu",
                                   "--max-restarts", "1", "--run-id", "r1", "--dry-run", "--set", "train.steps=3"])
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.stdout.strip())
    assert argv[0] == sys.executable
    a = _torchrun_args(argv)
    assert (a.nnodes, a.nproc_per_node, a.max_restarts, a.standalone, a.module) == ("1", "2", 1, True, True)
    assert a.training_script == "lf_orchestrator"
    run_dir = str(tiny_config.parent / "runs" / "tiny-r1")
    assert a.training_script_args == ["run", str(tiny_config.resolve()), "--run-dir", run_dir,
                                      "--set", "run.device=cpu", "--set", "train.steps=3"]


def test_multi_node_torchrun_needs_rendezvous(tiny_config):
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--nodes", "2", "--run-id", "x", "--dry-run",
                                   "--rdzv-endpoint", "head:29400"])
    assert res.exit_code == 0, res.output
    a = _torchrun_args(shlex.split(res.stdout.strip()))
    assert (a.nnodes, a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id, a.standalone) == ("2", "c10d", "head:29400",
                                                                                     "x", False)
    for extra, message in ([["--run-id", "x"], "--rdzv-endpoint"], [["--rdzv-endpoint", "h:1"], "--run-id"]):
        bad = CliRunner().invoke(app, ["launch", str(tiny_config), "--nodes", "2", "--dry-run", *extra])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_launch_rejects_bad_config_and_options(tiny_config):
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--dry-run", "--set", "train.stepz=3"])
    assert res.exit_code == 2 and "train.stepz" in res.output
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--dry-run", "--gpus-per-node", "0"])
    assert res.exit_code == 2 and "--procs-per-node" in res.output and "got 0" in res.output


LLAMA = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"


def test_launch_refuses_a_manual_plan_that_does_not_fit_the_world(tmp_path):
    """Oracle: lf-parallel's check_plan for the job's world size (nodes x procs per node), which `lf run` applies
    in every worker: tp=3 on 2 processes is refused once, exit 2, before torchrun starts or any folder is made."""
    sets = ["--set", f"run.out_dir='{tmp_path / 'runs'}'", "--set", "parallel.plan='manual'"]
    res = CliRunner().invoke(app, ["launch", str(LLAMA), "--nproc-per-node", "2", "--device", "cpu", *sets,
                                   "--set", "parallel.spec='tp=3'"])
    assert res.exit_code == 2, res.output
    assert res.output.count("error:") == 1 and "dp*tp*pp*cp = 1*3*1*1 = 3" in res.output, res.output
    assert "1 node(s) x 2 processes = 2" in res.output and str(LLAMA) in res.output, res.output
    assert not (tmp_path / "runs").exists()
    res = CliRunner().invoke(app, ["launch", str(LLAMA), "--nproc-per-node", "2", "--dry-run", *sets,
                                   "--set", "parallel.spec='tp=2'"])
    assert res.exit_code == 0, res.output  # a plan that fits starts (here: is printed)


TORCHRUN_STDERR = """rank error here
E1204 18:41:56.903000 18645 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 1
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
lf_orchestrator FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_18:41:56
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 18690)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchrun_failure_report_is_summarised():
    """Oracle: torchrun 2.x's stderr when rank 1 exits with code 2 (captured from a real run, frames shortened):
    the rank's own output and a worker's traceback pass unchanged; torchrun's ChildFailedError traceback and
    report become one line naming the rank, its exit code and where its error is; the exit code is the rank's."""
    import io

    from lf_orchestrator.launch._torchrun import FailureFilter

    worker_tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n'
    out = io.StringIO()
    filt = FailureFilter(out)
    filt.feed_all(io.StringIO(worker_tb + TORCHRUN_STDERR))
    text = out.getvalue()
    assert text.startswith(worker_tb + "rank error here\n"), text
    assert "ChildFailedError" not in text and "File \"<frozen runpy>\"" not in text and "=====" not in text, text
    assert text.rstrip().endswith("worker failed: rank 1 (local_rank: 1) (host localhost) exited with code 2; "
                                  "its error is printed above"), text
    assert filt.exit_code == 2


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _rank_pid(root_pid: int, rank: str) -> int | None:
    todo, seen = [root_pid], set()
    while todo:
        pid = todo.pop()
        seen.add(pid)
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"".join(env) and pid != root_pid:
            return pid
        todo += [c for c in _children(pid) if c not in seen]
    return None


def test_sigkill_one_rank_restarts_from_last_checkpoint(tiny_config, tmp_path):
    """torchrun --max-restarts 1, 2 CPU processes: SIGKILL rank 1 after the step-20 checkpoint; the group
    restarts, resumes from the latest complete checkpoint and finishes. Oracle: an uninterrupted run."""
    common = ["--nproc-per-node", "2", "--device", "cpu", "--set", "eval.at_end=false", "--set", "run.threads=1",
              "--set", "train.steps=40", "--set", "train.ckpt_every=10", "--set", "train.warmup_steps=2"]
    env = dict(os.environ, MUJOCO_GL="osmesa")
    lf = [sys.executable, "-m", "lf_orchestrator", "launch", str(tiny_config)]
    killed = subprocess.Popen([*lf, *common, "--max-restarts", "1", "--run-id", "killed"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tiny_config.parent / "runs" / "tiny-killed"
    deadline, victim = time.time() + 600, None
    while time.time() < deadline and killed.poll() is None:
        latest = run_dir / "checkpoints" / "latest"
        if latest.is_file() and latest.read_text() >= "step-00000020":
            victim = _rank_pid(killed.pid, "1")
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert victim is not None, "rank 1 was not found running after the step-20 checkpoint"
    out, _ = killed.communicate(timeout=600)
    assert killed.returncode == 0, out[-12000:]
    assert "resumed from step" in out, out[-3000:]
    resumed_at = int(out.split("resumed from step")[1].split()[0])
    assert resumed_at >= 20 and resumed_at % 10 == 0
    full = subprocess.run([*lf, *common, "--run-id", "full"], env=env, capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    a, b = _rows(tiny_config.parent / "runs" / "tiny-full"), _rows(run_dir)
    assert [r["step"] for r in b] == list(range(1, 41))  # every step once: the lost tail was redone once
    assert [r["train/loss"] for r in a] == [r["train/loss"] for r in b]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000040"
