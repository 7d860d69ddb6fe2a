"""`lf run` / `lf eval` progress when the output is not a terminal: plain lines every train.log_every steps with
step time, throughput and ETA, for the trainer, and evaluation progress lines.

Oracles: the step numbers a log_every schedule selects (multiples and the last step), the stats passed in
(loss, lr, step_s, rates printed in the documented format; ETA = steps left x step_s), and the stdout of real tiny
`lf run`s (VLA with its closed-loop evaluation, llama3) under CliRunner (not a TTY).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.progress import TrainProgress

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

LINE = re.compile(r"step (\d+)/(\d+) loss (\d+\.\d{4}) (?:acc \d\.\d\d )?lr (\S+) (\d+\.\d{3}) s/step "
                  r"([\d,]+\.\d) samples/s ([\d,]+) tok/s ETA (\d+:\d\d:\d\d)")
EVAL_TASK = re.compile(r"eval vla (\S+): success (\d+)/(\d+) \(task (\d+)/(\d+), (\d+)/(\d+) episodes, "
                       r"\d+:\d\d:\d\d elapsed, ETA (\d+:\d\d:\d\d)\)")


def test_plain_lines_every_log_every_and_at_the_end():
    out = io.StringIO()
    console = Console(file=io.StringIO())
    with TrainProgress(console, enabled=True, log_every=3, out=out) as progress:
        assert not progress.live  # a StringIO console is no terminal
        for done in range(11):
            progress.data(done, 10)
        progress.start(8, 1)  # resumed at step 1
        for step in range(2, 9):
            progress.step(step, {"train/loss": 1.0 / step, "train/lr": 1e-3, "perf/tokens_per_s": 1234.0,
                                 "perf/samples_per_s": 80.44, "step_s": 61.5})
    lines = out.getvalue().splitlines()
    assert lines[:10] == [f"demonstrations {d}/10" for d in range(1, 11)]
    steps = [LINE.fullmatch(x) for x in lines[10:]]
    assert all(steps), lines[10:]
    assert [int(m[1]) for m in steps] == [3, 6, 8]
    assert [m[3] for m in steps] == [f"{1 / s:.4f}" for s in (3, 6, 8)]
    assert {m[4] for m in steps} == {"1.00e-03"} and {m[5] for m in steps} == {"61.500"}
    assert {m[6] for m in steps} == {"80.4"} and {m[7] for m in steps} == {"1,234"}
    assert [m[8] for m in steps] == ["0:05:08", "0:02:03", "0:00:00"]  # (8 - step) x 61.5 s, rounded up
    assert console.file.getvalue() == ""  # no bar drawn


def test_disabled_process_prints_nothing():
    out = io.StringIO()
    with TrainProgress(Console(file=io.StringIO()), enabled=False, log_every=1, out=out) as progress:
        progress.start(2, 0)
        progress.step(1, {"train/loss": 1.0, "train/lr": 1e-3})
    assert out.getvalue() == ""


def test_eval_progress_lines():
    """Oracle: the episodes reported (a group of 4 of 10, then the task's end), the successes passed in."""
    from lf_orchestrator.progress import EvalProgress

    lines = []
    progress = EvalProgress(lines.append, ["reach-v3", "push-v3"], 10)
    progress.episodes_done("reach-v3", 4, 4)
    progress.episodes_done("reach-v3", 10, 6)
    progress.task_done("reach-v3", [True] * 3 + [False] * 7)
    assert re.fullmatch(r"eval vla reach-v3: episode 4/10 \(4/20 episodes, \d+:\d\d:\d\d elapsed, ETA \S+\)", lines[0])
    m = EVAL_TASK.fullmatch(lines[1])
    assert len(lines) == 2 and m and m.groups()[:7] == ("reach-v3", "3", "10", "1", "2", "10", "20"), lines


def test_lf_run_redirected_prints_step_and_eval_lines(tiny_config):
    """A real tiny VLA run (4 steps, log_every 2, closed-loop eval of 2 episodes) whose stdout is not a TTY prints
    steps 2 and 4 with step time, samples/s, tok/s and ETA, then the evaluation's progress line."""
    res = CliRunner().invoke(app, ["run", str(tiny_config), "--set", "train.steps=4", "--set", "train.log_every=2",
                                   "--set", "train.warmup_steps=1", "--set", "eval.random_baseline=false"])
    assert res.exit_code == 0, res.output
    steps = [m for m in map(LINE.fullmatch, res.stdout.splitlines()) if m]
    assert [int(m[1]) for m in steps] == [2, 4], res.stdout
    assert steps[-1][8] == "0:00:00"
    evals = [m for m in map(EVAL_TASK.fullmatch, res.stdout.splitlines()) if m]
    assert len(evals) == 1 and evals[0].group(1, 3, 6, 7) == ("reach-v3", "2", "2", "2"), res.stdout


def test_lf_run_llama3_redirected_prints_throughput(tmp_path):
    """The recipe trainer's path (llama3 tiny, 4 steps, log_every 2) prints the same line as the VLA's: step time,
    samples/s (global batch 8 per step), tok/s (8 x 64 tokens per step: 64 x samples/s) and ETA."""
    res = CliRunner().invoke(app, ["run", str(EXAMPLES / "llama3_pretrain.toml"), "--set", "run.device='cpu'",
                                   "--set", "run.threads=1", "--set", f"run.out_dir='{tmp_path}/runs'",
                                   "--set", f"corpus.cache_dir='{tmp_path}/corpus'", "--set", "corpus.max_chars=60000",
                                   "--set", "corpus.seq_len=64", "--set", "train.global_batch=8",
                                   "--set", "parallel.micro_batch=8", "--set", "train.steps=4", "--set",
                                   "train.log_every=2", "--set", "train.warmup_steps=1", "--set", "eval.at_end=false"])
    assert res.exit_code == 0, res.output
    steps = [m for m in map(LINE.fullmatch, res.stdout.splitlines()) if m]
    assert [int(m[1]) for m in steps] == [2, 4], res.stdout
    for m in steps:
        samples, tokens = float(m[6].replace(",", "")), float(m[7].replace(",", ""))
        assert abs(tokens - 64 * samples) <= 0.5 + 64 * 0.05, m[0]  # both from one window; samples/s is rounded
