"""The cluster a plan runs on: GPU model, count, memory, NVLink domain and inter-node bandwidth.

Either detected on the running machine (:func:`detect_cluster`: CUDA device
properties, and nodes from the launcher's environment: torchrun's
``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` or Slurm's ``SLURM_NNODES``) or described for
planning ahead (:func:`make_cluster`, e.g. 64 x ``a100-80g`` with 8 per node and
200 Gbit/s per GPU between nodes). :data:`GPU_CATALOGUE` holds datasheet peaks
(dense bf16 tensor-core TFLOP/s, HBM TB/s) and an intra-node all-reduce bus
bandwidth; the H200's bus bandwidth is the one measured in ``BENCH.md``.
"""

from __future__ import annotations

import os

import msgspec

GIB = 1024 ** 3


class ClusterError(ValueError):
    """A cluster description that cannot be used; the message names the option and the value."""


class GPUSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU model's datasheet figures."""

    name: str
    """Catalogue key, e.g. ``"h200"``."""
    memory_gib: float
    """Device memory, GiB."""
    bf16_tflops: float
    """Dense bf16 tensor-core peak, TFLOP/s (the MFU denominator)."""
    hbm_tbps: float
    """HBM bandwidth, TB/s."""
    nvlink_busbw_gbps: float
    """All-reduce bus bandwidth inside one node (NVLink/NVSwitch or PCIe), GB/s."""


GPU_CATALOGUE: dict[str, GPUSpec] = {s.name: s for s in (
    GPUSpec(name="h200", memory_gib=139.8, bf16_tflops=989.4, hbm_tbps=4.8, nvlink_busbw_gbps=292.0),
    GPUSpec(name="h100", memory_gib=79.1, bf16_tflops=989.4, hbm_tbps=3.35, nvlink_busbw_gbps=292.0),
    GPUSpec(name="h100-pcie", memory_gib=79.1, bf16_tflops=756.0, hbm_tbps=2.0, nvlink_busbw_gbps=25.0),
    GPUSpec(name="a100-80g", memory_gib=79.1, bf16_tflops=312.0, hbm_tbps=2.04, nvlink_busbw_gbps=230.0),
    GPUSpec(name="a100-40g", memory_gib=39.4, bf16_tflops=312.0, hbm_tbps=1.56, nvlink_busbw_gbps=230.0),
    GPUSpec(name="l40s", memory_gib=44.4, bf16_tflops=362.0, hbm_tbps=0.86, nvlink_busbw_gbps=22.0),
    GPUSpec(name="b200", memory_gib=178.4, bf16_tflops=2250.0, hbm_tbps=8.0, nvlink_busbw_gbps=650.0),
)}
"""GPU model -> :class:`GPUSpec` (SXM parts unless the name says PCIe)."""


class Cluster(msgspec.Struct, frozen=True, kw_only=True):
    """GPUs of a job: how many, which, grouped in nodes of ``gpus_per_node``."""

    gpu: GPUSpec
    """The GPU model (all GPUs alike)."""
    gpus: int
    """GPUs in the job."""
    gpus_per_node: int
    """GPUs joined by NVLink in one node."""
    inter_node_gbps: float = 400.0
    """Network bandwidth between nodes per GPU (its NIC), Gbit/s (e.g. 400 for NDR InfiniBand)."""

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def memory_bytes(self) -> int:
        return int(self.gpu.memory_gib * GIB)

    def describe(self) -> str:
        """One line, e.g. ``1024 x h100 (128 nodes of 8, 400 Gbit/s per GPU between nodes)``."""
        return (f"{self.gpus} x {self.gpu.name} ({self.nodes} node{'s' * (self.nodes > 1)} of {self.gpus_per_node}, "
                f"{self.inter_node_gbps:g} Gbit/s per GPU between nodes)")


def gpu_spec(name: str) -> GPUSpec:
    """The catalogue entry for ``name`` (case and ``-sxm`` suffix ignored).

    Raises:
        ClusterError: unknown GPU, listing the catalogue.
    """
    key = name.lower().replace("_", "-").removesuffix("-sxm")
    if key not in GPU_CATALOGUE:
        raise ClusterError(f"--gpu: unknown GPU {name!r}; expected one of {sorted(GPU_CATALOGUE)}")
    return GPU_CATALOGUE[key]


def make_cluster(*, gpus: int, gpu: str = "h100", gpus_per_node: int | None = None,
                 inter_node_gbps: float = 400.0) -> Cluster:
    """A cluster described for planning ahead.

    Raises:
        ClusterError: non-positive counts or bandwidth, ``gpus`` not a multiple of
            ``gpus_per_node`` (when larger than one node), or an unknown GPU.

    Example:
        >>> make_cluster(gpus=64, gpu="a100-80g", gpus_per_node=8, inter_node_gbps=200).nodes
        8
    """
    per_node = gpus_per_node or min(gpus, 8)
    for key, value in (("--gpus", gpus), ("--gpus-per-node", per_node), ("--inter-node-gbps", inter_node_gbps)):
        if not value > 0:
            raise ClusterError(f"{key} must be positive, got {value}")
    if gpus > per_node and gpus % per_node:
        raise ClusterError(f"--gpus {gpus} is not a multiple of --gpus-per-node {per_node}")
    return Cluster(gpu=gpu_spec(gpu), gpus=gpus, gpus_per_node=min(per_node, gpus), inter_node_gbps=inter_node_gbps)


def _match_device(device_name: str) -> GPUSpec:
    name = device_name.lower()
    for key, fragment in (("h200", "h200"), ("b200", "b200"), ("h100-pcie", "h100 pcie"), ("h100", "h100"),
                          ("l40s", "l40s")):
        if fragment in name:
            return GPU_CATALOGUE[key]
    if "a100" in name:
        return GPU_CATALOGUE["a100-80g" if "80" in name else "a100-40g"]
    raise ClusterError(f"detected GPU {device_name!r} is not in the catalogue; give --gpu, one of "
                       f"{sorted(GPU_CATALOGUE)}")


def detect_cluster(env: dict[str, str] | None = None) -> Cluster:
    """The cluster this process runs in: the local CUDA devices and the launcher's node count.

    Nodes come from ``WORLD_SIZE / LOCAL_WORLD_SIZE`` (torchrun) or ``SLURM_NNODES``;
    otherwise one node. Memory is the device's own total, not the catalogue's.

    Raises:
        ClusterError: no CUDA device (say ``--gpus`` and ``--gpu`` to plan ahead).
    """
    import torch

    env = dict(os.environ) if env is None else env
    if not torch.cuda.is_available():
        raise ClusterError("no CUDA device detected; describe the cluster with --gpus N --gpu NAME "
                           f"(one of {sorted(GPU_CATALOGUE)})")
    props = torch.cuda.get_device_properties(0)
    spec = msgspec.structs.replace(_match_device(props.name), memory_gib=props.total_memory / GIB)
    local = int(env.get("LOCAL_WORLD_SIZE", torch.cuda.device_count()))
    nodes = int(env.get("SLURM_NNODES", 0)) or max(int(env.get("WORLD_SIZE", local)) // max(local, 1), 1)
    return Cluster(gpu=spec, gpus=local * nodes, gpus_per_node=local,
                   inter_node_gbps=float(env.get("LF_INTER_NODE_GBPS", 400.0)))
