"""Exactness of the partitioners on the host + one GPU, printed as figures (several GPUs:
bench/expansion_vs_milp.py).

1. min-cut vs brute-force enumeration on 1,000 random nets of 1-16 ops (random costs,
   random pins to the GPU and colocation): largest relative difference (target 1e-9).
2. min-cut vs the MILP optimum without a memory limit on random nets up to 2,000 ops.
3. memory-limited: the Lagrangian + repair + moves heuristic (MILP off) vs the MILP
   optimum, over random nets of 40-250 ops and GPU limits between the pinned floor and the
   unconstrained use: median and worst gap (targets: under 1% and under 5%).
4. makespan plan vs the min-cut placement's simulated makespan (never worse).

    python bench/plan_exactness.py [memory_cases]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from partition_cases import brute_force_costs  # noqa: E402
from placer.partition import check_plan  # noqa: E402
from placer.partition.memory import MemoryPartitioner  # noqa: E402
from placer.partition.milp import milp_partition  # noqa: E402
from placer.partition.mincut import MinCutPartitioner, mincut_placement  # noqa: E402
from placer.partition.problem import memory_use, serial_cost  # noqa: E402
from placer.partition.synthetic import random_arrays, random_small  # noqa: E402

CPU, GPU = 0, 1   # device indices of the host and the GPU in the synthetic arrays


def brute_force(cases: int = 1000) -> None:
    rng = np.random.default_rng(1000)
    worst, solved, t0 = 0.0, 0, time.perf_counter()
    while solved < cases:
        arr = random_small(int(rng.integers(1, 17)), rng)
        free = arr.allowed.all(axis=1)
        arr.allowed[free & (rng.random(arr.n_ops) < 0.05), CPU] = False   # pinned to the GPU
        if arr.n_ops > 1 and rng.random() < 0.3:
            pairs = rng.integers(0, arr.n_ops, (2, 2))
            arr.colocate = pairs[pairs[:, 0] != pairs[:, 1]].astype(np.int64)
        best = brute_force_costs(arr).min()
        if not np.isfinite(best):
            continue
        plan = MinCutPartitioner().partition(arr)
        check_plan(arr, plan)
        worst = max(worst, abs(plan.total_s - best) / best)
        solved += 1
    print(f"brute force: {solved} nets of 1-16 ops (with pins, colocation), largest relative difference {worst:.2e} "
          f"({time.perf_counter() - t0:.1f} s)")


def versus_milp(sizes=(100, 300, 1000, 2000)) -> None:
    for n in sizes:
        for seed in range(3):
            arr = random_arrays(n, seed=seed, tensor_bytes=3e6)
            t0 = time.perf_counter()
            x = mincut_placement(arr)
            t_cut = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = milp_partition(arr, time_limit=120)
            t_milp = time.perf_counter() - t0
            cut = serial_cost(arr, x).total_s
            print(f"MILP vs min-cut, {n} ops seed {seed}: min-cut {cut:.9g} s, MILP "
                  f"{res['objective']:.9g} s ({'optimal' if res['optimal'] else 'not proven'}), "
                  f"rel diff {abs(cut - res['objective']) / res['objective']:.1e}; "
                  f"min-cut {t_cut * 1e3:.0f} ms, MILP {t_milp * 1e3:.0f} ms")


def memory_gaps(cases: int = 100) -> None:
    gaps, t_h, t_m, unproven = [], 0.0, 0.0, 0
    for k in range(cases):
        rng = np.random.default_rng(k)
        arr = random_arrays(int(rng.integers(40, 250)), seed=100 + k,
                            tensor_bytes=float(rng.choice([5e5, 2e6, 8e6])))
        free = memory_use(arr, mincut_placement(arr))[GPU]
        floor = memory_use(arr, np.where(arr.forced == GPU, GPU, CPU))[GPU]
        cap = floor + (free - floor) * rng.uniform(0.2, 0.9)
        arr.capacity = np.array([np.inf, cap])
        t0 = time.perf_counter()
        heur = MemoryPartitioner(milp_time_limit=0).partition(arr)
        t_h += time.perf_counter() - t0
        check_plan(arr, heur)
        t0 = time.perf_counter()
        res = milp_partition(arr, time_limit=60)
        t_m += time.perf_counter() - t0
        if not res["optimal"]:
            unproven += 1
            continue
        gaps.append(heur.total_s / res["objective"] - 1)
    g = np.array(gaps)
    print(f"memory limit, {len(g)} nets of 40-250 ops with a proven MILP optimum "
          f"({unproven} unproven in 60 s): heuristic gap median {100 * np.median(g):.3f}%, "
          f"90th pct {100 * np.quantile(g, 0.9):.3f}%, worst {100 * g.max():.3f}%; "
          f"time heuristic {t_h / cases:.2f} s/net, MILP {t_m / cases:.2f} s/net")


def makespan(cases: int = 20) -> None:
    from placer.partition.schedule import MakespanPartitioner, Simulator
    gains = []
    for seed in range(cases):
        arr = random_arrays(int(np.random.default_rng(seed).integers(50, 300)), seed=seed,
                            tensor_bytes=2e6)
        base = Simulator(arr).score(mincut_placement(arr))
        plan = MakespanPartitioner(time_s=1.0).partition(arr)
        check_plan(arr, plan)
        assert plan.makespan_s <= base * (1 + 1e-12)
        gains.append(1 - plan.makespan_s / base)
    g = np.array(gains)
    print(f"makespan, {cases} nets of 50-300 ops: never worse than the min-cut placement; "
          f"makespan shorter by median {100 * np.median(g):.1f}%, best {100 * g.max():.1f}%")


if __name__ == "__main__":
    brute_force()
    versus_milp()
    memory_gaps(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
    makespan()
