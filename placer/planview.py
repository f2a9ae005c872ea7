"""What a plan looks like from outside: the JSON document, the serial timeline, memory curves.

``plan_json(result)`` is what ``placer plan --json`` prints and what ``placer report``
reads: enough to recompute the plan's cost by hand (every op's two times and device,
every tensor's bytes, copy times, producer and consumers, and ``outputs_on_host``: whether
external outputs made on the GPU pay their copy back), plus baselines, memory and the
predicted schedules. ``json_text(doc)`` is how it is written out.
"""
from __future__ import annotations

import json

from placer.partition.problem import PIN_CPU, from_graph, gpu_memory, placement_array
from placer.planner import PlanResult
from placer.types import Plan
from placer.units import fmt_bytes, fmt_time

BASELINE_LABELS = {"all_cpu": "all on the CPU", "all_gpu": "all on the GPU (CPU fallback)",
                   "greedy": "greedy (each op on its faster device)", "existing": "your placement",
                   "lower_bound": "lower bound (sum of per-op minima, no copies)"}


def optimality(plan: Plan) -> str:
    """The optimality statement printed beside the plan."""
    if plan.objective == "makespan":
        return "heuristic for the overlapped (makespan) objective; serial cost shown for comparison"
    limit = "" if plan.gpu_capacity_bytes is None else " within the GPU memory limit"
    if plan.optimal:
        return f"optimal for the serial objective{limit}"
    if plan.gap is not None:
        return f"within {100 * plan.gap:.2g}% of the MILP bound{limit}"
    if not any(note.startswith("MILP") for note in plan.notes):
        return f"feasible{limit}; optimality not proven (no MILP was run: time limit 0)"
    return f"feasible{limit}; optimality not proven (the MILP did not finish in time)"


def plan_json(result: PlanResult, profiles: dict | None = None) -> dict:
    net, plan = result.typed.net, result.plan
    arr = result.arrays if result.arrays is not None else from_graph(result.graph)
    on_gpu = placement_array(plan.placement, len(net.ops))
    params, gpu_curve, _ = gpu_memory(arr, on_gpu, curve_only=True)
    cpu_params, cpu_curve, _ = gpu_memory(arr, ~on_gpu, curve_only=True)
    h2d = sum(c.nbytes for c in plan.copies if c.direction == "h2d")
    d2h = sum(c.nbytes for c in plan.copies if c.direction == "d2h")
    return {
        "net": net.name, "path": net.path, "objective": plan.objective,
        "method": result.options.method, "solver": plan.method,
        "total_s": plan.cost.total_s, "compute_s": plan.cost.compute_s, "copy_s": plan.cost.copy_s,
        "optimal": bool(plan.optimal), "gap": _gap(plan), "optimality": optimality(plan),
        "outputs_on_host": bool(arr.outputs_on_host),
        "notes": list(plan.notes), "profiles": profiles or {},
        "ops": _op_records(result, arr, on_gpu), "tensors": _tensor_records(result.costs.tensors),
        "copies": [{"tensor": c.tensor, "direction": c.direction, "bytes": c.nbytes, "time_s": c.time_s,
                    "producer": c.producer, "consumers": list(c.consumers)} for c in plan.copies],
        "baselines": _baselines(result),
        "gpu_memory": {"used_bytes": plan.gpu_memory_bytes, "capacity_bytes": result.capacity_bytes,
                       "usable_bytes": result.usable_bytes, "param_bytes": params,
                       "peak_activation_bytes": float(gpu_curve.max()) if len(gpu_curve) else 0.0},
        "memory_timeline": {"gpu": (params + gpu_curve).tolist(), "cpu": (cpu_params + cpu_curve).tolist()},
        "pcie_bytes": {"h2d": h2d, "d2h": d2h},
        "schedules": {"serial": serial_schedule(result),
                      "makespan": {"makespan_s": result.makespan["makespan_s"],
                                   "events": [_event(result, e) for e in result.makespan["events"]]}},
    }


def _op_records(result: PlanResult, arr, on_gpu) -> list[dict]:
    """One record per op, made from whole table columns (a million ops in seconds)."""
    ops, net, reasons = result.costs.ops, result.typed.net, result.plan.reasons
    copies_in, copies_out = _copies_per_op(result.plan)
    cols = {c: ops[c].tolist() for c in ("index", "name", "type", "cpu_s", "gpu_s", "cpu_source",
                                         "gpu_source", "flops", "param_bytes", "output_bytes")}
    pins = [(None, "cpu", "gpu")[p + 1] for p in arr.pin.tolist()]
    device = ["gpu" if g else "cpu" for g in on_gpu.tolist()]
    out = []
    for k, i in enumerate(cols["index"]):
        i = int(i)
        out.append({
            "index": i, "name": cols["name"][k], "type": cols["type"][k], "device": device[i],
            "cpu_s": float(cols["cpu_s"][k]), "gpu_s": float(cols["gpu_s"][k]),
            "cpu_source": cols["cpu_source"][k], "gpu_source": cols["gpu_source"][k],
            "reason": reasons.get(i, ""), "flops": float(cols["flops"][k]),
            "param_bytes": float(cols["param_bytes"][k]), "output_bytes": float(cols["output_bytes"][k]),
            "outputs": list(net.ops[i].outputs), "pinned": pins[i],
            "copies_in": copies_in.get(i, []), "copies_out": copies_out.get(i, [])})
    return out


def _tensor_records(tensors) -> list[dict]:
    cols = [tensors[c].tolist() for c in ("name", "producer", "consumers", "bytes", "h2d_s", "d2h_s",
                                          "external_output")]
    return [{"name": name, "producer": int(producer), "consumers": [int(c) for c in consumers],
             "bytes": float(nbytes), "h2d_s": float(h2d), "d2h_s": float(d2h), "external_output": bool(ext)}
            for name, producer, consumers, nbytes, h2d, d2h, ext in zip(*cols)]


def _gap(plan: Plan) -> float | None:
    """The relative gap to the bound; rounding noise of a proven optimum reads 0."""
    if plan.gap is None:
        return None
    return 0.0 if plan.optimal and abs(plan.gap) < 1e-9 else float(plan.gap)


def _baselines(result: PlanResult) -> dict:
    out = {}
    for name, b in result.baselines.items():
        if name == "lower_bound":
            out[name] = {"total_s": b.total_s, "label": BASELINE_LABELS[name], "feasible": True}
            continue
        fits = b.gpu_memory_bytes <= result.usable_bytes * (1 + 1e-9)
        entry = {"total_s": b.cost.total_s, "compute_s": b.cost.compute_s, "copy_s": b.cost.copy_s,
                 "gpu_memory_bytes": b.gpu_memory_bytes, "feasible": bool(fits),
                 "label": BASELINE_LABELS[name],
                 "gpu_ops": sum(1 for d in b.placement.values() if d.is_gpu)}
        if name in result.makespan.get("baselines", {}):
            entry["makespan_s"] = result.makespan["baselines"][name]
        if not fits:
            entry["why_infeasible"] = (f"needs {fmt_bytes(b.gpu_memory_bytes)} of GPU memory; "
                                       f"{fmt_bytes(result.usable_bytes)} usable")
        if name == "existing":
            entry.update(_existing_caveat(result, b))
        out[name] = entry
    return out


def _existing_caveat(result: PlanResult, existing: Plan) -> dict:
    """The file's own placement may put on the GPU ops that placer must keep on the CPU (no
    GPU kernel it knows of, or an unknown type priced at --unknown-op-cost): say so, since
    that is how it can look cheaper than an optimal plan."""
    arr = result.arrays if result.arrays is not None else from_graph(result.graph)
    forced = [i for i, d in existing.placement.items() if d.is_gpu and arr.pin[i] == PIN_CPU]
    if not forced:
        return {}
    types = sorted({arr.types[i] for i in forced})
    return {"note": f"places {len(forced)} op(s) on the GPU that this plan must keep on the CPU "
                    f"({', '.join(types)}: no GPU kernel known to placer; their GPU time is a guess)"}


def _copies_per_op(plan: Plan) -> tuple[dict, dict]:
    ins: dict[int, list[str]] = {}
    outs: dict[int, list[str]] = {}
    for c in plan.copies:
        if c.producer >= 0:
            outs.setdefault(c.producer, []).append(c.tensor)
        for r in c.consumers:
            if r >= 0:
                ins.setdefault(r, []).append(c.tensor)
    return ins, outs


def serial_schedule(result: PlanResult) -> dict:
    """Ops one after another (Caffe2 ``simple`` nets), each copy run when it is needed:
    the timeline whose length is the serial objective."""
    plan, net = result.plan, result.typed.net
    pending: dict[int, list] = {}
    for c in plan.copies:
        first_reader = min([r for r in c.consumers if r >= 0], default=len(net.ops))
        when = c.producer + 1 if c.direction == "d2h" else first_reader  # before step `when`
        pending.setdefault(when, []).append(c)
    t, events = 0.0, []
    cpu_s, gpu_s = result.costs.ops["cpu_s"].tolist(), result.costs.ops["gpu_s"].tolist()
    on_gpu = placement_array(plan.placement, len(net.ops)).tolist()
    for i in range(len(net.ops) + 1):
        for c in pending.get(i, ()):
            events.append({"lane": c.direction, "kind": "copy", "name": c.tensor, "op": None,
                           "tensor": c.tensor, "type": None, "bytes": c.nbytes,
                           "start_s": t, "end_s": t + c.time_s})
            t += c.time_s
        if i == len(net.ops):
            break
        gpu = on_gpu[i]
        dur = float(gpu_s[i] if gpu else cpu_s[i])
        events.append({"lane": "gpu" if gpu else "cpu", "kind": "op", "name": _op_name(net, i), "op": i,
                       "tensor": None, "type": net.ops[i].type, "bytes": None, "start_s": t, "end_s": t + dur})
        t += dur
    return {"makespan_s": t, "events": events}


def _event(result: PlanResult, e: dict) -> dict:
    net, i = result.typed.net, e.get("op")
    out = dict(e)
    if "name" not in out:
        out["name"] = e.get("tensor") if i is None else _op_name(net, i)
    if "type" not in out:
        out["type"] = None if i is None else net.ops[i].type
    out.setdefault("bytes", None)
    return out


def _op_name(net, i: int) -> str:
    op = net.ops[i]
    return op.name or (op.outputs[0] if op.outputs else f"#{i}")


def json_text(doc) -> str:
    """``doc`` as JSON text laid out for people and diff tools alike: a dict one key a line
    (indented one space a level), a list of records one record a line, a list of numbers
    on one line.

    Python's json module encodes in C only without ``indent`` (its indented encoder is
    pure Python: about 6 s for the plan of a 100k-op net), so each record is encoded whole
    by the C encoder and only the few enclosing dicts and lists are laid out here."""
    out: list[str] = []
    _lay_out(doc, 0, out)
    return "".join(out)


def _lay_out(value, depth: int, out: list[str]) -> None:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        out.append("{\n")
        for k, (key, item) in enumerate(value.items()):
            out.append(f"{inner}{json.dumps(str(key))}: ")
            _lay_out(item, depth + 1, out)
            out.append(",\n" if k < len(value) - 1 else "\n")
        out.append(pad + "}")
    elif isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out.append("[\n" + ",\n".join(inner + json.dumps(item) for item in value) + "\n" + pad + "]")
    else:
        out.append(json.dumps(value))


__all__ = ["plan_json", "json_text", "serial_schedule", "optimality", "fmt_bytes", "fmt_time"]
