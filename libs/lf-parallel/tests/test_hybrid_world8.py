"""Hybrid plans on an 8-process gloo CPU world vs. the single-process run (the oracle).

One spawned world runs every job (8 processes on a small machine: tiny models, 3 steps). Tolerances
as in ``_matrix``. Covers 3-D dp x tp x cp with ZeRO-3 (llama3, ring; wan_dit, Ulysses), ZeRO-3 over 8
ranks, and heterogeneous VLM and VLA plans (vision encoder replicated, LLM / backbone tp=2 + sp, ZeRO-3 over
dp=4).
"""

from __future__ import annotations

import pytest
from _matrix import assert_matches, job_id, run

from lf_parallel._harness import Job

JOBS = [
    Job(recipe="llama3", plan="dp=2,tp=2,cp=2,zero=3"),
    Job(recipe="llama3", plan="dp=8,zero=3", global_batch=8),
    Job(recipe="qwen2_vl", plan="tp=2,sp=1,dp=4,zero=3,vision.tp=1", global_batch=8),
    Job(recipe="wan_dit", plan="dp=2,tp=2,cp=2,zero=3,cp_kind=ulysses"),
    Job(recipe="vla", plan="tp=2,sp=1,dp=4,zero=3,vision.tp=1", global_batch=8),
]


@pytest.fixture(scope="module")
def world8():
    return run(JOBS, nproc=8)


@pytest.mark.parametrize("job", JOBS, ids=job_id)
def test_world8_plan_matches_single_process(world8, job):
    assert_matches(world8[job])
