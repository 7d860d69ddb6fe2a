"""``data.prefetch``: the next step's batches collated on a background thread (lf_orchestrator.prefetch).

Oracles: the same sampler drawn step by step on the calling thread (the batches, their order and the data
position must not change), and whole `lf run`s with ``data.prefetch = false`` (losses bit for bit). Resume and
rollback with prefetching on are covered by test_family_resume / test_vla_checkpoint / test_family_faults (they
fail when a checkpoint stores the position after the step drawn ahead).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lf_data import ResumableSampler
from lf_orchestrator.cli import app
from lf_orchestrator.prefetch import StepPrefetcher

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class _Source:
    """A trainer's host half: micro-batches of indices from a sampler, tagged with the step and the thread."""

    def __init__(self, steps: int, enabled: bool, fail_at: int | None = None):
        self.sampler = ResumableSampler(10, batch_size=2, seed=3)
        self.indices = iter(self.sampler)
        self.threads: list[str] = []
        self.fail_at = fail_at

        def make(step):
            if step == self.fail_at:
                raise RuntimeError(f"bad sample at step {step}")
            self.threads.append(threading.current_thread().name)
            idx = [next(self.indices) for _ in range(2)]
            return [{"idx": torch.tensor(idx), "step": torch.tensor(step)}]

        def reset():
            self.indices = iter(self.sampler)

        self.prefetcher = StepPrefetcher(make, self.sampler, reset, last_step=steps, enabled=enabled,
                                         pin_memory=False)


def _draw(source: _Source, steps) -> list[list[int]]:
    return [source.prefetcher.batches(s)[0]["idx"].tolist() for s in steps]


def test_prefetched_batches_equal_the_sequential_ones_and_the_position_excludes_the_step_drawn_ahead():
    """Seven steps of 2 samples over 10 (an epoch boundary inside): the same indices either way; the worker thread
    made every step after the first; while step s + 1 is drawn ahead the checkpoint position is the sequential
    one after step s; nothing is drawn past train.steps."""
    plain, ahead = _Source(7, enabled=False), _Source(7, enabled=True)
    for s in range(7):
        assert _draw(ahead, [s]) == _draw(plain, [s])
        assert ahead.prefetcher.sampler_state() == plain.sampler.state_dict()
    assert all(name.startswith("lf-prefetch") for name in ahead.threads[1:])
    assert ahead.threads[0] == threading.current_thread().name
    assert len(ahead.threads) == 7 and ahead.sampler.state_dict() == plain.sampler.state_dict()
    ahead.prefetcher.close()


def test_a_step_other_than_the_one_drawn_ahead_rewinds_the_sampler():
    """After step 2 (step 3 drawn ahead), asking for step 1 again (a rollback) throws step 3's draw away: the
    batch for the repeated step is the one the sequential sampler gives from the position after step 2."""
    ahead, plain = _Source(10, enabled=True), _Source(10, enabled=False)
    _draw(ahead, [0, 1, 2])
    _draw(plain, [0, 1, 2])
    assert _draw(ahead, [1]) == _draw(plain, [3])  # the data position is kept, the step number is the rollback's
    ahead.prefetcher.discard()
    assert ahead.sampler.state_dict() == plain.sampler.state_dict()


def test_an_error_while_drawing_ahead_is_raised_for_that_step():
    """make() fails on the worker thread for step 2: step 1 still arrives; asking for step 2 raises the error."""
    source = _Source(5, enabled=True, fail_at=2)
    _draw(source, [0, 1])
    with pytest.raises(RuntimeError, match="bad sample at step 2"):
        _draw(source, [2])


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.usefixtures("one_thread")
def test_recipe_run_losses_do_not_depend_on_prefetching(tmp_path):
    """Tiny llama3, 4 steps of 2 accumulated micro-batches: data.prefetch true and false give the same losses."""
    sets = [f"corpus.cache_dir='{tmp_path / 'corpus'}'", "corpus.max_chars=60000", "corpus.seq_len=64",
            "corpus.eval_fraction=0.1", "train.global_batch=8", "parallel.micro_batch=4", "parallel.plan='manual'",
            "parallel.dp=1", "parallel.grad_accum=2", "run.device='cpu'", "run.threads=1", "memory.precision='fp32'",
            "train.steps=4", "train.warmup_steps=1", "train.log_every=1", "train.ckpt_every=100",
            "eval.at_end=false"]
    losses = {}
    for prefetch in (True, False):
        args = ["run", str(EXAMPLES / "llama3_pretrain.toml"), "--run-dir", str(tmp_path / str(prefetch))]
        for item in [*sets, f"data.prefetch={str(prefetch).lower()}"]:
            args += ["--set", item]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        losses[prefetch] = _losses(tmp_path / str(prefetch))
    assert sorted(losses[True]) == [1, 2, 3, 4] and losses[True] == losses[False]
    assert losses[True][4] < losses[True][1]


def test_vla_run_losses_do_not_depend_on_prefetching(tiny_config, tmp_path):
    """The VLA family (tiny Meta-World config, 6 steps): data.prefetch true and false give the same losses."""
    losses = {}
    for prefetch in (True, False):
        run_dir = tmp_path / str(prefetch)
        result = CliRunner().invoke(app, ["run", str(tiny_config), "--run-dir", str(run_dir), "--set",
                                          f"data.prefetch={str(prefetch).lower()}", "--set", "eval.at_end=false"])
        assert result.exit_code == 0, result.output
        losses[prefetch] = _losses(run_dir)
    assert len(losses[True]) == 6 and losses[True] == losses[False]
