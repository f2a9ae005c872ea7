"""Partitioners: cost arrays over a machine's k devices in, a ``Plan`` out.

``partition(arr, method="auto", **options)`` picks one by name:
- "auto" (default): "mincut" on a two-device machine (the host and one GPU), else
  "expansion";
- "mincut": the exact optimum of the serial objective over two devices (s-t min-cut);
- "expansion": alpha-expansion over k devices, each move one exact min-cut;
- with per-device memory limits (``arr.capacity`` finite anywhere), both become the
  memory-limited search (``memory``: one Lagrangian price per device over the min-cut or
  alpha-expansion, repair, local moves, then the MILP for the optimum or a gap, within
  ``time_limit`` seconds);
- "milp": the MILP alone (``milp``: exact when it finishes in ``time_limit``);
- "makespan": overlap-aware placement (event simulator, HEFT, local search);
- "hosts": over a cluster's HOST/DEVICE devices, hosts first, then devices (``hosts.py``);
- "greedy", "all_cpu", "all_gpu", "pipeline", "m_topo", "m_etf": baselines
  (``baselines``).
Every plan can be checked with ``check.check_plan``.
"""
from __future__ import annotations

import numpy as np

from placer.partition.check import check_plan

METHODS = ("auto", "mincut", "expansion", "milp", "makespan", "greedy", "all_cpu", "all_gpu",
           "pipeline", "m_topo", "m_etf", "hosts")


def partition(arr, method: str = "auto", time_limit: float = 10.0, **options):
    """The plan of ``arr`` by ``method`` (module docstring)."""
    from placer.partition import baselines
    from placer.partition.expansion import ExpansionPartitioner
    from placer.partition.mincut import MinCutPartitioner
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "auto":
        method = "mincut" if arr.k == 2 else "expansion"
    limited = bool(np.isfinite(arr.capacity).any())
    if method in ("mincut", "expansion"):
        if limited:
            from placer.partition.memory import MemoryPartitioner
            return MemoryPartitioner(milp_time_limit=time_limit, **options).partition(arr)
        if method == "mincut":
            return MinCutPartitioner().partition(arr)
        return ExpansionPartitioner(**options).partition(arr)
    if method == "milp":
        from placer.partition.milp import milp_plan
        return milp_plan(arr, time_limit)
    if method == "hosts":
        from placer.partition.hosts import hosts_first
        return hosts_first(arr, time_limit)
    if method == "makespan":
        from placer.partition.schedule import MakespanPartitioner
        return MakespanPartitioner(**options).partition(arr)
    return getattr(baselines, method)(arr)


__all__ = ["partition", "check_plan", "METHODS"]
