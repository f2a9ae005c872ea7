"""Searching for the layouts: TorchRec's greedy, local search, and the exact MILP.

An **assignment** gives each table a layout and, for a layout whose shards are still to
be placed, the rank positions of its shards. Its step is the step model's
(``sharding.step``) on the sum of the layouts' loads; an assignment that does not fit a
GPU's memory (dense part + shards > usable) or the host's scores infinity.

- ``torchrec_greedy``: TorchRec's planner as published (``planner/proposers.py``,
  ``partitioners.py``, ``perf_models.py``): per table its layouts sorted by perf (the
  largest shard's, or the sum of shards'); proposals from ``GreedyProposer`` (both sorts:
  start from every table's best, then advance the table with the largest storage to its
  next layout, until none is left) and ``UniformProposer`` (one sharding type for all);
  each proposal partitioned by ``GreedyPerfPartitioner`` (row-wise and data-parallel on
  their ranks, then shards largest storage first, each on the rank with the least perf
  so far that has room) and rated by ``NoopPerfModel`` (max over ranks of the summed
  shard perf). Kernels fused / fused_uvm / fused_uvm_caching only (no host kernel), perf
  and storage from placer's estimator. It gives no bound.
- ``local_search``: from the best of several starts, moves one table to another layout
  or rank(s), or swaps the ranks of two tables' shards, while the step improves.
- ``milp_assignment``: the step model written exactly as a MILP (one binary per table
  and layout, one per table, layout and rank holding a shard; one variable per max of
  the module docstring of ``sharding.step``), memory rows per GPU and for the host,
  solved by HiGHS (scipy.optimize.milp) within a time limit, with the heuristic's step as
  a cutoff (scipy's HiGHS takes no starting solution, so the cutoff is how the heuristic
  seeds it): the result is never worse and comes with HiGHS's bound.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from placer.sharding.cost import Layout, Load, ShardEstimator
from placer.sharding.step import StepModel
from placer.sharding.types import HOST, ROW_WISE, TABLE_WISE

MAX_POSITION_SETS = 24      # column-wise shards: rank sets tried per layout in local search
MS, MIB, GIB = 1e3, 2.0 ** 20, 2.0 ** 30


@dataclass(frozen=True)
class Choice:
    layout: int                         # index into the table's layouts
    positions: tuple[int, ...] = ()     # rank positions of its shards (placed layouts)


class Search:
    """Assignments over one estimator's layouts, scored by its step model."""

    def __init__(self, est: ShardEstimator, layouts: list[list[Layout]] | None = None):
        self.est = est
        self.model = StepModel(est)
        self.layouts = layouts if layouts is not None else [est.layouts(t) for t in range(len(est.tables))]
        self._loads: dict[tuple[int, Choice], Load] = {}

    # -- scoring ------------------------------------------------------------------------------

    def load(self, t: int, c: Choice) -> Load:
        key = (t, c)
        if key not in self._loads:
            self._loads[key] = self.est.load_of(self.layouts[t][c.layout], c.positions)
        return self._loads[key]

    def total(self, assignment: list[Choice]) -> Load:
        total = Load.zeros(self.est.k)
        for t, c in enumerate(assignment):
            total = total + self.load(t, c)
        return total

    def fits(self, load: Load) -> bool:
        return bool(np.all(self.est.dense_bytes + load.hbm <= self.est.capacity + 1e-6)
                    and load.ddr <= self.est.host_capacity)

    def score(self, assignment: list[Choice]) -> float:
        load = self.total(assignment)
        return self.model.time(load) if self.fits(load) else math.inf

    def overflow(self, assignment: list[Choice]) -> tuple[str, float, float]:
        """(device, bytes needed, bytes usable) of the device most over its memory."""
        load = self.total(assignment)
        need = self.est.dense_bytes + load.hbm
        over = need - self.est.capacity
        p = int(np.argmax(over))
        names = self.est.machine.names
        if load.ddr - self.est.host_capacity > over[p]:
            return names[self.est.host], load.ddr, self.est.host_capacity
        return names[self.est.ranks[p]], float(need[p]), float(self.est.capacity[p])

    # -- choices of one table -----------------------------------------------------------------------

    def choices(self, t: int, ef_load: np.ndarray | None = None) -> list[Choice]:
        """Every way to lay table t out: each layout, each rank (set) for its shards."""
        out = []
        k = self.est.k
        for i, lay in enumerate(self.layouts[t]):
            if lay.shards == 0:
                out.append(Choice(i))
            elif lay.shards == 1:
                out += [Choice(i, (p,)) for p in range(k)]
            else:
                sets = list(itertools.islice(itertools.combinations(range(k), lay.shards), MAX_POSITION_SETS + 1))
                if len(sets) > MAX_POSITION_SETS:
                    load = np.zeros(k) if ef_load is None else ef_load
                    least = tuple(sorted(np.argsort(load, kind="stable")[:lay.shards].tolist()))
                    sets = sets[:MAX_POSITION_SETS - 1] + [least]
                out += [Choice(i, s) for s in sets]
        return out

    def named(self, t: int, sharding: str, kernel: str) -> list[int]:
        return [i for i, lay in enumerate(self.layouts[t]) if lay.sharding_type == sharding and lay.kernel == kernel]


# ------------------------------------------------------------------ starts and baselines

def uniform(search: Search, sharding: str, kernel: str) -> list[Choice] | None:
    """Every table with the same layout (data-parallel, host, row-wise over all ranks)."""
    out = []
    for t in range(len(search.layouts)):
        idx = [i for i in search.named(t, sharding, kernel) if search.layouts[t][i].shards == 0
               and (sharding != ROW_WISE or len(search.layouts[t][i].group) == search.est.k)]
        if not idx:
            return None
        out.append(Choice(idx[0]))
    return out


def table_wise_on_one(search: Search, kernel: str = "hbm") -> list[Choice] | None:
    """Every table whole on the first rank (one GPU)."""
    out = []
    for t in range(len(search.layouts)):
        idx = search.named(t, TABLE_WISE, kernel)
        if not idx:
            return None
        out.append(Choice(idx[0], (0,)))
    return out


def balanced_start(search: Search, sharding: str | None = None) -> list[Choice]:
    """Largest tables first, each on the choice that lengthens the step least and fits
    (of layouts of one sharding type and the host kernel, with ``sharding``)."""
    n = len(search.layouts)
    order = sorted(range(n), key=lambda t: -search.est.tables[t].nbytes)
    chosen: dict[int, Choice] = {}
    total = Load.zeros(search.est.k)
    for t in order:
        best, best_s = None, math.inf
        for c in search.choices(t, total.ef + total.eb):
            lay = search.layouts[t][c.layout]
            if sharding is not None and lay.sharding_type != sharding and lay.kernel != HOST:
                continue
            trial = total + search.load(t, c)
            if not search.fits(trial):
                continue
            s = search.model.time(trial)
            if s < best_s:
                best, best_s = c, s
        if best is None:  # nothing fits: the smallest-footprint choice, reported as infeasible later
            best = min(search.choices(t), key=lambda c: float(search.load(t, c).hbm.max()))
        chosen[t] = best
        total = total + search.load(t, best)
    return [chosen[t] for t in range(n)]


# ------------------------------------------------------------------ local search

def multi_start(search: Search, starts: list[list[Choice]], time_limit_s: float = 5.0) -> tuple[list[Choice], float]:
    """Local search from each start (an equal share of the time each), the best result."""
    best, best_s = None, math.inf
    feasible = [a for a in starts if math.isfinite(search.score(a))]
    for j, start in enumerate(sorted(feasible, key=search.score)):
        a, s = local_search(search, start, time_limit_s / max(len(feasible), 1))
        if s < best_s:
            best, best_s = a, s
    return best, best_s


def local_search(search: Search, start: list[Choice], time_limit_s: float = 5.0) -> tuple[list[Choice], float]:
    """First-improvement moves (one table's choice; two tables' shard ranks swapped)."""
    deadline = time.monotonic() + time_limit_s
    current = list(start)
    total = search.total(current)
    best = search.model.time(total) if search.fits(total) else math.inf
    order = sorted(range(len(current)), key=lambda t: -search.est.tables[t].nbytes)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for t in order:
            base = total + _neg(search.load(t, current[t]))
            for c in search.choices(t, base.ef + base.eb):
                if c == current[t]:
                    continue
                trial = base + search.load(t, c)
                if not search.fits(trial):
                    continue
                s = search.model.time(trial)
                if s < best - 1e-12:
                    current[t], total, best, improved = c, trial, s, True
                    base = total + _neg(search.load(t, current[t]))
            if time.monotonic() > deadline:
                break
        if not improved:
            improved, current, total, best = _swaps(search, current, total, best, deadline)
    return current, best


def _swaps(search: Search, current, total, best, deadline):
    """Two single-shard tables on different ranks trade ranks."""
    single = [t for t, c in enumerate(current) if len(c.positions) == 1]
    for a, b in itertools.combinations(single, 2):
        ca, cb = current[a], current[b]
        if ca.positions == cb.positions:
            continue
        na, nb = Choice(ca.layout, cb.positions), Choice(cb.layout, ca.positions)
        trial = total + _neg(search.load(a, ca)) + _neg(search.load(b, cb)) + search.load(a, na) + search.load(b, nb)
        if search.fits(trial):
            s = search.model.time(trial)
            if s < best - 1e-12:
                current = list(current)
                current[a], current[b] = na, nb
                return True, current, trial, s
        if time.monotonic() > deadline:
            break
    return False, current, total, best


def _neg(load: Load) -> Load:
    return Load(-load.ef, -load.eb, -load.send, -load.idx, -load.hbm, -load.cpu_f, -load.cpu_b, -load.host_w,
                -load.ddr, -load.of_s, -load.ob_s, 0.0, 0.0)


# ------------------------------------------------------------------ TorchRec's greedy

class PartitionError(Exception):
    """A proposal whose shards do not fit (TorchRec's PlannerError of the partitioner)."""


def torchrec_greedy(search: Search) -> list[Choice] | None:
    """TorchRec's proposers + GreedyPerfPartitioner + NoopPerfModel (module docstring).
    Each layout's keys (storage, perf per shard) are computed once, and the proposer
    finds the table to advance from a heap: the same proposals as TorchRec's scan of every
    table per step, in O(log tables) instead of O(tables) a step."""
    n = len(search.layouts)
    options = [[i for i, lay in enumerate(search.layouts[t]) if lay.kernel != HOST] for t in range(n)]
    if not all(options):        # TorchRec has no host kernel: a table laid out only on the host
        return None
    keys = _LayoutKeys(search)
    best, best_rating = None, math.inf
    seen: set[tuple[int, ...]] = set()
    for proposal in _proposals(search, options, keys):
        key = tuple(proposal)
        if key in seen:
            continue
        seen.add(key)
        try:
            placed, rating = _partition(search, proposal, keys)
        except PartitionError:
            continue
        if rating < best_rating:
            best, best_rating = placed, rating
    return best


def _score(lay: Layout, use_depth: bool) -> float:
    perfs = _shard_perfs(lay)
    return max(perfs) if use_depth else sum(perfs)


def _shard_perfs(lay: Layout) -> list[float]:
    """Perf totals of the layout's shards (unplaced shards as on the first rank)."""
    if lay.shards:
        return [lay.perf[0].total] * lay.shards
    return [lay.perf[p].total for p in (lay.group or [0])]


def _storage(lay: Layout) -> tuple[float, float, float, float]:
    """(max hbm, sum hbm, max ddr, sum ddr) over the shards: GreedyProposer's key."""
    shards = [lay.storage[0]] * lay.shards if lay.shards else [lay.storage[p] for p in (lay.group or [0])]
    hbm, ddr = [s.hbm_bytes for s in shards], [s.ddr_bytes for s in shards]
    return max(hbm), sum(hbm), max(ddr), sum(ddr)


class _LayoutKeys:
    """The greedy's keys of layout ``i`` of table ``t``, computed on first use: storage
    (``_storage``), its partition sort key, and per rank the HBM bytes and perf total."""

    def __init__(self, search: Search):
        self.search = search
        self._storage: dict[tuple[int, int], tuple] = {}
        self._placing: dict[tuple[int, int], tuple] = {}

    def storage(self, t: int, i: int) -> tuple[float, float, float, float]:
        got = self._storage.get((t, i))
        if got is None:
            got = self._storage[(t, i)] = _storage(self.search.layouts[t][i])
        return got

    def placing(self, t: int, i: int) -> tuple:
        """(shards, group, hbm bytes per rank, perf per rank, partition sort key)."""
        got = self._placing.get((t, i))
        if got is None:
            lay = self.search.layouts[t][i]
            ranks = range(len(lay.storage))
            got = self._placing[(t, i)] = (
                lay.shards, tuple(lay.group), [lay.storage[p].hbm_bytes for p in ranks],
                [lay.perf[p].total for p in ranks], (self.storage(t, i)[1], sum(_shard_perfs(lay))))
        return got


_NO_STORAGE = (0.0, 0.0, 0.0, 0.0)


def _proposals(search: Search, options: list[list[int]], keys: _LayoutKeys | None = None):
    keys = keys or _LayoutKeys(search)
    n = len(options)
    for use_depth in (True, False):     # GreedyProposer(), GreedyProposer(use_depth=False)
        ranked = [sorted(opts, key=lambda i, t=t: _score(search.layouts[t][i], use_depth)) for t, opts in enumerate(options)]
        index = [0] * n
        # the table whose current option has the largest storage advances (the first such
        # table on ties; one with no storage never does), among those with a next option
        heap = []
        for t in range(n):
            if len(ranked[t]) > 1:
                st = keys.storage(t, ranked[t][0])
                if st > _NO_STORAGE:
                    heap.append((tuple(-x for x in st), t))
        heapq.heapify(heap)
        while True:
            yield [ranked[t][index[t]] for t in range(n)]
            if not heap:
                break
            _, t = heapq.heappop(heap)
            index[t] += 1
            if index[t] + 1 < len(ranked[t]):
                st = keys.storage(t, ranked[t][index[t]])
                if st > _NO_STORAGE:
                    heapq.heappush(heap, (tuple(-x for x in st), t))
    kinds = {(lay.sharding_type, len(lay.group)) for t in range(n) for i in options[t] for lay in [search.layouts[t][i]]}
    for kind in sorted(kinds):          # UniformProposer: one sharding type for every table
        best = []
        for t in range(n):
            same = [i for i in options[t] if (search.layouts[t][i].sharding_type, len(search.layouts[t][i].group)) == kind]
            if not same:
                break
            best.append(min(same, key=lambda i, t=t: _score(search.layouts[t][i], True)))
        else:
            yield best


def _partition(search: Search, proposal: list[int], keys: _LayoutKeys | None = None) -> tuple[list[Choice], float]:
    """GreedyPerfPartitioner (sort by storage) and the NoopPerfModel rating. Python floats
    and lists throughout (the same double arithmetic as arrays, without their per-call
    cost: this runs once per proposal, for every table)."""
    keys = keys or _LayoutKeys(search)
    est = search.est
    k = est.k
    hbm_left = (np.asarray(est.capacity, float) - est.dense_bytes).tolist()
    perf = [0.0] * k
    choice: dict[int, Choice] = {}
    placed = []
    for t, i in enumerate(proposal):
        shards, group, hbm, perfs, sort_key = keys.placing(t, i)
        if shards == 0:   # uniform (and host-group) layouts first, on their ranks
            for p in group:
                hbm_left[p] -= hbm[p]
                perf[p] += perfs[p]
            choice[t] = Choice(i)
        else:
            placed.append((sort_key, t, i, shards, hbm, perfs))
    if any(h < -1e-6 for h in hbm_left):
        raise PartitionError("uniform layouts do not fit")
    placed.sort(key=lambda x: x[0], reverse=True)
    for _, t, i, shards, hbm, perfs in placed:
        used: list[int] = []
        for _ in range(shards):
            for p in sorted(range(k), key=lambda r: (perf[r], r)):   # least perf so far, then the lower rank
                if p in used:
                    continue
                if hbm[p] <= hbm_left[p] + 1e-6:
                    hbm_left[p] -= hbm[p]
                    perf[p] += perfs[p]
                    used.append(p)
                    break
            else:
                raise PartitionError(f"no rank has room for a shard of table {t}")
        choice[t] = Choice(i, tuple(sorted(used)))
    return [choice[t] for t in range(len(proposal))], float(max(perf))


# ------------------------------------------------------------------ the exact MILP

@dataclass
class MilpResult:
    assignment: list[Choice] | None
    step_s: float | None
    bound_s: float | None
    optimal: bool
    status: str
    seconds: float


class _Program:
    """Variables with bounds and integrality, and sparse rows lo <= a.v <= hi."""

    def __init__(self):
        self.lb, self.ub, self.integer, self.cost = [], [], [], []
        self.r, self.c, self.v, self.lo, self.hi = [], [], [], [], []

    def var(self, lb=0.0, ub=math.inf, integer=False, cost=0.0) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(1 if integer else 0)
        self.cost.append(cost)
        return len(self.lb) - 1

    def row(self, terms: dict[int, float], lo: float, hi: float) -> None:
        k = len(self.lo)
        for col, val in terms.items():
            if val != 0.0:
                self.r.append(k)
                self.c.append(col)
                self.v.append(val)
        self.lo.append(lo)
        self.hi.append(hi)

    def solve(self, time_limit_s: float, relax: bool = False):
        a = coo_matrix((self.v, (self.r, self.c)), shape=(len(self.lo), len(self.lb))).tocsr()
        integrality = np.zeros(len(self.lb)) if relax else np.array(self.integer)
        with _quiet_stdout():
            return milp(np.array(self.cost), integrality=integrality,
                        bounds=Bounds(np.array(self.lb), np.array(self.ub)),
                        constraints=[LinearConstraint(a, np.array(self.lo), np.array(self.hi))],
                        options={"time_limit": max(time_limit_s, 0.01), "disp": False, "mip_rel_gap": 1e-9})


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS's C++ writes notes on a cutoff-bound search to the process's stdout even with
    ``disp`` off; they would land in the middle of ``placer shard``'s tables."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):   # a captured stdout has no descriptor
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def _add(expr: dict[int, float], terms: dict[int, float], scale: float = 1.0) -> dict[int, float]:
    for col, val in terms.items():
        expr[col] = expr.get(col, 0.0) + scale * val
    return expr


def milp_assignment(search: Search, cutoff_s: float | None = None, time_limit_s: float = 10.0) -> MilpResult:
    """The step model's optimum over every assignment (module docstring). Times in ms,
    buffers in MiB and memory in GiB inside the program."""
    est, model = search.est, search.model
    k, n = est.k, len(search.layouts)
    prog = _Program()
    z: list[list[int]] = []           # z[t][i]: table t takes layout i
    y: dict[tuple[int, int, int], int] = {}   # (t, i, p): a shard of that layout on position p
    arrays = {name: [dict() for _ in range(k)] for name in ("ef", "eb", "send", "idx", "hbm")}
    scalars = {name: {} for name in ("cpu_f", "cpu_b", "host_w", "ddr", "of_s", "ob_s")}
    w_in, w_out, w_host = prog.var(0, 1, True), prog.var(0, 1, True), prog.var(0, 1, True)
    for t in range(n):
        zt = []
        for i, lay in enumerate(search.layouts[t]):
            zi = prog.var(0, 1, True)
            zt.append(zi)
            _loads_into(arrays, scalars, lay.fixed, zi)
            if lay.fixed.a2a_in:
                prog.row({w_in: 1, zi: -1}, 0, math.inf)
            if lay.fixed.a2a_out:
                prog.row({w_out: 1, zi: -1}, 0, math.inf)
            if lay.kernel == HOST:
                prog.row({w_host: 1, zi: -1}, 0, math.inf)
            if lay.shards:
                ys = {}
                for p in range(k):
                    yv = prog.var(0, 1, True)
                    y[(t, i, p)] = yv
                    ys[yv] = 1.0
                    prog.row({yv: 1, zi: -1}, -math.inf, 0)     # a shard only where the layout is taken
                    for name in arrays:
                        val = getattr(lay.per_shard, name)[p]
                        if val:
                            arrays[name][p][yv] = arrays[name][p].get(yv, 0.0) + val
                prog.row({**ys, zi: -float(lay.shards)}, 0, 0)   # as many ranks as shards
        prog.row({zi: 1 for zi in zt}, 1, 1)
        z.append(zt)
    units = {"ef": MS, "eb": MS, "send": 1 / MIB, "idx": 1 / MIB, "hbm": 1 / GIB}
    for name, unit in units.items():
        for p in range(k):
            arrays[name][p] = {c: v * unit for c, v in arrays[name][p].items()}
    sunits = {"cpu_f": MS, "cpu_b": MS, "host_w": 1.0, "ddr": 1 / GIB, "of_s": MS, "ob_s": MS}
    for name, unit in sunits.items():
        scalars[name] = {c: v * unit for c, v in scalars[name].items()}
    # memory
    for p in range(k):
        prog.row(arrays["hbm"][p], -math.inf, (est.capacity[p] - est.dense_bytes) / GIB + 1e-9)
    if math.isfinite(est.host_capacity):
        prog.row(scalars["ddr"], -math.inf, est.host_capacity / GIB + 1e-9)
    # interchangeable ranks carry non-increasing lookup seconds (any plan permutes to one that does)
    for p, q in _interchangeable_pairs(search):
        prog.row(_add(_add(_add(dict(arrays["ef"][p]), arrays["eb"][p]), arrays["ef"][q], -1), arrays["eb"][q], -1),
                 0, math.inf)
    # maxima over ranks
    ef_m, send_m, idx_m = prog.var(), prog.var(), prog.var()
    for p in range(k):
        prog.row(_add({ef_m: 1.0}, arrays["ef"][p], -1.0), 0, math.inf)
        prog.row(_add({send_m: 1.0}, arrays["send"][p], -1.0), 0, math.inf)
        prog.row(_add({idx_m: 1.0}, arrays["idx"][p], -1.0), 0, math.inf)
    alpha, beta = est.a2a
    a_in = {w_in: alpha * MS, idx_m: beta * MIB * MS}
    a_out = {w_out: alpha * MS, send_m: beta * MIB * MS}
    q = model.queue
    # S >= A_in + EF + A_of ; S >= cpu_f + H2D_r
    S = prog.var()
    prog.row(_add(_add(_add({S: 1.0}, a_in, -1), {ef_m: -1.0}), _add(dict(a_out), scalars["of_s"]), -1), 0, math.inf)
    b = est.b
    for p in range(k):
        terms = _add({S: 1.0, w_host: -model.h2d_lat[p] * MS}, scalars["cpu_f"], -1)
        prog.row(_add(terms, scalars["host_w"], -b * model.h2d_coef[p] * MS), 0, math.inf)
    # T = S + max(F_before, o_e) + A_ob
    T = prog.var()
    a_ob = _add(dict(a_out), scalars["ob_s"])
    prog.row(_add({T: 1.0, S: -1.0}, a_ob, -1), max(q.before_finish_s, q.exchange_ready_s) * MS,
             max(q.before_finish_s, q.exchange_ready_s) * MS)
    C = prog.var()
    prog.row({C: 1.0, T: -1.0}, q.after_s * MS, math.inf)
    if math.isfinite(q.after_finish_s):
        prog.row({C: 1.0, S: -1.0}, q.after_finish_s * MS, math.inf)
    Z = prog.var(cost=1.0, ub=math.inf if cutoff_s is None else cutoff_s * MS * (1 + 1e-9) + 1e-9)
    for p in range(k):
        do = model.DO[p] * MS
        prog.row(_add({Z: 1.0, S: -1.0}, arrays["eb"][p], -1), (model.DF[p] + model.DB[p]) * MS + do, math.inf)
        prog.row(_add({Z: 1.0, T: -1.0}, arrays["eb"][p], -1), do, math.inf)
        prog.row({Z: 1.0, C: -1.0}, do, math.inf)
        back = _add(_add({Z: 1.0, S: -1.0, w_host: -model.d2h_lat[p] * MS}, scalars["host_w"],
                         -b * model.d2h_coef[p] * MS), scalars["cpu_b"], -1)
        prog.row(back, (model.DF[p] + model.exchange_at[p]) * MS, math.inf)
    start = time.monotonic()
    res = prog.solve(time_limit_s)
    seconds = time.monotonic() - start
    status = {0: "optimal", 1: "time limit", 2: "infeasible"}.get(res.status, "failed")
    bound = getattr(res, "mip_dual_bound", None)
    if (bound is None or not np.isfinite(bound)) and res.status == 1:
        relaxed = prog.solve(time_limit_s, relax=True)   # the LP relaxation bounds the optimum too
        bound = relaxed.fun if relaxed.status == 0 else None
    bound_s = float(bound) / MS if bound is not None and np.isfinite(bound) else None
    if res.x is None:
        return MilpResult(None, None, bound_s, False, status, seconds)
    x = res.x
    assignment = []
    for t in range(n):
        i = int(np.argmax([x[zi] for zi in z[t]]))
        lay = search.layouts[t][i]
        positions = tuple(p for p in range(k) if lay.shards and x[y[(t, i, p)]] > 0.5)
        assignment.append(Choice(i, positions))
    step = search.score(assignment)
    optimal = res.status == 0
    return MilpResult(assignment, step, step if optimal else bound_s, optimal, status, seconds)


def _interchangeable_pairs(search: Search) -> list[tuple[int, int]]:
    """Consecutive rank positions that every per-rank figure of the model treats alike."""
    est, model = search.est, search.model
    per_rank = [model.DF, model.DB, model.DO, model.exchange_at, model.h2d_lat, model.h2d_coef, model.d2h_lat,
                model.d2h_coef, est.capacity]
    per_rank += [getattr(lay.per_shard, f) for lays in search.layouts for lay in lays if lay.per_shard is not None
                 for f in ("ef", "eb", "send", "idx", "hbm")]
    per_rank += [getattr(lay.fixed, f) for lays in search.layouts for lay in lays for f in ("ef", "eb", "send", "idx", "hbm")]
    pairs = []
    for p in range(est.k - 1):
        if all(np.isclose(a[p], a[p + 1], rtol=1e-12, atol=0.0) for a in per_rank):
            pairs.append((p, p + 1))
    return pairs


def _loads_into(arrays, scalars, load: Load, var: int) -> None:
    for name in arrays:
        vals = getattr(load, name)
        for p, val in enumerate(vals):
            if val:
                arrays[name][p][var] = arrays[name][p].get(var, 0.0) + float(val)
    for name in scalars:
        val = getattr(load, name)
        if val:
            scalars[name][var] = scalars[name].get(var, 0.0) + float(val)


def brute_force(search: Search) -> tuple[list[Choice] | None, float]:
    """Every assignment scored (tests: tiny problems only)."""
    per_table = [search.choices(t) for t in range(len(search.layouts))]
    best, best_s = None, math.inf
    for combo in itertools.product(*per_table):
        s = search.score(list(combo))
        if s < best_s:
            best, best_s = list(combo), s
    return best, best_s


