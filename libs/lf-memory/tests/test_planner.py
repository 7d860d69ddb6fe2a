"""The knapsack recompute planner: optimal choices, and plans that hold when applied.

Oracles: brute force over every combination of options on small random
instances (the least FLOPs under the budget); ``measure_saved_bytes`` on the
whole tiny Llama 3 / VLA (float32, CPU) for a planned model; the same model
without recomputation for outputs and gradients (``torch.equal``).
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from lfm_models import BATCH, LLAMA_SEQ, llama_inputs, vla_inputs
from torch import nn

from lf_ir import Llama3Model, VLAModel, llama3_config, materialize, next_token_loss, vla_config
from lf_ir.recipes.llama3 import build_graph as llama_graph
from lf_ir.recipes.qwen2_vl import build_graph as qwen_graph
from lf_ir.recipes.qwen2_vl import qwen2_vl_config
from lf_memory._measure import measure_saved_bytes
from lf_memory._planner import block_option_costs, plan_recompute, solve_recompute
from lf_memory._recompute_modes import apply_recompute
from lf_memory._saved_bytes import block_saved_terms, stack_shared_bytes


def _brute(items, budget):
    best = None
    for combo in itertools.product(*(sorted(item) for item in items)):
        b = sum(item[o][0] for item, o in zip(items, combo, strict=True))
        f = sum(item[o][1] for item, o in zip(items, combo, strict=True))
        if b <= budget and (best is None or (f, b) < (best[2], best[1])):
            best = (list(combo), b, f)
    return best


def test_solver_matches_brute_force():
    """Oracle: exhaustive search over 4 options for up to 6 items, 300 random instances with random budgets."""
    rng = random.Random(0)
    for _ in range(300):
        items = [{o: (rng.randint(0, 50), rng.randint(0, 40)) for o in ("none", "selective", "selective_attn", "full")}
                 for _ in range(rng.randint(1, 6))]
        budget = rng.randint(0, 200)
        got, want = solve_recompute(items, budget), _brute(items, budget)
        if want is None:
            assert got is None
            continue
        assert (got[1], got[2]) == (want[1], want[2])
        assert sum(items[i][o][0] for i, o in enumerate(got[0])) == got[1] <= budget
        assert sum(items[i][o][1] for i, o in enumerate(got[0])) == got[2]


def test_plan_extremes_and_full_fallback():
    """Oracle: the option costs; a huge budget recomputes nothing, the least-bytes budget is all full, less
    than that does not fit (all full, fits False)."""
    graph = llama_graph(llama3_config("tiny", layers=4), seq_len=LLAMA_SEQ)
    roomy = plan_recompute(graph, 10**12, BATCH, dtype_bytes=4)
    assert roomy.fits and roomy.recompute_flops == 0 and set(roomy.block_options()) == {"none"}
    tight = plan_recompute(graph, 10**12, BATCH, dtype_bytes=4, options=("full",))
    assert tight.block_options() == ["full"] * 4
    exact = plan_recompute(graph, tight.saved_bytes, BATCH, dtype_bytes=4)
    assert exact.fits and exact.block_options() == ["full"] * 4 and exact.saved_bytes == tight.saved_bytes
    over = plan_recompute(graph, tight.saved_bytes - 1, BATCH, dtype_bytes=4)
    assert not over.fits and over.block_options() == ["full"] * 4
    block = graph.components[0].blocks()[0]
    costs = block_option_costs(block, BATCH, LLAMA_SEQ, 4)
    assert costs["full"][1] == block.forward_flops(BATCH, LLAMA_SEQ) and costs["none"][1] == 0
    assert tight.recompute_flops == 4 * costs["full"][1]


def test_auto_beats_full_where_uniform_modes_do_not_fit():
    """Oracle: option costs of Llama-3-8B (seq 8192, bf16, micro-batch 1): at a budget between all-full and
    all-selective bytes only full recompute fits uniformly; the plan fits it with fewer recomputed FLOPs."""
    graph = llama_graph(llama3_config("8B"), seq_len=8192)
    full = plan_recompute(graph, 10**15, 1, options=("full",))
    selective = plan_recompute(graph, 10**15, 1, options=("selective", "full"))
    assert selective.counts()["selective"] == 32
    budget = (full.saved_bytes + selective.saved_bytes) // 2
    auto = plan_recompute(graph, budget, 1)
    assert auto.fits and auto.saved_bytes <= budget < selective.saved_bytes
    # half-way in bytes: about half the blocks can stay selective, so about half the FLOPs of full
    assert auto.counts()["full"] <= 16 and auto.recompute_flops < 0.55 * full.recompute_flops


def test_plan_covers_multimodal_components():
    """Oracle: the Qwen2-VL 7B graph: one option per ViT and decoder block, names in graph order."""
    cfg = qwen2_vl_config("7B")
    plan = plan_recompute(qwen_graph(cfg, seq_len=2048, image_patches=1024), 20 * 2**30, 1)
    assert [len(v) for v in plan.options.values()] == [cfg.vision_layers, cfg.layers]
    assert plan.block_names()[0] == "block0" and plan.block_names()[-1] == f"layer{cfg.layers - 1}"
    assert plan.fits and plan.unpredicted == []


def test_bad_arguments_raise():
    """Oracle: the contract (errors name the argument and the value)."""
    graph = llama_graph(llama3_config("tiny"), seq_len=8)
    with pytest.raises(ValueError, match="batch must be an int >= 1, got 0"):
        plan_recompute(graph, 1000, 0)
    with pytest.raises(ValueError, match="budget_bytes must be >= 0, got -1"):
        plan_recompute(graph, -1, 1)
    with pytest.raises(ValueError, match="containing 'full', got \\['none'\\]"):
        plan_recompute(graph, 1000, 1, options=("none",))
    with pytest.raises(ValueError, match="kernels must be 'cpu' or 'cuda', got 'rocm'"):
        plan_recompute(graph, 1000, 1, kernels="rocm")
    with pytest.raises(ValueError, match="stream_db must be None or an int >= 1, got 0"):
        plan_recompute(graph, 1000, 1, stream_db=0)


def _llama(layers):
    with torch.device("meta"):
        model = Llama3Model(llama3_config("tiny", layers=layers))
    return materialize(model, "cpu", 0)


def _llama_measured(model):
    ids = llama_inputs()
    params = list(model.parameters())
    nbytes, logits = measure_saved_bytes(model, ids, exclude=params)
    loss = next_token_loss(logits, ids)
    loss.backward()
    return nbytes, logits.detach(), loss.detach()


def test_planned_llama_fits_its_budget_and_is_exact():
    """Oracle: measured bytes of the whole planned tiny Llama 3 (4 blocks, CPU, so ``kernels="cpu"``) within 5%
    of the plan and under its budget; logits, loss and every gradient torch.equal to the model without recomputation."""
    reference, model = _llama(4), _llama(4)
    graph = llama_graph(model.cfg, seq_len=LLAMA_SEQ)
    cpu = {"dtype_bytes": 4, "kernels": "cpu"}  # measured on the CPU: the CPU byte rules
    full = plan_recompute(graph, 10**12, BATCH, options=("full",), **cpu)
    none = plan_recompute(graph, 10**12, BATCH, **cpu)
    budget = (full.saved_bytes + 2 * none.saved_bytes) // 3
    plan = plan_recompute(graph, budget, BATCH, **cpu)
    assert plan.fits and len(set(plan.block_options())) > 1, plan.block_options()
    chosen = apply_recompute(model.blocks, "auto", plan=plan)
    assert chosen == [i for i, o in enumerate(plan.block_options()) if o != "none"]
    measured, logits, loss = _llama_measured(model)
    _, logits_ref, loss_ref = _llama_measured(reference)
    assert abs(measured - plan.saved_bytes) <= 0.05 * measured, (measured, plan.saved_bytes)
    assert measured <= budget * 1.05
    assert torch.equal(logits, logits_ref) and torch.equal(loss, loss_ref)
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name


def test_auto_on_vla_is_bitwise_exact():
    """Oracle: the tiny VLA without recomputation; every option used once or more across its blocks."""
    def build():
        with torch.device("meta"):
            m = VLAModel(vla_config("tiny"))
        return materialize(m, "cpu", 0)

    reference, model = build(), build()
    options = ["selective_attn", "full", "selective", "none"]
    n = len(model.blocks)

    class Plan:
        def block_options(self):
            return [options[i % 4] for i in range(n)]

        def block_names(self):
            return [b.lf_node.name for b in model.blocks]

    apply_recompute(nn.ModuleList(model.blocks), "auto", plan=Plan())
    outs = []
    for m in (reference, model):
        logits = m(*vla_inputs(m))
        logits.float().square().mean().backward()
        outs.append(logits.detach())
    assert torch.equal(outs[0], outs[1])
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name


def _all(graph, mode, **kwargs):
    """The planner's bytes with every block on ``mode`` (``"none"`` / ``"selective"``: a roomy budget over
    ``(mode, "full")``; ``"full"``: only full)."""
    options = ("full",) if mode == "full" else (mode, "full")
    plan = plan_recompute(graph, 10**15, 1, None, 2, options=options, **kwargs)
    assert set(plan.block_options()) == {mode}
    return plan.saved_bytes


def _shared(graph):

    return sum(stack_shared_bytes(c.blocks()[0], 1, c.seq_len, 2) for c in graph.components if c.blocks())


@pytest.mark.parametrize("recipe", ["llama3", "wan_dit"])
@pytest.mark.parametrize("kernels", ["cuda", "cpu"])
def test_planner_counts_the_estimators_bytes(recipe, kernels):
    """Oracle: ``estimate_memory``'s activations on the same kernel path (one rank, bf16, micro-batch 1): the
    planner's all-none / all-selective / all-full bytes equal them up to the tensors every block shares (a DiT's
    text context and RoPE tables, which only the planner counts; its time embedding, which the planner counts
    once and the estimator once per checkpointed block). Before 0.4.4 the planner always used the CPU rules:
    Wan2.1-1.3B at 81 x 480 x 832 kept 129.3 GiB without recompute by the planner against 103.8 GiB by
    ``estimate_memory(kernels="cuda")``, so ``memory.recompute = "auto"`` recomputed 12 blocks where 4 fit."""
    from lf_ir.recipes import wan_dit
    from lf_memory import estimate_memory

    if recipe == "llama3":
        graph = llama_graph(llama3_config("tiny", layers=4), seq_len=256)
    else:
        graph = wan_dit.build_graph(wan_dit.wan_dit_config("tiny"))
    extra = _shared(graph)
    (comp,) = [c for c in graph.components if c.blocks()]
    blocks = comp.blocks()
    # inputs every checkpointed block keeps, the same tensor (a DiT's time embedding): the planner counts them
    # once whatever the plan (the documented overcount when no block is checkpointed), the estimator per block
    shared_in = block_saved_terms(blocks[0], 1, comp.seq_len, "full", dtype_bytes=2).get("shared_inputs", 0)
    for mode in ("none", "selective", "full"):
        want = estimate_memory(graph, None, precision="bf16", recompute=mode, kernels=kernels).activations
        got = _all(graph, mode, kernels=kernels)
        per_block = 0 if mode == "none" else len(blocks)
        assert got == want + extra + shared_in * (1 - per_block), (mode, got, want, extra, shared_in)
    if kernels == "cuda" and recipe == "llama3":  # stream_db: the decoder norms' input, as the estimator reads it
        from types import SimpleNamespace

        fsdp = SimpleNamespace(zero_stage=3, precision="bf16", tp=1, sp=False)
        est = estimate_memory(graph, fsdp, precision="bf16", kernels="cuda").activations
        assert _all(graph, "none", stream_db=2) == est + extra < _all(graph, "none")


def test_cuda_is_the_default_and_counts_fused_norms():
    """Oracle: ``lf_ir``'s CUDA norm rule: with ``kernels="cuda"`` (the default) a Llama block kept whole drops
    the CPU RMSNorm's ``x * rstd`` copies; checkpointed options keep no norm statistics, so they are equal."""
    from lf_ir import Norm

    graph = llama_graph(llama3_config("tiny", layers=2), seq_len=64)
    block = graph.components[0].blocks()[0]
    assert block_option_costs(block, 2, 64) == block_option_costs(block, 2, 64, kernels="cuda")
    cuda, cpu = block_option_costs(block, 2, 64, 2), block_option_costs(block, 2, 64, 2, kernels="cpu")
    norm = block.attn_norm
    assert isinstance(norm, Norm) and norm.kind == "rms"
    per_norm = norm.saved_bytes(2, 64, 2) - norm.saved_bytes(2, 64, 4, kernels="cuda")
    assert cpu["none"][0] - cuda["none"][0] == 2 * per_norm
    assert all(cuda[o][0] == cpu[o][0] for o in ("selective", "selective_attn", "full"))
    assert cuda["full"] == cpu["full"]
