"""Recomputation and fused optimizers composed with TP + SP and ZeRO-2/3, on a 2-process gloo CPU world.

Regression tests of three composition bugs found by ``bench/llama3_parallel.py``:

1. TP + SP with any recomputation: the sequence split was re-applied to the already split input when the
   first block was recomputed (CheckpointError, saved (b, S, d) vs recomputed (b, S/2, d));
2. selective recomputation under ZeRO-2/3 with FSDP2 bf16 parameters: FSDP's pre-forward ran inside the
   recomputed region ("profiler._record_function_enter_new ... not found in storage");
3. fused / foreach AdamW after TP: unsplit parameters are plain tensors next to DTensors ("mixed
   torch.Tensor and DTensor").

One spawned world runs every case (module-scoped fixture; process start-up dominates on 2 cores). Each
case trains the tiny llama3 (``materialize`` seed 0, the harness's fixed batch of 4 samples) for 2 AdamW
steps through ``parallelize(..., recompute=lambda m: apply_recompute(m.blocks, mode))`` and
``build_optimizer``, as ``bench/llama3_parallel.py`` does. Two TP + SP cases use PyTorch's composable
checkpoint instead of lf-memory's default (which alone already keeps the block's hooks out of the
recomputed region), so the sequence-parallel boundaries are checked on their own.

Oracles: the single-process float32 run without recomputation (``lf_parallel._harness.reference``):
losses and last-step gradients within 1e-5 relative (the plans only change summation order), parameters
within 1e-4 (Adam's ``g / (|g| + eps)`` amplifies round-off, see ``Job.eps``). The bf16 ZeRO cases (the
only way to get FSDP2's input cast, the trigger of bug 2, on CPU) are compared with the same plan without
recomputation (recomputation replays the same kernels on the same inputs: 1e-6) and, for the loss, with
the float32 single process (bf16 parameters: 2e-2).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
import torch
import torch.distributed as dist
from _pp_cp_world import run_world
from torch.distributed.tensor import DTensor

from lf_memory import apply_recompute
from lf_parallel._harness import Job, _build, _full, _local_batch, _rel, _step, reference, resolve_plan
from lf_parallel._mesh import build_mesh
from lf_parallel._parallelize import parallelize
from lf_parallel._zero import build_optimizer, tensor_kind_groups


class Case(msgspec.Struct, frozen=True):
    plan: str
    recompute: str = "none"
    optim: str = "loop"
    """AdamW implementation: ``loop`` (``foreach=False``, as the oracle), ``foreach`` or ``fused``."""
    backend: str = "default"
    """lf-memory's checkpoint backend: ``default`` (``apply_recompute``, wraps ``forward``) or
    ``composable`` (PyTorch's, re-runs the block's hooks: checks TP + SP's boundaries on their own)."""

    @property
    def name(self) -> str:
        return f"{self.plan}|{self.recompute}|{self.optim}" + ("" if self.backend == "default" else "|composable")


JOB = Job(recipe="llama3", plan="dp=1", steps=2)
EXACT = [Case("tp=2,sp=1", "full"), Case("tp=2,sp=1", "selective"), Case("tp=2,sp=1", "every_k"),
         Case("zero=3,dp=2", "selective"), Case("zero=2,dp=2", "selective"),
         Case("tp=2", optim="fused"), Case("tp=2,sp=1", optim="foreach"), Case("tp=2,sp=1", "full", "fused"),
         Case("tp=2,sp=1", "full", backend="composable"), Case("tp=2,sp=1", "selective", backend="composable")]
"""float32 cases, compared with the single-process run."""
BF16 = [Case(f"zero={z},dp=2,precision=bf16", r) for z in (3, 2) for r in ("selective", "none")]
"""FSDP2 bf16 parameters: selective against no recomputation under the same plan."""
CASES = EXACT + BF16


def _train(case: Case, world: int) -> dict:
    model, recipe = _build(JOB)
    plan = resolve_plan(case.plan, world_size=world, global_batch=JOB.global_batch, graph=model.graph)
    batch = recipe.batch(model, JOB.global_batch, JOB.seed + 1)
    mesh = build_mesh(plan)
    if case.backend == "default":
        model = parallelize(model, mesh, plan, recompute=lambda m: apply_recompute(m.blocks, case.recompute))
    else:
        model = parallelize(model, mesh, plan, recompute=lambda m: apply_recompute(m.blocks, case.recompute,
                                                                                    backend=case.backend))
    impl = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[case.optim]
    opt = build_optimizer(model, mesh, plan, lr=JOB.lr, eps=JOB.eps, **impl)
    groups = [_kind(g) for g in opt.param_groups]
    params = list(model.parameters())  # weight-decay groups as a trainer makes them, split by kind
    decay = tensor_kind_groups([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}])
    local = _local_batch(batch, plan, mesh)
    dp_group = mesh["dp_replicate", "dp_shard"]._flatten("dp_all").get_group()
    losses, grads = [], None
    for step in range(JOB.steps):
        loss, grads = _step(model, recipe, local, opt, record_grads=step == JOB.steps - 1)
        dist.all_reduce(loss, group=dp_group)
        losses.append(float(loss) / plan.dp)
    grads.pop("__local_numel__")
    params = {n: _full(p) for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params, "groups": groups,
            "decay_groups": [(*_kind(g), g["weight_decay"]) for g in decay]}


def _kind(group: dict) -> tuple[str, int]:
    return "dtensor" if isinstance(group["params"][0], DTensor) else "plain", len(group["params"])


def _body(rank: int, world: int, out_dir: str) -> None:
    results = {}
    for case in CASES:  # the bugs raised on every rank alike: record the error, go on with the next case
        try:
            results[case.name] = _train(case, world)
        except Exception as e:  # noqa: BLE001
            results[case.name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    if rank == 0:
        torch.save(results, Path(out_dir) / "results.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("composition")
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
    try:
        run_world(_body, 2, str(out))
    finally:
        os.environ.update(saved)
    return torch.load(out / "results.pt", weights_only=True)


@pytest.fixture(scope="module")
def oracle():
    losses, grads, params, *_ = reference(JOB)
    return {"losses": losses, "grads": grads, "params": params}


def _ok(run: dict) -> dict:
    assert "error" not in run, run["error"]
    return run


def _loss_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("case", EXACT, ids=lambda c: c.name)
def test_matches_single_process(runs, oracle, case):
    """Oracle: the single-process float32 run (no recomputation, for-loop AdamW), 2 steps."""
    r = _ok(runs[case.name])
    assert _loss_rel(r["losses"], oracle["losses"]) <= 1e-5, (r["losses"], oracle["losses"])
    grad_rel, worst = _rel(r["grads"], oracle["grads"])
    assert grad_rel <= 1e-5, (grad_rel, worst)
    param_rel, worst_param = _rel(r["params"], oracle["params"])
    assert param_rel <= 1e-4, (param_rel, worst_param)
    assert oracle["losses"][1] < oracle["losses"][0] - 0.05  # the first step trained


@pytest.mark.parametrize("zero", [3, 2])
def test_selective_recompute_under_fsdp_bf16(runs, oracle, zero):
    """Oracle: the same bf16 ZeRO plan without recomputation (same kernels replayed: 1e-6), and for the
    loss the float32 single process (bf16 parameters and activations: 2e-2)."""
    plan = f"zero={zero},dp=2,precision=bf16"
    sel, none = _ok(runs[f"{plan}|selective|loop"]), _ok(runs[f"{plan}|none|loop"])
    assert _loss_rel(sel["losses"], none["losses"]) <= 1e-6
    assert _rel(sel["grads"], none["grads"])[0] <= 1e-6
    assert _rel(sel["params"], none["params"])[0] <= 1e-6
    assert _loss_rel(sel["losses"], oracle["losses"]) <= 2e-2


def test_optimizer_groups_by_tensor_kind(runs):
    """Oracle: the IR's tp annotations of llama3-tiny (2 blocks). Plain TP: the embedding and 5 norms stay
    plain tensors, the 14 block linears and the head are DTensors; with SP the 5 norms become replicated
    DTensors (``SequenceParallel``). ZeRO-3 alone: one mesh, one group."""
    assert _ok(runs["tp=2|none|fused"])["groups"] == [("plain", 6), ("dtensor", 15)]
    assert _ok(runs["tp=2,sp=1|full|fused"])["groups"] == [("plain", 1), ("dtensor", 20)]
    assert _ok(runs["zero=3,dp=2|selective|loop"])["groups"] == [("dtensor", 21)]
    # weight-decay groups (matrices: embedding, 14 linears, head; vectors: 5 norms) split by kind
    assert runs["tp=2|none|fused"]["decay_groups"] == [("plain", 1, 0.1), ("dtensor", 15, 0.1), ("plain", 5, 0.0)]


def test_tensor_kind_groups_without_dtensors_keeps_groups_and_order():
    """Oracle: the definition; plain parameters only (one process): one group per input group, order and
    options kept."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    (group,) = tensor_kind_groups(model.parameters())
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    w, b = model[0].weight, model[0].bias
    assert tensor_kind_groups([{"params": [w], "lr": 0.5}, {"params": b}]) == [{"params": [w], "lr": 0.5},
                                                                               {"params": [b]}]
