"""Placement under a GPU memory limit: Lagrangian min-cut + repair + local moves, and an
exact MILP (HiGHS) that proves the optimum or bounds the gap.

Memory model (``problem.gpu_memory``): parameters read by any GPU op + the peak over op
steps of live activation bytes on the GPU must stay within ``capacity`` (already net of
the reserve). The problem is NP-hard; the heuristic is fast, the MILP is exact.

Lagrangian: each op gets an extra GPU cost ``lam * w_i`` with w_i the GPU bytes it
brings (parameters it reads, blobs it writes); ``lam`` is bisected with the same min-cut network until the
cheapest feasible plan is found (the price is spread over op steps: see ``lagrangian``);
a greedy repair moves GPU ops with the smallest cost increase per byte freed to the CPU
until the plan fits; then moves that lower the cost and keep the plan within the limit
are applied: single ops, runs of up to 4 ops, CPU/GPU swaps, and (up to 20k ops) windows
of 16 ops re-solved exactly by min-cut with the rest held.

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
from placer.partition.problem import (PIN_CPU, PIN_GPU, CostArrays, flip_delta, flip_deltas,
                                      from_graph, gpu_memory, scratch_bytes, serial_cost)


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
        # each min-cut costs ~0.2 s at 100k ops and ~5 s at 1M: fewer of them on big nets
        small = arr.n_ops <= 20_000   # window re-solves cost a whole min-cut each: small nets only
        steps = 12 if small else 6 if arr.n_ops <= 200_000 else 4
        starts, prices = lagrangian(arr, net, self.capacity, free_opt, steps=steps,
                                    rounds=3 if small else 1)
        starts = _distinct(arr, starts)[:4]
        share = self.improve_time_s / (2 * len(starts) + 1)
        tried = [improve(arr, x, self.capacity, share) for x in starts]
        if small:
            tried = [windows(arr, net, x, self.capacity, prices[-1], share) for x in tried]
        on_gpu = min(tried, key=lambda x: serial_cost(arr, x).total_s)
        on_gpu = improve(arr, on_gpu, self.capacity, share)
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
        own = arr.read_param_bytes + arr.written_bytes
        heavy = ops[np.argsort(-own[ops], kind="stable")][:5]
        raise InfeasiblePlanError(
            f"the ops pinned to the GPU need {used / 2**20:.1f} MiB of GPU memory, "
            f"{(used - capacity) / 2**20:.1f} MiB over the {capacity / 2**20:.1f} MiB usable: "
            + ", ".join(f"{arr.op_label(i)} ({own[i] / 2**20:.1f} MiB)" for i in heavy),
            hint="unpin some of them, raise --gpu-mem or lower --gpu-reserve")


def lagrangian(arr: CostArrays, net: FlowNetwork, capacity: float, free_opt: np.ndarray,
               steps: int = 12, rounds: int = 3) -> list[np.ndarray]:
    """Feasible starting placements: per round, the cheapest one met while bisecting the
    multiplier and the last infeasible one repaired.

    The memory limit holds at every op step s, so each step gets a price mu_s (summing to
    1) and an op's GPU-side cost grows by lam * (bytes of the parameters it reads, live at
    every step, + bytes of each blob it writes times the price of the steps the blob
    lives). Round 1 prices the steps where the unconstrained optimum exceeds the limit;
    each later round moves half the price to where the last infeasible plan exceeded it.
    """
    mu = _excess(arr, free_opt, capacity, None)
    starts, prices = [], []
    for _ in range(rounds):
        w = _op_weights(arr, mu)
        found, tight, lam = _bisect(arr, net, capacity, w, steps)
        starts += found
        prices.append(lam * w)
        if tight is None:
            break
        mu = _excess(arr, tight, capacity, mu)
    return starts, prices


def _excess(arr, x, capacity, mu):
    params, curve, _ = gpu_memory(arr, x, curve_only=True)
    over = np.maximum(curve + params - capacity, 0)
    new = over / over.sum() if over.sum() > 0 else np.full(arr.n_ops, 1.0 / max(arr.n_ops, 1))
    return new if mu is None else 0.5 * mu + 0.5 * new


def _op_weights(arr, mu):
    """GPU bytes of each op priced by step (see ``lagrangian``)."""
    n = arr.n_ops
    cum = np.concatenate([[0.0], np.cumsum(mu)])
    last = np.full(arr.n_tensors, -1, np.int64)
    has = np.diff(arr.t_ptr) > 0
    if has.any():
        last[has] = np.maximum.reduceat(arr.t_cons, arr.t_ptr[:-1][has])
    made = np.flatnonzero(arr.t_producer >= 0)
    p = arr.t_producer[made]
    end = np.maximum(last[made], p)
    act = np.bincount(p, weights=arr.t_bytes[made] * (cum[end + 1] - cum[p]), minlength=n)
    return arr.read_param_bytes * cum[-1] + act + scratch_bytes(arr) * mu


def _bisect(arr, net, capacity, w, steps):
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
    found = [best] + ([repair(arr, tight, capacity)] if tight is not None else [])
    return found, tight, hi


def _distinct(arr, starts):
    """Starting placements without repeats, cheapest first."""
    seen, out = set(), []
    for x in sorted(starts, key=lambda x: serial_cost(arr, x).total_s):
        key = x.tobytes()
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def windows(arr: CostArrays, net: FlowNetwork, on_gpu: np.ndarray, capacity: float,
            price: np.ndarray, time_s: float, width: int = 16) -> np.ndarray:
    """Re-solve windows of consecutive ops exactly by min-cut, the rest held, with the
    memory price at 0, 1/2 and 1 times the Lagrangian one; keep what lowers the cost and
    fits. Moves whole blocks that single-op moves cannot."""
    x = on_gpu.copy()
    cost = serial_cost(arr, x).total_s
    deadline = time.perf_counter() + time_s
    for start in range(0, max(arr.n_ops - width // 2, 1), width // 2):
        for mult in (0.0, 0.5, 1.0):
            if time.perf_counter() > deadline:
                return x
            fixed = np.where(x, PIN_GPU, PIN_CPU).astype(np.int8)
            inside = slice(start, start + width)
            fixed[inside] = arr.forced[inside]
            y, _ = net.solve(mult * price, fixed=fixed, ref=x)
            c = serial_cost(arr, y).total_s
            if c < cost * (1 - 1e-12) and usage(arr, y) <= capacity:
                x, cost = y, c
    return x


def _better(arr, x, best, best_cost):
    c = serial_cost(arr, x).total_s
    return (x.copy(), c) if c < best_cost else (best, best_cost)


def repair(arr: CostArrays, on_gpu: np.ndarray, capacity: float) -> np.ndarray:
    """Move GPU ops to the CPU, cheapest cost increase per byte first, until it fits.
    Moving an op off the GPU never makes GPU memory grow, so the shortest prefix of that
    order that fits is found by bisection (log n memory evaluations)."""
    movable = np.flatnonzero(on_gpu & (arr.forced != PIN_GPU))
    w = arr.read_param_bytes + arr.written_bytes + 1.0
    ratio = np.maximum(arr.cpu_s[movable] - arr.gpu_s[movable], 0) / w[movable]
    order = movable[np.argsort(ratio, kind="stable")]

    def moved(k):
        x = on_gpu.copy()
        x[np.isin(arr.component, arr.component[order[:k]])] = False
        return x

    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if usage(arr, moved(mid)) <= capacity:
            hi = mid
        else:
            lo = mid + 1
    return moved(lo)


def improve(arr: CostArrays, on_gpu: np.ndarray, capacity: float, time_s: float) -> np.ndarray:
    """Moves that lower the cost and still fit, until none is left or time is up:
    single ops (colocation groups), runs of up to 4 consecutive ops, and swaps of a CPU op
    that wants the GPU with a GPU op that is cheap to move out."""
    x = on_gpu.copy()
    deadline = time.perf_counter() + time_s
    free = np.flatnonzero(arr.forced < 0)
    order = free[np.argsort(-np.abs(arr.cpu_s[free] - arr.gpu_s[free]))]
    groups = [_group(arr, i) for i in order]
    runs = (np.arange(i, i + k) for size in [np.bincount(arr.component)] for k in (2, 3, 4)
            for i in range(arr.n_ops - k + 1)  # a run never splits a colocated group
            if (arr.forced[i:i + k] < 0).all() and (size[arr.component[i:i + k]] == 1).all())
    for _ in range(6):
        moved = any([_moves(arr, x, capacity, groups, deadline),
                     _moves(arr, x, capacity, runs, deadline),
                     _swaps(arr, x, capacity, order, deadline)])
        if not moved or time.perf_counter() > deadline:
            break
    return x


def _group(arr: CostArrays, i: int) -> np.ndarray:
    if len(arr.colocate):
        return np.flatnonzero(arr.component == arr.component[i])
    return np.array([i])


def _moves(arr, x, capacity, moves, deadline) -> bool:
    """Apply each move (ops flipped together) that lowers the cost and fits."""
    moved = False
    for ops in moves:
        if time.perf_counter() > deadline:
            break
        delta, _ = flip_delta(arr, x, ops)
        if delta >= -1e-15:
            continue
        x[ops] = ~x[ops]
        if x[ops].any() and usage(arr, x) > capacity:
            x[ops] = ~x[ops]
            continue
        moved = True
    return moved


def _swaps(arr, x, capacity, order, deadline, k: int = 25) -> bool:
    """Pair a CPU op whose move to the GPU would pay but does not fit with a GPU op whose
    move to the CPU frees room cheaply."""
    d = flip_deltas(arr, x)
    cpu_ops, gpu_ops = order[~x[order]], order[x[order]]
    want = [(d[i], i) for i in cpu_ops[np.argsort(d[cpu_ops])][:k] if d[i] < 0]
    out = [(d[i], i) for i in gpu_ops[np.argsort(d[gpu_ops])][:k]]
    moved = False
    for _, a in want:
        for _, b in out:
            if time.perf_counter() > deadline or x[a] or not x[b]:
                break
            ops = np.concatenate([_group(arr, a), _group(arr, b)])
            delta, _ = flip_delta(arr, x, ops)
            if delta >= -1e-15:
                continue
            x[ops] = ~x[ops]
            if usage(arr, x) > capacity:
                x[ops] = ~x[ops]
                continue
            moved = True
            break
    return moved
