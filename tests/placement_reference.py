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
