"""The pipeline glue of multi-component recipes (``embed_inputs``, ``trunk_blocks``, ``trunk_head``).

Oracle: the model's own ``forward`` on the same weights and inputs; cutting ``trunk_blocks``
at every trunk node must give the same output as running it whole (a pipeline stage runs
one slice), and every side tensor must have the sample on dim 0.
"""

from __future__ import annotations

import pytest
import torch

from lf_ir import materialize
from lf_ir._pipeline_glue import block_span, blocks_between
from lf_ir.recipes import qwen2_vl, vla, wan_dit

B = 2


def _qwen():
    cfg = qwen2_vl.qwen2_vl_config("tiny", layers=3)
    ids = torch.randint(0, cfg.image_token_id, (B, 12), generator=torch.Generator().manual_seed(0))
    ids[:, 2:6] = cfg.image_token_id
    pixels = torch.randn(B * 16, cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2)
    mask = torch.ones(B, 12, dtype=torch.long)
    mask[1, -3:] = 0
    return qwen2_vl.Qwen2VLModel(cfg, qwen2_vl.build_graph(cfg, 12, 16)), "text", (
        ids, pixels, torch.tensor([[1, 4, 4]] * B), mask)


def _vla():
    cfg = vla.vla_config("tiny", layers=3)
    return vla.VLAModel(cfg), "backbone", (
        torch.randint(0, 256, (B, 64, 64, 3), dtype=torch.uint8), torch.randint(0, 64, (B, 16)),
        torch.rand(B, 16) > 0.3, torch.randn(B, 39), torch.randint(64, 320, (B, cfg.num_action_tokens - 1)))


def _wan():
    cfg = wan_dit.wan_dit_config("tiny", layers=3)
    return wan_dit.WanDiTModel(cfg, wan_dit.build_graph(cfg, 8)), "video", (
        torch.randn(B, 4, 2, 4, 4), torch.tensor([10.0, 700.0]), torch.randn(B, 7, 32))


@pytest.mark.parametrize("make", [_qwen, _vla, _wan], ids=["qwen2_vl", "vla", "wan_dit"])
def test_glue_composes_to_forward_at_every_cut(make):
    torch.manual_seed(0)
    with torch.device("meta"):
        model, trunk, _ = make()
    model = materialize(model, "cpu", 0)
    _, _, inputs = make()
    want = model(*inputs)
    x, *side = model.embed_inputs(*inputs)
    assert all(t.shape[0] == B for t in (x, *side))
    first, end = block_span(model.components[trunk])
    assert len(blocks_between(model.components[trunk])) == len(model.graph.component(trunk).blocks()) == 3
    for cut in range(first, end + 1):
        h = model.trunk_blocks(x, *side, start=0, stop=cut)
        h = model.trunk_blocks(h, *side, start=cut, stop=None)
        torch.testing.assert_close(model.trunk_head(h, *side), want, rtol=0, atol=0)
