"""Makespan: the event simulator on hand-timed nets, the timeline's invariants, and the
makespan plan never worse than the min-cut plan's makespan."""
import numpy as np
import pytest

from placer.graph import build_cost_graph
from placer.partition import check_plan, partition
from placer.partition.mincut import mincut_placement
from placer.partition.schedule import Simulator, heft_placement
from placer.partition.synthetic import random_arrays

from partition_cases import hand_net


def _fork():
    # op0 makes a, read by op1 and op2; op3 reads b (op1) and c (op2)
    ops = [(1.0, 1.0), (4.0, 4.0), (4.0, 4.0), (1.0, 1.0)]
    tensors = [("a", 0, [1, 2], 0.5, 0.5), ("b", 1, [3], 0.25, 0.25),
               ("c", 2, [3], 0.25, 0.25), ("out", 3, [], 0.1, 0.1, True)]
    return build_cost_graph(hand_net(ops, tensors))


def test_simulator_overlaps_cpu_gpu_and_copies():
    sim = Simulator(_fork())
    # all on the CPU: a chain of 1 + 4 + 4 + 1
    assert sim.score(np.zeros(4, bool)) == pytest.approx(10.0)
    # op2 on the GPU: a copied in [1, 1.5], op2 [1.5, 5.5], c copied out [5.5, 5.75];
    # op1 on the CPU [1, 5]; op3 starts at 5.75 and ends at 6.75
    assert sim.score(np.array([0, 0, 1, 0], bool)) == pytest.approx(6.75)
    # op3 on the GPU as well: b copied in [5, 5.25], op3 [5.5, 6.5], out back [6.5, 6.6]
    assert sim.score(np.array([0, 0, 1, 1], bool)) == pytest.approx(6.6)


def test_copy_lanes_run_in_issue_order():
    # two blobs from the CPU to the GPU share the one H2D engine
    ops = [(1.0, 1.0), (1.0, 1.0), (1.0, 1.0)]
    tensors = [("x", -1, [0], 2.0, 2.0), ("y", -1, [1], 2.0, 2.0), ("z", -1, [2], 0.1, 0.1)]
    sim = Simulator(build_cost_graph(hand_net(ops, tensors)))
    # x [0,2], y [2,4]; op0 [2,3], op1 [4,5]; op2 on the CPU [0,1]
    assert sim.score(np.array([1, 1, 0], bool)) == pytest.approx(5.0)


def _check_timeline(g, on_gpu, events):
    per_lane = {}
    for e in events:
        assert e["end_s"] >= e["start_s"]
        per_lane.setdefault(e["lane"], []).append((e["start_s"], e["end_s"]))
    for spans in per_lane.values():
        spans.sort()
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0 - 1e-12, "two items overlap on one lane"
    ops = {e["op"]: e for e in events if e["kind"] == "op"}
    assert sorted(ops) == list(range(g.number_of_nodes()))
    for u, v in g.edges:
        if on_gpu[u] == on_gpu[v]:
            assert ops[v]["start_s"] >= ops[u]["end_s"] - 1e-12
        else:
            copies = [e for e in events if e["kind"] == "copy" and e["tensor"] in g.edges[u, v]["tensors"]]
            assert copies and min(c["start_s"] for c in copies) >= ops[u]["end_s"] - 1e-12
            assert ops[v]["start_s"] >= min(c["end_s"] for c in copies) - 1e-12
    for e in events:
        assert (e["lane"] == "gpu") == bool(e["kind"] == "op" and on_gpu[e["op"]]) or e["kind"] == "copy"


def test_makespan_plan_is_never_worse_than_min_cut():
    from placer.partition.synthetic import to_net_costs
    for seed in range(8):
        arr = random_arrays(int(np.random.default_rng(seed).integers(20, 120)), seed=seed,
                            tensor_bytes=2e6)
        g = build_cost_graph(to_net_costs(arr))
        sim = Simulator(g)
        base = sim.score(mincut_placement(arr))
        plan = partition(g, method="makespan", time_s=0.3)
        check_plan(g, plan)
        assert plan.objective == "makespan"
        assert plan.makespan_s <= base * (1 + 1e-12)
        assert plan.makespan_s == pytest.approx(sim.score(plan))
        on_gpu = [plan.device_of(i) == "gpu" for i in range(arr.n_ops)]
        _check_timeline(g, on_gpu, plan.timeline)


def test_heft_respects_pins():
    arr = random_arrays(80, seed=3)
    x = heft_placement(arr)
    assert not x[arr.forced == 0].any()


def test_makespan_plan_keeps_the_memory_limit():
    from placer.partition.memory import usage
    arr = random_arrays(100, seed=12, tensor_bytes=2e6)
    cap = 0.5 * usage(arr, mincut_placement(arr))
    plan = partition(arr, method="makespan", capacity_bytes=cap, reserve=0.0, time_s=0.3)
    check_plan(arr, plan, capacity=cap)
    serial = partition(arr, capacity_bytes=cap, reserve=0.0, time_limit=0)
    assert plan.makespan_s <= Simulator(arr).score(serial) * (1 + 1e-12)
