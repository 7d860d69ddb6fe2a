"""Saved-bytes and traffic rules of the IR nodes. Oracle: ``torch.autograd.graph.saved_tensors_hooks`` on the
lowered module (every saved tensor deduplicated by storage, parameters excluded), float32 and bf16, attention
through lf_kernels' CPU path; the prediction must be within 5% (it is exact for the kernels of torch 2.13)."""

from __future__ import annotations

import pytest
import torch
from _saved_bytes import measure_saved

from lf_ir._lower import lower_node, materialize
from lf_ir._mask import Mask
from lf_ir._nodes import (
    MLP,
    Attention,
    Embedding,
    IRError,
    LearnedPositional,
    Linear,
    LMHead,
    Norm,
    PatchEmbed2D,
    RoPE,
    TransformerBlock,
)
from lf_ir.recipes.llama3 import build_graph as build_llama3
from lf_ir.recipes.llama3 import llama3_config
from lf_ir.recipes.vla import build_graph as build_vla
from lf_ir.recipes.vla import vla_config
from lf_kernels import MaskSpec

B, S, D = 2, 12, 16
DTYPES = [(torch.float32, 4), (torch.bfloat16, 2)]


def _lowered(node, dtype):
    with torch.device("meta"):
        module = lower_node(node)
    return materialize(module, "cpu", 0).to(dtype)


def _kernel_mask(mask) -> MaskSpec:
    m = mask if isinstance(mask, Mask) else Mask(kind=mask, prefix_len=5 if mask == "prefix_lm" else None)
    return MaskSpec(m.kind, prefix_len=m.prefix_len) if m.kind == "prefix_lm" else MaskSpec(m.kind)


SIMPLE = [
    Embedding(name="embed", num_embeddings=50, dim=D),
    Linear(name="proj", in_features=D, out_features=24),
    Linear(name="proj_nobias", in_features=D, out_features=24, bias=False),
    Norm(name="ln", dim=D),
    Norm(name="rms", dim=D, kind="rms"),
    LearnedPositional(name="pos", length=20, dim=D),
    MLP(name="gelu", dim=D, hidden=40),
    MLP(name="swiglu", dim=D, hidden=40, activation="swiglu", bias=False),
    LMHead(name="head", dim=D, vocab_size=50),
    PatchEmbed2D(name="patch", in_channels=3, image_size=8, patch_size=4, dim=D),
]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("node", SIMPLE, ids=lambda n: n.name)
def test_simple_node_saved_bytes_match_autograd(node, dtype, nbytes):
    """Oracle: saved_tensors_hooks on the lowered node (module docstring)."""
    module = _lowered(node, dtype)
    if isinstance(node, Embedding):
        x = torch.randint(0, 50, (B, S))
    elif isinstance(node, PatchEmbed2D):
        x = torch.randn(B, 3, 8, 8, dtype=dtype)
    else:
        x = torch.randn(B, S, D, dtype=dtype, requires_grad=True)
    measured = measure_saved(lambda: module(x), module)
    predicted = node.saved_bytes(B, S if not isinstance(node, PatchEmbed2D) else node.num_patches, nbytes)
    assert abs(predicted - measured) <= 0.05 * max(measured, 1), (predicted, measured)


ATTENTION = [
    Attention(name="causal_gqa_rope", dim=D, heads=4, kv_heads=2, mask="causal", rope=RoPE()),
    Attention(name="full_mha_bias", dim=D, heads=4, kv_heads=4, mask="full", bias=True),
    Attention(name="prefix_gqa", dim=D, heads=4, kv_heads=2, mask=Mask(kind="prefix_lm", prefix_len=5)),
    Attention(name="prefix_mha", dim=D, heads=4, kv_heads=4, mask="prefix_lm"),
]


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("key_padding", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("node", ATTENTION, ids=lambda n: n.name)
def test_attention_saved_bytes_match_autograd(node, key_padding, dtype, nbytes):
    """Oracle: saved_tensors_hooks through lf_kernels.attention's CPU backends (flash, dense mask)."""
    module = _lowered(node, dtype)
    x = torch.randn(B, S, D, dtype=dtype, requires_grad=True)
    pad = torch.ones(B, S, dtype=torch.bool) if key_padding else None
    if pad is not None:
        pad[0, -3:] = False
    measured = measure_saved(lambda: module(x, _kernel_mask(node.mask), pad), module)
    predicted = node.saved_bytes(B, S, nbytes, key_padding=key_padding)
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)


@pytest.mark.parametrize(("dtype", "nbytes"), DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("recipe", ["llama3", "vla"])
def test_recipe_blocks_saved_bytes_match_autograd(recipe, dtype, nbytes):
    """Oracle: saved_tensors_hooks on each lowered TransformerBlock of the tiny recipes (RMSNorm + SwiGLU +
    GQA + RoPE for llama3; LayerNorm + GELU + prefix-LM / full for vla)."""
    graph = build_llama3(llama3_config("tiny"), seq_len=S) if recipe == "llama3" else build_vla(vla_config("tiny"))
    blocks = [n for c in graph.components for n in c.nodes if isinstance(n, TransformerBlock)]
    assert {b.attention.mask_spec.kind for b in blocks} == ({"causal"} if recipe == "llama3"
                                                            else {"full", "prefix_lm"})
    for node in blocks:
        module = _lowered(node, dtype)
        x = torch.randn(B, S, node.in_dim, dtype=dtype, requires_grad=True)
        measured = measure_saved(lambda m=module, n=node, x=x: m(x, _kernel_mask(n.attention.mask)), module)
        predicted = node.saved_bytes(B, S, nbytes)
        assert abs(predicted - measured) <= 0.05 * measured, (node.name, predicted, measured)


def test_saved_bytes_scale_and_hand_counts():
    """Oracle: hand counts from the rules in lf_ir._bytes for a llama3-8B block at seq 4096, bf16."""
    block = build_llama3(llama3_config("8B"), seq_len=4096).components[0].nodes[1]
    t, d, kv, h = 4096, 4096, 1024, 14336
    rms = (2 * t * d + t) * 4
    attn = (3 * t * d + 2 * t * kv + 2 * t * 128) * 2 + 32 * t * 4
    mlp = (t * d + 4 * t * h) * 2
    assert block.saved_bytes(1, 4096, 2) == 2 * rms + attn + mlp
    assert block.saved_bytes(3, 4096, 2) == 3 * block.saved_bytes(1, 4096, 2)


def test_forward_bytes_hand_counts_and_errors():
    """Oracle: the traffic model of lf_ir._bytes counted by hand for a linear and a GELU MLP."""
    lin = Linear(name="l", in_features=8, out_features=4)
    assert lin.forward_bytes(2, 3, 4) == (6 * 8 + 6 * 4 + 8 * 4 + 4) * 4
    mlp = MLP(name="m", dim=8, hidden=16)
    params = 2 * 8 * 16 + 16 + 8
    assert mlp.forward_bytes(1, 2, 2) == (2 * (8 + 16) + 2 * 2 * 16 + 2 * (16 + 8) + params) * 2
    with pytest.raises(IRError, match=r"node 'l' \(Linear\): dtype_bytes must be a positive integer, got 0"):
        lin.saved_bytes(1, 1, 0)
    att = Attention(name="a", dim=16, heads=4, kv_heads=2, mask="causal")
    dense = Attention(name="a", dim=16, heads=4, kv_heads=2, mask=Mask(kind="block_causal", frame_tokens=4))
    assert dense.forward_bytes(2, 8, 2) - att.forward_bytes(2, 8, 2) == 8 * 8  # the bool mask is read
