"""The ranking order of ``search_plans``, the trunk pipeline stages split, and ``check_plan``'s hint when no plan
exists.

Oracles: the cost model's own predictions (the ranking is sorted by them, unrounded), Qwen2-VL's graph edge
``vision -> text`` (the trunk is the language model), and ``choose_plan``'s reason that a batch cannot split."""

from __future__ import annotations

import pytest

from lf_ir.recipes import llama3, qwen2_vl
from lf_parallel import PlanError, check_plan, split_stages, trunk_component
from lf_parallel._cluster import make_cluster
from lf_parallel._plan import Plan
from lf_parallel._search import search_plans


def test_ranking_sorts_by_unrounded_step_time_and_prefers_less_recompute():
    """A tiny model's steps (~0.3 ms) differ by less than the 0.1 ms the ranking used to round to: then
    ``full`` ranked first (less memory broke the tie). Now the order is the predictions' own, and a plan's
    ``none`` comes before its ``selective`` and ``full`` (each predicted slower or equal; the tiny model is
    host-bound, where ``selective``'s dispatch mode can cost more than ``full``, as measured for Qwen2-VL)."""
    graph = llama3.build_graph(llama3.llama3_config("tiny"), 128)
    ranked = search_plans(graph, make_cluster(gpus=1, gpu="h100"), global_batch=16, seq=128, top=1000).ranked
    steps = [c.cost.step_s for c in ranked]
    assert steps == sorted(steps) and ranked[0].recompute == "none"
    for plan in {c.plan.describe() for c in ranked}:
        modes = [c.recompute for c in ranked if c.plan.describe() == plan]
        assert modes[0] == "none" and sorted(modes) == ["full", "none", "selective"], (plan, modes)


def test_qwen2_vl_7b_pipeline_splits_the_language_model():
    """Qwen2-VL-7B's vision tower has 32 blocks, its language model 28: the trunk is still ``text`` (the
    component the vision tokens flow into), so pipeline stages cut the 28 text blocks."""
    graph = qwen2_vl.build_graph(qwen2_vl.qwen2_vl_config("7B"))
    assert trunk_component(graph) == "text"
    specs = split_stages(graph, 4)
    assert {s.trunk for s in specs} == {"text"} and specs[-1].stop == len(graph.component("text").nodes)


def test_check_plan_without_a_nearby_plan_says_why():
    """8 processes cannot split 2 samples: the error says so, not ``try <an error message>``."""
    with pytest.raises(PlanError) as err:
        check_plan(Plan(dp=2), world_size=8, global_batch=2)
    text = str(err.value)
    assert "parallel.dp=2 must equal the number of processes (8)" in text
    assert "no plan of 8 processes fits: train.global_batch=2 is not divisible" in text and "try " not in text
    with pytest.raises(PlanError, match=r"; try dp=8 "):
        check_plan(Plan(dp=2), world_size=8, global_batch=8)
