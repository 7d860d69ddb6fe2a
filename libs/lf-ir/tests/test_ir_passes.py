"""Graph passes: JSON round trip of every node type, per-component costs and the table. Oracles:
decode(encode(x)) == x, the per-node rules summed by hand, and the graph-level functions."""

from __future__ import annotations

import typing

import msgspec
import pytest

import lf_ir._nodes as nodes_mod
from lf_ir._graph import Component, Graph, backward_flops, forward_flops, from_json, param_count, to_json
from lf_ir._mask import Mask
from lf_ir._nodes import (
    MLP,
    Attention,
    Embedding,
    IRError,
    LearnedPositional,
    Linear,
    LMHead,
    Node,
    Norm,
    PatchEmbed2D,
    RoPE,
    TransformerBlock,
)
from lf_ir._table import cost_table, graph_cost
from lf_ir.recipes.llama3 import build_graph, llama3_config
from lf_ir.recipes.vla import build_graph as build_vla
from lf_ir.recipes.vla import vla_config

EXAMPLES = [
    Embedding(name="embed", num_embeddings=10, dim=8, tp="row"),
    Linear(name="lin", in_features=8, out_features=8, bias=False, tp="column"),
    PatchEmbed2D(name="patch", in_channels=3, image_size=8, patch_size=4, dim=8),
    LearnedPositional(name="pos", length=4, dim=8),
    Norm(name="norm", dim=8, kind="rms", eps=1e-6),
    Attention(name="attn", dim=8, heads=2, kv_heads=1, mask=Mask(kind="window_3d", grid=(1, 2, 2),
              window=(1, 3, 3), causal_t=True, packed=True), rope=RoPE(scaling="llama3")),
    MLP(name="mlp", dim=8, hidden=16, activation="swiglu"),
    TransformerBlock(name="block", attn_norm=Norm(name="block.n1", dim=8),
                     attention=Attention(name="block.a", dim=8, heads=2, kv_heads=2, mask="full"),
                     mlp_norm=Norm(name="block.n2", dim=8), mlp=MLP(name="block.m", dim=8, hidden=8)),
    LMHead(name="head", dim=8, vocab_size=10, tied_to="embed"),
]


def test_every_node_type_of_nodes_py_round_trips_through_json():
    """Oracle: decode(encode(node)) == node for each type of _nodes.py (with _nodes_input.py and
    _nodes_transformer.py, split out of it) / _nodes_lm.py in the Node union."""
    own = {t for t in typing.get_args(Node) if t.__module__ in (
        nodes_mod.__name__, "lf_ir._nodes_input", "lf_ir._nodes_transformer", "lf_ir._nodes_lm")}
    assert own == {type(n) for n in EXAMPLES}
    for node in EXAMPLES:
        assert msgspec.json.decode(msgspec.json.encode(node), type=Node) == node
    g = Graph(name="g", recipe="t", components=[Component(name="c", modality="sequence", seq_len=4, nodes=[
        n for n in EXAMPLES if not isinstance(n, PatchEmbed2D | Linear | LearnedPositional)])])
    assert from_json(to_json(g)) == g


def test_graph_cost_sums_the_node_rules():
    """Oracle: graph-level functions and node rules summed by hand."""
    g = build_vla(vla_config("tiny"))
    cost = graph_cost(g, batch=3, dtype_bytes=2)
    assert [c.component for c in cost.components] == ["vision", "tokens", "state", "backbone"]
    assert cost.total("params") == param_count(g)
    assert cost.total("forward_flops") == forward_flops(g, 3)
    assert cost.total("backward_flops") == backward_flops(g, 3)
    back = g.component("backbone")
    assert cost.components[3].saved_bytes == sum(n.saved_bytes(3, back.seq_len, 2) for n in back.nodes)
    assert cost.components[3].forward_bytes == sum(n.forward_bytes(3, back.seq_len, 2) for n in back.nodes)
    # prefix_lm given as a bare string keeps the causal lower bound: fewer FLOPs than dense
    assert cost.components[3].forward_flops_unmasked < cost.components[3].forward_flops
    assert cost.components[0].forward_flops_unmasked == cost.components[0].forward_flops  # full mask


def test_seq_override_and_llama_backward_is_twice_forward():
    g = build_graph(llama3_config("tiny"), seq_len=16)
    a = graph_cost(g, 2, 4, seq={"text": 32})
    b = graph_cost(build_graph(llama3_config("tiny"), seq_len=32), 2, 4)
    assert a == b and a.components[0].backward_flops == 2 * a.components[0].forward_flops
    with pytest.raises(IRError, match=r"unknown components \['vision'\]"):
        graph_cost(g, seq={"vision": 4})
    with pytest.raises(IRError, match="batch must be a positive integer, got 0"):
        graph_cost(g, batch=0)


def test_cost_table_rows_and_units():
    """Oracle: the numbers of graph_cost, formatted in GFLOPs and MiB."""
    g = build_graph(llama3_config("1B"), seq_len=4096)
    cost = graph_cost(g, batch=1, dtype_bytes=2)
    text = cost_table(cost)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["component", "modality", "seq", "params"]
    row = lines[3].split()
    assert row[:4] == ["text", "text", "4,096", "1,235,814,400"]
    assert row[4] == f"{cost.components[0].forward_flops / 1e9:,.3f}"
    assert row[6] == f"{cost.components[0].saved_bytes / 2 ** 20:,.2f}"
    assert lines[-1].split()[0] == "total"
