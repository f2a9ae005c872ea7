"""Turn a placement into a ``Plan``: its cost, copies, memory per device, and a reason per op.

Reasons are derived from the costs, never invented. Each op's **second-best** device is
the one it would cost the plan least to move it to alone (``problem.move_deltas``); the
reason says why the op is where it is and not there:
- it is faster where it is: "cuda:0 14x faster than cpu";
- it is as fast or slower where it is: the copy that moving it would add ("cpu: copy of
  'x' to cuda:0 costs more than cuda:0 saves"), or the memory it would not fit in
  ("cpu: its 2.1 GB of parameters do not fit on cuda:0");
- pinned or colocated ops say so.
At most ``MAX_EXPLAINED_MOVES`` ops get the blob-naming reason (each a ``move_delta`` of
its colocation group, local to the blobs it touches); the rest a generic one, so that a
million-op plan is explained in linear time.
"""
from __future__ import annotations

import numpy as np

from placer.partition.problem import (FREE, CostArrays, as_placement, device_memory, memory_use,
                                      move_delta, move_deltas, plan_copies, serial_cost)
from placer.types import Plan
from placer.units import fmt_bytes

MAX_EXPLAINED_MOVES = 2000  # ops whose reason names a blob; the rest a generic one


def make_plan(arr: CostArrays, dev, method: str, objective: str = "serial",
              optimal: bool = False, gap: float | None = None,
              capacity=None, notes: list[str] | None = None, explain: bool = True) -> Plan:
    """A Plan of a placement (``dev``: a device index per op). ``capacity`` is the usable
    memory per device the plan was made for (default: ``arr.capacity``); ``explain``
    False leaves ``reasons`` empty (a baseline's: no one reads them)."""
    dev = as_placement(arr, dev).copy()
    params, peak, _ = device_memory(arr, dev)
    cap = arr.capacity if capacity is None else np.broadcast_to(np.asarray(capacity, float), (arr.k,))
    return Plan(placement=dev, devices=tuple(arr.devices), device_kinds=tuple(arr.device_kinds),
                copies=plan_copies(arr, dev), cost=serial_cost(arr, dev), method=method,
                objective=objective, optimal=optimal, gap=gap, memory_bytes=params + peak,
                capacity_bytes=np.array(cap, float), reasons=reasons(arr, dev) if explain else {},
                notes=list(notes or []))


def second_best(arr: CostArrays, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each op: the device it would cost least to move it to alone, and that cost
    change (inf where it may take no other device)."""
    n = arr.n_ops
    best_d = np.full(n, -1, np.int64)
    best = np.full(n, np.inf)
    if arr.k < 2:          # one device: nowhere else to go
        return best_d, best
    feasible = arr.feasible
    for d in range(arr.k):
        delta = move_deltas(arr, dev, d)
        ok = feasible[:, d] & (dev != d) & (delta < best)
        best_d[ok], best[ok] = d, delta[ok]
    return best_d, best


def reasons(arr: CostArrays, dev: np.ndarray) -> dict[int, str]:
    """A short why per op (see the module docstring)."""
    dev = as_placement(arr, dev)
    names = arr.devices
    n = arr.n_ops
    other, _ = second_best(arr, dev) if n else (np.zeros(0, np.int64), None)
    rows = np.arange(n)
    here = arr.op_s[rows, dev]
    there = np.where(other >= 0, arr.op_s[rows, np.maximum(other, 0)], np.inf)
    out: dict[int, str] = {}
    forced = arr.forced
    restricted = ~arr.allowed.all(axis=1)
    against = []
    for i in range(n):
        if forced[i] != FREE:
            if restricted[i]:
                out[i] = arr.pin_reason[i] if arr.pin_reason and arr.pin_reason[i] else f"pinned: {names[dev[i]]}"
            else:
                out[i] = f"colocated with an op pinned to {names[forced[i]]}"
        elif other[i] < 0:
            out[i] = f"{names[dev[i]]}: the only device it may take"
        elif here[i] < there[i]:
            out[i] = f"{names[dev[i]]} {_ratio(there[i], here[i])} faster than {names[other[i]]}"
        else:
            against.append(i)
    use = None
    for j, i in enumerate(against):
        if j >= MAX_EXPLAINED_MOVES:
            out[i] = (f"{names[dev[i]]}: same time as {names[other[i]]}" if here[i] == there[i]
                      else f"{names[dev[i]]}: copies cost more than {names[other[i]]} saves")
            continue
        if use is None:
            use = memory_use(arr, dev)
        out[i] = _against(arr, dev, i, arr.group_of(i), int(other[i]), here[i], there[i], use)
    return out


def _ratio(slow: float, fast: float) -> str:
    if fast <= 0:
        return "much"
    r = slow / fast
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


def _against(arr: CostArrays, dev: np.ndarray, i: int, comp: np.ndarray, to: int, here: float, there: float,
             use: np.ndarray) -> str:
    """Why op i (of colocation group ``comp``) is not on ``to``, where it alone would run
    at least as fast. ``use``: the bytes each device holds now; the op does not fit on
    ``to`` when they plus what it brings there (its parameters and outputs, a bound on its
    activations) pass the limit."""
    names = arr.devices
    delta, worst = move_delta(arr, dev, comp, to)
    where, dest = names[dev[i]], names[to]
    if delta < 0 and np.isfinite(arr.capacity[to]):   # moving would pay: memory holds it back
        own = float(arr.read_param_bytes[comp].sum())
        brings = own + float(arr.written_bytes[comp].sum())
        if use[to] + brings > arr.capacity[to]:
            over = use[to] + brings - arr.capacity[to]
            if own >= 0.5 * over:
                return f"{where}: its {fmt_bytes(own)} of parameters do not fit on {dest}"
            return f"{where}: does not fit in {dest} memory"
    blob = f"'{arr.tensor_name(worst)}'" if worst >= 0 else "its blobs"
    if len(comp) > 1:
        head = arr.op_label(int(comp[0]) if comp[0] != i else int(comp[-1]))
        return f"{where}: shares a device with {head} (in place); moving them costs a copy of {blob}"
    if here == there:
        return f"{where}: same time as {dest}; moving adds a copy of {blob}"
    return f"{where}: copy of {blob} costs more than {dest} saves"


__all__ = ["make_plan", "reasons", "second_best"]
