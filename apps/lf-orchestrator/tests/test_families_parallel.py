"""The llm family under hybrid lf-parallel plans in 2- and 4-process gloo jobs (torchrun), against one process.

Oracle: the single-process run of the same config (DESIGN.md: a plan is correct when its losses equal the
single-process run's within float32 tolerance); 3 steps, so the updates of ZeRO-3 / tensor + sequence
parallelism enter the losses of steps 2 and 3, and the held-out cross-entropy after the last update. Every
run clips (``train.grad_clip`` below the gradient norm), so each step's logged gradient norm, computed on the
plan's shards, is compared too (``lf_parallel.clip_grad_norm_``: tensor parallel x ZeRO-3 mixes gradients on the
2-D ``(dp_shard, tp)`` mesh with FSDP's 1-D dp mesh).
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


CLIP = 0.05
"""Below every step's gradient norm of the tiny model (about 0.3 to 3), so every step clips."""


def _run(tmp: Path, corpus: Path, spec: str, nproc: int) -> tuple[list[float], float, list[float]]:
    out = tmp / spec.replace(",", "_").replace("=", "")
    sets = [f"run.out_dir='{out}'", f"corpus.cache_dir='{corpus}'", "corpus.max_chars=60000", "corpus.seq_len=64",
            "train.steps=3", "train.warmup_steps=1", "train.global_batch=8", "parallel.plan='manual'",
            f"parallel.spec='{spec}'", "run.threads=1", "run.device='cpu'", "train.log_every=1",
            f"train.grad_clip={CLIP}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_free_port()), "-m", "lf_orchestrator", "run", str(EXAMPLE), *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    norms = [r["train/grad_norm"] for r in rows if "train/grad_norm" in r]
    return losses, next(r["eval/cross_entropy"] for r in rows if "eval/cross_entropy" in r), norms


def _reference(tmp_path_factory) -> tuple[Path, Path]:
    """(the corpus folder shared by the runs, the single-process run's results file), run once per session."""
    tmp = tmp_path_factory.getbasetemp() / "families_parallel"
    corpus = tmp / "corpus"
    ref = tmp / "ref.json"
    if not ref.exists():
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(json.dumps(_run(tmp, corpus, "dp=1", 1)))
    return tmp, ref


def _assert_matches(spec: str, got, ref) -> None:
    """Losses, gradient norms (each clipped step's) and the held-out CE equal one process's within 1e-5."""
    (losses, ce, norms), (ref_losses, ref_ce, ref_norms) = got, ref
    assert len(losses) == len(norms) == 3
    for a, b in zip(losses, ref_losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (spec, losses, ref_losses)
    for a, b in zip(norms, ref_norms, strict=True):
        assert b > CLIP and abs(a - b) <= 1e-5 * b, (spec, norms, ref_norms)
    assert abs(ce - ref_ce) <= 1e-5 * ref_ce


@pytest.mark.parametrize("spec", ["dp=2,zero=3", "tp=2,sp=1"])
def test_two_process_plan_matches_one_process(tmp_path_factory, spec):
    """Losses and gradient norms of 3 steps and the held-out CE under ``spec`` (2 processes) equal dp=1's within
    1e-5 relative."""
    tmp, ref = _reference(tmp_path_factory)
    _assert_matches(spec, _run(tmp, tmp / "corpus", spec, 2), json.loads(ref.read_text()))


def test_tensor_parallel_x_zero3_clips_like_one_process(tmp_path_factory):
    """``tp=2,dp=2,zero=3`` on 4 processes, the run ``lf launch --nproc-per-node 4 --device cpu`` starts: it crashed
    at the first step's gradient clipping ("All operands in aten.stack.default must have the same mesh"); its losses,
    clipped steps' gradient norms and held-out CE must equal the single process's within 1e-5 relative."""
    tmp, ref = _reference(tmp_path_factory)
    spec = "tp=2,dp=2,zero=3"
    _assert_matches(spec, _run(tmp, tmp / "corpus", spec, 4), json.loads(ref.read_text()))
