"""Progress of `lf run` and `lf eval`: a rich bar on a terminal, plain log lines anywhere else.

rich draws its live bar only on a terminal; with output redirected (``lf run > log.txt``, a batch job's log)
the bar prints nothing until the end. :class:`TrainProgress` therefore picks one of two modes:

- *live* (stdout and the console's stream are both terminals): rich's progress bar, as before;
- *plain* (otherwise): one line every ``train.log_every`` steps and at the last step, ``step 30/1500 loss 1.2340
  lr 1.00e-03 0.398 s/step 80.4 samples/s 1,234 tok/s ETA 0:09:45``, written to stdout when stdout is
  redirected (so it lands in the log file) and to the console otherwise.

The trainer reports through it for every family with the same vocabulary: the
step time (``step_s``, seconds per step over the log window), samples/s (``perf/samples_per_s``), tokens/s
(``perf/tokens_per_s``, where the run has tokens) and the time left at the window's pace.

:class:`EvalProgress` reports closed-loop evaluation (a line per finished group of episodes and per task, with
the time left) the same way, so a long Meta-World evaluation is not minutes of silence in a log file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def format_eta(seconds: float) -> str:
    """``H:MM:SS`` of ``seconds`` (rounded up to whole seconds; negative or non-finite: ``?``)."""
    if not (seconds >= 0 and seconds < float("inf")):
        return "?"
    s = int(-(-seconds // 1))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class LineReporter:
    """Writes one plain progress line: to ``out`` if given, else to stdout when it is redirected (the log file),
    else to ``console``; a disabled reporter (not the main process) writes nothing.

    Args:
        console: the console of the run's messages (``lf``'s stderr console).
        enabled: whether this process reports.
        out: a fixed stream (tests).
    """

    def __init__(self, console: Console, *, enabled: bool = True, out: IO[str] | None = None) -> None:
        self.console, self.enabled, self.out = console, enabled, out

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        out = self.out if self.out is not None else (sys.stdout if not _isatty(sys.stdout) else None)
        if out is None:
            self.console.print(text, highlight=False, soft_wrap=True)
        else:
            out.write(text + "\n")
            out.flush()


class TrainProgress:
    """Console progress of data preparation and training steps (main process only).

    Args:
        console: where messages of the run go (``lf``'s stderr console).
        enabled: whether this process reports (``ctx.is_main``); a disabled one prints nothing.
        log_every: steps between plain lines (``train.log_every``); the last step always prints.
        live: force the mode (tests); default: live when stdout and the console are terminals.
        out: the stream plain lines go to; default: stdout when it is redirected, else the console's stream.
    """

    def __init__(self, console: Console, *, enabled: bool, log_every: int, live: bool | None = None,
                 out: IO[str] | None = None) -> None:
        self.console, self.enabled, self.log_every = console, enabled, max(int(log_every), 1)
        self.live = (console.is_terminal and _isatty(sys.stdout)) if live is None else live
        self._line = LineReporter(console, enabled=enabled, out=out)
        self._bar: Progress | None = None
        self._data_task = self._train_task = None
        self._total = 0
        self._window: tuple[int, float] = (0, time.perf_counter())
        self._rates: dict[str, float] = {}
        self._data_printed = -1
        if self.live:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=console,
                                 disable=not enabled, transient=False)

    def __enter__(self) -> TrainProgress:
        if self._bar is not None:
            self._bar.__enter__()
            self._data_task = self._bar.add_task("demonstrations", total=None, info="", visible=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def data(self, done: int, total: int) -> None:
        """Dataset generation progress (episodes ``done`` of ``total``); plain mode prints each tenth."""
        if self._bar is not None:
            self._bar.update(self._data_task, completed=done, total=total, visible=True)
            return
        tenth = 10 * done // max(total, 1)
        if tenth > self._data_printed and (tenth > 0 or done == total):
            self._data_printed = tenth
            self._line(f"demonstrations {done}/{total}")

    def start(self, total_steps: int, step: int) -> None:
        """Training begins at ``step`` (a resumed run: its checkpoint's step) of ``total_steps``."""
        self._total, self._window = total_steps, (step, time.perf_counter())
        if self._bar is not None:
            self._train_task = self._bar.add_task("training", total=total_steps, completed=step, info="")

    def step(self, step: int, stats: dict[str, float]) -> None:
        """After optimizer step ``step``: ``stats`` holds ``train/loss``, ``train/lr`` and, on logged steps,
        ``step_s``, ``perf/samples_per_s`` and ``perf/tokens_per_s`` (``train/token_accuracy`` for token
        recipes); a rate missing from a run's stats is left out of its line."""
        self._rates.update({k: v for k, v in stats.items() if k in RATES})
        tok_s = self._rates.get("perf/tokens_per_s")
        acc = f"acc {stats['train/token_accuracy']:.2f} " if "train/token_accuracy" in stats else ""
        if self._bar is not None:
            rate = f"{tok_s:,.0f} tok/s" if tok_s is not None else \
                f"{self._rates.get('perf/samples_per_s', 0.0):,.1f} samples/s"
            self._bar.update(self._train_task, completed=step, info=f"loss {stats['train/loss']:.3f} {acc}{rate}")
            return
        if step % self.log_every and step != self._total:
            return
        first, t0 = self._window
        now = time.perf_counter()
        self._window = (step, now)
        step_s = stats.get("step_s", (now - t0) / max(step - first, 1))
        lr = f"lr {stats['train/lr']:.2e} " if "train/lr" in stats else ""
        rates = "".join(f" {self._rates[k]:,.{digits}f} {unit}" for k, (unit, digits) in RATES.items()
                        if k in self._rates)
        self._line(f"step {step}/{self._total} loss {stats['train/loss']:.4f} {acc}{lr}{step_s:.3f} s/step{rates} "
                   f"ETA {format_eta((self._total - step) * step_s)}")


RATES = {"perf/samples_per_s": ("samples/s", 1), "perf/tokens_per_s": ("tok/s", 0)}
"""The throughput scalars of a plain progress line, with their unit and decimals, in line order."""


class EvalProgress:
    """Progress lines of a closed-loop evaluation: after each group of episodes and after each task, with the
    episodes done, the elapsed time and the time left at the pace so far.

    Args:
        report: writes one line (:class:`LineReporter`), or None to print nothing.
        tasks: the tasks rolled out, in order.
        episodes: episodes per task.
        what: the policy being evaluated (``"vla"``).
    """

    def __init__(self, report: Callable[[str], None] | None, tasks: list[str], episodes: int, *,
                 what: str = "vla") -> None:
        self.report, self.tasks, self.episodes, self.what = report, list(tasks), int(episodes), what
        self.total = len(self.tasks) * self.episodes
        self.done, self._t0 = 0, time.perf_counter()

    def _times(self) -> str:
        elapsed = time.perf_counter() - self._t0
        left = elapsed / self.done * (self.total - self.done) if self.done else float("inf")
        return f"{format_eta(elapsed)} elapsed, ETA {format_eta(left)}"

    def episodes_done(self, task: str, done_in_task: int, count: int) -> None:
        """``count`` more episodes of ``task`` finished (``done_in_task`` of them so far)."""
        self.done += count
        if self.report is not None and done_in_task < self.episodes:  # the task's last group: task_done says it
            self.report(f"eval {self.what} {task}: episode {done_in_task}/{self.episodes} "
                        f"({self.done}/{self.total} episodes, {self._times()})")

    def task_done(self, task: str, successes: list[bool]) -> None:
        """``task`` finished with these per-episode successes."""
        if self.report is not None:
            index = self.tasks.index(task) + 1
            self.report(f"eval {self.what} {task}: success {sum(successes)}/{len(successes)} (task {index}/"
                        f"{len(self.tasks)}, {self.done}/{self.total} episodes, {self._times()})")
