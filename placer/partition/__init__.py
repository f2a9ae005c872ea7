"""Partitioners: a cost graph (``placer.graph``) in, a ``Plan`` out.

``partition(graph, method="mincut", **options)`` picks one by name:
- "mincut" (default): exact optimum of the serial objective; with ``capacity_bytes``
  it becomes the memory-limited search (Lagrangian min-cut + repair + local moves, then
  the MILP for the optimum or a gap, within ``time_limit`` seconds);
- "milp": the MILP alone (exact when it finishes in ``time_limit``);
- "makespan": overlap-aware placement (event simulator, HEFT, local search), within
  ``capacity_bytes`` when given;
- "greedy", "all_cpu", "all_gpu": the baselines.
``capacity_bytes`` is the GPU memory before the reserve; ``reserve`` (default 0.1) is the
fraction kept free, so plans must fit ``capacity_bytes * (1 - reserve)``.
Every plan can be checked with ``check.check_plan``.
"""
from __future__ import annotations

from placer.errors import InfeasiblePlanError, PlacerError
from placer.partition import baselines
from placer.partition.check import check_plan
from placer.partition.explain import make_plan
from placer.partition.memory import MemoryPartitioner
from placer.partition.milp import milp_partition
from placer.partition.mincut import MinCutPartitioner
from placer.partition.problem import from_graph
from placer.partition.schedule import MakespanPartitioner, Simulator

METHODS = ("mincut", "milp", "makespan", "greedy", "all_cpu", "all_gpu")
MILP_TIME_LIMIT, MILP_INFEASIBLE = 1, 2  # scipy.optimize.milp status codes


def partition(graph, method: str = "mincut", capacity_bytes: float | None = None,
              reserve: float = 0.1, time_limit: float = 10.0, **options):
    """The plan of ``graph`` by ``method`` (module docstring)."""
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}")
    if not 0 <= reserve < 1:
        raise ValueError(f"reserve must be in [0, 1), not {reserve}")
    usable = None if capacity_bytes is None else float(capacity_bytes) * (1 - reserve)
    arr = from_graph(graph)
    if method == "mincut":
        if usable is None:
            return MinCutPartitioner().partition(arr)
        return MemoryPartitioner(usable, milp_time_limit=time_limit, **options).partition(arr)
    if method == "milp":
        return _milp_plan(arr, usable, time_limit)
    if method == "makespan":
        return MakespanPartitioner(capacity_bytes=usable, **options).partition(arr)
    return getattr(baselines, method)(arr)


def _milp_plan(arr, usable, time_limit):
    from placer.partition.memory import check_pinned_fit
    if usable is not None:
        check_pinned_fit(arr, usable)
    res = milp_partition(arr, usable, time_limit, max_vars=10**9)
    if res["x"] is None:
        raise _no_milp_placement(res, time_limit)
    plan = make_plan(arr, res["x"], "milp", optimal=res["optimal"], capacity=usable,
                     notes=[res["note"]])
    if res["bound"] is not None and plan.total_s > 0:
        plan.gap = max(0.0, (plan.total_s - res["bound"]) / plan.total_s)
    return plan


def _no_milp_placement(res: dict, time_limit: float) -> PlacerError:
    """Why the MILP returned no placement, as the error the user can act on."""
    if res["status"] == MILP_INFEASIBLE:
        return InfeasiblePlanError(f"no placement satisfies the pins and the GPU memory limit: {res['note']}",
                                   hint="unpin some ops, raise --gpu-mem or lower --gpu-reserve")
    if res["status"] == MILP_TIME_LIMIT:
        return PlacerError(f"the MILP found no placement within its {time_limit:g} s time limit: {res['note']}",
                           hint="raise --time-limit, or use --method mincut")
    return PlacerError(f"the MILP found no placement: {res['note']}", hint="use --method mincut")


__all__ = ["partition", "check_plan", "baselines", "MinCutPartitioner", "MemoryPartitioner",
           "MakespanPartitioner", "Simulator", "METHODS"]
