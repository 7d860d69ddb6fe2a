"""Hybrid plans on a 4-process gloo CPU world vs. the single-process run (the oracle), and DCP resharding.

One spawned world runs every job. Tolerances as in ``test_hybrid_world2`` (float32: 1e-5 relative on
losses and last-step gradients, 1e-4 on parameters after Adam). Resharding: the state after 2 steps
is saved under ZeRO-3 over dp=4, loaded under tp=2 x dp=2 (ZeRO-3), and the third step's loss and
gradients must equal the uninterrupted single-process run's.
"""

from __future__ import annotations

import pytest

from lf_parallel._harness import Job, run_jobs

JOBS = [
    Job(recipe="llama3", plan="dp=4"),
    Job(recipe="llama3", plan="zero=3,dp_replicate=2,dp_shard=2"),
    Job(recipe="llama3", plan="tp=2,dp=2,zero=3"),
    Job(recipe="llama3", plan="tp=2,sp=1,dp=2,zero=2"),
    Job(recipe="vla", plan="zero=2,dp_replicate=2,dp_shard=2"),
    Job(recipe="vla", plan="tp=2,sp=1,dp=2,zero=3"),
    Job(recipe="vla", plan="tp=2,dp=2,zero=3,vision.tp=1"),
    Job(recipe="llama3", plan="zero=3,dp=4", reshard_to="tp=2,dp=2,zero=3"),
    Job(recipe="vla", plan="zero=3,dp=4", reshard_to="tp=2,sp=1,dp=2,zero=3"),
]


@pytest.fixture(scope="module")
def results():
    mp = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        mp.delenv(key, raising=False)
    try:
        yield {(r.job.recipe, r.job.plan, r.job.reshard_to): r for r in run_jobs(JOBS, nproc=4)}
    finally:
        mp.undo()


def _id(job: Job) -> str:
    return f"{job.recipe}:{job.plan}" + (f">{job.reshard_to}" if job.reshard_to else "")


@pytest.mark.parametrize("job", JOBS, ids=_id)
def test_plan_matches_single_process(results, job):
    r = results[(job.recipe, job.plan, job.reshard_to)]
    assert len(r.losses) == 3
    assert r.loss_rel <= 1e-5, (r.losses, r.ref_losses)
    assert r.grad_rel <= 1e-5, r.worst
    assert r.param_rel <= 1e-4, r.worst_param
    assert r.ref_losses[-1] < r.ref_losses[0] - 0.1


def test_hsdp_and_2d_shard_over_the_right_dims(results):
    """HSDP 2x2 shards over 2 ranks (replicated across the other pair); TP=2 x FSDP=2 shards the tp-split
    matrices 4 ways and the replicated embedding and norms 2 ways (llama3 tiny: 57% of elements are held
    by one tp rank, so 28.5% by one rank of the 2-D mesh)."""
    hsdp = results[("llama3", "zero=3,dp_replicate=2,dp_shard=2", None)].shard_fractions
    two_d = results[("llama3", "tp=2,dp=2,zero=3", None)].shard_fractions
    assert hsdp["params"] == pytest.approx(0.5, abs=0.02)
    assert 0.25 < two_d["params"] < 0.3
