"""Recompute on every block type the recipes use: Wan DiT blocks, pi0 joint blocks, Qwen2-VL ViT and decoder blocks.

Oracles, on the whole tiny ``wan_dit``, ``vla_flow`` and ``qwen2_vl`` models (float32, CPU):

- bytes: ``measure_saved_bytes`` (saved-tensor hooks plus storages alive after the forward) of the
  whole training forward, within 5% of the planner's prediction on the CPU rules (``kernels="cpu"``:
  non-block nodes' ``saved_bytes``, shared tensors once, and each block's option cost);
- numbers: the same model without recomputation; output, loss and every gradient ``torch.equal``;
- auto: at a budget between the all-full and all-none totals the plan's bytes are under the budget
  and its recomputed FLOPs below full recompute's (the planner's own price list).
"""

from __future__ import annotations

import functools

import pytest
import torch
from lfm_models import BATCH, recipe_case

from lf_memory._measure import measure_saved_bytes
from lf_memory._planner import _option_costs, plan_recompute
from lf_memory._recompute_modes import apply_recompute, recompute_flags

RECIPES = ("wan_dit", "vla_flow", "qwen2_vl")
MODES = ("none", "full", "selective", "every_k", "auto")
_BIG = 2**50


def _batch(recipe: str) -> int:
    return 1 if recipe == "qwen2_vl" else BATCH


def _run(model, inputs, forward, loss_fn):
    """(saved bytes of the forward, output, loss, {name: grad})."""
    nbytes, out = measure_saved_bytes(lambda *a: forward(model, a), *inputs, exclude=model.parameters())
    loss = loss_fn(out, inputs)
    loss.backward()
    return nbytes, out.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@functools.cache
def _reference(recipe: str):
    return _run(*recipe_case(recipe))


def _plan(graph, batch, budget, options=None):
    kwargs = {} if options is None else {"options": options}  # measured on the CPU: the CPU byte rules
    return plan_recompute(graph, budget, batch, None, 4, key_padding={"backbone"}, kernels="cpu", **kwargs)


def _predicted(graph, batch: int, per_block: list[str]) -> int:
    """The all-none plan's bytes less, per recomputed block, what its option frees (shared tensors once)."""
    total = _plan(graph, batch, _BIG, ("none", "full")).saved_bytes
    nodes = [(c, n) for c in graph.components for n in c.blocks()]
    for (comp, node), option in zip(nodes, per_block, strict=True):
        costs = _option_costs(node, batch, comp.seq_len, 4, comp.name == "backbone", False, "cpu")
        total -= costs["none"][0] - costs[option][0]
    return total


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_recompute_bytes_and_exact_numbers(recipe, mode):
    """Oracle: measured bytes within 5% of the prediction; output, loss, grads equal the run without recompute."""
    model, inputs, forward, loss_fn = recipe_case(recipe)
    graph, batch = model.graph, _batch(recipe)
    n = len(model.blocks)
    assert n == sum(len(c.blocks()) for c in graph.components) and n >= 3
    if mode == "auto":
        none = _plan(graph, batch, _BIG, ("none", "full"))
        full = _plan(graph, batch, _BIG, ("full",))
        budget = (full.saved_bytes + 2 * none.saved_bytes) // 3
        plan = _plan(graph, batch, budget)
        assert plan.fits and plan.saved_bytes <= budget
        assert 0 < plan.recompute_flops < full.recompute_flops, (plan.recompute_flops, full.recompute_flops)
        assert plan.block_names() == [b.lf_node.name for b in model.blocks]
        per_block = plan.block_options()
        apply_recompute(model.blocks, "auto", plan=plan)
    else:
        flags = recompute_flags(n, mode, every=2)
        per_block = [("selective" if mode == "selective" else "full") if f else "none" for f in flags]
        apply_recompute(model.blocks, mode, every=2)
    predicted = _predicted(graph, batch, per_block)
    measured, out, loss, grads = _run(model, inputs, forward, loss_fn)
    assert abs(measured - predicted) <= 0.05 * measured, (recipe, mode, per_block, measured, predicted)
    _, out_ref, loss_ref, grads_ref = _reference(recipe)
    assert torch.equal(loss, loss_ref) and torch.equal(out, out_ref)
    for name, grad in grads.items():
        assert grad is not None and torch.equal(grad, grads_ref[name]), name


def test_block_types_without_selective_rule_plan_none_or_full():
    """Oracle: the contract; a block type that opts in with ``is_block`` only gets "none" / "full", and the
    selective options of it raise naming the node."""
    from lf_ir import MLP
    from lf_memory._saved_bytes import block_options, block_saved_terms

    class PlainBlock(MLP, frozen=True, kw_only=True, tag="test_plain_block"):
        is_block = True

    node = PlainBlock(name="p0", dim=8, hidden=16)
    assert block_options(node) == ("none", "full")
    assert block_saved_terms(node, 2, 3, "full") == {"input": 2 * 3 * 8 * 4}
    with pytest.raises(ValueError, match="block 'p0' \\(PlainBlock\\) has no selective recompute rule"):
        block_saved_terms(node, 2, 3, "selective")
    with pytest.raises(TypeError, match="got MLP"):
        block_saved_terms(MLP(name="m", dim=8, hidden=16), 2, 3, "full")
