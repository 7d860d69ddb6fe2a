"""The wan_dit recipe from the IR alone. Oracles: diffusers' parameter totals of
WanTransformer3DModel for the published Wan2.1 T2V configs (counted on the meta device,
diffusers 0.42), the lowered module's own parameters, FlopCounterMode on the lowered tiny
model, the token arithmetic of the Wan VAE (4x8x8) and patch (1x2x2), and RoPE's algebra."""

from __future__ import annotations

import msgspec
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import IRError, forward_flops, from_json, lf_modules, materialize, node_backward_flops, param_count, to_json
from lf_ir._nodes_dit import DiTAttention, DiTBlock
from lf_ir._nodes_video import AdaLNModulation, RoPE3D, VideoPatchEmbed
from lf_ir._nodes_vision import FeedForward
from lf_ir._rope3d_torch import apply_rope3d, rope3d_cos_sin
from lf_ir.recipes.wan_dit import WanDiTModel, build_graph, latent_grid, video_tokens, wan_dit_config


@pytest.mark.parametrize(("size", "expected"), [("1.3B", 1_418_996_800), ("14B", 14_288_491_584)])
def test_full_size_param_counts_are_diffusers_ones(size, expected):
    """Oracle: sum of WanTransformer3DModel parameters on the meta device for the Wan2.1 T2V configs."""
    assert param_count(build_graph(wan_dit_config(size))) == expected


def test_tiny_param_count_equals_lowered_module_and_shapes_match():
    """Oracle: the lowered module's parameters, name by name."""
    cfg = wan_dit_config("tiny")
    with torch.device("meta"):
        model = WanDiTModel(cfg)
    assert param_count(model.graph) == sum(p.numel() for p in model.parameters())
    for name, module, node in lf_modules(model):
        own = {k: tuple(v.shape) for k, v in module.named_parameters()}
        assert own == node.param_shapes(), name
        assert set(node.tp_dims()) == set(node.param_shapes()), name
    assert len(model.blocks) == cfg.layers


def test_video_tokens_of_81_frames_480p():
    """Oracle: Wan's arithmetic, (81 - 1) / 4 + 1 = 21 latent frames, 480/8/2 = 30, 832/8/2 = 52."""
    cfg = wan_dit_config("1.3B")
    assert latent_grid(cfg, 81, 480, 832) == (21, 30, 52)
    assert video_tokens(cfg, 81, 480, 832) == 32_760 == build_graph(cfg).component("video").seq_len
    assert video_tokens(cfg, 81, 720, 1280) == 21 * 45 * 80
    assert video_tokens(wan_dit_config("tiny")) == 45
    with pytest.raises(ValueError, match=r"4k \+ 1 .* got 80"):
        video_tokens(cfg, 80, 480, 832)
    with pytest.raises(ValueError, match=r"video height: latent size 62.5"):
        video_tokens(cfg, 81, 500, 832)
    with pytest.raises(ValueError, match=r"video width: latent size 13"):
        video_tokens(cfg, 81, 480, 104)


def test_json_round_trip_and_graph_layout():
    """Oracle: decode(encode(graph)) == graph; the text projection feeds the video blocks' cross-attention."""
    g = build_graph(wan_dit_config("tiny"), seq_len=60)
    assert from_json(to_json(g)) == g
    assert [c.name for c in g.components] == ["text", "video"] and g.edges[0].kind == "context"
    names = [n.name for n in g.component("video").nodes]
    assert names == ["patch_embed", "time_embed", "block0", "block1", "head", "loss"]
    assert b'"op":"dit_block"' in to_json(g) and b'"op":"flow_matching_loss"' in to_json(g)


@pytest.fixture
def counted_attention(monkeypatch):
    """Attention by explicit matmuls (FlopCounterMode does not see the CPU SDPA kernel)."""
    import lf_ir._lower_video as lower_video
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower_video, "attention", lambda q, k, v, mask: attention_reference(q, k, v, mask)[0])


def test_forward_and_backward_flops_match_flop_counter(counted_attention):
    """Oracle: FlopCounterMode on the lowered tiny model, forward alone and a flow-matching step
    (forward + backward). The comparable quantity: attention through explicit matmuls (fixture);
    inputs that are data (latents, sinusoid, text states) get no gradient, which the IR's backward
    rules for the patch embedding, time and text embeddings account for."""
    b = 3
    cfg = wan_dit_config("tiny")
    f, h, w = latent_grid(cfg, cfg.frames, cfg.height, cfg.width)
    with torch.device("meta"):
        model = WanDiTModel(cfg)
    model = materialize(model, "cpu", 0)
    x0 = torch.randn(b, cfg.in_channels, f, h * 2, w * 2)
    noise, text = torch.randn_like(x0), torch.randn(b, cfg.text_len, cfg.text_dim)
    sigma = torch.rand(b)
    fwd_counter = FlopCounterMode(display=False)
    with fwd_counter, torch.no_grad():
        model(x0, sigma * 1000, text)
    fwd = forward_flops(model.graph, b)
    assert abs(fwd_counter.get_total_flops() - fwd) / fwd < 0.02, (fwd_counter.get_total_flops(), fwd)
    step_counter = FlopCounterMode(display=False)
    with step_counter:
        model.flow_loss(x0, text, noise, sigma).backward()
    bwd = sum(node_backward_flops(n, b, c.seq_len) for c in model.graph.components for n in c.nodes)
    assert abs(step_counter.get_total_flops() - (fwd + bwd)) / (fwd + bwd) < 0.02, (
        step_counter.get_total_flops(), fwd + bwd)


def test_malformed_configs_fail_naming_the_node():
    with pytest.raises(IRError, match=r"node 'block0.self_attn'.*dim 40 is not divisible by heads 3"):
        build_graph(wan_dit_config("tiny", dim=40))
    with pytest.raises(IRError, match=r"node 'block0.self_attn'.*rope: head_dim must be even and at least 6.*9"):
        build_graph(wan_dit_config("tiny", dim=27))
    with pytest.raises(IRError, match=r"node 'block0.self_attn'.*rope: .*got 4"):
        build_graph(wan_dit_config("tiny", dim=12))
    with pytest.raises(IRError, match=r"node 'time_embed'.*freq_dim must be even, got 15"):
        build_graph(wan_dit_config("tiny", freq_dim=15))
    with pytest.raises(IRError, match=r"node 'patch_embed'.*patch\[0\] must be a positive integer, got 0"):
        build_graph(wan_dit_config("tiny", patch=(0, 2, 2)))
    with pytest.raises(IRError, match=r"node 'block0.cross_attn'.*context_len must be a positive integer"):
        build_graph(wan_dit_config("tiny", text_len=0))
    with pytest.raises(IRError, match=r"node 'text_proj'.*in_features must be a positive integer, got -1"):
        build_graph(wan_dit_config("tiny", text_dim=-1))
    with pytest.raises(IRError, match=r"node 'block0.self_attn'.*rope: max_seq_len must be a positive"):
        build_graph(wan_dit_config("tiny", rope_max_seq_len=0))
    att = DiTAttention(name="a", dim=36, heads=3, rope=RoPE3D())
    cross = DiTAttention(name="c", dim=36, heads=3, cross=True, context_len=4)
    with pytest.raises(IRError, match=r"node 'blk' \(DiTBlock\): sub-node widths disagree: \[36, 40\]"):
        DiTBlock(name="blk", modulation=AdaLNModulation(name="m", dim=36), self_attn=att, cross_attn=cross,
                 ffn=FeedForward(name="f", dim=40, hidden=8, activation="gelu_tanh"))
    with pytest.raises(IRError, match=r"node 'blk'.*self_attn must have cross=False"):
        DiTBlock(name="blk", modulation=AdaLNModulation(name="m", dim=36), self_attn=cross, cross_attn=att,
                 ffn=FeedForward(name="f", dim=36, hidden=8, activation="gelu_tanh"))
    with pytest.raises(IRError, match=r"node 'c'.*cross-attention takes no rope"):
        DiTAttention(name="c", dim=36, heads=3, cross=True, context_len=4, rope=RoPE3D())
    with pytest.raises(msgspec.ValidationError, match="patch"):
        msgspec.json.decode(b'{"op":"video_patch_embed","name":"p","in_channels":4,"dim":8,"patch":[1,2]}',
                            type=VideoPatchEmbed)


def test_forward_rejects_inputs_that_do_not_fit():
    cfg = wan_dit_config("tiny")
    with torch.device("meta"):
        model = WanDiTModel(cfg)
    model = materialize(model, "cpu", 0)
    t, text = torch.tensor([1.0, 2.0]), torch.randn(2, 7, cfg.text_dim)
    with pytest.raises(ValueError, match=r"latents: expected \(batch, 4, frames, height, width\), got \(2, 3, 1,"):
        model(torch.randn(2, 3, 1, 4, 4), t, text)
    with pytest.raises(ValueError, match=r"not multiples of the patch \(1, 2, 2\)"):
        model(torch.randn(2, 4, 1, 5, 4), t, text)
    with pytest.raises(ValueError, match=r"timestep: expected shape \(2,\), got \(\)"):
        model(torch.randn(2, 4, 1, 4, 4), torch.tensor(3.0), text)
    with pytest.raises(ValueError, match=r"text: expected \(2, tokens, 32\)"):
        model(torch.randn(2, 4, 1, 4, 4), t, text[..., :5])
    with pytest.raises(ValueError, match=r"grid \(1, 2, 2000\) exceeds the rope's max_seq_len 1024"):
        model(torch.randn(2, 4, 1, 4, 4000), t, text)


def test_rope3d_is_a_rotation_with_relative_scores_per_axis():
    """Oracle: RoPE's algebra in float64: norms kept; with a position shift along any one axis, q.k scores
    depend only on the difference (tables built for a larger grid and shifted by one plane)."""
    rope, head_dim = RoPE3D(theta=10000.0), 12
    assert rope.split(head_dim) == (4, 4, 4) and rope.split(128) == (44, 42, 42)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3 * 4 * 5, 2, head_dim, dtype=torch.float64, generator=g)
    k = torch.randn(1, 3 * 4 * 5, 2, head_dim, dtype=torch.float64, generator=g)
    cos, sin = (t.double() for t in rope3d_cos_sin(rope, head_dim, (3, 4, 5)))
    torch.testing.assert_close(apply_rope3d(q, cos, sin).norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)  # fp32 tables
    big_cos, big_sin = (t.double().view(4, 5, 6, head_dim) for t in rope3d_cos_sin(rope, head_dim, (4, 5, 6)))
    base = [t[:3, :4, :5].reshape(1, -1, 1, head_dim) for t in (big_cos, big_sin)]
    def scores(tabs):  # (1, heads, query token, key token)
        return torch.einsum("bmhd,bnhd->bhmn", apply_rope3d(q, *tabs), apply_rope3d(k, *tabs))

    ref = scores(base)
    for shifted in ([t[1:, :4, :5] for t in (big_cos, big_sin)], [t[:3, 1:, :5] for t in (big_cos, big_sin)],
                    [t[:3, :4, 1:] for t in (big_cos, big_sin)]):
        tabs = [t.reshape(1, -1, 1, head_dim) for t in shifted]
        torch.testing.assert_close(scores(tabs), ref, rtol=1e-5, atol=1e-5)  # float32 tables
        assert not torch.allclose(scores([tabs[0], -tabs[1]]), ref, atol=1e-3)  # the angles matter
