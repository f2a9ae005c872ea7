"""The placement problem as a mixed-integer program for HiGHS (scipy.optimize.milp).

Exact formulation (see ``memory`` for the memory part): binary x per op (1 = GPU),
continuous copy indicators H_t, D_t in [0, 1] that the objective pushes down to
max over readers of (x_v - x_u) and (x_u - x_v); pins are bounds, colocation equalities.
Without a capacity it is the same problem the min-cut solves, which makes it an
independent exactness check; with one, it gives the optimum or a bound on it.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from placer.partition.problem import PARAM, PIN_CPU, PIN_GPU, CostArrays


class _Rows:
    """Sparse constraint rows lo <= a.x <= hi, gathered as triplets."""

    def __init__(self):
        self.r, self.c, self.v, self.lo, self.hi = [], [], [], [], []

    def add(self, cols, vals, lo, hi):
        k = len(self.lo)
        self.r += [k] * len(cols)
        self.c += list(cols)
        self.v += list(vals)
        self.lo.append(lo)
        self.hi.append(hi)

    def constraint(self, n_vars):
        a = coo_matrix((self.v, (self.r, self.c)), shape=(len(self.lo), n_vars)).tocsr()
        return LinearConstraint(a, np.array(self.lo, float), np.array(self.hi, float))


def milp_partition(arr: CostArrays, capacity: float | None = None, time_limit: float = 10.0,
                   max_vars: int = 400_000) -> dict:
    """{"x": bool array or None, "objective", "bound", "optimal", "status", "note"} (seconds;
    ``status`` is scipy's: 0 optimal, 1 time limit, 2 infeasible; None when skipped)."""
    n, T = arr.n_ops, arr.n_tensors
    cost = [arr.gpu_s - arr.cpu_s, arr.t_h2d.copy(), arr.t_d2h.copy()]
    const = float(arr.cpu_s.sum())
    rows = _Rows()
    H, D = n, n + T
    nxt = n + 2 * T
    for t in range(T):
        p = int(arr.t_producer[t])
        if p == PARAM:
            continue
        readers = arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]].tolist()
        for v in readers:  # H_t >= x_v - x_u ; D_t >= x_u - x_v
            rows.add([v, H + t] + ([p] if p >= 0 else []), [1, -1] + ([-1] if p >= 0 else []),
                     -np.inf, 0)
            if p >= 0:
                rows.add([p, v, D + t], [1, -1, -1], -np.inf, 0)
        if p >= 0 and arr.outputs_on_host and arr.t_ext_out[t]:
            rows.add([p, D + t], [1, -1], -np.inf, 0)
    for a, b in arr.colocate:
        rows.add([int(a), int(b)], [1, -1], 0, 0)
    if capacity is not None:
        nxt = _memory_rows(arr, rows, nxt, float(capacity))
    if nxt > max_vars:
        return {"x": None, "objective": None, "bound": None, "optimal": False, "status": None,
                "note": f"MILP skipped: {nxt} variables > {max_vars}"}
    c = np.concatenate(cost + [np.zeros(nxt - n - 2 * T)])
    lb, ub = np.zeros(nxt), np.ones(nxt)
    lb[:n][arr.forced == PIN_GPU] = 1
    ub[:n][arr.forced == PIN_CPU] = 0
    integrality = np.zeros(nxt)
    integrality[:n] = 1
    res = milp(c, integrality=integrality, bounds=Bounds(lb, ub),
               constraints=[rows.constraint(nxt)] if rows.lo else [],
               options={"time_limit": time_limit, "disp": False})
    x = None if res.x is None else res.x[:n] > 0.5
    bound = getattr(res, "mip_dual_bound", None)
    bound = None if bound is None or not np.isfinite(bound) else float(bound) + const
    optimal = res.status == 0
    if optimal and res.fun is not None:
        bound = float(res.fun) + const if bound is None else bound
    note = (f"MILP ({nxt} variables, {len(rows.lo)} rows): {res.message.strip()}"
            + (f"; bound {bound:.6g} s" if bound is not None else ""))
    return {"x": x, "objective": None if res.fun is None else float(res.fun) + const,
            "bound": bound, "optimal": optimal, "status": int(res.status), "note": note}


def _memory_rows(arr: CostArrays, rows: _Rows, nxt: int, capacity: float):
    """Add G, L, B, F variables and the per-step memory rows; returns the next free
    variable index."""
    n = arr.n_ops
    step_terms: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    params = []
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        readers = sorted(set(arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]].tolist()))
        nbytes = float(arr.t_bytes[t])
        if p == PARAM:
            if readers:
                g = nxt
                nxt += 1
                for v in readers:
                    rows.add([v, g], [1, -1], -np.inf, 0)
                params.append((g, nbytes))
            continue
        keep_to_end = p >= 0 and arr.t_ext_out[t] and not arr.outputs_on_host
        kept = {}
        if p >= 0:
            lval = nxt
            nxt += 1
            rows.add([p, lval], [1, -1], -np.inf, 0)       # L[t,p] >= x_p
            step_terms[p].append((lval, nbytes))
            if keep_to_end:                                # L[t,i] >= x_p to the end
                for i in range(p + 1, n):
                    kept[i] = nxt
                    nxt += 1
                    rows.add([p, kept[i]], [1, -1], -np.inf, 0)
                    step_terms[i].append((kept[i], nbytes))
        if not readers:
            continue
        first = p + 1 if p >= 0 else readers[0]
        last = readers[-1]
        span = range(first, last + 1)
        B = {i: nxt + k for k, i in enumerate(span)}
        F = {i: nxt + len(span) + k for k, i in enumerate(span)}
        nxt += 2 * len(span)
        rset = set(readers)
        for i in span:
            if i + 1 <= last:
                rows.add([B[i + 1], B[i]], [1, -1], -np.inf, 0)
            if i - 1 >= first:
                rows.add([F[i - 1], F[i]], [1, -1], -np.inf, 0)
            if i in rset:
                rows.add([i, B[i]], [1, -1], -np.inf, 0)
                rows.add([i, F[i]], [1, -1], -np.inf, 0)
            if keep_to_end:   # made on the CPU, copied in: live between GPU readers
                rows.add([F[i], B[i], kept[i]], [1, 1, -1], -np.inf, 1)
                continue
            lval = nxt
            nxt += 1
            if p >= 0:
                rows.add([p, B[i], lval], [1, 1, -1], -np.inf, 1)
            rows.add([F[i], B[i], lval], [1, 1, -1], -np.inf, 1)
            step_terms[i].append((lval, nbytes))
    produced = np.bincount(arr.t_producer[arr.t_producer >= 0],
                           weights=arr.t_bytes[arr.t_producer >= 0], minlength=n)
    scratch = np.maximum(arr.output_bytes - produced, 0)
    for i in range(n):
        cols = [c for c, _ in step_terms[i]] + [i] + [g for g, _ in params]
        vals = [b for _, b in step_terms[i]] + [scratch[i]] + [b for _, b in params]
        rows.add(cols, vals, -np.inf, capacity)
    return nxt
