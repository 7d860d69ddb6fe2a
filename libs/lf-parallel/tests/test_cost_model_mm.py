"""The cost model's multimodal terms (``lf_parallel._mm_cost``) against the committed Qwen2-VL-7B measurement.

Oracle: ``bench/results/qwen2_vl_peer_h200x2.json`` (lf's Qwen2-VL-7B under ``zero=3,dp=2`` on 2 H200, one
packed row per rank, measured step medians; the numbers used are copied into :data:`MEASURED`, so lf-parallel's
tests need no file outside the library). The prediction for the slowest rank's row (its tokens, samples,
images and patches as written in the file) must stay within 6% of the measured step with every block
recomputed (``lf full``) and with the ViT's blocks only (``lf vision``); without the segment overhead the
model is about 30% fast, so breaking the term fails the test. Also: a text-only graph is unchanged by the
multimodal arguments (no per-image component), and packed images divide the ViT's attention core.
"""

from __future__ import annotations

import msgspec
import pytest

from lf_ir import llama3_config
from lf_ir.recipes import llama3
from lf_ir.recipes.qwen2_vl import build_graph, qwen2_vl_config
from lf_parallel import parse_plan
from lf_parallel._calibrate import default_calibration
from lf_parallel._cluster import make_cluster
from lf_parallel._cost_model import step_cost
from lf_parallel._mm_cost import packed_components, per_image_components

MEASURED = {
    "plan": "zero=3,dp=2", "world_size": 2,
    "row": {"tokens": 8192, "images": 13, "samples": 13, "image_tokens": 3680},
    "runs": {"lf full": {"step_s_median": 1.579455831499999}, "lf vision": {"step_s_median": 1.2163688369999974}},
}
"""From ``bench/results/qwen2_vl_peer_h200x2.json`` (measured at commit 3d50fd6): the plan, the slowest rank's
packed row (the one with the most tokens: ``max(per_rank_batch, key=tokens)``) and the step medians."""
RUNS = {"lf full": "full", "lf vision": {"vision": "full"}}
"""Measured run -> the recompute it used (every block / the ViT's blocks only)."""


@pytest.fixture(scope="module")
def measured():
    data, row = MEASURED, MEASURED["row"]  # the slowest rank: most tokens and images
    merge = qwen2_vl_config("7B").spatial_merge_size ** 2
    graph = build_graph(qwen2_vl_config("7B"), seq_len=row["tokens"], image_patches=row["image_tokens"] * merge)
    return data, row, graph


def _predict(graph, plan, row, recompute, calibration=None):
    return step_cost(graph, plan, make_cluster(gpus=2, gpu="h200"), recompute=recompute, calibration=calibration,
                     images_per_sample=row["images"], docs_per_sample=row["samples"])


@pytest.mark.parametrize("run", sorted(RUNS))
def test_qwen2_vl_7b_step_within_6_percent_of_measurement(measured, run):
    """Predicted step of the measured row and plan is within 6% of the committed median; the segment overhead is
    what closes the gap (without it the prediction is more than 20% below the measurement)."""
    data, row, graph = measured
    plan = parse_plan(data["plan"])
    assert plan.world_size == data["world_size"] == 2
    step = data["runs"][run]["step_s_median"]
    cost = _predict(graph, plan, row, RUNS[run])
    assert abs(cost.step_s / step - 1) < 0.06, (run, cost.step_s, step)
    assert cost.host_s > 0
    bare = msgspec.structs.replace(default_calibration(make_cluster(gpus=2, gpu="h200").gpu),
                                   host_overhead_us_per_segment=0.0)
    assert _predict(graph, plan, row, RUNS[run], bare).step_s < 0.8 * step


def test_segments_only_touch_multimodal_graphs(measured):
    """Oracle: the definition. Qwen2-VL's ViT is the per-image component and feeds the packed decoder; a llama3
    graph has no per-image component, so images_per_sample changes nothing, and docs_per_sample only divides
    its attention core (never adds overhead). Packing 4 images into the same patches shrinks the ViT's
    attention work (compute time falls; each image adds segment overhead instead)."""
    _, row, graph = measured
    assert per_image_components(graph) == {"vision"}
    assert packed_components(graph, "vision", frozenset({"vision"})) == {"text"}
    cfg = llama3_config("tiny")
    lgraph = llama3.build_graph(cfg, 512)
    cluster, plan = make_cluster(gpus=1, gpu="h200"), parse_plan("dp=1")
    base = step_cost(lgraph, plan, cluster)
    assert step_cost(lgraph, plan, cluster, images_per_sample=8).step_s == base.step_s
    docs = step_cost(lgraph, plan, cluster, docs_per_sample=4)
    assert docs.compute_s < base.compute_s and docs.step_s <= base.step_s and docs.host_s == 0.0
    one = step_cost(graph, parse_plan("dp=1"), cluster, images_per_sample=1)
    four = step_cost(graph, parse_plan("dp=1"), cluster, images_per_sample=4)
    assert four.compute_s < one.compute_s
    with pytest.raises(ValueError, match="images_per_sample"):
        step_cost(graph, parse_plan("dp=1"), cluster, images_per_sample=0.5)
