"""`lf run` under torchrun with 2 CPU processes (gloo). Oracle: the single-process run.

With data parallelism each rank takes a strided half of the same shuffled micro-batches
that the single process accumulates (grad_accum=2), and the loss is normalized by the
global target-token count, so both runs take the same optimizer steps. Losses agree to
1e-5 relative: float32 sums in a different order (all-reduce vs accumulation) are the
only difference.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lf_orchestrator.config import load_config


def _losses(out_root: Path) -> list[float]:
    (run_dir,) = [p for p in out_root.iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows]


def test_two_process_data_parallel_matches_single_process(tiny_config, tmp_path):
    common = ["--set", "eval.at_end=false", "--set", "run.threads=1", "--set",
              "parallel.micro_batch=4"]
    single_out, dp_out = tmp_path / "single", tmp_path / "dp"
    single = subprocess.run([sys.executable, "-m", "lf_orchestrator", "run", str(tiny_config),
                             *common, "--set", f"run.out_dir='{single_out}'"],
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-2000:]
    dp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", "-m", "lf_orchestrator", "run", str(tiny_config),
                         *common, "--set", f"run.out_dir='{dp_out}'"],
                        capture_output=True, text=True, timeout=300)
    assert dp.returncode == 0, dp.stderr[-2000:]
    (dp_dir,) = [p for p in dp_out.iterdir() if p.is_dir()]
    plan = json.loads((dp_dir / "plan.json").read_text())["plan"]  # the auto-tuner's plan on 2 processes
    assert plan.startswith("dp=2 ") and "micro_batch=4 grad_accum=1" in plan
    a, b = _losses(single_out), _losses(dp_out)
    steps = load_config(tiny_config).train.steps
    assert len(a) == len(b) == steps
    for x, y in zip(a, b, strict=True):
        assert abs(x - y) <= 1e-5 * abs(x), (a, b)
