"""Pipeline parallel for multi-component models (qwen2_vl, vla, wan_dit). Oracle: the single-process run.

One spawned world of 2 gloo processes runs every case at pp = 2: stage 0 runs the
encoders (vision tower, text projection, state / token embeddings) and the recipe's glue
(``embed_inputs``) before its trunk blocks; side tensors (M-RoPE ids, key padding, the
DiT's text context, time modulation and RoPE tables) travel with the hidden states.
Each case takes 3 SGD steps on one batch and then one more forward/backward; the
per-step losses, the first step's gradients, the final gradients and the parameters (gathered by name from the
stages, which keep the full model's names) must equal the single-process run's within
1e-5 relative: float32 round-off only, since micro-batches change the summation order.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from _pp_cp_world import rel_close, run_world
from torch import nn

from lf_ir import materialize, next_token_loss
from lf_ir.recipes import qwen2_vl, vla, wan_dit
from lf_kernels import MaskSpec
from lf_parallel._pipeline import build_stage_module, pipeline_step
from lf_parallel._pipeline_mm import MultimodalStageModule, build_multimodal_pipeline
from lf_parallel._stages import split_stages

SEED, STEPS, BATCH, MICRO = 0, 3, 8, 4
CASES = [("qwen2_vl", "1f1b", 1), ("vla", "gpipe", 1), ("wan_dit", "1f1b", 1),
         ("qwen2_vl", "interleaved_1f1b", 2), ("wan_dit", "interleaved_1f1b", 2), ("vla", "zero_bubble", 2)]
"""(recipe, schedule, virtual stages per rank), all at pp = 2."""

QWEN = qwen2_vl.qwen2_vl_config("tiny", layers=4)
QWEN_GRAPH = qwen2_vl.build_graph(QWEN, seq_len=16, image_patches=16)
VLA = vla.vla_config("tiny", layers=4)
WAN = wan_dit.wan_dit_config("tiny", layers=4)
WAN_GRAPH = wan_dit.build_graph(WAN, seq_len=8)


def _qwen_model() -> nn.Module:
    return qwen2_vl.Qwen2VLModel(QWEN, QWEN_GRAPH)


def _vla_model() -> nn.Module:
    return vla.VLAModel(VLA)


def _wan_model() -> nn.Module:
    return wan_dit.WanDiTModel(WAN, WAN_GRAPH)


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((pred.float() - target) ** 2).mean()


def _batch(recipe: str) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(forward inputs, loss target), each with the sample on dim 0 (qwen2_vl's patch rows: 16 per sample)."""
    gen = torch.Generator().manual_seed(3)
    if recipe == "qwen2_vl":  # one 4x4-patch image per sample: 4 merged tokens at ids 2..5
        ids = torch.randint(0, QWEN.image_token_id, (BATCH, 16), generator=gen)
        ids[:, 2:6] = QWEN.image_token_id
        pixels = torch.randn(BATCH * 16, QWEN.in_channels * QWEN.temporal_patch_size * QWEN.patch_size ** 2,
                             generator=gen)
        return (ids, pixels, torch.tensor([[1, 4, 4]] * BATCH)), ids
    if recipe == "vla":
        n = VLA.num_action_tokens
        image = torch.randint(0, 256, (BATCH, VLA.image_size, VLA.image_size, 3), generator=gen, dtype=torch.uint8)
        instr = torch.randint(0, VLA.text_vocab_size, (BATCH, VLA.max_instruction_len), generator=gen)
        instr_mask = torch.rand(BATCH, VLA.max_instruction_len, generator=gen) > 0.3
        actions = torch.randint(VLA.text_vocab_size, VLA.vocab_size, (BATCH, n), generator=gen)
        state = torch.randn(BATCH, VLA.state_dim, generator=gen)
        return (image, instr, instr_mask, state, actions[:, :-1]), actions
    latents = torch.randn(BATCH, WAN.in_channels, 2, 4, 4, generator=gen)  # a (2, 2, 2) token grid
    t = torch.rand(BATCH, generator=gen) * 1000
    text = torch.randn(BATCH, WAN.text_len, WAN.text_dim, generator=gen)
    return (latents, t, text), torch.randn(latents.shape, generator=gen)


RECIPES = {"qwen2_vl": (_qwen_model, next_token_loss, 0.1), "vla": (_vla_model, _ce, 0.5),
           "wan_dit": (_wan_model, _mse, 0.2)}
"""Recipe -> (model builder, loss_fn(output, target), SGD learning rate). Each step amplifies the float32
round-off of the last: the rates keep the losses going down smoothly (qwen2_vl at 0.5 overshoots at step 3,
wan_dit's cross-attention key-bias gradients, small sums of cancelling terms, drift to 1.2e-5 at 0.5)."""


def _optimizer(recipe: str, params):
    # SGD, not Adam: Adam divides by the gradient's scale, which turns float32 round-off in
    # near-zero gradients into parameter differences far above it.
    return torch.optim.SGD(params, lr=RECIPES[recipe][2], momentum=0.9)


def _case_name(case) -> str:
    return "-".join(map(str, case))


def _run_case(rank: int, case, out_dir: str) -> None:
    recipe, schedule, virtual = case
    build, loss_fn, _ = RECIPES[recipe]
    sched, modules = build_multimodal_pipeline(
        build, pp_rank=rank, pp=2, schedule=schedule, n_microbatches=MICRO, loss_fn=loss_fn,
        device=torch.device("cpu"), seed=SEED, virtual_stages=virtual)
    opt = _optimizer(recipe, [p for m in modules for p in m.parameters()])
    inputs, target = _batch(recipe)
    losses, first = [], {}
    for step in range(STEPS + 1):
        step_losses = pipeline_step(sched, pp_rank=rank, pp=2, inputs=inputs, target=target)
        if step_losses:
            losses.append(torch.stack(step_losses).mean().item())
        if step == 0:
            first = {n: p.grad.clone() for m in modules for n, p in m.named_parameters()}
        if step < STEPS:
            opt.step()
            opt.zero_grad()
    state = {n: (p.detach(), p.grad) for m in modules for n, p in m.named_parameters()}
    path = os.path.join(out_dir, f"{_case_name(case)}-{rank}.pt")
    torch.save({"state": state, "losses": losses, "first": first}, path)


def _world(rank: int, world: int, out_dir: str) -> None:
    import torch.distributed as dist

    for case in CASES:
        _run_case(rank, case, out_dir)
        dist.barrier()


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pipeline_mm"))
    run_world(_world, 2, out)
    return out


@functools.cache
def _reference(recipe: str):
    """Single process, full batch: losses of every step and the final gradients and parameters."""
    build, loss_fn, _ = RECIPES[recipe]
    with torch.device("meta"):
        model = build()
    model = materialize(model, "cpu", SEED)
    opt = _optimizer(recipe, model.parameters())
    (inputs, target), losses, first = _batch(recipe), [], {}
    for step in range(STEPS + 1):
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            first = {n: p.grad.clone() for n, p in model.named_parameters()}
        if step < STEPS:
            opt.step()
            opt.zero_grad()
    return {n: (p.detach(), p.grad) for n, p in model.named_parameters()}, losses, first


@pytest.mark.parametrize("case", CASES, ids=_case_name)
def test_multimodal_pipeline_equals_single_process(world_dir, case):
    ref_state, ref_losses, ref_first = _reference(case[0])
    got_state, got_losses, got_first = {}, None, {}
    for r in range(2):
        saved = torch.load(os.path.join(world_dir, f"{_case_name(case)}-{r}.pt"), weights_only=True)
        assert not set(got_state) & set(saved["state"]), "two stages hold the same parameter"
        got_state.update(saved["state"])
        got_first.update(saved["first"])
        got_losses = saved["losses"] or got_losses
    assert set(got_state) == set(ref_state)
    rel_close(torch.tensor(got_losses), torch.tensor(ref_losses), 1e-5, "losses")
    for name, (param, grad) in ref_state.items():
        assert grad is not None and got_state[name][1] is not None, f"{name}: no gradient"
        rel_close(got_first[name], ref_first[name], 1e-5, f"first-step grad {name}")
        rel_close(got_state[name][1], grad, 1e-5, f"grad {name}")
        rel_close(got_state[name][0], param, 1e-5, f"param {name}")
    assert ref_losses[-1] < ref_losses[0]  # the steps trained the model


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_stages_chain_to_the_model_output(recipe):
    """Oracle: the whole model's forward on the same weights; 4 stages run one after another in one process."""
    build = RECIPES[recipe][0]
    with torch.device("meta"):
        model = build()
    inputs, _ = _batch(recipe)
    want = materialize(model, "cpu", SEED)(*inputs)
    specs = split_stages(model.graph, 4)
    assert specs[0].encoders and specs[0].start == 0 and not any(s.encoders for s in specs[1:])
    x = inputs
    for spec in specs:
        with torch.device("meta"):
            stage = build_stage_module(model.graph, spec, MaskSpec("causal"), model=build())
        assert isinstance(stage, MultimodalStageModule)
        out = materialize(stage, "cpu", SEED)(*x)
        x = out if isinstance(out, tuple) else (out,)
        assert all(t.shape[0] == BATCH for t in x)  # every side tensor has the sample on dim 0
    torch.testing.assert_close(x[0], want, rtol=0, atol=0)


def test_stage_errors_name_the_problem():
    """Oracle: the documented errors (no glue; head tied to an embedding on another stage)."""
    from lf_ir import Llama3Model, llama3_config
    from lf_ir.recipes.llama3 import build_graph

    cfg = llama3_config("tiny", tie_embeddings=True)
    spec = split_stages(build_graph(cfg, 8), 2)[1]
    with torch.device("meta"):
        with pytest.raises(TypeError, match="Llama3Model cannot be pipelined: it has no"):
            MultimodalStageModule(Llama3Model(cfg, build_graph(cfg, 8)), spec)
        qwen = qwen2_vl.qwen2_vl_config("tiny", tie_embeddings=True)
        spec = split_stages(qwen2_vl.build_graph(qwen, 16, 16), 2)[1]
        with pytest.raises(ValueError, match="head 'head' .* is tied to 'embed'"):
            MultimodalStageModule(qwen2_vl.Qwen2VLModel(qwen, qwen2_vl.build_graph(qwen, 16, 16)), spec)
    with pytest.raises(ValueError, match="runs one stage per rank"):
        build_multimodal_pipeline(_wan_model, pp_rank=0, pp=2, schedule="1f1b", n_microbatches=2, loss_fn=_mse,
                                  device=torch.device("cpu"), seed=0, virtual_stages=2)


def test_encoder_stage_without_model_says_to_pass_it():
    """Oracle: the documented ValueError when stage 0 holds encoders and no recipe model is given."""
    cfg = qwen2_vl.qwen2_vl_config("tiny")
    graph = qwen2_vl.build_graph(cfg, 16, 16)
    spec = split_stages(graph, 2)[0]
    assert spec.encoders  # stage 0 carries the vision tower
    with torch.device("meta"), pytest.raises(ValueError, match=r"encoder components .* model=recipe_model"):
        build_stage_module(graph, spec, MaskSpec(kind="causal"))
