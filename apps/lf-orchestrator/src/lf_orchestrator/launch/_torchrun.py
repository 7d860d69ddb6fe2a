"""The torchrun backend: ``python -m torch.distributed.run ... -m lf_orchestrator run CONFIG --run-dir DIR``.

torchrun (torch elastic) supervises the workers: when one dies it stops the others and, up to
``--max-restarts`` times, starts the whole group again; the restarted workers resume the shared run
folder from its latest complete checkpoint (see ``lf run --run-dir``).
"""

from __future__ import annotations

import signal
import subprocess

from lf_orchestrator.launch._spec import LaunchSpec, torchrun_args


def torchrun_command(spec: LaunchSpec) -> list[str]:
    """The full command line (argv) this node runs."""
    return [spec.python, "-m", "torch.distributed.run", *torchrun_args(spec)]


def run_torchrun(spec: LaunchSpec, env: dict[str, str] | None = None) -> int:
    """Run torchrun in the foreground and return its exit code.

    SIGTERM and SIGINT sent to this process are forwarded to torchrun, which forwards them to its
    workers (they save a checkpoint and exit: see ``lf_orchestrator.faults``).
    """
    proc = subprocess.Popen(torchrun_command(spec), env=env)

    def forward(signum, _frame):
        proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
