"""``clip_grad_norm_`` / ``total_norm`` on the gradients of real plans in one 4-process gloo CPU world.

Oracle: the single process. Each case parallelizes the tiny llama3 under a plan (meshes and placements as
training makes them: TP DTensors on ``tp``, FSDP2 on the 1-D dp mesh for the parameters TP leaves whole,
``(dp_shard, tp)`` 2-D, HSDP's ``Replicate`` x ``Shard``, plain DDP tensors), runs one backward, gathers every
gradient to its full tensor and computes ``torch.nn.utils.clip_grad_norm_`` on those full tensors in one
process. lf's function on the sharded gradients must give the same norm (2 and inf) and, gathered after
clipping, the same clipped gradients: 1e-6 relative in float32 (the sums only change order). The pipeline
case gives each of the 2 ``pp`` ranks half of the tensor-parallel gradients (disjoint stages) and combines
over the pp group. A NaN in the gradients (of the first stage, under pp) must give NaN on every rank and leave
the gradients unscaled. A tensor whose shards are empty on some ranks (uneven sharding) still gives every rank
the whole norm.
"""

from __future__ import annotations

import json
import math
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PLANS = ["tp=2,dp=2,zero=3", "tp=2,sp=1,dp=2,zero=3", "zero=3,dp_replicate=2,dp_shard=2", "dp=4,zero=3",
         "pp=2,tp=2"]
NORMS = [2.0, float("inf")]
MAX_NORM = 0.05
"""Small enough that every case clips (the tiny model's gradient norm at init is about 1 to 10)."""


def _full(t):
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _case(plan_text: str) -> dict:
    """Norms and clipped-gradient differences of one plan on this rank (see the module docstring)."""
    from torch.distributed.tensor import DTensor

    from lf_parallel import Plan, build_mesh, clip_grad_norm_, loss_parallel_context, parallelize
    from lf_parallel._harness import Job, _build, _local_batch, resolve_plan

    model, recipe = _build(Job(recipe="llama3", plan=plan_text))
    if plan_text.startswith("pp="):  # tp on the (pp, tp) mesh; the stages are simulated below
        plan = Plan(pp=2, tp=2, micro_batch=4)
    else:
        plan = resolve_plan(plan_text, world_size=4, global_batch=4, graph=model.graph)
    mesh = build_mesh(plan)
    model = parallelize(model, mesh, plan)
    batch = _local_batch(recipe.batch(model, 4, 1), plan, mesh)
    with loss_parallel_context():  # the head's vocab-sharded logits, as in training
        recipe.loss(model, batch).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    pp_group = None
    if plan.pp > 1:  # pp rank r keeps every other gradient tensor: two disjoint stages
        r = mesh.get_local_rank("pp")
        params = [p for i, p in enumerate(params) if i % 2 == r]
        pp_group = mesh["pp"].get_group()
    saved = [p.grad.detach().clone() for p in params]
    kinds = sorted({str(p.grad.device_mesh.mesh_dim_names) + str(p.grad.placements) if isinstance(p.grad, DTensor)
                    else "plain" for p in params})
    out = {"kinds": kinds}
    for norm_type in NORMS:
        for p, g in zip(params, saved, strict=True):
            p.grad.copy_(g)
        full = [_full(p.grad) for p in params]
        if pp_group is not None:  # the oracle sees both stages' gradients
            gathered = [None, None]
            dist.all_gather_object(gathered, full, group=pp_group)
            full = gathered[0] + gathered[1]
        ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in full]
        for q, g in zip(ref, full, strict=True):
            q.grad = g.clone()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref, MAX_NORM, norm_type)
        norm = clip_grad_norm_(params, MAX_NORM, norm_type, pp_group=pp_group)
        clipped = [_full(p.grad) for p in params]
        if pp_group is not None:
            gathered = [None, None]
            dist.all_gather_object(gathered, clipped, group=pp_group)
            clipped = gathered[0] + gathered[1]
        grad_rel = max(float((a - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30))
                       for a, q in zip(clipped, ref, strict=True))
        out[str(norm_type)] = {"norm": float(norm), "ref": float(ref_norm), "grad_rel": grad_rel}
    # a NaN in the first gradient of stage 0 (each rank puts one in its shard of it): every rank of both
    # stages must see it
    for p, g in zip(params, saved, strict=True):
        p.grad.copy_(g)
    if pp_group is None or mesh.get_local_rank("pp") == 0:
        local = params[0].grad
        (local._local_tensor if isinstance(local, DTensor) else local).view(-1)[0] = float("nan")
    before = [(p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad).clone() for p in params]
    norm = clip_grad_norm_(params, MAX_NORM, pp_group=pp_group)
    after = [(p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad) for p in params]
    out["nan"] = {"norm": float(norm), "unscaled": all(torch.equal(a.nan_to_num(), b.nan_to_num())
                                                       for a, b in zip(after, before, strict=True))}
    return out


def _uneven() -> dict:
    """A (1, 3) tensor sharded over 4 ranks (ranks 1-3 hold empty shards) next to a plain one: 2- and inf-norm."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from lf_parallel import total_norm

    full = torch.tensor([[3.0, -12.0, 4.0]])
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
    tensors = [distribute_tensor(full, mesh, [Shard(0)]), torch.tensor([84.0])]
    return {str(p): [float(total_norm(tensors, p)), float(torch.cat([full.flatten(), tensors[1]]).norm(p))]
            for p in NORMS}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {plan: _case(plan) for plan in PLANS}
        results["uneven"] = _uneven()
        every = [None] * world
        dist.all_gather_object(every, results)
        if rank == 0:
            Path(out).write_text(json.dumps(every))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results():
    patch = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        patch.delenv(key, raising=False)
    try:
        with tempfile.TemporaryDirectory(prefix="lf-grad-norm-") as tmp:
            out = str(Path(tmp) / "results.json")
            mp.start_processes(_worker, args=(4, _free_port(), out), nprocs=4, start_method="spawn")
            return json.loads(Path(out).read_text())
    finally:
        patch.undo()


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("norm_type", NORMS)
def test_norm_and_clipped_grads_equal_one_process(results, plan, norm_type):
    """Every rank's total norm, and the clipped gradients gathered to full tensors, equal the single process's
    ``torch.nn.utils.clip_grad_norm_`` on the same full gradients within 1e-6 relative (float32)."""
    for rank, per_rank in enumerate(results):
        r = per_rank[plan][str(norm_type)]
        assert r["ref"] > MAX_NORM  # the case clips
        assert abs(r["norm"] - r["ref"]) <= 1e-6 * r["ref"], (plan, rank, r)
        assert r["grad_rel"] <= 1e-6, (plan, rank, r)


def test_cases_cover_the_mesh_kinds(results):
    """The plans put gradients on the kinds the trainers meet: 2-D (dp_shard, tp) with 1-D dp (ZeRO-3 x TP),
    plain with 1-D tp (TP alone, here per pipeline stage), HSDP's Replicate x Shard."""
    kinds = {plan: set(results[0][plan]["kinds"]) for plan in PLANS}
    assert any("('dp_shard', 'tp')" in k for k in kinds["tp=2,dp=2,zero=3"])
    assert any(k.startswith("('dp_shard',)") for k in kinds["tp=2,dp=2,zero=3"])  # the mix that crashed
    assert "plain" in kinds["pp=2,tp=2"] and any(k.startswith("('tp',)") for k in kinds["pp=2,tp=2"])
    assert any("Replicate" in k for k in kinds["zero=3,dp_replicate=2,dp_shard=2"])


@pytest.mark.parametrize("plan", PLANS)
def test_nan_gradient_is_seen_by_all_and_not_applied(results, plan):
    """A NaN in a gradient (of stage 0 only, under pp) makes every rank's norm NaN (so all skip the step
    together); the gradients are left unscaled."""
    for per_rank in results:
        assert math.isnan(per_rank[plan]["nan"]["norm"])
        assert per_rank[plan]["nan"]["unscaled"]


def test_empty_shards_join_the_reduction(results):
    """Ranks whose shard of a tensor is empty (uneven sharding) still join its reduction: every rank gets the
    single process's norm (sqrt(3^2 + 12^2 + 4^2 + 84^2) = 85; inf-norm 84), no hang."""
    for per_rank in results:
        for got, ref in per_rank["uneven"].values():
            assert abs(got - ref) <= 1e-6 * ref
