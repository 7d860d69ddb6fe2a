"""The main component of a graph view is its trunk, the component the others feed (lf-ir's edges).

Oracle: the recipes' own data flow (Qwen2-VL ``vision -> text``, the VLA's encoders -> ``backbone``, Wan's
``text -> video``) and the graph's components: for a VLM the main component is the language model even where
its vision tower has more blocks (Qwen2-VL-7B: 32 vision blocks, 28 text blocks)."""

from __future__ import annotations

import pytest

from lf_ir.recipes import llama3, qwen2_vl, vla, vla_flow, wan_dit, wan_vae
from lf_memory._estimate import estimate_memory
from lf_memory._estimate_graph import graph_view, trunk_name

CASES = [
    (lambda: qwen2_vl.build_graph(qwen2_vl.qwen2_vl_config("7B")), "text"),
    (lambda: qwen2_vl.build_graph(qwen2_vl.qwen2_vl_config("tiny")), "text"),
    (lambda: llama3.build_graph(llama3.llama3_config("tiny"), 32), "text"),
    (lambda: vla.build_graph(vla.vla_config("tiny")), "backbone"),
    (lambda: vla_flow.build_graph(vla_flow.vla_flow_config("tiny")), "backbone"),
    (lambda: wan_dit.build_graph(wan_dit.wan_dit_config("tiny")), "video"),
    (lambda: wan_vae.build_graph(wan_vae.wan_vae_config("tiny"), 5, 16, 16), "encoder0"),
]


@pytest.mark.parametrize(("build", "trunk"), CASES)
def test_main_component_is_the_trunk(build, trunk):
    graph = build()
    assert trunk_name(graph) == trunk and graph_view(graph).main == trunk


def test_qwen2_vl_7b_seq_applies_to_text_tokens():
    """Oracle: the estimate of a graph built with 2,048 text tokens equals the estimate of the default graph
    with ``seq=2048`` (``seq`` is the main component's tokens), the vision tower unchanged."""
    cfg = qwen2_vl.qwen2_vl_config("7B")
    assert len(qwen2_vl.build_graph(cfg).component("vision").blocks()) == 32
    direct = estimate_memory(qwen2_vl.build_graph(cfg, seq_len=2048))
    via_seq = estimate_memory(qwen2_vl.build_graph(cfg), seq=2048)
    assert via_seq.activations == direct.activations and via_seq.temporaries == direct.temporaries
