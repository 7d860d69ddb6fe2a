"""`lf launch CONFIG`: start a run on several processes or machines (torchrun, Slurm, Kubernetes: a Kubeflow
PyTorchJob or a JobSet, ``--kind``).

The config is validated here first (a bad config fails in well under a second, before any job
starts). Every backend runs ``lf run CONFIG --run-dir DIR`` in each worker, with one run folder per
job, so elastic restarts and requeued jobs resume it from its latest checkpoint.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Optional

import typer

from lf_orchestrator._console import fail, make_console
from lf_orchestrator._options import SetOpt
from lf_orchestrator.config import ConfigError, load_config
from lf_orchestrator.launch._jobset import jobset
from lf_orchestrator.launch._k8s import K8sOptions, Volume, pytorchjob
from lf_orchestrator.launch._slurm import SlurmOptions, sbatch_script, submit
from lf_orchestrator.launch._spec import LaunchError, LaunchSpec, absolute, shell_join
from lf_orchestrator.launch._torchrun import run_torchrun, torchrun_command

console = make_console(stderr=True)


class Backend(StrEnum):
    """Where `lf launch` starts the workers."""

    torchrun = "torchrun"
    slurm = "slurm"
    kubernetes = "kubernetes"


class K8sKind(StrEnum):
    """Which Kubernetes workload `lf launch --backend kubernetes` writes."""

    pytorchjob = "pytorchjob"
    """Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``): needs the Kubeflow training operator."""
    jobset = "jobset"
    """``JobSet`` (``jobset.x-k8s.io/v1alpha2``): needs the JobSet controller."""


def _fail(message: str) -> None:
    fail(console, message)


def _env_pairs(items: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env {item!r}: expected NAME=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def launch(
    config: Annotated[Path, typer.Argument(help="Run config (TOML).")],
    overrides: SetOpt = None,
    backend: Annotated[Backend, typer.Option(help="How to start the workers.")] = Backend.torchrun,
    nodes: Annotated[int, typer.Option(help="Machines.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(
        "--gpus-per-node", "--nproc-per-node", help="Worker processes per machine (CPU processes with "
        "--device cpu).")] = 1,
    device: Annotated[str, typer.Option(help="auto, cpu (gloo) or cuda; overrides run.device.")] = "auto",
    max_restarts: Annotated[int, typer.Option(help="Elastic restarts of the worker group after a "
                                              "failure; each resumes from the last checkpoint.")] = 0,
    rdzv_endpoint: Annotated[str, typer.Option(help="torchrun, several nodes: host:port of the c10d "
                                               "rendezvous.")] = "",
    run_id: Annotated[str, typer.Option(help="Names the run folder {out_dir}/{name}-{run_id} and the "
                                        "rendezvous; the same on every node (default: a timestamp).")] = "",
    dry_run: Annotated[bool, typer.Option(help="Print the command, sbatch script or manifest; start "
                                          "nothing.")] = False,
    partition: Annotated[str, typer.Option(help="Slurm partition.")] = "",
    account: Annotated[str, typer.Option(help="Slurm account.")] = "",
    time_limit: Annotated[str, typer.Option("--time", help="Slurm time limit (HH:MM:SS).")] = "",
    cpus_per_task: Annotated[int, typer.Option(help="Slurm CPUs per node task.")] = 0,
    requeue: Annotated[bool, typer.Option(help="Slurm: requeue on preemption (resumes the run).")] = False,
    kind: Annotated[K8sKind, typer.Option(help="Kubernetes: the workload to write, a Kubeflow PyTorchJob or a "
                                          "JobSet.")] = K8sKind.pytorchjob,
    image: Annotated[str, typer.Option(help="Kubernetes: container image with lf installed.")] = "",
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = "default",
    cpu: Annotated[str, typer.Option(help="Kubernetes: CPU per pod (quantity).")] = "",
    memory: Annotated[str, typer.Option(help="Kubernetes: memory per pod (e.g. 64Gi).")] = "",
    env: Annotated[Optional[list[str]], typer.Option(help="Kubernetes: NAME=VALUE in every pod.")] = None,
    volume: Annotated[Optional[list[str]], typer.Option(
        help="Kubernetes: CLAIM:/mount/path, a PersistentVolumeClaim in every pod.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        help="Slurm / Kubernetes: where to write the script or manifest.")] = None,
    apply: Annotated[bool, typer.Option(help="Kubernetes: kubectl apply the manifest.")] = False,
):
    """Start `lf run` on NODES x GPUS_PER_NODE processes with torchrun, Slurm or Kubernetes."""
    try:
        cfg = load_config(config, overrides)
        rid = run_id or ("$SLURM_JOB_ID" if backend is Backend.slurm else time.strftime("%Y%m%d-%H%M%S"))
        if backend is Backend.kubernetes:
            rid = run_id or cfg.run.name.lower().replace("_", "-")
            out_dir, cfg_path = cfg.run.out_dir, str(config)  # paths as the pods see them
        else:
            out_dir, cfg_path = absolute(cfg.run.out_dir), absolute(config)
        if kind is not K8sKind.pytorchjob and backend is not Backend.kubernetes:
            raise LaunchError(f"--kind {kind.value}: only with --backend kubernetes (got --backend {backend.value})")
        if backend is Backend.torchrun and nodes > 1 and not run_id:
            raise LaunchError("--run-id: several torchrun nodes need the same --run-id on every node")
        spec = LaunchSpec(config=cfg_path, overrides=tuple(overrides or ()),
                          run_dir=f"{out_dir}/{cfg.run.name}-{rid}", nodes=nodes, procs_per_node=gpus_per_node,
                          device=device, max_restarts=max_restarts, rdzv_id=run_id or "lf",
                          rdzv_endpoint=rdzv_endpoint)
        _check_manual_plan(cfg, config, nodes, gpus_per_node)
        if backend is Backend.torchrun:
            raise typer.Exit(_torchrun(spec, dry_run))
        if backend is Backend.slurm:
            _slurm(spec, SlurmOptions(job_name=cfg.run.name, partition=partition, account=account,
                                      time=time_limit, cpus_per_task=cpus_per_task, requeue=requeue,
                                      output=f"{out_dir}/slurm-%x-%j.out"), dry_run, output)
        else:
            if not image:
                raise LaunchError("--backend kubernetes: --image is required (an image with lf installed)")
            opts = K8sOptions(job_name=rid, image=image, namespace=namespace, cpu=cpu, memory=memory,
                              env=_env_pairs(env or []), volumes=tuple(Volume.parse(v) for v in volume or []))
            _kubernetes(spec, opts, kind, dry_run, output, apply)
    except (ConfigError, LaunchError) as err:
        _fail(str(err))


def _check_manual_plan(cfg, config: Path, nodes: int, procs_per_node: int) -> None:
    """Refuse a ``parallel.plan = "manual"`` plan that `lf run` would refuse on ``nodes x procs_per_node`` processes
    before its first step, as far as that needs no model: the spec parses, the degrees are positive and multiply to
    the world size, the batch splits (lf-parallel's ``check_plan`` without the IR graph).

    Raises:
        LaunchError: names the config, the plan and the world size.
    """
    if cfg.parallel.plan != "manual":
        return
    from lf_orchestrator.families._plan import capability_refusal, manual_plan
    from lf_parallel import PlanError, check_plan

    world = nodes * procs_per_node
    try:
        plan = check_plan(manual_plan(cfg), world_size=world, global_batch=cfg.train.global_batch)
    except PlanError as err:
        raise LaunchError(f"{config}: {err} (the job has {nodes} node(s) x {procs_per_node} processes = "
                          f"{world})") from None
    why = capability_refusal(plan, cfg)  # the recipe's declared parallelisms: before any worker starts
    if why:
        raise LaunchError(f"{config}: parallel.spec {cfg.parallel.spec!r}: {why}")


def _torchrun(spec: LaunchSpec, dry_run: bool) -> int:
    cmd = torchrun_command(spec)
    if dry_run:
        print(shell_join(cmd))
        return 0
    console.print(f"run folder: [bold]{spec.run_dir}[/]\n$ {shell_join(cmd)}", highlight=False)
    return run_torchrun(spec)


def _slurm(spec: LaunchSpec, opts: SlurmOptions, dry_run: bool, output: Optional[Path]) -> None:
    script = sbatch_script(spec, opts)
    if dry_run:
        print(script, end="")
        return
    folder = Path(spec.run_dir.replace("-$SLURM_JOB_ID", ""))
    path = output or folder.with_name(folder.name + ".sbatch")
    job = submit(script, path)
    console.print(f"submitted Slurm job {job} ({path}); run folder: "
                  f"[bold]{spec.run_dir.replace('$SLURM_JOB_ID', job)}[/]", highlight=False)
    print(job)


def _kubernetes(spec: LaunchSpec, opts: K8sOptions, kind: K8sKind, dry_run: bool, output: Optional[Path],
                apply: bool) -> None:
    manifest = jobset(spec, opts) if kind is K8sKind.jobset else pytorchjob(spec, opts)
    try:
        import yaml

        text = yaml.safe_dump(manifest, sort_keys=False)
    except ImportError:  # JSON is YAML too
        text = json.dumps(manifest, indent=1) + "\n"
    if dry_run:
        print(text, end="")
        return
    path = output or Path(f"{opts.job_name}.{kind.value}.yaml")
    path.write_text(text)
    console.print(f"wrote {path}")
    if apply:
        if shutil.which("kubectl") is None:
            raise LaunchError("--apply: 'kubectl' not found on PATH")
        res = subprocess.run(["kubectl", "apply", "-f", str(path)], capture_output=True, text=True)
        if res.returncode != 0:
            raise LaunchError(f"kubectl apply -f {path}: {res.stderr.strip()}")
        console.print(res.stdout.strip())
