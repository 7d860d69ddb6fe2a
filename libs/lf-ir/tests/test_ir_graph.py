"""IR graph checks. Oracles: hand-computed counts, the lowered module's own parameters,
torch's FlopCounterMode, and msgspec's JSON round trip."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import (
    MLP,
    Attention,
    Component,
    Edge,
    Graph,
    IRError,
    Linear,
    Norm,
    VLAModel,
    forward_flops,
    from_json,
    lf_modules,
    materialize,
    param_count,
    summary_rows,
    to_json,
    validate,
    vla_config,
)
from lf_ir.recipes.vla import build_graph


def _tiny():
    return vla_config("tiny", text_vocab_size=30, max_instruction_len=5, image_size=32,
                      patch_size=8, action_horizon=2)


def test_json_round_trip_is_identity():
    """Oracle: decode(encode(graph)) == graph, and the JSON names each node's op."""
    g = build_graph(_tiny())
    data = to_json(g)
    assert from_json(data) == g
    assert b'"op":"transformer_block"' in data and b'"mask":{"kind":"prefix_lm","prefix_len"' in data


def test_param_count_matches_lowered_module():
    """Oracle: the parameter count of the lowered torch module."""
    cfg = _tiny()
    with torch.device("meta"):
        model = VLAModel(cfg)
    assert param_count(model.graph) == sum(p.numel() for p in model.parameters())
    # hand count of one component: state projection = 39*32 weights + 32 biases
    assert param_count(model.graph, component="state") == 39 * 32 + 32


def test_forward_flops_match_flop_counter(monkeypatch):
    """Oracle: FlopCounterMode on the lowered model, with attention computed by explicit matmuls
    (the CPU SDPA kernel is invisible to the counter) so that every FLOP is counted."""
    import lf_ir._lower as lower
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower, "attention",
                        lambda q, k, v, mask, key_padding=None: attention_reference(
                            q, k, v, mask, key_padding=key_padding)[0])
    cfg = _tiny()
    with torch.device("meta"):
        model = VLAModel(cfg)
    model = materialize(model, "cpu", 0)
    b = 3
    img = torch.randint(0, 256, (b, 32, 32, 3), dtype=torch.uint8)
    ids = torch.randint(0, 30, (b, 5))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(img, ids, torch.ones(b, 5, dtype=torch.bool), torch.randn(b, 39),
              torch.randint(30, 30 + 256, (b, cfg.num_action_tokens - 1)))
    measured, predicted = counter.get_total_flops(), forward_flops(model.graph, b)
    assert abs(measured - predicted) / measured < 0.02, (measured, predicted)


def test_summary_rows_sum_to_totals():
    g = build_graph(_tiny())
    rows = summary_rows(g, batch=2)
    assert [r[0] for r in rows] == ["vision", "tokens", "state", "backbone"]
    assert sum(r[3] for r in rows) == param_count(g)
    assert sum(r[4] for r in rows) == forward_flops(g, 2)


def test_attention_heads_must_divide_width_error_names_node():
    with pytest.raises(IRError, match=r"node 'block0.attention'.*dim 30 is not divisible by heads 4"):
        Attention(name="block0.attention", dim=30, heads=4, kv_heads=4)


def test_unknown_mask_kind_error_names_node():
    with pytest.raises(IRError, match=r"'attn'.*unknown mask kind 'sliding'"):
        Attention(name="attn", dim=32, heads=4, kv_heads=4, mask="sliding")
    # and from JSON the Literal type rejects it at decode time
    good = to_json(build_graph(_tiny())).replace(b'"mask":"full"', b'"mask":"sliding"', 1)
    with pytest.raises(msgspec.ValidationError, match="mask"):
        from_json(good)


def test_shape_mismatch_inside_component_names_node():
    comp = Component(name="head", modality="sequence", seq_len=4, nodes=[
        Linear(name="up", in_features=8, out_features=16),
        MLP(name="mlp", dim=32, hidden=64)])
    with pytest.raises(IRError, match=r"component 'head', node 'mlp': expects input width 32 but 'up' produces 16"):
        validate(Graph(name="g", recipe="test", components=[comp]))


def test_shape_mismatch_between_components_names_edge_and_node():
    src = Component(name="vision", modality="image", seq_len=4,
                    nodes=[Linear(name="proj", in_features=8, out_features=24)])
    dst = build_graph(_tiny()).component("backbone")
    g = Graph(name="g", recipe="test", components=[src, dst],
              edges=[Edge(src="vision", src_node="proj", dst="backbone")])
    with pytest.raises(IRError, match=r"'vision'.'proj' produces width 24 but 'backbone' runs at width 32"):
        validate(g)


def test_norm_kind_and_positive_sizes_validated():
    with pytest.raises(IRError, match="kind must be 'layer' or 'rms'"):
        Norm(name="n", dim=4, kind="batch")
    with pytest.raises(IRError, match="hidden must be a positive integer, got 0"):
        MLP(name="m", dim=4, hidden=0)


def test_every_lowered_module_knows_its_node():
    """Oracle: the graph itself; every node of every component is found on a module."""
    with torch.device("meta"):
        model = VLAModel(_tiny())
    found = {node.name for _, _, node in lf_modules(model)}
    expected = {n.name for c in model.graph.components for n in c.nodes}
    assert expected <= found
    assert len(model.blocks) == _tiny().vision_layers + _tiny().layers


def test_deterministic_init_independent_of_device_build():
    """Oracle: two independent builds with the same seed give bit-identical weights."""
    def build(seed):
        with torch.device("meta"):
            m = VLAModel(_tiny())
        return materialize(m, "cpu", seed).state_dict()
    a, b, c = build(0), build(0), build(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["components.backbone.layers.1.attention.q.weight"],
                           c["components.backbone.layers.1.attention.q.weight"])
    with torch.device("meta"):
        m = VLAModel(_tiny())
    m = materialize(m, "cpu", 0)
    assert all(bool(torch.isfinite(t).all()) for t in [*m.parameters(), *m.buffers()])
    w = a["components.backbone.layers.1.attention.q.weight"]
    assert math.isclose(float(w.std()), 0.02, rel_tol=0.15)
