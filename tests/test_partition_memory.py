"""Memory limits per device: the memory model, the heuristic's gap to the MILP optimum,
the single-GPU plans kept, and the error when the pinned ops alone do not fit."""
import numpy as np
import pytest

from placer.errors import InfeasiblePlanError
from placer.partition import check_plan, partition
from placer.partition.expansion import ExpansionPartitioner, expansion_placement
from placer.partition.memory import MemoryPartitioner, improve, over_limit, repair
from placer.partition.milp import milp_partition
from placer.partition.mincut import mincut_placement
from placer.partition.problem import device_memory, memory_use, respecting_pins, serial_cost
from placer.partition.synthetic import random_arrays, random_small

from placement_reference import (hand_arrays, memory_bytes, placements, random_constraints, serial_costs,
                                 two_device_net)


def test_memory_model_matches_the_step_by_step_reference():
    rng = np.random.default_rng(5)
    for _ in range(40):
        arr = random_small(int(rng.integers(2, 8)), rng, gpus=int(rng.integers(1, 4)))
        arr.output_bytes = arr.output_bytes * rng.uniform(1.0, 1.5, arr.n_ops)
        every = placements(arr)
        some = every[:: max(1, len(every) // 16)]
        expect = memory_bytes(arr, some)
        for row, want in zip(some, expect):
            params, peak, _ = device_memory(arr, row)
            assert params + peak == pytest.approx(want, rel=1e-12)


def _limits(arr, rng, low=0.3, high=0.8):
    """GPU limits between what the pinned ops need and what the unconstrained plan uses."""
    free = memory_use(arr, expansion_placement(arr)[0] if arr.k > 2 else mincut_placement(arr))
    floor = memory_use(arr, respecting_pins(arr, np.full(arr.n_ops, arr.host)))
    cap = floor + (free - floor) * rng.uniform(low, high, arr.k)
    cap[arr.host] = np.inf
    return cap


def test_one_gpu_heuristic_is_close_to_the_milp_optimum():
    gaps = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        arr = random_arrays(int(rng.integers(60, 140)), seed=50 + seed, tensor_bytes=2e6)
        free = memory_use(arr, mincut_placement(arr))[1]
        arr.capacity = np.array([np.inf, free * rng.uniform(0.3, 0.8)])
        heur = MemoryPartitioner(milp_time_limit=0).partition(arr)
        check_plan(arr, heur)
        res = milp_partition(arr, time_limit=30)
        assert res["optimal"]
        assert heur.total_s >= res["objective"] * (1 - 1e-9)
        gaps.append(heur.total_s / res["objective"] - 1)
        full = MemoryPartitioner(milp_time_limit=30).partition(arr)
        check_plan(arr, full)
        assert full.optimal and full.gap == pytest.approx(0.0, abs=1e-7)
    assert max(gaps) < 0.05 and np.median(gaps) < 0.01


def test_several_gpus_heuristic_is_close_to_the_milp_optimum():
    gaps = []
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        arr = random_arrays(int(rng.integers(40, 120)), seed=200 + seed, gpus=2 + seed % 2,
                            tensor_bytes=float(rng.choice([5e5, 2e6, 8e6])),
                            peer=("mixed", "nvlink", "staged")[seed % 3], hetero=seed % 3 == 1)
        arr.capacity = _limits(arr, rng, 0.2, 0.9)
        heur = MemoryPartitioner(milp_time_limit=0, improve_time_s=1.0).partition(arr)
        check_plan(arr, heur)
        assert not over_limit(arr, heur.placement).any()
        res = milp_partition(arr, time_limit=60)
        assert res["optimal"]
        assert heur.total_s >= res["objective"] * (1 - 1e-9)
        gaps.append(heur.total_s / res["objective"] - 1)
    assert max(gaps) < 0.05 and np.median(gaps) < 0.01


def test_memory_partitioner_with_the_milp_reaches_the_brute_force_optimum():
    rng = np.random.default_rng(12)
    checked = 0
    for _ in range(40):
        arr = random_small(int(rng.integers(3, 8)), rng, gpus=int(rng.integers(2, 4)),
                           peer=str(rng.choice(["mixed", "nvlink", "staged"])), hetero=bool(rng.random() < 0.5))
        arr = random_constraints(arr, rng, pin_p=0.15)
        if not len(placements(arr)):
            continue
        every = placements(arr)
        mem, cost = memory_bytes(arr, every), serial_costs(arr, every)
        arr.capacity = np.where(np.arange(arr.k) == arr.host, np.inf,
                                np.quantile(mem, rng.uniform(0.1, 0.6), axis=0))
        fits = (mem <= arr.capacity * (1 + 1e-12)).all(axis=1)
        if not fits.any():    # pins put more on a GPU than it holds
            with pytest.raises(InfeasiblePlanError):
                MemoryPartitioner(milp_time_limit=20, improve_time_s=0.3).partition(arr)
            continue
        if fits[cost == cost.min()].any():
            continue      # the limit does not bind
        plan = MemoryPartitioner(milp_time_limit=20, improve_time_s=0.3).partition(arr)
        check_plan(arr, plan)
        assert plan.total_s == pytest.approx(cost[fits].min(), rel=1e-7)
        assert plan.optimal
        checked += 1
    assert checked >= 10


def test_one_gpu_loose_limit_keeps_the_unconstrained_optimum():
    arr = random_arrays(200, seed=4)
    free = partition(arr)
    arr.capacity = np.array([np.inf, 10 * free.memory_bytes[1]])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.method == "mincut-memory"
    assert plan.total_s == pytest.approx(free.total_s, rel=1e-12)
    assert plan.optimal and plan.memory_bytes[1] <= plan.capacity_bytes[1]


def test_several_gpus_loose_limit_keeps_the_expansion_plan():
    arr = random_arrays(200, seed=4, gpus=3, hetero=True)
    free = ExpansionPartitioner().partition(arr)
    arr.capacity = np.concatenate([[np.inf], 10 * free.memory_bytes[1:] + 1])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.method == "expansion-memory"
    assert plan.total_s == pytest.approx(free.total_s, rel=1e-12)


def _table_net(**kw):
    # a 6 GB embedding table read by a lookup that is 3x faster on the GPU
    ops = [(3e-3, 1e-3), (2e-3, 1e-4)]
    tensors = [("table", -2, [0], 0, 0, False, 6e9), ("ids", -1, [0], 1e-5, 1e-5, False, 1e3),
               ("emb", 0, [1], 1e-4, 1e-4, False, 1e6), ("out", 1, [], 1e-5, 1e-5, True, 1e3)]
    return two_device_net(ops, tensors, **kw)


def test_tight_limit_moves_the_big_table_to_the_cpu():
    assert partition(_table_net()).device_of(0) == "cuda:0"
    arr = _table_net(capacity=[np.inf, 3.6e9])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.device_of(0) == "cpu" and plan.device_of(1) == "cuda:0"
    assert plan.reasons[0] == "cpu: its 5.59 GiB of parameters do not fit on cuda:0"   # 6e9 B
    assert plan.optimal
    # by hand: op0 on the CPU 3 ms, emb to the GPU 0.1 ms, op1 0.1 ms, out back 0.01 ms
    assert plan.total_s == pytest.approx(3e-3 + 1e-4 + 1e-4 + 1e-5)


def _two_tables(capacity):
    """Two 6 GB tables, each read by a lookup 3x faster on a GPU, and an op joining both."""
    ops = [(3e-3, 1e-3, 1e-3), (3e-3, 1e-3, 1e-3), (1e-3, 1e-4, 1e-4)]
    tensors = [("tableA", -2, [0], (0, 0, 0), False, 6e9), ("tableB", -2, [1], (0, 0, 0), False, 6e9),
               ("ids", -1, [0, 1], (1e-5, 1e-5, 1e-6), False, 1e3),
               ("embA", 0, [2], (1e-4, 1e-4, 1e-5)), ("embB", 1, [2], (1e-4, 1e-4, 1e-5)),
               ("out", 2, [], (1e-5, 1e-5, 1e-6), True, 1e3)]
    return hand_arrays(ops, tensors, capacity=capacity)


def test_two_tables_too_big_for_one_gpu_go_one_per_gpu():
    free = partition(_two_tables(None))
    assert len(set(free.placement.tolist())) == 1        # everything on one GPU
    arr = _two_tables([np.inf, 8e9, 8e9])
    plan = partition(arr)
    check_plan(arr, plan)
    assert plan.device_of(0) != plan.device_of(1) and plan.kind_of(0) == plan.kind_of(1) == "gpu"
    every = placements(arr)
    fits = (memory_bytes(arr, every) <= arr.capacity).all(axis=1)
    assert plan.total_s == pytest.approx(serial_costs(arr, every)[fits].min(), rel=1e-12)
    # by hand: 1 + 1 + 0.1 ms of ops, ids to both GPUs, one embedding over the peer link, out back
    assert plan.total_s == pytest.approx(2.1e-3 + 2e-5 + 1e-5 + 1e-5)


def test_repair_and_improve_keep_every_device_within_its_limit():
    rng = np.random.default_rng(3)
    for seed in range(4):
        arr = random_arrays(150, seed=seed, gpus=3, tensor_bytes=3e6)
        arr.capacity = _limits(arr, rng, 0.2, 0.5)
        start = expansion_placement(arr)[0]
        assert over_limit(arr, start).any()
        fixed = repair(arr, start)
        assert not over_limit(arr, fixed).any()
        moved = np.flatnonzero(fixed != start)
        assert (arr.feasible[moved, fixed[moved]]).all()
        better = improve(arr, fixed, time_s=1.0)
        assert not over_limit(arr, better).any()
        assert serial_cost(arr, better).total_s <= serial_cost(arr, fixed).total_s


def test_pinned_set_over_capacity_names_device_ops_and_bytes():
    ops = [(1.0, 0.1, False), (1.0, 0.1, False)]
    tensors = [("w0", -2, [0], 0, 0, False, 3 * 2**20), ("w1", -2, [1], 0, 0, False, 2**20),
               ("a", 0, [1], 0.1, 0.1, False, 1.0)]
    arr = two_device_net(ops, tensors, capacity=[np.inf, 2 * 2**20])
    arr.allowed = np.array([[False, True], [False, True]])     # both pinned to the GPU
    with pytest.raises(InfeasiblePlanError) as err:
        partition(arr)
    msg = str(err.value)
    assert "the ops pinned to cuda:0 need 4.0 MiB of its memory, 2.0 MiB over the 2.0 MiB usable" in msg
    assert "#0 FC 'op0' (3.0 MiB)" in msg and "#1 FC 'op1' (1.0 MiB)" in msg
    assert "\n" not in msg


def test_pinned_set_over_capacity_on_the_second_gpu():
    arr = _two_tables([np.inf, 8e9, 8e9])
    arr.allowed = np.array([[False, False, True], [False, False, True], [True, True, True]])
    with pytest.raises(InfeasiblePlanError) as err:
        partition(arr)
    # 12e9 B of tables + embB (1e6 B) and the ids copy (1e3 B) live at step 1
    assert ("the ops pinned to cuda:1 need 11445.0 MiB of its memory, 3815.7 MiB over the 7629.4 MiB usable"
            in str(err.value))


def test_window_re_solve_holds_the_rest_and_is_exact_on_two_devices():
    import itertools
    from placer.partition.memory import Relaxation
    rng = np.random.default_rng(8)
    for case in range(20):
        arr = random_small(int(rng.integers(5, 10)), rng, gpus=1 + case % 3)
        x = respecting_pins(arr, rng.integers(0, arr.k, arr.n_ops))
        start = int(rng.integers(0, arr.n_ops - 3))
        inside = slice(start, start + 3)
        y = Relaxation(arr).window(x, inside, np.zeros((arr.n_ops, arr.k)))
        outside = np.ones(arr.n_ops, bool)
        outside[inside] = False
        assert (y[outside] == x[outside]).all()
        got = serial_cost(arr, y).total_s
        assert got <= serial_cost(arr, x).total_s * (1 + 1e-12)
        if arr.k == 2:   # the min-cut over the window is exact
            best = np.inf
            for devs in itertools.product(*[np.flatnonzero(arr.feasible[i]) for i in range(start, start + 3)]):
                z = x.copy()
                z[inside] = devs
                best = min(best, serial_cost(arr, z).total_s)
            assert got == pytest.approx(best, rel=1e-9)


def test_priced_expansion_keeps_colocated_ops_together():
    """Every start of the relaxed solves, and so every plan, keeps colocation groups on
    one device, whatever the per-device prices."""
    rng = np.random.default_rng(30)
    for _ in range(30):
        arr = random_constraints(random_small(int(rng.integers(3, 9)), rng, gpus=int(rng.integers(2, 4)),
                                              hetero=True), rng, pin_p=0.0, pairs=3)
        extra = rng.exponential(1e-4, (arr.n_ops, arr.k))
        for a, b in arr.colocate.tolist():     # times and prices that pull the two apart
            arr.op_s[a], arr.op_s[b] = 1.0, 1.0
            arr.op_s[a, 1], arr.op_s[b, 2] = 1e-6, 1e-6
            extra[a], extra[b] = 1.0, 1.0
            extra[a, 1], extra[b, 2] = 0.0, 0.0
        dev, _ = expansion_placement(arr, extra=extra)
        for a, b in arr.colocate.tolist():
            assert dev[a] == dev[b]


def test_no_placement_fits_though_each_pin_does():
    """Three 6 GB tables whose lookups may run on either GPU only (8 GB each): no pin
    alone is over, yet no placement fits; the MILP proves it, the heuristic says so."""
    ops = [(None, 1e-3, 1e-3)] * 3
    tensors = [(f"table{i}", -2, [i], (0, 0, 0), False, 6e9) for i in range(3)]
    arr = hand_arrays(ops, tensors, capacity=[np.inf, 8e9, 8e9])
    with pytest.raises(InfeasiblePlanError, match="no placement satisfies the pins and the memory limits"):
        partition(arr)
    with pytest.raises(InfeasiblePlanError, match="no placement found that fits the memory of cuda:"):
        MemoryPartitioner(milp_time_limit=0).partition(arr)


def test_the_milp_a_plan_runs_itself_is_sized_to_its_time_limit():
    """HiGHS does not stop its root LP relaxation at the time limit (210k variables took
    99 s against 5 s), so the memory partitioner skips a MILP with more variables than
    ``vars_within(time limit)`` and says why; within that size it runs and proves."""
    from placer.partition import milp
    from placer.planning.view import optimality
    assert milp.vars_within(10) == milp.ROOT_LP_VARS_IN_10S
    assert milp.vars_within(40) == 2 * milp.ROOT_LP_VARS_IN_10S and milp.vars_within(0) == 0
    arr = random_arrays(120, seed=53, tensor_bytes=2e6)
    free = memory_use(arr, mincut_placement(arr))[1]
    arr.capacity = np.array([np.inf, free * 0.5])
    assert milp._least_variables(arr) > milp.vars_within(1e-5)
    quick = MemoryPartitioner(milp_time_limit=1e-5).partition(arr)
    check_plan(arr, quick)
    assert any(n.startswith("MILP skipped") and "root LP relaxation" in n for n in quick.notes)
    assert not quick.optimal and quick.gap is None and "too big for the MILP" in optimality(quick)
    full = MemoryPartitioner(milp_time_limit=30).partition(arr)
    assert full.optimal and not any("skipped" in n for n in full.notes)
    assert full.total_s <= quick.total_s * (1 + 1e-9)


def test_on_three_or_more_devices_the_milp_proves_or_improves_the_expansion_plan():
    """Where the unconstrained alpha-expansion plan fits, the MILP (within its time limit)
    proves it optimal, or replaces it with a shorter plan and says by how much: random nets
    on 3-4 devices whose GPUs suit different ops (the case where expansion can miss)."""
    from placer.partition.expansion import expansion_placement
    rng = np.random.default_rng(5)
    proved = improved = 0
    for seed in range(40):
        n, gpus = int(rng.integers(20, 120)), int(rng.integers(2, 4))
        arr = random_arrays(n, seed=seed, gpus=gpus, peer=str(rng.choice(["mixed", "nvlink", "staged"])))
        arr.op_s[:, 1:] *= rng.lognormal(0.0, 0.7, (n, gpus))
        expansion = serial_cost(arr, expansion_placement(arr)[0]).total_s
        plan = MemoryPartitioner(milp_time_limit=30).partition(arr)
        check_plan(arr, plan)
        res = milp_partition(arr, time_limit=30)
        assert res["optimal"] and plan.optimal and plan.gap == pytest.approx(0.0, abs=1e-9)
        assert plan.total_s == pytest.approx(res["objective"], rel=1e-9, abs=1e-12)
        if plan.total_s < expansion * (1 - 1e-9):
            improved += 1
            assert any("shorter than alpha-expansion's" in note for note in plan.notes)
        proved += 1
    assert proved == 40 and improved >= 1
