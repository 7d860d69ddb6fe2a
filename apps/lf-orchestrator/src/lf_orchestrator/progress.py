"""Training progress of `lf run` (VLA trainer): a rich bar on a terminal, plain log lines anywhere else.

rich draws its live bar only on a terminal; with output redirected (``lf run > log.txt``, a batch job's log)
the bar prints nothing until the end. :class:`TrainProgress` therefore picks one of two modes:

- *live* (stdout and the console's stream are both terminals): rich's progress bar, as before;
- *plain* (otherwise): one line every ``train.log_every`` steps and at the last step, ``step 30/1500 loss 1.234
  lr 1.00e-03 2.51 steps/s 1,234 tok/s``, written to stdout when stdout is redirected (so it lands in the log
  file) and to the console otherwise.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


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
        self.out = out
        self._bar: Progress | None = None
        self._data_task = self._train_task = None
        self._total = 0
        self._window: tuple[int, float] = (0, time.perf_counter())
        self._tok_s = 0.0
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

    def _line(self, text: str) -> None:
        if not self.enabled:
            return
        out = self.out if self.out is not None else (sys.stdout if not _isatty(sys.stdout) else None)
        if out is None:
            self.console.print(text, highlight=False, soft_wrap=True)
        else:
            out.write(text + "\n")
            out.flush()

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
        ``perf/tokens_per_s`` (``train/token_accuracy`` for token recipes)."""
        self._tok_s = stats.get("perf/tokens_per_s", self._tok_s)
        acc = f"acc {stats['train/token_accuracy']:.2f} " if "train/token_accuracy" in stats else ""
        if self._bar is not None:
            self._bar.update(self._train_task, completed=step,
                             info=f"loss {stats['train/loss']:.3f} {acc}{self._tok_s:,.0f} tok/s")
            return
        if step % self.log_every and step != self._total:
            return
        first, t0 = self._window
        now = time.perf_counter()
        self._window = (step, now)
        rate = (step - first) / max(now - t0, 1e-9)
        lr = f"lr {stats['train/lr']:.2e} " if "train/lr" in stats else ""
        self._line(f"step {step}/{self._total} loss {stats['train/loss']:.4f} {acc}{lr}{rate:.2f} steps/s "
                   f"{self._tok_s:,.0f} tok/s")
