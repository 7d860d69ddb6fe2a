"""The llama3 recipe from the IR alone. Oracles: the published parameter counts of Meta's
checkpoints, the lowered module's own parameters, FlopCounterMode, Meta's reference
``apply_scaling`` loop (llama-models repo) re-typed in Python floats, and RoPE's algebra
(rotations keep norms; scores depend only on position differences)."""

from __future__ import annotations

import math

import msgspec
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import (
    RECIPES,
    IRError,
    Llama3Model,
    LMHead,
    RoPE,
    apply_rope,
    forward_flops,
    from_json,
    lf_modules,
    llama3_config,
    materialize,
    node_backward_flops,
    param_count,
    rope_cos_sin,
    rope_inv_freq,
    to_json,
)
from lf_ir.recipes.llama3 import build_graph, next_token_loss
from lf_ir.recipes.vla import build_graph as build_vla_graph
from lf_ir.recipes.vla import vla_config


@pytest.mark.parametrize(("size", "expected"), [
    ("1B", 1_235_814_400),    # Llama-3.2-1B (tied), HF model card / safetensors total
    ("8B", 8_030_261_248),    # Llama-3.1-8B, "8.03B"
    ("70B", 70_553_706_496),  # Llama-3.1-70B, "70.6B"
])
def test_full_size_param_counts_are_the_published_ones(size, expected):
    """Oracle: the parameter totals of Meta's released checkpoints; counted from the IR, nothing allocated."""
    assert param_count(build_graph(llama3_config(size))) == expected


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_param_count_equals_lowered_module(tied):
    """Oracle: the parameters of the lowered module (shared tensors counted once by torch)."""
    cfg = llama3_config("tiny", tie_embeddings=tied)
    with torch.device("meta"):
        model = Llama3Model(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert param_count(model.graph) == n
    head = 0 if tied else cfg.vocab_size * cfg.dim
    per_layer = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * cfg.kv_heads * cfg.head_dim + 3 * cfg.dim * cfg.ffn_hidden
    assert n == cfg.vocab_size * cfg.dim + head + cfg.layers * (per_layer + 2 * cfg.dim) + cfg.dim


def test_tied_head_shares_the_embedding_after_materialize_and_cast():
    """Oracle: logits computed by hand from the embedding table and the final hidden state."""
    cfg = llama3_config("tiny", tie_embeddings=True)
    with torch.device("meta"):
        model = Llama3Model(cfg)
    model = materialize(model, "cpu", 0).double()
    text = model.components["text"]
    assert not any(k.startswith(f"components.text.layers.{cfg.layers + 2}") for k in model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    hidden = text(ids, mask=model.mask, stop=cfg.layers + 2)
    torch.testing.assert_close(model(ids), hidden @ text["embed"].weight.T, rtol=1e-12, atol=1e-12)


def test_json_round_trip_and_old_json_without_rope_still_decodes():
    """Oracle: decode(encode(graph)) == graph; a VLA graph written before ``Attention.rope`` existed."""
    g = build_graph(llama3_config("tiny", tie_embeddings=True), seq_len=32)
    data = to_json(g)
    assert from_json(data) == g
    assert b'"op":"lm_head"' in data and b'"tied_to":"embed"' in data and b'"scaling":"llama3"' in data
    vla = build_vla_graph(vla_config("tiny"))
    old = to_json(vla).replace(b',"rope":null', b"")
    assert b"rope" not in old and from_json(old) == vla


def test_registered_in_recipes():
    assert RECIPES["llama3"].build_graph is build_graph
    assert RECIPES["llama3"].config("tiny").dim == 64 and RECIPES["llama3"].model is Llama3Model


@pytest.mark.parametrize("tied", [False, True])
def test_forward_and_backward_flops_match_flop_counter(monkeypatch, tied):
    """Oracle: FlopCounterMode on the lowered tiny model (attention by explicit matmuls, which the
    counter sees), forward alone and forward + backward (IR: backward = 2 x forward)."""
    import lf_ir._lower as lower
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower, "attention", lambda q, k, v, mask, key_padding=None: attention_reference(
        q, k, v, mask, key_padding=key_padding)[0])
    b, s = 3, 24
    cfg = llama3_config("tiny", tie_embeddings=tied)
    with torch.device("meta"):
        model = Llama3Model(cfg, build_graph(cfg, seq_len=s))
    model = materialize(model, "cpu", 0)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    fwd_counter = FlopCounterMode(display=False)
    with fwd_counter, torch.no_grad():
        model(ids)
    fwd = forward_flops(model.graph, b)
    assert abs(fwd_counter.get_total_flops() - fwd) / fwd < 0.02, (fwd_counter.get_total_flops(), fwd)
    step_counter = FlopCounterMode(display=False)
    with step_counter:
        next_token_loss(model(ids), ids).backward()
    bwd = sum(node_backward_flops(n, b, s) for c in model.graph.components for n in c.nodes)
    assert abs(step_counter.get_total_flops() - (fwd + bwd)) / (fwd + bwd) < 0.02


def test_malformed_configs_fail_naming_the_node():
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*dim 60 is not divisible by heads 8"):
        build_graph(llama3_config("tiny", dim=60, heads=8))
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*heads 4 is not divisible by kv_heads 3"):
        build_graph(llama3_config("tiny", kv_heads=3))
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*rope: head_dim must be even, got 7"):
        build_graph(llama3_config("tiny", dim=28, heads=4, kv_heads=4))
    with pytest.raises(IRError, match=r"'layer0.attention'.*low_freq_factor < high_freq_factor"):
        build_graph(llama3_config("tiny", rope_low_freq_factor=4.0))
    with pytest.raises(msgspec.ValidationError, match="scaling"):
        msgspec.json.decode(b'{"scaling":"yarn"}', type=RoPE)


def test_tied_head_must_name_a_matching_embedding():
    g = build_graph(llama3_config("tiny"), seq_len=8)
    comp = g.components[0]
    bad = msgspec.structs.replace(comp, nodes=[*comp.nodes[:-1], LMHead(name="head", dim=64, vocab_size=256,
                                                                            tied_to="norm")])
    with pytest.raises(IRError, match=r"node 'head': tied_to 'norm' must name an earlier Embedding"):
        from_json(to_json(msgspec.structs.replace(g, components=[bad])))
    bad = msgspec.structs.replace(comp, nodes=[*comp.nodes[:-1], LMHead(name="head", dim=64, vocab_size=128,
                                                                            tied_to="embed")])
    with pytest.raises(IRError, match=r"tied to 'embed' of shape \(256, 64\) but the head needs \(128, 64\)"):
        from_json(to_json(msgspec.structs.replace(g, components=[bad])))


def _meta_apply_scaling(freqs, factor, low, high, old_len):
    """Meta's llama-models ``apply_scaling`` (Llama 3.1), as a Python loop."""
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(freq)
        elif wavelen > old_len / low:
            out.append(freq / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


@pytest.mark.parametrize(("theta", "head_dim", "old_len"), [(500000.0, 128, 8192), (10000.0, 16, 64)])
def test_llama3_inv_freq_matches_meta_reference(theta, head_dim, old_len):
    """Oracle: Meta's apply_scaling on theta^(-2i/d) in float64 Python; all three bands are hit."""
    plain = [theta ** (-(2 * i) / head_dim) for i in range(head_dim // 2)]
    torch.testing.assert_close(rope_inv_freq(RoPE(theta=theta), head_dim).double(),
                               torch.tensor(plain, dtype=torch.float64), rtol=1e-6, atol=0)
    rope = RoPE(theta=theta, scaling="llama3", factor=8.0, original_max_position_embeddings=old_len)
    ref = torch.tensor(_meta_apply_scaling(plain, 8.0, 1.0, 4.0, old_len), dtype=torch.float64)
    got = rope_inv_freq(rope, head_dim).double()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)
    ratio = torch.tensor(plain, dtype=torch.float64) / ref
    assert (ratio == 1).any() and (ratio.sub(8).abs() < 1e-9).any() and ((ratio > 1.01) & (ratio < 7.99)).any()


def test_rope_keeps_norms_and_scores_depend_on_relative_position():
    """Oracle: RoPE is a rotation (norm preserved) and q(m).k(n) depends on m - n only."""
    rope = RoPE(theta=10000.0, scaling="llama3", factor=8.0, original_max_position_embeddings=64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 16, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, 5, 16, dtype=torch.float64, generator=g)
    pos = torch.arange(5).unsqueeze(0)
    cos, sin = rope_cos_sin(rope, 16, pos, torch.float64)
    qr = apply_rope(q, cos, sin)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)
    cos2, sin2 = rope_cos_sin(rope, 16, pos + 37, torch.float64)
    scores = qr @ apply_rope(k, cos, sin).transpose(-1, -2)
    shifted = apply_rope(q, cos2, sin2) @ apply_rope(k, cos2, sin2).transpose(-1, -2)
    torch.testing.assert_close(shifted, scores, rtol=1e-5, atol=1e-5)  # float32 angles


def test_causal_and_every_module_knows_its_node():
    """Oracle: causality (changing token j changes logits at positions >= j only) and the graph's node list."""
    cfg = llama3_config("tiny")
    with torch.device("meta"):
        model = Llama3Model(cfg)
    assert {n.name for n in model.graph.components[0].nodes} <= {n.name for _, _, n in lf_modules(model)}
    assert len(model.blocks) == cfg.layers
    model = materialize(model, "cpu", 1).double()
    ids = torch.randint(0, cfg.vocab_size, (2, 10))
    base = model(ids)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % cfg.vocab_size
    out = model(changed)
    assert torch.equal(out[:, :6], base[:, :6]) and not torch.allclose(out[:, 6:], base[:, 6:])
    with pytest.raises(ValueError, match=r"input_ids: expected \(batch, seq\)"):
        model(ids[0])


def test_packed_documents_equal_separate_sequences():
    """Two documents packed in one row with document_ids (and positions restarting per document) give
    the logits each document gets alone. Oracle: the unpacked forward of each document (float64)."""
    cfg = llama3_config("tiny")
    with torch.device("meta"):
        model = Llama3Model(cfg)
    materialize(model, "cpu", seed=3)
    model = model.double()
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, cfg.vocab_size, (1, 7), generator=gen)
    b = torch.randint(0, cfg.vocab_size, (1, 5), generator=gen)
    packed = torch.cat([a, b], dim=1)
    docs = torch.tensor([[0] * 7 + [1] * 5])
    positions = torch.cat([torch.arange(7), torch.arange(5)]).unsqueeze(0)
    out = model(packed, positions=positions, document_ids=docs)
    torch.testing.assert_close(out[:, :7], model(a), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[:, 7:], model(b), rtol=1e-10, atol=1e-10)
    leaky = model(packed, positions=positions)  # without document ids the second document sees the first
    assert not torch.allclose(leaky[:, 7:], model(b), rtol=1e-6, atol=1e-6)
