"""GPU memory limits: the memory model, the exact MILP, the Lagrangian heuristic's gap,
and the error when nothing fits."""
import numpy as np
import pytest

from placer.errors import InfeasiblePlanError
from placer.graph import build_cost_graph
from placer.partition import check_plan, partition
from placer.partition.memory import MemoryPartitioner, usage
from placer.partition.milp import milp_partition
from placer.partition.mincut import mincut_placement
from placer.partition.problem import PIN_GPU, gpu_memory
from placer.partition.synthetic import random_arrays, random_small

from partition_cases import brute_force_costs, brute_force_memory, hand_net


def _rows(n):
    rows = np.arange(2 ** n)
    return ((rows[:, None] >> np.arange(n)) & 1).astype(bool)


def test_memory_model_matches_the_step_by_step_reference():
    rng = np.random.default_rng(5)
    for _ in range(40):
        arr = random_small(int(rng.integers(2, 10)), rng)
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, arr.n_ops)
        for x in _rows(arr.n_ops)[:: max(1, 2 ** arr.n_ops // 16)]:
            params, peak, _ = gpu_memory(arr, x)
            assert params + peak == pytest.approx(brute_force_memory(arr, x), rel=1e-12)


def test_milp_equals_brute_force_under_a_memory_limit():
    rng = np.random.default_rng(9)
    checked = 0
    for _ in range(40):
        n = int(rng.integers(3, 10))
        arr = random_small(n, rng)
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, n)
        rows = _rows(n)
        mem = np.array([brute_force_memory(arr, x) for x in rows])
        cost = brute_force_costs(arr)
        cap = float(np.quantile(mem, rng.uniform(0.1, 0.6)))
        feasible = np.where(mem <= cap, cost, np.inf)
        if not np.isfinite(feasible.min()):
            continue
        res = milp_partition(arr, cap, time_limit=20)
        assert res["optimal"]
        assert res["objective"] == pytest.approx(feasible.min(), rel=1e-7)
        assert usage(arr, res["x"]) <= cap * (1 + 1e-9)
        plan = partition(arr, method="milp", capacity_bytes=cap, reserve=0.0)
        check_plan(arr, plan, capacity=cap)
        checked += 1
    assert checked >= 25


def test_heuristic_is_close_to_the_milp_optimum():
    gaps = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        arr = random_arrays(int(rng.integers(60, 140)), seed=50 + seed, tensor_bytes=2e6)
        free = usage(arr, mincut_placement(arr))
        floor = usage(arr, arr.forced == PIN_GPU)
        cap = floor + (free - floor) * rng.uniform(0.3, 0.8)
        heur = MemoryPartitioner(cap, milp_time_limit=0).partition(arr)
        check_plan(arr, heur, capacity=cap)
        res = milp_partition(arr, cap, time_limit=30)
        assert res["optimal"]
        assert heur.total_s >= res["objective"] * (1 - 1e-9)
        gaps.append(heur.total_s / res["objective"] - 1)
        full = MemoryPartitioner(cap, milp_time_limit=30).partition(arr)
        check_plan(arr, full, capacity=cap)
        assert full.optimal and full.gap == pytest.approx(0.0, abs=1e-7)
    assert max(gaps) < 0.05 and np.median(gaps) < 0.01


def test_loose_limit_keeps_the_unconstrained_optimum():
    arr = random_arrays(200, seed=4)
    free = partition(arr)
    plan = partition(arr, capacity_bytes=10 * usage(arr, mincut_placement(arr)))
    check_plan(arr, plan, capacity=plan.gpu_capacity_bytes)
    assert plan.total_s == pytest.approx(free.total_s, rel=1e-12)
    assert plan.optimal and plan.gpu_memory_bytes <= plan.gpu_capacity_bytes


def test_tight_limit_moves_the_big_table_to_the_cpu():
    # a 6 GB embedding table read by a lookup that is 3x faster on the GPU
    ops = [(3e-3, 1e-3), (2e-3, 1e-4)]
    tensors = [("table", -2, [0], 0, 0, False, 6e9), ("ids", -1, [0], 1e-5, 1e-5, False, 1e3),
               ("emb", 0, [1], 1e-4, 1e-4, False, 1e6), ("out", 1, [], 1e-5, 1e-5, True, 1e3)]
    g = build_cost_graph(hand_net(ops, tensors))
    assert partition(g).device_of(0) == "gpu"
    plan = partition(g, capacity_bytes=4e9, reserve=0.1)
    check_plan(g, plan, capacity=3.6e9)
    assert plan.device_of(0) == "cpu" and plan.device_of(1) == "gpu"
    assert plan.reasons[0] == "CPU: its 5.59 GiB of parameters do not fit in GPU memory"  # 6e9 B
    assert plan.optimal


def test_pinned_set_over_capacity_names_ops_and_bytes():
    ops = [(1.0, 0.1), (1.0, 0.1)]
    tensors = [("w0", -2, [0], 0, 0, False, 3 * 2**20), ("w1", -2, [1], 0, 0, False, 2**20),
               ("a", 0, [1], 0.1, 0.1, False, 1.0)]
    g = build_cost_graph(hand_net(ops, tensors), pins={0: "gpu", 1: "gpu"})
    with pytest.raises(InfeasiblePlanError) as err:
        partition(g, capacity_bytes=2 * 2**20, reserve=0.0)
    msg = str(err.value)
    assert "4.0 MiB of GPU memory, 2.0 MiB over the 2.0 MiB usable" in msg
    assert "#0 FC 'op0' (3.0 MiB)" in msg and "#1 FC 'op1' (1.0 MiB)" in msg
