"""Plan time and peak memory on synthetic layered DAG nets of 1k to 1M ops.

Each case runs in a fresh process so that its peak RSS (getrusage ru_maxrss) is its own.
Modes, on the host + one GPU: "serial" (exact min-cut, Plan with copies and reasons),
"memory" (GPU capacity at half of what the unconstrained optimum uses; Lagrangian +
repair + moves, MILP off), "graph" (build the networkx cost graph from the cost tables
``placer.costs.model`` writes, ``synthetic.to_net_costs``, then its arrays, then plan from them).
Targets (issue): 100k ops under 5 s, 1M ops under 60 s.

    python bench/plan_scale.py              # every mode, 1k..1M (the 1M graph needs ~4 GB)
    python bench/plan_scale.py 1000 10000   # chosen sizes
    python bench/plan_scale.py --makespan   # makespan on the host + 4 GPUs, 1k..100k ops
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
    import numpy as np

    from placer.partition import partition
    from placer.partition.mincut import mincut_placement
    from placer.partition.problem import from_graph, memory_use
    from placer.partition.synthetic import random_arrays, to_net_costs
    t0 = time.perf_counter()
    arr = random_arrays(n, seed=n)
    out = {"n_ops": n, "mode": mode, "tensors": arr.n_tensors, "gen_s": time.perf_counter() - t0}
    if mode == "graph":
        from placer.costs.graph import build_cost_graph
        costs = to_net_costs(arr)
        t0 = time.perf_counter()
        g = build_cost_graph(costs, arr.allowed, arr.pin_reason)
        out["graph_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = partition(from_graph(g))
    elif mode == "memory":
        cap = 0.5 * memory_use(arr, mincut_placement(arr))[1]
        arr.capacity = np.array([np.inf, cap])
        t0 = time.perf_counter()
        plan = partition(arr, time_limit=0)
        out["fits"] = bool(plan.gpu_memory_bytes <= cap)
    else:
        t0 = time.perf_counter()
        plan = partition(arr)
    out["plan_s"] = time.perf_counter() - t0
    out["total_s"] = plan.total_s
    out["gpu_ops"] = int(sum(plan.device_kinds[d] == "gpu" for d in plan.placement.tolist()))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(sizes: list[int]) -> None:
    print(f"{'ops':>9} {'mode':>7} {'plan s':>8} {'graph s':>8} {'peak MB':>8}  note")
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
            print(f"{n:>9} {mode:>7} {d['plan_s']:>8.2f} {graph:>8} {d['peak_rss_mb']:>8.0f}  {note}",
                  flush=True)


def one_makespan(n: int, gpus: int = 4) -> dict:
    """Makespan mode: the serial plan (alpha-expansion) on the host + ``gpus`` GPUs, then
    the makespan search from it (HEFT, list scheduling in net order, 2 s of local search),
    then the rest of a makespan Plan (per-op reasons, the recorded timeline). Columns:
    times in s (busy hosts inflate them), makespans in ms, gain = 1 - plan / serial."""
    from placer.partition.expansion import expansion_placement
    from placer.partition.explain import make_plan
    from placer.partition.schedule import MakespanPartitioner, Simulator, heft_placement, list_schedule
    from placer.partition.synthetic import random_arrays
    arr = random_arrays(n, seed=n, gpus=gpus)
    t0 = time.perf_counter()
    serial = expansion_placement(arr)[0]
    out = {"n_ops": n, "gpus": gpus, "serial_plan_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    sim = Simulator(arr)
    out["serial_makespan_s"] = sim.score(serial)
    out["sim_run_s"] = time.perf_counter() - t0
    out["heft_makespan_s"] = sim.score(heft_placement(arr, sim))
    out["list_makespan_s"] = sim.score(list_schedule(arr, range(n), sim))
    t0 = time.perf_counter()
    x, out["makespan_s"], note = MakespanPartitioner(start=serial).search(arr, sim)
    out["search_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()     # what partition() adds: the Plan (reasons) and the timeline
    make_plan(arr, x, "makespan", objective="makespan", notes=[note])
    sim.run(x, record=True)
    out["plan_and_timeline_s"] = time.perf_counter() - t0
    out["gain_pct"] = 100 * (1 - out["makespan_s"] / out["serial_makespan_s"])
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main_makespan(sizes: list[int]) -> None:
    print(f"{'ops':>9} {'serial s':>9} {'sim run s':>9} {'search s':>8} {'plan+tl s':>9} {'serial ms':>10} "
          f"{'HEFT ms':>9} {'list ms':>9} {'plan ms':>9} {'gain':>6} {'peak MB':>8}")
    for n in sizes:
        r = subprocess.run([sys.executable, __file__, "--one-makespan", str(n)], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode:
            print(f"{n:>9}  failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        d = json.loads(r.stdout)
        print(f"{n:>9} {d['serial_plan_s']:>9.2f} {d['sim_run_s']:>9.3f} {d['search_s']:>8.2f} "
              f"{d['plan_and_timeline_s']:>9.2f} "
              f"{1e3 * d['serial_makespan_s']:>10.2f} {1e3 * d['heft_makespan_s']:>9.2f} "
              f"{1e3 * d['list_makespan_s']:>9.2f} "
              f"{1e3 * d['makespan_s']:>9.2f} {d['gain_pct']:>5.1f}% {d['peak_rss_mb']:>8.0f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        sys.path.insert(0, str(ROOT))
        print(json.dumps(one(int(sys.argv[2]), sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--one-makespan":
        sys.path.insert(0, str(ROOT))
        print(json.dumps(one_makespan(int(sys.argv[2]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--makespan":
        main_makespan([int(a) for a in sys.argv[2:]] or [1_000, 10_000, 100_000])
    else:
        main([int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000, 1_000_000])
