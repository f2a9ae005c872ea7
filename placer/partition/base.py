"""What every partitioner is: ``partition(arr)`` gives the ``Plan`` of a problem, and what
``placer.partition`` chooses one from (``PARTITIONERS``: method name -> factory)."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from placer.costs.arrays import CostArrays
from placer.types import Plan


class Partitioner(Protocol):
    """One algorithm (min-cut, alpha-expansion, the memory-limited search, ...): the plan
    of a problem's cost arrays."""

    def partition(self, arr: CostArrays, /) -> Plan: ...


# the partitioner a method name gives for this problem, its time limit (seconds) and options
PartitionerFactory = Callable[[CostArrays, float, dict[str, Any]], Partitioner]

# ``placer.partition.partition``'s call: the plan of ``arr`` by a method, within a time limit
Chooser = Callable[[CostArrays, str, float], Plan]


__all__ = ["Partitioner", "PartitionerFactory", "Chooser"]
