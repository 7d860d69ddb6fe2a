"""Saved bytes predicted from the IR's per-node ``saved_bytes`` against measurement, every recipe and option.

Oracle: ``measure_saved_bytes`` (saved-tensor hooks plus storages alive after
forward, deduplicated by storage) on the lowered tiny recipes' blocks, float32
on CPU, called with the arguments the models pass (Qwen2-VL: M-RoPE / vision
RoPE tables, one ViT segment). The issue asks for 5%. The DiT and joint blocks are checked on
the whole models in test_recompute_recipes.py.
"""

from __future__ import annotations

import copy

import pytest
from lfm_models import BATCH, block_cases, qwen_block_cases
from torch import nn

from lf_memory._measure import measure_saved_bytes
from lf_memory._recompute import _default_backend
from lf_memory._recompute_modes import _apply_mode
from lf_memory._saved_bytes import BLOCK_OPTIONS, block_saved_bytes, stack_saved_bytes, stack_shared_bytes

CASES = [(n, b, a, {}, s, kp) for n, b, a, s, kp in block_cases()] + qwen_block_cases()


class _Plan:
    """A stand-in RecomputePlan: one option per block."""

    def __init__(self, options, names):
        self._options, self._names = options, names

    def block_options(self):
        return self._options

    def block_names(self):
        return self._names


def _measure(blocks, args, kwargs) -> int:
    params = [p for block in blocks for p in block.parameters()]
    x = args[0].clone().requires_grad_()

    def run(x, *rest, **kw):
        for block in blocks:
            x = block(x, *rest, **kw)
        return x

    nbytes, out = measure_saved_bytes(run, x, *args[1:], exclude=params, **kwargs)
    out.sum().backward()
    return nbytes


PARAMS = [pytest.param(case, option, id=f"{case[0]}-{option}") for case in CASES for option in BLOCK_OPTIONS]


@pytest.mark.parametrize(("case", "option"), PARAMS)
def test_block_option_within_5_percent(case, option):
    """Oracle: measured bytes of one block under each planner option within 5% of the prediction."""
    name, block, args, kwargs, seq, key_padding = case
    block = copy.deepcopy(block)
    _apply_mode([block], "auto", 2, _default_backend(), _Plan([option], [block.lf_node.name]))
    predicted = block_saved_bytes(block.lf_node, args[0].shape[0], seq, option, key_padding=key_padding)
    measured = _measure([block], args, kwargs)
    assert abs(measured - predicted) <= 0.05 * measured, (name, option, measured, predicted)


@pytest.mark.parametrize("mode", ["none", "full", "selective", "every_k"])
def test_qwen2_vl_decoder_stack_within_5_percent(mode):
    """Oracle: measured bytes of 3 Qwen2-VL decoder blocks (shared M-RoPE tables) within 5% of
    ``stack_saved_bytes``, which counts the shared rotary tables once. They are the caller's inputs here, so
    the measurement sees them only when a block saves them for backward (not when every block is fully
    checkpointed); in a model they are created by its forward and stay alive in every mode."""
    _, block, args, kwargs, seq, _ = qwen_block_cases()[0]
    blocks = [copy.deepcopy(block) for _ in range(3)]
    _apply_mode(blocks, mode, 2, _default_backend())
    nodes = [b.lf_node for b in blocks]
    predicted = stack_saved_bytes(nodes, BATCH, seq, mode, every=2)
    if mode == "full":
        predicted -= stack_shared_bytes(nodes[0], BATCH, seq, 4)
    measured = _measure(blocks, args, kwargs)
    assert abs(measured - predicted) <= 0.05 * measured, (mode, measured, predicted)


def test_auto_plan_checks_blocks():
    """Oracle: the contract; a plan for other blocks or without a plan raises, nothing applied."""
    _, block, *_ = CASES[2]
    blocks = nn.ModuleList([copy.deepcopy(block)])
    with pytest.raises(ValueError, match="needs plan=RecomputePlan"):
        _apply_mode(blocks, "auto", 2, _default_backend())
    with pytest.raises(ValueError, match="plan has 2 blocks but 1 were given"):
        _apply_mode(blocks, "auto", 2, _default_backend(), _Plan(["full", "full"], ["a", "b"]))
    with pytest.raises(ValueError, match="is IR node 'layer0' but the plan's block 0 is 'layer7'"):
        _apply_mode(blocks, "auto", 2, _default_backend(), _Plan(["full"], ["layer7"]))
    with pytest.raises(ValueError, match="got 'half'"):
        _apply_mode(blocks, "auto", 2, _default_backend(), _Plan(["half"], ["layer0"]))
