"""Fault handling of the recipe trainer (llm / vlm / video families): non-finite steps, SIGTERM / SIGINT, `lf run`.

The tiny llama3 example in one process on the CPU. Oracles: the weights before the poisoned step (a dropped update
leaves them bit-identical), the latest checkpoint's tensors read back (a stopped run must not have touched them),
the sampler arithmetic (samples consumed), the uninterrupted run's logged losses (a run preempted and resumed must
repeat them exactly), and the files and exit codes the handlers must leave.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lf_orchestrator.checkpoint import latest_checkpoint
from lf_orchestrator.cli import app
from lf_orchestrator.config import load_config
from lf_orchestrator.families._state import load_model_weights
from lf_orchestrator.faults import NonFiniteError, read_faults
from lf_orchestrator.train import Trainer
from lf_parallel import init_distributed

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama3_pretrain.toml"
CORPUS = ["corpus.max_chars=60000", "corpus.seq_len=64", "corpus.eval_fraction=0.1", "train.global_batch=8",
          "parallel.micro_batch=4", "train.warmup_steps=1", "train.log_every=1", "run.threads=1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _trainer(corpus_dir: Path, run_dir: Path, *extra: str, resume: bool = False) -> Trainer:
    cfg = load_config(EXAMPLE, [f"corpus.cache_dir='{corpus_dir}'", *CORPUS, "eval.at_end=false", *extra])
    return Trainer(cfg, run_dir, init_distributed("cpu"), resume=resume)


def _poison(trainer: Trainer, at_step: int, *, once: bool = False) -> None:
    """Make the training loss NaN whenever step ``at_step`` (1-based) runs (only its first attempt with ``once``)."""
    fired = []

    def hook(module, _args, out):
        hit = module.training and trainer.step == at_step - 1 and not (once and len(fired) >= trainer.plan.grad_accum)
        fired.extend([1] if hit else [])
        return (out[0] * float("nan"), out[1]) if hit else out

    trainer.loss_module.register_forward_hook(hook)


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in r}


def test_nonfinite_stop_raises_and_touches_neither_weights_nor_checkpoint(corpus_dir, tmp_path):
    """NaN at step 3 (checkpoint at 2): NonFiniteError names the step; the weights are step 2's bit for bit, and
    the latest checkpoint is still step 2's with the same tensors."""
    trainer = _trainer(corpus_dir, tmp_path, "train.steps=4", "train.ckpt_every=2", "train.on_nonfinite='stop'")
    _poison(trainer, 3)
    seen = {}
    with pytest.raises(NonFiniteError, match="step 3: non-finite loss"):
        trainer.fit(lambda step, _: seen.update({step: _weights(trainer)}))
    now = _weights(trainer)
    assert sorted(seen) == [1, 2] and all(torch.equal(seen[2][k], v) for k, v in now.items())
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "step-00000002"
    saved = load_model_weights(ckpt)
    assert saved.keys() == now.keys() and all(torch.equal(saved[k], v) for k, v in now.items())
    (event,) = read_faults(tmp_path)
    assert (event["step"], event["action"]) == (3, "stop") and "nan" in event["reason"]


def test_nonfinite_skip_leaves_weights_bit_identical_and_goes_on(corpus_dir, tmp_path):
    """NaN at step 2 with skip: weights after step 2 equal those after step 1 bit for bit, step 3 trains again;
    the LR schedule does not advance on the skipped step."""
    trainer = _trainer(corpus_dir, tmp_path, "train.steps=4", "train.ckpt_every=4", "train.on_nonfinite='skip'")
    _poison(trainer, 2)
    snaps = {}
    trainer.fit(lambda step, _: snaps.update({step: _weights(trainer)}))
    assert all(torch.equal(snaps[1][k], snaps[2][k]) for k in snaps[1])
    assert not all(torch.equal(snaps[2][k], snaps[3][k]) for k in snaps[2])
    rows = _rows(tmp_path)
    assert math.isnan(rows[2]["train/loss"]) and rows[2]["train/nonfinite_skipped"] == 1
    assert all(math.isfinite(rows[s]["train/loss"]) for s in (1, 3, 4))
    assert rows[3]["train/lr"] == rows[2]["train/lr"]
    assert [e["action"] for e in read_faults(tmp_path)] == ["skip"]


def test_nonfinite_rollback_reloads_the_checkpoint_without_replaying(corpus_dir, tmp_path):
    """A transient NaN at step 5 (checkpoints every 2): back to step 4's state, the data position kept (one extra
    step of samples consumed), every logged loss finite, the run ends at train.steps."""
    trainer = _trainer(corpus_dir, tmp_path, "train.steps=6", "train.ckpt_every=2", "train.on_nonfinite='rollback'")
    _poison(trainer, 5, once=True)
    trainer.fit()
    assert trainer.step == 6
    (event,) = read_faults(tmp_path)
    assert (event["step"], event["action"]) == (5, "rollback")
    rows = _rows(tmp_path)
    assert sorted(rows) == list(range(1, 7)) and all(math.isfinite(r["train/loss"]) for r in rows.values())
    consumed = trainer.sampler.state_dict()
    expected = trainer.sampler.state_for(trainer.plan.micro_batch * trainer.plan.grad_accum * 7)
    assert (consumed["epoch"], consumed["offset"]) == (expected["epoch"], expected["offset"])


def test_step_zero_checkpoint_leaves_the_run_unchanged(corpus_dir, tmp_path):
    """``on_nonfinite = "rollback"`` saves step 0 before training, and DCP fills the empty AdamW state with a
    zero-LR step to save it (its step counter becomes 1, which changes every later bias correction). Oracle: the
    same run under ``stop`` (no step-0 save), bit for bit; the step-0 folder loads back an empty optimizer."""
    losses = {}
    for policy in ("stop", "rollback"):
        _trainer(corpus_dir, tmp_path / policy, "train.steps=3", "train.ckpt_every=10",
                 f"train.on_nonfinite='{policy}'").fit()
        losses[policy] = {step: row["train/loss"] for step, row in _rows(tmp_path / policy).items()}
    assert losses["stop"] == losses["rollback"] and sorted(losses["stop"]) == [1, 2, 3]
    step0 = tmp_path / "rollback" / "checkpoints" / "step-00000000"
    assert step0.is_dir()
    fresh = _trainer(corpus_dir, tmp_path / "fresh")
    fresh._restore(step0)
    assert fresh.step == 0 and not fresh.optimizer.state


def test_nonfinite_weights_are_never_checkpointed(corpus_dir, tmp_path):
    """A NaN parameter: save() raises naming it and writes nothing."""
    trainer = _trainer(corpus_dir, tmp_path, "train.steps=2")
    with torch.no_grad():
        next(trainer.model.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(NonFiniteError, match="holds NaN or inf"):
        trainer.save()
    assert latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_the_current_step_and_resume_continues(corpus_dir, tmp_path, signum, code):
    """The signal during step 3 (checkpoints every 4): step 3 is saved, fit stops (preempted, exit code 128 +
    signal), the handlers are restored; the resumed run logs steps 4..5 exactly as the uninterrupted run."""
    full = _trainer(corpus_dir, tmp_path / "full", "train.steps=5", "train.ckpt_every=4")
    full.fit()

    part = _trainer(corpus_dir, tmp_path / "part", "train.steps=5", "train.ckpt_every=4")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    summary = part.fit(lambda step, _: os.kill(os.getpid(), signum) if step == 3 else None)
    assert summary["preempted"] and summary["steps"] == 3
    assert (summary["signal"], summary["exit_code"]) == (signal.Signals(signum).name, code)
    assert {s: signal.getsignal(s) for s in before} == before
    assert latest_checkpoint(tmp_path / "part").name == "step-00000003"

    resumed = _trainer(corpus_dir, tmp_path / "part", "train.steps=5", "train.ckpt_every=4", resume=True)
    assert resumed.step == 3
    assert not resumed.fit()["preempted"] and resumed.step == 5
    want, got = _rows(tmp_path / "full"), _rows(tmp_path / "part")
    assert [got[s]["train/loss"] for s in range(1, 6)] == [want[s]["train/loss"] for s in range(1, 6)]


def test_hang_watchdog_dumps_the_stacks(corpus_dir, tmp_path):
    """train.hang_timeout_s = 0.3 with on_hang = "dump" and a step boundary that stalls 1.5 s: the watchdog writes
    hang-rank0.txt naming the last finished step and holding this test's stack; the run still finishes."""
    trainer = _trainer(corpus_dir, tmp_path, "train.steps=2", "train.ckpt_every=2", "train.hang_timeout_s=0.3",
                       "train.on_hang='dump'")
    trainer.fit(lambda step, _: time.sleep(1.5) if step == 1 else None)
    text = (tmp_path / "hang-rank0.txt").read_text()
    assert trainer.step == 2 and "last finished step 1" in text and "test_hang_watchdog_dumps_the_stacks" in text


def test_lf_run_with_a_diverging_lr_stops_and_keeps_the_good_checkpoint(corpus_dir, tmp_path):
    """The reported case: lr 1e30 without clipping, a checkpoint every step. `lf run` fails (NonFiniteError, not
    exit 0), and every checkpoint left holds finite weights only."""
    args = ["run", str(EXAMPLE), "--run-dir", str(tmp_path / "run"), "--set", "train.lr=1e30", "--set",
            "train.grad_clip=0.0", "--set", "train.steps=6", "--set", "train.ckpt_every=1", "--set",
            "run.device='cpu'", "--set", f"corpus.cache_dir='{corpus_dir}'", "--set", "eval.at_end=false"]
    for item in CORPUS:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and isinstance(result.exception, NonFiniteError), result.output
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None
    assert all(bool(torch.isfinite(v).all()) for v in load_model_weights(ckpt).values())
    assert read_faults(tmp_path / "run")[-1]["action"] == "stop"


def test_ctrl_c_to_lf_run_saves_prints_the_resume_command_and_exits_130(corpus_dir, tmp_path):
    """SIGINT to a real `lf run` process of the llama3 example (checkpoints every 500 of 1000 steps) after its
    third logged step: exit code 130, the resume command on stderr, and a complete checkpoint of the step it
    stopped at (the last logged one)."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "lf_orchestrator", "run", str(EXAMPLE), "--run-dir", str(run_dir), "--set",
           "train.steps=1000", "--set", "train.ckpt_every=500", "--set", "run.device='cpu'", "--set",
           f"corpus.cache_dir='{corpus_dir}'"]
    for item in CORPUS:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 600
    while time.time() < deadline and proc.poll() is None and not (
            metrics.is_file() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-2000:]
    assert f"lfrun--resume{run_dir}" in "".join(err.split()) and "SIGINT" in err  # rich may wrap the line
    last = max(_rows(run_dir))
    assert latest_checkpoint(run_dir).name == f"step-{last:08d}" and 3 <= last < 1000


TERM_RANK1 = """
import os, signal, sys
from lf_orchestrator.train import Trainer
from lf_orchestrator.cli import app

_step = Trainer.train_step

def _train_step(self):  # rank 1 alone is preempted during step 2
    out = _step(self)
    if self.step == 2 and self.ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return out

Trainer.train_step = _train_step
sys.argv[0] = "lf"
app()
"""


def test_sigterm_on_one_rank_stops_every_rank_after_one_save(corpus_dir, tmp_path):
    """2-process gloo job (dp=2), SIGTERM to rank 1 only during step 2 of 50: the ranks agree at the step boundary,
    both write step 2's shards (one complete checkpoint), both exit 143 instead of hanging, and rank 0 prints the
    resume command. Oracle: the checkpoint marker and the exit codes torchrun reports."""
    wrapper, run_dir = tmp_path / "wrapper.py", tmp_path / "run"
    wrapper.write_text(TERM_RANK1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sets = [f"corpus.cache_dir='{corpus_dir}'", *CORPUS, "train.steps=50", "train.ckpt_every=25",
            "run.device='cpu'", "eval.at_end=false", "parallel.plan='manual'", "parallel.spec='dp=2'"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           str(wrapper), "run", str(EXAMPLE), "--run-dir", str(run_dir), *[a for x in sets for a in ("--set", x)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = "".join((done.stdout + done.stderr).split())
    assert done.returncode != 0 and "exitcode:143" in out, done.stderr[-3000:]
    assert f"SIGTERM:savedstep2andstopped;continuewith`lfrun--resume{run_dir}`" in out
    assert latest_checkpoint(run_dir).name == "step-00000002" and max(_rows(run_dir)) == 2
