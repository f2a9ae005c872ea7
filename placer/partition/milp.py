"""The placement problem over k devices as a mixed-integer program for HiGHS
(scipy.optimize.milp): the optimum, or a bound on it, of the serial objective within
per-device memory limits.

Variables lie in [0, 1]; only x is integer. L(a, b) is the copy time of a tensor from
device a to device b (``CostArrays.copy_s``).
- x[i, d] = 1 when op i runs on device d, for every (i, d) with ``feasible[i, d]``
  (pins are the variables that do not exist); sum_d x[i, d] = 1; colocated ops a, b have
  x[a, d] = x[b, d].
- "t is read on e": Y[t, e] >= x[v, e] for every reader v of t that may run on e (the x
  of a single reader stands for it); 1 for an external output read back on the host.
- copies: a tensor fed from the host costs L(host, e) Y[t, e] for every e != host. A
  tensor made by op u costs sum over s != e of L(s, e) W[t, s, e], with
      sum_{s != e} W[t, s, e] >= Y[t, e] - x[u, e]    (read on e and not made there)
      W[t, s, e] <= x[u, s]                             (the copy leaves u's device)
  (the second row is dropped where u has a single possible source). At binary x the
  least W is 1 exactly for s = u's device and each e != s that t is read on: one copy per
  tensor and destination, priced by its source's link, as ``problem.serial_cost`` says.
  Parameters are never copied.
Memory, per device d with a finite capacity: ``problem.device_memory``'s model, exactly.
- parameters: G[t, d] >= x[v, d] for readers v; P_d = sum_t bytes_t G[t, d].
- an activation t made by op p with readers r_1 < ... < r_m that may run on d (readers
  come after their producer in net order) is live on d at step p when x[p, d] (the
  ``written_bytes`` of p, scratch included, sit on x[p, d] in row p), and after p while a
  reader on d is still to come and either t was made on d or a reader on d came before.
  With the monotone chains F_j = OR x[r_1..r_j, d] (F_j >= F_j-1, F_j >= x[r_j, d]) and
  B_j = OR x[r_j..r_m, d] (B_j >= B_j+1, B_j >= x[r_j, d]), the steps after p fall into
  segments (p, r_1), {r_1}, (r_1, r_2), ..., {r_m} with constant F and B; one variable per
  segment, S >= x[p, d] + B - 1 and S >= F + B - 1 (F = 0 before r_1), carries t's bytes
  into the rows of its steps. A host-fed tensor is the same without x[p, d]. An output
  kept on its device (``outputs_on_host`` False) and made on d lives to the end: S >=
  x[p, d] in its segments, and a running sum K_i of such bytes past the last reader.
- one row per step i: P_d + segment bytes at i + written_bytes_i x[i, d] + K_i
  <= capacity_d (rows in MiB).
At binary x the least feasible G, F, B, S, K give exactly ``device_memory``'s bytes.
Interchangeable devices (same op times, feasibility and links) without a memory limit
are collapsed to the first of them (``_collapsed``), and those with one are used in
order (``_symmetry_rows``): both keep the optimum and spare HiGHS the relabelled copies
of every placement.
Without finite capacities this is the problem the min-cut (two devices) and
alpha-expansion (more) solve, which makes it their independent exactness check.

HiGHS stops at an absolute gap of 1e-6 (objective units): the objective is scaled so a
reference placement costs 1e3, making that 1e-9 of it; the relative gap is ``REL_GAP``.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from placer.errors import InfeasiblePlanError, PlacerError
from placer.partition.expansion import interchangeable
from placer.partition.explain import make_plan
from placer.partition.problem import HOST, PARAM, CostArrays, check_pinned_fit
from placer.types import Plan

REL_GAP = 1e-7          # HiGHS stops when (incumbent - bound) / incumbent <= this
OBJECTIVE_SCALE = 1e3   # a reference placement's objective after scaling


class _Program:
    """Variables (cost, bounds, integrality) and sparse rows lo <= a.v <= hi, built up as
    arrays of triplets."""

    def __init__(self):
        self.cost, self.lb, self.ub, self.integer = [], [], [], []
        self.n_vars = 0
        self.r, self.c, self.v, self.lo, self.hi = [], [], [], [], []
        self.n_rows = 0

    def variables(self, count: int, cost=0.0, lb=0.0, ub=1.0, integer=False) -> np.ndarray:
        ids = self.n_vars + np.arange(count)
        self.n_vars += count
        self.cost.append(np.broadcast_to(np.asarray(cost, float), (count,)))
        self.lb.append(np.broadcast_to(np.asarray(lb, float), (count,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, float), (count,)))
        self.integer.append(np.full(count, 1 if integer else 0))
        return ids

    def row(self, cols, vals, lo: float, hi: float) -> None:
        self.r.append(np.full(len(cols), self.n_rows))
        self.c.append(np.asarray(cols, np.int64))
        self.v.append(np.asarray(vals, float))
        self.lo.append(lo)
        self.hi.append(hi)
        self.n_rows += 1

    def rows(self, row_of_entry, cols, vals, lo, hi) -> None:
        """Many rows at once: entries (local row, col, val); lo/hi per local row."""
        lo, hi = np.atleast_1d(lo).astype(float), np.atleast_1d(hi).astype(float)
        self.r.append(self.n_rows + np.asarray(row_of_entry, np.int64))
        self.c.append(np.asarray(cols, np.int64))
        self.v.append(np.asarray(vals, float))
        self.lo.extend(lo.tolist())
        self.hi.extend(hi.tolist())
        self.n_rows += len(lo)

    def at_least(self, big, small) -> None:
        """Rows big >= small, elementwise over two index arrays."""
        big, small = np.asarray(big, np.int64), np.asarray(small, np.int64)
        m = len(big)
        self.rows(np.repeat(np.arange(m), 2), np.column_stack([big, small]).ravel(),
                  np.tile([1.0, -1.0], m), np.zeros(m), np.full(m, np.inf))

    def solve(self, time_limit: float):
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
        a = coo_matrix((cat(self.v, float), (cat(self.r, np.int64), cat(self.c, np.int64))),
                       shape=(self.n_rows, self.n_vars)).tocsr()
        cons = [LinearConstraint(a, np.array(self.lo, float), np.array(self.hi, float))] if self.n_rows else []
        return milp(cat(self.cost, float), integrality=cat(self.integer, np.int64),
                    bounds=Bounds(cat(self.lb, float), cat(self.ub, float)), constraints=cons,
                    options={"time_limit": max(float(time_limit), 0.0), "disp": False,
                             "mip_rel_gap": REL_GAP})


def _reference_cost(arr: CostArrays) -> float:
    """A positive scale for the objective: the summed per-op fastest times plus the
    cheapest copy of every tensor (never 0 unless everything is free)."""
    best = np.where(arr.feasible, arr.op_s, np.inf).min(axis=1) if arr.n_ops else np.zeros(0)
    ref = float(best.sum())
    if arr.n_tensors and arr.k > 1:
        off = ~np.eye(arr.k, dtype=bool)
        ref += float(arr.class_s[np.unique(arr.link_class[off])].min(axis=0).sum())
    return ref if ref > 0 else 1.0


def _placement_rows(arr: CostArrays, prog: _Program, scale: float) -> np.ndarray:
    """x, one-hot and colocation rows; returns the x index per (op, device), -1 where
    the op may not run."""
    n, k = arr.n_ops, arr.k
    feasible = arr.feasible & _collapsed(arr)[None, :]
    xi = np.full((n, k), -1, np.int64)
    xi[feasible] = prog.variables(int(feasible.sum()), cost=arr.op_s[feasible] * scale, integer=True)
    ops, _ = np.nonzero(feasible)
    prog.rows(ops, xi[feasible], np.ones(len(ops)), np.ones(n), np.ones(n))
    for a, b in arr.colocate.tolist():
        for d in np.flatnonzero(feasible[a] & feasible[b]).tolist():
            prog.row([xi[a, d], xi[b, d]], [1.0, -1.0], 0.0, 0.0)
    return xi


def _collapsed(arr: CostArrays) -> np.ndarray:
    """bool [k]: devices the program may use. Of interchangeable devices without a
    memory limit (``expansion.interchangeable``: same op times, feasibility and links to
    every other device) only the first: moving every op from one such device b to
    another a keeps each op's time and each copy's link (a and b reach every other device
    alike), drops the copies between them and merges their destinations, so it never
    costs more; with no limit to respect, an optimum uses one of them."""
    label = interchangeable(arr)
    first = np.array([label[d] == d for d in range(arr.k)])
    return first | np.isfinite(arr.capacity)


def _symmetry_rows(arr: CostArrays, prog: _Program, xi: np.ndarray) -> None:
    """Interchangeable devices with a (same) memory limit, d_1 < d_2 < ..., are used in
    order of their first op: op j may go on d_l+1 only if an earlier op went on d_l.
    Renaming those devices turns any placement into one that obeys this at the same cost
    and memory, so the optimum is kept while HiGHS no longer explores its relabelled
    copies. V[l, j] <= V[l, j-1] + x[j, d_l] (V in [0, 1], V[l, -1] = 0) is at most "d_l
    used by op j"; x[j, d_l+1] <= V[l, j-1]."""
    label = interchangeable(arr)
    n = arr.n_ops
    for cls in np.unique(label).tolist():
        group = [d for d in np.flatnonzero(label == cls).tolist() if np.isfinite(arr.capacity[d])]
        for a, b in zip(group, group[1:]):
            V = prog.variables(n)
            for j in range(n):
                cols, vals = [int(V[j])], [1.0]
                if j:
                    cols.append(int(V[j - 1]))
                    vals.append(-1.0)
                if xi[j, a] >= 0:
                    cols.append(int(xi[j, a]))
                    vals.append(-1.0)
                prog.row(cols, vals, -np.inf, 0.0)
                if xi[j, b] >= 0:
                    prog.row([int(xi[j, b])] + ([int(V[j - 1])] if j else []), [1.0] + ([-1.0] if j else []),
                             -np.inf, 0.0)


def _readers(arr: CostArrays, t: int) -> list[int]:
    return sorted(set(arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]].tolist()))


def _copy_rows(arr: CostArrays, prog: _Program, xi: np.ndarray, scale: float) -> None:
    """Y and W variables and rows for every tensor that can need a copy (docstring)."""
    k, host = arr.k, arr.host
    for t in range(arr.n_tensors):
        u = int(arr.t_producer[t])
        if u == PARAM:
            continue
        readers = _readers(arr, t)
        host_reads = bool(arr.outputs_on_host and arr.t_ext_out[t])
        for e in range(k):
            cols = [int(xi[v, e]) for v in readers if xi[v, e] >= 0]
            fixed = host_reads and e == host
            if not cols and not fixed:
                continue
            if u == HOST:
                if e != host:
                    _read_on(prog, cols, fixed, cost=float(arr.copy_s(t, host, e)) * scale)
                continue
            sources = [s for s in range(k) if s != e and xi[u, s] >= 0]
            if not sources:
                continue
            w = prog.variables(len(sources), cost=np.array([arr.copy_s(t, s, e) for s in sources]) * scale)
            y = None if fixed else _read_on(prog, cols, False)
            # sum_s W[t, s, e] + x[u, e] - Y[t, e] >= 0  (Y = 1 when the host reads it back)
            row_cols = list(w) + ([int(xi[u, e])] if xi[u, e] >= 0 else []) + ([y] if y is not None else [])
            row_vals = [1.0] * len(w) + ([1.0] if xi[u, e] >= 0 else []) + ([-1.0] if y is not None else [])
            prog.row(row_cols, row_vals, 1.0 if fixed else 0.0, np.inf)
            if len(sources) > 1:
                prog.at_least([xi[u, s] for s in sources], w)


def _read_on(prog: _Program, cols: list[int], fixed: bool, cost: float = 0.0):
    """The "read on e" indicator: None when it is 1 anyway (the host reads the tensor
    back; never priced), the reader's own x when there is one reader and no cost, else a
    variable Y >= every reader's x."""
    if fixed:
        return None
    if len(cols) == 1 and cost == 0.0:
        return cols[0]
    y = int(prog.variables(1, cost=cost)[0])
    prog.at_least(np.full(len(cols), y), cols)
    return y


def _or_chain(prog: _Program, xs: list[int]) -> list[int]:
    """Variables c_j >= c_j-1, c_j >= xs[j] (c_0 = xs[0]): c_j is at least OR xs[..j]."""
    out = [xs[0]]
    for x in xs[1:]:
        c = int(prog.variables(1)[0])
        prog.at_least([c, c], [out[-1], x])
        out.append(c)
    return out


def _memory_rows(arr: CostArrays, prog: _Program, xi: np.ndarray, d: int) -> None:
    """Parameter, liveness and per-step rows of device d (module docstring), in MiB
    (bytes span 1e0..1e10; in MiB HiGHS's coefficients stay near 1, and its feasibility
    tolerance, 1e-7, is a tenth of a byte)."""
    n = arr.n_ops
    cap = float(arr.capacity[d])
    unit = float(2**20)
    # the per-step terms as segments: variable col holds nbytes over steps start..stop-1
    seg_start: list[int] = []
    seg_stop: list[int] = []
    seg_col: list[int] = []
    seg_val: list[float] = []
    kept_terms: list[list[tuple[int, float]]] = [[] for _ in range(n)]   # (x[p, d], bytes) from step i on

    def add(steps: range, col: int, nbytes: float) -> None:
        if len(steps):
            seg_start.append(steps.start)
            seg_stop.append(steps.stop)
            seg_col.append(col)
            seg_val.append(nbytes)
    param_cols, param_bytes = [], []
    for t in range(arr.n_tensors):
        nbytes = float(arr.t_bytes[t]) / unit
        p = int(arr.t_producer[t])
        readers = [v for v in _readers(arr, t) if xi[v, d] >= 0]
        if nbytes <= 0:
            continue
        if p == PARAM:
            if readers:
                param_cols.append(_read_on(prog, [int(xi[v, d]) for v in readers], False))
                param_bytes.append(nbytes)
            continue
        made = int(xi[p, d]) if p >= 0 and xi[p, d] >= 0 else -1
        kept = made >= 0 and bool(arr.t_ext_out[t]) and not arr.outputs_on_host
        end = readers[-1] if readers else p
        if kept and end + 1 < n:
            kept_terms[end + 1].append((made, nbytes))
        if not readers:
            continue
        xs = [int(xi[v, d]) for v in readers]
        F, B = _or_chain(prog, xs), _or_chain(prog, xs[::-1])[::-1]
        segments = []     # (steps, F or None, B)
        if made >= 0 and readers[0] > p + 1:
            segments.append((range(p + 1, readers[0]), None, B[0]))
        for j, r in enumerate(readers):
            segments.append((range(r, r + 1), F[j], B[j]))
            if j + 1 < len(readers) and readers[j + 1] > r + 1:
                segments.append((range(r + 1, readers[j + 1]), F[j], B[j + 1]))
        for steps, f, b in segments:
            s = int(prog.variables(1)[0])
            if made >= 0:     # S - x[p] - B >= -1
                prog.row([s, made, b], [1.0, -1.0, -1.0], -1.0, np.inf)
            if f is not None:
                prog.row([s, f, b], [1.0, -1.0, -1.0], -1.0, np.inf)
            if kept:
                prog.at_least([s], [made])
            add(steps, s, nbytes)
    base = []
    if param_cols:     # P_d = sum bytes G
        p_d = int(prog.variables(1, ub=np.inf)[0])
        prog.row([p_d] + param_cols, [1.0] + [-b for b in param_bytes], 0.0, 0.0)
        base = [p_d]
    has_kept = any(kept_terms)
    if has_kept:       # K_i = K_i-1 + bytes of kept outputs whose last reader was step i-1
        K = prog.variables(n, ub=np.inf)
        for i in range(n):
            cols = [int(K[i])] + ([int(K[i - 1])] if i else []) + [c for c, _ in kept_terms[i]]
            vals = [1.0] + ([-1.0] if i else []) + [-b for _, b in kept_terms[i]]
            prog.row(cols, vals, 0.0, 0.0)
    written = arr.written_bytes / unit
    # one row per step: sum of its terms <= capacity, built from whole arrays (a tensor live
    # over a thousand steps is one segment here, a thousand entries in the matrix)
    starts, stops = np.asarray(seg_start, np.int64), np.asarray(seg_stop, np.int64)
    lengths = stops - starts
    seg_of = np.repeat(np.arange(len(starts)), lengths)
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    step_parts = [starts[seg_of] + offsets]
    col_parts = [np.asarray(seg_col, np.int64)[seg_of]]
    val_parts = [np.asarray(seg_val, float)[seg_of]]
    everywhere = [int(c) for c in base]
    for c in everywhere:
        step_parts.append(np.arange(n))
        col_parts.append(np.full(n, c, np.int64))
        val_parts.append(np.ones(n))
    if has_kept:
        step_parts.append(np.arange(n))
        col_parts.append(np.asarray(K, np.int64))
        val_parts.append(np.ones(n))
    on_d = np.flatnonzero(xi[:, d] >= 0)
    step_parts.append(on_d)
    col_parts.append(xi[on_d, d].astype(np.int64))
    val_parts.append(np.asarray(written, float)[on_d])
    steps_all = np.concatenate(step_parts)
    if len(steps_all):
        present = np.unique(steps_all)
        prog.rows(np.searchsorted(present, steps_all), np.concatenate(col_parts), np.concatenate(val_parts),
                  np.full(len(present), -np.inf), np.full(len(present), cap / unit))


def _least_variables(arr: CostArrays) -> int:
    """A lower bound on the program's variables, from whole arrays: an x per feasible
    (op, device) of the devices the program uses, and at least one copy variable (Y or
    W) per tensor made by an op and device other than the producer's only one where a
    reader may run. The program grows with these (copy rows build k-1 sources each), so
    a net far too big for ``max_vars`` is refused in time linear in its size."""
    feasible = arr.feasible & _collapsed(arr)[None, :]
    n_x = int(feasible.sum())
    made = np.flatnonzero(arr.t_producer >= 0)
    if not len(made) or not len(arr.t_cons):
        return n_x
    readers = feasible[arr.t_cons]     # per consumer entry: the devices its reader may take
    readable = np.column_stack([np.bincount(arr.entry_tensor, weights=readers[:, d], minlength=arr.n_tensors) > 0
                                for d in range(arr.k)])
    at_producer = feasible[arr.t_producer[made]]
    only_there = at_producer & (at_producer.sum(axis=1) == 1)[:, None]   # no source but e itself
    return n_x + int((readable[made] & ~only_there).sum())


# HiGHS does not stop its root LP relaxation at the time limit: on placer's memory-limited
# MILP (a 2-core x86 VM) 70k variables took the 10 s limit, 210k took 99 s against a 5 s
# limit, all of it in the root LP. LP time grows about as the square of the size, so the
# MILP a plan runs on its own is sized to its time limit (``vars_within``).
ROOT_LP_VARS_IN_10S = 70_000


def vars_within(time_limit: float) -> int:
    """The most variables whose root LP relaxation HiGHS finishes within ``time_limit``
    seconds (``ROOT_LP_VARS_IN_10S``, scaled by the square root of the time)."""
    return int(ROOT_LP_VARS_IN_10S * np.sqrt(max(float(time_limit), 0.0) / 10.0))


def milp_partition(arr: CostArrays, time_limit: float = 10.0, max_vars: int = 400_000) -> dict:
    """Solve the MILP within ``time_limit`` seconds, honouring ``arr.capacity``.

    Returns {"x": device index per op or None, "objective" and "bound" (seconds, None
    when unknown), "optimal", "status" ("optimal", "time limit", "infeasible", "skipped",
    "failed"), "note"}."""
    skipped = {"x": None, "objective": None, "bound": None, "optimal": False, "status": "skipped",
               "note": f"MILP skipped: more than {max_vars} variables"
                       + (f", too many for its root LP relaxation to finish within {time_limit:g} s "
                          f"(raise --time-limit)" if max_vars >= vars_within(time_limit) else "")}
    if _least_variables(arr) > max_vars:   # too big: known before building any of it
        return skipped
    scale = OBJECTIVE_SCALE / _reference_cost(arr)
    prog = _Program()
    xi = _placement_rows(arr, prog, scale)
    _symmetry_rows(arr, prog, xi)
    _copy_rows(arr, prog, xi, scale)
    for d in np.flatnonzero(np.isfinite(arr.capacity)).tolist():
        _memory_rows(arr, prog, xi, d)
        if prog.n_vars > max_vars:
            break
    if prog.n_vars > max_vars:
        return skipped
    res = prog.solve(time_limit)
    x = None
    if res.x is not None:
        val = np.where(xi >= 0, res.x[np.maximum(xi, 0)], -1.0)
        x = val.argmax(axis=1).astype(np.int64)
    objective = None if res.fun is None else float(res.fun) / scale
    bound = getattr(res, "mip_dual_bound", None)
    bound = None if bound is None or not np.isfinite(bound) else float(bound) / scale
    optimal = res.status == 0 and x is not None
    if optimal and bound is None:
        bound = objective
    status = {0: "optimal", 1: "time limit", 2: "infeasible"}.get(res.status, "failed")
    note = (f"MILP ({prog.n_vars} variables, {prog.n_rows} rows): {res.message.strip()}"
            + (f"; bound {bound:.6g} s" if bound is not None else ""))
    return {"x": x, "objective": objective, "bound": bound, "optimal": optimal, "status": status,
            "note": note}


class MilpPartitioner:
    """The MILP's plan (``partition(method="milp")``): optimal when it finishes within
    ``time_limit`` seconds, else the best placement found with its gap to the bound."""

    method = "milp"

    def __init__(self, time_limit: float = 10.0):
        self.time_limit = time_limit

    def partition(self, arr: CostArrays) -> Plan:
        check_pinned_fit(arr)
        res = milp_partition(arr, self.time_limit, max_vars=10**9)
        if res["x"] is None:
            raise _no_placement(res, self.time_limit)
        plan = make_plan(arr, res["x"], self.method, optimal=res["optimal"], notes=[res["note"]])
        if res["bound"] is not None and plan.total_s > 0:
            plan.gap = max(0.0, (plan.total_s - res["bound"]) / plan.total_s)
        return plan


def _no_placement(res: dict, time_limit: float) -> PlacerError:
    """Why the MILP returned no placement, as the error the user can act on."""
    if res["status"] == "infeasible":
        return InfeasiblePlanError(f"no placement satisfies the pins and the memory limits: {res['note']}",
                                   hint="unpin some ops, or give the devices more memory (--gpu-mem, "
                                        "--gpu-reserve, the machine profile)")
    if res["status"] == "time limit":
        return PlacerError(f"the MILP found no placement within its {time_limit:g} s time limit: {res['note']}",
                           hint="raise --time-limit, or use --method auto")
    return PlacerError(f"the MILP found no placement: {res['note']}", hint="use --method auto")


__all__ = ["milp_partition", "MilpPartitioner"]
