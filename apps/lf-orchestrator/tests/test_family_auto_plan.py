"""``parallel.plan = "auto"`` in the recipe trainer: the ``lf plan`` ranking, restricted to the plans the
trainer can run, chooses context parallelism where it ranks best, and runs it.

Oracles: the search's own ranking (``lf_parallel.search_plans`` on the nominal 2 x H100 cluster of a CPU job:
one 4,096-token sample per step leaves cp=2 (or tp=2) as the only 2-GPU plans, and cp=2 ranks first); the
single-process run of the same config (DESIGN.md: losses of a parallel plan equal the one-process run's
within float32 tolerance; 2 steps of the tiny llama3 in float32, 1e-5 relative); the written ``plan.json``
and ``lf plan --json`` output for the skipped plans and their reasons.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"


def _sets(corpus: Path, seq: int, *extra: str) -> list[str]:
    return [f"corpus.cache_dir='{corpus}'", "corpus.max_chars=60000", f"corpus.seq_len={seq}",
            f"model.overrides={{vocab_size=1024, max_seq_len={seq}}}", "train.steps=2", "train.warmup_steps=1",
            "train.global_batch=1", "parallel.micro_batch=1", "train.log_every=1", "run.threads=1",
            "run.device='cpu'", *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(run_dir: Path, sets: list[str], nproc: int) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_free_port()), "-m", "lf_orchestrator", "run", str(EXAMPLE), "--run-dir", str(run_dir),
           *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return " ".join((done.stdout + done.stderr).split())


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


def test_auto_chooses_cp_and_runs_it_on_two_processes(tmp_path):
    """4,096 tokens, one sample per step, 2 processes: auto picks ``cp=2`` (before, cp plans were never chosen),
    the 2-process gloo run trains with it, and its 2 losses equal the one-process run's within 1e-5 relative."""
    corpus = tmp_path / "corpus"
    out = _run(tmp_path / "auto", _sets(corpus, 4096), 2)
    # the ZeRO stage is the cost model's (unrounded) pick among cp=2 plans within microseconds of each other
    assert re.search(r"plan \(auto\): dp=1 (zero_stage=\d )?cp=2 micro_batch=1", out), out[-2000:]
    info = json.loads((tmp_path / "auto" / "plan.json").read_text())
    assert info["source"] == "auto" and info["nominal_cluster"] and info["skipped"] == []
    _run(tmp_path / "ref", _sets(corpus, 4096, "parallel.plan='manual'", "parallel.spec='dp=1'"), 1)
    got, ref = _losses(tmp_path / "auto"), _losses(tmp_path / "ref")
    assert len(got) == len(ref) == 2
    for a, b in zip(got, ref, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (got, ref)


def _plan_of(seq: int, *extra: str):
    from lf_ir.recipes import llama3
    from lf_orchestrator.families._plan import resolve_plan
    from lf_orchestrator.families.recipes import recipe_config

    cfg = load_config(EXAMPLE, _sets(Path("/nonexistent"), seq, *extra))
    graph = llama3.build_graph(recipe_config("llama3", "tiny", dict(cfg.model.overrides))[0], seq)
    return resolve_plan(cfg, graph, world_size=2, device_type="cpu", seq=seq, precision="fp32")


def test_auto_skips_plans_the_trainer_cannot_run_and_says_why():
    """4,098 tokens split by cp=2 leave 2,049 per rank, not a zigzag split (2 * cp must divide the tokens): the
    faster cp plans are skipped with that reason in plan.json and the next runnable plan (tp=2) is chosen.
    ``parallel.cp_kind = 'ulysses'`` keeps the ring plans out the same way."""
    plan, info = _plan_of(4098)
    assert plan.cp == 1 and plan.tp == 2, plan.describe()
    assert info["skipped"] and all(s["why"] == "4098 tokens per sample do not divide by 2 * cp = 4 (zigzag split)"
                                   for s in info["skipped"]), info["skipped"]
    assert all("cp=2" in s["plan"] for s in info["skipped"])
    plan, info = _plan_of(4096, "parallel.cp_kind='ulysses'")
    # the faster ring cp plans are skipped; the pick is the next runnable one (tp=2 ranks a hair above ulysses
    # cp=2 since the ranking uses the unrounded step time)
    assert plan.cp == 1 or plan.cp_kind == "ulysses", plan.describe()
    assert info["skipped"] and all("parallel.cp_kind = 'ulysses'" in s["why"] for s in info["skipped"])


@pytest.mark.parametrize(("seq", "expected"), [(4096, "yes"), (4098, "zigzag split")])
def test_lf_plan_config_shows_whether_lf_run_can_run_each_plan(tmp_path, seq, expected):
    """``lf plan CONFIG --json`` gives each ranked plan an ``lf_run`` entry: ``yes`` or the trainer's reason (the
    same function the auto path uses); the cp plans of the 4,098-token config carry the zigzag reason."""
    cfg = tmp_path / "run.toml"
    from lf_orchestrator.config import to_toml

    cfg.write_text(to_toml(load_config(EXAMPLE, _sets(tmp_path / "corpus", seq))))
    out = CliRunner().invoke(app, ["plan", str(cfg), "--seq", str(seq), "--gpus", "2", "--json", "--top", "50"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["plans"]
    cp_rows = [r for r in rows if "cp=2" in r["plan"]]
    assert cp_rows and all(expected in r["lf_run"] for r in cp_rows), cp_rows
    assert any(r["lf_run"] == "yes" for r in rows)


@pytest.mark.parametrize(("spec", "device", "precision", "expected"), [
    ("dp=2,zero=3", "cuda", "bf16", "bf16"), ("dp=2,zero=2", "cuda", "bf16", "bf16"),
    ("dp=2,zero=1", "cuda", "bf16", "fp32"), ("dp=2,zero=3", "cpu", "bf16", "fp32"),
    ("dp=2,zero=3", "cuda", "fp16", "fp32"), ("dp=2,zero=3", "cuda", "fp32", "fp32")])
def test_fsdp_casts_parameters_for_bf16_on_cuda(spec, device, precision, expected):
    """Oracle: ``with_fsdp_compute``'s rule (ZeRO-2/3 on CUDA with bf16 compute: FSDP2 casts the parameters;
    everything else keeps fp32 parameters under autocast), through ``resolve_plan`` for a manual spec."""
    from lf_ir.recipes import llama3
    from lf_orchestrator.families._plan import resolve_plan
    from lf_orchestrator.families.recipes import recipe_config

    cfg = load_config(EXAMPLE, _sets(Path("/nonexistent"), 256, "parallel.plan='manual'", f"parallel.spec='{spec}'",
                                     "train.global_batch=2"))
    graph = llama3.build_graph(recipe_config("llama3", "tiny", dict(cfg.model.overrides))[0], 256)
    plan, _ = resolve_plan(cfg, graph, world_size=2, device_type=device, seq=256, precision=precision)
    assert plan.precision == expected, plan
