"""`lf run`'s training progress when the output is not a terminal: plain lines every train.log_every steps.

Oracles: the step numbers a log_every schedule selects (multiples and the last step), the stats passed in
(loss, lr printed in the documented format), and the stdout of a real tiny `lf run` under CliRunner (not a TTY).
"""

from __future__ import annotations

import io
import re

from rich.console import Console
from typer.testing import CliRunner

from lf_orchestrator.cli import app
from lf_orchestrator.progress import TrainProgress

LINE = re.compile(r"step (\d+)/(\d+) loss (\d+\.\d{4}) (?:acc \d\.\d\d )?lr (\S+) (\d+\.\d\d) steps/s ([\d,]+) tok/s")


def test_plain_lines_every_log_every_and_at_the_end():
    out = io.StringIO()
    console = Console(file=io.StringIO())
    with TrainProgress(console, enabled=True, log_every=3, out=out) as progress:
        assert not progress.live  # a StringIO console is no terminal
        for done in range(11):
            progress.data(done, 10)
        progress.start(8, 1)  # resumed at step 1
        for step in range(2, 9):
            progress.step(step, {"train/loss": 1.0 / step, "train/lr": 1e-3, "perf/tokens_per_s": 1234.0})
    lines = out.getvalue().splitlines()
    assert lines[:10] == [f"demonstrations {d}/10" for d in range(1, 11)]
    steps = [LINE.fullmatch(x) for x in lines[10:]]
    assert all(steps), lines[10:]
    assert [int(m[1]) for m in steps] == [3, 6, 8]
    assert [m[3] for m in steps] == [f"{1 / s:.4f}" for s in (3, 6, 8)]
    assert {m[4] for m in steps} == {"1.00e-03"} and {m[6] for m in steps} == {"1,234"}
    assert console.file.getvalue() == ""  # no bar drawn


def test_disabled_process_prints_nothing():
    out = io.StringIO()
    with TrainProgress(Console(file=io.StringIO()), enabled=False, log_every=1, out=out) as progress:
        progress.start(2, 0)
        progress.step(1, {"train/loss": 1.0, "train/lr": 1e-3})
    assert out.getvalue() == ""


def test_lf_run_redirected_prints_step_lines(tiny_config):
    """A real tiny VLA run (4 steps, log_every 2) whose stdout is not a TTY prints steps 2 and 4 to stdout."""
    res = CliRunner().invoke(app, ["run", str(tiny_config), "--set", "train.steps=4", "--set", "train.log_every=2",
                                   "--set", "train.warmup_steps=1", "--set", "eval.at_end=false"])
    assert res.exit_code == 0, res.output
    steps = [int(m[1]) for m in map(LINE.fullmatch, res.stdout.splitlines()) if m]
    assert steps == [2, 4], res.stdout
