"""Baselines: hand-computed totals on one and two GPUs, memory-aware ones within the
limits, pins honoured, and the optimum never worse than any baseline."""
import numpy as np
import pytest

from placer.partition import baselines, check_plan, partition
from placer.partition.milp import milp_partition
from placer.partition.synthetic import random_arrays

from placement_reference import hand_arrays, random_constraints, two_device_net

PLANS = ("all_cpu", "all_gpu", "greedy", "pipeline", "m_topo", "m_etf")


def _one_gpu_net():
    # op0 CPU-only; op1 10x faster on the GPU; op2 slower on the GPU
    ops = [(1.0, 1.0, False), (2.0, 0.2), (0.5, 1.0)]
    tensors = [("in", -1, [0], 0.3, 0.3), ("a", 0, [1], 0.4, 0.4), ("b", 1, [2], 0.6, 0.6),
               ("out", 2, [], 0.1, 0.1, True)]
    return two_device_net(ops, tensors)


def test_hand_computed_baselines_on_one_gpu():
    arr = _one_gpu_net()
    got = baselines.baselines(arr, existing_placement=[0, 0, 1])
    for name, plan in got.items():
        if name != "lower_bound":
            check_plan(arr, plan)
    assert got["all_cpu"].total_s == pytest.approx(3.5)
    # all-GPU with fallback: op0 CPU 1, copy a 0.4, op1 0.2, op2 1.0, out back 0.1
    assert got["all_gpu"].total_s == pytest.approx(2.7)
    assert got["all_gpu"].device_of(0) == "cpu"
    # greedy: op1 GPU, op2 CPU: 1 + 0.4 + 0.2 + 0.6 + 0.5
    assert got["greedy"].total_s == pytest.approx(2.7)
    # existing: op2 on the GPU: 1 + 2 + copy b 0.6 + 1.0 + out back 0.1
    assert got["existing"].total_s == pytest.approx(4.7)
    # one GPU: the pipeline, m-TOPO and m-ETF put every op that may run there on it
    for name in ("pipeline", "m_topo", "m_etf"):
        assert got[name].placement.tolist() == [0, 1, 1], name
    assert got["lower_bound"].total_s == pytest.approx(1.7)
    assert partition(arr).total_s == pytest.approx(2.7)


def _chain():
    """cpu, cuda:0, cuda:1 (twice as slow); op0 CPU-only; a chain op1..op4, op3 slower
    on the GPUs. Copy seconds per class: host -> GPU, GPU -> host, GPU -> GPU."""
    ops = [(1.0, None, None), (2.0, 0.2, 0.4), (2.0, 0.2, 0.4), (0.5, 1.0, 2.0), (4.0, 0.4, 0.8)]
    tensors = [("in", -1, [0], (0.3, 0.3, 0.03)), ("a", 0, [1], (0.4, 0.4, 0.04)),
               ("b", 1, [2], (0.6, 0.6, 0.06)), ("c", 2, [3], (0.5, 0.5, 0.05)),
               ("d", 3, [4], (0.2, 0.2, 0.02)), ("out", 4, [], (0.1, 0.1, 0.01), True)]
    return hand_arrays(ops, tensors)


def test_hand_computed_baselines_on_two_gpus():
    arr = _chain()
    got = baselines.baselines(arr)
    for name in PLANS:
        check_plan(arr, got[name])
        assert len(got[name].memory_bytes) == 3
    assert got["all_cpu"].total_s == pytest.approx(9.5)
    # the fastest GPU is cuda:0: op0 1, a 0.4, ops 0.2 + 0.2 + 1.0 + 0.4, out 0.1
    assert got["all_gpu"].placement.tolist() == [0, 1, 1, 1, 1]
    assert got["all_gpu"].total_s == pytest.approx(3.3)
    # greedy: op3 on the CPU: ops 2.3, copies a 0.4, c 0.5, d 0.2, out 0.1
    assert got["greedy"].placement.tolist() == [0, 1, 1, 0, 1]
    assert got["greedy"].total_s == pytest.approx(3.5)
    # pipeline: mean GPU work 0.3, 0.3, 1.5, 0.6; cuda:0 twice as fast takes 2/3 of 2.7:
    # op4's midpoint (2.4) is past 1.8. Ops 1 + 0.2 + 0.2 + 1.0 + 0.8, a 0.4, d 0.02, out 0.1
    assert got["pipeline"].placement.tolist() == [0, 1, 1, 1, 2]
    assert got["pipeline"].total_s == pytest.approx(3.72)
    # m-TOPO: share 2.7 / 2 = 1.35; cuda:0 holds op1, op2 (0.4), op3 would make it 1.4.
    # Ops 1 + 0.2 + 0.2 + 2.0 + 0.8, a 0.4, c over the peer link 0.05, out 0.1
    assert got["m_topo"].placement.tolist() == [0, 1, 1, 2, 2]
    assert got["m_topo"].total_s == pytest.approx(4.75)
    # m-ETF on a chain: each op starts earliest where its input already is
    assert got["m_etf"].placement.tolist() == [0, 1, 1, 1, 1]
    assert got["lower_bound"].total_s == pytest.approx(1.0 + 0.2 + 0.2 + 0.5 + 0.4)


def _branches(capacity=None):
    """Two independent branches reading one host input, joined by op2."""
    ops = [(4.0, 1.0, 1.0), (4.0, 1.0, 1.0), (1.0, 0.5, 0.5)]
    tensors = [("x", -1, [0, 1], (0.1, 0.1, 0.01)), ("y0", 0, [2], (0.2, 0.2, 0.02)),
               ("y1", 1, [2], (0.2, 0.2, 0.02)), ("out", 2, [], (0.1, 0.1, 0.01), True, 1e3)]
    return hand_arrays(ops, tensors, capacity=capacity)


def test_m_etf_spreads_branches_and_skips_a_gpu_without_room():
    arr = _branches()
    plan = baselines.m_etf(arr)
    # op0 on cuda:0 from 0.1 s (x copied in); op1 starts at 0.1 s on cuda:1, not 1.1 s
    # on cuda:0; the join starts when y1 arrives (1.12 s) on either: the lower index
    assert plan.placement.tolist() == [1, 2, 1]
    assert plan.total_s == pytest.approx(2.5 + 0.1 + 0.1 + 0.02 + 0.1)
    assert baselines.m_topo(arr).placement.tolist() == [1, 2, 2]
    # cuda:1 has room for 0.5 MB: x and y1 (1 MB each) do not fit there
    arr = _branches(capacity=[np.inf, 1e7, 5e5])
    plan = baselines.m_etf(arr)
    check_plan(arr, plan)
    assert plan.placement.tolist() == [1, 1, 1] and plan.total_s == pytest.approx(2.7)
    topo = baselines.m_topo(arr)
    check_plan(arr, topo)
    # m-TOPO fills cuda:0 to its share (1.25 s) with op0, finds no room on cuda:1: the host
    assert topo.placement.tolist() == [1, 0, 0] and topo.total_s == pytest.approx(6.3)


def test_memory_blind_baselines_say_when_they_do_not_fit():
    arr = random_arrays(300, seed=2, gpus=2, tensor_bytes=3e6)
    free = baselines.all_gpu(arr)
    g = free.placement[free.placement > 0][0]
    arr.capacity = np.where(np.arange(arr.k) == 0, np.inf, free.memory_bytes[g] / 3)
    plan = baselines.all_gpu(arr)
    assert (plan.memory_bytes > plan.capacity_bytes).any()
    assert any(note.startswith(f"does not fit: {arr.devices[g]} needs") for note in plan.notes)
    for name in ("m_topo", "m_etf"):
        aware = getattr(baselines, name)(arr)
        check_plan(arr, aware)                 # within every limit
        assert aware.notes == []


def test_baselines_honour_pins_colocation_and_limits_on_random_nets():
    rng = np.random.default_rng(4)
    for seed in range(6):
        arr = random_constraints(random_arrays(120, seed=seed, gpus=int(rng.integers(1, 4)),
                                               hetero=bool(seed % 2), no_kernel=0.1), rng, pairs=4)
        got = baselines.baselines(arr, existing_placement=np.zeros(arr.n_ops, np.int64))
        for name in PLANS:
            check_plan(arr, got[name])
        arr.capacity = np.where(np.arange(arr.k) == 0, np.inf, 2e8)
        for name in ("m_topo", "m_etf"):
            check_plan(arr, getattr(baselines, name)(arr))


def test_the_optimum_is_never_worse_than_a_baseline():
    for seed in range(10):
        arr = random_arrays(150, seed=seed, tensor_bytes=3e6)
        best = partition(arr).total_s
        got = baselines.baselines(arr)
        assert got["lower_bound"].total_s <= best * (1 + 1e-12)
        for name in PLANS:
            assert best <= got[name].total_s * (1 + 1e-12), name
    for seed in range(3):
        arr = random_arrays(60, seed=seed, gpus=2 + seed % 2, hetero=True, tensor_bytes=3e6)
        res = milp_partition(arr, time_limit=60)
        assert res["optimal"]
        got = baselines.baselines(arr)
        assert got["lower_bound"].total_s <= res["objective"] * (1 + 1e-12)
        for name in PLANS:
            assert res["objective"] <= got[name].total_s * (1 + 1e-12), name


def test_partition_by_method_name():
    arr = _chain()
    for name in PLANS:
        assert partition(arr, method=name).method == name
    with pytest.raises(ValueError, match="unknown partition method 'fastest'"):
        partition(arr, method="fastest")
