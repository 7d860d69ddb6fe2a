"""Hybrid plans on a 2-process gloo CPU world vs. the single-process run (the oracle).

One spawned world runs every plan (module-scoped fixture; process start-up dominates on 2 cores).
Each job trains a recipe's tiny model (deterministic init, fixed random batch of 4 samples) for 3
AdamW steps. Tolerances (float32): losses and last-step gradients 1e-5 relative (the plans only
change summation order: DP gradient averaging, TP partial sums); parameters 1e-4, because Adam's
``g / (|g| + eps)`` amplifies the round-off of entries with |g| near eps (see ``Job.eps``). The tied
vocab-parallel variant sends every gradient through two vocab-sharded matmuls: 3e-5.
"""

from __future__ import annotations

import pytest

from lf_parallel._harness import Job, run_jobs

PLANS = {
    "llama3": ["dp=2", "zero=1,dp=2", "zero=2,dp=2", "zero=3,dp=2", "tp=2", "tp=2,sp=1"],
    "vla": ["dp=2", "zero=1,dp=2", "zero=2,dp=2", "zero=3,dp=2", "tp=2", "tp=2,sp=1", "tp=2,sp=1,vision.tp=1"],
    "llama3_tied_vocab_parallel": ["tp=2", "tp=2,sp=1"],
}
JOBS = [Job(recipe=r, plan=p) for r, plans in PLANS.items() for p in plans]
# rank 0's share of the elements (params, grads, AdamW moments) each plan must leave it
SHARDS = {"dp=2": (1.0, 1.0, 1.0), "zero=1,dp=2": (1.0, 1.0, 0.5), "zero=2,dp=2": (0.5, 0.5, 0.5),
          "zero=3,dp=2": (0.5, 0.5, 0.5)}


@pytest.fixture(scope="module")
def results(monkeypatch_module):
    return {(r.job.recipe, r.job.plan): r for r in run_jobs(JOBS, nproc=2)}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        mp.delenv(key, raising=False)
    yield mp
    mp.undo()


@pytest.mark.parametrize("recipe,plan", [(j.recipe, j.plan) for j in JOBS])
def test_plan_matches_single_process(results, recipe, plan):
    r = results[(recipe, plan)]
    tol = 3e-5 if recipe.endswith("vocab_parallel") else 1e-5
    assert r.loss_rel <= 1e-5, (r.losses, r.ref_losses)
    assert r.grad_rel <= tol, r.worst
    assert r.param_rel <= 1e-4, r.worst_param
    assert r.ref_losses[-1] < r.ref_losses[0] - 0.1  # the steps trained: not a comparison of two inits


@pytest.mark.parametrize("plan", list(SHARDS))
def test_zero_stages_shard_what_they_say(results, plan):
    """Oracle: ZeRO's definition (Rajbhandari et al. 2020) of what each stage shards over 2 ranks."""
    f = results[("llama3", plan)].shard_fractions
    assert (f["params"], f["grads"], f["optim_state"]) == pytest.approx(SHARDS[plan], abs=0.02)


def test_tensor_parallel_shards_blocks_not_replicated_components(results):
    """TP=2 halves the block and head matrices; with vision.tp=1 the vision encoder stays whole."""
    llama = results[("llama3", "tp=2")].shard_fractions["params"]
    vla = results[("vla", "tp=2,sp=1")].shard_fractions["params"]
    hetero = results[("vla", "tp=2,sp=1,vision.tp=1")].shard_fractions["params"]
    assert 0.5 < llama < 0.6  # everything but the (replicated) embedding and norms is split (57%)
    assert 0.5 < vla < hetero < 1.0
