"""The gemma recipe and the node options it brought, from the IR alone. Oracles: the parameter counts of
Google's released Gemma 1 checkpoints re-derived from their config arithmetic, the lowered module's own
parameters, FlopCounterMode, ``saved_tensors_hooks`` on the lowered nodes, formulas written out in float64,
and the JSON the other recipes wrote before the options existed."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from _saved_bytes import measure_saved
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import (
    MLP,
    RECIPES,
    Attention,
    Embedding,
    IRError,
    Mask,
    Norm,
    RoPE,
    TransformerBlock,
    forward_flops,
    from_json,
    lf_modules,
    lower_node,
    materialize,
    node_backward_flops,
    param_count,
    to_json,
)
from lf_ir.recipes.gemma import GemmaModel, build_graph, gemma_config, next_token_loss
from lf_ir.recipes.llama3 import build_graph as build_llama3
from lf_ir.recipes.llama3 import llama3_config
from lf_kernels import MaskSpec

WIDE = dict(dim=48, heads=4, kv_heads=2, head_dim=16)
"""A tiny Gemma whose heads are wider than dim / heads (as in Gemma 7B: 16 x 256 over 3072)."""


def _gemma_count(vocab, dim, layers, heads, kv_heads, head_dim, ffn):
    """Parameters of GemmaForCausalLM from its config: tied embedding, per layer q/k/v/o, gate/up/down, 2 norms."""
    per_layer = 2 * dim * heads * head_dim + 2 * dim * kv_heads * head_dim + 3 * dim * ffn + 2 * dim
    return vocab * dim + layers * per_layer + dim


@pytest.mark.parametrize(("size", "expected"), [("2B", 2_506_172_416), ("7B", 8_537_680_896)])
def test_full_size_param_counts_are_the_released_ones(size, expected):
    """Oracle: gemma-2b / gemma-7b config.json arithmetic (2.51B and 8.54B, the safetensors totals)."""
    hf = {"2B": (256000, 2048, 18, 8, 1, 256, 16384), "7B": (256000, 3072, 28, 16, 16, 256, 24576)}[size]
    assert _gemma_count(*hf) == expected
    assert param_count(build_graph(gemma_config(size))) == expected
    assert gemma_config(size.lower()) == gemma_config(size)


@pytest.mark.parametrize("overrides", [{}, WIDE], ids=["tiny", "wide-heads"])
def test_tiny_builds_validates_round_trips_and_counts_its_module(overrides):
    """Oracle: the lowered module's parameters; decode(encode(graph)) == graph."""
    cfg = gemma_config("tiny", **overrides)
    graph = build_graph(cfg, seq_len=32)
    assert from_json(to_json(graph)) == graph
    with torch.device("meta"):
        model = GemmaModel(cfg, graph)
    n = sum(p.numel() for p in model.parameters())
    assert param_count(graph) == n == _gemma_count(cfg.vocab_size, cfg.dim, cfg.layers, cfg.heads, cfg.kv_heads,
                                                   cfg.head_dim, cfg.ffn_hidden)
    assert {node.name for node in graph.components[0].nodes} <= {node.name for _, _, node in lf_modules(model)}
    assert len(model.blocks) == cfg.layers and RECIPES["gemma"].build_graph is build_graph
    assert graph.components[0].nodes[0].tp == "row"  # the tied head splits the vocabulary with it under TP
    with pytest.raises(ValueError, match=r"model.size: unknown gemma size '13B'"):
        gemma_config("13B")


def test_init_is_identity_norms_and_scaled_embedding():
    """Oracle: the Gemma formulas written out in float64 (embedding * sqrt(dim); norms start at 1 + 0)."""
    cfg = gemma_config("tiny", **WIDE)
    with torch.device("meta"):
        model = GemmaModel(cfg)
    model = materialize(model, "cpu", 0).double()
    text = model.components["text"]
    assert all(not text.layers[i].attn_norm.weight.any() for i in range(1, cfg.layers + 1))
    with torch.no_grad():
        for p in model.parameters():  # perturb the norms so (1 + w) matters
            if p.dim() == 1:
                p.copy_(torch.linspace(-0.5, 0.5, p.numel(), dtype=torch.float64))
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    emb = text["embed"].weight[ids] * math.sqrt(cfg.dim)
    torch.testing.assert_close(text(ids, stop=1), emb, rtol=1e-15, atol=0)
    norm = text["norm"]
    x = torch.randn(2, 7, cfg.dim, dtype=torch.float64)
    expected = x / (x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps).sqrt() * (1 + norm.weight)
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=1e-12)
    mlp = text.layers[1].mlp
    gate = x @ mlp.gate.weight.T
    gelu_tanh = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    torch.testing.assert_close(mlp(x), (gelu_tanh * (x @ mlp.up.weight.T)) @ mlp.down.weight.T, rtol=1e-12,
                               atol=1e-12)
    hidden = text(ids, mask=model.mask, stop=cfg.layers + 2)
    torch.testing.assert_close(model(ids), hidden @ text["embed"].weight.T, rtol=1e-12, atol=1e-12)  # tied head


def test_forward_and_backward_flops_match_flop_counter(monkeypatch):
    """Oracle: FlopCounterMode on the lowered wide-head tiny model (attention by explicit matmuls, which the
    counter sees): the score terms are heads * head_dim wide, not dim."""
    import lf_ir._lower as lower
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower, "attention", lambda q, k, v, mask, key_padding=None: attention_reference(
        q, k, v, mask, key_padding=key_padding)[0])
    b, s = 3, 24
    cfg = gemma_config("tiny", **WIDE)
    with torch.device("meta"):
        model = GemmaModel(cfg, build_graph(cfg, seq_len=s))
    model = materialize(model, "cpu", 0)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids)
    fwd = forward_flops(model.graph, b)
    assert abs(counter.get_total_flops() - fwd) / fwd < 0.02, (counter.get_total_flops(), fwd)
    step = FlopCounterMode(display=False)
    with step:
        next_token_loss(model(ids), ids).backward()
    bwd = sum(node_backward_flops(n, b, s) for c in model.graph.components for n in c.nodes)
    assert abs(step.get_total_flops() - (fwd + bwd)) / (fwd + bwd) < 0.02


B, S, D = 2, 12, 20
OPTION_NODES = [
    Embedding(name="embed_scaled", num_embeddings=50, dim=D, scale=math.sqrt(D)),
    Norm(name="rms_zero_centered", dim=D, kind="rms", eps=1e-6, zero_centered_gamma=True),
    MLP(name="geglu_tanh", dim=D, hidden=40, activation="geglu_tanh", bias=False),
]
OPTION_ATTENTION = [
    Attention(name="causal_mqa_rope_wide", dim=D, heads=4, kv_heads=1, kv_channels=8, rope=RoPE()),
    Attention(name="prefix_gqa_wide", dim=D, heads=4, kv_heads=2, kv_channels=8,
              mask=Mask(kind="prefix_lm", prefix_len=5)),
]


def _lowered(node, dtype):
    with torch.device("meta"):
        module = lower_node(node)
    return materialize(module, "cpu", 0).to(dtype)


@pytest.mark.parametrize(("dtype", "nbytes"), [(torch.float32, 4), (torch.bfloat16, 2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("node", OPTION_NODES + OPTION_ATTENTION, ids=lambda n: n.name)
def test_saved_bytes_of_the_new_options_match_autograd(node, dtype, nbytes):
    """Oracle: saved_tensors_hooks on the lowered node (as tests/test_ir_bytes.py); exact on torch 2.13."""
    module = _lowered(node, dtype)
    if isinstance(node, Embedding):
        measured = measure_saved(lambda: module(torch.randint(0, 50, (B, S))), module)
    else:
        x = torch.randn(B, S, D, dtype=dtype, requires_grad=True)
        if isinstance(node, Attention):
            mask = node.mask_spec
            spec = MaskSpec(mask.kind, prefix_len=mask.prefix_len) if mask.kind == "prefix_lm" else MaskSpec(mask.kind)
            measured = measure_saved(lambda: module(x, spec), module)
        else:
            measured = measure_saved(lambda: module(x), module)
    assert node.saved_bytes(B, S, nbytes) == measured
    if isinstance(node, Norm):  # no fused CUDA kernel for it: the same bytes on either kernel path
        assert node.saved_bytes(B, S, nbytes, kernels="cuda") == measured


def test_gemma_block_saved_bytes_match_autograd():
    """Oracle: saved_tensors_hooks on a lowered gemma block (the sum of its children's rules)."""
    block = build_graph(gemma_config("tiny", **WIDE), seq_len=S).components[0].nodes[1]
    assert isinstance(block, TransformerBlock) and block.attention.inner_dim == 64 != block.attention.dim
    module = _lowered(block, torch.float32)
    x = torch.randn(B, S, block.in_dim, requires_grad=True)
    assert block.saved_bytes(B, S, 4) == measure_saved(lambda: module(x, MaskSpec("causal")), module)


def test_options_are_checked_and_unset_options_leave_the_json_as_before():
    """Oracle: a llama3 graph's JSON as written before the options existed (no new keys; it decodes to the same
    graph), and the nodes' checks naming the node."""
    data = to_json(build_llama3(llama3_config("tiny"), seq_len=8))
    for key in (b"kv_channels", b"zero_centered_gamma", b'"scale"', b"geglu"):
        assert key not in data
    assert from_json(data) == build_llama3(llama3_config("tiny"), seq_len=8)
    att = Attention(name="a", dim=64, heads=4, kv_heads=2)
    assert att.head_dim == 16 and att.param_shapes()["q.weight"] == (64, 64)
    wide = msgspec.structs.replace(att, kv_channels=32)
    assert wide.head_dim == 32 and wide.param_shapes()["o.weight"] == (64, 128)
    with pytest.raises(IRError, match=r"node 'n' \(Norm\): zero_centered_gamma is implemented for kind='rms' only"):
        Norm(name="n", dim=8, kind="layer", zero_centered_gamma=True)
    with pytest.raises(IRError, match=r"node 'e' \(Embedding\): scale must be a positive number, got -1.0"):
        Embedding(name="e", num_embeddings=4, dim=8, scale=-1.0)
    with pytest.raises(IRError, match=r"node 'a' \(Attention\): kv_channels must be a positive integer, got 0"):
        Attention(name="a", dim=48, heads=4, kv_heads=2, kv_channels=0)
    with pytest.raises(IRError, match=r"activation must be one of \['gelu', 'swiglu', 'geglu_tanh'\]"):
        MLP(name="m", dim=8, hidden=8, activation="geglu")
    with pytest.raises(IRError, match=r"'layer0.attention'.*rope: head_dim must be even, got 7"):
        build_graph(gemma_config("tiny", head_dim=7))


def test_causal_and_packed_documents_equal_separate_sequences():
    """Oracle: causality (token j moves logits at positions >= j only) and the unpacked forward of each
    document (float64)."""
    cfg = gemma_config("tiny", **WIDE)
    with torch.device("meta"):
        model = GemmaModel(cfg)
    model = materialize(model, "cpu", seed=3).double()
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, cfg.vocab_size, (1, 7), generator=gen)
    b = torch.randint(0, cfg.vocab_size, (1, 5), generator=gen)
    changed = a.clone()
    changed[:, 4] = (changed[:, 4] + 1) % cfg.vocab_size
    base, out = model(a), model(changed)
    assert torch.equal(out[:, :4], base[:, :4]) and not torch.allclose(out[:, 4:], base[:, 4:])
    packed = model(torch.cat([a, b], 1), positions=torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0),
                   document_ids=torch.tensor([[0] * 7 + [1] * 5]))
    torch.testing.assert_close(packed[:, :7], base, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(packed[:, 7:], model(b), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match=r"input_ids: expected \(batch, seq\)"):
        model(a[0])
