"""Sharded DCP checkpoints of the recipe trainer: exact resume under DP, ZeRO-3 and TP+SP, resharding, SIGKILL.

2-process gloo jobs (torchrun) of the tiny llama3 example in float32 on the CPU, 5 steps with a checkpoint after
every step. Oracles: the uninterrupted run of the same plan (a resumed run logs its losses bit for bit: same
batches, same updates, same schedule, deterministic gloo reductions), and the uninterrupted ZeRO-3 run for a
ZeRO-3 checkpoint resumed under tp=2 (same global batch, reductions in another order: 1e-6 relative). A "stopped"
run is a copy of the uninterrupted run's folder without the checkpoints after step 3 (all a stopped process
leaves), except in the SIGKILL test, where the process group really is killed while it saves step 4.
(TP + SP here; the issue's TP+PP resume, bit for bit, and a pp checkpoint resumed under dp are in
``test_family_pipeline.py``.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lf_orchestrator.checkpoint import latest_checkpoint
from lf_orchestrator.families._state import load_model_weights, reshard_sampler

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"
STEPS, STOP = 5, 3
WRAPPER = """
import os, sys, time
from pathlib import Path
import lf_parallel._checkpoint as ck

_commit = ck._commit

def _slow_commit(tmp, dst, extra, files):  # shards written, marker not yet: signal the test, then stall
    if dst.name == os.environ.get("LF_TEST_STALL_COMMIT"):
        Path(os.environ["LF_TEST_SIGNAL"]).write_text(str(tmp))
        time.sleep(600)
    _commit(tmp, dst, extra, files)

ck._commit = _slow_commit
from lf_orchestrator.cli import app
sys.argv[0] = "lf"
app()
"""


def test_sampler_position_reshards_over_dp():
    """Oracle: the uninterrupted dp=2 sampler stream. After 3 micro-batches of 4 per rank, the dp=1 sampler
    restored from both ranks' positions yields the next 8 samples the two dp=2 ranks would have (as a set:
    one global micro-batch), and a same-size restore is the rank's own position."""
    from lf_data import ResumableSampler

    ranks = [ResumableSampler(40, batch_size=4, seed=3, rank=r, world_size=2) for r in range(2)]
    its = [iter(s) for s in ranks]
    for it in its:
        [next(it) for _ in range(12)]
    states = [s.state_dict() for s in ranks]
    assert reshard_sampler(states, 1, 2) == (states[1], None)
    state, note = reshard_sampler(states, 0, 1)
    one = ResumableSampler(40, batch_size=8, seed=3)
    one.load_state_dict(state)
    it1 = iter(one)
    assert note is None and sorted(next(it1) for _ in range(8)) == sorted(next(it) for it in its for _ in range(4))
    assert reshard_sampler(states, 0, 5)[1] == ("the data position (24 samples into epoch 0) does not split "
                                                "over dp=5; each rank continues at 4")


def test_async_checkpoints_keep_last_k_and_load_back(tmp_path):
    """One process, ``train.async_checkpoint`` and keep 2: after saves of steps 1-3 only steps 2 and 3 remain,
    ``latest`` names step 3, a stale ``.tmp`` of an older step is gone; step 3 loads back bit for bit
    (oracle: the saved tensors) and its weights read without a process group carry the recipe names."""
    import torch
    from torch import nn

    from lf_orchestrator.families._state import FamilyCheckpointer

    def make():
        wrapper = nn.Module()
        wrapper.model = nn.Linear(3, 2)
        return wrapper, torch.optim.AdamW(wrapper.parameters(), lr=0.1)

    (tmp_path / "checkpoints" / "step-00000001.tmp").mkdir(parents=True)
    ckpt = FamilyCheckpointer(tmp_path, distributed=False, keep=2, async_save=True)
    module, opt = make()
    for step in (1, 2, 3):
        module.model(torch.randn(4, 3)).sum().backward()
        opt.step()
        ckpt.save(step, module, opt, {"step": step, "rng": [torch.get_rng_state()]}, plan="dp=1")
    ckpt.close()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000003"]
    assert (root / "latest").read_text() == "step-00000003" and latest_checkpoint(tmp_path) == root / "step-00000003"
    fresh, fresh_opt = make()
    state, extra = ckpt.load(root / "step-00000003", fresh, fresh_opt)
    assert state["step"] == 3 and extra == {"step": 3, "plan": "dp=1", "world_size": 1}
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), fresh.parameters(), strict=True))
    assert torch.equal(fresh_opt.state[fresh.model.weight]["exp_avg"], opt.state[module.model.weight]["exp_avg"])
    weights = load_model_weights(root / "step-00000003")
    assert sorted(weights) == ["bias", "weight"] and torch.equal(weights["weight"], module.model.weight.detach())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmd(tmp: Path, corpus: Path, run_dir: Path, spec: str, *extra: str) -> list[str]:
    wrapper = tmp / "lf_wrapper.py"
    if not wrapper.exists():
        wrapper.write_text(WRAPPER)
    sets = [f"corpus.cache_dir='{corpus}'", "corpus.max_chars=60000", "corpus.seq_len=64", f"train.steps={STEPS}",
            "train.warmup_steps=2", "train.global_batch=8", "train.ckpt_every=1", "train.keep_checkpoints=3",
            "parallel.plan='manual'", f"parallel.spec='{spec}'", "run.threads=1", "run.device='cpu'",
            "train.log_every=1", "eval.at_end=false", *extra]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(_free_port()), str(wrapper), "run", str(EXAMPLE), "--run-dir", str(run_dir),
            *[a for s in sets for a in ("--set", s)]]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _run(tmp: Path, corpus: Path, run_dir: Path, spec: str, *extra: str) -> str:
    done = subprocess.run(_cmd(tmp, corpus, run_dir, spec, *extra), capture_output=True, text=True, timeout=300,
                          env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return " ".join((done.stdout + done.stderr).split())  # rich wraps lines at the terminal width


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _stopped_copy(run_dir: Path, dst: Path) -> Path:
    """``run_dir`` as a run stopped after the step-``STOP`` checkpoint leaves it (later checkpoints removed)."""
    shutil.copytree(run_dir, dst)
    for later in range(STOP + 1, STEPS + 1):
        shutil.rmtree(dst / "checkpoints" / f"step-{later:08d}")
    (dst / "checkpoints" / "latest").write_text(f"step-{STOP:08d}")
    return dst


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(tmp folder, corpus cache, uninterrupted runs by spec) shared by the tests of this module."""
    tmp = tmp_path_factory.mktemp("family_resume")
    return tmp, tmp / "corpus", {}


def _full(job, spec: str, *extra: str) -> Path:
    tmp, corpus, runs = job
    if spec not in runs:
        run_dir = tmp / ("full_" + spec.replace(",", "_").replace("=", ""))
        _run(tmp, corpus, run_dir, spec, *extra)
        runs[spec] = run_dir
    return runs[spec]


@pytest.mark.parametrize("spec", ["dp=2,zero=3", "tp=2,sp=1", "dp=2,zero=1"])
def test_resume_is_bitwise_exact(job, spec):
    """A run stopped after step 3 and resumed under the same plan logs the uninterrupted run's losses of steps
    4 and 5 bit for bit. The ZeRO-3 runs write their checkpoints asynchronously (train.async_checkpoint)."""
    extra = ("train.async_checkpoint=true",) if "zero" in spec else ()
    full = _full(job, spec, *extra)
    assert sorted(p.name for p in (full / "checkpoints").glob("step-*")) == [f"step-{s:08d}" for s in (3, 4, 5)]
    assert (full / "checkpoints" / "latest").read_text() == f"step-{STEPS:08d}"
    tmp, corpus, _ = job
    part = _stopped_copy(full, tmp / ("part_" + full.name))
    out = _run(tmp, corpus, part, spec)
    assert f"resumed from step {STOP}" in out and "resharding" not in out, out[-2000:]
    ref, got = _losses(full), _losses(part)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in range(STOP + 1, STEPS + 1)] == [ref[s] for s in range(STOP + 1, STEPS + 1)]


def test_zero3_checkpoint_resumes_under_tp(job):
    """The step-3 checkpoint of the dp=2 ZeRO-3 run, resumed under tp=2 + SP: DCP reshards (and the log says
    so); the next losses equal the uninterrupted ZeRO-3 run's within 1e-6 relative (same global batches)."""
    full = _full(job, "dp=2,zero=3", "train.async_checkpoint=true")
    tmp, corpus, _ = job
    part = _stopped_copy(full, tmp / "zero3_to_tp2")
    out = _run(tmp, corpus, part, "tp=2,sp=1")
    assert "resharding it (DCP) to plan 'dp=1 tp=2 sp=true" in out, out[-2000:]
    ref, got = _losses(full), _losses(part)
    for step in range(STOP + 1, STEPS + 1):
        assert abs(got[step] - ref[step]) <= 1e-6 * abs(ref[step]), (step, got, ref)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc/*/stat``'s parent ids)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants, as a scheduler ending the job does."""
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def test_sigkill_during_save_keeps_previous_checkpoint(job):
    """SIGKILL of the whole job (torchrun and both ranks) while the step-4 save stalls between its shards and
    its marker: step 3 stays ``latest`` and complete, step 4 is only a ``.tmp`` folder that is never loaded; the
    run resumes from step 3 (``lf run --resume``) and logs the uninterrupted dp=2 run's losses bit for bit."""
    full = _full(job, "dp=2")
    tmp, corpus, _ = job
    run_dir, signal_file = tmp / "killed", tmp / "stalled"
    proc = subprocess.Popen(_cmd(tmp, corpus, run_dir, "dp=2"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=_env(LF_TEST_STALL_COMMIT="step-00000004", LF_TEST_SIGNAL=str(signal_file)))
    try:
        deadline = time.time() + 240
        while not signal_file.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert signal_file.exists(), f"the step-4 save never stalled (exit code {proc.poll()})"
    finally:
        _kill_tree(proc.pid)  # torchrun starts its ranks in their own sessions: kill each descendant
        proc.wait(timeout=60)
    ckpts = run_dir / "checkpoints"
    tmp4 = Path(signal_file.read_text())
    assert tmp4 == ckpts / "step-00000004.tmp" and (tmp4 / ".metadata").is_file()  # shards were written
    assert not (ckpts / "step-00000004").exists()
    assert (ckpts / "latest").read_text() == "step-00000003"
    assert latest_checkpoint(run_dir) == ckpts / "step-00000003"
    weights = load_model_weights(ckpts / "step-00000003")
    assert weights and all(k.startswith("components.") for k in weights)
    done = subprocess.run([*_cmd(tmp, corpus, run_dir, "dp=2")[:8], "run", "--resume", str(run_dir)],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "resumed from step 3" in done.stdout + done.stderr
    assert not tmp4.exists() and (ckpts / "latest").read_text() == f"step-{STEPS:08d}"
    ref, got = _losses(full), _losses(run_dir)
    assert [got[s] for s in range(1, STEPS + 1)] == [ref[s] for s in range(1, STEPS + 1)]
