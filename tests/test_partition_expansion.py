"""Alpha-expansion over k devices: every move against brute force, the search against the optimum."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from placer.partition.expansion import (ExpansionPartitioner, MoveNetwork, expansion_placement,
                                        interchangeable, move_energy)
from placer.partition.problem import serial_cost
from placer.partition.synthetic import random_arrays, random_small


def _random_case(rng):
    n = int(rng.integers(2, 8))
    arr = random_small(n, rng, gpus=int(rng.integers(1, 4)), peer=str(rng.choice(["mixed", "nvlink", "staged"])),
                       hetero=bool(rng.random() < 0.5))
    f = np.array([int(rng.choice(np.flatnonzero(arr.feasible[i]))) for i in range(n)])
    return arr, f, int(rng.integers(arr.k))


def _switch_sets(net):
    movable = np.flatnonzero(net.movable)
    for bits in itertools.product([False, True], repeat=len(movable)):
        sw = np.zeros(net.arr.n_ops, bool)
        sw[movable[np.array(bits, bool)]] = True
        yield sw


def test_every_move_minimises_its_energy_which_bounds_the_true_cost():
    """For 250 random moves: the min-cut's switch set is optimal for the move energy
    (brute force over every switch set); that energy equals the true cost at x = 0 and is
    never below it; moves without truncated terms are exact."""
    rng = np.random.default_rng(0)
    exact = truncated = 0
    for _ in range(250):
        arr, f, alpha = _random_case(rng)
        net = MoveNetwork(arr, f, alpha)
        move = net.solve()
        best_energy, best_true = np.inf, np.inf
        for sw in _switch_sets(net):
            energy = move_energy(arr, f, alpha, sw)
            true = serial_cost(arr, np.where(sw, alpha, f)).total_s
            assert energy >= true - 1e-12
            if not sw.any():
                assert energy == pytest.approx(true, rel=1e-12, abs=1e-15)
            best_energy, best_true = min(best_energy, energy), min(best_true, true)
        got = move_energy(arr, f, alpha, move.switch)
        assert got <= best_energy * (1 + 1e-9) + 1e-12
        assert move.energy_s == pytest.approx(got, rel=1e-6, abs=1e-9)
        if net.truncated == 0:
            exact += 1
            assert best_energy == pytest.approx(best_true, rel=1e-12, abs=1e-15)
        else:
            truncated += 1
    assert exact > 100 and truncated > 10   # both kinds were exercised


def test_expansion_finds_the_brute_force_optimum_on_small_nets():
    rng = np.random.default_rng(1)
    gaps = []
    for _ in range(80):
        n = int(rng.integers(2, 8))
        arr = random_small(n, rng, gpus=int(rng.integers(2, 4)), peer=str(rng.choice(["mixed", "staged"])),
                           hetero=bool(rng.random() < 0.5))
        choices = [np.flatnonzero(arr.feasible[i]) for i in range(n)]
        best = min(serial_cost(arr, np.array(c)).total_s for c in itertools.product(*choices))
        dev, _ = expansion_placement(arr)
        assert arr.feasible[np.arange(n), dev].all()
        gaps.append(serial_cost(arr, dev).total_s / best - 1)
    assert max(gaps) < 0.05 and np.median(gaps) < 1e-9


def test_two_devices_expansion_equals_the_exact_min_cut():
    from placer.partition.mincut import MinCutPartitioner
    for seed in range(5):
        arr = random_arrays(400, seed=seed, tensor_bytes=3e6)
        exact = MinCutPartitioner().partition(arr).total_s
        dev, _ = expansion_placement(arr)
        assert serial_cost(arr, dev).total_s == pytest.approx(exact, rel=1e-6)


def test_interchangeable_devices_are_identical_gpus_with_identical_links():
    arr = random_arrays(50, seed=3, gpus=4, peer="nvlink")
    assert interchangeable(arr).tolist() == [0, 1, 1, 1, 1]
    arr = random_arrays(50, seed=3, gpus=4, peer="mixed")   # 1-2 fast, 1-3 staged: not the same
    assert interchangeable(arr).tolist()[1:] == [1, 2, 1, 2]
    arr = random_arrays(50, seed=3, gpus=3, hetero=True)
    assert len(set(interchangeable(arr).tolist())) == 4


def test_expansion_plan_respects_pins_and_reports_its_moves():
    arr = random_arrays(300, seed=5, gpus=3, peer="mixed", no_kernel=0.2)
    plan = ExpansionPartitioner().partition(arr)
    cpu_only = ~arr.allowed[:, 1:].any(axis=1)
    assert (plan.placement[cpu_only] == 0).all()
    assert plan.total_s == pytest.approx(serial_cost(arr, plan.placement).total_s)
    assert "alpha-expansion" in plan.notes[0]
    assert len(plan.devices) == 4 and len(plan.memory_bytes) == 4
