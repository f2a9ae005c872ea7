"""Plan stability: re-solves under costs moved within their measured spread; per-op flip
counts checked against brute-force optima of the very costs each draw produced."""
from __future__ import annotations

import numpy as np
import pytest
from partition_cases import brute_force_best
from placement_reference import hand_arrays, two_device_net

from placer.partition import partition, stability

# Four independent ops (copies cost next to nothing) on the CPU + one GPU machine: 0 is
# clearly GPU, 1 is a toss-up, 2 is clearly CPU, 3 is pinned to the CPU by having no GPU kernel.
OPS = [(1.0, 0.2), (1.0, 1.01), (0.1, 5.0), (0.5, 0.1, False)]
TENSORS = [("x", -1, [0, 1, 2, 3], 1e-9, 1e-9), ("y0", 0, [], 1e-9, 1e-9, True),
           ("y1", 1, [], 1e-9, 1e-9, True), ("y2", 2, [], 1e-9, 1e-9, True),
           ("y3", 3, [], 1e-9, 1e-9, True)]


def _arrays():
    return two_device_net(OPS, TENSORS)


def _brute_force(arr) -> np.ndarray:
    return brute_force_best(arr)


def test_flips_are_counted_against_the_optimum_of_each_draw():
    arr = _arrays()
    plan = _brute_force(arr)
    assert plan.tolist() == [1, 0, 0, 0]
    seen = []

    def solve(perturbed):
        seen.append(perturbed.op_s.copy())
        return _brute_force(perturbed)
    spreads = np.array([[0.05, 0.05], [0.2, 0.2], [0.05, 0.05], [0.3, 0.3]])
    result = stability.check(arr, solve, plan, spreads, draws=200, seed=3, budget_s=60)
    assert result.draws == len(seen) == 200
    optima = np.array([_brute_force(_with(arr, op_s)) for op_s in seen])
    assert result.flips.tolist() == (optima != plan).sum(axis=0).tolist()
    assert result.flips[0] == result.flips[2] == result.flips[3] == 0     # far apart, or pinned
    assert 40 < result.flips[1] < 160                                     # a toss-up flips often
    assert result.moves_to[1] == "cuda:0" and result.moves_to[0] is None
    assert result.flipped_draws == int((optima != plan).any(axis=1).sum())
    assert result.summary() == (f"placement stable under measured noise: 1 of 4 ops flip in "
                                f"{result.flipped_draws} of 200 draws")


def test_costs_move_log_normally_with_the_measured_spread():
    arr = _arrays()
    seen = []
    spreads = np.array([[0.1, 0.0], [0.4, 0.4], [0.0, 0.0], [0.0, 0.0]])
    stability.check(arr, lambda a: seen.append(a.op_s[:, 0] / arr.op_s[:, 0]) or _brute_force(a),
                    _brute_force(arr), spreads, draws=400, seed=0, budget_s=60)
    logs = np.log(np.array(seen))
    sigma = np.log1p(spreads[:, 0]) / 1.349
    assert np.std(logs[:, 0]) == pytest.approx(sigma[0], rel=0.1)
    assert np.std(logs[:, 1]) == pytest.approx(sigma[1], rel=0.1)
    assert np.all(logs[:, 2] == 0) and np.all(np.abs(logs) <= 3 * sigma + 1e-12)
    # the interquartile range of the factors is the measured spread, to first order
    q1, q3 = np.percentile(np.exp(logs[:, 0]), [25, 75])
    assert q3 - q1 == pytest.approx(0.1, rel=0.2)


def test_no_measured_spread_means_no_draws_and_a_budget_bounds_them():
    arr = _arrays()
    plan = _brute_force(arr)
    calls = []
    none = stability.check(arr, lambda a: calls.append(1) or plan, plan, np.zeros((4, 2)), draws=8)
    assert none.draws == 0 and not calls and none.flipping_ops == 0
    assert none.summary() == ("placement stability not checked: no op cost has a measured spread "
                              "(kernel-model, datasheet or roofline estimates only)")
    one = stability.check(arr, _brute_force, plan, np.full((4, 2), 0.1), draws=8, budget_s=0.0)
    assert one.draws == 1                                    # the budget was spent after the first
    with pytest.raises(ValueError, match="shape"):
        stability.check(arr, _brute_force, plan, np.zeros((3, 2)))


def test_the_min_cut_resolve_agrees_with_brute_force():
    arr = _arrays()

    def mincut(a):
        return partition(a, "mincut").placement
    spreads = np.full((4, 2), 0.2)
    by_cut = stability.check(arr, mincut, mincut(arr), spreads, draws=30, seed=5, budget_s=60)
    by_force = stability.check(arr, _brute_force, _brute_force(arr), spreads, draws=30, seed=5, budget_s=60)
    assert by_cut.flips.tolist() == by_force.flips.tolist()


def test_plan_json_carries_the_summary_and_a_flag_per_op():
    arr = _arrays()
    result = stability.check(arr, _brute_force, _brute_force(arr), np.full((4, 2), 0.2), draws=20, seed=1)
    doc = {"ops": [{"index": i} for i in range(4)]}
    stability.add_to_plan_json(doc, result)
    assert doc["stability"]["draws"] == 20 and doc["stability"]["summary"] == result.summary()
    assert doc["ops"][1]["stability"] == {"flips": int(result.flips[1]), "draws": 20, "moves_to": "cuda:0"}
    assert doc["ops"][0]["stability"]["flips"] == 0 and doc["ops"][0]["stability"]["moves_to"] is None


def _with(arr, op_s):
    from dataclasses import replace
    return replace(arr, op_s=op_s)


def test_three_devices_flips_name_the_device_moved_to():
    """The host and two GPUs: op 0 is a toss-up between the GPUs, op 1 is clearly cuda:1;
    every flip is counted against the brute-force optimum of the costs of its draw."""
    arr = hand_arrays([(1.0, 0.2, 0.202), (1.0, 0.5, 0.1)],
                      [("x", -1, [0, 1], (1e-9, 1e-9, 1e-9)), ("y0", 0, [], (1e-9,) * 3, True),
                       ("y1", 1, [], (1e-9,) * 3, True)])
    plan = brute_force_best(arr)
    assert plan.tolist() == [1, 2]
    seen = []

    def solve(perturbed):
        seen.append(perturbed.op_s.copy())
        return brute_force_best(perturbed)
    result = stability.check(arr, solve, plan, np.full((2, 3), 0.1), draws=60, seed=2, budget_s=60)
    optima = np.array([brute_force_best(_with(arr, op_s)) for op_s in seen])
    assert result.flips.tolist() == (optima != plan).sum(axis=0).tolist()
    assert 5 < result.flips[0] < 55 and result.flips[1] == 0
    assert result.moves_to == ["cuda:1", None] and result.devices == ("cpu", "cuda:0", "cuda:1")
