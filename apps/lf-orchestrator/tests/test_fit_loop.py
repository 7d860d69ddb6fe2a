"""The fit loop of the trainer (:func:`lf_orchestrator.train.fit.fit_loop`) on a scripted trainer without a model.

Oracle: the contract the VLA and recipe trainers' own loops had before they were merged (their docstrings and
`lf run`'s exit codes): log lines every ``log_every`` steps and at the last, with the window's throughput; a
checkpoint every ``ckpt_every`` steps and at the last; SIGTERM / SIGINT save the step, skip the evaluation and
report 143 / 130; ``rollback`` saves step 0 first and restarts the logs at the checkpoint's step. The expected
step lists are written out by hand.
"""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch

from lf_orchestrator.faults import RolledBack
from lf_orchestrator.metrics import read_metrics
from lf_orchestrator.train.fit import fit_loop, lr_factor


class _Checkpointer:
    def __init__(self):
        self.closed = self.waited = 0

    def close(self):
        self.closed += 1

    def wait(self):
        self.waited += 1


class _Trainer:
    """``train_step`` returns fixed scalars (``rollback_at``: the first call at that step raises RolledBack after
    going back to step 0, as ``nonfinite_step`` does); ``save`` records the step."""

    def __init__(self, run_dir, *, steps, log_every=1, ckpt_every=100, on_nonfinite="skip", rollback_at=None):
        self.cfg = SimpleNamespace(train=SimpleNamespace(
            steps=steps, global_batch=2, log_every=log_every, ckpt_every=ckpt_every, hang_timeout_s=0.0,
            on_hang="abort", on_nonfinite=on_nonfinite, profile_steps=[]))
        self.ctx = SimpleNamespace(is_main=True, distributed=False, rank=0, device=torch.device("cpu"))
        self.run_dir, self.step, self.saved = run_dir, 0, []
        self.checkpointer = _Checkpointer()
        self.rollback_at = rollback_at

    def train_step(self):
        if self.step == self.rollback_at:
            self.rollback_at, self.step = None, 0
            raise RolledBack("step-00000000")
        self.step += 1
        return {"train/loss": 1.0 / self.step, "train/target_units": 10.0}

    def save(self):
        self.saved.append(self.step)


def _fit(trainer, on_step=None, evaluated=None):
    def evaluate():
        evaluated.append(trainer.step)
        return {"eval/loss": 0.5}

    return fit_loop(trainer, on_step, step_units=lambda s: s["train/target_units"], rate_key="perf/units_per_s",
                    loss_label="loss", evaluate=None if evaluated is None else evaluate, summary={"plan": "dp=1"})


def test_log_window_checkpoint_cadence_eval_and_summary(tmp_path):
    """7 steps, logs every 3, checkpoints every 4: logs at 3, 6, 7 (with units/s), saves at 4 and 7, the
    evaluation after the last save is logged at step 7; the summary's fields in the recipe trainer's order."""
    trainer, evaluated = _Trainer(tmp_path, steps=7, log_every=3, ckpt_every=4), []
    seen = []
    summary = _fit(trainer, lambda step, s: seen.append(step), evaluated)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [3, 6, 7, 7]
    assert all(r["perf/units_per_s"] > 0 and r["train/target_units"] == 10.0 for r in records[:3])
    assert records[3] == {"step": 7, "eval/loss": 0.5}
    assert trainer.saved == [4, 7] and evaluated == [7] and seen == list(range(1, 8))
    assert (tmp_path / "loss_curve.png").is_file()
    assert (trainer.checkpointer.closed, trainer.checkpointer.waited) == (1, 1)
    assert list(summary) == ["steps", "resumed_from", "seconds", "final", "eval", "plan", "preempted"]
    assert summary["steps"] == 7 and summary["resumed_from"] == 0 and summary["eval"] == {"eval/loss": 0.5}
    assert summary["final"]["train/loss"] == 1 / 7 and summary["plan"] == "dp=1" and not summary["preempted"]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_the_step_and_stops_without_eval(tmp_path, signum, code):
    """A signal during step 2 (checkpoints every 5): step 2 is saved, the loop stops, no evaluation; the summary
    names the signal and `lf run`'s exit code; the previous handlers are back."""
    trainer, evaluated = _Trainer(tmp_path, steps=10, ckpt_every=5), []
    before = signal.getsignal(signum)
    summary = _fit(trainer, lambda step, _: os.kill(os.getpid(), signum) if step == 2 else None, evaluated)
    assert trainer.saved == [2] and evaluated == [] and trainer.step == 2
    assert summary["preempted"] and summary["signal"] == signal.Signals(signum).name
    assert summary["exit_code"] == code and summary["eval"] == {}
    assert signal.getsignal(signum) == before


def test_rollback_saves_step_zero_and_restarts_the_logs(tmp_path):
    """``rollback`` without a checkpoint saves step 0 first; a rollback to step 0 during step 3 drops the logged
    steps 1-2 and the run logs 1..4 again; without ``evaluate`` the summary has no ``eval``."""
    trainer = _Trainer(tmp_path, steps=4, on_nonfinite="rollback", rollback_at=2)
    summary = fit_loop(trainer, step_units=lambda s: 1.0, rate_key="perf/tokens_per_s", loss_label="loss")
    assert trainer.saved == [0, 4]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert "perf/tokens_per_s" in read_metrics(tmp_path)[0]
    assert list(summary) == ["steps", "resumed_from", "seconds", "final", "preempted"]


def test_lr_factor_warmup_then_cosine():
    """Closed forms: (step + 1) / warmup during warm-up, 1 at its end, the midpoint of the cosine halfway, and
    ``min_ratio`` from ``total`` on."""
    kw = {"warmup": 4, "total": 14, "min_ratio": 0.1}
    assert [lr_factor(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, **kw) == 1.0
    assert lr_factor(9, **kw) == pytest.approx(0.55)
    assert lr_factor(14, **kw) == pytest.approx(0.1) and lr_factor(20, **kw) == pytest.approx(0.1)


def test_trained_phrase_names_the_resumed_steps():
    """Oracle: the phrase names exactly the steps the timed process ran."""
    from lf_orchestrator.train.fit import trained_phrase

    assert trained_phrase({"steps": 1500, "resumed_from": 0, "seconds": 567.6}) == "trained 1500 steps in 568 s"
    assert trained_phrase({"steps": 1500, "resumed_from": 500, "seconds": 412.2}) == (
        "trained steps 501-1500 in 412 s (resumed from step 500)")


def test_resumed_phrase_says_nothing_to_train_past_train_steps():
    """Oracle: the checkpoint step vs. train.steps: below it the usual line; at or past it one line saying
    nothing is left to train (never "resumed from step 75 of 12")."""
    from lf_orchestrator.train.fit import resumed_phrase

    assert resumed_phrase(5, 12) == "resumed from step 5 of 12"
    assert resumed_phrase(75, 12) == ("the checkpoint is at step 75, past train.steps = 12: nothing to train; "
                                      "raise train.steps with --set to continue")
    assert resumed_phrase(12, 12).startswith("the checkpoint is at step 12 = train.steps: the run is already "
                                             "finished") and "of 12" not in resumed_phrase(12, 12)


def test_too_few_samples_for_a_micro_batch_names_the_fields():
    """Oracle: the sampler's rule (each dp rank needs one full micro-batch): 15 samples, 2 ranks x 8 is refused
    naming train.global_batch and the data selection; 16 samples pass."""
    from lf_orchestrator.config import ConfigError
    from lf_orchestrator.train.fit import check_enough_samples

    plan = SimpleNamespace(dp=2, micro_batch=8)
    cfg = SimpleNamespace(train=SimpleNamespace(global_batch=16))
    with pytest.raises(ConfigError, match=r"train.global_batch = 16 takes micro-batches of 8 sample\(s\) on each of 2 "
                                          r"data-parallel rank\(s\), but the data gives 15 training sample\(s\)"):
        check_enough_samples(15, plan, cfg)
    check_enough_samples(16, plan, cfg)
