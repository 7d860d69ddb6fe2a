"""qwen2_vl and wan_dit (tiny) under every parallel mode, and context parallel with ZeRO-3, on gloo CPU worlds.

Oracle: the single-process run of the same job (see ``_matrix`` for the tolerances and why; three
wan_dit jobs run in float64 to hold every gradient tensor to 1e-5). One
spawned world of 2 processes runs every world-2 job, one of 4 every world-4 job (module fixtures:
process start-up dominates on a small machine). Each job trains 3 AdamW steps on a fixed batch of 4.
Pipeline plans of these recipes are tested with the pipeline (``test_pipeline*``).
"""

from __future__ import annotations

import pytest
import torch
from _matrix import assert_matches, job_id, run

from lf_parallel._harness import Job
from lf_parallel._harness_mm import patchify
from lf_parallel._plan import PlanError, parse_plan
from lf_parallel._plan_check import check_plan

MODES = ["dp=2", "zero=1,dp=2", "zero=2,dp=2", "zero=3,dp=2", "tp=2", "tp=2,sp=1"]
WORLD2 = [Job(recipe=r, plan=p) for r in ("qwen2_vl", "wan_dit") for p in MODES] + [
    Job(recipe="qwen2_vl", plan="tp=2,sp=1,vision.tp=1"),
    Job(recipe="wan_dit", plan="cp=2"),
    Job(recipe="wan_dit", plan="cp=2,cp_kind=ulysses"),
    Job(recipe="llama3", plan="cp=2"),
    Job(recipe="llama3", plan="cp=2,cp_kind=ulysses"),
    Job(recipe="wan_dit", plan="tp=2,sp=1", dtype="float64"),
    Job(recipe="wan_dit", plan="cp=2", dtype="float64"),
]
WORLD4 = [
    Job(recipe="qwen2_vl", plan="tp=2,dp=2,zero=3"),
    Job(recipe="qwen2_vl", plan="tp=2,sp=1,dp=2,zero=3,vision.tp=1"),
    Job(recipe="wan_dit", plan="tp=2,dp=2,zero=3"),
    Job(recipe="wan_dit", plan="tp=2,sp=1,dp=2,zero=2"),
    Job(recipe="wan_dit", plan="dp=2,zero=3,cp=2"),
    Job(recipe="wan_dit", plan="dp=2,zero=3,cp=2,cp_kind=ulysses"),
    Job(recipe="llama3", plan="dp=2,zero=3,cp=2"),
    Job(recipe="llama3", plan="dp=2,zero=3,cp=2,cp_kind=ulysses"),
    Job(recipe="wan_dit", plan="tp=2,zero=3,cp=2,cp_kind=ulysses", dtype="float64"),
]


@pytest.fixture(scope="module")
def world2():
    return run(WORLD2, nproc=2)


@pytest.fixture(scope="module")
def world4():
    return run(WORLD4, nproc=4)


@pytest.mark.parametrize("job", WORLD2, ids=job_id)
def test_world2_plan_matches_single_process(world2, job):
    assert_matches(world2[job])


@pytest.mark.parametrize("job", WORLD4, ids=job_id)
def test_world4_plan_matches_single_process(world4, job):
    assert_matches(world4[job])


def test_heterogeneous_vlm_keeps_the_vision_encoder_whole(world2):
    """Oracle: what tp=2 splits. With vision.tp=1 the ViT stays replicated, so rank 0 holds more elements."""
    split = world2[Job(recipe="qwen2_vl", plan="tp=2,sp=1")].shard_fractions["params"]
    hetero = world2[Job(recipe="qwen2_vl", plan="tp=2,sp=1,vision.tp=1")].shard_fractions["params"]
    assert 0.5 < split < hetero < 1.0


def test_zero3_with_context_parallel_shards_over_dp_times_cp(world4):
    """Oracle: ZeRO-3 with cp=2 shards every parameter over the dp x cp = 4 ranks (mesh ``dp_shard_cp``)."""
    f = world4[Job(recipe="llama3", plan="dp=2,zero=3,cp=2")].shard_fractions
    assert (f["params"], f["optim_state"]) == pytest.approx((0.25, 0.25), abs=0.02)


def test_patchify_inverts_unpatchify():
    """Oracle: ``WanDiTModel.unpatchify`` (the recipe's own token -> latent layout)."""
    from lf_ir.recipes.wan_dit import WanDiTModel, wan_dit_config

    cfg = wan_dit_config("tiny")
    with torch.device("meta"):
        model = WanDiTModel(cfg)
    x = torch.randn(2, 4, 3, 6, 10)
    tokens = patchify(x, cfg.patch)
    assert tokens.shape == (2, 3 * 3 * 5, 16)
    assert torch.equal(model.unpatchify(tokens, (3, 3, 5)), x)


def test_ring_plus_ulysses_is_refused_by_parallelize():
    """Oracle: parallelize() applies ring or Ulysses over the cp dim; the 2-D split needs groups the plan
    does not describe, so it fails before any step, naming the field and value."""
    from lf_parallel._context import context_parallel_of

    plan = check_plan(parse_plan("cp=2,cp_kind=ring+ulysses,mb=4"), world_size=2, global_batch=4)
    with pytest.raises(ValueError, match="cp_kind='ring\\+ulysses'"):
        context_parallel_of(None, plan)


def test_ulysses_heads_checked_before_launch():
    """Oracle: wan_dit tiny (harness) has 4 heads; tp=2 leaves 2 per rank, which cp=4 Ulysses cannot split."""
    from lf_parallel._harness import resolve_plan
    from lf_parallel._harness_mm import wan_dit_build

    with torch.device("meta"):
        graph = wan_dit_build("tiny").graph
    with pytest.raises(PlanError, match="cp=4 \\(ulysses\\)"):
        resolve_plan("tp=2,cp=4,cp_kind=ulysses", world_size=8, global_batch=4, graph=graph)
