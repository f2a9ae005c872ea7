"""Partitioners: cost arrays over a machine's k devices in, a ``Plan`` out.

``partition(arr, method="auto", **options)`` picks one by name from ``PARTITIONERS`` (each
entry makes a ``base.Partitioner`` for the problem, its time limit and options):
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

from typing import Any

import numpy as np

from placer.partition import baselines
from placer.partition.base import Partitioner, PartitionerFactory
from placer.partition.check import check_plan
from placer.partition.expansion import ExpansionPartitioner
from placer.partition.hosts import HostsFirstPartitioner
from placer.partition.memory import MemoryPartitioner
from placer.partition.milp import MilpPartitioner
from placer.partition.mincut import MinCutPartitioner
from placer.partition.problem import CostArrays
from placer.partition.schedule import MakespanPartitioner
from placer.types import Plan


def _serial(unlimited: PartitionerFactory) -> PartitionerFactory:
    """``unlimited``, or the memory-limited search when any device's capacity is finite."""
    def factory(arr: CostArrays, time_limit: float, options: dict[str, Any]) -> Partitioner:
        if arr.capacity is not None and np.isfinite(arr.capacity).any():
            return MemoryPartitioner(milp_time_limit=time_limit, **options)
        return unlimited(arr, time_limit, options)
    return factory


def _auto(arr: CostArrays, time_limit: float, options: dict[str, Any]) -> Partitioner:
    return PARTITIONERS["mincut" if arr.k == 2 else "expansion"](arr, time_limit, options)


def _baseline(name: str) -> PartitionerFactory:
    return lambda arr, time_limit, options: baselines.BaselinePartitioner(getattr(baselines, name))


# method name -> the partitioner it gives for a problem (module docstring); the order is --help's
PARTITIONERS: dict[str, PartitionerFactory] = {
    "auto": _auto,
    "mincut": _serial(lambda arr, time_limit, options: MinCutPartitioner()),
    "expansion": _serial(lambda arr, time_limit, options: ExpansionPartitioner(**options)),
    "milp": lambda arr, time_limit, options: MilpPartitioner(time_limit),
    "makespan": lambda arr, time_limit, options: MakespanPartitioner(**options),
    **{name: _baseline(name) for name in ("greedy", "all_cpu", "all_gpu", "pipeline", "m_topo", "m_etf")},
    "hosts": lambda arr, time_limit, options: HostsFirstPartitioner.from_device_names(arr, partition, time_limit),
}
METHODS = tuple(PARTITIONERS)


def partition(arr: CostArrays, method: str = "auto", time_limit: float = 10.0, **options: Any) -> Plan:
    """The plan of ``arr`` by ``method`` (module docstring)."""
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    return PARTITIONERS[method](arr, time_limit, options).partition(arr)


__all__ = ["partition", "check_plan", "METHODS", "PARTITIONERS"]
