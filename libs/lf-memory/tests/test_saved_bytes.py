"""Predicted saved-activation bytes (from the IR) against measured ones, per recompute mode.

Oracle: ``measure_saved_bytes`` on the lowered tiny VLA (vision and backbone
blocks) and tiny Llama 3 blocks, float32 on CPU: tensors autograd saves
(``saved_tensors_hooks``) plus storages still alive after forward (selective
checkpointing's cache), deduplicated by storage ``data_ptr``. The issue asks
for 5%; the rules are exact on the CPU path, so we require 5% and report.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lfm_models import BATCH, block_cases

from lf_memory import (
    apply_recompute,
    block_saved_bytes,
    block_saved_terms,
    measure_saved_bytes,
    stack_saved_bytes,
)
from lf_memory._recompute_modes import _apply_mode

CASES = block_cases()
BACKENDS = ["composable", "function"]


def _measure(blocks, args) -> int:
    """Saved bytes of running ``blocks`` in sequence on ``args`` (x first), then frees them."""
    params = [p for block in blocks for p in block.parameters()]
    x = args[0].clone().requires_grad_()

    def run(x, *rest):
        for block in blocks:
            x = block(x, *rest)
        return x

    nbytes, out = measure_saved_bytes(run, x, *args[1:], exclude=params)
    out.sum().backward()
    return nbytes


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_block_prediction_matches_measurement(case, mode):
    """Oracle: measured bytes of one block (model's own argument types) within 5% of the IR rule."""
    name, block, args, seq, key_padding = case
    block = copy.deepcopy(block)
    if mode != "none":
        apply_recompute([block], mode)
    predicted = block_saved_bytes(block.lf_node, BATCH, seq, mode, key_padding=key_padding)
    measured = _measure([block], args)
    assert abs(measured - predicted) <= 0.05 * measured, (name, mode, measured, predicted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["none", "full", "selective", "every_k"])
@pytest.mark.parametrize("case", CASES[1:], ids=[c[0] for c in CASES[1:]])
def test_stack_prediction_matches_measurement(case, mode, backend):
    """Oracle: measured bytes of a 3-block stack (VLA backbone: shared key padding; Llama 3:
    RoPE, causal) within 5% of ``stack_saved_bytes``; every=2 recomputes blocks 0 and 2."""
    _, block, args, seq, key_padding = case
    blocks = [copy.deepcopy(block) for _ in range(3)]
    _apply_mode(blocks, mode, 2, backend)
    predicted = stack_saved_bytes([b.lf_node for b in blocks], BATCH, seq, mode, every=2,
                                  key_padding=key_padding)
    measured = _measure(blocks, args)
    assert abs(measured - predicted) <= 0.05 * measured, (mode, measured, predicted)


def test_llama_block_numbers_by_hand():
    """Oracle: hand arithmetic for tiny Llama 3 (b=2, s=24, d=64, kv=32, H=160, 4 heads, fp32).
    none: 8*T*d + 2*T (rstd) + 2*b*s*hd (cos, sin) + 2*T*kv + b*h*s (lse) + 4*T*H elements;
    full: T*d; selective: T*d (input) + T*(2d+2kv) + T*d (sdpa) + T*(d+2H) + b*h*s;
    selective_attn: selective less the SDPA output and the lse."""
    node = CASES[2][1].lf_node
    t, d, kv, hidden = BATCH * 24, 64, 32, 160
    none = 8 * t * d + 2 * t + 2 * BATCH * 24 * 16 + 2 * t * kv + BATCH * 4 * 24 + 4 * t * hidden
    assert block_saved_bytes(node, BATCH, 24, "none") == 4 * none == 240768
    assert block_saved_bytes(node, BATCH, 24, "full") == 4 * t * d
    selective = t * d + t * (2 * d + 2 * kv) + t * d + t * (d + 2 * hidden) + BATCH * 4 * 24
    assert block_saved_bytes(node, BATCH, 24, "selective") == 4 * selective
    assert block_saved_bytes(node, BATCH, 24, "selective_attn") == 4 * (selective - t * d - BATCH * 4 * 24)
    terms = block_saved_terms(node, BATCH, 24, "none")
    assert terms["attention"] == node.attention.saved_bytes(BATCH, 24, 4) and set(terms) == {
        "attn_norm", "attention", "mlp_norm", "mlp"}


def test_modes_order_and_ir_equality():
    """Oracle: "none" is the IR node's own saved_bytes (float32 and bf16); full < selective_attn <
    selective < none for every tiny block; the recompute terms halve in bf16 (all but the fp32 lse)."""
    for _, block, _, seq, key_padding in CASES:
        node = block.lf_node
        for nbytes in (4, 2):
            assert block_saved_bytes(node, BATCH, seq, "none", key_padding=key_padding, dtype_bytes=nbytes) == \
                node.saved_bytes(BATCH, seq, nbytes, key_padding=key_padding)
        sizes = [block_saved_bytes(node, BATCH, seq, m, key_padding=key_padding)
                 for m in ("full", "selective_attn", "selective", "none")]
        assert sizes == sorted(sizes) and len(set(sizes)) == 4
        half = block_saved_terms(node, BATCH, seq, "selective", dtype_bytes=2)
        full = block_saved_terms(node, BATCH, seq, "selective")
        assert all(half[k] * 2 == v for k, v in full.items() if k != "attention.lse")


def test_bad_arguments_raise():
    """Oracle: the contract (errors name the argument and the value)."""
    node = CASES[0][1].lf_node
    with pytest.raises(ValueError, match="got 'every_k'"):
        block_saved_bytes(node, 1, 4, "every_k")
    with pytest.raises(ValueError, match="seq must be >= 1, got 0"):
        block_saved_bytes(node, 1, 0)
    with pytest.raises(TypeError, match="got Norm"):
        block_saved_bytes(node.attn_norm, 1, 4)
    with pytest.raises(ValueError, match="recompute_every must be an int >= 1, got 0"):
        stack_saved_bytes([node], 1, 4, "every_k", every=0)


def test_measure_counts_a_linear_input():
    """Oracle: nn.Linear saves its (4, 8) float32 input for the weight gradient: 128 bytes."""
    lin = torch.nn.Linear(8, 3)
    nbytes, out = measure_saved_bytes(lin, torch.randn(4, 8), exclude=lin.parameters())
    assert nbytes == 128 and out.shape == (4, 3)
