"""Plan choice and validation. Oracle: hand-derived plans and the constraint they must meet."""

import pytest

from lf_parallel import Plan, PlanError, check_plan, choose_plan


@pytest.mark.parametrize("world,batch,max_mb,expected", [
    (1, 64, 64, Plan(dp=1, micro_batch=64, grad_accum=1)),
    (2, 64, 64, Plan(dp=2, micro_batch=32, grad_accum=1)),
    (2, 64, 16, Plan(dp=2, micro_batch=16, grad_accum=2)),
    (4, 96, 10, Plan(dp=4, micro_batch=8, grad_accum=3)),
    (1, 7, 3, Plan(dp=1, micro_batch=1, grad_accum=7)),
])
def test_choose_plan(world, batch, max_mb, expected):
    plan = choose_plan(world_size=world, global_batch=batch, max_micro_batch=max_mb)
    assert plan == expected and plan.global_batch == batch


def test_indivisible_batch_names_nearby_batches():
    with pytest.raises(PlanError, match=r"global_batch=10 is not divisible by the 4 .* use 8 or 12"):
        choose_plan(world_size=4, global_batch=10, max_micro_batch=8)


def test_check_plan_rejects_wrong_dp_and_suggests_valid_plan():
    with pytest.raises(PlanError, match=r"parallel.dp=4 must equal the number of processes \(2\); "
                                        r"try dp=2 micro_batch=32 grad_accum=1"):
        check_plan(Plan(dp=4, micro_batch=8, grad_accum=2), world_size=2, global_batch=64)


def test_check_plan_rejects_batch_mismatch():
    with pytest.raises(PlanError, match="dp\\*micro_batch\\*grad_accum = 32 but train.global_batch = 64"):
        check_plan(Plan(dp=2, micro_batch=8, grad_accum=2), world_size=2, global_batch=64)
    ok = Plan(dp=2, micro_batch=16, grad_accum=2)
    assert check_plan(ok, world_size=2, global_batch=64) is ok


def test_non_positive_degree_rejected():
    with pytest.raises(PlanError, match="parallel.micro_batch must be >= 1, got 0"):
        check_plan(Plan(dp=1, micro_batch=0), world_size=1, global_batch=0)
