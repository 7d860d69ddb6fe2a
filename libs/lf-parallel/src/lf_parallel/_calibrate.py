"""Achieved rates the cost model divides by: defaults from BENCH.md, or measured by a short microbenchmark.

Defaults are the H200 ceilings measured in ``BENCH.md`` (bf16 matmul 8192^3 785
TFLOP/s; SDPA cuDNN fwd+bwd 529 TFLOP/s causal and 562 full, FlexAttention 374 for
other masks, all on the FLOPs the mask keeps; device copy 4.23 TB/s read + write;
NCCL all-reduce 292 GB/s bus bandwidth) as fractions of the H200's datasheet peaks,
applied to any catalogue GPU. :func:`calibrate` measures the same four things on
the local GPU in a few seconds and caches them as JSON per device name and torch
version (``~/.cache/lf/calibration.json``, or ``LF_CACHE_DIR``). :func:`calibration_for` gives a cluster
the cached entry when this machine's GPU is the cluster's model (``lf plan`` and ``lf run``'s auto plan use it;
``lf plan --calibrate`` measures first).

Collectives inside a node (:class:`CommCalibration`) are measured in a process group
by :func:`lf_parallel._calibrate_comm.measure_collectives` and merged into
:attr:`Calibration.comm`; an entry holding them is cached under a key that also names
the group size and GPUs per node (bandwidth depends on how many GPUs share the links).
Cache entries written before the field existed load with ``comm=None``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec

from lf_parallel._atomic import write_text_atomic
from lf_parallel._cluster import Cluster, ClusterError, GPUSpec, _match_device

_H200_PEAK, _H200_HBM = 989.4, 4.8


class CommCalibration(msgspec.Struct, frozen=True, kw_only=True):
    """Alpha-beta figures of collectives inside one node, fitted to a microbenchmark.

    The model is :func:`lf_parallel._comm_model.collective_time`'s: ``steps * alpha + nbytes * factor / busbw``
    (NCCL bus-bandwidth factors, nccl-tests PERFORMANCE.md). Made by
    :func:`lf_parallel._calibrate_comm.fit_collectives`.
    """

    ranks: int
    """Group size the collectives ran on."""
    gpus_per_node: int
    """GPUs per node of the machine measured (the group stayed inside one node)."""
    alpha_us: dict[str, float]
    """Latency per step by measured kind (``all_gather``, ``reduce_scatter``, ``all_reduce``), microseconds."""
    busbw_gbps: dict[str, float]
    """Bus bandwidth by measured kind, GB/s (1e9 bytes/s)."""
    pooled_alpha_us: float
    """One alpha fitted to every kind's timings together, microseconds (used for kinds not measured)."""
    pooled_busbw_gbps: float
    """One bus bandwidth fitted to every kind's timings together, GB/s (used for kinds not measured)."""
    sizes: list[int] = []
    """Message sizes timed (the full, unsharded tensor), bytes."""
    times_s: dict[str, list[float]] = {}
    """The slowest rank's mean time per call, by kind, one per entry of ``sizes``, seconds."""
    source: str = ""
    """What was measured: backend, device, dtype, torch version."""

    def figures(self, kind: str) -> tuple[float, float]:
        """``(alpha_us, busbw_gbps)`` for collective ``kind``: its own fit if measured, else the pooled one."""
        if kind in self.alpha_us and kind in self.busbw_gbps:
            return self.alpha_us[kind], self.busbw_gbps[kind]
        return self.pooled_alpha_us, self.pooled_busbw_gbps


class Calibration(msgspec.Struct, frozen=True, kw_only=True):
    """Achieved rates on one GPU model (what the cost model divides work by)."""

    matmul_tflops: float
    """Large bf16 matmul, TFLOP/s."""
    attention_tflops: dict[str, float]
    """Attention fwd+bwd by mask class (``causal``, ``full``, ``masked``), TFLOP/s on the kept FLOPs
    (3.5x the forward's, as BENCH.md counts)."""
    copy_tbps: float
    """Device-to-device copy, TB/s of bytes read plus written (element-wise ops run at this)."""
    elementwise_share: float = 0.5
    """Share of a node's ``forward_bytes`` moved by element-wise kernels, not hidden under matmuls
    (norms, RoPE, activations, residual adds: 48% of a Llama-3-8B block's traffic)."""
    model_efficiency: float = 0.76
    """Achieved share of the rates above inside a real training step (shapes, launches, allocator, eager
    element-wise chains); fitted once to BENCH.md's plain FSDP2 Llama-3-8B step on 2 H200s (full AC,
    eager: 7,333 tokens/s/GPU). The GPU check ``bench/autotune_check.py`` measures it again."""
    kernel_overhead_us: float = 25.0
    """Launch and tail cost per node per pass (forward or backward), microseconds."""
    alpha_us: float = 15.0
    """Latency per collective step (alpha of the alpha-beta model), microseconds; inside a node :attr:`comm`
    replaces it when measured."""
    host_overhead_us_per_segment: float = 186.0
    """Host and launch cost of attention run one segment at a time (Qwen2-VL: each image in the ViT, each packed
    sample in the decoder; :mod:`lf_parallel._mm_cost`), per segment, per block, per pass (forward, backward,
    recomputed forward), microseconds. Fitted (relative least squares) to ``bench/results/qwen2_vl_peer_h200x2.json``:
    Qwen2-VL-7B under ``zero=3,dp=2`` on 2 H200, the slowest rank's packed row (8,192 tokens, 13 samples of one
    image each, 14,720 patches), step 1.579 s with every block recomputed and 1.216 s with the ViT's only; the
    rest of the model predicts 1.089 s and 0.888 s, and 186 us leaves -3.5% and +3.2% (without it: -31% and -27%;
    ``tests/test_cost_model_mm.py`` checks it). Measured with one image per sample, so images and samples share
    one constant."""
    host_us_per_launch: float = 65.0
    """Host time per kernel launch issued from Python (a block's forward, a recomputed forward, the model's glue),
    microseconds: module calls, autocast casts and autograd recording around each ATen op
    (:mod:`lf_parallel._host_cost`). Fitted together with the two below (grid search, smallest largest |error|)
    to the eight Qwen2-VL 8 + 7 layers rows on one H200 (``bench/results/autotune_qwen2_vl_h200.json``: micro-batch
    1 / 2 x recompute none / selective / full; ``step_anatomy_qwen_h200.json``: none, fused ops off), the
    host-bound model, as first committed (its sweep ran before lf-memory 0.4.4 and a gc fix); errors then -13% to
    +10% (were -18% to -64%); on the sweep re-measured afterwards -8.1% to +15.0%. GPU-bound Llama-3 and
    Wan2.1 rows do not move (their launches take 8% of the GPU time). ``scripts/host_cost_check.py`` prints it."""
    host_us_per_backward_launch: float = 30.0
    """Host time per kernel launch of the backward pass (the C++ autograd engine), microseconds. Fitted
    with :attr:`host_us_per_launch`."""
    host_us_per_sac_launch: float = 40.0
    """Extra host time per forward or recomputed op of a block under ``selective`` recompute (the selective
    checkpoint's Python ``TorchDispatchMode`` sees every op), microseconds. Fitted with
    :attr:`host_us_per_launch`."""
    source: str = "defaults"
    """``"defaults"`` (BENCH.md ratios) or ``"measured <device>, torch <version>"``."""
    comm: CommCalibration | None = None
    """Measured intra-node collectives (alpha and bus bandwidth per kind); ``None``: ``alpha_us`` and the GPU
    catalogue's ``nvlink_busbw_gbps``."""


def default_calibration(gpu: GPUSpec) -> Calibration:
    """BENCH.md's H200 ratios (achieved / peak) applied to ``gpu``'s datasheet peaks."""
    scale = gpu.bf16_tflops / _H200_PEAK
    return Calibration(matmul_tflops=785.0 * scale,
                       attention_tflops={"causal": 529.0 * scale, "full": 562.0 * scale, "masked": 374.0 * scale},
                       copy_tbps=4.23 * gpu.hbm_tbps / _H200_HBM)


def cache_path() -> Path:
    """Where measured calibrations are kept (``$LF_CACHE_DIR/calibration.json``, default ``~/.cache/lf``)."""
    return Path(os.environ.get("LF_CACHE_DIR", Path.home() / ".cache" / "lf")) / "calibration.json"


def _key(device_name: str, torch_version: str, ranks: int | None = None, gpus_per_node: int | None = None) -> str:
    key = f"{device_name} | torch {torch_version}"
    return key if ranks is None else f"{key} | comm {ranks} ranks, {gpus_per_node} GPUs/node"


def load_calibration(gpu: GPUSpec, device_name: str | None = None, path: Path | None = None, *,
                     gpus_per_node: int | None = None, comm_ranks: int | None = None) -> Calibration:
    """The cached measurement for ``device_name`` and this torch, else :func:`default_calibration`.

    With ``gpus_per_node``, an entry whose collectives were measured on ``comm_ranks`` ranks (default: the whole
    node) of such a node is preferred; else the entry without collectives.
    """
    import torch

    path = path or cache_path()
    if device_name and path.is_file():
        data = json.loads(path.read_text())
        keys = [_key(device_name, torch.__version__)]
        if gpus_per_node is not None:
            keys.insert(0, _key(device_name, torch.__version__, comm_ranks or gpus_per_node, gpus_per_node))
        for key in keys:
            if data.get(key) is not None:
                return msgspec.convert(data[key], Calibration)
    return default_calibration(gpu)


def calibration_for(cluster: Cluster, *, device_name: str | None = None, path: Path | None = None) -> Calibration:
    """The rates to plan ``cluster`` with: this machine's cached measurement when its GPU is the cluster's model.

    ``device_name`` (default: ``torch.cuda.get_device_name(0)`` when CUDA is available) is mapped to a catalogue
    GPU as :func:`lf_parallel.detect_cluster` maps it; when that is ``cluster.gpu`` and :func:`load_calibration`
    finds an entry (one with collectives measured on a node of ``cluster.gpus_per_node`` GPUs preferred), it is
    returned. Otherwise (no CUDA, a GPU outside the catalogue, planning ahead for another model, nothing cached)
    :func:`default_calibration` of ``cluster.gpu``: an H200's measurement never prices an A100 plan.

    Example::

        cal = calibration_for(make_cluster(gpus=8, gpu="h200"), device_name="NVIDIA H200")
        print(cal.source)  # "defaults" until calibrate() has run on an H200 with this torch
    """
    if device_name is None:
        import torch

        if not torch.cuda.is_available():
            return default_calibration(cluster.gpu)
        device_name = torch.cuda.get_device_name(0)
    try:
        local = _match_device(device_name)
    except ClusterError:
        return default_calibration(cluster.gpu)
    if local.name != cluster.gpu.name:
        return default_calibration(cluster.gpu)
    return load_calibration(cluster.gpu, device_name, path, gpus_per_node=cluster.gpus_per_node)


def save_calibration(cal: Calibration, device_name: str, path: Path | None = None) -> Path:
    """Add ``cal`` to the JSON cache under ``device_name`` and this torch version; returns the file.

    With measured collectives (``cal.comm``) the key also names their group size and GPUs per node.
    """
    import torch

    path = path or cache_path()
    data = json.loads(path.read_text()) if path.is_file() else {}
    comm = cal.comm
    key = _key(device_name, torch.__version__, *((comm.ranks, comm.gpus_per_node) if comm else ()))
    data[key] = msgspec.to_builtins(cal)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=1))


def _timed(fn, repeats: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def calibrate(*, size: int = 8192, seq: int = 8192, repeats: int = 10, save: bool = True) -> Calibration:
    """Measure matmul, attention (causal and full, fwd+bwd) and copy rates on ``cuda:0``; cache them.

    Raises:
        RuntimeError: no CUDA device.
    """
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise RuntimeError("calibrate() needs a CUDA device; on the CPU the BENCH.md defaults are used")
    dev = torch.device("cuda", 0)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    matmul = 2 * size ** 3 / _timed(lambda: a @ a, repeats) / 1e12
    q, k, v = (torch.randn(1, 32, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    rates = {}
    for kind, causal in (("causal", True), ("full", False)):
        def step(causal=causal):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
        kept = 0.5 if causal else 1.0
        rates[kind] = 3.5 * 4 * seq * seq * 32 * 128 * kept / _timed(step, repeats) / 1e12
    rates["masked"] = rates["causal"] * 374.0 / 529.0
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / _timed(lambda: dst.copy_(src), repeats) / 1e12
    name = torch.cuda.get_device_name(dev)
    cal = Calibration(matmul_tflops=matmul, attention_tflops=rates, copy_tbps=copy,
                      source=f"measured {name}, torch {torch.__version__}")
    if save:
        save_calibration(cal, name)
    return cal
