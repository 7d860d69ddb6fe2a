"""The qwen2_vl recipe from the IR alone. Oracles: the lowered module's own parameters,
FlopCounterMode, decode(encode(graph)), RoPE's algebra (M-RoPE on equal ids is 1D RoPE;
2D RoPE keeps norms and scores depend only on the (row, column) offset), and the
placeholder-count rules of the peer."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lf_ir import RECIPES, IRError, RoPE, apply_rope, forward_flops, from_json, materialize, param_count, to_json
from lf_ir import rope_cos_sin as rope1d_cos_sin
from lf_ir._cost import node_backward_flops
from lf_ir._mrope import MRoPE, VisionRoPE
from lf_ir._mrope_torch import apply_rope_fp32, mrope_cos_sin, vision_rope_cos_sin
from lf_ir.recipes.llama3 import next_token_loss
from lf_ir.recipes.qwen2_vl import Qwen2VLModel, build_graph, qwen2_vl_config

PATCH = 3 * 2 * 14 * 14


def _tiny(tied=False, **kw):
    cfg = qwen2_vl_config("tiny", tie_embeddings=tied, **kw)
    with torch.device("meta"):
        model = Qwen2VLModel(cfg)
    return cfg, model


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_param_count_equals_lowered_module(tied):
    """Oracle: the parameters of the lowered module (a tied head owns none)."""
    cfg, model = _tiny(tied)
    assert param_count(model.graph) == sum(p.numel() for p in model.parameters())
    vision = param_count(model.graph, component="vision")
    vd, hid = cfg.vision_dim, cfg.vision_dim * cfg.spatial_merge_size ** 2
    per_block = 4 * vd * vd + 4 * vd + 2 * vd * vd * cfg.vision_mlp_ratio + vd * cfg.vision_mlp_ratio + vd + 4 * vd
    assert vision == vd * PATCH + cfg.vision_layers * per_block + 2 * vd + hid * hid + hid + hid * cfg.dim + cfg.dim


@pytest.mark.parametrize("tied", [False, True])
def test_forward_and_backward_flops_match_flop_counter(monkeypatch, tied):
    """Oracle: FlopCounterMode on the lowered tiny model, attention by explicit matmuls (which the counter
    sees; CPU SDPA it does not), one 4x4-patch image per sample, forward alone and forward + backward
    (IR: 2 x forward except the patch embedding, whose pixels need no gradient)."""
    import lf_ir._lower_mm as lower_mm
    from lf_kernels import attention_reference

    monkeypatch.setattr(lower_mm, "attention", lambda q, k, v, mask, key_padding=None: attention_reference(
        q, k, v, mask, key_padding=key_padding)[0])
    b, s, grid = 3, 24, torch.tensor([[1, 4, 4]] * 3)
    cfg = qwen2_vl_config("tiny", tie_embeddings=tied)
    with torch.device("meta"):
        model = Qwen2VLModel(cfg, build_graph(cfg, seq_len=s, image_patches=16))
    model = materialize(model, "cpu", 0)
    ids = torch.randint(0, 400, (b, s))
    ids[:, 2:6] = cfg.image_token_id
    pixels = torch.randn(3 * 16, PATCH)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids, pixels, grid)
    fwd = forward_flops(model.graph, b)
    assert abs(counter.get_total_flops() - fwd) / fwd < 0.02, (counter.get_total_flops(), fwd)
    step = FlopCounterMode(display=False)
    with step:
        next_token_loss(model(ids, pixels, grid), ids).backward()
    bwd = sum(node_backward_flops(n, b, c.seq_len) for c in model.graph.components for n in c.nodes)
    assert abs(step.get_total_flops() - (fwd + bwd)) / (fwd + bwd) < 0.02, (step.get_total_flops(), fwd + bwd)


def test_json_round_trip_and_registry():
    """Oracle: decode(encode(graph)) == graph; the recipe registry."""
    g = build_graph(qwen2_vl_config("tiny", tie_embeddings=True), seq_len=64, image_patches=64)
    data = to_json(g)
    assert from_json(data) == g
    for tag in (b'"op":"mm_block"', b'"kind":"mrope"', b'"kind":"vision_2d"', b'"op":"patch_merger"',
                b'"op":"patch_embed_3d"', b'"activation":"quick_gelu"'):
        assert tag in data, tag
    assert RECIPES["qwen2_vl"].build_graph is build_graph
    assert [len(c.blocks()) for c in g.components] == [2, 2]


def test_malformed_configs_fail_naming_the_node():
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*dim 60 is not divisible by heads 8"):
        build_graph(qwen2_vl_config("tiny", dim=60, heads=8, merger_dim=60))
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*heads 4 is not divisible by kv_heads 3"):
        build_graph(qwen2_vl_config("tiny", kv_heads=3))
    with pytest.raises(IRError, match=r"node 'layer0.attention'.*mrope sections \[2, 3, 4\] sum to 9 but must sum "
                                      r"to head_dim / 2 = 8"):
        build_graph(qwen2_vl_config("tiny", mrope_section=(2, 3, 4)))
    with pytest.raises(IRError, match=r"node 'block0.attention'.*divisible by 4 for 2D rotary"):
        build_graph(qwen2_vl_config("tiny", vision_dim=36, vision_heads=6))
    with pytest.raises(IRError, match=r"node 'vision'.'merger' produces width 96 but 'text' runs at width 64"):
        build_graph(qwen2_vl_config("tiny", merger_dim=96))
    with pytest.raises(IRError, match=r"node 'block0.mlp'.*activation must be"):
        build_graph(qwen2_vl_config("tiny", vision_act="relu"))


def test_placeholder_count_and_grid_errors():
    """Oracle: the peer's rule (placeholders == merged tokens) and get_rope_index's grid accounting."""
    cfg, model = _tiny()
    model = materialize(model, "cpu", 0)
    ids = torch.randint(0, 400, (1, 16))
    ids[0, 2:5] = cfg.image_token_id  # 3 placeholders, the grid gives 4 tokens
    with pytest.raises(ValueError, match=r"input_ids hold 3 placeholders \(id 500\) but the vision tower gives 4"):
        model(ids, torch.randn(16, PATCH), torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match=r"pixel_values: 15 patches but image_grid_thw describes 16"):
        model(ids, torch.randn(15, PATCH), torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match=r"image_grid_thw\[0\] = \[1, 3, 4\]"):
        model(ids, torch.randn(12, PATCH), torch.tensor([[1, 3, 4]]))


def test_mrope_on_equal_ids_is_plain_rope():
    """Oracle: lf's 1D RoPE (checked against HF Llama elsewhere) with the same positions."""
    pos_bs = torch.randint(0, 500, (2, 9))
    cos, sin = mrope_cos_sin(MRoPE(theta=1e4, sections=(2, 3, 3)), 16, pos_bs.expand(3, 2, 9), torch.float32)
    cos1, sin1 = rope1d_cos_sin(RoPE(theta=1e4), 16, pos_bs, torch.float32)
    assert torch.equal(cos, cos1) and torch.equal(sin, sin1)
    pos = torch.stack([pos_bs, pos_bs + 1, pos_bs + 2])  # distinct ids: bands differ from 1D RoPE
    cos3, _ = mrope_cos_sin(MRoPE(theta=1e4, sections=(2, 3, 3)), 16, pos, torch.float32)
    assert torch.equal(cos3[..., :2], cos1[..., :2]) and not torch.allclose(cos3[..., 2:8], cos1[..., 2:8])


def test_vision_rope_keeps_norms_and_depends_on_offsets_only():
    """Oracle: a 2D rotation keeps norms, and q(r1, c1).k(r2, c2) depends on (r1 - r2, c1 - c2) only."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 16, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, 6, 16, dtype=torch.float64, generator=g)
    pos = torch.randint(0, 20, (6, 2), generator=g)
    rope = VisionRoPE(theta=1e4)

    def scores(p):
        cos, sin = vision_rope_cos_sin(rope, 16, p)
        qr = apply_rope(q, cos[None].double(), sin[None].double())
        return qr, qr @ apply_rope(k, cos[None].double(), sin[None].double()).transpose(-1, -2)
    qr, base = scores(pos)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(scores(pos + torch.tensor([7, 3]))[1], base, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(scores(pos * torch.tensor([1, 2]))[1], base, atol=1e-3)
    half = apply_rope_fp32(q.half(), *(t[None] for t in vision_rope_cos_sin(rope, 16, pos)))
    assert half.dtype == torch.float16


def test_text_only_forward_is_causal():
    """Oracle: causality (changing token j changes logits at positions >= j only)."""
    cfg, model = _tiny()
    model = materialize(model, "cpu", 1).double()
    ids = torch.randint(0, 400, (2, 10))
    base = model(ids)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 400
    out = model(changed)
    assert torch.equal(out[:, :6], base[:, :6]) and not torch.allclose(out[:, 6:], base[:, 6:])
    with pytest.raises(ValueError, match=r"input_ids: expected \(batch, seq\)"):
        model(ids[0])


def test_planner_rules_cover_every_node():
    """Oracles: lf_kernels.dense_mask's kept pairs for the unmasked FLOPs (causal decoder, per-frame ViT
    segments); the byte rules run for every node of the graph (saved-activation estimates need them)."""
    from lf_ir import _cost
    from lf_kernels import MaskSpec, dense_mask

    g = build_graph(qwen2_vl_config("tiny"), seq_len=40, image_patches=64)
    vision, text = g.components
    attn = text.blocks()[0].attention
    proj = attn.forward_flops(2, 40) - 4 * 2 * 40 * 40 * attn.dim
    kept = int(dense_mask(MaskSpec("causal"), 40, 40).sum())
    assert attn.forward_flops_unmasked(2, 40) == proj + 4 * 2 * attn.dim * kept
    vattn = vision.blocks()[0].attention
    vproj = vattn.forward_flops(1, 64) - 4 * 64 * 64 * vattn.dim
    assert vattn.forward_flops_unmasked(1, 64, doc_lens=[16, 48]) == vproj + 4 * vattn.dim * (16 ** 2 + 48 ** 2)
    for comp in g.components:
        for node in comp.nodes:
            assert _cost.node_forward_bytes(node, 2, comp.seq_len, 2) > 0, node.name
            assert _cost.node_saved_bytes(node, 2, comp.seq_len, 2) >= 0, node.name
            assert _cost.node_forward_flops_unmasked(node, 2, comp.seq_len) <= node.forward_flops(2, comp.seq_len)
