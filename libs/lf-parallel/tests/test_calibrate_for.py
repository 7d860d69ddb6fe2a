"""Which rates a cluster is planned with: :func:`calibration_for` and the cache it reads.

Oracles: a cache file written here by hand (JSON under the documented ``"<device> | torch <version>"`` keys, not
through ``save_calibration``); the catalogue GPU ``detect_cluster`` would map the device name to; and the step's
compute time from the IR's own FLOP counts (Llama-3-8B): halving the matmul rate adds exactly the matmul FLOPs
(forward + backward, 3x the forward's part linear in the sequence) over the default rate.
"""

from __future__ import annotations

import json

import msgspec
import pytest
import torch

from lf_ir.recipes import llama3
from lf_parallel import Calibration, calibration_for, default_calibration, make_cluster, step_cost
from lf_parallel._calibrate import CommCalibration
from lf_parallel._plan import Plan

DEVICE = "Fake H200 Test"  # maps to the catalogue's h200, as detect_cluster maps "NVIDIA H200"
SEQ = 2048


def _entry(cal: Calibration) -> dict:
    return msgspec.to_builtins(cal)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """LF_CACHE_DIR with one entry for DEVICE (matmul at half the default) and one with collectives measured on a
    node of 8 GPUs; returns (plain, with_comm)."""
    monkeypatch.setenv("LF_CACHE_DIR", str(tmp_path))
    base = default_calibration(make_cluster(gpus=1, gpu="h200").gpu)
    plain = msgspec.structs.replace(base, matmul_tflops=base.matmul_tflops / 2,
                                    source=f"measured {DEVICE}, torch {torch.__version__}")
    comm = CommCalibration(ranks=8, gpus_per_node=8, alpha_us={"all_reduce": 9.0}, busbw_gbps={"all_reduce": 300.0},
                           pooled_alpha_us=9.0, pooled_busbw_gbps=300.0)
    with_comm = msgspec.structs.replace(plain, copy_tbps=3.0, comm=comm)
    key = f"{DEVICE} | torch {torch.__version__}"
    (tmp_path / "calibration.json").write_text(json.dumps({
        key: _entry(plain), f"{key} | comm 8 ranks, 8 GPUs/node": _entry(with_comm)}))
    return plain, with_comm


def test_cached_entry_only_for_its_gpu_model_and_device(cache):
    plain, with_comm = cache
    h200_2, h200_8 = make_cluster(gpus=2, gpu="h200"), make_cluster(gpus=8, gpu="h200")
    assert calibration_for(h200_2, device_name=DEVICE) == plain
    assert calibration_for(h200_8, device_name=DEVICE) == with_comm  # the node's measured collectives preferred
    assert calibration_for(h200_8, device_name=DEVICE).comm.busbw_gbps == {"all_reduce": 300.0}
    # Planning ahead for another model on this machine: that model's defaults, never the H200's measurement.
    a100 = make_cluster(gpus=8, gpu="a100-80g")
    assert calibration_for(a100, device_name=DEVICE) == default_calibration(a100.gpu)
    assert calibration_for(a100, device_name=DEVICE).source == "defaults"
    # Another H200 name without an entry, a GPU outside the catalogue: the defaults.
    assert calibration_for(h200_2, device_name="NVIDIA H200") == default_calibration(h200_2.gpu)
    assert calibration_for(h200_2, device_name="Some TPU") == default_calibration(h200_2.gpu)


def test_cached_rates_change_the_predicted_step(cache):
    plain, _ = cache
    cluster = make_cluster(gpus=1, gpu="h200")
    graph = llama3.build_graph(llama3.llama3_config("8B"), SEQ)
    plan = Plan(dp=1, micro_batch=1, grad_accum=1, precision="bf16")
    default = step_cost(graph, plan, cluster, seq=SEQ, calibration=default_calibration(cluster.gpu))
    cached = step_cost(graph, plan, cluster, seq=SEQ, calibration=calibration_for(cluster, device_name=DEVICE))
    mm = 0.0  # forward matmul FLOPs: the part of each node's FLOPs linear in the sequence
    for node in graph.components[0].nodes:
        f1, f2 = node.forward_flops(1, SEQ), node.forward_flops(1, 2 * SEQ)
        mm += f1 - max((f2 - 2 * f1) / 2, 0.0)
    rate = plain.model_efficiency * 2 * plain.matmul_tflops * 1e12  # the default (undivided) matmul rate
    assert mm > 0
    assert cached.compute_s - default.compute_s == pytest.approx(3 * mm / rate, rel=1e-9)
    # The step rises by at most that: part of the extra GPU time can hide the host's kernel launches.
    assert 0 < cached.step_s - default.step_s <= cached.compute_s - default.compute_s
