"""Baselines reported beside every plan, scored with the same serial cost function.

Every baseline puts each op on a device it may take (``feasible``: kernels, pins, and
colocation: a group follows its pin, else its members' choice) and its Plan reports
memory per device against ``arr.capacity``; those that ignore memory say so in a note
when they do not fit.
- ``all_cpu``: every op on the host.
- ``all_gpu``: every op on one GPU, the fastest by summed op time (cuda:0 when the GPUs
  are alike), host fallback for ops that may not run there (what Caffe2 does by itself).
- ``greedy``: each op (colocation group: summed times) on its individually fastest
  device, copies paid afterwards.
- ``existing``: a given device index per op (a file's own device options), as it is.
- ``pipeline``: what people do by hand: the ops in net order cut into as many contiguous
  stages as there are GPUs, stage g on GPU g, each stage's summed time on its GPU equal;
  ops that may not run on their stage's GPU on the host.
- ``m_topo`` (Baechi, SoCC 2020): ops in net order (a topological order) fill one GPU up
  to an equal share of the total compute or until its memory is full, then the next; ops
  that fit on no GPU on the host.
- ``m_etf`` (Baechi): earliest task first. Among the ops whose inputs are all made, the
  op and GPU where an op can start earliest are chosen, the start being when the GPU is
  free and every input has arrived (its producer's finish, + the copy over the link from
  the producer's device, ``copy_s``); a GPU without memory room for the op is skipped;
  ops that may run on no GPU with room go to the host.
- ``lower_bound``: sum over ops of the fastest device they may take, no copies: a
  ``PlanCost``, not a placement; no plan costs less.
m-TOPO and m-ETF count a device's memory as every byte ever placed there (parameters and
blobs made or copied there, never freed), an upper bound on the peak: what they place fits.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from placer.partition.expansion import colocated
from placer.partition.explain import make_plan
from placer.partition.problem import PARAM, CostArrays, as_placement, respecting_pins
from placer.types import Plan, PlanCost


def _plan(arr: CostArrays, dev: np.ndarray, method: str, memory_aware: bool = False):
    plan = make_plan(arr, dev, method, explain=False)   # scored and shown, never explained
    over = np.flatnonzero(plan.memory_bytes > arr.capacity * (1 + 1e-12))
    if len(over):
        plan.notes.append(("does not fit: " if not memory_aware else "no placement of this method fits: ")
                          + ", ".join(f"{arr.devices[d]} needs {plan.memory_bytes[d] / 2**20:.1f} MiB "
                                      f"of {arr.capacity[d] / 2**20:.1f} MiB usable" for d in over))
    return plan


def gpus(arr: CostArrays) -> list[int]:
    return [d for d, kind in enumerate(arr.device_kinds) if kind == "gpu"]


def all_cpu(arr: CostArrays):
    return _plan(arr, respecting_pins(arr, np.full(arr.n_ops, arr.host)), "all_cpu")


def fastest_gpu(arr: CostArrays) -> int:
    """The GPU with the least summed time over the ops every GPU may run (ties: the
    lowest index); the host when there is no GPU."""
    g = gpus(arr)
    if not g:
        return arr.host
    common = arr.feasible[:, g].all(axis=1)
    return g[int(np.argmin(arr.op_s[common][:, g].sum(axis=0)))]


def all_gpu(arr: CostArrays):
    return _plan(arr, respecting_pins(arr, np.full(arr.n_ops, fastest_gpu(arr))), "all_gpu")


def greedy(arr: CostArrays):
    comp = arr.component
    m = comp.max() + 1 if len(comp) else 0
    summed = np.zeros((m, arr.k))
    np.add.at(summed, comp, np.where(arr.feasible, arr.op_s, 0.0))
    summed[~arr.feasible[np.unique(comp, return_index=True)[1]]] = np.inf
    return _plan(arr, summed.argmin(axis=1)[comp] if m else np.zeros(0, np.int64), "greedy")


def existing(arr: CostArrays, dev):
    """Score a given placement as it is (no pins applied: it is what the file says)."""
    return _plan(arr, as_placement(arr, dev), "existing")


def pipeline(arr: CostArrays):
    g = gpus(arr)
    work = _gpu_time(arr, g) if g else np.zeros(arr.n_ops)
    if not g or work.sum() <= 0:
        return _plan(arr, respecting_pins(arr, np.full(arr.n_ops, arr.host)), "pipeline")
    # a GPU twice as fast takes twice the work: stage j ends where the cumulative work
    # reaches the sum of the speed shares up to j; an op belongs where its midpoint falls
    common = arr.feasible[:, g].all(axis=1)
    summed = arr.op_s[common][:, g].sum(axis=0)
    speed = np.where(summed > 0, 1.0 / np.maximum(summed, 1e-300), 1.0) if common.any() else np.ones(len(g))
    ends = np.cumsum(speed) / speed.sum() * work.sum()
    middle = np.cumsum(work) - 0.5 * work
    stage = np.minimum(np.searchsorted(ends, middle), len(g) - 1)
    dev = np.where(work > 0, np.asarray(g)[stage], arr.host)
    return _plan(arr, respecting_pins(arr, colocated(arr, dev)), "pipeline")


class _Residency:
    """Bytes ever placed on each device (module docstring): the parameters and blobs
    read or written there, each counted once per device. Devices without a limit are
    not tracked."""

    def __init__(self, arr: CostArrays):
        self.arr = arr
        self.limited = np.isfinite(arr.capacity).tolist()
        self.capacity = (arr.capacity * (1 + 1e-12)).tolist()
        self.used = [0.0] * arr.k
        self.on: list[set] = [set() for _ in range(arr.k)]
        if any(self.limited):
            cptr, cten = arr.consumed_by
            pptr, pten = arr.produced_by
            self.reads = _split(cten.tolist(), cptr.tolist())
            self.makes = _split(pten.tolist(), pptr.tolist())
            self.nbytes = arr.t_bytes.tolist()
            self.written = arr.written_bytes.tolist()
            # what an op brings at most (nothing it reads there yet): room for that is room enough
            cons = np.bincount(np.repeat(np.arange(arr.n_ops), np.diff(cptr)), weights=arr.t_bytes[cten],
                               minlength=arr.n_ops) if len(cten) else np.zeros(arr.n_ops)
            self.most = (arr.written_bytes + cons).tolist()

    def new_bytes(self, i: int, d: int) -> float:
        on, nb = self.on[d], self.nbytes
        return self.written[i] + sum(nb[t] for t in self.reads[i] if t not in on)

    def fits(self, i: int, d: int) -> bool:
        if not self.limited[d]:
            return True
        used = self.used[d]
        return used + self.most[i] * (1 + 1e-9) <= self.capacity[d] or used + self.new_bytes(i, d) <= self.capacity[d]

    def place(self, i: int, d: int) -> None:
        if self.limited[d]:
            self.used[d] += self.new_bytes(i, d)
            self.on[d].update(self.reads[i])
            self.on[d].update(self.makes[i])


def _fallback(arr: CostArrays, i: int, group_dev: int) -> int:
    """Where an op goes when no GPU takes it: its group's device, else the host, else
    its first feasible device."""
    if group_dev >= 0:
        return group_dev
    return arr.host if arr.feasible[i, arr.host] else int(np.argmax(arr.feasible[i]))


def _gpu_time(arr: CostArrays, g: list[int]) -> np.ndarray:
    """Mean time of each op over the GPUs it may run on (0 where it may run on none)."""
    on = arr.feasible[:, g]
    summed = np.where(on, arr.op_s[:, g], 0.0).sum(axis=1)
    return np.where(on.any(axis=1), summed / np.maximum(on.sum(axis=1), 1), 0.0)


def m_topo(arr: CostArrays):
    g = gpus(arr)
    res = _Residency(arr)
    comp = arr.component
    group_dev = np.full(comp.max() + 1 if len(comp) else 0, -1, np.int64)
    share = float(_gpu_time(arr, g).sum()) / max(len(g), 1)
    load = np.zeros(arr.k)
    cur = 0                          # the GPU being filled
    dev = np.full(arr.n_ops, arr.host, np.int64)
    for i in range(arr.n_ops):
        d = int(group_dev[comp[i]])
        while d < 0 and cur < len(g):
            full = load[g[cur]] > 0 and load[g[cur]] + arr.op_s[i, g[cur]] > share and cur + 1 < len(g)
            if arr.feasible[i, g[cur]] and not full and not res.fits(i, g[cur]):
                full = True          # out of memory: move on to the next GPU
            if full:
                cur += 1
                continue
            # an op pinned away from this GPU takes the first later one it may run on
            d = next((e for e in g[cur:] if arr.feasible[i, e] and res.fits(i, e)), -1)
            break
        d = d if d >= 0 else _fallback(arr, i, int(group_dev[comp[i]]))
        dev[i] = d
        group_dev[comp[i]] = d
        load[d] += arr.op_s[i, d]
        res.place(i, d)
    return _plan(arr, dev, "m_topo", memory_aware=True)


def _split(flat: list, ptr: list) -> list[list]:
    """A CSR array as one Python list per row (list slices: no array per row)."""
    return [flat[ptr[i]:ptr[i + 1]] for i in range(len(ptr) - 1)]


def _predecessors(arr: CostArrays) -> tuple[np.ndarray, list[list[int]]]:
    """Per op the number of distinct ops whose blobs it reads, and each op's readers (in
    op order). A blob made by a later op (a train net's state, read as the previous step
    left it) is there from the start: its maker is not a predecessor. Computed over the
    whole CSR at once: the distinct (maker, reader) pairs."""
    n = arr.n_ops
    cptr, cten = arr.consumed_by
    reader = np.repeat(np.arange(n, dtype=np.int64), np.diff(cptr))
    made = arr.t_producer[cten].astype(np.int64)
    keep = (made >= 0) & (made < reader)
    pairs = np.unique(made[keep] * max(n, 1) + reader[keep])       # sorted by maker, then reader
    makers, readers = pairs // max(n, 1), pairs % max(n, 1)
    waiting = np.bincount(readers, minlength=n).astype(np.int64)
    bounds = np.searchsorted(makers, np.arange(n + 1)).tolist()
    succ = _split(readers.tolist(), bounds)
    return waiting, succ


def m_etf(arr: CostArrays):
    """Earliest task first (module docstring). One heap per device holds (time the op's
    inputs are all there, op) for the ready ops that may go there; at each step the top
    of every heap is checked (an op placed meanwhile, its group placed elsewhere, or no
    memory room left there: dropped; room only shrinks) and the op that starts earliest
    is placed. An op dropped from every heap goes to its group's device or the host.
    The loop runs on Python lists (one per array, read once), and whether a heap's top
    fits its device is remembered until something is placed there."""
    n, k = arr.n_ops, arr.k
    g = gpus(arr)
    res = _Residency(arr)
    comp = arr.component.tolist()
    group_dev = [-1] * (max(comp) + 1 if n else 0)
    cptr, cten = arr.consumed_by
    reads = _live_reads(arr, cptr, cten)
    producer, host = arr.t_producer.tolist(), arr.host
    copy_rows, link = arr.class_s.tolist(), arr.link_class.tolist()
    op_s, feasible = arr.op_s.tolist(), arr.feasible.tolist()
    waiting, succ = _predecessors(arr)
    waiting = waiting.tolist()
    finish, free_at = [0.0] * n, [0.0] * k
    dev = [-1] * n
    options = [0] * n                        # heap entries of an op still standing
    heaps: list[list] = [[] for _ in range(k)]
    arrival: dict[tuple[int, int], float] = {}
    placed_on = [0] * k                      # ops placed on each device so far
    fit_memo: list[tuple] = [(-1, -1, False)] * k   # (op, placed_on[d], fits) of heap d's top

    def data_ready(i: int, d: int) -> float:
        ready = 0.0
        for t in reads[i]:
            p = producer[t]
            src, made = (host, 0.0) if p < 0 else (dev[p], finish[p])
            if src != d:
                at = arrival.get((t, d))
                if at is None:
                    at = arrival[(t, d)] = made + copy_rows[link[src][d]][t]
                made = at
            if made > ready:
                ready = made
        return ready

    def push(i: int, devices: list[int], forced: bool) -> None:
        for d in devices:
            heapq.heappush(heaps[d], (data_ready(i, d), i, forced))
        options[i] += len(devices)

    def ready(i: int) -> None:
        gd = group_dev[comp[i]]
        row = feasible[i]
        choice = [gd] if gd >= 0 else [d for d in g if row[d]]
        if choice:
            push(i, choice, False)
        else:
            push(i, [_fallback(arr, i, -1)], True)

    def fits(i: int, d: int) -> bool:
        memo = fit_memo[d]
        if memo[0] != i or memo[1] != placed_on[d]:
            memo = fit_memo[d] = (i, placed_on[d], res.fits(i, d))
        return memo[2]

    def valid(entry, d: int) -> bool:
        _, i, forced = entry
        if dev[i] >= 0:
            return False
        if forced:
            return True
        gd = group_dev[comp[i]]
        ok = (gd < 0 or gd == d) and fits(i, d)
        if not ok:
            options[i] -= 1
            if options[i] == 0:        # no GPU takes it: its group's device or the host
                push(i, [_fallback(arr, i, gd)], True)
        return ok
    for i in [j for j in range(n) if waiting[j] == 0]:
        ready(i)
    for _ in range(n):
        best = None
        while best is None:      # an op dropped from every heap is pushed to another one
            for d in range(k):
                h = heaps[d]
                while h and not valid(h[0], d):
                    heapq.heappop(h)
                if h:
                    top = h[0]
                    key = (free_at[d] if free_at[d] > top[0] else top[0], top[1], d)
                    if best is None or key < best:
                        best = key
        start, i, d = best       # its entry leaves the heap lazily, as a placed op
        dev[i] = d
        group_dev[comp[i]] = d
        res.place(i, d)
        placed_on[d] += 1
        finish[i] = free_at[d] = start + op_s[i][d]
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready(j)
    return _plan(arr, np.array(dev, np.int64), "m_etf", memory_aware=True)


def _live_reads(arr: CostArrays, cptr: np.ndarray, cten: np.ndarray) -> list[list[int]]:
    """Per op, the tensors it reads that are not parameters nor state from the previous
    step (made by a later op), in CSR order, as lists."""
    reader = np.repeat(np.arange(arr.n_ops), np.diff(cptr))
    made_by = arr.t_producer[cten]
    live = (made_by != PARAM) & (made_by < reader)
    ptr = np.concatenate([[0], np.cumsum(live)])[cptr].tolist()
    flat = cten[live].tolist()
    return [flat[ptr[i]:ptr[i + 1]] for i in range(arr.n_ops)]


def lower_bound(arr: CostArrays) -> PlanCost:
    best = np.where(arr.feasible, arr.op_s, np.inf).min(axis=1) if arr.n_ops else np.zeros(0)
    return PlanCost(float(best.sum()), 0.0)


class BaselinePartitioner:
    """A baseline as a partitioner (``partition(method=...)``): ``place`` is one of the
    functions above (``greedy``, ``all_cpu``, ...)."""

    def __init__(self, place: Callable[[CostArrays], Plan]):
        self.place = place

    def partition(self, arr: CostArrays) -> Plan:
        return self.place(arr)


def baselines(arr: CostArrays, existing_placement=None) -> dict:
    """Every baseline: name -> Plan (``lower_bound`` -> PlanCost)."""
    out = {"all_cpu": all_cpu(arr), "all_gpu": all_gpu(arr), "greedy": greedy(arr),
           "pipeline": pipeline(arr), "m_topo": m_topo(arr), "m_etf": m_etf(arr)}
    if existing_placement is not None:
        out["existing"] = existing(arr, existing_placement)
    out["lower_bound"] = lower_bound(arr)
    return out


__all__ = ["all_cpu", "all_gpu", "greedy", "existing", "pipeline", "m_topo", "m_etf", "lower_bound",
           "baselines", "fastest_gpu", "BaselinePartitioner"]
