"""The Slurm backend: an sbatch script that runs one ``srun torchrun`` task per node.

The rendezvous comes from the Slurm environment: the first host of ``$SLURM_JOB_NODELIST`` serves the
c10d store, ``$SLURM_JOB_ID`` is the rendezvous id and names the run folder, so a requeued job
(``--requeue``) continues the same run from its latest checkpoint. ``--signal=TERM@grace`` asks Slurm
to send SIGTERM ahead of the time limit, which makes the workers save and exit.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import msgspec

from lf_orchestrator.launch._spec import LaunchError, LaunchSpec, shell_join, torchrun_args


class SlurmOptions(msgspec.Struct, frozen=True, kw_only=True):
    """sbatch settings that are not part of the job shape."""

    job_name: str = "lf"
    """``#SBATCH --job-name``."""
    partition: str = ""
    """``#SBATCH --partition`` (empty: the cluster default)."""
    account: str = ""
    """``#SBATCH --account`` (empty: none)."""
    time: str = ""
    """``#SBATCH --time`` limit, e.g. ``04:00:00`` (empty: the partition default)."""
    cpus_per_task: int = 0
    """``#SBATCH --cpus-per-task`` (0: not set)."""
    gpus: bool = True
    """Request ``--gpus-per-node`` (off for ``--device cpu``)."""
    output: str = "slurm-%x-%j.out"
    """``#SBATCH --output`` log file pattern."""
    port: int = 29500
    """c10d rendezvous port on the first node."""
    term_grace_s: int = 120
    """Seconds before the time limit when Slurm sends SIGTERM (0: no ``--signal``)."""
    requeue: bool = False
    """``#SBATCH --requeue``: a preempted job is queued again and resumes the same run folder."""


def sbatch_script(spec: LaunchSpec, opts: SlurmOptions) -> str:
    """The sbatch script text (``spec.run_dir`` should contain ``$SLURM_JOB_ID``)."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={opts.job_name}", f"#SBATCH --nodes={spec.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --output={opts.output}"]
    if opts.gpus and spec.device != "cpu":
        lines.append(f"#SBATCH --gpus-per-node={spec.procs_per_node}")
    for key, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    if opts.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    if opts.term_grace_s:
        lines.append(f"#SBATCH --signal=TERM@{opts.term_grace_s}")
    if opts.requeue:
        lines.append("#SBATCH --requeue")
    # One node: the standalone store avoids a fixed port clash between jobs sharing the node.
    endpoint = "$MASTER_ADDR:$MASTER_PORT" if spec.nodes > 1 else ""
    cmd = shell_join([spec.python, "-m", "torch.distributed.run",
                      *torchrun_args(spec, nnodes="$SLURM_NNODES", endpoint=endpoint,
                                     rdzv_id="$SLURM_JOB_ID")], keep_vars=True)
    lines += ["", "set -euo pipefail",
              'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"MASTER_PORT={opts.port}", "export MASTER_ADDR MASTER_PORT",
              "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}", "",
              f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 {cmd}", ""]
    return "\n".join(lines)


def submit(script: str, path: Path) -> str:
    """Write ``script`` to ``path`` and submit it with ``sbatch --parsable``; returns the job id.

    Raises:
        LaunchError: no ``sbatch`` on PATH, or sbatch refused the script (its message included).
    """
    if shutil.which("sbatch") is None:
        raise LaunchError("--backend slurm: 'sbatch' not found on PATH (use --dry-run to print the script)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    res = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        raise LaunchError(f"sbatch {path}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]
