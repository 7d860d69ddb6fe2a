"""The Kubernetes backend without the Kubeflow operator: a ``JobSet`` (``jobset.x-k8s.io/v1alpha2``) manifest.

Spec followed: the JobSet CRD ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`` and its API
reference (https://github.com/kubernetes-sigs/jobset, site/content/en/docs/reference/jobset.v1alpha2.md).

One replicated job (``workers``, one Job) of ``nodes`` pods with indexed completion. ``network.enableDNSHostnames``
gives every pod the stable name ``<jobset>-workers-0-<index>.<jobset>`` through the JobSet's headless service, so
pod index 0 serves torchrun's c10d rendezvous and every pod reaches it by that name; the Job controller puts the
pod index in ``JOB_COMPLETION_INDEX`` (torchrun's c10d rendezvous assigns the node ranks itself). A failed pod
fails its Job (``backoffLimit`` 0, ``restartPolicy: Never``); ``failurePolicy.maxRestarts`` then recreates the whole
set, and the new workers resume the run folder (named after the JobSet) from its latest checkpoint. Resources,
environment and volumes are the PyTorchJob writer's (:func:`lf_orchestrator.launch._k8s.pod_template`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from lf_orchestrator.launch._k8s import K8sOptions, check_job_name, pod_template
from lf_orchestrator.launch._spec import LaunchSpec, torchrun_args

REPLICATED_JOB = "workers"
"""Name of the one replicated job (part of every pod's host name)."""
RDZV_PORT = 29500
"""c10d rendezvous port on pod index 0."""


def rendezvous_host(job_name: str) -> str:
    """DNS name of pod index 0 through the JobSet's headless service (``network.subdomain`` = the JobSet name)."""
    return f"{job_name}-{REPLICATED_JOB}-0-0.{job_name}"


def jobset(spec: LaunchSpec, opts: K8sOptions) -> dict[str, Any]:
    """The JobSet manifest as a dict (``json.dumps`` / ``yaml.safe_dump`` it).

    Raises:
        LaunchError: a job name that is not a DNS-1123 label.
    """
    check_job_name(opts.job_name)
    endpoint = f"{rendezvous_host(opts.job_name)}:{RDZV_PORT}" if spec.nodes > 1 else ""
    spec = msgspec.structs.replace(spec, rdzv_endpoint=endpoint, rdzv_id=opts.job_name)
    pod = pod_template(spec, opts, command=["python", "-m", "torch.distributed.run"], args=torchrun_args(spec),
                       restart_policy="Never")
    job = {"metadata": {"labels": {"app.kubernetes.io/name": "lf", "lf/job": opts.job_name}},
           "spec": {"parallelism": spec.nodes, "completions": spec.nodes, "completionMode": "Indexed",
                    "backoffLimit": 0, "template": pod}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": opts.job_name, "namespace": opts.namespace,
                         "labels": {"app.kubernetes.io/name": "lf"}},
            "spec": {"network": {"enableDNSHostnames": True, "subdomain": opts.job_name},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
                     "failurePolicy": {"maxRestarts": spec.max_restarts},
                     "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": job}]}}
