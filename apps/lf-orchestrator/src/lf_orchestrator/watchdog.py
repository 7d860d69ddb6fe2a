"""Hang watchdog: when no training step finishes for ``timeout_s``, dump every thread's stack.

A Python thread waits for heartbeats (:meth:`Watchdog.beat`, once per step). On timeout it writes a
diagnostic file ``hang-rank{r}.txt`` in the run folder (rank, pid, host, last step, seconds since the
last beat, then the stacks of all threads via :func:`faulthandler.dump_traceback`) and, with
``abort=True``, exits the process with :data:`HANG_EXIT_CODE` so that torchrun restarts the group from
the last checkpoint. Because a C call that holds the GIL would also stall that thread, ``abort=True``
also arms :func:`faulthandler.dump_traceback_later` (a C-level timer that needs no GIL) at twice the
timeout as a backstop. Built on the standard library only, like torch elastic's own watchdogs.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HANG_EXIT_CODE = 124
"""Exit code of a process the watchdog stopped (as coreutils ``timeout`` uses)."""


class Watchdog:
    """Dump stacks (and optionally exit) when :meth:`beat` is not called for ``timeout_s`` seconds.

    Args:
        timeout_s: seconds without a beat that count as a hang (> 0).
        dump_path: file that receives the diagnostic (appended; created on the first hang).
        abort: exit the process after the dump (exit code :data:`HANG_EXIT_CODE`).
        describe: returns a line of run state for the header (e.g. the step); called on hang.

    Raises:
        ValueError: ``timeout_s`` <= 0.
    """

    def __init__(self, timeout_s: float, dump_path: Path, *, abort: bool = True,
                 describe: Callable[[], str] = lambda: ""):
        if not timeout_s > 0:
            raise ValueError(f"Watchdog: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s, self.dump_path, self.abort, self.describe = float(timeout_s), Path(dump_path), abort, describe
        self.fired = 0
        """Hangs detected so far."""
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop = None

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name="lf-watchdog", daemon=True)
        self._thread.start()
        if self.abort:
            self._backstop = self.dump_path.with_suffix(".backstop.txt").open("a")
            faulthandler.dump_traceback_later(2 * self.timeout_s, exit=True, file=self._backstop)
        return self

    def beat(self) -> None:
        """Progress was made: restart the countdown."""
        self._last = time.monotonic()
        if self._backstop is not None:
            faulthandler.dump_traceback_later(2 * self.timeout_s, exit=True, file=self._backstop)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._backstop is not None:
            faulthandler.cancel_dump_traceback_later()
            self._backstop.close()
            self._backstop = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _watch(self) -> None:
        reported = None
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self._last
            if idle < self.timeout_s or reported == self._last:
                continue
            reported = self._last  # one dump per hang
            self.fired += 1
            self._dump(idle)
            if self.abort:
                sys.stderr.flush()
                os._exit(HANG_EXIT_CODE)

    def _dump(self, idle: float) -> None:
        header = (f"lf watchdog: no progress for {idle:.1f} s (timeout {self.timeout_s:g} s); "
                  f"rank {os.environ.get('RANK', '0')}/{os.environ.get('WORLD_SIZE', '1')} pid {os.getpid()} "
                  f"host {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}; {self.describe()}\n")
        self.dump_path.parent.mkdir(parents=True, exist_ok=True)
        with self.dump_path.open("a") as f:
            f.write(header)
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        sys.stderr.write(header + f"stacks of all threads: {self.dump_path}\n")
