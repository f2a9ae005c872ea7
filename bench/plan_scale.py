"""Plan time and peak memory on synthetic layered DAG nets of 1k to 1M ops.

Each case runs in a fresh process so that its peak RSS (getrusage ru_maxrss) is its own.
Modes: "serial" (exact min-cut, Plan with copies and reasons), "memory" (GPU capacity at
half of what the unconstrained optimum uses; Lagrangian + repair + moves, MILP off),
"graph" (build the networkx cost graph from NetCosts-shaped tables, then plan from it; and,
for comparison, the same arrays built from the tables in bulk, as the planner does).
bench/plan_cli_scale.py times the whole command line instead.
Targets (issue): 100k ops under 5 s, 1M ops under 60 s.

    python bench/plan_scale.py              # every mode, 1k..1M (the 1M graph needs ~4 GB)
    python bench/plan_scale.py 1000 10000   # chosen sizes
"""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(n: int, mode: str) -> dict:
    from placer.partition import partition
    from placer.partition.memory import usage
    from placer.partition.mincut import mincut_placement
    from placer.partition.synthetic import random_arrays, to_net_costs
    t0 = time.perf_counter()
    arr = random_arrays(n, seed=n)
    out = {"n_ops": n, "mode": mode, "tensors": arr.n_tensors, "gen_s": time.perf_counter() - t0}
    if mode == "graph":
        from placer.graph import build_cost_graph
        costs = to_net_costs(arr)
        t0 = time.perf_counter()
        g = build_cost_graph(costs)
        out["graph_s"] = time.perf_counter() - t0
        from placer.graph import cost_arrays
        t0 = time.perf_counter()
        cost_arrays(costs)
        out["arrays_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = partition(g)
    elif mode == "memory":
        cap = 0.5 * usage(arr, mincut_placement(arr))
        t0 = time.perf_counter()
        plan = partition(arr, capacity_bytes=cap, reserve=0.0, time_limit=0)
        out["fits"] = plan.gpu_memory_bytes <= cap
    else:
        t0 = time.perf_counter()
        plan = partition(arr)
    out["plan_s"] = time.perf_counter() - t0
    out["total_s"] = plan.total_s
    out["gpu_ops"] = sum(d.kind == "gpu" for d in plan.placement.values())
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(sizes: list[int]) -> None:
    print(f"{'ops':>9} {'mode':>7} {'plan s':>8} {'graph s':>8} {'arrays s':>8} {'peak MB':>8}  note")
    for n in sizes:
        for mode in ("serial", "memory", "graph"):
            r = subprocess.run([sys.executable, __file__, "--one", str(n), mode], cwd=ROOT,
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{n:>9} {mode:>7}  failed: {r.stderr.strip().splitlines()[-1]}")
                continue
            d = json.loads(r.stdout)
            note = f"{d['gpu_ops']} ops on GPU" + (f", fits: {d['fits']}" if "fits" in d else "")
            graph = f"{d['graph_s']:.2f}" if "graph_s" in d else "-"
            arrays = f"{d['arrays_s']:.2f}" if "arrays_s" in d else "-"
            print(f"{n:>9} {mode:>7} {d['plan_s']:>8.2f} {graph:>8} {arrays:>8} {d['peak_rss_mb']:>8.0f}  {note}",
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        sys.path.insert(0, str(ROOT))
        print(json.dumps(one(int(sys.argv[2]), sys.argv[3])))
    else:
        main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000, 1_000_000])
