"""The partitioners' view of a cost graph over k devices: flat arrays, and what a placement costs.

Every partitioner turns the networkx cost graph (``placer.costs.graph``) into ``CostArrays``
once, because a million-op net is too big to walk node by node in Python while solving.
A **placement** is an int array ``dev`` with one device index per op (0 is the host CPU,
see ``placer.hardware.machine``).

Serial cost (Caffe2 ``simple`` nets run ops one after another):
  total = sum over ops of op_s[i, dev[i]]
        + for every tensor t and every device e != src(t) on which t is read:
          copy_s(t, src(t) -> e), paid once per destination however many readers it has there,
where src(t) is the device of t's producer, or the host for a blob fed from the host;
an external output read back on the host (``outputs_on_host``) counts as a reader on the
host. Parameters (producer PARAM) are never copied: the init net makes them on every
device that reads them, which costs memory only. Copy times are per **link class**
(``placer.hardware.machine.Machine.link_classes``): ``class_s[link_class[a, b], t]``.

Memory per device (``device_memory``): the parameters read there + the peak over op steps
of live activation bytes there. A blob made on device d by op p lives on d from step p to
its last reader on d; a blob copied to d lives from its first to its last reader on d;
an external output kept on its device (``outputs_on_host`` False) lives to the end; bytes
an op writes that nobody reads live during that op's step only.
"""
from __future__ import annotations

import numpy as np

from placer.costs.arrays import FREE, HOST, PARAM, CostArrays
from placer.errors import InfeasiblePlanError
from placer.types import PlanCopy, PlanCost

SLACK = 1 + 1e-12   # memory comparisons tolerate rounding of summed bytes


def from_graph(graph) -> CostArrays:
    """CostArrays of a networkx cost graph (``placer.costs.graph``), or the arrays themselves."""
    if isinstance(graph, CostArrays):
        return graph
    n = graph.number_of_nodes()
    g = graph.graph
    k = len(g["devices"])
    nodes = [graph.nodes[i] for i in range(n)]
    op_s = np.array([d["time_s"] for d in nodes], np.float64).reshape(n, k)
    allowed = np.zeros((n, k), bool)
    rows = np.repeat(np.arange(n), [len(d["allowed"]) for d in nodes])
    cols = np.fromiter((x for d in nodes for x in d["allowed"]), np.int64, count=len(rows))
    allowed[rows, cols] = True
    t = g["tensors"]
    # an op reading the blob it writes (in place) needs no copy of it: not a reader here
    prod = t.producer
    owner = np.repeat(prod, np.diff(t.ptr))
    keep = t.consumers != owner
    counts = np.bincount(np.repeat(np.arange(len(prod)), np.diff(t.ptr))[keep], minlength=len(prod))
    ptr = np.zeros(len(prod) + 1, np.int64)
    ptr[1:] = np.cumsum(counts)
    pairs = [(grp[0], other) for grp in g.get("colocate", []) for other in grp[1:]]
    return CostArrays(
        op_s=op_s, allowed=allowed, param_bytes=np.array([d["param_bytes"] for d in nodes], float),
        output_bytes=np.array([d["output_bytes"] for d in nodes], float), t_producer=prod.astype(np.int64),
        t_ptr=ptr, t_cons=t.consumers[keep].astype(np.int64), t_bytes=t.nbytes.astype(np.float64),
        t_ext_out=t.external_output.astype(bool), link_class=g["link_class"], class_s=g["class_s"],
        devices=tuple(g["devices"]), device_kinds=tuple(g["device_kinds"]), capacity=g["capacity"],
        host=int(g.get("host", 0)), lanes=tuple(g.get("lanes", ())), routes=dict(g.get("routes", {})),
        colocate=np.array(pairs, np.int64).reshape(-1, 2), outputs_on_host=bool(g.get("outputs_on_host", True)),
        names=[d["name"] for d in nodes], types=[d["type"] for d in nodes], t_names=list(t.names),
        pin_reason=[d.get("pin_reason", "") for d in nodes])


# ---------------------------------------------------------------------- placements

def as_placement(arr: CostArrays, dev) -> np.ndarray:
    """A placement as an int array of device indices (accepts a list or array)."""
    out = np.asarray(dev, dtype=np.int64)
    if out.shape != (arr.n_ops,):
        raise ValueError(f"placement has shape {out.shape}, the net has {arr.n_ops} ops")
    return out


def respecting_pins(arr: CostArrays, dev) -> np.ndarray:
    """``dev`` with every op forced to one device put there, and any op on a device it may
    not take moved to its first feasible one (the host where it may)."""
    out = as_placement(arr, dev).copy()
    forced = arr.forced
    out[forced >= 0] = forced[forced >= 0]
    bad = ~arr.feasible[np.arange(arr.n_ops), out]
    if bad.any():
        ok = arr.feasible[bad]
        out[bad] = np.where(ok[:, arr.host], arr.host, ok.argmax(axis=1))
    return out


def copy_reads(arr: CostArrays, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tensor, destination) of every read that needs a copy (a consumer on another device
    than the tensor's source; an external output away from the host when outputs come
    back), duplicates included, and the source device of every tensor."""
    src = arr.tensor_source(dev)
    ts, ds = [arr.entry_tensor], [dev[arr.t_cons]]
    if arr.outputs_on_host:
        ext = np.flatnonzero(arr.t_ext_out)
        ts.append(ext)
        ds.append(np.full(len(ext), arr.host, np.int64))
    t, d = np.concatenate(ts), np.concatenate(ds)
    need = (src[t] >= 0) & (d != src[t])
    return t[need], d[need], src


def copy_pairs(arr: CostArrays, dev) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The copies a placement needs: (tensor, source device, destination device) arrays,
    one per tensor and destination, sorted by tensor then destination."""
    dev = as_placement(arr, dev)
    k = arr.k
    t, d, src = copy_reads(arr, dev)
    key = np.unique(t * k + d)
    t, d = key // k, key % k
    return t, src[t], d


def serial_cost(arr: CostArrays, dev) -> PlanCost:
    """The serial objective of a placement (module docstring)."""
    dev = as_placement(arr, dev)
    compute = float(arr.op_s[np.arange(arr.n_ops), dev].sum())
    t, s, d = copy_pairs(arr, dev)
    return PlanCost(compute, float(arr.copy_s(t, s, d).sum()))


def plan_copies(arr: CostArrays, dev) -> list[PlanCopy]:
    """The copies a placement needs, one per tensor and destination device, with the ops
    that read each copy (-1 stands for the host reading an external output)."""
    dev = as_placement(arr, dev)
    t, s, d = copy_pairs(arr, dev)
    secs = arr.copy_s(t, s, d)
    names, kinds = arr.devices, arr.device_kinds
    out = []
    for tt, ss, dd, sec in zip(t.tolist(), s.tolist(), d.tolist(), secs.tolist()):
        cons = arr.t_cons[arr.t_ptr[tt]:arr.t_ptr[tt + 1]]
        readers = tuple(int(c) for c in cons[dev[cons] == dd])
        if dd == arr.host and arr.outputs_on_host and arr.t_ext_out[tt]:
            readers += (-1,)
        out.append(PlanCopy(arr.tensor_name(tt), names[ss], names[dd], float(arr.t_bytes[tt]), sec,
                            int(arr.t_producer[tt]), readers, kinds[ss], kinds[dd]))
    return out


# ------------------------------------------------------------------------ memory

def device_memory(arr: CostArrays, dev, curves: bool = False):
    """Memory of a placement per device (module docstring).

    Returns (params [k], peak activations [k], step of each peak [k]); with ``curves``,
    (params [k], live activation bytes [k, n] at every step, None).
    """
    dev = as_placement(arr, dev)
    n, k, T = arr.n_ops, arr.k, arr.n_tensors
    et, cons = arr.entry_tensor, arr.t_cons
    cdev = dev[cons]
    params = arr.t_producer == PARAM
    pe = params[et]
    pkey = np.unique(et[pe] * k + cdev[pe])
    param_bytes = np.bincount(pkey % k, weights=arr.t_bytes[pkey // k], minlength=k)[:k]
    # live intervals per (tensor, device): reader entries, plus the producer's own step
    act = ~pe
    made = np.flatnonzero(arr.t_producer >= 0)
    keys = np.concatenate([et[act] * k + cdev[act], made * k + dev[arr.t_producer[made]]])
    pos = np.concatenate([cons[act], arr.t_producer[made]])
    order = np.lexsort((pos, keys))
    keys, pos = keys[order], pos[order]
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(keys))[:len(starts)] - 1   # (none when nothing is live)
    key, start, end = keys[starts], pos[starts], pos[ends]
    t, d = key // k, key % k
    if not arr.outputs_on_host:
        kept = arr.t_ext_out[t] & (arr.t_producer[t] >= 0)
        kept &= d == dev[np.maximum(arr.t_producer[t], 0)]
        end = np.where(kept, n - 1, end)
    nb = arr.t_bytes[t]
    diff = np.zeros(k * (n + 1))
    _accumulate(diff, d * (n + 1) + start, nb)
    _accumulate(diff, d * (n + 1) + end + 1, -nb)
    curve = np.cumsum(diff.reshape(k, n + 1), axis=1)[:, :n]
    curve[dev, np.arange(n)] += arr.scratch_bytes
    if curves:
        return param_bytes, curve, None
    if n == 0:
        return param_bytes, np.zeros(k), np.zeros(k, np.int64)
    step = curve.argmax(axis=1)
    return param_bytes, curve[np.arange(k), step], step


def _accumulate(target: np.ndarray, index: np.ndarray, weights: np.ndarray) -> None:
    if len(index):
        target += np.bincount(index, weights=weights, minlength=len(target))


def memory_use(arr: CostArrays, dev) -> np.ndarray:
    """Bytes each device needs for a placement: parameters + peak activations."""
    params, peak, _ = device_memory(arr, dev)
    return params + peak


def fits(arr: CostArrays, dev) -> bool:
    return bool((memory_use(arr, dev) <= arr.capacity * SLACK).all())


def check_pinned_fit(arr: CostArrays) -> None:
    """InfeasiblePlanError when the ops forced onto one device alone exceed its capacity.
    A device's memory depends only on the ops placed on it, so the forced ops are put
    there and every other op anywhere else."""
    forced = arr.forced
    own = arr.read_param_bytes + arr.written_bytes
    for d in np.flatnonzero(np.isfinite(arr.capacity)).tolist():
        on_d = forced == d
        if not on_d.any():
            continue
        dev = np.where(on_d, d, (d + 1) % arr.k)
        params, peak, _ = device_memory(arr, dev)
        used, capacity = params[d] + peak[d], float(arr.capacity[d])
        if used <= capacity * SLACK:
            continue
        ops = np.flatnonzero(on_d)
        heavy = ops[np.argsort(-own[ops], kind="stable")][:5]
        raise InfeasiblePlanError(
            f"the ops pinned to {arr.devices[d]} need {used / 2**20:.1f} MiB of its memory, "
            f"{(used - capacity) / 2**20:.1f} MiB over the {capacity / 2**20:.1f} MiB usable: "
            + ", ".join(f"{arr.op_label(i)} ({own[i] / 2**20:.1f} MiB)" for i in heavy),
            hint=f"unpin some of them, or give {arr.devices[d]} more memory (--gpu-mem, "
                 "--gpu-reserve, the machine profile)")


# ------------------------------------------------------------------------ moves

def _tensor_copy_cost(arr: CostArrays, dev: np.ndarray, t: int, moved: dict[int, int] | None = None) -> float:
    """Copy seconds of one tensor under a placement (the reference, loop form); ``moved``
    maps ops to the device they take instead of ``dev``'s."""
    p = int(arr.t_producer[t])
    if p == PARAM:
        return 0.0
    moved = moved or {}
    src = arr.host if p == HOST else moved.get(p, int(dev[p]))
    cons = arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]].tolist()
    dests = {moved.get(c, d) for c, d in zip(cons, dev[cons].tolist())}
    if arr.outputs_on_host and arr.t_ext_out[t]:
        dests.add(arr.host)
    dests.discard(src)
    return float(sum(arr.class_s[arr.link_class[src, e], t] for e in dests))


def move_delta(arr: CostArrays, dev, ops, to: int) -> tuple[float, int]:
    """Change of the serial cost if ``ops`` all move to device ``to``, and the tensor whose
    copy cost grows the most (-1 if none). ``dev`` is left unchanged."""
    dev = as_placement(arr, dev)
    ops = np.atleast_1d(np.asarray(ops, np.int64))
    cptr, cten = arr.consumed_by
    pptr, pten = arr.produced_by
    touched = np.unique(np.concatenate([cten[cptr[i]:cptr[i + 1]] for i in ops]
                                       + [pten[pptr[i]:pptr[i + 1]] for i in ops]))
    before = np.array([_tensor_copy_cost(arr, dev, t) for t in touched.tolist()])
    moved = dict.fromkeys(ops.tolist(), int(to))   # not a copy of dev: this is called per op
    after = np.array([_tensor_copy_cost(arr, dev, t, moved) for t in touched.tolist()])
    compute = float((arr.op_s[ops, to] - arr.op_s[ops, dev[ops]]).sum())
    grow = after - before
    worst = int(touched[np.argmax(grow)]) if len(touched) and grow.max() > 0 else -1
    return compute + float(grow.sum()), worst


def move_deltas(arr: CostArrays, dev, to: int) -> np.ndarray:
    """Change of the serial cost if each op alone moved to device ``to`` (vectorised
    ``move_delta`` for every op at once; colocation ignored; 0 for ops already there)."""
    dev = as_placement(arr, dev)
    n, k, T = arr.n_ops, arr.k, arr.n_tensors
    et, cons = arr.entry_tensor, arr.t_cons
    live = arr.t_producer != PARAM
    src = arr.tensor_source(dev)
    # reader counts per (tensor, device) over live tensors (host reader of outputs included)
    rt, rd = et[live[et]], dev[cons[live[et]]]
    if arr.outputs_on_host:
        ext = np.flatnonzero(arr.t_ext_out & live)
        rt, rd = np.concatenate([rt, ext]), np.concatenate([rd, np.full(len(ext), arr.host)])
    keys, counts = np.unique(rt * k + rd, return_counts=True)

    def count(t, d):
        if not len(keys):
            return np.zeros(len(t), np.int64)
        q = t * k + d
        at = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
        return np.where(keys[at] == q, counts[at], 0)

    delta = arr.op_s[:, to] - arr.op_s[np.arange(n), dev]
    # 1. tensors an op makes: their source moves from dev[p] to `to`
    made = np.flatnonzero((arr.t_producer >= 0) & live)
    kt, kd = keys // k, keys % k
    old_cost = np.zeros(T)
    new_cost = np.zeros(T)
    mk = np.isin(kt, made)
    a = src[kt[mk]]
    old_cost += np.bincount(kt[mk], weights=np.where(kd[mk] != a, arr.class_s[arr.link_class[a, kd[mk]], kt[mk]], 0.0),
                            minlength=T)
    new_cost += np.bincount(kt[mk], weights=np.where(kd[mk] != to, arr.class_s[arr.link_class[to, kd[mk]], kt[mk]], 0.0),
                            minlength=T)
    p = arr.t_producer[made]
    moved = dev[p] != to
    delta += np.bincount(p[moved], weights=(new_cost - old_cost)[made[moved]], minlength=n)
    # 2. tensors an op reads (made by another op or the host): the reader leaves dev[c] for `to`
    e = np.flatnonzero(live[et])
    t, c = et[e], cons[e]
    a, s = dev[c], src[t]
    own = arr.t_producer[t] == c          # an op never reads its own output here
    go = (a != to) & ~own
    t, c, a, s = t[go], c[go], a[go], s[go]
    change = np.zeros(len(t))
    leaving = (a != s) & (count(t, a) == 1)          # the last reader on a: that copy goes
    change -= np.where(leaving, arr.class_s[arr.link_class[s, a], t], 0.0)
    arriving = (to != s) & (count(t, np.full(len(t), to)) == 0)   # the first reader on `to`
    change += np.where(arriving, arr.class_s[arr.link_class[s, np.full(len(t), to)], t], 0.0)
    delta += np.bincount(c, weights=change, minlength=n)
    delta[dev == to] = 0.0
    return delta


__all__ = ["CostArrays", "from_graph", "HOST", "PARAM", "FREE", "as_placement", "respecting_pins", "copy_pairs",
           "serial_cost", "plan_copies", "device_memory", "memory_use", "fits", "SLACK", "check_pinned_fit",
           "move_delta", "move_deltas"]
