"""The invariant checker catches each kind of broken plan."""
import copy

import pytest

from placer.partition import check_plan, partition
from placer.partition.check import PlanInvariantError
from placer.partition.synthetic import random_arrays
from placer.types import CPU, GPU0, PlanCost


@pytest.fixture
def case():
    arr = random_arrays(120, seed=8, tensor_bytes=3e6)
    return arr, partition(arr)


def test_a_correct_plan_passes(case):
    arr, plan = case
    check_plan(arr, plan, capacity=plan.gpu_memory_bytes)


def _broken(plan, **changes):
    p = copy.copy(plan)
    for k, v in changes.items():
        setattr(p, k, v)
    return p


def test_missing_op(case):
    arr, plan = case
    placement = dict(plan.placement)
    del placement[5]
    with pytest.raises(PlanInvariantError, match="placement covers 119 ops"):
        check_plan(arr, _broken(plan, placement=placement))


def test_broken_pin(case):
    arr, plan = case
    pinned = int(next(i for i in range(arr.n_ops) if arr.forced[i] == 0))
    placement = dict(plan.placement)
    placement[pinned] = GPU0
    with pytest.raises(PlanInvariantError, match=f"op {pinned} is pinned to cpu"):
        check_plan(arr, _broken(plan, placement=placement))


def test_missing_copy(case):
    arr, plan = case
    assert plan.copies
    with pytest.raises(PlanInvariantError, match="copies differ"):
        check_plan(arr, _broken(plan, copies=plan.copies[1:]))


def test_wrong_cost(case):
    arr, plan = case
    cost = PlanCost(plan.cost.compute_s * (1 + 1e-6), plan.cost.copy_s)
    with pytest.raises(PlanInvariantError, match="compute_s"):
        check_plan(arr, _broken(plan, cost=cost))


def test_over_capacity(case):
    arr, plan = case
    with pytest.raises(PlanInvariantError, match="exceeds capacity"):
        check_plan(arr, plan, capacity=plan.gpu_memory_bytes * 0.5)


def test_all_cpu_placement_has_no_copies_to_list(case):
    arr, plan = case
    placement = {i: CPU for i in range(arr.n_ops)}
    with pytest.raises(PlanInvariantError, match="extra"):
        check_plan(arr, _broken(plan, placement=placement))
