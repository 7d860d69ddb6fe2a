"""``bench/step_anatomy.py``: its CPU dry run, its argument checks, and its timeline / memory arithmetic.

Oracles: recompute replays the same kernels, so the ``none`` and ``full`` rows of one model have bitwise equal
losses; hand-computed unions of kernel intervals and a hand-replayed allocation trace; ``bench/report.py``
renders the written file.
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
SCRIPT = REPO / "bench" / "step_anatomy.py"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run(*args: str, out: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, str(SCRIPT), "--dry", *args, "--out", str(out or "/dev/null")]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_dry_run_writes_rows_that_recompute_leaves_bitwise_equal(tmp_path):
    out = tmp_path / "anatomy.json"
    proc = _run("--case", "wan_dit:1:2:none", "--case", "wan_dit:1:2:full", "--fused", "0", out=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and [r["recompute"] for r in result["rows"]] == ["none", "full"]
    none, full = result["rows"]
    assert none["last_loss"] == full["last_loss"] and none["last_loss"] == none["last_loss"]  # equal, not NaN
    assert none["micro_batch"] == 1 and none["grad_accum"] == 2 and none["fused_ops"] is False
    assert all(r["step_s"] > 0 and len(r["step_s_timed"]) == 1 for r in result["rows"])
    report = _module(REPO / "bench" / "report.py", "bench_report_anatomy")
    lines = report._step_anatomy(result)
    assert sum(line.startswith("| wan_dit-tiny") for line in lines) == 2


@pytest.mark.parametrize("args", [("--case", "foo"), ("--case", "llama3:0:1:none"), ("--case", "gpt:1:1:none"),
                                  ("--case", "llama3:1:1:bogus"), ("--fused", "2")])
def test_bad_arguments_are_refused_before_any_model_is_built(args):
    proc = _run(*args)
    assert proc.returncode == 2 and "expected" in proc.stderr and "Traceback" not in proc.stderr


def test_busy_union_and_peak_replay_by_hand():
    anatomy = _module(SCRIPT, "bench_step_anatomy")
    assert anatomy._busy_union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    frame = [{"filename": "/x/lf_ir/_lower.py", "line": 12, "name": "forward"}]
    events = [{"action": "alloc", "addr": 1, "size": 100, "frames": frame},
              {"action": "alloc", "addr": 2, "size": 50, "frames": []},
              {"action": "free_completed", "addr": 1, "size": 100},
              {"action": "alloc", "addr": 3, "size": 30, "frames": frame}]
    peak = anatomy._peak_alive(events, live_after=1000, top=5)
    # 1000 held at the end = base + 100 + 50 - 100 + 30, so base 920; the peak 1070 comes after the second alloc
    gib = 1024 ** 3
    assert peak["held_before_step_gib"] * gib == pytest.approx(920) and peak["peak_gib"] * gib == pytest.approx(1070)
    sites = {g["frame"]: (round(g["gib"] * gib), g["count"]) for g in peak["allocated_in_step_alive_at_peak"]}
    assert sites == {"lf_ir/_lower.py:12 forward": (100, 1), "?": (50, 1)}
