"""Invariants every plan must satisfy, checked from scratch with plain loops.

``check_plan(arr, plan, capacity=None)`` recomputes what a plan claims without the
vectorised code the partitioners use: every op placed once on a device of the machine
it may run on, colocated ops together, exactly the copies the placement needs (one per
tensor and destination device, leaving the producer's device, or the host for a
host-fed tensor), memory per device within ``capacity`` (default ``arr.capacity``) and
equal to what the plan reports, and the reported cost equal to the cost recomputed here
(relative 1e-9).
"""
from __future__ import annotations

import numpy as np

from placer.partition.problem import HOST, PARAM

REL = 1e-9


class PlanInvariantError(AssertionError):
    """A plan that breaks an invariant: a bug in a partitioner, never a user error."""


def check_plan(arr, plan, capacity=None) -> None:
    problems: list[str] = []
    dev = _devices(arr, plan, problems)
    if dev is None:
        raise PlanInvariantError("; ".join(problems))
    names = arr.devices
    for i, d in enumerate(dev):
        if not arr.allowed[i, d]:
            ok = ", ".join(names[e] for e in range(arr.k) if arr.allowed[i, e])
            problems.append(f"op {i} is placed on {names[d]} where it may not run (only {ok})")
    for a, b in arr.colocate.tolist():
        if dev[a] != dev[b]:
            problems.append(f"ops {a} and {b} must share a device: {names[dev[a]]} and {names[dev[b]]}")
    _check_copies(arr, plan, dev, problems)
    _check_memory(arr, plan, dev, arr.capacity if capacity is None else capacity, problems)
    if problems:
        raise PlanInvariantError("; ".join(problems))


def _devices(arr, plan, problems: list[str]):
    if tuple(plan.devices) != tuple(arr.devices):
        problems.append(f"plan is over devices {tuple(plan.devices)}, the machine has {tuple(arr.devices)}")
        return None
    placement = np.asarray(plan.placement).tolist()
    if len(placement) != arr.n_ops:
        problems.append(f"placement covers {len(placement)} ops, the net has {arr.n_ops}")
        return None
    bad = [i for i, d in enumerate(placement) if not (isinstance(d, int) and 0 <= d < arr.k)]
    if bad:
        problems.append(f"op {bad[0]} placed on unknown device {placement[bad[0]]!r}")
        return None
    return placement


def _needed_copies(arr, dev):
    """{(tensor, source, destination): seconds} the placement needs, by plain loops."""
    need = {}
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        if p == PARAM:
            continue
        src = arr.host if p == HOST else dev[p]
        readers = {dev[int(c)] for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]}
        if arr.outputs_on_host and arr.t_ext_out[t]:
            readers.add(arr.host)
        for dst in sorted(readers - {src}):
            need[(arr.tensor_name(t), arr.devices[src], arr.devices[dst])] = \
                float(arr.class_s[arr.link_class[src, dst], t])
    return need


def _check_copies(arr, plan, dev, problems):
    need = _needed_copies(arr, dev)
    have = {(c.tensor, c.src, c.dst): c.time_s for c in plan.copies}
    if len(have) != len(plan.copies):
        problems.append("a copy is listed twice")
    if set(have) != set(need):
        problems.append(f"copies differ: missing {sorted(set(need) - set(have))[:5]}, "
                        f"extra {sorted(set(have) - set(need))[:5]}")
    for key in sorted(set(have) & set(need)):
        if abs(have[key] - need[key]) > REL * max(need[key], 1e-300):
            problems.append(f"copy {key} takes {need[key]!r} s, the plan says {have[key]!r}")
            break
    compute_s = 0.0
    for i, d in enumerate(dev):
        compute_s += float(arr.op_s[i, d])
    copy_s = sum(need.values())
    for what, mine, theirs in (("compute_s", compute_s, plan.cost.compute_s),
                               ("copy_s", copy_s, plan.cost.copy_s),
                               ("total_s", compute_s + copy_s, plan.cost.total_s)):
        if abs(mine - theirs) > REL * max(abs(mine), 1e-300):
            problems.append(f"{what}: plan says {theirs!r}, recomputed {mine!r}")
    listed = sum(c.time_s for c in plan.copies)
    if abs(listed - copy_s) > REL * max(copy_s, 1e-300):
        problems.append(f"copies listed add up to {listed!r} s, recomputed {copy_s!r}")


def memory_by_loops(arr, dev) -> list[float]:
    """Bytes per device: parameters read there + the peak over steps of live blobs there
    (made there: from its producer's step to its last reader there, to the end when an
    external output stays on its device; copied in: from its first to its last reader
    there) + bytes an op writes beyond its blobs during its own step."""
    n, k = arr.n_ops, arr.k
    params = [0.0] * k
    change = [[0.0] * (n + 1) for _ in range(k)]   # live bytes change at each step
    made_bytes = [0.0] * n
    producer, nbytes, ext = arr.t_producer.tolist(), arr.t_bytes.tolist(), arr.t_ext_out.tolist()
    ptr, cons = arr.t_ptr.tolist(), arr.t_cons.tolist()
    for t in range(arr.n_tensors):
        p, b = producer[t], nbytes[t]
        span: dict[int, list[int]] = {}              # device -> [first, last] reader there
        for c in cons[ptr[t]:ptr[t + 1]]:
            s = span.setdefault(dev[c], [c, c])
            s[0], s[1] = min(s[0], c), max(s[1], c)
        if p == PARAM:
            for d in span:
                params[d] += b
            continue
        if p >= 0:
            made_bytes[p] += b
            here = span.setdefault(dev[p], [p, p])
            here[0] = p
            if ext[t] and not arr.outputs_on_host:
                here[1] = n - 1
        for d, (start, end) in span.items():
            change[d][start] += b
            change[d][end + 1] -= b
    written = arr.output_bytes.tolist()
    out = []
    for d in range(k):
        live, peak = 0.0, 0.0
        for i in range(n):
            live += change[d][i]
            scratch = max(written[i] - made_bytes[i], 0.0) if dev[i] == d else 0.0
            peak = max(peak, live + scratch)
        out.append(params[d] + peak)
    return out


def _check_memory(arr, plan, dev, capacity, problems):
    used = memory_by_loops(arr, dev)
    capacity = np.broadcast_to(np.asarray(capacity, float), (arr.k,))
    reported = np.asarray(plan.memory_bytes, float)
    for d in range(arr.k):
        if used[d] > capacity[d] * (1 + REL):
            problems.append(f"{arr.devices[d]} memory {used[d]:.0f} B exceeds capacity {capacity[d]:.0f} B")
        if len(reported) != arr.k or abs(used[d] - reported[d]) > REL * max(used[d], 1.0):
            problems.append(f"plan reports {reported.tolist()} bytes per device, recomputed {used}")
            break
