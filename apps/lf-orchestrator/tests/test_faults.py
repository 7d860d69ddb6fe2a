"""Fault policies of the trainer: non-finite steps (stop / skip / rollback), SIGTERM save-and-exit, the
hang watchdog, and SIGKILL during a checkpoint save.

Oracles: the weights before the poisoned step (a dropped update must leave them bit-identical), the
checkpoint's tensors (rollback restores them exactly), the sampler arithmetic (samples consumed), the
files the handlers must write (read back), and a run killed mid-save (the previous checkpoint loads).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from lf_orchestrator.config import load_config
from lf_orchestrator.faults import NonFiniteError, read_faults


def _trainer(tiny_config, tmp_path, *extra):
    from lf_orchestrator.train import Trainer
    from lf_parallel import init_distributed

    cfg = load_config(tiny_config, ["eval.at_end=false", "train.warmup_steps=1", *extra])
    return Trainer(cfg, tmp_path, init_distributed("cpu"))


def _poison(trainer, at_step: int, *, once: bool = False) -> None:
    """Make the loss NaN whenever step ``at_step`` (1-based) runs (only the first time with ``once``)."""
    real = trainer.model.training_loss
    fired = []

    def poisoned(batch):
        loss, metrics = real(batch)
        hit = trainer.step == at_step - 1 and not (once and len(fired) >= trainer.plan.grad_accum)
        fired.extend([1] if hit else [])
        return (loss * float("nan") if hit else loss), metrics

    trainer.model.training_loss = poisoned


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _rows(run_dir):
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_nonfinite_stop_raises_before_the_update(tiny_config, tmp_path):
    trainer = _trainer(tiny_config, tmp_path, "train.steps=4", "train.on_nonfinite='stop'")
    _poison(trainer, 2)
    seen = {}
    with pytest.raises(NonFiniteError, match="step 2: non-finite loss"):
        trainer.fit(lambda step, _: seen.update(w=_weights(trainer)))
    assert all(torch.equal(seen["w"][k], v) for k, v in _weights(trainer).items())
    (event,) = read_faults(tmp_path)
    assert (event["step"], event["action"]) == (2, "stop") and "nan" in event["reason"]


def test_nonfinite_skip_drops_the_update_and_goes_on(tiny_config, tmp_path):
    trainer = _trainer(tiny_config, tmp_path, "train.steps=4", "train.on_nonfinite='skip'")
    _poison(trainer, 2)
    snaps = {}
    trainer.fit(lambda step, _: snaps.update({step: _weights(trainer)}))
    assert all(torch.equal(snaps[1][k], snaps[2][k]) for k in snaps[1])  # the NaN step changed nothing
    assert not all(torch.equal(snaps[2][k], snaps[3][k]) for k in snaps[2])  # later steps train
    rows = _rows(tmp_path)
    assert math.isnan(rows[2]["train/loss"]) and rows[2]["train/nonfinite_skipped"] == 1
    assert all(math.isfinite(rows[s]["train/loss"]) for s in (1, 3, 4))
    assert rows[3]["train/lr"] == rows[2]["train/lr"]  # the schedule counts applied updates only
    assert [e["action"] for e in read_faults(tmp_path)] == ["skip"]


def test_nonfinite_rollback_restores_the_checkpoint_and_skips_the_bad_batches(tiny_config, tmp_path):
    """NaN at step 5 with checkpoints every 2 steps: back to step 4's weights, optimizer and schedule; the
    data position is kept, so the run consumes 1 extra step of samples and ends at train.steps."""
    trainer = _trainer(tiny_config, tmp_path, "train.steps=6", "train.ckpt_every=2",
                       "train.on_nonfinite='rollback'")
    _poison(trainer, 5, once=True)  # a transient blow-up
    trainer.fit()
    assert trainer.step == 6
    (event,) = read_faults(tmp_path)
    assert (event["step"], event["action"]) == (5, "rollback")
    rows = _rows(tmp_path)
    assert sorted(rows) == list(range(1, 7)) and all(math.isfinite(r["train/loss"]) for r in rows.values())
    per_step = trainer.plan.micro_batch * trainer.plan.grad_accum
    consumed = trainer.sampler.state_dict()
    expected = trainer.sampler.state_for(per_step * 7)  # 6 steps + the rolled-back one
    assert (consumed["epoch"], consumed["offset"]) == (expected["epoch"], expected["offset"])


def test_rollback_restores_checkpoint_weights_exactly(tiny_config, tmp_path):
    from lf_orchestrator.checkpoint import load_weights
    from lf_orchestrator.faults import RolledBack

    trainer = _trainer(tiny_config, tmp_path, "train.steps=3", "train.ckpt_every=2", "train.on_nonfinite='rollback'")
    trainer.fit()  # checkpoints at 2 and 3; now poison step 4
    trainer.cfg = load_config(tiny_config, ["eval.at_end=false", "train.warmup_steps=1", "train.steps=5",
                                            "train.ckpt_every=2", "train.on_nonfinite='rollback'"])
    _poison(trainer, 4)
    with pytest.raises(RolledBack, match="step-00000003"):
        trainer.train_step()
    saved = load_weights(tmp_path / "checkpoints" / "step-00000003")
    state = torch.load(tmp_path / "checkpoints" / "step-00000003" / "train_state.pt", weights_only=True)
    assert trainer.step == 3 == state["step"]
    assert all(torch.equal(saved[k], v) for k, v in trainer.model.state_dict().items())


def test_sigterm_saves_the_current_step_and_stops(tiny_config, tmp_path):
    """SIGTERM at step 4 (checkpoints every 3): the handler saves step 4, fit returns preempted, and a
    resumed run continues from step 4. Oracle: the checkpoint pointer and the resumed trainer's step."""
    from lf_orchestrator.train import Trainer
    from lf_parallel import init_distributed

    trainer = _trainer(tiny_config, tmp_path)

    def term_at_4(step, _):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    summary = trainer.fit(term_at_4)
    assert summary["preempted"] and summary["steps"] == 4
    assert signal.getsignal(signal.SIGTERM) == before  # handler removed again
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000004"
    resumed = Trainer(trainer.cfg, tmp_path, init_distributed("cpu"), resume=True)
    assert resumed.step == 4
    assert not resumed.fit()["preempted"] and resumed.step == 6


def test_sigterm_to_lf_run_exits_143_after_saving(tiny_config, tmp_path):
    env = dict(os.environ, MUJOCO_GL="osmesa")
    run_dir = tmp_path / "term"
    proc = subprocess.Popen([sys.executable, "-m", "lf_orchestrator", "run", str(tiny_config), "--run-dir",
                             str(run_dir), "--set", "train.steps=1000", "--set", "train.ckpt_every=500",
                             "--set", "eval.at_end=false"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and not ((run_dir / "metrics.jsonl").is_file()
                                          and (run_dir / "metrics.jsonl").read_text().count("\n") >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-2000:]
    last = max(json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step-{last:08d}"


def test_watchdog_dumps_all_stacks_once_per_hang(tmp_path):
    """Oracle: the dump file read back: the stalled frame's name, one dump per hang, a new one after progress."""
    from lf_orchestrator.watchdog import Watchdog

    def stalled_here(seconds):
        time.sleep(seconds)

    dog = Watchdog(0.3, tmp_path / "hang.txt", abort=False, describe=lambda: "step 9").start()
    try:
        stalled_here(1.5)  # 5 timeouts long: still one hang
        assert dog.fired == 1
        dog.beat()
        stalled_here(0.9)
        assert dog.fired == 2
    finally:
        dog.stop()
    text = (tmp_path / "hang.txt").read_text()
    assert text.count("lf watchdog: no progress") == 2 and "step 9" in text
    assert text.count("in stalled_here") == 2


def test_trainer_arms_the_watchdog(tiny_config, tmp_path):
    """train.hang_timeout_s wires the watchdog into fit: a stalled step leaves hang-rank0.txt."""
    trainer = _trainer(tiny_config, tmp_path, "train.steps=3", "train.hang_timeout_s=1", "train.on_hang='dump'")

    def stall_in_step_2(step, _):
        if step == 2:
            time.sleep(2.5)

    trainer.fit(stall_in_step_2)
    text = (tmp_path / "hang-rank0.txt").read_text()
    assert "lf watchdog: no progress" in text and "last finished step" in text and "in fit" in text


def test_watchdog_abort_exits_with_its_code(tmp_path):
    from lf_orchestrator.watchdog import HANG_EXIT_CODE

    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from lf_orchestrator.watchdog import Watchdog
        Watchdog(0.3, Path({str(tmp_path / 'hang.txt')!r}), describe=lambda: "step 7").start()
        time.sleep(30)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == HANG_EXIT_CODE, res.stderr
    text = (tmp_path / "hang.txt").read_text()
    assert "step 7" in text and "time.sleep" not in text and "<string>" in text


def test_sigkill_during_checkpoint_save_keeps_the_previous_one(tmp_path):
    """The process dies (SIGKILL) after writing step 2's DCP shards but before its marker: step 1 stays the
    loadable latest and the half-written folder is never taken. Oracle: step 1's saved tensors."""
    code = textwrap.dedent(f"""
        import os, signal, torch
        from pathlib import Path
        import lf_parallel._checkpoint as ck
        from lf_orchestrator.families._state import FamilyCheckpointer
        run = Path({str(tmp_path)!r})
        loss = torch.nn.Module()
        loss.model = torch.nn.Linear(4, 1, bias=False)
        saver = FamilyCheckpointer(run, distributed=False, keep=2)
        with torch.no_grad():
            loss.model.weight.copy_(torch.arange(4.0))
        saver.save(1, loss, None, {{"step": 1}}, "dp=1")
        ck._commit = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        with torch.no_grad():
            loss.model.weight.zero_()
        saver.save(2, loss, None, {{"step": 2}}, "dp=1")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    from lf_orchestrator.checkpoint import latest_checkpoint, load_weights

    assert (tmp_path / "checkpoints" / "step-00000002.tmp").is_dir()
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-00000001"
    assert torch.equal(load_weights(latest)["weight"], torch.arange(4.0).reshape(1, 4))


def test_rollback_gives_up_on_a_persistent_blow_up(tiny_config, tmp_path):
    from lf_orchestrator.faults import MAX_ROLLBACKS

    trainer = _trainer(tiny_config, tmp_path, "train.steps=4", "train.ckpt_every=2", "train.on_nonfinite='rollback'")
    _poison(trainer, 3)  # every time step 3 runs
    with pytest.raises(NonFiniteError, match=f"rolled back to .*step-00000002 {MAX_ROLLBACKS} times"):
        trainer.fit()
    assert [e["action"] for e in read_faults(tmp_path)] == ["rollback"] * (MAX_ROLLBACKS + 1)
