"""The min-cut partitioner on a CPU + one GPU machine: equal to brute force, copies paid
once per direction, pins and colocation honoured, no int32 overflow. (Equal to the MILP:
test_partition_milp.test_two_devices_equals_the_min_cut.)"""
import numpy as np
import pytest

from placer.errors import InfeasiblePlanError
from placer.partition import check_plan, partition
from placer.partition.mincut import MinCutPartitioner
from placer.partition.synthetic import random_small

from partition_cases import brute_force_costs
from placement_reference import hand_arrays, two_device_net

CPU, GPU = 0, 1


def _with_constraints(arr, rng):
    """Random user pins to the GPU and colocation pairs on top of a random small net."""
    n = arr.n_ops
    allowed = arr.allowed.copy()
    for i in range(n):
        if allowed[i].all() and rng.random() < 0.08:
            allowed[i, CPU] = False
    arr.allowed = allowed
    if n >= 2 and rng.random() < 0.5:
        k = int(rng.integers(1, 3))
        pairs = rng.integers(0, n, (k, 2))
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        arr.colocate = pairs.astype(np.int64)
    return arr


def _h2d_d2h(arr):
    """The rows of ``class_s`` that price host -> GPU and GPU -> host copies."""
    return arr.link_class[CPU, GPU], arr.link_class[GPU, CPU]


def test_equals_brute_force_on_200_random_nets():
    rng = np.random.default_rng(2024)
    checked = 0
    for case in range(200):
        n = int(rng.integers(1, 15)) if case % 10 else 16
        arr = _with_constraints(random_small(n, rng), rng)
        every = brute_force_costs(arr)
        best = every.min()
        if not np.isfinite(best):
            continue  # constraints contradict each other (covered below)
        plan = MinCutPartitioner().partition(arr)
        check_plan(arr, plan)
        assert plan.total_s == pytest.approx(best, rel=1e-9, abs=0), f"case {case}, n={n}"
        assert plan.optimal and plan.gap == 0.0
        checked += 1
    assert checked > 150


def test_costs_spanning_many_orders_of_magnitude():
    """Scaling to int32 must neither overflow nor lose the small costs' decisions."""
    rng = np.random.default_rng(7)
    for case in range(30):
        arr = random_small(int(rng.integers(4, 12)), rng)
        arr.op_s = arr.op_s.copy()
        arr.op_s[:, CPU] *= 10.0 ** rng.uniform(-6, 6, arr.n_ops)
        arr.class_s = arr.class_s.copy()
        arr.class_s[_h2d_d2h(arr)[0]] *= 10.0 ** rng.uniform(-3, 3, arr.n_tensors)
        plan = MinCutPartitioner().partition(arr)
        check_plan(arr, plan)
        assert plan.total_s == pytest.approx(brute_force_costs(arr).min(), rel=1e-9)


def test_huge_absolute_costs_do_not_wrap_int32():
    arr = random_small(10, np.random.default_rng(1))
    arr.op_s, arr.class_s = arr.op_s * 1e9, arr.class_s * 1e9
    plan = MinCutPartitioner().partition(arr)
    assert plan.total_s == pytest.approx(brute_force_costs(arr).min(), rel=1e-9)


def test_fan_out_tensor_is_copied_once_each_way():
    # op0 (CPU only) makes x for three GPU-friendly readers: one H2D copy of x.
    # op4 (GPU-friendly) makes y for three CPU-only readers: one D2H copy of y.
    ops = [(1.0, 1.0, False), (1.0, 0.1), (1.0, 0.1), (1.0, 0.1),
           (1.0, 0.1), (1.0, 1.0, False), (1.0, 1.0, False), (1.0, 1.0, False)]
    tensors = [("x", 0, [1, 2, 3], 0.5, 0.5), ("z", 3, [4], 0.01, 0.01),
               ("y", 4, [5, 6, 7], 0.5, 0.5)]
    arr = two_device_net(ops, tensors)
    plan = partition(arr)
    check_plan(arr, plan)
    assert [plan.device_of(i) for i in range(8)] == ["cpu"] + ["cuda:0"] * 4 + ["cpu"] * 3
    assert sorted((c.tensor, c.direction) for c in plan.copies) == [("x", "h2d"), ("y", "d2h")]
    assert plan.cost.copy_s == pytest.approx(1.0)
    assert plan.total_s == pytest.approx(1.0 + 0.4 + 3.0 + 1.0)


def test_host_input_pays_h2d_only_when_read_on_gpu():
    for h2d, where in ((2.0, "cpu"), (0.5, "cuda:0")):
        arr = two_device_net([(2.0, 1.0)], [("data", -1, [0], h2d, 0.1)])
        plan = partition(arr)
        check_plan(arr, plan)
        assert plan.device_of(0) == where
        assert [c.tensor for c in plan.copies] == (["data"] if where == "cuda:0" else [])


def test_external_output_returns_to_host_unless_told_otherwise():
    tensors = [("out", 0, [], 0.1, 2.0, True)]
    assert partition(two_device_net([(2.0, 1.0)], tensors)).device_of(0) == "cpu"
    arr = two_device_net([(2.0, 1.0)], tensors, outputs_on_host=False)
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.device_of(0) == "cuda:0" and plan.copies == []


def test_parameters_are_never_copied():
    arr = two_device_net([(2.0, 1.0), (1.0, 5.0)], [("w", -2, [0, 1], 9.0, 9.0), ("a", 0, [1], 0.1, 0.1)])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.device_of(0) == "cuda:0" and plan.device_of(1) == "cpu"
    assert [c.tensor for c in plan.copies] == ["a"]


def test_pins_and_colocation_are_honoured():
    ops = [(1.0, None), (1.0, 0.1), (0.1, 1.0), (0.1, 1.0)]     # op 0 pinned to the CPU
    tensors = [("a", 0, [1], (0.01, 0.01)), ("b", 1, [2], (0.01, 0.01)), ("c", 2, [3], (0.01, 0.01))]
    arr = hand_arrays(ops, tensors, colocate=[(1, 2), (3, 1)], pin_reason=["pinned: --pin cpu", "", "", ""])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.device_of(0) == "cpu"
    assert plan.device_of(1) == plan.device_of(2) == plan.device_of(3)
    assert plan.reasons[0] == "pinned: --pin cpu"


def test_reasons_follow_the_costs():
    ops = [(1.4, 0.1), (1.0, 2.0), (1.0, 0.9)]
    tensors = [("a", 0, [1], 0.01, 0.01), ("b", 1, [2], 5.0, 5.0)]
    plan = partition(two_device_net(ops, tensors))
    assert plan.reasons[0] == "cuda:0 14x faster than cpu"
    assert plan.reasons[1] == "cpu 2.0x faster than cuda:0"
    assert plan.reasons[2] == "cpu: copy of 'b' costs more than cuda:0 saves"


def test_contradicting_pins_are_an_infeasible_plan():
    arr = hand_arrays([(1, None), (None, 1)], [("a", 0, [1], (1, 1))], colocate=[(0, 1)],
                      pin_reason=["pinned: --pin cpu", "pinned: --pin cuda:0"])
    with pytest.raises(InfeasiblePlanError, match="have no device in common"):
        partition(arr)
