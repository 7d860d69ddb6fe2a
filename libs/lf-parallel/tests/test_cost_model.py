"""Cluster catalogue, calibration cache, alpha-beta collectives, bubbles and the step-cost model.

Oracles: the alpha-beta and bubble formulas written out by hand in float64; the
IR's FLOP totals with every rate set equal (so compute time is FLOPs over rate,
computed here independently of the cost model's split into matmul and attention);
and orderings that must hold (recomputing more costs time and saves memory).
"""

from __future__ import annotations

import math

import msgspec
import pytest
import torch

from lf_ir.recipes import llama3
from lf_parallel._calibrate import Calibration, default_calibration, load_calibration, save_calibration
from lf_parallel._cluster import ClusterError, detect_cluster, gpu_spec, make_cluster
from lf_parallel._comm_model import bubble_fraction, bubble_micro_batches, collective_time, mesh_strides
from lf_parallel._cost_model import step_cost
from lf_parallel._plan import Plan

SEQ = 64


def _flat_cal(rate: float = 1e12) -> Calibration:
    """Every rate equal, no element-wise share, overhead or efficiency loss."""
    tf = rate / 1e12
    return Calibration(matmul_tflops=tf, attention_tflops={"causal": tf, "full": tf, "masked": tf},
                       copy_tbps=1e6, elementwise_share=0.0, kernel_overhead_us=0.0, alpha_us=0.0,
                       model_efficiency=1.0)


def test_catalogue_and_cluster_errors():
    """Oracle: datasheet values and the options' constraints."""
    assert gpu_spec("H100-SXM").bf16_tflops == 989.4
    cl = make_cluster(gpus=64, gpu="a100-80g", gpus_per_node=8, inter_node_gbps=200)
    assert (cl.nodes, cl.gpus_per_node) == (8, 8) and "64 x a100-80g" in cl.describe()
    with pytest.raises(ClusterError, match="unknown GPU 'tpu'"):
        make_cluster(gpus=8, gpu="tpu")
    with pytest.raises(ClusterError, match="--gpus 12 is not a multiple of --gpus-per-node 8"):
        make_cluster(gpus=12, gpus_per_node=8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_detect_without_gpu_says_how_to_plan_ahead():
    """Oracle: on a CPU machine detection fails naming --gpus and --gpu."""
    with pytest.raises(ClusterError, match="--gpus N --gpu NAME"):
        detect_cluster({})


def test_calibration_defaults_and_cache(tmp_path):
    """Oracle: BENCH.md's H200 numbers as defaults; a saved calibration reads back equal."""
    h200 = default_calibration(gpu_spec("h200"))
    assert h200.matmul_tflops == pytest.approx(785.0) and h200.attention_tflops["causal"] == pytest.approx(529.0)
    assert default_calibration(gpu_spec("a100-80g")).matmul_tflops == pytest.approx(785.0 * 312 / 989.4)
    path = tmp_path / "cal.json"
    measured = msgspec.structs.replace(h200, matmul_tflops=700.0, source="measured test")
    save_calibration(measured, "NVIDIA H200", path)
    assert load_calibration(gpu_spec("h200"), "NVIDIA H200", path) == measured
    assert load_calibration(gpu_spec("h200"), "other", path) == h200


def test_collectives_alpha_beta():
    """Oracle: steps * alpha + bytes * NCCL bus factor / bandwidth, NVLink inside a node, the NIC outside."""
    cl = make_cluster(gpus=16, gpu="h100", gpus_per_node=8, inter_node_gbps=400)
    cal = msgspec.structs.replace(default_calibration(cl.gpu), alpha_us=10.0)
    nv, nic = 292e9, 400 / 8 * 1e9 * 0.8
    assert collective_time("all_reduce", 1e9, 8, cluster=cl, calibration=cal) == pytest.approx(
        14 * 10e-6 + 1e9 * 2 * 7 / 8 / nv)
    assert collective_time("all_gather", 1e9, 16, cluster=cl, calibration=cal) == pytest.approx(
        15 * 10e-6 + 1e9 * 15 / 16 / nic)
    assert collective_time("p2p", 1e6, 2, cluster=cl, calibration=cal, span=16) == pytest.approx(10e-6 + 1e6 / nic)
    assert collective_time("all_to_all", 1e9, 1, cluster=cl, calibration=cal) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time("gossip", 1.0, 2, cluster=cl, calibration=cal)
    assert mesh_strides(Plan(dp=4, tp=2, cp=2, pp=2, zero_stage=3)) == {
        "tp": 1, "cp": 2, "dp_shard": 4, "dp_replicate": 16, "pp": 16}


def test_bubbles():
    """Oracle: (p-1)/(m+p-1) for 1F1B/GPipe, (p-1)/v slots interleaved, (p-1)/3 zero bubble."""
    assert bubble_fraction("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("gpipe", 8, 8) == pytest.approx(7 / 15)
    assert bubble_micro_batches("interleaved_1f1b", 4, 4) == pytest.approx(0.75)
    assert bubble_micro_batches("zero_bubble", 4) == pytest.approx(1.0)
    assert bubble_micro_batches("1f1b", 1) == 0.0
    with pytest.raises(ValueError, match="pp_schedule"):
        bubble_micro_batches("dualpipe", 2)


def test_compute_time_equals_flops_over_rate():
    """Oracle: 3x the IR's matmul FLOPs plus 3.5x the kept causal attention FLOPs, over one rate."""
    cfg = llama3.llama3_config("tiny")
    graph = llama3.build_graph(cfg, SEQ)
    cl = make_cluster(gpus=1, gpu="h100")
    cost = step_cost(graph, Plan(), cl, calibration=_flat_cal(), precision="bf16")
    core = 4 * SEQ * SEQ * cfg.dim  # dense score + value FLOPs per layer, one sample
    fwd = sum(n.forward_flops(1, SEQ) for n in graph.components[0].nodes)
    keep = (SEQ + 1) / (2 * SEQ)
    expected = 3 * (fwd - cfg.layers * core) / 1e12 + 3.5 * cfg.layers * core * keep / 1e12
    assert cost.compute_s == pytest.approx(expected, rel=1e-9)
    assert cost.exposed_comm_s == 0.0 and cost.bubble_s == 0.0
    assert cost.mfu == pytest.approx(3 * fwd / cost.step_s / 989.4e12)


def test_tp_comm_and_recompute_orderings():
    """Oracle: SP's all-gather + reduce-scatter per row-parallel projection in forward and backward
    (hand alpha-beta); recomputing more costs time and saves memory."""
    cfg = llama3.llama3_config("tiny")
    graph = llama3.build_graph(cfg, SEQ)
    cl = make_cluster(gpus=2, gpu="h100")
    cal = msgspec.structs.replace(_flat_cal(), alpha_us=0.0)
    cost = step_cost(graph, Plan(tp=2, sp=True), cl, calibration=cal)
    act = SEQ * cfg.dim * 2
    one = 2 * act * (1 / 2) / 292e9  # all-gather + reduce-scatter, factor (n-1)/n
    assert cost.comm["tp"] == pytest.approx(cfg.layers * 2 * one * 2)
    gpu_only = msgspec.structs.replace(default_calibration(cl.gpu), host_us_per_launch=0.0,
                                       host_us_per_backward_launch=0.0, host_us_per_sac_launch=0.0)
    modes = {m: step_cost(graph, Plan(), cl, recompute=m, calibration=gpu_only) for m in ("none", "selective", "full")}
    assert modes["none"].step_s < modes["selective"].step_s < modes["full"].step_s  # GPU time (tiny: host-bound)
    assert modes["none"].memory.total > modes["selective"].memory.total > modes["full"].memory.total
    assert math.isclose(modes["none"].recompute_s, 0.0)
