"""Placement over k >= 3 devices by alpha-expansion (Boykov, Veksler and Zabih 2001), each
move one exact s-t minimum cut that charges a tensor's copy once per destination device.

The problem (multiway cut with per-op device costs) is NP-hard from three devices. An
**expansion move** on device alpha takes the current placement f and lets every op that
may run on alpha either keep f(i) (x_i = 0, source side) or switch to alpha (x_i = 1,
sink side); ops already on alpha, or that may not run there, keep their device.

Energy of a move (serial objective, ``problem``): unary terms E_i(0) = op_s[i, f(i)] and
E_i(1) = op_s[i, alpha] (plus any per-device price ``extra``) are the arcs i -> t and
s -> i. For a tensor t made on device P (its producer u, or the host) and read by ops
(and the host, for an output read back), group its readers by current device e; ``y_e``
says "some reader on e keeps e", ``z`` says "some reader ends on alpha". L(a, b) is the
copy time of t from a to b. After the move the copy cost of t is

  producer ends on P (x_u = 0):     z L(P, alpha) + sum over e != P, alpha of y_e L(P, e)
  producer ends on alpha (x_u = 1): sum over e != alpha of y_e L(alpha, e)

which splits into terms a min-cut can represent (V_e: the movable readers on e):
- (A) (1 - x_u) z L(P, alpha): node a with u -> a = L and a -> v = inf for every movable
  reader v (a single reader: u -> v). A fixed producer (the host, or an op that cannot
  move) is the source: s -> a. A reader already on alpha makes z = 1: a unary term on u.
- (B) x_u y_P L(alpha, P): node b with v -> b = inf (v in V_P) and b -> u = L (a single
  reader: v -> u); a fixed reader on P (the host reading an output made there) makes it
  a unary term on u.
- (C) e != P, alpha: y_e [(1 - x_u) L(P, e) + x_u L(alpha, e)]. With a fixed reader on e,
  y_e = 1 and the term is unary on u: exact. Otherwise, when L(alpha, e) >= L(P, e), it is
  y_e L(P, e) + x_u y_e (L(alpha, e) - L(P, e)): node c with v -> c = inf, c -> t = L(P, e)
  and c -> u = the difference: exact. When L(alpha, e) < L(P, e) (alpha is closer to e
  than P is: a CPU producer, alpha one GPU, readers on another GPU across NVLink), the
  part (1 - x_u) y_e (L(P, e) - L(alpha, e)) is not submodular: the move prices it as
  y_e L(P, e), the copy from the producer's current device, an upper bound that is tight
  at the current placement. A producer already on alpha: y_e L(alpha, e), node c only.
So every move minimises exactly an energy that equals the true cost at x = 0 and never
lies below it: a move never raises the cost; moves without such "truncated" terms are
exact (``MoveNetwork.truncated`` counts them; tests check both against brute force).

Costs become int32 capacities as in ``mincut`` (scale = 2^29 / the reference cut, the
energy at x = 0): the move is optimal for the rounded energy, within ``arcs / scale``
seconds of the exact one; every accepted move is re-scored in floating point.

The search (``expand``): from each start placement, cycle alpha over the devices and keep
a move when it lowers the true cost, until a whole cycle changes nothing; devices that
are interchangeable (same costs, links and capacity) and unused are tried once, not
once each. Starts: everything on the host; the two-device optimum on each GPU kind
(exact min-cut, lifted); each op (colocation group) on its own fastest device. The best
result wins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from placer.partition.explain import make_plan
from placer.partition.mincut import BUDGET, _to_int, two_device_placement
from placer.partition.problem import (PARAM, CostArrays, as_placement, respecting_pins,
                                      serial_cost)

INF = np.inf


@dataclass
class Move:
    """The result of one expansion move."""

    switch: np.ndarray          # bool [n]: ops that switch to alpha
    energy_s: float             # the move's (surrogate) energy at that switch set, seconds
    truncated: int              # non-submodular terms priced at their upper bound
    resolution_s: float         # integer rounding per arc


class MoveNetwork:
    """The s-t network of one expansion move (module docstring); ``solve`` runs the cut."""

    def __init__(self, arr: CostArrays, f: np.ndarray, alpha: int, extra: np.ndarray | None = None,
                 frozen: np.ndarray | None = None):
        self.arr, self.f, self.alpha = arr, as_placement(arr, f), int(alpha)
        n = arr.n_ops
        rows_i = np.arange(n)
        feasible = arr.feasible
        self.movable = (self.f != alpha) & feasible[:, alpha]
        if frozen is not None:      # ops held where they are (whole colocation groups)
            self.movable &= ~frozen
        op_now = arr.op_s[rows_i, self.f]
        op_alpha = arr.op_s[:, alpha]
        if extra is not None:
            op_now = op_now + extra[rows_i, self.f]
            op_alpha = op_alpha + extra[:, alpha]
        self.const = float(op_now[~self.movable].sum())
        self.e0 = np.where(self.movable, op_now, 0.0)   # i -> t (keep)
        self.e1 = np.where(self.movable, op_alpha, 0.0)  # s -> i (switch)
        self.node = np.full(n, -1, np.int64)
        mov = np.flatnonzero(self.movable)
        self.node[mov] = np.arange(len(mov))
        self.m = len(mov)
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.caps: list[np.ndarray] = []
        self.n_aux = 0
        self.truncated = 0
        self._tensor_terms()

    # node numbering: movable ops 0..m-1, auxiliary m.., then s, t (fixed in solve)
    S, T = -10, -20   # source and sink in arc lists (op nodes are >= 0)

    def _arcs(self, r, c, cap):
        self.rows.append(np.asarray(r, np.int64))
        self.cols.append(np.asarray(c, np.int64))
        self.caps.append(np.broadcast_to(np.asarray(cap, np.float64), np.shape(r)).copy())

    def _new_nodes(self, count: int) -> np.ndarray:
        ids = self.m + self.n_aux + np.arange(count)
        self.n_aux += count
        return ids

    def _tensor_terms(self) -> None:
        arr, f, alpha, k = self.arr, self.f, self.alpha, self.arr.k
        live = arr.t_producer != PARAM
        et = arr.entry_tensor
        # readers: (tensor, reader op or -1 for the host, current device, movable)
        keep = live[et]
        rt, rv = et[keep], arr.t_cons[keep]
        if arr.outputs_on_host:
            ext = np.flatnonzero(arr.t_ext_out & live)
            rt = np.concatenate([rt, ext])
            rv = np.concatenate([rv, np.full(len(ext), -1, np.int64)])
        re = np.where(rv >= 0, f[np.maximum(rv, 0)], arr.host)
        rmov = (rv >= 0) & self.movable[np.maximum(rv, 0)]
        src = arr.tensor_source(f)
        prod = arr.t_producer
        pmov = (prod >= 0) & self.movable[np.maximum(prod, 0)]
        # groups of readers by (tensor, device)
        key = rt * k + re
        order = np.lexsort((rv, key))
        rt, rv, re, rmov, key = rt[order], rv[order], re[order], rmov[order], key[order]
        first = np.ones(len(key), bool)
        first[1:] = key[1:] != key[:-1]
        gid = np.cumsum(first) - 1
        gstart = np.flatnonzero(first)
        g_t, g_e = rt[gstart], re[gstart]
        G = len(gstart)
        g_mov = np.bincount(gid, weights=rmov, minlength=G).astype(np.int64)
        g_fix = np.bincount(gid, weights=~rmov, minlength=G).astype(np.int64)
        g_P = src[g_t]
        g_u = prod[g_t]
        g_umov = pmov[g_t]
        # the movable reader of a group with exactly one (its node), else -1
        one_reader = np.full(G, -1, np.int64)
        single = g_mov == 1
        mv = np.flatnonzero(rmov)
        one_reader[gid[mv]] = np.where(single[gid[mv]], self.node[rv[mv]], -1)

        def L(a, b, t):
            return np.where(a == b, 0.0, self.arr.class_s[self.arr.link_class[a, b], t])

        # ---- group terms: e != alpha (readers on alpha are fixed there: the z term below)
        off_alpha = g_e != alpha
        u_node = np.where(g_umov, self.node[np.maximum(g_u, 0)], -1)
        # producer on alpha already: y_e L(alpha, e) to the sink
        at_alpha = off_alpha & (g_P == alpha) & (g_fix == 0) & (g_mov > 0)
        # producer fixed off alpha: y_e L(P, e) to the sink (e != P)
        fixed_p = off_alpha & (g_P != alpha) & ~g_umov & (g_e != g_P) & (g_fix == 0) & (g_mov > 0)
        to_t = np.zeros(G)
        to_u = np.zeros(G)
        to_t[at_alpha] = L(alpha, g_e[at_alpha], g_t[at_alpha])
        to_t[fixed_p] = L(g_P[fixed_p], g_e[fixed_p], g_t[fixed_p])
        # producer movable
        pm = off_alpha & g_umov
        # (B) readers on P
        b = pm & (g_e == g_P)
        b_fix = b & (g_fix > 0)
        np.add.at(self.e1, g_u[b_fix], L(alpha, g_P[b_fix], g_t[b_fix]))
        b_var = b & (g_fix == 0) & (g_mov > 0)
        to_u[b_var] = L(alpha, g_P[b_var], g_t[b_var])
        # (C) readers on a third device
        c = pm & (g_e != g_P)
        c_fix = c & (g_fix > 0)
        np.add.at(self.e0, g_u[c_fix], L(g_P[c_fix], g_e[c_fix], g_t[c_fix]))
        np.add.at(self.e1, g_u[c_fix], L(alpha, g_e[c_fix], g_t[c_fix]))
        c_var = c & (g_fix == 0) & (g_mov > 0)
        near = L(g_P[c_var], g_e[c_var], g_t[c_var])
        far = L(alpha, g_e[c_var], g_t[c_var])
        to_t[c_var] = near
        to_u[c_var] = np.maximum(far - near, 0.0)
        self.truncated += int((far < near).sum())
        # constant copies (groups whose readers all stay: fixed readers, fixed producer)
        const_g = off_alpha & ~g_umov & (g_fix > 0) & (g_e != g_P)
        self.const += float(L(g_P[const_g], g_e[const_g], g_t[const_g]).sum())
        # emit: single movable reader -> direct arcs; several -> one node per group
        has = (to_t > 0) | (to_u > 0)
        single_g = has & single
        v = one_reader[single_g]
        np.add.at(self.e0, np.flatnonzero(self.movable)[v], to_t[single_g])
        du = single_g & (to_u > 0)
        self._arcs(one_reader[du], u_node[du], to_u[du])
        multi_g = np.flatnonzero(has & (g_mov > 1))
        if len(multi_g):
            gnode = np.full(G, -1, np.int64)
            gnode[multi_g] = self._new_nodes(len(multi_g))
            ent = mv[np.isin(gid[mv], multi_g)]
            self._arcs(self.node[rv[ent]], gnode[gid[ent]], INF)
            tt = multi_g[to_t[multi_g] > 0]
            self._arcs(gnode[tt], np.full(len(tt), self.T), to_t[tt])
            uu = multi_g[to_u[multi_g] > 0]
            self._arcs(gnode[uu], u_node[uu], to_u[uu])
        # ---- tensor terms: z (some reader ends on alpha), for producers off alpha
        T_ = arr.n_tensors
        z_const = np.zeros(T_, bool)
        on_alpha = ~off_alpha
        z_const[g_t[on_alpha]] = True
        mov_count = np.bincount(rt[rmov], minlength=T_)
        tens = np.flatnonzero(live & (arr.tensor_source(f) != alpha) & (arr.tensor_source(f) >= 0))
        tmov = pmov[tens]
        t_u = np.where(tmov, self.node[np.maximum(prod[tens], 0)], -1)
        Lz = L(src[tens], np.full(len(tens), alpha), tens)
        # a reader already on alpha: unary on a movable producer, else a constant
        zc = z_const[tens]
        np.add.at(self.e0, np.flatnonzero(self.movable)[t_u[zc & tmov]], Lz[zc & tmov])
        self.const += float(Lz[zc & ~tmov].sum())
        need = ~zc & (mov_count[tens] > 0)
        one = need & (mov_count[tens] == 1)
        # the single movable reader of each tensor
        first_mov = np.full(T_, -1, np.int64)
        first_mov[rt[rmov][::-1]] = self.node[rv[rmov][::-1]]
        y_src = np.where(tmov, t_u, self.S)
        self._arcs(y_src[one], first_mov[tens[one]], Lz[one])
        several = np.flatnonzero(need & (mov_count[tens] > 1))
        if len(several):
            a_node = np.full(T_, -1, np.int64)
            a_node[tens[several]] = self._new_nodes(len(several))
            self._arcs(y_src[several], a_node[tens[several]], Lz[several])
            ent = np.flatnonzero(rmov & (a_node[rt] >= 0))
            self._arcs(a_node[rt[ent]], self.node[rv[ent]], INF)
        # ---- colocation: ops that share a device move together
        a, b2 = self.arr.colocate[:, 0], self.arr.colocate[:, 1]
        both = self.movable[a] & self.movable[b2]
        self._arcs(self.node[a[both]], self.node[b2[both]], INF)
        self._arcs(self.node[b2[both]], self.node[a[both]], INF)

    def solve(self) -> Move:
        """The minimum cut: which movable ops switch to alpha."""
        m, n_nodes = self.m, self.m + self.n_aux + 2
        s, t = n_nodes - 2, n_nodes - 1
        rows = np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)
        cols = np.concatenate(self.cols) if self.cols else np.zeros(0, np.int64)
        caps = np.concatenate(self.caps) if self.caps else np.zeros(0)
        rows = np.where(rows == self.S, s, np.where(rows == self.T, t, rows))
        cols = np.where(cols == self.S, s, np.where(cols == self.T, t, cols))
        mov = np.flatnonzero(self.movable)
        e0, e1 = self.e0[mov], self.e1[mov]
        base = np.minimum(e0, e1)
        e0, e1 = e0 - base, e1 - base
        # the energy at x = 0 above the per-op minimum: the reference cut for scaling
        ref = float(e0.sum()) + float(caps[(cols == t) & np.isfinite(caps)].sum())
        constant = self.const + float(base.sum())
        if m == 0 or ref <= 0:
            return Move(np.zeros(self.arr.n_ops, bool), constant + ref, self.truncated, 0.0)
        scale = BUDGET / (ref * 1.001)
        node = np.arange(m)
        all_rows = np.concatenate([np.full(m, s), node, rows])
        all_cols = np.concatenate([node, np.full(m, t), cols])
        all_caps = np.concatenate([e1, e0, caps])
        key = all_rows * n_nodes + all_cols
        keys, inverse = np.unique(key, return_inverse=True)
        finite = np.where(np.isinf(all_caps), 0.0, all_caps)
        merged = np.bincount(inverse, weights=finite, minlength=len(keys))
        merged[np.bincount(inverse, weights=np.isinf(all_caps), minlength=len(keys)) > 0] = np.inf
        ints = _to_int(merged, scale)
        keep = ints > 0
        r, c = keys[keep] // n_nodes, keys[keep] % n_nodes
        graph = csr_matrix((ints[keep], (r.astype(np.int32), c.astype(np.int32))), shape=(n_nodes, n_nodes))
        flow = maximum_flow(graph, s, t, method="dinic")
        residual = graph.astype(np.int64) - flow.flow.astype(np.int64)
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reach = breadth_first_order(residual, s, directed=True, return_predecessors=False)
        keep_side = np.zeros(n_nodes, bool)
        keep_side[reach] = True
        switch = np.zeros(self.arr.n_ops, bool)
        switch[mov] = ~keep_side[:m]
        energy = constant + flow.flow_value / scale
        return Move(switch, energy, self.truncated, 1.0 / scale)


def move_energy(arr: CostArrays, f: np.ndarray, alpha: int, switch: np.ndarray,
                extra: np.ndarray | None = None) -> float:
    """The energy an expansion move minimises, at one switch set, from the case analysis
    in the module docstring (loops; the reference the tests check ``MoveNetwork`` against)."""
    f = as_placement(arr, f)
    g = np.where(switch, alpha, f)
    rows = np.arange(arr.n_ops)
    total = float(arr.op_s[rows, g].sum()) + (float(extra[rows, g].sum()) if extra is not None else 0.0)
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        if p == PARAM:
            continue
        P = arr.host if p < 0 else int(f[p])
        readers = [(int(f[c]), int(g[c]), _may_move(arr, f, alpha, c))
                   for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]]
        if arr.outputs_on_host and arr.t_ext_out[t]:
            readers.append((arr.host, arr.host, False))

        def L(a, b):
            return 0.0 if a == b else float(arr.class_s[arr.link_class[a, b], t])
        after = {new for _, new, _ in readers}
        if not (p >= 0 and switch[p]):          # the producer stays on P: exact
            total += sum(L(P, e) for e in after if e != P)
            continue
        for e in after - {alpha}:               # the producer is now on alpha
            fixed_reader = any(now == e and not may for now, _, may in readers)
            if e != P and not fixed_reader and L(alpha, e) < L(P, e):
                total += L(P, e)                # truncated: priced from P
            else:
                total += L(alpha, e)
    return total


def _may_move(arr: CostArrays, f: np.ndarray, alpha: int, c: int) -> bool:
    return int(f[c]) != alpha and bool(arr.feasible[c, alpha])


def energy(arr: CostArrays, dev: np.ndarray, extra: np.ndarray | None = None) -> float:
    """Serial cost plus the per-device prices ``extra`` of a placement."""
    total = serial_cost(arr, dev).total_s
    if extra is not None:
        total += float(extra[np.arange(arr.n_ops), dev].sum())
    return total


def interchangeable(arr: CostArrays, extra: np.ndarray | None = None) -> np.ndarray:
    """Class label per device: devices with equal op costs, feasibility, capacity, prices
    and links (to every other device, both ways) share a label."""
    k = arr.k
    label = np.arange(k)
    for a in range(k):
        for b in range(a):
            if label[b] != b:
                continue
            if _same(arr, extra, a, b):
                label[a] = b
                break
    return label


def _same(arr, extra, a, b) -> bool:
    if not (np.array_equal(arr.op_s[:, a], arr.op_s[:, b]) and np.array_equal(arr.allowed[:, a], arr.allowed[:, b])
            and arr.capacity[a] == arr.capacity[b] and arr.device_kinds[a] == arr.device_kinds[b]):
        return False
    if extra is not None and not np.array_equal(extra[:, a], extra[:, b]):
        return False
    if a == arr.host or b == arr.host:
        return False
    lc = arr.link_class
    others = [x for x in range(arr.k) if x not in (a, b)]
    return (all(lc[a, x] == lc[b, x] and lc[x, a] == lc[x, b] for x in others)
            and lc[a, b] == lc[b, a])


def expand(arr: CostArrays, start: np.ndarray, extra: np.ndarray | None = None,
           deadline: float | None = None, max_cycles: int = 20,
           frozen: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Alpha-expansion from ``start`` until a cycle over the devices changes nothing;
    ops in ``frozen`` (bool per op, whole colocation groups) keep their device."""
    f = colocated(arr, respecting_pins(arr, start))
    best = energy(arr, f, extra)
    label = interchangeable(arr, extra)
    stats = {"moves": 0, "accepted": 0, "truncated": 0, "cycles": 0, "resolution_s": 0.0}
    for _ in range(max_cycles):
        stats["cycles"] += 1
        changed = False
        tried_empty: set[int] = set()
        for alpha in range(arr.k):
            if deadline is not None and time.perf_counter() > deadline:
                return f, stats
            if not (f == alpha).any():   # an unused device: one of each interchangeable class
                if label[alpha] in tried_empty:
                    continue
                tried_empty.add(int(label[alpha]))
            move = MoveNetwork(arr, f, alpha, extra, frozen).solve()
            stats["moves"] += 1
            stats["truncated"] += move.truncated
            stats["resolution_s"] = max(stats["resolution_s"], move.resolution_s)
            if not move.switch.any():
                continue
            g = f.copy()
            g[move.switch] = alpha
            e = energy(arr, g, extra)
            if e < best * (1 - 1e-12) - 1e-15:
                f, best, changed = g, e, True
                stats["accepted"] += 1
        if not changed:
            break
    return f, stats


def starts(arr: CostArrays) -> list[np.ndarray]:
    """Start placements (module docstring)."""
    n = arr.n_ops
    out = [np.full(n, arr.host, np.int64)]
    seen: set[int] = set()
    label = interchangeable(arr)
    for d in range(arr.k):
        if d != arr.host and label[d] not in seen:
            seen.add(int(label[d]))
            out.append(two_device_placement(arr, arr.host, d))
    comp = arr.component          # each colocation group on its fastest device, summed
    m = int(comp.max()) + 1 if n else 0
    summed = np.zeros((m, arr.k))
    np.add.at(summed, comp, np.where(arr.feasible, arr.op_s, np.inf))
    out.append(summed.argmin(axis=1)[comp])
    return out


def colocated(arr: CostArrays, dev: np.ndarray) -> np.ndarray:
    """``dev`` with every colocation group on the device of its first op (a move keeps a
    group together but cannot join one that a start split)."""
    if not len(arr.colocate):
        return dev
    comp = arr.component
    first = np.full(int(comp.max()) + 1, -1, np.int64)
    first[comp[::-1]] = np.arange(arr.n_ops)[::-1]
    return dev[first[comp]]


def expansion_placement(arr: CostArrays, extra: np.ndarray | None = None,
                        time_s: float | None = None, initial: list[np.ndarray] | None = None
                        ) -> tuple[np.ndarray, dict]:
    """The best placement alpha-expansion finds from every start (and ``initial`` ones)."""
    deadline = None if time_s is None else time.perf_counter() + time_s
    best, best_e, best_stats = None, np.inf, {}
    for s in (initial or []) + starts(arr):
        f, stats = expand(arr, s, extra, deadline)
        e = energy(arr, f, extra)
        if e < best_e:
            best, best_e, best_stats = f, e, stats
    return best, best_stats


class ExpansionPartitioner:
    """The serial objective over k devices (no memory limit) by alpha-expansion."""

    method = "expansion"

    def __init__(self, time_s: float | None = None):
        self.time_s = time_s

    def partition(self, arr: CostArrays):
        dev, stats = expansion_placement(arr, time_s=self.time_s)
        plan = make_plan(arr, dev, method=self.method, optimal=arr.k <= 2)
        plan.notes.append(
            f"alpha-expansion: {stats.get('moves', 0)} min-cut moves, {stats.get('accepted', 0)} accepted, "
            f"{stats.get('cycles', 0)} cycles; {stats.get('truncated', 0)} copy terms priced at their "
            f"upper bound; costs rounded to {stats.get('resolution_s', 0.0):.3g} s per arc")
        return plan


__all__ = ["MoveNetwork", "Move", "move_energy", "expand", "expansion_placement", "ExpansionPartitioner",
           "interchangeable", "energy"]
