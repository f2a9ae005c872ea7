"""Baselines: hand-computed totals, pins honoured, and min-cut never worse than any."""
import pytest

from placer.graph import build_cost_graph
from placer.partition import baselines, check_plan, partition
from placer.partition.synthetic import random_arrays

from partition_cases import hand_net


def _net():
    # op0 CPU-only; op1 10x faster on the GPU; op2 slower on the GPU
    ops = [(1.0, 1.0, False), (2.0, 0.2), (0.5, 1.0)]
    tensors = [("in", -1, [0], 0.3, 0.3), ("a", 0, [1], 0.4, 0.4), ("b", 1, [2], 0.6, 0.6),
               ("out", 2, [], 0.1, 0.1, True)]
    return build_cost_graph(hand_net(ops, tensors))


def test_hand_computed_baselines():
    g = _net()
    got = baselines.baselines(g, existing_placement={0: "cpu", 1: "cpu", 2: "gpu"})
    for name, plan in got.items():
        if name != "lower_bound":
            check_plan(g, plan)
    assert got["all_cpu"].total_s == pytest.approx(3.5)
    # all-GPU with fallback: op0 CPU 1, copy a 0.4, op1 0.2, op2 1.0, out back 0.1
    assert got["all_gpu"].total_s == pytest.approx(2.7)
    assert got["all_gpu"].device_of(0) == "cpu"
    # greedy: op1 GPU, op2 CPU: 1 + 0.4 + 0.2 + 0.6 + 0.5
    assert got["greedy"].total_s == pytest.approx(2.7)
    # existing: op2 on the GPU: 1 + 2 + copy b 0.6 + 1.0 + out back 0.1
    assert got["existing"].total_s == pytest.approx(4.7)
    assert got["lower_bound"].total_s == pytest.approx(1.7)
    assert partition(g).total_s == pytest.approx(2.7)


def test_min_cut_is_never_worse_than_a_baseline():
    for seed in range(10):
        arr = random_arrays(150, seed=seed, tensor_bytes=3e6)
        best = partition(arr).total_s
        got = baselines.baselines(arr)
        for name, plan in got.items():
            if name == "lower_bound":
                assert plan.total_s <= best * (1 + 1e-12)
            else:
                check_plan(arr, plan)
                assert best <= plan.total_s * (1 + 1e-12), name


def test_partition_by_method_name():
    g = _net()
    assert partition(g, method="all_cpu").method == "all_cpu"
    with pytest.raises(ValueError, match="unknown partition method 'fastest'"):
        partition(g, method="fastest")
