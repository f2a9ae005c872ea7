"""Makespan: CPU work, the GPU stream and the two copy engines run at the same time.

Event model (Caffe2's async executors, one stream per resource): four lanes, "cpu",
"gpu", "h2d", "d2h"; each runs its work in issue order, one item at a time. Ops are
issued in net order on their device's lane and start when the lane is free and every
input is present on that device. A blob needed on the other device is copied right after
its producer ends (host-fed inputs at time 0) on the copy lane of that direction, and is
present there when the copy ends. External outputs read on the host end with their D2H
copy. Parameters are present on both devices from the start. The makespan is the end of
the last item on any lane.

Search: a HEFT-style list scheduler (ops by decreasing upward rank, each on the device
where it would finish first) proposes a placement; a local search then flips single ops
(colocation groups) while the simulated makespan drops, starting from the better of the
min-cut and HEFT placements. The result is never worse than the min-cut placement's
makespan, since that placement is a candidate and moves are accepted only if they improve.
With a GPU memory limit the start is the memory-limited serial plan, HEFT's placement
counts only if it fits, and no move may break the limit.
"""
from __future__ import annotations

import time

import numpy as np

from placer.partition.explain import make_plan
from placer.partition.memory import MemoryPartitioner, usage
from placer.partition.mincut import mincut_placement
from placer.partition.problem import (HOST, PARAM, CostArrays, copy_masks, from_graph,
                                      placement_array)

LANES = ("cpu", "gpu", "h2d", "d2h")


class Simulator:
    """Scores placements of one cost graph by simulated makespan."""

    def __init__(self, graph):
        arr = self.arr = from_graph(graph)
        cptr, cten = arr.consumed_by
        pptr, pten = arr.produced_by
        self.reads = [cten[cptr[i]:cptr[i + 1]].tolist() for i in range(arr.n_ops)]
        self.makes = [pten[pptr[i]:pptr[i + 1]].tolist() for i in range(arr.n_ops)]
        self.cost = (arr.cpu_s.tolist(), arr.gpu_s.tolist())
        self.copy_s = (arr.t_h2d.tolist(), arr.t_d2h.tolist())
        self.hosts = np.flatnonzero(arr.t_producer == HOST).tolist()
        self.params = np.flatnonzero(arr.t_producer == PARAM).tolist()

    def score(self, plan_or_on_gpu) -> float:
        return self.run(_on_gpu(plan_or_on_gpu, self.arr.n_ops))[0]

    def timeline(self, plan_or_on_gpu) -> list[dict]:
        return self.run(_on_gpu(plan_or_on_gpu, self.arr.n_ops), record=True)[1]

    def run(self, on_gpu: np.ndarray, record: bool = False):
        """(makespan_s, events); events are dicts lane/kind/op/tensor/start_s/end_s."""
        arr = self.arr
        h2d, d2h = copy_masks(arr, on_gpu)
        h2d, d2h = h2d.tolist(), d2h.tolist()
        dev = np.asarray(on_gpu, bool).astype(int).tolist()
        inf = float("inf")
        avail = ([inf] * arr.n_tensors, [inf] * arr.n_tensors)
        lane = [0.0, 0.0, 0.0, 0.0]   # cpu, gpu, h2d, d2h
        events: list[dict] = []
        for t in self.params:
            avail[0][t] = avail[1][t] = 0.0
        for t in self.hosts:
            avail[0][t] = 0.0
            if h2d[t]:
                self._copy(t, 0, 0.0, avail, lane, events, record)
        for i in range(arr.n_ops):
            d = dev[i]
            here = avail[d]
            ready = max((here[t] for t in self.reads[i]), default=0.0)
            start = max(lane[d], ready)
            end = start + self.cost[d][i]
            lane[d] = end
            if record:
                events.append({"lane": LANES[d], "kind": "op", "op": i, "tensor": None,
                               "start_s": start, "end_s": end})
            for t in self.makes[i]:
                here[t] = end
                if (h2d[t] if d == 0 else d2h[t]):
                    self._copy(t, d, end, avail, lane, events, record)
        return max(lane), events

    def _copy(self, t, src, ready, avail, lane, events, record):
        k = 2 + src   # h2d lane from the CPU, d2h lane from the GPU
        start = max(lane[k], ready)
        end = start + self.copy_s[src][t]
        lane[k] = end
        avail[1 - src][t] = end
        if record:
            events.append({"lane": LANES[k], "kind": "copy", "op": None,
                           "tensor": self.arr.tensor_name(t), "start_s": start, "end_s": end})


def _on_gpu(plan_or_on_gpu, n):
    if hasattr(plan_or_on_gpu, "placement"):
        return placement_array(plan_or_on_gpu.placement, n)
    return np.asarray(plan_or_on_gpu, bool)


def heft_placement(arr: CostArrays) -> np.ndarray:
    """Placement chosen by a HEFT-style list scheduler (module docstring)."""
    n = arr.n_ops
    sim = Simulator(arr)
    readers = [[] for _ in range(n)]
    for i in range(n):
        for t in sim.reads[i]:
            p = int(arr.t_producer[t])
            if p >= 0:
                readers[p].append((i, 0.25 * (arr.t_h2d[t] + arr.t_d2h[t])))
    w = 0.5 * (arr.cpu_s + arr.gpu_s)
    rank = np.zeros(n)
    for i in range(n - 1, -1, -1):
        rank[i] = w[i] + max((c + rank[j] for j, c in readers[i]), default=0.0)
    order = sorted(range(n), key=lambda i: (-rank[i], i))
    forced, comp = arr.forced.tolist(), arr.component
    on_gpu = np.zeros(n, bool)
    placed = np.zeros(n, bool)
    lane = [0.0, 0.0, 0.0, 0.0]
    done = {}   # tensor -> {device: time}
    for t in sim.params:
        done[t] = {0: 0.0, 1: 0.0}
    for t in sim.hosts:
        done[t] = {0: 0.0}
    for i in order:
        options = [forced[i]] if forced[i] >= 0 else [0, 1]
        mates = np.flatnonzero((comp == comp[i]) & placed)
        if len(mates):
            options = [int(on_gpu[mates[0]])]
        best = None
        for d in options:
            ready, copies, copy_lane = 0.0, [], lane[3 - d]
            for t in sim.reads[i]:
                have = done.get(t, {})
                if d in have:
                    ready = max(ready, have[d])
                elif have:
                    src = 1 - d
                    s = max(copy_lane, have[src])
                    copy_lane = s + sim.copy_s[src][t]
                    copies.append((t, copy_lane))
                    ready = max(ready, copy_lane)
            end = max(lane[d], ready) + sim.cost[d][i]
            if best is None or end < best[0]:
                best = (end, d, copies, copy_lane)
        end, d, copies, copy_lane = best
        on_gpu[i], placed[i] = bool(d), True
        lane[d] = end
        if copies:
            lane[3 - d] = copy_lane
        for t, at in copies:
            done[t][d] = at
        for t in sim.makes[i]:
            done[t] = {d: end}
    return on_gpu


def local_search(arr: CostArrays, sim: Simulator, on_gpu: np.ndarray, best: float,
                 time_s: float = 2.0, fits=lambda x: True,
                 passes: int = 3) -> tuple[np.ndarray, float]:
    """Flip single ops (colocation groups) while the makespan drops and ``fits`` holds."""
    x = on_gpu.copy()
    free = np.flatnonzero(arr.forced < 0)
    order = free[np.argsort(-np.abs(arr.cpu_s[free] - arr.gpu_s[free]))]
    deadline = time.perf_counter() + time_s
    for _ in range(passes):
        improved = False
        for i in order:
            if time.perf_counter() > deadline:
                return x, best
            group = np.flatnonzero(arr.component == arr.component[i]) if len(arr.colocate) else [i]
            x[group] = ~x[group]
            m = sim.run(x)[0]
            if m < best * (1 - 1e-12) and (not x[group].any() or fits(x)):
                best, improved = m, True
            else:
                x[group] = ~x[group]
        if not improved:
            break
    return x, best


class MakespanPartitioner:
    """Minimise the simulated makespan (module docstring)."""

    method = "makespan"

    def __init__(self, time_s: float = 2.0, capacity_bytes: float | None = None):
        self.time_s = time_s
        self.capacity = capacity_bytes

    def partition(self, graph):
        arr = from_graph(graph)
        sim = Simulator(arr)
        fits = (lambda x: True) if self.capacity is None else (
            lambda x: usage(arr, x) <= self.capacity)
        if self.capacity is None:
            base = mincut_placement(arr)
        else:  # the serial plan within the memory limit
            base = placement_array(MemoryPartitioner(self.capacity, milp_time_limit=0)
                                   .partition(arr).placement, arr.n_ops)
        base_ms = sim.run(base)[0]
        heft = heft_placement(arr)
        heft_ms = sim.run(heft)[0] if fits(heft) else float("inf")
        start, start_ms = (heft, heft_ms) if heft_ms < base_ms else (base, base_ms)
        x, ms = local_search(arr, sim, start, start_ms, self.time_s, fits)
        plan = make_plan(arr, x, self.method, objective="makespan", capacity=self.capacity, notes=[
            f"makespan {ms:.6g} s; min-cut placement {base_ms:.6g} s "
            f"({100 * (base_ms - ms) / base_ms if base_ms > 0 else 0.0:.1f}% better); "
            + (f"HEFT {heft_ms:.6g} s" if heft_ms < float("inf") else "HEFT's placement does not fit in GPU memory")])
        plan.makespan_s = ms
        plan.timeline = sim.run(x, record=True)[1]
        return plan


__all__ = ["Simulator", "MakespanPartitioner", "heft_placement"]
