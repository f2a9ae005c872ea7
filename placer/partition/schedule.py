"""Makespan over k devices: the devices and the machine's copy lanes run at the same time.

Event model (Caffe2's async executors: one stream per device, copies on their own
engines). Lanes: one per device (``arr.devices``) and one per copy lane of the machine
(``arr.lanes``); a lane runs its items in issue order, one at a time, each starting when
the lane is free and its inputs are ready.
- Ops are issued in net order (a net reads only blobs made earlier) on their device's
  lane and start when every blob they read is present on that device.
- A blob is copied once to every other device that reads it, right after its producer
  ends (a host-fed blob: at time 0, before any op), in the order (producer, blob,
  destination). A copy from a to b follows ``arr.routes[(a, b)]``: each hop runs on its
  lane in turn and takes ``arr.class_s[class, t]``; the blob is present on b when the
  last hop ends. A staged GPU -> GPU copy thus holds the source's D2H lane, then the
  destination's H2D lane; GPUs behind one PCIe switch share its lanes, so their copies
  queue. (Arrays without routes get one lane per ordered device pair.)
- An external output is copied to the host like any other blob (``outputs_on_host``).
- Parameters are present on every device from the start (the init net makes them).
- A blob read before the op that makes it runs (a train net's state as the previous
  step's update left it: ``placer.training.placement``) is present on its maker's device
  from the start and copied from there at time 0, like a host-fed blob.
The makespan is the end of the last item on any lane.

Search (``MakespanPartitioner``): three placements are scored: the serial plan (exact
min-cut on two devices, alpha-expansion on more, the memory-limited plan when
``arr.capacity`` is finite), HEFT (Topcuoglu, Hariri and Wu 2002: ops by decreasing
upward rank, each on the feasible device where it would finish first, copies queued on
the routes' lanes) and the same earliest-finish list scheduling in net order (the order
the executors issue ops in, which this simulator follows; it usually beats HEFT's order
here). A local search then moves single ops (whole colocation groups) from the best of
them to any feasible device while the simulated makespan drops, trying first the ops on
the current critical path (the chain of items each of which waited for the one before).
The serial plan is a candidate and moves are accepted only when they lower the makespan
(and keep every device within capacity), so the result is never worse than the serial
plan's makespan.
"""
from __future__ import annotations

import time

import numpy as np

from placer.partition.baselines import fastest_gpu
from placer.partition.expansion import expansion_placement
from placer.partition.explain import make_plan
from placer.partition.memory import MemoryPartitioner
from placer.partition.mincut import mincut_placement
from placer.partition.problem import PARAM, CostArrays, as_placement, copy_reads, fits, from_graph, respecting_pins

INF = float("inf")


class Simulator:
    """Scores placements of one net by simulated makespan (module docstring).

    Everything that does not depend on the placement is built once here; a run turns
    its placement into flat Python lists with numpy (the copies, the slot every read
    waits on, the hops of every copy) and then walks the ops once, O(reads + hops)."""

    def __init__(self, arr_or_graph):
        arr = self.arr = from_graph(arr_or_graph)
        k = arr.k
        ptr, ten = arr.consumed_by
        op_of = np.repeat(np.arange(arr.n_ops), np.diff(ptr))
        live = arr.t_producer[ten] != PARAM        # parameters are everywhere from the start
        self.read_t, self.read_op = ten[live], op_of[live]
        self.read_ptr = np.searchsorted(self.read_op, np.arange(arr.n_ops + 1))
        self.read_ptr_list = self.read_ptr.tolist()
        self.carried = _carried(arr)
        self.lane_names, self.route = _lanes_and_routes(arr)
        hops = max((len(r) for r in self.route.values()), default=1)
        self.route_len = np.zeros(k * k, np.int64)
        self.route_lane = np.zeros((k * k, hops), np.int64)
        self.route_class = np.zeros((k * k, hops), np.int64)
        for (a, b), route in self.route.items():
            self.route_len[a * k + b] = len(route)
            for h, (lane, cls) in enumerate(route):
                self.route_lane[a * k + b, h], self.route_class[a * k + b, h] = lane, cls

    @property
    def n_lanes(self) -> int:
        return len(self.lane_names)

    def placement(self, plan_or_dev) -> np.ndarray:
        return as_placement(self.arr, getattr(plan_or_dev, "placement", plan_or_dev))

    def score(self, plan_or_dev) -> float:
        return self.run(self.placement(plan_or_dev))[0]

    def timeline(self, plan_or_dev) -> list[dict]:
        return self.run(self.placement(plan_or_dev), record=True)[1]

    def run(self, dev, record: bool = False) -> tuple[float, list[dict]]:
        """(makespan_s, events). Events (only with ``record``), in issue order: dicts with
        lane, kind ("op"/"copy"), op (the op, or a copy's producer: None for a host-fed
        blob), tensor (name), src / dst (a copy's devices, by name), start_s, end_s, and
        waits_for: the index of the event whose end set this one's start (None at 0)."""
        run = _Run(self, self.placement(dev))
        if not record:
            return run.fast(), []
        makespan, items = run.items()
        return makespan, run.events(items)

    def critical_ops(self, dev) -> list[int]:
        """Ops on the critical path, latest first: from the item that ends last back along
        what each waited for; a copy on the path contributes its producer."""
        _, items = _Run(self, self.placement(dev)).items()
        j = max(range(len(items)), key=lambda x: items[x][4], default=-1)
        out: list[int] = []
        while j >= 0:
            if items[j][1] >= 0:
                out.append(items[j][1])
            j = items[j][5]
        return list(dict.fromkeys(out))


def _carried(arr: CostArrays) -> np.ndarray:
    """bool [T]: blobs read before their maker runs (there from the start, on its device)."""
    first = np.full(arr.n_tensors, arr.n_ops, np.int64)
    has = np.diff(arr.t_ptr) > 0
    if has.any():
        first[has] = np.minimum.reduceat(arr.t_cons, arr.t_ptr[:-1][has])
    return (arr.t_producer >= 0) & (first < arr.t_producer)


def _lanes_and_routes(arr: CostArrays) -> tuple[tuple[str, ...], dict]:
    """Lane names (devices first, then copy lanes) and every ordered pair's hops as
    (lane index into those names, link class)."""
    k = arr.k
    names = list(arr.devices) + list(arr.lanes)
    route = {}
    for a in range(k):
        for b in range(k):
            if a == b:
                continue
            hops = arr.routes.get((a, b))
            if hops is None:   # no machine routes: one direct lane per ordered pair
                names.append(f"{arr.devices[a]}->{arr.devices[b]}")
                hops = ((len(names) - 1 - k, int(arr.link_class[a, b])),)
            route[(a, b)] = tuple((k + int(lane), int(cls)) for lane, cls in hops)
    return tuple(names), route


class _Run:
    """One simulation: the placement's copies and read slots as flat lists.

    Slots of ``avail`` (when a blob is present where a reader needs it): 0..n-1 the end
    of op i (its blobs on its own device), n the blobs there from the start (time 0:
    host-fed ones on the host, carried state on its maker's device),
    n + 1 + c the end of copy c. Copies are numbered in issue order."""

    def __init__(self, sim: Simulator, dev: np.ndarray):
        arr, k, n = sim.arr, sim.arr.k, sim.arr.n_ops
        self.sim, self.n = sim, n
        t, d = _copies_needed(arr, dev)
        prod = arr.t_producer[t]
        when = np.where(sim.carried[t], -1, prod)        # issued after this op (-1: at time 0)
        issue = np.argsort(when, kind="stable")          # host-fed and carried first, then by producer
        t, d, prod, when = t[issue], d[issue], prod[issue], when[issue]
        s = np.where(prod >= 0, dev[np.maximum(prod, 0)], arr.host)
        self.copy_t, self.copy_src, self.copy_dst = t, s, d
        self.copy_ptr = np.searchsorted(when, np.arange(n + 1)).tolist()   # op i: [ptr[i], ptr[i+1])
        # the slot every read waits on: its producer's end, or the end of its copy
        rt, ro = sim.read_t, sim.read_op
        rdev = dev[ro]
        producer = arr.t_producer[rt]
        local = np.where(producer >= 0, dev[np.maximum(producer, 0)], arr.host) == rdev
        copy_of = np.empty(arr.n_tensors * k, np.int64)    # (tensor, device) -> copy number (sparse)
        copy_of[t * k + d] = np.arange(len(t))
        slot = np.where((producer >= 0) & ~sim.carried[rt], producer, n)
        slot[~local] = n + 1 + copy_of[rt[~local] * k + rdev[~local]]
        self.slot = slot.tolist()
        # the hops of every copy, flat
        pair = s * k + d
        count = sim.route_len[pair]
        hop_ptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
        which = np.repeat(np.arange(len(t)), count)
        h = np.arange(len(which)) - hop_ptr[which]
        self.hop_lane = sim.route_lane[pair[which], h].tolist()
        self.hop_s = arr.class_s[sim.route_class[pair[which], h], t[which]].tolist()
        self.hop_ptr = hop_ptr.tolist()
        self.dev = dev.tolist()
        self.cost = arr.op_s[np.arange(n), dev].tolist()

    def fast(self) -> float:
        n, dev, cost, slot, cp = self.n, self.dev, self.cost, self.slot, self.copy_ptr
        rp = self.sim.read_ptr_list
        lane = [0.0] * self.sim.n_lanes
        avail = [INF] * n + [0.0] + [INF] * len(self.copy_t)
        self._copies(0, cp[0], 0.0, lane, avail)
        for i in range(n):
            d = dev[i]
            ready = lane[d]
            for j in slot[rp[i]:rp[i + 1]]:
                if avail[j] > ready:
                    ready = avail[j]
            end = ready + cost[i]
            lane[d] = avail[i] = end
            if cp[i + 1] > cp[i]:
                self._copies(cp[i], cp[i + 1], end, lane, avail)
        return max(lane, default=0.0)

    def _copies(self, c0: int, c1: int, ready: float, lane: list, avail: list) -> None:
        hp, hl, hs, base = self.hop_ptr, self.hop_lane, self.hop_s, self.n + 1
        for c in range(c0, c1):
            at = ready
            for h in range(hp[c], hp[c + 1]):
                q = hl[h]
                at = (lane[q] if lane[q] > at else at) + hs[h]
                lane[q] = at
            avail[base + c] = at

    def items(self) -> tuple[float, list[tuple]]:
        """The walk of ``fast``, keeping every item as (lane, op, copy, start_s, end_s,
        waits_for): op items have copy -1; a copy's op is its producer (-1: the host);
        waits_for is the index of the item whose end set the start (-1: none)."""
        n, dev, cost, slot, cp = self.n, self.dev, self.cost, self.slot, self.copy_ptr
        rp = self.sim.read_ptr_list
        lane = [0.0] * self.sim.n_lanes
        last = [-1] * self.sim.n_lanes         # the item that last ran on each lane
        avail = [INF] * n + [0.0] + [INF] * len(self.copy_t)
        made_by = [-1] * len(avail)            # the item that made each slot available
        items: list[tuple] = []
        self._copy_items(0, cp[0], 0.0, -1, lane, last, avail, made_by, items)
        for i in range(n):
            d = dev[i]
            ready, why = lane[d], last[d]
            for j in slot[rp[i]:rp[i + 1]]:
                if avail[j] > ready:
                    ready, why = avail[j], made_by[j]
            end = ready + cost[i]
            lane[d] = avail[i] = end
            made_by[i] = last[d] = len(items)
            items.append((d, i, -1, ready, end, why))
            if cp[i + 1] > cp[i]:
                self._copy_items(cp[i], cp[i + 1], end, i, lane, last, avail, made_by, items)
        return max(lane, default=0.0), items

    def _copy_items(self, c0, c1, ready, producer, lane, last, avail, made_by, items) -> None:
        hp, hl, hs, base = self.hop_ptr, self.hop_lane, self.hop_s, self.n + 1
        for c in range(c0, c1):
            at, why = ready, (made_by[producer] if producer >= 0 else -1)
            for h in range(hp[c], hp[c + 1]):
                q = hl[h]
                start = at
                if lane[q] > at:
                    start, why = lane[q], last[q]
                at = start + hs[h]
                lane[q] = at
                items.append((q, producer, c, start, at, why))
                why = last[q] = len(items) - 1
            avail[base + c], made_by[base + c] = at, why

    def events(self, items: list[tuple]) -> list[dict]:
        """``Simulator.run``'s event dicts from ``items``."""
        arr, names = self.sim.arr, self.sim.lane_names
        out = []
        for q, op, c, start, end, why in items:
            copy = c >= 0
            out.append({"lane": names[q], "kind": "copy" if copy else "op",
                        "op": op if op >= 0 else None,
                        "tensor": arr.tensor_name(int(self.copy_t[c])) if copy else None,
                        "bytes": float(arr.t_bytes[self.copy_t[c]]) if copy else None,
                        "src": arr.devices[self.copy_src[c]] if copy else None,
                        "dst": arr.devices[self.copy_dst[c]] if copy else None,
                        "start_s": start, "end_s": end, "waits_for": why if why >= 0 else None})
        return out


def _copies_needed(arr: CostArrays, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tensor, destination) of every copy, sorted: ``problem.copy_pairs`` with the
    duplicates dropped through a [tensors x devices] mark array instead of a sort (the
    simulator's hot path)."""
    k = arr.k
    t, d, _ = copy_reads(arr, dev)
    mark = np.zeros(arr.n_tensors * k, bool)
    mark[t * k + d] = True
    key = np.flatnonzero(mark)
    return key // k, key % k


# ---------------------------------------------------------------------- HEFT

def upward_rank(arr: CostArrays) -> np.ndarray:
    """HEFT's upward rank: an op's mean time over its feasible devices plus the longest
    (mean copy + rank) over its readers. The mean copy time of a blob is its copy time
    averaged over all k x k ordered device pairs, 0 on the diagonal (producer and reader
    on independent, uniformly drawn devices)."""
    n, k = arr.n_ops, arr.k
    ok = arr.feasible
    w = np.where(ok, arr.op_s, 0.0).sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    off = ~np.eye(k, dtype=bool)
    comm = (arr.class_s[arr.link_class[off]].sum(axis=0) / k ** 2 if k > 1
            else np.zeros(arr.n_tensors))
    et = arr.entry_tensor
    made = (arr.t_producer[et] >= 0) & ~_carried(arr)[et]   # carried state waits for no one
    u, v, c = arr.t_producer[et][made], arr.t_cons[made], comm[et][made]
    order = np.argsort(u, kind="stable")
    u, v, c = u[order], v[order].tolist(), c[order].tolist()
    ptr = np.searchsorted(u, np.arange(n + 1)).tolist()
    rank = [0.0] * n
    wl = w.tolist()
    for i in range(n - 1, -1, -1):   # readers come later in net order
        best = 0.0
        for e in range(ptr[i], ptr[i + 1]):
            x = c[e] + rank[v[e]]
            if x > best:
                best = x
        rank[i] = wl[i] + best
    return np.asarray(rank)


def heft_placement(arr: CostArrays, sim: Simulator | None = None) -> np.ndarray:
    """The placement a HEFT list schedule picks: ops by decreasing upward rank (ties in
    net order, so producers come first); see ``list_schedule``."""
    n = arr.n_ops
    return list_schedule(arr, np.lexsort((np.arange(n), -upward_rank(arr))), sim)


def list_schedule(arr: CostArrays, order, sim: Simulator | None = None) -> np.ndarray:
    """Earliest-finish list scheduling: ops in ``order`` (producers before readers), each
    on the feasible device where it would finish first given the lanes so far, its
    missing inputs copied over their routes from the producer's device (once per
    destination). In net order this is the simulator's own issue order."""
    sim = sim or Simulator(arr)
    n = arr.n_ops
    order = np.asarray(order).tolist()
    options = _options(arr)
    comp = arr.component.tolist()
    group_dev: dict[int, int] = {}
    cost = arr.op_s.tolist()
    reads = _reads_with_producers(arr, sim)
    state = _ListState(sim, n)
    for i in order:
        choices = [group_dev[comp[i]]] if comp[i] in group_dev else options[i]
        best = None
        for d in choices:
            c, lane_free = cost[i][d], state.lane[d]
            if best is not None and (lane_free + c, c) >= best[:2]:
                continue                  # cannot finish first, whatever its inputs
            ready, pending, new = state.inputs_ready(reads[i], d)
            finish = (lane_free if lane_free > ready else ready) + c
            if best is None or (finish, c) < best[:2]:
                best = (finish, c, d, pending, new)
        finish, _, d, pending, new = best
        group_dev.setdefault(comp[i], d)
        state.commit(i, d, finish, pending, new)
    return np.asarray(state.dev, np.int64)


def _reads_with_producers(arr: CostArrays, sim: Simulator) -> list[list[tuple[int, int]]]:
    """Per op, the (tensor, producer, carried) triples it reads (no parameters)."""
    pairs = list(zip(sim.read_t.tolist(), arr.t_producer[sim.read_t].tolist(),
                     sim.carried[sim.read_t].tolist()))
    rp = sim.read_ptr_list
    return [pairs[rp[i]:rp[i + 1]] for i in range(arr.n_ops)]


class _ListState:
    """The list schedule so far: each placed op's device and end, the lanes' ends and
    the copies made (tensor * k + device -> arrival)."""

    def __init__(self, sim: Simulator, n: int):
        arr = sim.arr
        self.k, self.host = arr.k, arr.host
        self.dev, self.end = [-1] * n, [0.0] * n
        self.lane = [0.0] * sim.n_lanes
        self.copied: dict[int, float] = {}
        self.route = [sim.route.get((a, b), ()) for a in range(arr.k) for b in range(arr.k)]
        used = {cls for route in self.route for _, cls in route}
        self.class_row = {cls: arr.class_s[cls].tolist() for cls in used}   # per hop class

    def inputs_ready(self, reads, d: int) -> tuple[float, dict | None, list | None]:
        """When every input of an op would be on device ``d``: (time, tentative lane ends,
        new copies), copies queued behind each other on shared lanes."""
        k, dev, end, lane, copied = self.k, self.dev, self.end, self.lane, self.copied
        ready, pending, new = 0.0, None, None
        for t, p, carried in reads:
            if p < 0:
                src, at = self.host, 0.0
            elif carried:                 # state from the previous step, at its maker's device
                if dev[p] < 0:
                    continue              # whose device is not chosen yet: not priced here
                src, at = dev[p], 0.0
            else:
                src, at = dev[p], end[p]
            if src != d:
                got = copied.get(t * k + d)
                if got is None:
                    if pending is None:
                        pending, new = {}, []
                    for q, cls in self.route[src * k + d]:
                        free = pending.get(q, lane[q])
                        at = (free if free > at else at) + self.class_row[cls][t]
                        pending[q] = at
                    new.append((t * k + d, at))
                else:
                    at = got
            if at > ready:
                ready = at
        return ready, pending, new

    def commit(self, i: int, d: int, finish: float, pending, new) -> None:
        self.dev[i], self.end[i], self.lane[d] = d, finish, finish
        if pending:
            for q, at in pending.items():
                self.lane[q] = at
            self.copied.update(new)


def _options(arr: CostArrays) -> list[list[int]]:
    """The feasible devices of every op (rows with the same pattern share one list)."""
    ok = arr.feasible
    patterns, which = np.unique(ok, axis=0, return_inverse=True)
    lists = [np.flatnonzero(row).tolist() for row in patterns]
    return [lists[w] for w in np.ravel(which).tolist()]


# ---------------------------------------------------------------------- local search

MIN_RUNS = 10   # the local search needs time for this many simulations, else it is skipped


def local_search(arr: CostArrays, sim: Simulator, dev: np.ndarray, makespan_s: float,
                 time_s: float = 2.0, keep_fit: bool = False,
                 run_s: float = 0.0) -> tuple[np.ndarray, float, dict]:
    """Move single ops (whole colocation groups) to other feasible devices while the
    makespan drops, the ops on the critical path tried first; each accepted move
    restarts the sweep from the new critical path. ``keep_fit``: a move must also keep
    every device within ``arr.capacity``. ``run_s``: the time of one simulation, when
    the caller has measured it (on the largest nets fewer than ``MIN_RUNS`` fit in
    ``time_s``, and the search is skipped). Returns (placement, makespan_s, stats)."""
    x = as_placement(arr, dev).copy()
    best = makespan_s
    deadline = time.perf_counter() + time_s
    stats = {"tried": 0, "accepted": 0, "skipped": run_s * MIN_RUNS > time_s}
    if stats["skipped"]:
        return x, best, stats
    options = _options(arr)
    groups = _groups(arr)
    free = np.flatnonzero(arr.feasible.sum(axis=1) > 1)
    while time.perf_counter() < deadline:
        first = [i for i in sim.critical_ops(x) if len(options[i]) > 1]
        rest = np.setdiff1d(free, first)
        improved = False
        for i in first + rest[::-1].tolist():   # later ops first: they end the run
            group = groups.get(int(arr.component[i]), [i]) if groups else [i]
            here = int(x[i])
            for d in sorted((d for d in options[i] if d != here), key=lambda d: arr.op_s[i, d]):
                if time.perf_counter() > deadline:
                    return x, best, stats
                x[group] = d
                m = sim.score(x)
                stats["tried"] += 1
                if m < best * (1 - 1e-12) and (not keep_fit or fits(arr, x)):
                    best, improved = m, True
                    stats["accepted"] += 1
                    break
                x[group] = here
            if improved:
                break
        if not improved:
            break
    return x, best, stats


def _groups(arr: CostArrays) -> dict[int, np.ndarray]:
    """Colocation component -> its ops (only components of two or more ops)."""
    if len(arr.colocate) == 0:
        return {}
    comp = arr.component
    order = np.argsort(comp, kind="stable")
    bounds = np.flatnonzero(np.diff(comp[order])) + 1
    return {int(comp[g[0]]): g for g in np.split(order, bounds) if len(g) > 1}


# ---------------------------------------------------------------------- the partitioner

def serial_placement(arr: CostArrays) -> np.ndarray:
    """The serial objective's plan: exact min-cut on two devices, alpha-expansion on
    more, the memory-limited search when any device has a finite capacity."""
    if np.isfinite(arr.capacity).any():
        return MemoryPartitioner(milp_time_limit=0).partition(arr).placement
    if arr.k == 1:
        return np.zeros(arr.n_ops, np.int64)
    if arr.k == 2:
        return mincut_placement(arr)
    return expansion_placement(arr)[0]


class MakespanPartitioner:
    """Minimise the simulated makespan (module docstring). ``start``: the serial plan's
    placement when the caller has it already (else it is computed)."""

    method = "makespan"

    def __init__(self, time_s: float = 2.0, start=None):
        self.time_s = time_s
        self.start = start

    def search(self, arr: CostArrays, sim: Simulator | None = None) -> tuple[np.ndarray, float, str]:
        """(placement, makespan_s, note): the search without the Plan around it."""
        sim = sim or Simulator(arr)
        limited = bool(np.isfinite(arr.capacity).any())
        base = serial_placement(arr) if self.start is None else respecting_pins(arr, self.start)
        t0 = time.perf_counter()
        base_ms = sim.score(base)
        run_s = time.perf_counter() - t0
        tried = {"the serial plan": (base, base_ms)}
        starts = [("HEFT", heft_placement(arr, sim)),
                  ("list scheduling in net order", list_schedule(arr, np.arange(arr.n_ops), sim))]
        one_gpu = fastest_gpu(arr)
        if one_gpu != arr.host:   # so that the plan is never slower than everything on one GPU
            starts.append(("everything on one GPU", respecting_pins(arr, np.full(arr.n_ops, one_gpu))))
        for name, x in starts:
            tried[name] = (x, sim.score(x) if not limited or fits(arr, x) else INF)
        first = min(tried, key=lambda name: tried[name][1])   # the serial plan on ties
        x, ms, stats = local_search(arr, sim, *tried[first], self.time_s, keep_fit=limited, run_s=run_s)
        gain = 100 * (base_ms - ms) / base_ms if base_ms > 0 else 0.0
        others = "; ".join(f"{name} {m:.6g} s" if m < INF else f"{name}: does not fit in device memory"
                           for name, (_, m) in tried.items() if name != "the serial plan")
        search = (f"no local search (one simulation takes {run_s:.2g} s), {first} kept" if stats["skipped"]
                  else f"local search from {first}: {stats['accepted']} of {stats['tried']} moves accepted")
        return x, ms, f"makespan {ms:.6g} s; serial plan {base_ms:.6g} s ({gain:.1f}% better); {others}; {search}"

    def partition(self, arr_or_graph):
        arr = from_graph(arr_or_graph)
        sim = Simulator(arr)
        x, _, note = self.search(arr, sim)
        plan = make_plan(arr, x, self.method, objective="makespan", notes=[note])
        plan.makespan_s, plan.timeline = sim.run(x, record=True)
        return plan


__all__ = ["Simulator", "MakespanPartitioner", "heft_placement", "list_schedule", "local_search",
           "upward_rank", "serial_placement"]
