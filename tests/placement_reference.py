"""Independent references for the k-device partition tests: every placement of a small
net enumerated, its serial cost and its memory per device computed from the definitions
(DESIGN.md "Partitioning", ``problem``'s docstring), vectorised over placements only.
Nothing here calls the code under test."""
from __future__ import annotations

import itertools

import numpy as np

PARAM, HOST = -2, -1


def placements(arr) -> np.ndarray:
    """Every placement [R, n] that puts each op on an allowed device and colocated ops
    together."""
    n = arr.n_ops
    choices = [np.flatnonzero(arr.allowed[i]) for i in range(n)]
    rows = np.array(list(itertools.product(*choices)), np.int64).reshape(-1, n)
    for a, b in np.asarray(arr.colocate).reshape(-1, 2).tolist():
        rows = rows[rows[:, a] == rows[:, b]]
    return rows


def count_placements(arr) -> int:
    return int(np.prod([arr.allowed[i].sum() for i in range(arr.n_ops)], dtype=float))


def _readers(arr, t):
    return sorted(set(int(c) for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]))


def serial_costs(arr, P: np.ndarray) -> np.ndarray:
    """Serial cost of each placement: op times on their devices, plus one copy of every
    non-parameter tensor to each device it is read on other than where it starts (the
    producer's device, the host for a host-fed one); the host reads external outputs back
    when ``outputs_on_host``."""
    R, n = P.shape
    total = arr.op_s[np.arange(n), P].sum(axis=1) if n else np.zeros(R)
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        if p == PARAM:
            continue
        src = P[:, p] if p >= 0 else np.full(R, arr.host)
        cons = _readers(arr, t)
        for e in range(arr.k):
            read = (P[:, cons] == e).any(axis=1) if cons else np.zeros(R, bool)
            if arr.outputs_on_host and arr.t_ext_out[t] and e == arr.host:
                read[:] = True
            need = read & (src != e)
            cls = arr.link_class[np.where(need, src, 0), e]
            total = total + np.where(need, arr.class_s[np.maximum(cls, 0), t], 0.0)
    return total


def memory_bytes(arr, P: np.ndarray) -> np.ndarray:
    """[R, k] bytes per device, step by step: parameters read on a device for the whole
    run; a blob made there from its producer's step to its last reader there (to the end
    when it is an external output left on its device); a blob copied in from its first to
    its last reader there; bytes an op writes beyond its blobs during its own step."""
    R, n = P.shape
    out = np.zeros((R, arr.k))
    steps = np.arange(n)
    made_bytes = np.zeros(n)
    for t in range(arr.n_tensors):
        if arr.t_producer[t] >= 0:
            made_bytes[arr.t_producer[t]] += arr.t_bytes[t]
    scratch = np.maximum(np.asarray(arr.output_bytes, float) - made_bytes, 0.0)
    for e in range(arr.k):
        params = np.zeros(R)
        live = np.zeros((R, n))
        for t in range(arr.n_tensors):
            p = int(arr.t_producer[t])
            b = float(arr.t_bytes[t])
            cons = np.array(_readers(arr, t), np.int64)
            on = P[:, cons] == e if len(cons) else np.zeros((R, 0), bool)
            if p == PARAM:
                params += np.where(on.any(axis=1), b, 0.0)
                continue
            big = n + 1
            first = np.where(on, cons, big).min(axis=1, initial=big)
            last = np.where(on, cons, -1).max(axis=1, initial=-1)
            if p >= 0:
                here = P[:, p] == e
                end = np.maximum(last, p)
                if arr.t_ext_out[t] and not arr.outputs_on_host:
                    end = np.full(R, n - 1)
                start = np.where(here, p, first)
                end = np.where(here, end, last)
            else:
                start, end = first, last
            live += b * ((steps >= start[:, None]) & (steps <= end[:, None]))
        live += np.where(P == e, scratch, 0.0)
        out[:, e] = params + (live.max(axis=1) if n else 0.0)
    return out


def random_constraints(arr, rng, pin_p: float = 0.08, pairs: int = 2):
    """Random user pins (an op allowed on one random device of its own) and colocation
    pairs on top of a random net (may make it infeasible: callers check)."""
    n = arr.n_ops
    allowed = arr.allowed.copy()
    for i in range(n):
        if rng.random() < pin_p:
            d = int(rng.choice(np.flatnonzero(allowed[i])))
            allowed[i] = False
            allowed[i, d] = True
    arr.allowed = allowed
    if n >= 2 and rng.random() < 0.5:
        pr = rng.integers(0, n, (int(rng.integers(1, pairs + 1)), 2))
        arr.colocate = pr[pr[:, 0] != pr[:, 1]].astype(np.int64)
    return arr


def hand_arrays(ops, tensors, link_class=None, devices=None, colocate=(), outputs_on_host=True,
                capacity=None, pin_reason=None):
    """CostArrays from short rows (k devices).

    ops: per op, its seconds on each device (None: it may not run there).
    tensors: (name, producer, consumers, copy seconds per link class) with an optional
    5th ext_output (default False) and 6th bytes (default 1e6); producer -1 is the host,
    -2 the init net. ``link_class`` [k, k] defaults to host <-> GPU classes 0 (h2d) and
    1 (d2h) and class 2 between GPUs."""
    from placer.costs.arrays import CostArrays
    n, k = len(ops), len(ops[0])
    devices = devices or ("cpu",) + tuple(f"cuda:{g}" for g in range(k - 1))
    if link_class is None:
        link_class = np.full((k, k), 2)
        link_class[0, :], link_class[:, 0] = 0, 1
        np.fill_diagonal(link_class, -1)
    op_s = np.array([[1e9 if s is None else s for s in row] for row in ops], float)
    allowed = np.array([[s is not None for s in row] for row in ops], bool)
    rows = list(tensors)
    counts = [len(r[2]) for r in rows]
    nbytes = np.array([r[5] if len(r) > 5 else 1e6 for r in rows], float)
    producer = np.array([r[1] for r in rows], np.int64)
    made = np.bincount(producer[producer >= 0], weights=nbytes[producer >= 0], minlength=n)
    n_classes = int(link_class.max()) + 1
    class_s = np.array([[r[3][c] if c < len(r[3]) else np.inf for r in rows] for c in range(n_classes)], float)
    return CostArrays(
        op_s=op_s, allowed=allowed, param_bytes=np.zeros(n), output_bytes=made,
        t_producer=producer, t_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        t_cons=np.array([c for r in rows for c in r[2]], np.int64), t_bytes=nbytes,
        t_ext_out=np.array([bool(r[4]) if len(r) > 4 else False for r in rows]),
        link_class=np.asarray(link_class, np.int64), class_s=class_s, devices=tuple(devices),
        device_kinds=tuple("cpu" if d == "cpu" else "gpu" for d in devices),
        capacity=None if capacity is None else np.asarray(capacity, float),
        colocate=np.asarray(colocate, np.int64).reshape(-1, 2), outputs_on_host=outputs_on_host,
        names=[f"op{i}" for i in range(n)], types=["FC"] * n, t_names=[r[0] for r in rows],
        pin_reason=pin_reason)


def two_device_net(ops, tensors, **kw):
    """``hand_arrays`` for a CPU + one GPU machine from the single-GPU rows: ops
    (cpu_s, gpu_s) or (cpu_s, gpu_s, has_gpu_kernel); tensors (name, producer, consumers,
    h2d_s, d2h_s) with optional 6th ext_output and 7th bytes."""
    op_rows = [(o[0], o[1] if (len(o) < 3 or o[2]) else None) for o in ops]
    t_rows = [(t[0], t[1], t[2], (t[3], t[4])) + tuple(t[5:]) for t in tensors]
    reasons = ["pinned: no GPU kernel" if len(o) > 2 and not o[2] else "" for o in ops]
    return hand_arrays(op_rows, t_rows, pin_reason=reasons, **kw)
