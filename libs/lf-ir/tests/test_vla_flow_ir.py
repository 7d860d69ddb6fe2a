"""The vla_flow IR graph: sizes, parameter names and counts, FLOPs and saved bytes.

Oracles: the lowered module's state dict (names, shapes, count); ``torch.utils.flop_counter.FlopCounterMode``
on the lowered tiny model (forward and forward + backward within 2%), run twice as ``test_ir_flops.py`` does:
with attention through lf_kernels' explicit-matmul reference (the counter sees everything; compared with the IR
totals) and through the real CPU SDPA path (the counter does not see the attention core, so the IR totals
less the joint-attention term ``4 * heads * head_dim * kept_pairs`` per layer, twice that in backward);
``torch.autograd.graph.saved_tensors_hooks`` on the lowered nodes for ``saved_bytes``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lf_ir._lower as lower
import lf_ir._lower_expert as lower_expert
from lf_ir import IRError, from_json, materialize, param_count, to_json
from lf_ir._graph import backward_flops, forward_flops
from lf_ir._nodes_expert import ActionTimeEmbed, JointAttentionBlock
from lf_ir.recipes.vla_flow import VLAFlowModel, build_graph, vla_flow_config
from lf_kernels import attention_reference

B = 2


def _tiny(**kw):
    cfg = vla_flow_config("tiny", image_size=32, patch_size=8, **kw)
    with torch.device("meta"):
        model = VLAFlowModel(cfg)
    return cfg, materialize(model, "cpu", 0)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_param_names_shapes_and_counts_equal_the_lowered_module(activation):
    """Oracle: the lowered module's state dict (the patch embedding's conv is named ``conv`` there)."""
    cfg, model = _tiny(mlp_activation=activation)
    expected = {}
    for comp in model.graph.components:
        for i, node in enumerate(comp.nodes):
            for key, shape in node.param_shapes().items():
                key = f"conv.{key}" if comp.name == "vision" and i == 0 else key
                expected[f"components.{comp.name}.layers.{i}.{key}"] = shape
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    assert sum(p.numel() for p in model.parameters()) == param_count(model.graph)
    last = model.graph.component("backbone").nodes[-1]
    assert last.prefix_kv_only and "prefix.q.weight" not in last.param_shapes()
    assert set(last.tp_dims()) == set(last.param_shapes())


def test_sizes_round_trip_and_errors():
    for size in ("tiny", "small", "3B"):
        graph = build_graph(vla_flow_config(size))
        assert from_json(to_json(graph)) == graph
    big = build_graph(vla_flow_config("3B"))
    # pi0-like: ~3.1B (pi0 reports 3.3B with GeGLU Gemma-2B, SigLIP-So400m and a 300M expert)
    assert 3.0e9 < param_count(big) < 3.3e9
    expert = sum(n.param_shapes()[k][0] * (n.param_shapes()[k][1] if len(n.param_shapes()[k]) > 1 else 1)
                 for n in big.component("backbone").nodes[1:] for k in n.param_shapes() if k.startswith("suffix."))
    assert 2.8e8 < expert < 3.3e8  # the action expert's layers: pi0's "300M"
    with pytest.raises(ValueError, match="unknown vla_flow size 'huge'"):
        vla_flow_config("huge")
    with pytest.raises(IRError, match="heads 4 is not divisible by kv_heads 3"):
        build_graph(vla_flow_config("tiny", kv_heads=3))
    with pytest.raises(IRError, match="layers must be >= 1"):
        build_graph(vla_flow_config("tiny", layers=0))
    blk = big.component("backbone").nodes[1]
    with pytest.raises(IRError, match="must exceed suffix_len 50"):
        blk.forward_flops(1, 50)


def _joint_attention_term(graph, batch: int) -> int:
    comp = graph.component("backbone")
    return sum(4 * batch * n.heads * n.head_dim * n.kept_pairs(comp.seq_len) for n in comp.nodes
               if isinstance(n, JointAttentionBlock))


def _vision_attention_term(graph, batch: int) -> int:
    comp = graph.component("vision")
    return sum(4 * batch * comp.seq_len ** 2 * n.attention.dim for n in comp.blocks())


def _count(step) -> tuple[int, int]:
    fwd = FlopCounterMode(display=False)
    with fwd, torch.no_grad():
        step(backward=False)
    total = FlopCounterMode(display=False)
    with total:
        step(backward=True)
    return fwd.get_total_flops(), total.get_total_flops()


@pytest.mark.parametrize("path", ["math", "cpu_sdpa"])
def test_ir_flops_match_flop_counter(monkeypatch, path):
    """Oracle: FlopCounterMode (module docstring says what it sees on each path)."""
    if path == "math":
        def math_attention(q, k, v, mask, key_padding=None):
            return attention_reference(q, k, v, mask, key_padding=key_padding)[0]
        monkeypatch.setattr(lower, "attention", math_attention)
        monkeypatch.setattr(lower_expert, "attention", math_attention)
    cfg, model = _tiny(max_instruction_len=5)
    g = torch.Generator().manual_seed(0)
    batch = dict(image=torch.randint(0, 256, (B, 32, 32, 3), dtype=torch.uint8, generator=g),
                 instruction_ids=torch.randint(0, cfg.text_vocab_size, (B, 5), generator=g),
                 instruction_mask=torch.tensor([[1, 1, 1, 0, 0], [1] * 5], dtype=torch.bool),
                 state=torch.randn(B, cfg.state_dim, generator=g),
                 actions=torch.randn(B, cfg.action_horizon, cfg.action_dim, generator=g),
                 action_mask=torch.ones(B, cfg.action_horizon, dtype=torch.bool))

    def step(backward):
        loss, _ = model.training_loss(batch)
        if backward:
            loss.backward()
    measured_fwd, measured_total = _count(step)
    graph = model.graph
    fwd, bwd = forward_flops(graph, B), backward_flops(graph, B)
    if path == "cpu_sdpa":
        unseen = _joint_attention_term(graph, B) + _vision_attention_term(graph, B)
        fwd, bwd = fwd - unseen, bwd - 2 * unseen
    assert abs(measured_fwd - fwd) / fwd < 0.02, (measured_fwd, fwd)
    assert abs(measured_total - (fwd + bwd)) / (fwd + bwd) < 0.02, (measured_total, fwd + bwd)


def _measure_saved(fn, module) -> int:
    """Unique storage bytes packed by autograd during ``fn()``, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    held: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            held[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    out.float().sum().backward()
    return sum(held.values())


def _lowered(node, dtype):
    with torch.device("meta"):
        module = lower.lower_node(node)
    return materialize(module, "cpu", 0).to(dtype)


@pytest.mark.parametrize(("dtype", "nbytes"), [(torch.float32, 4), (torch.bfloat16, 2)], ids=["f32", "bf16"])
@pytest.mark.parametrize("variant", ["gqa", "mha_kv_only", "swiglu"])
def test_joint_block_saved_bytes_match_autograd(dtype, nbytes, variant):
    """Oracle: saved_tensors_hooks on the lowered block (inputs require grad, as inside the model)."""
    p, h = 9, 3
    node = JointAttentionBlock(name="b", dim=24, expert_dim=16, heads=4, kv_heads=4 if variant == "mha_kv_only" else 2,
                               head_dim=8, hidden=40, expert_hidden=20, suffix_len=h,
                               prefix_kv_only=variant == "mha_kv_only",
                               mlp_activation="swiglu" if variant == "swiglu" else "gelu")
    module = _lowered(node, dtype)
    x_pre = torch.randn(B, p, 24, dtype=dtype, requires_grad=True)
    x_suf = torch.randn(B, h, 16, dtype=dtype, requires_grad=True)
    pad = torch.ones(B, p, dtype=torch.bool)
    pad[0, 5:7] = False

    def run():
        pre, suf = module(x_pre, x_suf, pad)
        return suf.sum() + (pre.sum() if pre is not None else 0)
    assert node.saved_bytes(B, p + h, nbytes) == _measure_saved(run, module)


@pytest.mark.parametrize(("dtype", "nbytes"), [(torch.float32, 4), (torch.bfloat16, 2)], ids=["f32", "bf16"])
def test_action_time_embed_saved_bytes_match_autograd(dtype, nbytes):
    """Oracle: saved_tensors_hooks on the lowered node (the noisy actions are data, as in training)."""
    node = ActionTimeEmbed(name="embed", action_dim=4, width=16)
    module = _lowered(node, dtype)
    actions, sigma = torch.randn(B, 5, 4, dtype=dtype), torch.rand(B)
    assert node.saved_bytes(B, 5, nbytes) == _measure_saved(lambda: module(actions, sigma), module)
