"""Placement within per-device memory limits: Lagrangian prices + repair + local moves,
and an exact MILP (HiGHS) that proves the optimum or bounds the gap.

Memory model (``problem.device_memory``): on every device d, the parameters read there
+ the peak over op steps of live activation bytes there must stay within
``arr.capacity[d]`` (usable bytes, reserve already taken off; inf: no limit, typically
the host). The problem is NP-hard; the heuristic is fast, the MILP is exact.

Lagrangian: device d gets a price lam_d, and op i an extra cost lam_d * w[i, d] for
running on d, with w[i, d] the bytes it brings there (parameters it reads, blobs it
writes) priced over the steps where d is over its limit (see ``lagrangian``). The
relaxed problem is the serial one plus these per-(op, device) prices, solved by the
exact two-device min-cut (``FlowNetwork``) when k == 2 and by alpha-expansion
(``expansion_placement(arr, extra=...)``) when k >= 3. The prices are bisected (one
multiplier, per-device relative prices adjusted between rounds) until the cheapest
relaxed plan that fits everywhere is found. A repair moves ops off each over-full
device, the smallest compute time added per byte freed first, to their cheapest other
device with room; on several GPUs, the unconstrained plan cut into blocks that fit the
GPUs (``spread``) is one more start. Then moves that lower the cost and keep every device
within its limit are applied: single ops (colocation groups) to another device, runs of
2-4 ops exchanged between two devices, swaps between two devices, and (small nets)
windows of 16 ops re-solved with the rest held (exactly by min-cut on two devices). On a
CPU + one GPU machine this is the single-GPU search unchanged.

MILP (``milp``): one-hot x[i, d], copy variables per tensor and destination, and the
liveness of every blob per device with monotone chains, exact at binary x.
"""
from __future__ import annotations

import time

import numpy as np

from placer.errors import InfeasiblePlanError
from placer.partition.expansion import energy, expand, expansion_placement
from placer.partition.explain import make_plan
from placer.partition.milp import milp_partition, vars_within
from placer.partition.mincut import PIN_CPU, PIN_GPU, FlowNetwork, TwoDeviceView
from placer.partition.problem import (SLACK, CostArrays, check_pinned_fit, device_memory, memory_use, move_delta,
                                      move_deltas, respecting_pins, serial_cost)

def over_limit(arr: CostArrays, dev: np.ndarray) -> np.ndarray:
    """bool [k]: devices whose memory exceeds their capacity under ``dev``."""
    return memory_use(arr, dev) > arr.capacity * SLACK


class Relaxation:
    """The serial problem plus per-(op, device) prices ``extra`` [n, k]: exact min-cut on
    two devices, alpha-expansion on more (warm-started from ``warm`` placements)."""

    def __init__(self, arr: CostArrays):
        self.arr = arr
        if arr.k == 2:
            self.view = TwoDeviceView(arr, arr.host, 1 - arr.host)
            self.net = FlowNetwork(self.view)

    def solve(self, extra: np.ndarray | None = None, warm: list | None = None) -> np.ndarray:
        """The relaxed optimum (two devices) or the best expansion result: from every
        start of ``expansion_placement`` without ``warm`` placements, else from them and
        the all-host placement only (prices change little between two solves)."""
        arr = self.arr
        if arr.k == 2:
            a, b = self.view.a, self.view.b
            on_b, _ = self.net.solve(None if extra is None else extra[:, b] - extra[:, a])
            return self.view.placement(on_b)
        if not warm:
            return expansion_placement(arr, extra=extra)[0]
        tried = [expand(arr, s, extra)[0] for s in warm + [np.full(arr.n_ops, arr.host)]]
        return min(tried, key=lambda f: energy(arr, f, extra))

    def window(self, x: np.ndarray, inside: slice, extra: np.ndarray) -> np.ndarray:
        """The relaxed problem with every op outside ``inside`` held where ``x`` puts it:
        exact by min-cut on two devices, alpha-expansion from ``x`` on more (a colocation
        group moves only when all of it is inside)."""
        arr = self.arr
        if arr.k == 2:
            view = self.view
            fixed = np.where(x == view.b, PIN_GPU, PIN_CPU).astype(np.int8)
            fixed[inside] = view.forced[inside]
            on_b, _ = self.net.solve(extra[:, view.b] - extra[:, view.a], fixed=fixed, ref=x == view.b)
            return view.placement(on_b)
        outside = np.ones(arr.n_ops, bool)
        outside[inside] = False
        comp = arr.component
        held = np.bincount(comp, weights=outside, minlength=comp.max() + 1)[comp] > 0
        return expand(arr, x, extra, frozen=held)[0]


class MemoryPartitioner:
    """Serial objective within every device's usable memory (``arr.capacity``)."""

    def __init__(self, milp_time_limit: float = 10.0, milp_max_vars: int = 400_000,
                 improve_time_s: float = 2.0):
        self.milp_time_limit = milp_time_limit
        self.milp_max_vars = milp_max_vars
        self.improve_time_s = improve_time_s

    def partition(self, arr: CostArrays):
        method = "mincut-memory" if arr.k == 2 else "expansion-memory"
        solver = Relaxation(arr)
        free_opt = solver.solve()
        if not over_limit(arr, free_opt).any():
            exact = arr.k == 2
            notes = ["the unconstrained " + ("optimum" if exact else "alpha-expansion plan")
                     + " fits in every device's memory"]
            if exact:
                return make_plan(arr, free_opt, method, optimal=True, gap=0.0, notes=notes)
            return self._prove(arr, free_opt, method, notes)
        check_pinned_fit(arr)
        dev = search(arr, solver, free_opt, self.improve_time_s)
        heur = serial_cost(arr, dev).total_s if dev is not None else np.inf
        notes, optimal, gap = [f"Lagrangian + repair: {heur:.6g} s"], False, None
        if self.milp_time_limit > 0:
            res = milp_partition(arr, self.milp_time_limit,
                                 min(self.milp_max_vars, vars_within(self.milp_time_limit)))
            notes.append(res["note"])
            if (res["x"] is not None and serial_cost(arr, res["x"]).total_s < heur
                    and not over_limit(arr, res["x"]).any()):
                dev = res["x"]
            if dev is None and res["status"] == "infeasible":
                raise InfeasiblePlanError(f"no placement satisfies the pins and the memory limits: {res['note']}",
                                          hint="unpin some ops, or give the devices more memory (--gpu-mem, "
                                               "--gpu-reserve, the machine profile)")
            if res["bound"] is not None and dev is not None:
                total = serial_cost(arr, dev).total_s
                gap = max(0.0, (total - res["bound"]) / total) if total > 0 else 0.0
                optimal = res["optimal"] and gap <= 1e-9
        if dev is None:
            over = over_limit(arr, repair(arr, free_opt))
            names = ", ".join(arr.devices[d] for d in np.flatnonzero(over))
            raise InfeasiblePlanError(f"no placement found that fits the memory of {names}",
                                      hint="give the devices more memory, unpin ops, or raise --time-limit")
        return make_plan(arr, dev, method, optimal=optimal, gap=gap, notes=notes)


    def _prove(self, arr: CostArrays, dev: np.ndarray, method: str, notes: list[str]):
        """On three or more devices alpha-expansion has no guarantee: the MILP (sized to its
        time limit, ``milp.vars_within``) proves its plan optimal, finds a better one, or
        bounds the gap."""
        optimal, gap = False, None
        if self.milp_time_limit > 0:
            res = milp_partition(arr, self.milp_time_limit,
                                 min(self.milp_max_vars, vars_within(self.milp_time_limit)))
            notes.append(res["note"])
            total = serial_cost(arr, dev).total_s
            if res["x"] is not None and not over_limit(arr, res["x"]).any():
                milp_total = serial_cost(arr, res["x"]).total_s
                if milp_total < total * (1 - 1e-12):
                    notes.append(f"the MILP's plan is {100 * (total - milp_total) / total:.3g}% shorter "
                                 "than alpha-expansion's")
                    dev, total = res["x"], milp_total
            if res["bound"] is not None:
                gap = max(0.0, (total - res["bound"]) / total) if total > 0 else 0.0
                optimal = res["optimal"] and gap <= 1e-9
        return make_plan(arr, dev, method, optimal=optimal, gap=gap, notes=notes)


def search(arr: CostArrays, solver: Relaxation, free_opt: np.ndarray, improve_time_s: float):
    """The heuristic (module docstring): the cheapest placement it finds that fits every
    device, or None."""
    # a relaxed solve is one min-cut on two devices, ~(k - 1) x a few on more: each
    # costs ~0.2 s at 100k ops and ~5 s at 1M per cut, so fewer of them on big nets
    work = arr.n_ops * max(arr.k - 1, 1)
    small = work <= 20_000   # window re-solves cost a whole relaxed solve each: small nets only
    steps = 12 if small else 6 if work <= 200_000 else 4
    starts, prices = lagrangian(arr, solver, free_opt, steps=steps, rounds=3 if small else 1)
    starts = _distinct(arr, [x for x in starts if not over_limit(arr, x).any()])[:4]
    if arr.k > 2:     # several GPUs: the unconstrained plan cut into blocks that fit
        starts += [x for x in [spread(arr, free_opt)] if not over_limit(arr, x).any()]
    if not starts:
        return None
    share = improve_time_s / (2 * len(starts) + 1)
    tried = [improve(arr, x, share) for x in starts]
    if small:
        tried = [windows(arr, solver, x, prices[-1], share) for x in tried]
    best = min(tried, key=lambda x: serial_cost(arr, x).total_s)
    return improve(arr, best, share)


def lagrangian(arr: CostArrays, solver: Relaxation, free_opt: np.ndarray,
               steps: int = 12, rounds: int = 3) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Starting placements: per round, the cheapest one met while bisecting the prices
    that fits everywhere, and the last one that did not, repaired; and the prices
    (lam_d * w[:, d], an [n, k] array) each round ended with.

    The limit of device d holds at every op step s, so each step gets a price mu[d, s]
    (summing to 1 over s) and op i's cost on d grows by lam_d * w[i, d]: the bytes of
    the parameters it reads (live at every step), + bytes of each blob it writes times the
    price of the steps the blob lives, + bytes it writes beyond its blobs times the price
    of its own step. The prices are lam_d = t * scale_d * rel_d, one multiplier t bisected
    per round (as on one GPU), ``scale_d`` making a price of 1 comparable to the op times,
    and rel_d the devices' relative prices: 1 for every device that has been over its
    limit, 0 for the others. Round 1 prices the steps where the unconstrained optimum
    exceeds each limit; each later round moves half of a device's step prices to where
    the last plan that did not fit exceeded it, doubles rel_d of the devices still over
    there and halves it for those with room left in the cheapest plan that fits.
    """
    mu = _excess(arr, free_opt, None)
    rel = over_limit(arr, free_opt).astype(float)
    starts, prices = [], []
    for _ in range(rounds):
        w = _op_weights(arr, mu)
        found, tight, lam = _bisect(arr, solver, w, rel, steps)
        starts += found
        prices.append(lam[None, :] * w)
        if tight is None:
            break
        mu = _excess(arr, tight, mu)
        rel = _reweigh(arr, rel, tight, found[0] if found else None)
    return starts, prices


def _excess(arr: CostArrays, x: np.ndarray, mu: np.ndarray | None) -> np.ndarray:
    """[k, n] step prices: per device, where x exceeds its limit (uniform where it does
    not), half-mixed with the previous prices."""
    params, curve, _ = device_memory(arr, x, curves=True)
    over = np.maximum(curve + params[:, None] - arr.capacity[:, None], 0)
    total = over.sum(axis=1, keepdims=True)
    n = max(arr.n_ops, 1)
    new = np.where(total > 0, over / np.where(total > 0, total, 1), 1.0 / n)
    if mu is None:
        return new
    return np.where(total > 0, 0.5 * mu + 0.5 * new, mu)


def _op_weights(arr: CostArrays, mu: np.ndarray) -> np.ndarray:
    """[n, k]: the bytes each op brings to each device, priced by step (``lagrangian``)."""
    n, k = arr.n_ops, arr.k
    last = np.full(arr.n_tensors, -1, np.int64)
    has = np.diff(arr.t_ptr) > 0
    if has.any():
        last[has] = np.maximum.reduceat(arr.t_cons, arr.t_ptr[:-1][has])
    made = np.flatnonzero(arr.t_producer >= 0)
    p = arr.t_producer[made]
    end = np.maximum(last[made], p)
    w = np.zeros((n, k))
    for d in range(k):
        cum = np.concatenate([[0.0], np.cumsum(mu[d])])
        act = np.bincount(p, weights=arr.t_bytes[made] * (cum[end + 1] - cum[p]), minlength=n)
        w[:, d] = arr.read_param_bytes * cum[-1] + act + arr.scratch_bytes * mu[d]
    return w


def _reweigh(arr, rel, tight, best):
    """Relative prices for the next round (``lagrangian``), the largest 1."""
    rel = rel.copy()
    over = over_limit(arr, tight)
    rel[over] = np.where(rel[over] > 0, 2 * rel[over], 1.0)
    if best is not None:
        room = memory_use(arr, best) < 0.9 * arr.capacity
        rel[room] *= 0.5
    return rel / rel.max() if rel.max() > 0 else rel


def _bisect(arr, solver, w, rel, steps):
    """Bisect the multiplier t of the prices t * scale * rel (``lagrangian``): grow it
    until the relaxed plan fits everywhere, then halve the bracket ``steps`` times. A
    device that goes over its limit while unpriced gets rel 1. Returns the placements
    found (the cheapest that fits, the last that did not, repaired), the last that did
    not fit (or None) and the prices lam [k] of the smallest t that fitted."""
    finite = np.where(np.isfinite(arr.op_s), arr.op_s, np.nan)
    spread = float(np.nansum(np.nanmax(finite, axis=1) - np.nanmin(finite, axis=1))) if arr.n_ops else 0.0
    scale = max(spread, 1e-12) / np.maximum(w.sum(axis=0), 1.0)
    rel = rel.copy()
    host_only = respecting_pins(arr, np.full(arr.n_ops, arr.host))
    best = host_only if not over_limit(arr, host_only).any() else None
    best_cost = serial_cost(arr, best).total_s if best is not None else np.inf
    lo, hi, tight, warm = 0.0, 1.0, None, None

    def relaxed(t):
        nonlocal warm
        x = solver.solve(t * scale * rel * w, warm)
        warm = [x]
        over = over_limit(arr, x)
        rel[over & (rel == 0)] = 1.0
        return x, over.any()
    for _ in range(40):  # grow hi until the relaxed plan fits
        x, over = relaxed(hi)
        if not over:
            best, best_cost = _better(arr, x, best, best_cost)
            break
        lo, tight, hi = hi, x, hi * 4
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        x, over = relaxed(mid)
        if not over:
            best, best_cost = _better(arr, x, best, best_cost)
            hi = mid
        else:
            lo, tight = mid, x
    found = ([best] if best is not None else []) + ([repair(arr, tight)] if tight is not None else [])
    return found, tight, hi * scale * rel


def _distinct(arr, starts):
    """Starting placements without repeats, cheapest first."""
    seen, out = set(), []
    for x in sorted(starts, key=lambda x: serial_cost(arr, x).total_s):
        key = x.tobytes()
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def _better(arr, x, best, best_cost):
    c = serial_cost(arr, x).total_s
    return (x.copy(), c) if c < best_cost else (best, best_cost)


def windows(arr: CostArrays, solver: Relaxation, dev: np.ndarray, price: np.ndarray,
            time_s: float, width: int = 16) -> np.ndarray:
    """Re-solve windows of consecutive ops with the rest held (``Relaxation.window``),
    with the memory prices at 0, 1/2 and 1 times the Lagrangian ones; keep what lowers
    the cost and fits. Moves whole blocks that single-op moves cannot."""
    x = dev.copy()
    cost = serial_cost(arr, x).total_s
    deadline = time.perf_counter() + time_s
    for start in range(0, max(arr.n_ops - width // 2, 1), width // 2):
        for mult in (0.0, 0.5, 1.0):
            if time.perf_counter() > deadline:
                return x
            y = solver.window(x, slice(start, start + width), mult * price)
            c = serial_cost(arr, y).total_s
            if c < cost * (1 - 1e-12) and not over_limit(arr, y).any():
                x, cost = y, c
    return x


def spread(arr: CostArrays, dev: np.ndarray) -> np.ndarray:
    """Cut the ops of each over-full device into blocks that fit: the device keeps the
    longest run of its ops (in net order) that fits it, the rest go, block by block, to
    the other devices of its kind with a limit, each taking the longest next block that
    fits it (a device's memory only grows with the ops it takes, so each block's end is
    found by bisection); what is left goes to the host, and the result is repaired
    (``repair``) where an op could not go there. Where linear memory
    prices see no reason to share a load between equal GPUs, this does."""
    x = dev.copy()
    comp = arr.component
    for d in np.argsort(-(memory_use(arr, x) - arr.capacity)).tolist():
        if not over_limit(arr, x)[d]:
            continue
        ops = np.flatnonzero((x == d) & (arr.forced < 0))
        kept = _longest(arr, x, ops, d, keep=True)
        rest = ops[kept:]
        others = [e for e in range(arr.k) if e != d and np.isfinite(arr.capacity[e])
                  and arr.device_kinds[e] == arr.device_kinds[d]]
        for e in sorted(others, key=lambda e: memory_use(arr, x)[e] / max(arr.capacity[e], 1.0)):
            rest = rest[x[rest] == d]
            fit = rest[arr.feasible[rest, e]]
            take = _longest(arr, x, fit, e, keep=False)
            moved = np.isin(comp, comp[fit[:take]])
            x[moved] = e
        left = rest[x[rest] == d]
        x[np.isin(comp, comp[left])] = arr.host
    return repair(arr, respecting_pins(arr, x))


def _longest(arr: CostArrays, x: np.ndarray, ops: np.ndarray, d: int, keep: bool) -> int:
    """The largest m such that device d fits with ops[:m] on it: keeping them there and
    moving ops[m:] off to the host (``keep``), or moving ops[:m] to it."""
    comp = arr.component

    def placed(m):
        y = x.copy()
        if keep:
            y[np.isin(comp, comp[ops[m:]])] = arr.host
        else:
            y[np.isin(comp, comp[ops[:m]])] = d
        return y
    lo, hi = 0, len(ops)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if memory_use(arr, placed(mid))[d] <= arr.capacity[d] * SLACK:
            lo = mid
        else:
            hi = mid - 1
    return lo


def repair(arr: CostArrays, dev: np.ndarray) -> np.ndarray:
    """Move ops off every over-full device, worst first, until each fits (or no op can
    move): see ``_repair_device``. A repaired device takes no ops from later repairs, so
    ops never move back and forth; a device without a limit always has room."""
    x = dev.copy()
    closed = np.zeros(arr.k, bool)
    for _ in range(arr.k):
        over = over_limit(arr, x) & ~closed
        if not over.any():
            break
        excess = memory_use(arr, x) - arr.capacity
        d = int(np.flatnonzero(over)[np.argmax(excess[over])])
        closed[d] = True
        x = _repair_device(arr, x, d, closed)
    return x


def _repair_device(arr: CostArrays, x: np.ndarray, d: int, closed: np.ndarray) -> np.ndarray:
    """Move ops off device d, each (with its colocation group) to the other device where
    moving it alone costs least among those open with room for its bytes, the smallest
    compute time added per byte freed first. Moving ops off d never makes d's memory
    grow, so the shortest prefix of that order that fits is found by bisection (log n
    memory evaluations)."""
    k = arr.k
    bytes_ = arr.read_param_bytes + arr.written_bytes + 1.0
    room = arr.capacity - memory_use(arr, x)
    deltas = np.column_stack([move_deltas(arr, x, e) for e in range(k)])
    ok = arr.feasible & ~closed[None, :] & (room[None, :] >= bytes_[:, None])
    ok[:, d] = False
    alt = np.where(ok.any(axis=1), np.where(ok, deltas, np.inf).argmin(axis=1), -1)
    movable = np.flatnonzero((x == d) & (arr.forced < 0) & (alt >= 0))
    ratio = np.maximum(arr.op_s[movable, alt[movable]] - arr.op_s[movable, d], 0) / bytes_[movable]
    order = movable[np.argsort(ratio, kind="stable")]
    comp = arr.component

    def moved(j):
        dest = np.full(comp.max() + 1 if len(comp) else 0, -1, np.int64)
        head = order[:j][::-1]           # the first op of a group in the order decides
        dest[comp[head]] = alt[head]
        to = dest[comp]
        return np.where(to >= 0, to, x)

    def fits_d(y):
        return memory_use(arr, y)[d] <= arr.capacity[d] * SLACK
    lo, hi = 0, len(order)
    if not fits_d(moved(hi)):
        return moved(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits_d(moved(mid)):
            hi = mid
        else:
            lo = mid + 1
    return moved(lo)


def improve(arr: CostArrays, dev: np.ndarray, time_s: float) -> np.ndarray:
    """Moves that lower the cost and keep every device within its limit, until none is
    left or time is up: single ops (colocation groups) to another device, runs of 2-4
    consecutive ops exchanged between two devices (on two devices: flipped; each run is
    tried once, in the first passes, as they are many), and swaps of an op that wants a
    device with an op there that is cheap to move elsewhere."""
    x = dev.copy()
    deadline = time.perf_counter() + time_s
    free = np.flatnonzero(arr.forced < 0)
    finite = np.where(np.isfinite(arr.op_s), arr.op_s, np.nan)
    gain = (np.nanmax(finite, axis=1) - np.nanmin(finite, axis=1)) if arr.n_ops else np.zeros(0)
    order = free[np.argsort(-gain[free])]
    groups = [_group(arr, i) for i in order]
    size = np.bincount(arr.component)
    runs = (np.arange(i, i + m) for m in (2, 3, 4) for i in range(arr.n_ops - m + 1)
            if (arr.forced[i:i + m] < 0).all()       # a run never splits a colocated group
            and (size[arr.component[i:i + m]] == 1).all())
    for _ in range(6):
        moved = any([_single_moves(arr, x, groups, deadline),
                     _run_moves(arr, x, runs, deadline),
                     _swaps(arr, x, order, deadline)])
        if not moved or time.perf_counter() > deadline:
            break
    return x


def _group(arr: CostArrays, i: int) -> np.ndarray:
    return arr.group_of(i) if len(arr.colocate) else np.array([i])


def _apply(arr, x, moves: list[tuple[np.ndarray, int]]) -> bool:
    """Apply moves (ops, device), one after the other, in place if together they lower
    the cost and every device they go to still fits (the devices they leave only shrink);
    else leave ``x`` as it was."""
    before = [(ops, x[ops].copy()) for ops, _ in moves]   # what the moves change, not all of x
    delta = 0.0
    for ops, to in moves:
        if len(ops):
            delta += move_delta(arr, x, ops, to)[0]
            x[ops] = to
    if delta < -1e-15:
        use = memory_use(arr, x)
        if all(use[to] <= arr.capacity[to] * SLACK for _, to in moves):
            return True
    for ops, was in reversed(before):
        x[ops] = was
    return False


def _single_moves(arr, x, groups, deadline) -> bool:
    """Each op (its group) to its most promising other device, then its second if that
    one looks cheaper than staying (on two devices: the other device, always tried)."""
    moved = False
    k = arr.k
    deltas = np.column_stack([move_deltas(arr, x, e) for e in range(k)]) if k > 2 else None
    for ops in groups:
        if time.perf_counter() > deadline:
            break
        here = int(x[ops[0]])
        if k == 2:
            targets = [1 - here]
        else:
            cand = [e for e in np.argsort(deltas[ops[0]], kind="stable").tolist()
                    if e != here and arr.feasible[ops[0], e]]
            targets = cand[:1] + [e for e in cand[1:2] if deltas[ops[0], e] < 0]
        for to in targets:
            if _apply(arr, x, [(ops, to)]):
                moved = True
                break
    return moved


def _run_moves(arr, x, runs, deadline) -> bool:
    """Runs of consecutive free ops exchanged between two devices a and b (ops on a go to
    b and ops on b to a), for pairs among the run's devices and its neighbours': moves a
    block of ops that only pays together."""
    moved = False
    n = arr.n_ops
    for ops in runs:
        if time.perf_counter() > deadline:
            break
        near = {int(x[j]) for j in (ops[0] - 1, ops[-1] + 1) if 0 <= j < n}
        mine = set(x[ops].tolist())
        pairs = [(a, b) for a in sorted(mine | near) for b in sorted(mine | near)
                 if a < b and (a in mine or b in mine)]
        for a, b in pairs:
            on_a, on_b = ops[x[ops] == a], ops[x[ops] == b]
            if not (arr.feasible[on_a, b].all() and arr.feasible[on_b, a].all()):
                continue
            if _apply(arr, x, [(on_a, b), (on_b, a)]):
                moved = True
                break
    return moved


def _swaps(arr, x, order, deadline, k: int = 25) -> bool:
    """For each device with a limit: pair an op whose move there would pay but does not
    fit with an op there whose move to its best other device frees room cheaply."""
    moved = False
    for to in np.flatnonzero(np.isfinite(arr.capacity)).tolist():
        d_in = move_deltas(arr, x, to)
        want = order[(x[order] != to) & arr.feasible[order, to]]
        want = [int(i) for i in want[np.argsort(d_in[want])][:k] if d_in[i] < 0]
        if not want:
            continue
        others = [e for e in range(arr.k) if e != to]
        d_out = np.column_stack([np.where(arr.feasible[:, e], move_deltas(arr, x, e), np.inf)
                                 for e in others])
        there = order[x[order] == to]
        leave = there[np.argsort(d_out[there].min(axis=1))][:k].tolist()
        for a in want:
            for b in leave:
                if time.perf_counter() > deadline or x[a] == to or x[b] != to:
                    break
                dest = others[int(np.argmin(d_out[b]))]
                if _apply(arr, x, [(_group(arr, b), dest), (_group(arr, a), to)]):
                    moved = True
                    break
    return moved


__all__ = ["MemoryPartitioner", "Relaxation", "search", "lagrangian", "repair",
           "spread", "improve", "windows", "over_limit"]
