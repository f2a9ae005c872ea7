"""Invariants every plan must satisfy, checked from scratch with plain loops.

``check_plan(graph, plan, capacity=None)`` recomputes what a plan claims without the
vectorised code the partitioners use: each op placed once on a known device, pins and
colocation honoured, exactly the copies the placement needs (one per blob and direction,
wherever a reader's device differs from the producer's), GPU memory within capacity,
and the reported cost equal to the cost recomputed here (relative 1e-9).
"""
from __future__ import annotations

from placer.partition.problem import HOST, PARAM, from_graph, gpu_memory

REL = 1e-9


class PlanInvariantError(AssertionError):
    """A plan that breaks an invariant: a bug in a partitioner, never a user error."""


def check_plan(graph, plan, capacity: float | None = None) -> None:
    arr = from_graph(graph)
    problems: list[str] = []
    n = arr.n_ops
    dev = _devices(plan, n, problems)
    if dev is None:
        raise PlanInvariantError("; ".join(problems))
    forced = arr.forced.tolist()
    for i in range(n):
        if forced[i] >= 0 and dev[i] != ("gpu" if forced[i] == 1 else "cpu"):
            problems.append(f"op {i} is pinned to {'gpu' if forced[i] == 1 else 'cpu'} "
                            f"but placed on {dev[i]}")
    for a, b in arr.colocate.tolist():
        if dev[a] != dev[b]:
            problems.append(f"ops {a} and {b} must share a device")
    need, copy_s = _needed_copies(arr, dev)
    have = {(c.tensor, c.direction) for c in plan.copies}
    if len(have) != len(plan.copies):
        problems.append("a copy is listed twice")
    if have != set(need):
        problems.append(f"copies differ: missing {sorted(set(need) - have)[:5]}, "
                        f"extra {sorted(have - set(need))[:5]}")
    compute_s = sum(arr.gpu_s[i] if dev[i] == "gpu" else arr.cpu_s[i] for i in range(n))
    total = compute_s + copy_s
    for what, mine, theirs in (("compute_s", compute_s, plan.cost.compute_s),
                               ("copy_s", copy_s, plan.cost.copy_s),
                               ("total_s", total, plan.cost.total_s)):
        if abs(mine - theirs) > REL * max(abs(mine), 1e-300):
            problems.append(f"{what}: plan says {theirs!r}, recomputed {mine!r}")
    listed = sum(c.time_s for c in plan.copies)
    if abs(listed - copy_s) > REL * max(copy_s, 1e-300):
        problems.append(f"copies listed add up to {listed!r} s, recomputed {copy_s!r}")
    if capacity is not None:
        on_gpu = [d == "gpu" for d in dev]
        params, peak, step = gpu_memory(arr, on_gpu)
        if params + peak > capacity * (1 + REL):
            problems.append(f"GPU memory {params + peak:.0f} B (peak at op {step}) "
                            f"exceeds capacity {capacity:.0f} B")
        if abs(params + peak - plan.gpu_memory_bytes) > REL * max(params + peak, 1.0):
            problems.append(f"plan reports {plan.gpu_memory_bytes} GPU bytes, "
                            f"recomputed {params + peak}")
    if problems:
        raise PlanInvariantError("; ".join(problems))


def _devices(plan, n: int, problems: list[str]):
    keys = set(plan.placement)
    if keys != set(range(n)):
        problems.append(f"placement covers {len(keys)} ops, the net has {n} "
                        f"(missing {sorted(set(range(n)) - keys)[:5]})")
        return None
    dev = []
    for i in range(n):
        d = plan.placement[i]
        kind = d.kind if hasattr(d, "kind") else str(d)
        if kind not in ("cpu", "gpu"):
            problems.append(f"op {i} placed on unknown device {d!r}")
            return None
        dev.append(kind)
    return dev


def _needed_copies(arr, dev):
    """{(tensor, direction)} the placement needs and their total time, by plain loops."""
    need, total = [], 0.0
    for t in range(arr.n_tensors):
        p = int(arr.t_producer[t])
        if p == PARAM:
            continue
        where = "cpu" if p == HOST else dev[p]
        readers = {dev[int(c)] for c in arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]}
        if arr.outputs_on_host and arr.t_ext_out[t]:
            readers.add("cpu")
        if where == "cpu" and "gpu" in readers:
            need.append((arr.tensor_name(t), "h2d"))
            total += float(arr.t_h2d[t])
        if where == "gpu" and "cpu" in readers:
            need.append((arr.tensor_name(t), "d2h"))
            total += float(arr.t_d2h[t])
    return need, total
