"""What a plan looks like from outside: the JSON document, the serial timeline, memory curves.

``plan_json(result)`` is what ``placer plan --json`` prints and what ``placer report``
reads: enough to recompute the plan's cost by hand (every op's two times and device,
every tensor's bytes, copy times, producer and consumers, and ``outputs_on_host``: whether
external outputs made on the GPU pay their copy back), plus baselines, memory and the
predicted schedules.
"""
from __future__ import annotations

from placer.partition.problem import from_graph, gpu_memory, placement_array
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
    net, plan, costs = result.typed.net, result.plan, result.costs
    arr = result.arrays if result.arrays is not None else from_graph(result.graph)
    on_gpu = placement_array(plan.placement, len(net.ops))
    copies_in, copies_out = _copies_per_op(plan)
    ops = []
    for row in costs.ops.itertuples(index=False):
        i = int(row.index)
        ops.append({
            "index": i, "name": row.name, "type": row.type, "device": "gpu" if on_gpu[i] else "cpu",
            "cpu_s": float(row.cpu_s), "gpu_s": float(row.gpu_s), "cpu_source": row.cpu_source,
            "gpu_source": row.gpu_source, "reason": plan.reasons.get(i, ""), "flops": float(row.flops),
            "param_bytes": float(row.param_bytes), "output_bytes": float(row.output_bytes),
            "outputs": list(net.ops[i].outputs), "pinned": result.graph.nodes[i].get("pin"),
            "copies_in": copies_in.get(i, []), "copies_out": copies_out.get(i, [])})
    tensors = [{"name": t.name, "producer": int(t.producer), "consumers": [int(c) for c in t.consumers],
                "bytes": float(t.bytes), "h2d_s": float(t.h2d_s), "d2h_s": float(t.d2h_s),
                "external_output": bool(t.external_output)}
               for t in costs.tensors.itertuples(index=False)]
    params, gpu_curve, _ = gpu_memory(arr, on_gpu, curve_only=True)
    cpu_params, cpu_curve, _ = gpu_memory(arr, ~on_gpu, curve_only=True)
    h2d = sum(c.nbytes for c in plan.copies if c.direction == "h2d")
    d2h = sum(c.nbytes for c in plan.copies if c.direction == "d2h")
    return {
        "net": net.name, "path": net.path, "objective": plan.objective,
        "method": result.options.method, "solver": plan.method,
        "total_s": plan.cost.total_s, "compute_s": plan.cost.compute_s, "copy_s": plan.cost.copy_s,
        "optimal": bool(plan.optimal), "gap": _gap(plan), "optimality": optimality(plan),
        "outputs_on_host": bool(result.graph.graph.get("outputs_on_host", True)),
        "notes": list(plan.notes), "profiles": profiles or {},
        "ops": ops, "tensors": tensors,
        "copies": [{"tensor": c.tensor, "direction": c.direction, "bytes": c.nbytes, "time_s": c.time_s,
                    "producer": c.producer, "consumers": list(c.consumers)} for c in plan.copies],
        "baselines": _baselines(result),
        "gpu_memory": {"used_bytes": plan.gpu_memory_bytes, "capacity_bytes": result.capacity_bytes,
                       "usable_bytes": result.usable_bytes, "param_bytes": params,
                       "peak_activation_bytes": float(gpu_curve.max()) if len(gpu_curve) else 0.0},
        "memory_timeline": {"gpu": [params + float(x) for x in gpu_curve],
                            "cpu": [cpu_params + float(x) for x in cpu_curve]},
        "pcie_bytes": {"h2d": h2d, "d2h": d2h},
        "schedules": {"serial": serial_schedule(result),
                      "makespan": {"makespan_s": result.makespan["makespan_s"],
                                   "events": [_event(result, e) for e in result.makespan["events"]]}},
    }


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
    nodes = result.graph.nodes
    forced = [i for i, d in existing.placement.items() if d.is_gpu and nodes[i].get("pin") == "cpu"]
    if not forced:
        return {}
    types = sorted({nodes[i]["type"] for i in forced})
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
    cpu_s, gpu_s = result.costs.ops["cpu_s"].to_numpy(), result.costs.ops["gpu_s"].to_numpy()
    for i in range(len(net.ops) + 1):
        for c in pending.get(i, []):
            events.append({"lane": c.direction, "kind": "copy", "name": c.tensor, "op": None,
                           "tensor": c.tensor, "type": None, "bytes": c.nbytes,
                           "start_s": t, "end_s": t + c.time_s})
            t += c.time_s
        if i == len(net.ops):
            break
        gpu = plan.placement[i].is_gpu
        dur = float(gpu_s[i] if gpu else cpu_s[i])
        events.append({"lane": "gpu" if gpu else "cpu", "kind": "op", "name": _op_name(net, i), "op": i,
                       "tensor": None, "type": net.ops[i].type, "bytes": None, "start_s": t, "end_s": t + dur})
        t += dur
    return {"makespan_s": t, "events": events}


def _event(result: PlanResult, e: dict) -> dict:
    net, i = result.typed.net, e.get("op")
    out = dict(e)
    out.setdefault("name", e.get("tensor") if i is None else _op_name(net, i))
    out.setdefault("type", None if i is None else net.ops[i].type)
    out.setdefault("bytes", None)
    return out


def _op_name(net, i: int) -> str:
    op = net.ops[i]
    return op.name or (op.outputs[0] if op.outputs else f"#{i}")


__all__ = ["plan_json", "serial_schedule", "optimality", "fmt_bytes", "fmt_time"]
