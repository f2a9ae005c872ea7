"""Wires the stages: typed net -> costs -> cost graph -> partition -> check -> baselines.

``plan(typed_net, cpu_profile, gpu_profile, options)`` reads top to bottom; each stage is
one call into the module that names it. What ``plan`` returns carries everything the
command line, the JSON, the placed net and the report need. Every helper here makes one
pass over the ops (indexes built once), so planning stays linear in the size of the net.
"""
from __future__ import annotations

import fnmatch
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from placer.costs import NetCosts, annotate, gpu_memory_bytes
from placer.errors import InfeasiblePlanError, PlacerError
from placer.ops import registry
from placer.graph import build_cost_graph, cost_arrays
from placer.partition import baselines, check_plan, partition
from placer.partition.schedule import Simulator
from placer.shapes import require_complete
from placer.types import Net, Plan, TypedNet
from placer.units import fmt_bytes


MEMORY_BLIND = ("greedy",)  # methods that place without looking at GPU memory


@dataclass(frozen=True)
class PlanOptions:
    method: str = "mincut"
    gpu_mem_bytes: float | None = None     # None: the GPU profile's memory capacity
    reserve: float = 0.1                   # fraction of GPU memory kept free
    pins: tuple[str, ...] = ()             # "GLOB=cpu|gpu" on op names, output blobs, op types
    keep_existing: bool = False            # pin every op that already has a device_option
    outputs_on_host: bool = True           # external outputs come back to the host (D2H)
    time_limit_s: float = 10.0             # MILP / local-search time limit
    unknown_op_cost_s: float = 0.0         # CPU time charged to an op type with no entry


@dataclass
class PlanResult:
    typed: TypedNet
    costs: NetCosts
    arrays: Any  # the cost graph as the partitioners' CostArrays
    plan: Plan
    baselines: dict
    capacity_bytes: float
    usable_bytes: float
    makespan: dict = field(default_factory=dict)  # simulated overlap of the chosen plan
    options: PlanOptions = field(default_factory=PlanOptions)  # what was asked for
    graph_args: dict = field(default_factory=dict)  # pins, colocation, outputs_on_host

    @cached_property
    def graph(self):
        """The networkx cost graph of the plan (``placer.graph``), built on first use: the
        planner itself works on ``arrays``."""
        return build_cost_graph(self.costs, **self.graph_args)


def plan(typed: TypedNet, cpu_profile, gpu_profile, options: PlanOptions = PlanOptions(),
         clock=lambda stage: nullcontext()) -> PlanResult:
    """The plan of ``typed``; ``clock(stage)`` is entered around each stage (the command's
    ``--timings`` passes a ``StageClock``)."""
    net = require_complete(typed).net   # an op of unknown shape would be priced at zero
    if not net.ops:
        raise PlacerError(f"{net.path or net.name or 'the net'}: the net has no ops; there is nothing to place")
    with clock("costs"):  # 1. price every op and tensor on both devices
        costs = annotate(typed, cpu_profile, gpu_profile, unknown_op_cost_s=options.unknown_op_cost_s)
    with clock("graph"):  # 2. the cost graph with pins and colocation, as arrays for every stage below
        graph_args = dict(pins=resolve_pins(net, options.pins, options.keep_existing),
                          colocate=parameter_groups(net), inplace=inplace_pairs(net),
                          outputs_on_host=options.outputs_on_host)
        arrays = cost_arrays(costs, **graph_args)
    # 3. partition within GPU memory, and check the result from scratch
    capacity = float(gpu_memory_bytes(gpu_profile) if options.gpu_mem_bytes is None else options.gpu_mem_bytes)
    usable = capacity * (1 - options.reserve)
    with clock("partition"):
        chosen = partition(arrays, options.method, capacity_bytes=capacity, reserve=options.reserve,
                           time_limit=options.time_limit_s)
    _refuse_memory_blind(chosen, options, capacity, usable)
    with clock("check"):
        check_plan(arrays, chosen, usable)
    with clock("baselines"):  # 4. baselines beside it, and the overlapped schedule of the chosen plan
        base = baselines.baselines(arrays, existing_placement(net))
    with clock("makespan"):
        makespan = overlapped(arrays, chosen, base)
    return PlanResult(typed, costs, arrays, chosen, base, capacity, usable,
                      makespan=makespan, options=options, graph_args=graph_args)


def overlapped(graph, chosen: Plan, base: dict) -> dict:
    """The simulated overlapped schedule of the chosen plan; under the makespan objective,
    the baselines' makespans too, so that they are judged by the same measure."""
    sim = Simulator(graph)
    n = sim.arr.n_ops
    makespan_s, events = sim.run(_on_gpu(chosen, n), record=True)
    out = {"makespan_s": makespan_s, "events": events}
    if chosen.objective == "makespan":
        out["baselines"] = {name: sim.run(_on_gpu(b, n))[0] for name, b in base.items() if name != "lower_bound"}
    return out


def _refuse_memory_blind(chosen: Plan, options: PlanOptions, capacity: float, usable: float) -> None:
    """A method that ignores GPU memory may pick a placement that does not fit: say so."""
    if options.method in MEMORY_BLIND and chosen.gpu_memory_bytes > usable:
        raise InfeasiblePlanError(
            f"the {options.method} placement needs {fmt_bytes(chosen.gpu_memory_bytes)} of GPU memory; "
            f"{fmt_bytes(usable)} usable ({fmt_bytes(capacity)} less the {options.reserve:.0%} reserve)",
            hint="--method mincut places within the limit; or raise --gpu-mem")


def resolve_pins(net: Net, specs, keep_existing: bool) -> dict[int, str]:
    """``--pin GLOB=cpu|gpu`` matched against op names, output blob names and op types."""
    pins: dict[int, str] = {}
    if keep_existing:
        pins.update({op.index: op.device.kind for op in net.ops if op.device is not None})
        for op in net.ops:
            opdef = registry.get(op.type)
            if pins.get(op.index) == "gpu" and (opdef is None or "gpu" not in opdef.devices):
                raise InfeasiblePlanError(
                    f"--keep-existing: op {op.label} has a GPU device_option in the file, but placer "
                    f"has no GPU kernel for {op.type}",
                    hint="drop --keep-existing, or give that op a CPU device_option")
    for spec in specs:
        pattern, eq, device = spec.rpartition("=")
        if not eq or not pattern or device not in ("cpu", "gpu"):
            raise PlacerError(f"--pin '{spec}': expected GLOB=cpu or GLOB=gpu, e.g. --pin 'emb:::*=cpu'")
        hits = [op.index for op in net.ops
                if any(fnmatch.fnmatchcase(s, pattern) for s in (op.name, op.type, *op.outputs) if s)]
        if not hits:
            raise PlacerError(f"--pin '{spec}': no op name, op type or output blob matches '{pattern}'")
        pins.update((i, device) for i in hits)
    return pins


def inplace_pairs(net: Net) -> list[tuple[int, int]]:
    """(op, producer of the blob it overwrites) for every in-place op: they share a device."""
    writer: dict[str, int] = {}
    pairs = []
    for op in net.ops:
        for name in set(op.outputs) & set(op.inputs):
            if name in writer:
                pairs.append((op.index, writer[name]))
        for name in op.outputs:
            writer[name] = op.index
    return pairs


def parameter_groups(net: Net) -> list[set[int]]:
    """Ops that update a parameter in place, with every op that reads it (one device).

    One pass over the ops indexes each parameter's writers and readers, so the groups
    cost O(ops + parameters), not O(ops x parameters)."""
    writers: dict[str, set[int]] = {}
    readers: dict[str, set[int]] = {}
    for op in net.ops:
        for name in op.outputs:
            if name in net.params:
                writers.setdefault(name, set()).add(op.index)
        for name in op.inputs:
            if name in net.params:
                readers.setdefault(name, set()).add(op.index)
    return [writers[p] | readers.get(p, set()) for p in net.params if p in writers]


def existing_placement(net: Net) -> dict | None:
    """The placement the file carries, when any op has a device_option."""
    if all(op.device is None for op in net.ops):
        return None
    return {op.index: ("gpu" if op.device is not None and op.device.is_gpu else "cpu") for op in net.ops}


def _on_gpu(plan_: Plan, n: int):
    import numpy as np
    return np.array([plan_.placement[i].is_gpu for i in range(n)], bool)
