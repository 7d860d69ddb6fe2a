"""What `lf launch` starts: the job shape and the worker command every backend runs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import msgspec


class LaunchError(ValueError):
    """A launch request that cannot run; the message names the option and the value received."""


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One distributed job: ``nodes`` x ``procs_per_node`` workers running ``lf run`` on one config."""

    config: str
    """Run config (TOML) path, absolute, as the workers see it."""
    overrides: tuple[str, ...] = ()
    """``--set`` overrides forwarded to every worker."""
    run_dir: str
    """Run folder shared by every attempt (and every node); may hold shell variables (``$SLURM_JOB_ID``)."""
    nodes: int = 1
    """Machines in the job."""
    procs_per_node: int = 1
    """Worker processes per machine (GPUs per node; CPU processes with ``device=cpu``)."""
    device: str = "auto"
    """Worker device: ``auto``, ``cpu`` or ``cuda`` (``cpu`` uses gloo)."""
    max_restarts: int = 0
    """Elastic restarts of the whole worker group after a worker fails (torchrun ``--max-restarts``)."""
    rdzv_id: str = "lf"
    """Rendezvous id, the same on every node."""
    rdzv_endpoint: str = ""
    """``host:port`` of the c10d rendezvous; empty on one node (torchrun ``--standalone``)."""
    python: str = sys.executable
    """Interpreter the workers run."""

    def __post_init__(self) -> None:
        for name in ("nodes", "procs_per_node"):
            if getattr(self, name) < 1:
                raise LaunchError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(self, name)}")
        if self.max_restarts < 0:
            raise LaunchError(f"--max-restarts: expected an integer >= 0, got {self.max_restarts}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise LaunchError(f"--device: expected auto, cpu or cuda, got {self.device!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def worker_args(spec: LaunchSpec) -> list[str]:
    """The ``lf run`` arguments every worker gets (after ``-m lf_orchestrator``)."""
    args = ["run", spec.config, "--run-dir", spec.run_dir]
    if spec.device != "auto":
        args += ["--set", f"run.device={spec.device}"]
    for item in spec.overrides:
        args += ["--set", item]
    return args


def torchrun_args(spec: LaunchSpec, *, nnodes: str | None = None, endpoint: str | None = None,
                  rdzv_id: str | None = None) -> list[str]:
    """``torch.distributed.run`` options (after ``python -m torch.distributed.run``) and the worker module.

    One node without an endpoint uses ``--standalone`` (a local c10d store on a free port); otherwise
    a c10d rendezvous at ``endpoint`` with ``rdzv_id`` (both may be shell expressions for sbatch).
    """
    args = ["--nnodes", nnodes or str(spec.nodes), "--nproc-per-node", str(spec.procs_per_node),
            "--max-restarts", str(spec.max_restarts)]
    endpoint = endpoint if endpoint is not None else spec.rdzv_endpoint
    if spec.nodes == 1 and not endpoint:
        args.append("--standalone")
    else:
        if not endpoint:
            raise LaunchError(f"--rdzv-endpoint: {spec.nodes} nodes need a host:port every node can reach")
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id or spec.rdzv_id]
    return [*args, "-m", "lf_orchestrator", *worker_args(spec)]


def shell_join(args: list[str], *, keep_vars: bool = False) -> str:
    """``shlex.join``, but with ``keep_vars`` arguments holding ``$VAR`` are double-quoted so the shell
    expands them."""
    if not keep_vars:
        return shlex.join(args)
    out = []
    for a in args:
        if "$" in a and '"' not in a and "`" not in a and "\\" not in a:
            out.append(f'"{a}"')
        else:
            out.append(shlex.quote(a))
    return " ".join(out)


def absolute(path: str | Path) -> str:
    """``path`` made absolute (workers may start in another folder)."""
    return str(Path(path).expanduser().resolve())
