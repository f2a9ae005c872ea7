"""The invariant checker catches each kind of broken plan, on one GPU and on several."""
import copy
from dataclasses import replace

import numpy as np
import pytest

from placer.partition import check_plan, partition
from placer.partition.check import PlanInvariantError, memory_by_loops
from placer.partition.problem import memory_use
from placer.partition.synthetic import random_arrays, random_small
from placer.types import PlanCopy, PlanCost


@pytest.fixture(params=[1, 3], ids=["one-gpu", "three-gpus"])
def case(request):
    arr = random_arrays(120, seed=8, tensor_bytes=3e6, gpus=request.param, peer="mixed")
    return arr, partition(arr)


def _broken(plan, **changes):
    p = copy.copy(plan)
    for k, v in changes.items():
        setattr(p, k, v)
    return p


def test_a_correct_plan_passes(case):
    arr, plan = case
    check_plan(arr, plan, capacity=plan.memory_bytes)


def test_missing_op(case):
    arr, plan = case
    with pytest.raises(PlanInvariantError, match="placement covers 119 ops"):
        check_plan(arr, _broken(plan, placement=np.delete(plan.placement, 5)))


def test_unknown_device(case):
    arr, plan = case
    placement = plan.placement.copy()
    placement[3] = arr.k
    with pytest.raises(PlanInvariantError, match=f"op 3 placed on unknown device {arr.k}"):
        check_plan(arr, _broken(plan, placement=placement))


def test_op_on_a_device_it_may_not_take(case):
    arr, plan = case
    pinned = int(np.flatnonzero(~arr.allowed[:, 1])[0])
    placement = plan.placement.copy()
    placement[pinned] = 1
    with pytest.raises(PlanInvariantError, match=f"op {pinned} is placed on cuda:0 where it may not run"):
        check_plan(arr, _broken(plan, placement=placement))


def test_colocation_broken(case):
    arr, plan = case
    arr = replace(arr, colocate=np.array([[0, 1]]))
    placement = plan.placement.copy()
    placement[0], placement[1] = 0, 1
    with pytest.raises(PlanInvariantError, match="ops 0 and 1 must share a device"):
        check_plan(arr, _broken(plan, placement=placement))


def test_missing_copy(case):
    arr, plan = case
    assert plan.copies
    with pytest.raises(PlanInvariantError, match="copies differ"):
        check_plan(arr, _broken(plan, copies=plan.copies[1:]))


def test_copy_listed_twice(case):
    arr, plan = case
    with pytest.raises(PlanInvariantError, match="a copy is listed twice"):
        check_plan(arr, _broken(plan, copies=plan.copies + plan.copies[:1]))


def test_copy_from_the_wrong_source_device():
    arr = random_arrays(120, seed=8, tensor_bytes=3e6, gpus=3, peer="mixed")
    plan = partition(arr)
    c = next(c for c in plan.copies if c.direction == "d2d" or c.src != "cpu")
    wrong = next(d for d in arr.devices if d not in (c.src, c.dst))
    copies = [replace(x, src=wrong) if x is c else x for x in plan.copies]
    with pytest.raises(PlanInvariantError, match="copies differ"):
        check_plan(arr, _broken(plan, copies=copies))


def test_copy_priced_wrong(case):
    arr, plan = case
    first = plan.copies[0]
    copies = [PlanCopy(first.tensor, first.src, first.dst, first.nbytes, first.time_s * 2, first.producer,
                       first.consumers, first.src_kind, first.dst_kind)] + plan.copies[1:]
    with pytest.raises(PlanInvariantError, match="takes"):
        check_plan(arr, _broken(plan, copies=copies))


def test_wrong_cost(case):
    arr, plan = case
    cost = PlanCost(plan.cost.compute_s * (1 + 1e-6), plan.cost.copy_s)
    with pytest.raises(PlanInvariantError, match="compute_s"):
        check_plan(arr, _broken(plan, cost=cost))


def test_over_capacity(case):
    arr, plan = case
    with pytest.raises(PlanInvariantError, match="cuda:0 memory .* exceeds capacity"):
        check_plan(arr, plan, capacity=plan.memory_bytes * 0.5)
    arr.capacity = plan.memory_bytes * 0.5
    with pytest.raises(PlanInvariantError, match="exceeds capacity"):
        check_plan(arr, plan)


def test_memory_reported_wrong(case):
    arr, plan = case
    with pytest.raises(PlanInvariantError, match="bytes per device"):
        check_plan(arr, _broken(plan, memory_bytes=plan.memory_bytes * 1.01))


def test_all_cpu_placement_has_no_copies_to_list(case):
    arr, plan = case
    placement = np.zeros(arr.n_ops, np.int64)
    with pytest.raises(PlanInvariantError, match="extra"):
        check_plan(arr, _broken(plan, placement=placement))


def test_loop_memory_equals_the_vectorised_model():
    rng = np.random.default_rng(2)
    for _ in range(100):
        arr = random_small(int(rng.integers(1, 15)), rng, gpus=int(rng.integers(1, 4)))
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, arr.n_ops)
        dev = rng.integers(0, arr.k, arr.n_ops)
        assert memory_by_loops(arr, dev.tolist()) == pytest.approx(memory_use(arr, dev).tolist(), rel=1e-12)
