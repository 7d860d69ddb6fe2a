"""The llm family under hybrid lf-parallel plans in 2-process gloo jobs (torchrun), against one process.

Oracle: the single-process run of the same config (DESIGN.md: a plan is correct when its losses equal the
single-process run's within float32 tolerance); 3 steps, so the updates of ZeRO-3 / tensor + sequence
parallelism enter the losses of steps 2 and 3, and the held-out cross-entropy after the last update.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp: Path, corpus: Path, spec: str, nproc: int) -> tuple[list[float], float]:
    out = tmp / spec.replace(",", "_").replace("=", "")
    sets = [f"run.out_dir='{out}'", f"corpus.cache_dir='{corpus}'", "corpus.max_chars=60000", "corpus.seq_len=64",
            "train.steps=3", "train.warmup_steps=1", "train.global_batch=8", "parallel.plan='manual'",
            f"parallel.spec='{spec}'", "run.threads=1", "run.device='cpu'", "train.log_every=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_free_port()), "-m", "lf_orchestrator", "run", str(EXAMPLE), *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    return losses, next(r["eval/cross_entropy"] for r in rows if "eval/cross_entropy" in r)


@pytest.mark.parametrize("spec", ["dp=2,zero=3", "tp=2,sp=1"])
def test_two_process_plan_matches_one_process(tmp_path_factory, spec):
    """Losses of 3 steps and the held-out CE under ``spec`` (2 processes) equal dp=1's within 1e-5 relative."""
    tmp = tmp_path_factory.getbasetemp() / "families_parallel"
    corpus = tmp / "corpus"
    ref = tmp / "ref.json"
    if not ref.exists():
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(json.dumps(_run(tmp, corpus, "dp=1", 1)))
    ref_losses, ref_ce = json.loads(ref.read_text())
    losses, ce = _run(tmp, corpus, spec, 2)
    assert len(losses) == 3
    for a, b in zip(losses, ref_losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (spec, losses, ref_losses)
    assert abs(ce - ref_ce) <= 1e-5 * ref_ce
