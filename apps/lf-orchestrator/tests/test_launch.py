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
