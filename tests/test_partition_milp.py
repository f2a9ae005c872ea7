"""The MILP over k devices: equal to brute force with and without memory limits, equal to
the min-cut on two devices, and clear errors when it cannot give a plan."""
import numpy as np
import pytest

from placer.errors import InfeasiblePlanError, PlacerError
from placer.partition import check_plan, partition
from placer.partition.milp import milp_partition
from placer.partition.mincut import MinCutPartitioner
from placer.partition.problem import memory_use, serial_cost
from placer.partition.synthetic import random_arrays, random_small

from placement_reference import (count_placements, memory_bytes, placements, random_constraints,
                                 serial_costs)


def _random_net(rng, max_rows=300_000):
    """A random net on 3-4 devices (2-3 GPUs, every peer kind, some heterogeneous), with
    random pins and colocation, of up to 12 ops, small enough to enumerate."""
    while True:
        gpus = int(rng.integers(2, 4))
        n = int(rng.integers(2, 13))
        arr = random_small(n, rng, gpus=gpus, peer=str(rng.choice(["mixed", "nvlink", "staged"])),
                           hetero=bool(rng.random() < 0.5))
        arr = random_constraints(arr, rng)
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, n)
        if count_placements(arr) <= max_rows and len(placements(arr)):
            return arr


def test_milp_equals_brute_force_without_limits():
    rng = np.random.default_rng(11)
    sizes = []
    for _ in range(40):
        arr = _random_net(rng)
        best = serial_costs(arr, placements(arr)).min()
        res = milp_partition(arr, time_limit=30)
        assert res["optimal"] and res["status"] == "optimal"
        assert res["objective"] == pytest.approx(best, rel=1e-9)
        assert serial_cost(arr, res["x"]).total_s == pytest.approx(best, rel=1e-9)
        assert res["bound"] <= best * (1 + 1e-9)
        sizes.append((arr.n_ops, arr.k))
    assert max(n for n, _ in sizes) >= 10 and {k for _, k in sizes} == {3, 4}


def test_milp_equals_brute_force_on_twelve_ops_and_four_devices():
    rng = np.random.default_rng(21)
    arr = random_small(12, rng, gpus=3, peer="mixed", hetero=True)
    allowed = arr.allowed.copy()
    for i in (2, 6, 9):       # three ops pinned and two colocated: 4^8 placements left
        allowed[i] = np.arange(arr.k) == i % arr.k
    arr.allowed = allowed
    arr.colocate = np.array([[4, 5]])
    every = placements(arr)
    assert len(every) == 4 ** 8
    cost = serial_costs(arr, every)
    res = milp_partition(arr, time_limit=60)
    assert res["optimal"] and res["objective"] == pytest.approx(cost.min(), rel=1e-9)
    mem = memory_bytes(arr, every)
    arr.capacity = np.concatenate([[np.inf], np.quantile(mem[:, 1:], 0.3, axis=0)])
    fits = (mem <= arr.capacity * (1 + 1e-12)).all(axis=1)
    res = milp_partition(arr, time_limit=60)
    assert res["optimal"] and res["objective"] == pytest.approx(cost[fits].min(), rel=1e-9)
    assert cost[fits].min() > cost.min()


def test_milp_equals_brute_force_under_memory_limits():
    rng = np.random.default_rng(12)
    checked = binding = 0
    for case in range(40):
        arr = _random_net(rng, max_rows=60_000)
        every = placements(arr)
        mem, cost = memory_bytes(arr, every), serial_costs(arr, every)
        cap = np.quantile(mem, rng.uniform(0.1, 0.7), axis=0)
        if case % 4:
            cap[arr.host] = np.inf          # usually no limit on the host
        arr.capacity = cap
        fits = (mem <= cap * (1 + 1e-12)).all(axis=1)
        res = milp_partition(arr, time_limit=30)
        if not fits.any():
            assert res["status"] == "infeasible" and res["x"] is None
            continue
        assert res["optimal"]
        assert res["objective"] == pytest.approx(cost[fits].min(), rel=1e-9)
        assert (memory_use(arr, res["x"]) <= cap * (1 + 1e-9)).all()
        assert serial_cost(arr, res["x"]).total_s == pytest.approx(cost[fits].min(), rel=1e-9)
        plan = partition(arr, method="milp")
        check_plan(arr, plan)
        assert plan.optimal and plan.total_s == pytest.approx(cost[fits].min(), rel=1e-9)
        checked += 1
        binding += cost[fits].min() > cost.min() * (1 + 1e-9)
    assert checked >= 25 and binding >= 10


def test_one_gpu_memory_limit_equals_brute_force():
    rng = np.random.default_rng(9)
    checked = 0
    for _ in range(30):
        n = int(rng.integers(3, 10))
        arr = random_small(n, rng)
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, n)
        every = placements(arr)
        mem, cost = memory_bytes(arr, every), serial_costs(arr, every)
        arr.capacity = np.array([np.inf, np.quantile(mem[:, 1], rng.uniform(0.1, 0.6))])
        fits = mem[:, 1] <= arr.capacity[1]
        res = milp_partition(arr, time_limit=20)
        assert res["optimal"]
        assert res["objective"] == pytest.approx(cost[fits].min(), rel=1e-9)
        checked += 1
    assert checked == 30


@pytest.mark.parametrize("n", [120, 400])
def test_two_devices_equals_the_min_cut(n):
    arr = random_arrays(n, seed=n, tensor_bytes=3e6)
    plan = MinCutPartitioner().partition(arr)
    check_plan(arr, plan)
    res = milp_partition(arr, time_limit=60)
    assert res["optimal"]
    assert plan.total_s == pytest.approx(res["objective"], rel=1e-9)


def test_milp_plan_reports_its_optimum_and_notes():
    arr = random_arrays(60, seed=3, gpus=3, peer="mixed", hetero=True)
    plan = partition(arr, method="milp", time_limit=60)
    check_plan(arr, plan)
    assert plan.method == "milp" and plan.optimal and plan.gap == pytest.approx(0.0, abs=1e-6)
    assert plan.notes[0].startswith("MILP (")


def test_too_many_variables_is_skipped_not_solved():
    arr = random_arrays(200, seed=1, gpus=3)
    res = milp_partition(arr, time_limit=10, max_vars=100)
    assert res["status"] == "skipped" and res["x"] is None and "more than 100 variables" in res["note"]


def test_no_solution_in_the_time_limit_asks_for_more_time():
    arr = random_arrays(1000, seed=2, gpus=3, peer="mixed")
    arr.capacity = np.array([np.inf, 1e9, 1e9, 1e9])
    with pytest.raises(PlacerError, match="raise --time-limit") as err:
        partition(arr, method="milp", time_limit=0)
    assert not isinstance(err.value, InfeasiblePlanError)
    msg = str(err.value)
    assert "the MILP found no placement within its 0 s time limit" in msg and "Time limit reached" in msg
    assert "\n" not in msg


def test_no_placement_fits_is_an_infeasible_plan():
    arr = random_small(6, np.random.default_rng(4), gpus=2)
    arr.capacity = np.full(arr.k, 1.0)         # one byte on every device, the host too
    with pytest.raises(InfeasiblePlanError, match="no placement satisfies the pins and the memory limits"):
        partition(arr, method="milp")
