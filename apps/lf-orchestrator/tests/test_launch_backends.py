"""`lf launch --backend slurm | kubernetes`: the sbatch script and the PyTorchJob manifest.

Oracles: bash runs the sbatch script with ``srun`` / ``scontrol`` stubs and torchrun's own argument
parser reads what srun would start; the manifest validates against the PyTorchJob CRD's schema
(``data/pytorchjob_v1_schema.json``, its source named inside) with ``jsonschema``. With Slurm installed
and a cluster answering (``scripts/ci-slurm.sh`` starts one on localhost), a 2-process CPU job runs to
completion through ``sbatch``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lf_orchestrator.cli import app

SCHEMA = Path(__file__).parent / "data" / "pytorchjob_v1_schema.json"


def _sbatch(tiny_config, *extra) -> str:
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--backend", "slurm", "--dry-run", *extra])
    assert res.exit_code == 0, res.output
    return res.stdout


def _run_with_stubs(script: str, tmp_path: Path, nodes: str) -> list[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "srun").write_text(f'#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n')
    (stubs / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_NNODES=nodes,
               SLURM_JOB_NODELIST="node-[a-b]")
    res = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("nodes", [1, 2])
def test_sbatch_script_runs_torchrun_with_the_slurm_rendezvous(tiny_config, tmp_path, nodes):
    from torch.distributed.run import get_args_parser

    script = _sbatch(tiny_config, "--nodes", str(nodes), "--gpus-per-node", "4", "--max-restarts", "2",
                     "--partition", "gpu", "--time", "01:00:00", "--requeue", "--set", "train.steps=9")
    head = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert f"#SBATCH --nodes={nodes}" in head and "#SBATCH --ntasks-per-node=1" in head
    assert "#SBATCH --gpus-per-node=4" in head and "#SBATCH --partition=gpu" in head
    assert "#SBATCH --requeue" in head and "#SBATCH --time=01:00:00" in head
    srun = _run_with_stubs(script, tmp_path, str(nodes))
    assert srun[:2] == ["--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    argv = srun[2:]
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    a = get_args_parser().parse_args(argv[3:])
    assert (a.nnodes, a.nproc_per_node, a.max_restarts) == (str(nodes), "4", 2)
    if nodes == 1:
        assert a.standalone
    else:
        assert (a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id) == ("c10d", "node-a:29500", "4242")
    assert a.training_script == "lf_orchestrator" and a.module
    assert a.training_script_args == ["run", str(tiny_config.resolve()), "--run-dir",
                                      str(tiny_config.parent / "runs" / "tiny-4242"), "--set", "train.steps=9"]


def test_sbatch_cpu_requests_no_gpus(tiny_config):
    script = _sbatch(tiny_config, "--gpus-per-node", "2", "--device", "cpu")
    assert "--gpus-per-node" not in script and "--nproc-per-node 2" in script


def _manifest(tiny_config, *extra):
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--backend", "kubernetes", "--dry-run",
                                   "--image", "ghcr.io/lf/lf:0.2", *extra])
    assert res.exit_code == 0, res.output
    return yaml.safe_load(res.stdout)


def test_pytorchjob_manifest_validates_against_the_crd_schema(tiny_config):
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    m = _manifest(tiny_config, "--nodes", "4", "--gpus-per-node", "8", "--max-restarts", "3", "--run-id", "vla-7",
                  "--cpu", "64", "--memory", "512Gi", "--env", "NCCL_DEBUG=WARN", "--volume", "runs:/mnt/runs",
                  "--namespace", "ml")
    jsonschema.validate(m, schema)
    spec = m["spec"]
    assert spec["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 4, "maxReplicas": 4, "maxRestarts": 3}
    assert spec["nprocPerNode"] == "8" and m["metadata"] == {"name": "vla-7", "namespace": "ml"}
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4
    (c,) = worker["template"]["spec"]["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi"}
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in c["env"]
    assert {"name": "runs", "mountPath": "/mnt/runs"} in c["volumeMounts"]
    assert c["args"][:4] == ["run", str(tiny_config), "--run-dir", f"{tiny_config.parent / 'runs'}/tiny-vla-7"]
    # the schema can fail: a misspelt field and a wrong restart policy are caught
    for path, value in ((("restartPolicy",), "Sometimes"), (("template", "spec", "containers", 0, "imagee"), "x")):
        bad = json.loads(json.dumps(m))
        node = bad["spec"]["pytorchReplicaSpecs"]["Worker"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


JOBSET_SCHEMA = Path(__file__).parent / "data" / "jobset_v1alpha2_schema.json"


def test_jobset_manifest_validates_and_runs_torchrun_through_the_headless_service(tiny_config):
    """Oracles: the JobSet CRD's schema (``data/jobset_v1alpha2_schema.json``) and torchrun's own argument parser
    reading the container's command line: 4 indexed pods, c10d rendezvous at pod 0's stable host name."""
    import jsonschema
    from torch.distributed.run import get_args_parser

    schema = json.loads(JOBSET_SCHEMA.read_text())
    m = _manifest(tiny_config, "--kind", "jobset", "--nodes", "4", "--gpus-per-node", "8", "--max-restarts", "3",
                  "--run-id", "vla-7", "--cpu", "64", "--memory", "512Gi", "--env", "NCCL_DEBUG=WARN",
                  "--volume", "runs:/mnt/runs", "--namespace", "ml")
    jsonschema.validate(m, schema)
    assert (m["apiVersion"], m["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert m["metadata"]["name"] == "vla-7" and m["metadata"]["namespace"] == "ml"
    spec = m["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "vla-7"}
    assert spec["failurePolicy"] == {"maxRestarts": 3}
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["workers"]}
    (rjob,) = spec["replicatedJobs"]
    assert rjob["name"] == "workers" and rjob["replicas"] == 1
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (4, 4, "Indexed", 0)
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in c["env"]
    assert {"name": "runs", "mountPath": "/mnt/runs"} in c["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert c["command"] == ["python", "-m", "torch.distributed.run"]
    a = get_args_parser().parse_args(c["args"])
    assert (a.nnodes, a.nproc_per_node, a.max_restarts) == ("4", "8", 3) and not a.standalone
    assert (a.rdzv_backend, a.rdzv_endpoint, a.rdzv_id) == ("c10d", "vla-7-workers-0-0.vla-7:29500", "vla-7")
    assert a.module and a.training_script == "lf_orchestrator"
    assert a.training_script_args[:4] == ["run", str(tiny_config), "--run-dir",
                                          f"{tiny_config.parent / 'runs'}/tiny-vla-7"]


def test_jobset_schema_rejects_broken_manifests(tiny_config):
    """The schema can fail: each of these edits of a valid manifest is caught."""
    import jsonschema

    schema = json.loads(JOBSET_SCHEMA.read_text())
    m = _manifest(tiny_config, "--kind", "jobset", "--nodes", "2", "--run-id", "vla-8")
    jsonschema.validate(m, schema)
    job = ("spec", "replicatedJobs", 0, "template", "spec")
    edits = [(("apiVersion",), "jobset.x-k8s.io/v1"),
             ((*job, "completionMode"), "Sometimes"),
             ((*job, "template", "spec", "restartPolicy"), "Always"),  # Job pods: Never / OnFailure only
             ((*job, "template", "spec", "containers", 0, "imagee"), "x"),
             (("spec", "successPolicy", "operator"), "Most"),
             (("spec", "failurePolicy", "maxRestarts"), "3"),
             (("spec", "replicatedJobs", 0, "replicaz"), 2),
             (("spec", "networking"), {})]
    for path, value in edits:
        bad = json.loads(json.dumps(m))
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    del m["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    with pytest.raises(jsonschema.ValidationError, match="'template' is a required property"):
        jsonschema.validate(m, schema)


def test_jobset_one_node_cpu_and_written_file(tiny_config, tmp_path):
    """One CPU node: torchrun --standalone, no GPUs requested; without --dry-run the manifest goes to --output."""
    m = _manifest(tiny_config, "--kind", "jobset", "--device", "cpu", "--gpus-per-node", "2")
    c = m["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"] and "--standalone" in c["args"]
    out = tmp_path / "job.yaml"
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--backend", "kubernetes", "--kind", "jobset",
                                   "--image", "ghcr.io/lf/lf:0.2", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(out.read_text())["kind"] == "JobSet"
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--kind", "jobset", "--dry-run"])
    assert res.exit_code == 2 and "--kind jobset: only with --backend kubernetes" in res.output


def test_kubernetes_needs_an_image_and_a_dns_name(tiny_config):
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--backend", "kubernetes", "--dry-run"])
    assert res.exit_code == 2 and "--image" in res.output
    res = CliRunner().invoke(app, ["launch", str(tiny_config), "--backend", "kubernetes", "--dry-run",
                                   "--image", "x", "--run-id", "Bad_Name"])
    assert res.exit_code == 2 and "DNS-1123" in res.output and "Bad_Name" in res.output


def _slurm_up() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return res.returncode == 0 and "idle" in res.stdout


@pytest.mark.skipif(not _slurm_up(), reason="no Slurm cluster answering (run scripts/ci-slurm.sh)")
def test_slurm_runs_a_two_process_job_to_completion(tiny_config):
    res = subprocess.run([sys.executable, "-m", "lf_orchestrator", "launch", str(tiny_config), "--backend", "slurm",
                          "--nproc-per-node", "2", "--device", "cpu", "--set", "eval.at_end=false",
                          "--set", "run.threads=1"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    deadline = time.time() + 300
    while time.time() < deadline:
        state = subprocess.run(["sacct", "-n", "-X", "-j", job, "-o", "State"], capture_output=True, text=True)
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip()
        if not queued and (state.returncode != 0 or state.stdout.strip() not in ("PENDING", "RUNNING", "")):
            break
        time.sleep(1)
    run_dir = tiny_config.parent / "runs" / f"tiny-{job}"
    log = "\n".join(p.read_text() for p in (tiny_config.parent / "runs").glob(f"slurm-*-{job}.out"))
    assert (run_dir / "checkpoints" / "latest").is_file(), log[-3000:]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000006", log[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 2
