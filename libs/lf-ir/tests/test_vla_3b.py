"""The ~3B sizes of the ``vla`` and ``vla_flow`` recipes (OpenVLA- / pi0-class).

Oracles: the parameter count of the lowered model on the meta device (every parameter tensor, summed) against
the IR's ``param_count`` and against counts written out by hand from the layer shapes; the unchanged sizes
against the counts they had before the new fields (pinned).
"""

from __future__ import annotations

import pytest
import torch

from lf_ir import param_count
from lf_ir.recipes.vla import VLAModel, build_graph, vla_config
from lf_ir.recipes.vla_flow import build_graph as flow_graph
from lf_ir.recipes.vla_flow import vla_flow_config


def _vla_3b_by_hand() -> int:
    """SigLIP-So400m/14 at 224 px (bias-free attention) + Llama-3.2-3B-shaped backbone with LayerNorms."""
    vd, vh, d, h, kv = 1152, 4304, 3072, 8192, 8 * 128
    patches = (224 // 14) ** 2
    vision = (3 * 14 * 14 * vd + vd) + patches * vd + 27 * (4 * vd * vd + 2 * vd * vh + vh + vd + 4 * vd) \
        + 2 * vd + (vd * d + d)
    vocab, seq = 32000 + 256, patches + 16 + 1 + 16 - 1
    backbone = seq * d + 28 * (2 * d * d + 2 * d * kv + 3 * d * h + 4 * d) + 2 * d + d * vocab
    return vision + vocab * d + (39 * d + d) + backbone


def test_vla_3b_parameter_count():
    """Oracle: the meta-device model's parameters, the IR count and the hand count agree at 3,433,970,928."""
    cfg = vla_config("3B")
    with torch.device("meta"):
        model = VLAModel(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == param_count(model.graph) == _vla_3b_by_hand() == 3_433_970_928
    assert cfg.image_size == 224 and cfg.prefix_len == 256 + 16 + 1 and cfg.mlp_hidden == 8192
    block = model.graph.component("backbone").nodes[1]
    assert block.mlp.activation == "swiglu" and not block.mlp.bias and block.attention.kv_heads == 8


def test_vla_flow_3b_with_metaworld_batch_fields():
    """Oracle: the IR count; the 3B size with Meta-World's state / action fields (what bench/vla_peer.py trains)
    stays above 3.0B (the vision encoder, Gemma-2B-shaped backbone and 300M expert dominate)."""
    cfg = vla_flow_config("3B", max_instruction_len=16, state_dim=39, action_dim=4, action_horizon=4)
    assert cfg.image_size == 224
    assert param_count(flow_graph(cfg)) == 3_129_531_636


@pytest.mark.parametrize(("size", "expected"), [("tiny", 72_800), ("small", 2_437_568)])
def test_existing_vla_sizes_unchanged(size, expected):
    """Oracle: the counts of these sizes before ``hidden`` / ``vision_hidden`` / ``mlp_activation`` existed."""
    cfg = vla_config(size)
    assert param_count(build_graph(cfg)) == expected
    assert cfg.mlp_activation == "gelu" and cfg.mlp_hidden == cfg.dim * cfg.mlp_ratio


def test_swiglu_backbone_lowers_and_runs():
    """Oracle: the IR's parameter shapes; a tiny SwiGLU model's forward gives (batch, action tokens, vocab)."""
    from lf_ir import materialize

    cfg = vla_config("tiny", mlp_activation="swiglu", hidden=48, vision_hidden=40, image_size=32, patch_size=8)
    with torch.device("meta"):
        model = VLAModel(cfg)
    model = materialize(model, "cpu", seed=0)
    assert sum(p.numel() for p in model.parameters()) == param_count(model.graph)
    n = 2
    logits = model(torch.zeros(n, 32, 32, 3, dtype=torch.uint8), torch.zeros(n, 16, dtype=torch.long),
                   torch.ones(n, 16, dtype=torch.bool), torch.zeros(n, 39),
                   torch.full((n, cfg.num_action_tokens - 1), cfg.text_vocab_size))
    assert logits.shape == (n, cfg.num_action_tokens, cfg.vocab_size) and torch.isfinite(logits).all()
