"""Placement under a GPU memory limit: Lagrangian min-cut + repair + local moves, and an
exact MILP (HiGHS) that proves the optimum or bounds the gap.

Memory model (``problem.gpu_memory``): parameters read by any GPU op + the peak over op
steps of live activation bytes on the GPU must stay within ``capacity`` (already net of
the reserve). The problem is NP-hard; the heuristic is fast, the MILP is exact.

Lagrangian: each op gets an extra GPU cost ``lam * w_i`` with w_i = parameter bytes it
reads + bytes it writes; ``lam`` is bisected with the same min-cut network until the
cheapest feasible plan is found; a greedy repair moves GPU ops with the smallest cost
increase per byte freed to the CPU until the plan fits, then single-op moves that lower
the cost and keep the plan within the limit are applied.

MILP (exact, not a bound): x_i = 1 when op i is on the GPU; H_t >= x_v - x_u and
D_t >= x_u - x_v price each copy once; G_t >= x_v for parameters; activation liveness
L[t,i] per step is modelled exactly with monotone chains B (a GPU reader at or after i)
and F (a GPU reader at or before i): L >= x_u + B - 1 and L >= F + B - 1, and
sum_t bytes_t L[t,i] + scratch_i x_i + sum params G <= capacity for every step i.
At a binary x the least feasible L, B, F, G equal ``gpu_memory``'s accounting.
"""
from __future__ import annotations

import time

import numpy as np

from placer.errors import InfeasiblePlanError
from placer.partition.explain import make_plan
from placer.partition.mincut import FlowNetwork
from placer.partition.milp import milp_partition
from placer.partition.problem import (PIN_GPU, CostArrays, flip_delta, from_graph,
                                      gpu_memory, serial_cost)


def usage(arr: CostArrays, on_gpu) -> float:
    params, peak, _ = gpu_memory(arr, on_gpu)
    return params + peak


class MemoryPartitioner:
    """Serial objective within a GPU memory capacity (bytes, reserve already taken off)."""

    method = "mincut-memory"

    def __init__(self, capacity_bytes: float, milp_time_limit: float = 10.0,
                 milp_max_vars: int = 400_000, improve_time_s: float = 2.0):
        self.capacity = float(capacity_bytes)
        self.milp_time_limit = milp_time_limit
        self.milp_max_vars = milp_max_vars
        self.improve_time_s = improve_time_s

    def partition(self, graph):
        arr = from_graph(graph)
        net = FlowNetwork(arr)
        free_opt, _ = net.solve()
        if usage(arr, free_opt) <= self.capacity:
            return make_plan(arr, free_opt, self.method, optimal=True, gap=0.0,
                             capacity=self.capacity,
                             notes=["the unconstrained optimum fits in GPU memory"])
        check_pinned_fit(arr, self.capacity)
        on_gpu = lagrangian(arr, net, self.capacity)
        on_gpu = improve(arr, on_gpu, self.capacity, self.improve_time_s)
        heur = serial_cost(arr, on_gpu).total_s
        notes, optimal, gap = [f"Lagrangian + repair: {heur:.6g} s"], False, None
        if self.milp_time_limit > 0:
            res = milp_partition(arr, self.capacity, self.milp_time_limit, self.milp_max_vars)
            notes.append(res["note"])
            if res["x"] is not None and serial_cost(arr, res["x"]).total_s < heur:
                on_gpu = res["x"]
            if res["bound"] is not None:
                total = serial_cost(arr, on_gpu).total_s
                gap = max(0.0, (total - res["bound"]) / total) if total > 0 else 0.0
                optimal = res["optimal"] and gap <= 1e-9
        return make_plan(arr, on_gpu, self.method, optimal=optimal, gap=gap,
                         capacity=self.capacity, notes=notes)


def check_pinned_fit(arr: CostArrays, capacity: float) -> None:
    """InfeasiblePlanError when the ops forced onto the GPU alone exceed the capacity."""
    forced = arr.forced == PIN_GPU
    used = usage(arr, forced)
    if used > capacity:
        ops = np.flatnonzero(forced)
        heavy = ops[np.argsort(-(arr.param_bytes[ops] + arr.output_bytes[ops]))][:5]
        raise InfeasiblePlanError(
            f"the ops pinned to the GPU need {used / 2**20:.1f} MiB of GPU memory, "
            f"{(used - capacity) / 2**20:.1f} MiB over the {capacity / 2**20:.1f} MiB usable: "
            + ", ".join(f"{arr.op_label(i)} ({(arr.param_bytes[i] + arr.output_bytes[i]) / 2**20:.1f} MiB)"
                        for i in heavy),
            hint="unpin some of them, raise --gpu-mem or lower --gpu-reserve")


def lagrangian(arr: CostArrays, net: FlowNetwork, capacity: float, steps: int = 14) -> np.ndarray:
    """Best feasible placement over bisected multipliers, repaired if none was feasible."""
    w = arr.param_bytes + arr.output_bytes
    scale = max(float(np.abs(arr.cpu_s - arr.gpu_s).sum()), 1e-12) / max(float(w.sum()), 1.0)
    best, best_cost = arr.forced == PIN_GPU, serial_cost(arr, arr.forced == PIN_GPU).total_s
    lo, hi, tight = 0.0, scale, None
    for _ in range(40):  # grow hi until the relaxed plan fits
        x, _ = net.solve(hi * w)
        if usage(arr, x) <= capacity:
            best, best_cost = _better(arr, x, best, best_cost)
            break
        lo, tight, hi = hi, x, hi * 4
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        x, _ = net.solve(mid * w)
        if usage(arr, x) <= capacity:
            best, best_cost = _better(arr, x, best, best_cost)
            hi = mid
        else:
            lo, tight = mid, x
    if tight is not None:
        fixed = repair(arr, tight, capacity)
        best, best_cost = _better(arr, fixed, best, best_cost)
    return best


def _better(arr, x, best, best_cost):
    c = serial_cost(arr, x).total_s
    return (x.copy(), c) if c < best_cost else (best, best_cost)


def repair(arr: CostArrays, on_gpu: np.ndarray, capacity: float) -> np.ndarray:
    """Move GPU ops to the CPU, cheapest cost increase per byte first, until it fits."""
    x = on_gpu.copy()
    movable = np.flatnonzero(x & (arr.forced != PIN_GPU))
    w = arr.param_bytes + arr.output_bytes + 1.0
    ratio = np.maximum(arr.cpu_s[movable] - arr.gpu_s[movable], 0) / w[movable]
    for i in movable[np.argsort(ratio)]:
        if usage(arr, x) <= capacity:
            break
        x[arr.component == arr.component[i]] = False
    return x


def improve(arr: CostArrays, on_gpu: np.ndarray, capacity: float, time_s: float) -> np.ndarray:
    """Single-op (single colocation group) moves that lower the cost and still fit."""
    x = on_gpu.copy()
    free = np.flatnonzero(arr.forced < 0)
    gain = np.abs(arr.cpu_s[free] - arr.gpu_s[free])
    order = free[np.argsort(-gain)]
    deadline = time.perf_counter() + time_s
    for _ in range(3):
        moved = False
        for i in order:
            if time.perf_counter() > deadline:
                return x
            group = np.flatnonzero(arr.component == arr.component[i]) if len(arr.colocate) else [i]
            delta, _ = flip_delta(arr, x, group)
            if delta >= -1e-15:
                continue
            x[group] = ~x[group]
            if x[i] and usage(arr, x) > capacity:
                x[group] = ~x[group]
                continue
            moved = True
        if not moved:
            break
    return x
