"""Wires the stages: typed net -> costs -> cost graph -> partition -> check -> baselines.

``plan(typed_net, machine, options)`` reads top to bottom; each stage is one call into
the module that names it. What ``plan`` returns carries everything the command line, the
JSON, the placed net and the report need. Every helper here makes one pass over the ops
(indexes built once), so planning stays linear in the size of the net.
"""
from __future__ import annotations

import fnmatch
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from placer.costs.model import NetCosts, annotate
from placer.errors import InfeasiblePlanError, PlacerError
from placer.costs.graph import build_cost_graph, cost_arrays
from placer.hardware.machine import Machine, existing_placement
from placer.partition import baselines, partition
from placer.partition.check import check_plan
from placer.partition.problem import fits, memory_use
from placer.ops import registry
from placer.ops.registry import LIKE_INPUT
from placer.partition.schedule import Simulator
from placer.shapes import require_complete
from placer.training.placement import (
    inplace_pairs as training_inplace_pairs, price_state_reads, state_copy_bytes, state_groups, step_costs)
from placer.types import Net, Plan, TypedNet
from placer.units import fmt_bytes

MEMORY_BLIND = ("greedy",)  # methods that place without looking at memory


@dataclass(frozen=True)
class PlanOptions:
    method: str = "auto"
    gpu_mem_bytes: float | None = None     # per GPU; None: each GPU profile's capacity
    reserve: float = 0.1                   # fraction of GPU memory kept free
    host_mem_bytes: float | None = None    # None: host memory is not limited
    pins: tuple[str, ...] = ()             # "GLOB=cpu|gpu|cuda:N" on op names, output blobs, op types
    keep_existing: bool = False            # pin every op that already has a device_option
    outputs_on_host: bool = True           # external outputs come back to the host
    time_limit_s: float = 10.0             # MILP / local-search time limit
    unknown_op_cost_s: float = 0.0         # CPU time charged to an op type with no entry
    precision: str | None = None           # GPU math (placer.costs.precision); None: the net's dtypes
    placer_kernels: bool = False           # allow GPUs for ops only placer's runtime has GPU kernels for


@dataclass
class PlanResult:
    typed: TypedNet
    costs: NetCosts
    arrays: Any                            # the cost graph as the partitioners' CostArrays
    plan: Plan
    baselines: dict
    machine: Machine
    capacity_bytes: np.ndarray             # per device, before the reserve (inf: no limit)
    usable_bytes: np.ndarray               # per device, what plans must fit
    makespan: dict = field(default_factory=dict)  # simulated overlap of the chosen plan
    options: PlanOptions = field(default_factory=PlanOptions)
    graph_args: dict = field(default_factory=dict)  # restrictions, colocation, capacity (``graph_arguments``)
    step: Any = None                       # the NetCosts of one step (``step_arrays``); None: ``costs``
    state_reads: Any = None                # the state-copy rows priced into ``arrays``

    @cached_property
    def graph(self):
        """The networkx cost graph of the plan (``placer.costs.graph``), built on first use: the
        planner itself works on ``arrays``, which equal this graph's array form."""
        graph = build_cost_graph(self.step if self.step is not None else self.costs, **self.graph_args)
        if self.state_reads is not None:
            price_state_reads(graph.graph["class_s"], self.machine, self.state_reads)
        return graph


def plan(typed: TypedNet, machine: Machine, options: PlanOptions = PlanOptions(),
         clock=lambda stage: nullcontext()) -> PlanResult:
    """The plan of ``typed`` on ``machine``; ``clock(stage)`` is entered around each stage
    (``placer plan --timings`` passes a ``StageClock``)."""
    net = require_complete(typed).net   # an op of unknown shape would be priced at zero
    if not net.ops:
        raise PlacerError(f"{net.path or net.name or 'the net'}: the net has no ops; there is nothing to place")
    refuse_collectives(net)
    with clock("costs"):  # 1. price every op on every device
        costs = annotate(typed, machine, unknown_op_cost_s=options.unknown_op_cost_s,
                         precision=options.precision)
    with clock("graph"):  # 2. the cost graph with restrictions, colocation and memory limits, as arrays
        capacity, usable = memory_limits(machine, options)
        arrays, graph_args, step, state_reads = step_arrays(typed, costs, machine, options, usable)
    with clock("partition"):  # 3. partition within memory, and check the result from scratch
        chosen = partition(arrays, options.method, time_limit=options.time_limit_s)
    _refuse_memory_blind(arrays, chosen, options)
    with clock("check"):
        check_plan(arrays, chosen)
    with clock("baselines"):  # 4. baselines beside it, and the overlapped schedule of the chosen plan
        base = baselines.baselines(arrays, existing_placement(net, machine))
        state_copy_bytes(state_reads, arrays.t_names, chosen, *base.values())
    with clock("makespan"):
        makespan = overlapped(arrays, chosen, base)
    return PlanResult(typed, costs, arrays, chosen, base, machine, capacity, usable, makespan=makespan,
                      options=options, graph_args=graph_args, step=step, state_reads=state_reads)


def refuse_collectives(net: Net) -> None:
    """A net that already runs over several devices through collectives (NCCLAllreduce,
    Gloo's Allreduce, AllToAll, ...: ops that write each output where its input is) is
    not one this planner places: it prices an op on one device and copies its inputs
    there. Say so in one line, with what to use instead."""
    found: dict[str, int] = {}
    for op in net.ops:
        opdef = registry.get(op.type)
        if opdef is not None and opdef.transfer is not None and opdef.transfer.writes == LIKE_INPUT:
            found[op.type] = found.get(op.type, 0) + 1
    if found:
        kinds = ", ".join(f"{n} {t}" for t, n in found.items())
        raise PlacerError(f"{net.path or net.name or 'the net'}: runs over several devices through "
                          f"collectives ({kinds}); placer plan takes a one-device net",
                          hint="placer shard plans it from the one-device train net; "
                               "placer run --emulate-gpus N runs it as it is")


def graph_arguments(net: Net, costs: NetCosts, machine: Machine, options: PlanOptions, usable) -> dict:
    """The keyword arguments of ``build_cost_graph`` / ``cost_arrays`` for a plan: allowed
    devices and why, colocation groups, in-place pairs, outputs, usable memory."""
    allowed, why = allowed_devices(net, costs, machine, options.pins, options.keep_existing,
                                   placer_kernels=options.placer_kernels)
    return dict(allowed=allowed, pin_reason=why, colocate=parameter_groups(net), inplace=inplace_pairs(net),
                outputs_on_host=options.outputs_on_host, capacity=usable)


def step_arrays(typed: TypedNet, costs: NetCosts, machine: Machine, options: PlanOptions, usable):
    """The cost arrays of one run (on a train net, one step) with its restrictions,
    colocation and memory limits: in-place outputs nobody reads add no memory, state read
    away from its device is copied every step (``placer.training.placement``, rules 2 and
    6). Returns (arrays, the graph arguments, the step's costs, the state-copy rows)."""
    step, state_reads = step_costs(typed, costs)
    graph_args = graph_arguments(typed.net, costs, machine, options, usable)
    arrays = cost_arrays(step, **graph_args)
    price_state_reads(arrays.class_s, machine, state_reads)
    return arrays, graph_args, step, state_reads


def overlapped(arrays, chosen: Plan, base: dict) -> dict:
    """The simulated overlapped schedule of the chosen plan; under the makespan objective,
    the baselines' makespans too, so that they are judged by the same measure."""
    sim = Simulator(arrays)
    makespan_s, events = sim.run(chosen.placement, record=True)
    out = {"makespan_s": makespan_s, "events": events}
    if chosen.objective == "makespan":
        out["baselines"] = {name: sim.run(b.placement)[0] for name, b in base.items() if name != "lower_bound"}
    return out


def memory_limits(machine: Machine, options: PlanOptions) -> tuple[np.ndarray, np.ndarray]:
    """(capacity, usable) bytes per device: GPUs from their profiles (or ``gpu_mem_bytes``)
    less the reserve; the host unlimited unless ``host_mem_bytes`` is given."""
    capacity = np.full(machine.k, np.inf)
    for i, dev in enumerate(machine.devices):
        if dev.is_gpu:
            capacity[i] = float(dev.profile.memory_capacity_bytes if options.gpu_mem_bytes is None
                                else options.gpu_mem_bytes)
        elif options.host_mem_bytes is not None:
            capacity[i] = float(options.host_mem_bytes)
    usable = capacity.copy()
    gpus = [d.is_gpu for d in machine.devices]
    usable[gpus] = capacity[gpus] * (1 - options.reserve)
    return capacity, usable


def _refuse_memory_blind(arrays, chosen: Plan, options: PlanOptions) -> None:
    """A method that ignores memory may pick a placement that does not fit: say so."""
    if options.method in MEMORY_BLIND and not fits(arrays, chosen.placement):
        use = memory_use(arrays, chosen.placement)
        over = int(np.argmax(use - arrays.capacity))
        raise InfeasiblePlanError(
            f"the {options.method} placement needs {fmt_bytes(use[over])} on {arrays.devices[over]}; "
            f"{fmt_bytes(arrays.capacity[over])} usable",
            hint="the default method places within the limits; or raise --gpu-mem")


def placer_only_gpu_types(types) -> set[str]:
    """Of ``types``, the op types placer has a GPU kernel for and real Caffe2 has not."""
    return {t for t in types if (o := registry.get(t)) is not None
            and "gpu" in o.devices and "gpu" not in o.caffe2_kinds() and o.caffe2_kinds()}


def placer_only_types(types) -> set[str]:
    """Of ``types``, the op types real Caffe2 has no kernel for on any device (placer's
    bfloat16 casts): a net holding one runs in placer only, wherever its ops are placed."""
    return {t for t in types if (o := registry.get(t)) is not None and not o.caffe2_kinds()}


def placer_only_cpu_types(types) -> set[str]:
    """Of ``types``, the op types placer has a CPU kernel for and real Caffe2 runs on a GPU
    only (FP16MomentumSGDUpdate, FP32MomentumSGDUpdate: CUDA kernels alone)."""
    return {t for t in types if (o := registry.get(t)) is not None
            and "cpu" in o.devices and "cpu" not in o.caffe2_kinds() and "gpu" in o.caffe2_kinds()}


CAFFE2_CPU_ONLY = "pinned: no GPU kernel in Caffe2 (--allow-gpu-only-in-placer for placer's runtime)"
CAFFE2_GPU_ONLY = "pinned: no CPU kernel in Caffe2 (--allow-gpu-only-in-placer for placer's runtime)"


def allowed_devices(net: Net, costs: NetCosts, machine: Machine, specs, keep_existing: bool,
                    placer_kernels: bool = False) -> tuple[np.ndarray, list[str]]:
    """bool [n, k] devices each op may run on, and why it is restricted ("" if free).

    Kernels first: an unknown op type runs on the host only; an op type without a GPU
    kernel on CPU devices only; an op type placer has a GPU kernel for but real Caffe2 does
    not (``OpDef.caffe2_devices``: BBoxTransform and BoxWithNMSLimit in a detection net) on CPU
    devices only too, and one Caffe2 runs on a GPU only (FP16MomentumSGDUpdate) on GPUs
    only (where the machine has one), unless ``placer_kernels`` (``--allow-gpu-only-in-placer``): the placed
    net must run in the Caffe2 the user deploys, and only placer's runtime could run it
    otherwise. Then pins, a later one replacing an earlier one on the same
    op: ``--keep-existing`` (the file's own device options), then each ``--pin GLOB=DEV``
    (DEV: ``cpu``, ``gpu`` = any GPU, or a device name such as ``cuda:1``) matched against
    op names, op types and output blobs. A pin to a device the op has no kernel for is an
    error.
    """
    n, k = len(net.ops), machine.k
    kinds = np.array([d.kind for d in machine.devices])
    known = costs.ops["known"].to_numpy(bool)
    allowed = costs.kernels.copy()
    allowed[~known] = False
    allowed[~known, 0] = True
    why = ["" if known[i] else "pinned: unknown op type" for i in range(n)]
    if not placer_kernels and (kinds == "gpu").any():
        types = costs.ops["type"].to_numpy()
        for i in np.flatnonzero(np.isin(types, list(placer_only_gpu_types(set(types))))):
            allowed[i, kinds == "gpu"] = False
            why[i] = CAFFE2_CPU_ONLY
        for i in np.flatnonzero(np.isin(types, list(placer_only_cpu_types(set(types))))):
            allowed[i, kinds == "cpu"] = False
            why[i] = CAFFE2_GPU_ONLY
    for i in np.flatnonzero(known & ~allowed[:, kinds == "gpu"].any(axis=1) & (kinds == "gpu").any()):
        why[i] = why[i] or "pinned: no GPU kernel"
    pins: dict[int, tuple[np.ndarray, str]] = {}
    if keep_existing:
        for op in net.ops:
            if op.device is not None:
                name = "cpu" if op.device.kind == "cpu" else f"cuda:{op.device.index}"
                pins[op.index] = (_device_mask(machine, name, "--keep-existing"),
                                  f"pinned: the file's {name} (--keep-existing)")
    for spec in specs:
        pattern, eq, device = spec.rpartition("=")
        if not eq or not pattern or not device:
            raise PlacerError(f"--pin '{spec}': expected GLOB=DEVICE, e.g. --pin 'emb:::*=cpu' or "
                              f"--pin 'fc*=cuda:1'")
        mask = _device_mask(machine, device, f"--pin '{spec}'")
        hits = [op.index for op in net.ops
                if any(fnmatch.fnmatchcase(s, pattern) for s in (op.name, op.type, *op.outputs) if s)]
        if not hits:
            raise PlacerError(f"--pin '{spec}': no op name, op type or output blob matches '{pattern}'")
        pins.update((i, (mask, f"pinned: --pin {device}")) for i in hits)
    for i, (mask, reason) in pins.items():
        narrowed = allowed[i] & mask
        if not narrowed.any():
            op = net.ops[i]
            raise InfeasiblePlanError(
                f"op {op.label} is {reason.removeprefix('pinned: ').join(('pinned to ', ''))} but "
                f"{why[i].removeprefix('pinned: ') or 'has no kernel there'}",
                hint="remove its pin or pin it to cpu")
        allowed[i] = narrowed
        why[i] = reason
    return allowed, why


def _device_mask(machine: Machine, device: str, what: str) -> np.ndarray:
    kinds = np.array([d.kind for d in machine.devices])
    if device in ("cpu", "gpu"):
        mask = kinds == device
        if not mask.any():
            raise PlacerError(f"{what}: machine {machine.name} has no {device.upper()}")
        return mask
    try:
        index = machine.index(device)
    except PlacerError as e:
        raise PlacerError(f"{what}: {e.message}", hint=e.hint) from None
    mask = np.zeros(machine.k, bool)
    mask[index] = True
    return mask


def inplace_pairs(net: Net) -> list[tuple[int, int]]:
    """(op, producer of the blob it overwrites) for every in-place op: they share a device
    (an update op's in-place gradient excepted: ``placer.training.placement``, rule 3)."""
    return training_inplace_pairs(net)


def parameter_groups(net: Net) -> list[set[int]]:
    """Ops that write the same state (a parameter, its optimizer state, a counter) share
    its device; ops that only read it may sit elsewhere and pay a copy per step
    (``placer.training.placement``, rules 1 and 2)."""
    return state_groups(net)
