"""IR FLOPs of the tiny llama3 and vla recipes against ``torch.utils.flop_counter.FlopCounterMode`` on the
lowered models, forward and forward + backward, within 2%.

FlopCounterMode has no formula for the CPU SDPA kernels (``_scaled_dot_product_flash_attention_for_cpu``,
and the fused CPU kernel behind a dense mask): on the CPU it counts every matmul except the attention scores
and weighted values. So each test runs twice: (1) with attention computed by lf_kernels' explicit-matmul
reference (the counter sees all of it), compared with the IR totals; (2) through the real CPU path,
compared with the IR totals minus the attention term 4 * batch * seq^2 * dim per block (forward; twice that
in backward), which is exactly the quantity the counter can see there.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lf_ir._lower as lower
from lf_ir._graph import backward_flops, forward_flops
from lf_ir._nodes import TransformerBlock
from lf_ir.recipes.llama3 import Llama3Model, build_graph, llama3_config, next_token_loss
from lf_ir.recipes.vla import VLAModel, vla_config
from lf_kernels import attention_reference

B = 2


def _math_attention(monkeypatch):
    monkeypatch.setattr(lower, "attention", lambda q, k, v, mask, key_padding=None: attention_reference(
        q, k, v, mask, key_padding=key_padding)[0])


def _attention_term(graph, batch: int) -> int:
    return sum(4 * batch * c.seq_len ** 2 * n.attention.dim for c in graph.components for n in c.nodes
               if isinstance(n, TransformerBlock))


def _count(step) -> tuple[int, int]:
    fwd = FlopCounterMode(display=False)
    with fwd, torch.no_grad():
        step(backward=False)
    total = FlopCounterMode(display=False)
    with total:
        step(backward=True)
    return fwd.get_total_flops(), total.get_total_flops()


def _llama3_step():
    cfg, seq = llama3_config("tiny"), 24
    with torch.device("meta"):
        model = Llama3Model(cfg, build_graph(cfg, seq_len=seq))
    model = lower.materialize(model, "cpu", 0)
    ids = torch.randint(0, cfg.vocab_size, (B, seq))

    def step(backward):
        logits = model(ids)
        if backward:
            next_token_loss(logits, ids).backward()
    return model.graph, step


def _vla_step():
    cfg = vla_config("tiny", image_size=32)
    with torch.device("meta"):
        model = VLAModel(cfg)
    model = lower.materialize(model, "cpu", 0)
    img = torch.randint(0, 256, (B, 32, 32, 3), dtype=torch.uint8)
    ids = torch.randint(0, cfg.text_vocab_size, (B, cfg.max_instruction_len))
    act = torch.randint(cfg.text_vocab_size, cfg.vocab_size, (B, cfg.num_action_tokens - 1))

    def step(backward):
        logits = model(img, ids, torch.ones_like(ids, dtype=torch.bool), torch.randn(B, cfg.state_dim), act)
        if backward:
            logits.float().square().mean().backward()
    return model.graph, step


@pytest.mark.parametrize("build", [_llama3_step, _vla_step], ids=["llama3", "vla"])
@pytest.mark.parametrize("path", ["math", "cpu_sdpa"])
def test_ir_flops_match_flop_counter(monkeypatch, build, path):
    """Oracle: FlopCounterMode (module docstring says what it sees on each path)."""
    if path == "math":
        _math_attention(monkeypatch)
    graph, step = build()
    measured_fwd, measured_total = _count(step)
    fwd, bwd = forward_flops(graph, B), backward_flops(graph, B)
    if path == "cpu_sdpa":
        fwd, bwd = fwd - _attention_term(graph, B), bwd - 2 * _attention_term(graph, B)
    assert abs(measured_fwd - fwd) / fwd < 0.02, (measured_fwd, fwd)
    assert abs(measured_total - (fwd + bwd)) / (fwd + bwd) < 0.02, (measured_total, fwd + bwd)
