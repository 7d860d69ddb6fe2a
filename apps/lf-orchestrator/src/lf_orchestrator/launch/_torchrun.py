"""The torchrun backend: ``python -m torch.distributed.run ... -m lf_orchestrator run CONFIG --run-dir DIR``.

torchrun (torch elastic) supervises the workers: when one dies it stops the others and, up to
``--max-restarts`` times, starts the whole group again; the restarted workers resume the shared run
folder from its latest complete checkpoint (see ``lf run --run-dir``).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from typing import TextIO

from lf_orchestrator.launch._spec import LaunchSpec, torchrun_args


def torchrun_command(spec: LaunchSpec) -> list[str]:
    """The full command line (argv) this node runs."""
    return [spec.python, "-m", "torch.distributed.run", *torchrun_args(spec)]


def run_torchrun(spec: LaunchSpec, env: dict[str, str] | None = None) -> int:
    """Run torchrun in the foreground and return its exit code (the failed rank's own code when torchrun
    reports one, e.g. 2 for a run `lf run` refused).

    SIGTERM and SIGINT sent to this process are forwarded to torchrun, which forwards them to its
    workers (they save a checkpoint and exit: see ``lf_orchestrator.faults``). The shared stderr passes
    through :class:`FailureFilter`: the workers' output unchanged, torchrun's own ``ChildFailedError``
    traceback replaced by one line per failed rank.
    """
    proc = subprocess.Popen(torchrun_command(spec), env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    filt = FailureFilter(sys.stderr)
    reader = threading.Thread(target=filt.feed_all, args=(proc.stderr,), daemon=True)
    reader.start()

    def forward(signum, _frame):
        proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    reader.join()
    return filt.exit_code if code and filt.exit_code else code


_FIELD = re.compile(r"^\s*(rank|exitcode|error_file|host)\s*:\s*(.*)$")


class FailureFilter:
    """Copies torchrun's stderr to ``out`` line by line, except torchrun's own traceback of a failed worker group
    (a Python traceback ending in ``ChildFailedError`` and its ``Failures`` report), which becomes
    ``worker failed: rank R (host H) exited with code C; its error is above`` per failed rank. Any other
    traceback (a worker's) passes unchanged."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.exit_code = 0
        """The first failed rank's exit code from torchrun's report (0: no report seen)."""
        self._tb: list[str] | None = None
        self._report = False
        self._failure: dict[str, str] = {}
        self._rules = 0

    def feed_all(self, stream) -> None:
        for line in stream:
            self.feed(line)
        self.flush()

    def feed(self, line: str) -> None:
        """Take one line (with its newline)."""
        if self._report:
            self._in_report(line)
        elif self._tb is not None:
            self._tb.append(line)
            if line.strip() and not line[0].isspace():  # the exception line ends a traceback
                tb, self._tb = self._tb, None
                if line.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError"):
                    self._report = True
                else:
                    self._write("".join(tb))
        elif line.startswith("Traceback (most recent call last):"):
            self._tb = [line]
        else:
            self._write(line)

    def _in_report(self, line: str) -> None:  # "====", name FAILED, "----", Failures: [i]: ..., Root Cause ..., "===="
        match = _FIELD.match(line)
        if match:
            self._failure[match.group(1)] = match.group(2).strip()
        elif line.startswith(("[", "Root Cause", "-", "=")) and self._failure.get("rank"):
            self._summarise()
        if line.startswith("="):
            self._rules += 1
            if self._rules == 2:  # the report's closing rule
                self._report, self._rules = False, 0

    def _summarise(self) -> None:
        f, self._failure = self._failure, {}
        code = f.get("exitcode", "?").split()[0]
        if not self.exit_code and code.lstrip("-").isdigit() and int(code) > 0:
            self.exit_code = int(code)
        where = f" (host {f['host']})" if f.get("host") else ""
        err = f.get("error_file", "<N/A>")
        loc = f"error file {err}" if err and err != "<N/A>" else "its error is printed above"
        self._write(f"worker failed: rank {f['rank']}{where} exited with code {code}; {loc}\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def flush(self) -> None:
        """Write what is still held back (an unfinished traceback)."""
        if self._tb:
            self._write("".join(self._tb))
            self._tb = None
        if self._failure.get("rank"):
            self._summarise()
