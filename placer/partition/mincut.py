"""Exact serial placement as an s-t minimum cut (Stone 1977), solved by scipy's Dinic.

Network (source side = CPU, sink side = GPU):
  s -> x  capacity gpu_s(x)   (cut when x is on the GPU)
  x -> t  capacity cpu_s(x)   (cut when x is on the CPU)
  For a blob made by u and read by ops V, an auxiliary node a with u -> a = h2d and
  a -> v = inf (v in V) charges the CPU->GPU copy once when u is on the CPU and any v is
  on the GPU; a node b with v -> b = inf and b -> u = d2h charges the GPU->CPU copy once.
  A single reader needs no auxiliary node (u -> v = h2d, v -> u = d2h).
  Host-fed inputs have a CPU-pinned producer (the source); external outputs that go back
  to the host have a CPU-pinned reader, i.e. s -> u += d2h. Parameters cost nothing here.
  Pins are s -> x = inf (CPU) or x -> t = inf (GPU); colocated ops x, y get x <-> y = inf.

Integer capacities: scipy casts capacities to int32 (2^31 wraps to 0), so costs are
scaled by ``scale = 2^29 / C``, where C is the cut value of a feasible reference placement
(free ops on the CPU); infinity is 2^30 > every cut that can be minimal, and a capacity
plus any flow (at most C) stays below 2^31 in scipy's residual arithmetic. An arc worth
more than C is clipped to infinity: a minimum cut never contains it anyway. The plan is
optimal for the rounded costs; its true cost is within ``arcs_cut / scale`` seconds of the
true optimum (each cut arc rounds by at most half a unit, on both cuts compared), and is
recomputed in floating point afterwards. ``resolution_s = 1 / scale`` goes in the plan notes.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from placer.partition.explain import make_plan
from placer.partition.problem import HOST, PARAM, CostArrays, serial_cost

PIN_NONE, PIN_CPU, PIN_GPU = -1, 0, 1   # the two-device view's pins: none, source side, sink side


class TwoDeviceView:
    """A k-device problem seen as the two-device one between devices ``a`` (source side,
    "cpu" in this module's names: it must be the host, which feeds inputs and reads
    outputs) and ``b`` (sink side, "gpu"). Ops that may take neither device are held on
    ``a`` (only for starting placements of the k-device search). ``on_gpu`` booleans
    live here and nowhere else: ``placement`` turns them into device indices."""

    def __init__(self, arr: CostArrays, a: int, b: int):
        if a != arr.host:
            raise ValueError("the source side of a two-device view must be the host device")
        self.base, self.a, self.b = arr, a, b
        ok = arr.feasible
        fa, fb = ok[:, a], ok[:, b]
        self.forced = np.where(fb & ~fa, PIN_GPU, np.where(fa & fb, PIN_NONE, PIN_CPU)).astype(np.int8)
        self.cpu_s, self.gpu_s = arr.op_s[:, a], arr.op_s[:, b]
        self.t_h2d = arr.class_s[arr.link_class[a, b]]
        self.t_d2h = arr.class_s[arr.link_class[b, a]]
        for name in ("t_producer", "t_ptr", "t_cons", "t_ext_out", "outputs_on_host", "colocate",
                     "n_ops", "n_tensors", "entry_tensor"):
            setattr(self, name, getattr(arr, name))

    def placement(self, on_gpu: np.ndarray) -> np.ndarray:
        return np.where(on_gpu, self.b, self.a).astype(np.int64)

    def copy_s(self, on_gpu: np.ndarray) -> float:
        return serial_cost(self.base, self.placement(on_gpu)).copy_s

INF_CAP = 2**30  # + any flow (<= the reference cut < 2^29 * 1.01) stays below 2^31
BUDGET = 2**29


class FlowNetwork:
    """The min-cut network of a cost graph, built once from arrays; ``solve`` may be called
    again with extra per-op GPU cost (the memory partitioner's Lagrangian term)."""

    def __init__(self, arr: TwoDeviceView):
        self.arr = arr
        n = arr.n_ops
        self.forced = arr.forced
        self.src = arr.gpu_s.astype(np.float64).copy()   # s -> x
        self.snk = arr.cpu_s.astype(np.float64).copy()   # x -> t
        rows, cols, caps, n_nodes = _tensor_arcs(arr, self.src, n)
        a, b = arr.colocate[:, 0], arr.colocate[:, 1]
        rows = np.concatenate([rows, a, b])
        cols = np.concatenate([cols, b, a])
        caps = np.concatenate([caps, np.full(2 * len(a), np.inf)])
        self.n_nodes, self.s, self.t = n_nodes + 2, n_nodes, n_nodes + 1
        # merge parallel arcs once (capacities between ops never change between solves)
        key = rows * self.n_nodes + cols
        keys, inverse = np.unique(key, return_inverse=True)
        finite = np.where(np.isinf(caps), 0.0, caps)
        self.inner = np.bincount(inverse, weights=finite, minlength=len(keys)).astype(np.float64)
        self.inner[np.bincount(inverse, weights=np.isinf(caps), minlength=len(keys)) > 0] = np.inf
        # the CSR pattern of the whole network, fixed; solve() only fills in capacities
        node = np.arange(n)
        all_rows = np.concatenate([np.full(n, self.s), node, keys // self.n_nodes])
        all_cols = np.concatenate([node, np.full(n, self.t), keys % self.n_nodes])
        self.order = np.lexsort((all_cols, all_rows))
        self.indices = all_cols[self.order].astype(np.int32)
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(all_rows, minlength=self.n_nodes))]
                                     ).astype(np.int32)

    def solve(self, extra_gpu_s: np.ndarray | None = None, fixed: np.ndarray | None = None,
              ref: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """Min-cut placement (bool on_gpu per op) and solver facts.

        ``fixed`` (PIN_* per op) replaces the pins, e.g. to re-solve a window of ops with
        the rest held; ``ref`` is then a placement that respects it (sets the scale)."""
        forced = self.forced if fixed is None else fixed
        n = self.arr.n_ops
        extra = extra_gpu_s if extra_gpu_s is not None else 0.0
        src = self.src + extra
        snk = self.snk.copy()
        base = np.minimum(src, snk)
        src, snk = src - base, snk - base
        if ref is None:
            ref = forced == PIN_GPU      # feasible reference: free ops on the CPU
        ops_only = np.where(ref, self.arr.gpu_s + extra, self.arr.cpu_s) - base
        ref_cut = (float(ops_only.sum()) + self.arr.copy_s(ref)) * 1.001
        src[forced == PIN_CPU] = np.inf
        snk[forced == PIN_GPU] = np.inf
        if ref_cut <= 0:  # the reference costs nothing above the per-op minimum: optimal
            return ref.copy(), {"resolution_s": 0.0, "flow_units": 0, "arcs": 0,
                                "nodes": self.n_nodes}
        scale = BUDGET / ref_cut
        caps = _to_int(np.concatenate([src, snk, self.inner]), scale)[self.order]
        m = csr_matrix((caps, self.indices, self.indptr), shape=(self.n_nodes, self.n_nodes))
        flow = maximum_flow(m, self.s, self.t, method="dinic")
        residual = m.astype(np.int64) - flow.flow.astype(np.int64)
        residual.data[residual.data < 0] = 0
        residual.eliminate_zeros()
        reach = breadth_first_order(residual, self.s, directed=True, return_predecessors=False)
        on_cpu = np.zeros(self.n_nodes, bool)
        on_cpu[reach] = True
        facts = {"resolution_s": 1.0 / scale, "flow_units": int(flow.flow_value),
                 "arcs": int(np.count_nonzero(caps)), "nodes": self.n_nodes}
        return ~on_cpu[:n], facts


def _tensor_arcs(arr: TwoDeviceView, src: np.ndarray, n: int):
    """Arcs for copies (rows, cols, float caps) and the node count incl. auxiliary nodes.
    Host-input and external-output terms go into ``src`` (s -> x) in place."""
    prod, ptr, cons = arr.t_producer, arr.t_ptr, arr.t_cons
    count = np.diff(ptr)
    et = arr.entry_tensor
    live = prod != PARAM
    # host-fed inputs: CPU-pinned producer (the source)
    host = (prod == HOST) & live
    single = host & (count == 1)
    np.add.at(src, cons[ptr[:-1][single]], arr.t_h2d[single])
    # external outputs read on the host: s -> u += d2h
    made = prod >= 0
    ext = made & arr.t_ext_out & arr.outputs_on_host
    np.add.at(src, prod[ext], arr.t_d2h[ext])
    rows, cols, caps = [], [], []
    nxt = n + 2  # 0..n-1 ops, then s, t; auxiliary nodes after (s, t renumbered below)
    # ops: u -> v = h2d and v -> u = d2h for single readers
    one = made & (count == 1)
    u, v = prod[one], cons[ptr[:-1][one]]
    rows += [u]; cols += [v]; caps += [arr.t_h2d[one]]
    d2h_single = one & ~ext
    rows += [cons[ptr[:-1][d2h_single]]]; cols += [prod[d2h_single]]; caps += [arr.t_d2h[d2h_single]]
    # several readers (or a host input with several readers): auxiliary nodes
    multi_h = ((made | host) & (count > 1))
    ids = np.flatnonzero(multi_h)
    a_node = np.full(arr.n_tensors, -1, np.int64)
    a_node[ids] = nxt + np.arange(len(ids))
    nxt += len(ids)
    src_of = np.where(prod >= 0, prod, -1)
    mk = multi_h[et]
    rows += [src_of[ids], a_node[et[mk]]]
    cols += [a_node[ids], cons[mk]]
    caps += [arr.t_h2d[ids], np.full(int(mk.sum()), np.inf)]
    multi_d = made & (count > 1) & ~ext
    ids = np.flatnonzero(multi_d)
    b_node = np.full(arr.n_tensors, -1, np.int64)
    b_node[ids] = nxt + np.arange(len(ids))
    nxt += len(ids)
    mk = multi_d[et]
    rows += [cons[mk], b_node[ids]]
    cols += [b_node[et[mk]], prod[ids]]
    caps += [np.full(int(mk.sum()), np.inf), arr.t_d2h[ids]]
    rows, cols = np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64)
    caps = np.concatenate(caps).astype(np.float64)
    # renumber: aux nodes n+2.. -> n.., s = total-2, t = total-1; -1 (host producer) -> s
    n_aux = nxt - (n + 2)
    s_new = n + n_aux
    fix = lambda x: np.where(x == -1, s_new, np.where(x >= n + 2, x - 2, x))  # noqa: E731
    return fix(rows), fix(cols), caps, n + n_aux


def _to_int(caps: np.ndarray, scale: float) -> np.ndarray:
    out = np.full(len(caps), INF_CAP, np.int64)
    fin = np.isfinite(caps)
    out[fin] = np.minimum(np.rint(caps[fin] * scale), INF_CAP)
    return out.astype(np.int32)


def host_and_gpu(arr: CostArrays) -> tuple[int, int]:
    """The (host, GPU) pair of a two-device machine."""
    if arr.k != 2:
        raise ValueError(f"the exact min-cut places over two devices; this machine has {arr.k} "
                         "(use the expansion partitioner)")
    return arr.host, 1 - arr.host


class MinCutPartitioner:
    """Exact optimum of the serial objective on a two-device machine (no memory limit)."""

    method = "mincut"

    def partition(self, arr: CostArrays):
        view = TwoDeviceView(arr, *host_and_gpu(arr))
        on_gpu, facts = FlowNetwork(view).solve()
        plan = make_plan(arr, view.placement(on_gpu), method=self.method, optimal=True, gap=0.0)
        plan.notes.append(
            f"min-cut on {facts['nodes']} nodes / {facts['arcs']} arcs: optimal for costs "
            f"rounded to {facts['resolution_s']:.3g} s per arc; cost recomputed exactly")
        return plan


def two_device_placement(arr: CostArrays, a: int, b: int, extra_b: np.ndarray | None = None) -> np.ndarray:
    """The optimal serial placement over devices ``a`` (the host) and ``b`` alone, as device
    indices (ops that may take neither stay on ``a``: see ``TwoDeviceView``)."""
    view = TwoDeviceView(arr, a, b)
    return view.placement(FlowNetwork(view).solve(extra_b)[0])


def mincut_placement(arr: CostArrays) -> np.ndarray:
    """The optimal serial placement of a two-device machine, as device indices."""
    return two_device_placement(arr, *host_and_gpu(arr))


__all__ = ["FlowNetwork", "MinCutPartitioner", "TwoDeviceView", "mincut_placement",
           "two_device_placement", "host_and_gpu"]
