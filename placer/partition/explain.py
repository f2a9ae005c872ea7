"""Turn a placement into a ``Plan``: its cost, copies, GPU memory, and a reason per op.

Reasons are derived from the costs, never invented: an op's reason names the device
that is faster for it alone, or, when the plan goes against that, the copy or the memory
that made the difference (found by moving the op alone to the other device).
"""
from __future__ import annotations

import numpy as np

from placer.partition.problem import (PIN_NONE, CostArrays, flip_delta, gpu_memory,
                                      placement_dict, plan_copies, serial_cost)
from placer.types import Plan
from placer.units import fmt_bytes

MAX_EXPLAINED_MOVES = 2000  # ops whose reason names a blob; the rest a generic one


def make_plan(arr: CostArrays, on_gpu: np.ndarray, method: str, objective: str = "serial",
              optimal: bool = False, gap: float | None = None,
              capacity: float | None = None, notes: list[str] | None = None) -> Plan:
    on_gpu = np.asarray(on_gpu, bool).copy()
    params, peak, _ = gpu_memory(arr, on_gpu)
    return Plan(placement=placement_dict(on_gpu), copies=plan_copies(arr, on_gpu),
                cost=serial_cost(arr, on_gpu), method=method, objective=objective,
                optimal=optimal, gap=gap, gpu_memory_bytes=params + peak,
                gpu_capacity_bytes=capacity, reasons=reasons(arr, on_gpu, capacity),
                notes=list(notes or []))


def reasons(arr: CostArrays, on_gpu: np.ndarray, capacity: float | None) -> dict[int, str]:
    """A short why per op (see the module docstring)."""
    cpu, gpu = arr.cpu_s, arr.gpu_s
    out: dict[int, str] = {}
    against = []
    for i, (g, c_s, g_s, pin) in enumerate(zip(on_gpu.tolist(), cpu.tolist(), gpu.tolist(),
                                               arr.pin.tolist())):
        if pin != PIN_NONE:
            out[i] = (arr.pin_reason[i] if arr.pin_reason and arr.pin_reason[i]
                      else f"pinned: {'gpu' if pin else 'cpu'}")
        elif arr.forced[i] != PIN_NONE:
            out[i] = f"colocated with an op pinned to {'gpu' if arr.forced[i] else 'cpu'}"
        elif g and g_s < c_s:
            out[i] = f"GPU {_ratio(c_s, g_s)} faster"
        elif not g and c_s <= g_s:
            out[i] = f"CPU {_ratio(g_s, c_s)} faster" if c_s < g_s else "CPU: same time"
        else:
            against.append(i)
    for k, i in enumerate(against):
        out[i] = _against(arr, on_gpu, i, capacity) if k < MAX_EXPLAINED_MOVES else (
            "GPU: keeps copies away" if on_gpu[i] else "CPU: copies cost more than GPU saves")
    return out


def _ratio(slow: float, fast: float) -> str:
    if fast <= 0:
        return "much"
    r = slow / fast
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


def _against(arr: CostArrays, on_gpu: np.ndarray, i: int, capacity: float | None) -> str:
    """Why op i sits on its individually slower device."""
    comp = np.flatnonzero(arr.component == arr.component[i])
    delta, worst = flip_delta(arr, on_gpu, comp)
    if on_gpu[i]:
        name = f"'{arr.tensor_name(worst)}'" if worst >= 0 else "its blobs"
        if len(comp) > 1:  # it follows the ops it must share a device with
            head = arr.op_label(int(comp[0]) if comp[0] != i else int(comp[-1]))
            return f"GPU: shares a device with {head} (in place); moving them costs a copy of {name}"
        return f"GPU: copy of {name} costs more than CPU saves"
    if delta < 0 and capacity is not None:
        on_gpu[comp] = True
        params, peak, _ = gpu_memory(arr, on_gpu)
        on_gpu[comp] = False
        if params + peak > capacity:
            own = float(arr.read_param_bytes[comp].sum())
            if own >= 0.5 * (params + peak - capacity):
                return f"CPU: its {fmt_bytes(own)} of parameters do not fit in GPU memory"
            return "CPU: does not fit in GPU memory"
    if worst >= 0:
        return f"CPU: copy of '{arr.tensor_name(worst)}' costs more than GPU saves"
    return "CPU: moving it alone to the GPU does not pay"
