"""Sharding plans against the exact MILP on random small table sets (<= 12 tables, <= 4 GPUs).

Each case: a DLRM-shaped train net (placer.examples.dlrm) with 3-12 tables (rows
log-uniform in 1e3..3e6, width 16-128, 1-3 lookups per sample), on 2-4 GPUs of one kind
(V100 SXM2, A100 SXM4 or T4) joined by NVLink 2, peer-to-peer PCIe or staged copies, at a
global batch of 1024-16384, with GPU memory for all tables, 60% or 30% of them (and the
dense part). For the largest degree the script times:

- heuristic: what ``plan_sharding`` runs before its MILP: TorchRec's greedy and the other
  starts, then local search (``multi_start``);
- planner: the heuristic followed by the MILP within ``--planner-limit`` seconds, cut off
  at the heuristic's step (``plan_sharding``'s default pipeline, one degree);
- exact: the MILP alone with ``--exact-limit`` seconds (cases it does not prove optimal are
  left out of the gaps and counted).

Gap = (plan's step - optimum) / optimum under placer's step model. Prints one line per
case and the median, p90 and worst gaps. Re-run on a quiet host for times.

    python bench/sharding_vs_milp.py --cases 40 --seed 0
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from placer.examples.dlrm import DlrmConfig
from placer.hardware.machine import compose_machine
from placer.sharding.cost import ShardEstimator, ShardSettings
from placer.sharding.net import DlrmTrainNet, train_view
from placer.sharding.search import (Search, balanced_start, milp_assignment, multi_start, table_wise_on_one,
                                              torchrec_greedy, uniform)
from placer.hardware.profiles import load_device_profile

GPUS = ("v100-16gb-sxm2", "a100-40gb-sxm4", "t4-pcie3")
LINKS = ("nvlink2", "pcie-p2p", "staged")


def case(rng) -> tuple[Search, str]:
    host = load_device_profile("host-ci-2core", "cpu")
    gpu = str(rng.choice(GPUS))
    k = int(rng.integers(2, 5))
    link = str(rng.choice(LINKS))
    machine = compose_machine(host, load_device_profile(gpu, "gpu"), k, link)
    n = int(rng.integers(3, 13))
    rows = tuple(int(x) for x in np.exp(rng.uniform(np.log(1e3), np.log(3e6), n)))
    dim = int(rng.choice([16, 32, 64, 128]))
    pooling = int(rng.integers(1, 4))
    cfg = DlrmConfig("bench", rows, dim=dim, bottom=(13, 64, dim), top=(64, 1), batch=64, lookups_per_sample=pooling)
    G = int(rng.choice([1024, 4096, 16384]))
    view = train_view(DlrmTrainNet(cfg).typed_at_batch(G // k), machine)
    tables = sum(t.table.nbytes for t in view.tables)
    share = float(rng.choice([0.0, 0.6, 0.3]))
    mem = (share * tables + view.dense.memory_bytes) / 0.9 if share else None
    est = ShardEstimator(view, machine, tuple(machine.gpus), G, ShardSettings(gpu_mem_bytes=mem))
    what = f"{k}x {gpu} {link}, {n} tables x{dim} p{pooling}, G={G}, memory {'all' if not share else f'{share:.0%}'}"
    return Search(est), what


def heuristic(search: Search, seconds: float):
    starts = [uniform(search, "data_parallel", "hbm"), uniform(search, "table_wise", "host"),
              torchrec_greedy(search), balanced_start(search), uniform(search, "row_wise", "hbm"),
              table_wise_on_one(search)]
    starts += [balanced_start(search, s) for s in search.est.settings.sharding_types]
    return multi_start(search, [s for s in starts if s is not None], seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-time", type=float, default=2.0)
    ap.add_argument("--planner-limit", type=float, default=2.0)
    ap.add_argument("--exact-limit", type=float, default=300.0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    gaps_h, gaps_p, unproven, rows = [], [], 0, []
    for i in range(args.cases):
        search, what = case(rng)
        t0 = time.perf_counter()
        _, h_step = heuristic(search, args.search_time)
        t1 = time.perf_counter()
        planned = milp_assignment(search, h_step, args.planner_limit)
        p_step = min(h_step, planned.step_s or h_step)
        t2 = time.perf_counter()
        exact = milp_assignment(search, None, args.exact_limit)
        t3 = time.perf_counter()
        if not exact.optimal:
            unproven += 1
            print(f"{i:3d} {what}: exact MILP not proven in {args.exact_limit:.0f} s ({exact.status}); left out")
            continue
        gh, gp = (h_step - exact.step_s) / exact.step_s, (p_step - exact.step_s) / exact.step_s
        gaps_h.append(gh)
        gaps_p.append(gp)
        print(f"{i:3d} {what}: optimum {exact.step_s * 1e3:.4f} ms ({t3 - t2:.2f} s); heuristic {gh:+.3%} "
              f"({t1 - t0:.2f} s); planner {gp:+.3%} ({t2 - t0:.2f} s)")
    for name, gaps in (("heuristic", gaps_h), ("planner", gaps_p)):
        if gaps:
            q = np.percentile(gaps, [50, 90, 100])
            print(f"{name}: {len(gaps)} cases, gap median {q[0]:.3%}, p90 {q[1]:.3%}, worst {q[2]:.3%}, "
                  f"exact in {sum(g <= 1e-9 for g in gaps)}")
    print(f"exact MILP unproven: {unproven}; mean gap heuristic {statistics.mean(gaps_h) if gaps_h else 0:.3%}")


if __name__ == "__main__":
    main()
