"""The min-cut partitioner: equal to brute force and to the MILP, copies paid once per
direction, pins and colocation honoured, no int32 overflow."""
import numpy as np
import pytest

from placer.graph import build_cost_graph
from placer.partition import check_plan, partition
from placer.partition.milp import milp_partition
from placer.partition.mincut import MinCutPartitioner
from placer.partition.problem import PIN_GPU, PIN_NONE
from placer.partition.synthetic import random_arrays, random_small

from partition_cases import brute_force_costs, hand_net


def _with_constraints(arr, rng):
    """Random user pins and colocation pairs on top of a random small net."""
    n = arr.n_ops
    for i in range(n):
        if arr.pin[i] == PIN_NONE and rng.random() < 0.08:
            arr.pin[i] = PIN_GPU
    if n >= 2 and rng.random() < 0.5:
        k = int(rng.integers(1, 3))
        pairs = rng.integers(0, n, (k, 2))
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        arr.colocate = pairs.astype(np.int64)
    return arr


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
        arr.cpu_s = arr.cpu_s * 10.0 ** rng.uniform(-6, 6, arr.n_ops)
        arr.t_h2d = arr.t_h2d * 10.0 ** rng.uniform(-3, 3, arr.n_tensors)
        plan = MinCutPartitioner().partition(arr)
        check_plan(arr, plan)
        assert plan.total_s == pytest.approx(brute_force_costs(arr).min(), rel=1e-9)


def test_huge_absolute_costs_do_not_wrap_int32():
    arr = random_small(10, np.random.default_rng(1))
    arr.cpu_s, arr.gpu_s = arr.cpu_s * 1e9, arr.gpu_s * 1e9
    arr.t_h2d, arr.t_d2h = arr.t_h2d * 1e9, arr.t_d2h * 1e9
    plan = MinCutPartitioner().partition(arr)
    assert plan.total_s == pytest.approx(brute_force_costs(arr).min(), rel=1e-9)


@pytest.mark.parametrize("n", [120, 400])
def test_equals_milp_optimum(n):
    arr = random_arrays(n, seed=n, tensor_bytes=3e6)
    plan = partition(arr)
    check_plan(arr, plan)
    res = milp_partition(arr, None, time_limit=60)
    assert res["optimal"]
    assert plan.total_s == pytest.approx(res["objective"], rel=1e-9)


def test_fan_out_tensor_is_copied_once_each_way():
    # op0 (CPU only) makes x for three GPU-friendly readers: one H2D copy of x.
    # op4 (GPU-friendly) makes y for three CPU-only readers: one D2H copy of y.
    ops = [(1.0, 1.0, False), (1.0, 0.1), (1.0, 0.1), (1.0, 0.1),
           (1.0, 0.1), (1.0, 1.0, False), (1.0, 1.0, False), (1.0, 1.0, False)]
    tensors = [("x", 0, [1, 2, 3], 0.5, 0.5), ("z", 3, [4], 0.01, 0.01),
               ("y", 4, [5, 6, 7], 0.5, 0.5)]
    g = build_cost_graph(hand_net(ops, tensors))
    plan = partition(g)
    check_plan(g, plan)
    assert [plan.device_of(i) for i in range(8)] == ["cpu"] + ["gpu"] * 4 + ["cpu"] * 3
    assert sorted((c.tensor, c.direction) for c in plan.copies) == [("x", "h2d"), ("y", "d2h")]
    assert plan.cost.copy_s == pytest.approx(1.0)
    assert plan.total_s == pytest.approx(1.0 + 0.4 + 3.0 + 1.0)


def test_host_input_pays_h2d_only_when_read_on_gpu():
    for h2d, where in ((2.0, "cpu"), (0.5, "gpu")):
        g = build_cost_graph(hand_net([(2.0, 1.0)], [("data", -1, [0], h2d, 0.1)]))
        plan = partition(g)
        check_plan(g, plan)
        assert plan.device_of(0) == where
        assert [c.tensor for c in plan.copies] == (["data"] if where == "gpu" else [])


def test_external_output_returns_to_host_unless_told_otherwise():
    tensors = [("out", 0, [], 0.1, 2.0, True)]
    g = build_cost_graph(hand_net([(2.0, 1.0)], tensors))
    assert partition(g).device_of(0) == "cpu"
    g = build_cost_graph(hand_net([(2.0, 1.0)], tensors), outputs_on_host=False)
    plan = partition(g)
    check_plan(g, plan)
    assert plan.device_of(0) == "gpu" and plan.copies == []


def test_parameters_are_never_copied():
    g = build_cost_graph(hand_net([(2.0, 1.0), (1.0, 5.0)],
                                  [("w", -2, [0, 1], 9.0, 9.0), ("a", 0, [1], 0.1, 0.1)]))
    plan = partition(g)
    check_plan(g, plan)
    assert plan.device_of(0) == "gpu" and plan.device_of(1) == "cpu"
    assert [c.tensor for c in plan.copies] == ["a"]


def test_pins_and_colocation_are_honoured():
    ops = [(1.0, 0.1), (1.0, 0.1), (0.1, 1.0), (0.1, 1.0)]
    tensors = [("a", 0, [1], 0.01, 0.01), ("b", 1, [2], 0.01, 0.01), ("c", 2, [3], 0.01, 0.01)]
    g = build_cost_graph(hand_net(ops, tensors), pins={0: "cpu"}, colocate=[{1, 2}],
                         inplace=[(3, 1)])
    plan = partition(g)
    check_plan(g, plan)
    assert plan.device_of(0) == "cpu"
    assert plan.device_of(1) == plan.device_of(2) == plan.device_of(3)
    assert plan.reasons[0] == "pinned: --pin cpu"


def test_reasons_follow_the_costs():
    ops = [(1.4, 0.1), (1.0, 2.0), (1.0, 0.9)]
    tensors = [("a", 0, [1], 0.01, 0.01), ("b", 1, [2], 5.0, 5.0)]
    plan = partition(build_cost_graph(hand_net(ops, tensors)))
    assert plan.reasons[0] == "GPU 14x faster"
    assert plan.reasons[1] == "CPU 2.0x faster"
    assert plan.reasons[2] == "CPU: copy of 'b' costs more than GPU saves"


def test_contradicting_pins_are_an_infeasible_plan():
    from placer.errors import InfeasiblePlanError
    g = build_cost_graph(hand_net([(1, 1), (1, 1)], [("a", 0, [1], 1, 1)]),
                         pins={0: "cpu", 1: "gpu"}, colocate=[{0, 1}])
    with pytest.raises(InfeasiblePlanError, match="pinned to different devices"):
        partition(g)
