"""The Kubernetes backend: a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``) manifest.

Spec followed: the Kubeflow training-operator CRD ``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``
(https://github.com/kubeflow/training-operator). The job is elastic (``elasticPolicy`` with the c10d
rendezvous): the operator sets torchrun's ``PET_*`` variables (nodes, rendezvous endpoint, max
restarts) in every pod, so the container runs plain ``python -m torch.distributed.run`` with the
worker command. Every pod mounts the same volume for the run folder, which is named after the job so
a restarted pod resumes it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from lf_orchestrator.launch._spec import LaunchError, LaunchSpec, worker_args

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Volume(msgspec.Struct, frozen=True, kw_only=True):
    """A PersistentVolumeClaim mounted into every pod."""

    name: str
    """Volume name (DNS-1123 label)."""
    claim: str
    """PersistentVolumeClaim name."""
    mount_path: str
    """Where the pod sees it."""

    @classmethod
    def parse(cls, text: str) -> Volume:
        """``claim:/mount/path`` -> Volume (named after the claim).

        Raises:
            LaunchError: the text has no ``:`` or the path is not absolute.
        """
        claim, sep, mount = text.partition(":")
        if not sep or not claim or not mount.startswith("/"):
            raise LaunchError(f"--volume {text!r}: expected CLAIM:/absolute/mount/path")
        return cls(name=claim, claim=claim, mount_path=mount)


class K8sOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Pod settings of the manifest."""

    job_name: str
    """PyTorchJob / JobSet name (DNS-1123 label); also the run folder's suffix."""
    image: str
    """Container image with lf installed."""
    namespace: str = "default"
    """Namespace of the job."""
    cpu: str = ""
    """CPU request and limit per pod (Kubernetes quantity, empty: none)."""
    memory: str = ""
    """Memory request and limit per pod (e.g. ``64Gi``, empty: none)."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables (name, value)."""
    volumes: tuple[Volume, ...] = ()
    """Claims mounted into every pod (the run folder and data must live on one of them)."""
    shm: str = "16Gi"
    """Size of the in-memory ``/dev/shm`` (data loader workers and NCCL need more than the default)."""


def check_job_name(name: str) -> None:
    """Raise :class:`LaunchError` unless ``name`` is a DNS-1123 label (a job, JobSet or service name)."""
    if not _DNS1123.match(name) or len(name) > 63:
        raise LaunchError(f"--job-name {name!r}: expected a DNS-1123 label "
                          f"(lower-case letters, digits, '-', at most 63 characters)")


def pod_template(spec: LaunchSpec, opts: K8sOptions, *, command: list[str], args: list[str],
                 restart_policy: str | None = None) -> dict[str, Any]:
    """The core/v1 PodTemplateSpec every worker pod runs: one ``pytorch`` container running
    ``COMMAND ARGS`` with the GPUs (``nvidia.com/gpu`` = ``procs_per_node`` unless
    ``device = cpu``), CPU / memory, environment, claims and in-memory ``/dev/shm`` of ``opts``."""
    gpus = spec.device != "cpu"
    resources: dict[str, dict[str, Any]] = {"limits": {}, "requests": {}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = spec.procs_per_node
        resources["requests"]["nvidia.com/gpu"] = spec.procs_per_node
    for key, value in (("cpu", opts.cpu), ("memory", opts.memory)):
        if value:
            resources["limits"][key] = resources["requests"][key] = value
    mounts = [{"name": v.name, "mountPath": v.mount_path} for v in opts.volumes]
    volumes: list[dict[str, Any]] = [{"name": v.name, "persistentVolumeClaim": {"claimName": v.claim}}
                                     for v in opts.volumes]
    if opts.shm:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm}})
    env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"},
           *({"name": k, "value": v} for k, v in opts.env)]
    container = {"name": "pytorch", "image": opts.image, "command": command, "args": args, "env": env,
                 "resources": resources, "volumeMounts": mounts}
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if restart_policy is not None:
        pod["restartPolicy"] = restart_policy
    return {"metadata": {"labels": {"app.kubernetes.io/name": "lf", "lf/job": opts.job_name}}, "spec": pod}


def pytorchjob(spec: LaunchSpec, opts: K8sOptions) -> dict[str, Any]:
    """The PyTorchJob manifest as a dict (``json.dumps`` / ``yaml.safe_dump`` it).

    Raises:
        LaunchError: a job name that is not a DNS-1123 label.
    """
    check_job_name(opts.job_name)
    # The operator sets torchrun's PET_* variables (nodes, rendezvous endpoint, restarts) in every pod.
    replica = {"replicas": spec.nodes, "restartPolicy": "OnFailure",
               "template": pod_template(spec, opts, args=worker_args(spec),
                                           command=["python", "-m", "torch.distributed.run", "-m", "lf_orchestrator"])}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": opts.job_name, "namespace": opts.namespace},
            "spec": {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": spec.nodes,
                                       "maxReplicas": spec.nodes, "maxRestarts": spec.max_restarts},
                     "nprocPerNode": str(spec.procs_per_node),
                     "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": spec.max_restarts},
                     "pytorchReplicaSpecs": {"Worker": replica}}}
