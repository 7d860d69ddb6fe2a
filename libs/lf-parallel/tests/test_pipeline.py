"""Pipeline parallel on CPU processes (gloo). Oracle: the single-process llama3-tiny run.

One spawned world of 4 processes runs every case: each schedule at pp = 2 (ranks 0-1;
the interleaved schedules with 2 virtual stages per rank) and at pp = 4, and pp = 2 x dp = 2.
Each case takes 3 SGD steps on the same batch and then one more forward/backward;
the per-step losses, the final gradients and the parameters (gathered by name from the
stages, which keep the full model's names) must equal the single-process run's within
1e-5 relative: float32 round-off only, since micro-batches change the summation order.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from _pp_cp_world import rel_close, run_world

from lf_ir import Llama3Model, llama3_config, materialize, next_token_loss
from lf_ir.recipes.llama3 import build_graph
from lf_kernels import MaskSpec
from lf_parallel._pipeline import build_pipeline, pipeline_step
from lf_parallel._stages import balanced_partition, split_stages, stage_ranks

CFG = llama3_config("tiny", layers=8)
SEED, STEPS, BATCH, SEQ, MICRO = 0, 3, 8, 16, 4
CASES = [("gpipe", 2, 1, 1), ("1f1b", 2, 1, 1), ("interleaved_1f1b", 2, 2, 1), ("zero_bubble", 2, 2, 1),
         ("gpipe", 4, 1, 1), ("1f1b", 4, 1, 1), ("interleaved_1f1b", 4, 2, 1), ("zero_bubble", 4, 2, 1),
         ("1f1b", 2, 1, 2)]
"""(schedule, pp, virtual_stages, dp)."""


def _ids() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))


def _optimizer(params):
    # SGD, not Adam: Adam divides by the gradient's scale, which turns float32 round-off in
    # near-zero gradients into parameter differences far above it.
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _case_name(case) -> str:
    return "-".join(map(str, case))


def _run_case(rank: int, case, groups, out_dir: str) -> None:
    schedule, pp, virtual, dp = case
    if rank >= pp * dp:
        return
    dp_rank, pp_rank = divmod(rank, pp)
    pp_group, dp_group = groups[(pp, dp)][0][dp_rank], groups[(pp, dp)][1][pp_rank]
    sched, modules = build_pipeline(
        build_graph(CFG, SEQ), pp_rank=pp_rank, pp=pp, schedule=schedule, n_microbatches=MICRO // dp,
        loss_fn=next_token_loss, mask=MaskSpec("causal"), device=torch.device("cpu"), seed=SEED,
        group=pp_group, virtual_stages=virtual)
    params = [p for m in modules for p in m.parameters()]
    opt = _optimizer(params)
    ids = _ids().chunk(dp)[dp_rank]
    losses = []
    for step in range(STEPS + 1):
        step_losses = pipeline_step(sched, pp_rank=pp_rank, pp=pp, inputs=(ids,), target=ids)
        if step_losses:
            loss = torch.stack(step_losses).mean()
            if dp > 1:
                dist.all_reduce(loss, group=dp_group)
                loss /= dp
            losses.append(loss.item())
        if dp > 1:  # data parallel over the pipeline replicas: average the gradients
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad /= dp
        if step < STEPS:
            opt.step()
            opt.zero_grad()
    if dp_rank == 0:
        state = {n: (p.detach(), p.grad) for m in modules for n, p in m.named_parameters()}
        torch.save({"state": state, "losses": losses}, os.path.join(out_dir, f"{_case_name(case)}-{pp_rank}.pt"))


def _world(rank: int, world: int, out_dir: str) -> None:
    groups = {}
    for _, pp, _, dp in CASES:  # every rank creates every group, in the same order
        if (pp, dp) in groups:
            continue
        pp_groups = [dist.new_group([d * pp + r for r in range(pp)]) for d in range(dp)]
        dp_groups = [dist.new_group([d * pp + r for d in range(dp)]) if dp > 1 else None for r in range(pp)]
        groups[(pp, dp)] = (pp_groups, dp_groups)
    for case in CASES:
        _run_case(rank, case, groups, out_dir)
        dist.barrier()


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pipeline"))
    run_world(_world, 4, out)
    return out


@pytest.fixture(scope="module")
def reference():
    """Single process, full batch: losses of every step and the final gradients and parameters."""
    with torch.device("meta"):
        model = Llama3Model(CFG, build_graph(CFG, SEQ))
    model = materialize(model, "cpu", SEED)
    opt = _optimizer(model.parameters())
    ids, losses = _ids(), []
    for step in range(STEPS + 1):
        loss = next_token_loss(model(ids), ids)
        loss.backward()
        losses.append(loss.item())
        if step < STEPS:
            opt.step()
            opt.zero_grad()
    return {n: (p.detach(), p.grad) for n, p in model.named_parameters()}, losses


@pytest.mark.parametrize("case", CASES, ids=_case_name)
def test_pipeline_equals_single_process(world_dir, reference, case):
    ref_state, ref_losses = reference
    pp = case[1]
    got_state, got_losses = {}, None
    for r in range(pp):
        saved = torch.load(os.path.join(world_dir, f"{_case_name(case)}-{r}.pt"), weights_only=True)
        assert not set(got_state) & set(saved["state"]), "two stages hold the same parameter"
        got_state.update(saved["state"])
        if r == pp - 1:
            got_losses = saved["losses"]
    assert set(got_state) == set(ref_state)
    rel_close(torch.tensor(got_losses), torch.tensor(ref_losses), 1e-5, "losses")
    for name, (param, grad) in ref_state.items():
        rel_close(got_state[name][1], grad, 1e-5, f"grad {name}")
        rel_close(got_state[name][0], param, 1e-5, f"param {name}")
    assert ref_losses[-1] < ref_losses[0]  # the steps trained the model


def test_balanced_partition_is_optimal():
    """Oracle: brute force over all cut positions."""
    import itertools

    costs = [5, 1, 1, 3, 2, 2, 7, 1]
    for parts in (1, 2, 3, 4, 8):
        bounds = balanced_partition(costs, parts)
        got = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs)), strict=True))
                   for cuts in itertools.combinations(range(1, len(costs)), parts - 1))
        assert got == best and bounds[0] == 0 and bounds[-1] == len(costs)
    with pytest.raises(ValueError, match="cannot split 8 pipeline units into 9 stages"):
        balanced_partition(costs, 9)


def test_split_stages_layout():
    """Oracle: the llama3 node list (embed, 8 blocks, norm, head) and the looped placement."""
    graph = build_graph(CFG, SEQ)
    specs = split_stages(graph, 2, virtual_stages=2)
    assert [(s.start, s.stop, s.rank) for s in specs] == [(0, 3, 0), (3, 5, 1), (5, 7, 0), (7, 11, 1)]
    assert stage_ranks(2, 2) == [[0, 2], [1, 3]]
    assert sum(s.flops for s in specs) == sum(
        s.flops for s in split_stages(graph, 1))  # every node counted once
    with pytest.raises(ValueError, match="pp=4 x virtual_stages=4 = 16 stages but component 'text' has only 8"):
        split_stages(graph, 4, virtual_stages=4)


def test_split_stages_puts_encoders_first():
    """Oracle: the VLA graph's vision/tokens/state components are all on stage 0, the backbone split."""
    from lf_ir import vla_config
    from lf_ir.recipes.vla import build_graph as vla_graph

    specs = split_stages(vla_graph(vla_config("tiny")), 2)
    assert specs[0].encoders == ("vision", "tokens", "state") and specs[1].encoders == ()
    assert specs[0].trunk == "backbone" and specs[0].start == 0 and specs[1].stop == 5


SIDE_CASES = [("1f1b", 2, 1), ("interleaved_1f1b", 2, 2)]
"""(schedule, pp, virtual_stages) of the side-tensor test."""


def _packed_side() -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row packed documents: (positions, document_ids), (BATCH, SEQ) int64, positions restart per document."""
    gen = torch.Generator().manual_seed(5)
    docs = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for row in range(BATCH):
        cuts = sorted(torch.randperm(SEQ - 1, generator=gen)[:2].add(1).tolist())
        for c in cuts:
            docs[row, c:] += 1
    starts = torch.zeros_like(docs)
    for row in range(BATCH):
        for s in range(1, SEQ):
            starts[row, s] = starts[row, s - 1] if docs[row, s] == docs[row, s - 1] else s
    return torch.arange(SEQ).expand(BATCH, SEQ) - starts, docs


def _side_world(rank: int, world: int, out_dir: str) -> None:
    positions, docs = _packed_side()
    ids = _ids()
    for schedule, pp, virtual in SIDE_CASES:
        sched, modules = build_pipeline(
            build_graph(CFG, SEQ), pp_rank=rank, pp=pp, schedule=schedule, n_microbatches=MICRO,
            loss_fn=lambda out, tgt: next_token_loss(out, tgt) / MICRO,
            mask=MaskSpec("causal"), device=torch.device("cpu"), seed=SEED, virtual_stages=virtual,
            side=("positions", "document_ids"), scale_grads=False)
        losses = pipeline_step(sched, pp_rank=rank, pp=pp, inputs=(ids, positions, docs), target=ids)
        grads = {n: p.grad for m in modules for n, p in m.named_parameters()}
        torch.save({"grads": grads, "losses": losses}, os.path.join(out_dir, f"side-{schedule}-{rank}.pt"))


def test_side_tensors_through_stages(tmp_path):
    """Packed-document ``positions`` and ``document_ids`` flow with the hidden states through 2 pipeline ranks
    (1F1B, and interleaved with 4 stages), ``scale_grads=False`` with a loss already divided by the micro-batch
    count. Oracle: the single-process model on the whole batch with the same positions and document ids: the
    micro-batch losses sum to its mean loss and the gradients equal its gradients within 1e-5 relative; the
    document mask matters (the loss without it differs)."""
    run_world(_side_world, 2, str(tmp_path))
    positions, docs = _packed_side()
    with torch.device("meta"):
        model = Llama3Model(CFG, build_graph(CFG, SEQ))
    model = materialize(model, "cpu", SEED)
    ids = _ids()
    loss = next_token_loss(model(ids, positions=positions, document_ids=docs), ids)
    loss.backward()
    plain = next_token_loss(model(ids), ids).item()
    ref = {n: p.grad for n, p in model.named_parameters()}
    for schedule, _, _ in SIDE_CASES:
        got = {}
        for r in range(2):
            saved = torch.load(os.path.join(tmp_path, f"side-{schedule}-{r}.pt"), weights_only=True)
            got.update(saved["grads"])
        rel_close(torch.stack(saved["losses"]).sum(), loss.detach(), 1e-5, f"{schedule} loss")
        assert abs(plain - loss.item()) > 1e-3  # the document ids changed the result
        assert set(got) == set(ref)
        for name, grad in ref.items():
            rel_close(got[name], grad, 1e-5, f"{schedule} grad {name}")
