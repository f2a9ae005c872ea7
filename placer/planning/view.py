"""What a plan looks like from outside: the JSON document, the serial timeline, memory curves.

``plan_json(result)`` is what ``placer plan --json`` prints and what ``placer report``
reads: enough to recompute the plan's cost by hand (every op's two times and device,
every tensor's bytes, copy times, producer and consumers, and ``outputs_on_host``: whether
external outputs made on the GPU pay their copy back), plus baselines, memory and the
predicted schedules. ``json_text(doc)`` is how it is written out.

The document is built from whole table columns (Python lists, not per-row numpy
lookups), so the plan of a million-op net takes seconds.
"""
from __future__ import annotations

import json
import math

import numpy as np

from placer.partition.problem import device_memory
from placer.shapes import bounded_notes
from placer.planning.planner import PlanResult, placer_only_gpu_types, placer_only_types
from placer.types import Plan
from placer.units import fmt_bytes

SCHEMA_VERSION = 2   # docs/PLAN_JSON.md lists every field and what changed from version 1
BASELINE_LABELS = {"all_cpu": "all on the CPU", "all_gpu": "all on one GPU (CPU fallback)",
                   "greedy": "greedy (each op on its fastest device)", "existing": "your placement",
                   "pipeline": "pipeline split over the GPUs (balanced by compute)",
                   "m_topo": "Baechi m-TOPO", "m_etf": "Baechi m-ETF",
                   "lower_bound": "lower bound (sum of per-op minima, no copies)"}


def optimality(plan: Plan) -> str:
    """The optimality statement printed beside the plan."""
    if plan.objective == "makespan":
        return "heuristic for the overlapped (makespan) objective; serial cost shown for comparison"
    limit = " within the memory limits" if np.isfinite(plan.capacity_bytes).any() else ""
    if plan.optimal:
        return f"optimal for the serial objective{limit}"
    if plan.gap is not None:
        return f"within {100 * plan.gap:.2g}% of the MILP bound{limit}"
    if not any(note.startswith("MILP") for note in plan.notes):
        return f"feasible{limit}; optimality not proven (no MILP bound was computed)"
    if any(note.startswith("MILP skipped") for note in plan.notes):
        return f"feasible{limit}; optimality not proven (the net is too big for the MILP in its time limit)"
    return f"feasible{limit}; optimality not proven (the MILP did not finish in time)"


def plan_json(result: PlanResult, profiles: dict | None = None) -> dict:
    """The plan document (docs/PLAN_JSON.md)."""
    net, plan, costs, arr = result.typed.net, result.plan, result.costs, result.arrays
    devices, kinds = list(arr.devices), list(arr.device_kinds)
    first_gpu = next((d for d, kind in enumerate(kinds) if kind == "gpu"), None)
    ops = _op_records(result, first_gpu)
    tensors = _tensor_records(costs.tensors, arr, first_gpu)
    params, curves, _ = device_memory(arr, plan.placement, curves=True)
    memory = {devices[d]: {"used_bytes": float(plan.memory_bytes[d]), "param_bytes": float(params[d]),
                           "peak_activation_bytes": float(curves[d].max()) if curves.shape[1] else 0.0,
                           "capacity_bytes": _finite(result.capacity_bytes[d]),
                           "usable_bytes": _finite(result.usable_bytes[d])} for d in range(len(devices))}
    gpus = [d for d in range(len(devices)) if kinds[d] == "gpu"]
    busiest = max(gpus, key=lambda d: plan.memory_bytes[d]) if gpus else None
    links: dict[tuple[str, str], list] = {}
    for c in plan.copies:
        entry = links.setdefault((c.src, c.dst), [0.0, 0, 0.0])
        entry[0] += c.nbytes
        entry[1] += 1
        entry[2] += c.time_s
    timeline = {devices[d]: (params[d] + curves[d]).tolist() for d in range(len(devices))}
    if len(gpus) == 1:
        timeline["gpu"] = timeline[devices[gpus[0]]]
    return {
        "schema_version": SCHEMA_VERSION,
        "net": net.name, "path": net.path, "objective": plan.objective,
        "method": result.options.method, "solver": plan.method, "precision": costs.precision, "precision_notes": costs.precision_notes,
        "total_s": plan.cost.total_s, "compute_s": plan.cost.compute_s, "copy_s": plan.cost.copy_s,
        "optimal": bool(plan.optimal), "gap": _gap(plan), "optimality": optimality(plan),
        "outputs_on_host": bool(arr.outputs_on_host), "notes": list(plan.notes) + bounded_notes(result.typed.blobs) + caffe2_gpu_notes(result)
                 + offload_notes(result),
        "bounded_blobs": {b: {"shape": list(t.shape), "bound": t.bound}
                          for b, t in result.typed.blobs.items() if t is not None and t.bound},
        "machine": {"name": result.machine.name, "description": result.machine.describe(),
                    "devices": [{"name": dev.name, "kind": dev.kind, "profile": dev.profile.name}
                                for dev in result.machine.devices]},
        "devices": devices, "profiles": profiles or {},
        "ops": ops, "tensors": tensors,
        "copies": [{"tensor": c.tensor, "src": c.src, "dst": c.dst, "direction": c.direction,
                    "bytes": c.nbytes, "time_s": c.time_s, "producer": c.producer,
                    "consumers": list(c.consumers)} for c in plan.copies],
        "baselines": _baselines(result),
        "memory": memory,
        "gpu_memory": (dict(memory[devices[busiest]], device=devices[busiest]) if busiest is not None
                       else {"used_bytes": 0.0, "param_bytes": 0.0, "peak_activation_bytes": 0.0,
                             "capacity_bytes": None, "usable_bytes": None, "device": None}),
        "memory_timeline": timeline,
        "link_bytes": [{"src": a, "dst": b, "bytes": v[0], "copies": v[1], "time_s": v[2]}
                       for (a, b), v in sorted(links.items())],
        "pcie_bytes": {"h2d": plan.copy_bytes("h2d"), "d2h": plan.copy_bytes("d2h"),
                       "d2d": plan.copy_bytes("d2d")},
        "schedules": {"serial": serial_schedule(result),
                      "makespan": {"makespan_s": result.makespan["makespan_s"],
                                   "events": [_event(result, e) for e in result.makespan["events"]]}},
    }


def caffe2_gpu_notes(result: PlanResult) -> list[str]:
    """A note when ops sit on a GPU that real Caffe2 has no GPU kernel for (only under
    ``--allow-gpu-only-in-placer``): the placed net then runs in placer, not in Caffe2; and
    one when the net holds op types Caffe2 has no kernel for at all."""
    ops = result.typed.net.ops
    only = sorted(placer_only_types({op.type for op in ops}))
    notes = [f"op types real Caffe2 has no kernel for: {', '.join(only)}; Caffe2 cannot load the net "
             "(placer plans it; placer run refuses bfloat16 compute)"] if only else []
    if not result.options.placer_kernels:
        return notes
    on_gpu = np.asarray([d.kind == "gpu" for d in result.machine.devices])[np.asarray(result.plan.placement)]
    types = sorted(placer_only_gpu_types({ops[i].type for i in np.flatnonzero(on_gpu)}))
    if not types:
        return notes
    return notes + [f"on a GPU where Caffe2 has no GPU kernel (--allow-gpu-only-in-placer): {', '.join(types)}; "
                    f"the placed net runs in placer run, not in Caffe2"]


HALF_CASTS = frozenset({"FloatToHalf", "FloatToBFloat16"})


def offload_notes(result: PlanResult) -> list[str]:
    """Names the ZeRO-Offload layout (Ren et al., USENIX ATC 2021) where the plan chose it: the
    updates of float32 masters on the host, their half copies read by ops on a GPU (the
    forward and backward there), so that a step sends the half gradients to the host and
    brings the half parameters back. A master is a parameter (a blob the init net makes) that
    a cast makes a half copy of; its update is the op that last wrote it before the cast
    (whatever optimizer wrote it). Named when most of the masters' bytes are on the host."""
    ops, place = result.typed.net.ops, np.asarray(result.plan.placement)
    kinds = [d.kind for d in result.machine.devices]
    on_gpu = [kinds[int(p)] == "gpu" for p in place]     # any of the machine's GPUs
    params = result.typed.net.params
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for b in op.inputs:
            readers.setdefault(b, []).append(i)
    last_writer: dict[str, int] = {}
    offloaded, kept, state_bytes, kept_bytes, half_bytes = 0, 0, 0.0, 0.0, 0.0
    for j, op in enumerate(ops):
        i = last_writer.get(op.inputs[0]) if op.type in HALF_CASTS and op.inputs else None
        last_writer.update((b, j) for b in op.outputs)
        if i is None or op.inputs[0] not in params:
            continue
        half = op.outputs[0]
        if not any(on_gpu[r] for r in readers.get(half, []) if r != j):
            continue                       # its half copy feeds no GPU op: not this layout
        state = sum(_nbytes(result.typed.blobs.get(b)) for b in dict.fromkeys(ops[i].outputs))
        if on_gpu[i]:
            kept += 1
            kept_bytes += state
            continue
        offloaded += 1
        state_bytes += state
        half_bytes += _nbytes(result.typed.blobs.get(half))
    if not offloaded or state_bytes < kept_bytes:
        return []    # a few small updates (biases) on the host are not the layout
    return [f"ZeRO-Offload layout: {offloaded} of {offloaded + kept} updates of float32 masters on the CPU "
            f"({fmt_bytes(state_bytes)} of masters and optimizer state there), their half copies "
            f"({fmt_bytes(half_bytes)}) read by the forward and backward ops on a GPU: each step copies "
            "the half gradients down and the half parameters up"]


def _nbytes(t) -> float:
    return 0.0 if t is None else float(t.nbytes)


def gpu_kernel_field(notes: dict[int, str], devices: list[str]) -> str | dict[str, str]:
    """An op's ``gpu_kernel``: what the GPU kernel model assumed, one text when every GPU
    priced it alike (eight identical GPUs: one note, not eight), else GPU name -> text."""
    distinct = set(notes.values())
    if len(distinct) == 1:
        return distinct.pop()
    return {devices[d]: note for d, note in sorted(notes.items())}


def _op_records(result: PlanResult, first_gpu: int | None) -> list[dict]:
    """One record per op: device, time and source on every device, reason, copies."""
    net, plan, costs, arr = result.typed.net, result.plan, result.costs, result.arrays
    devices, kinds = list(arr.devices), list(arr.device_kinds)
    copies_in, copies_out = _copies_per_op(plan)
    feats = costs.ops
    names, types, flops = feats["name"].tolist(), feats["type"].tolist(), feats["flops"].tolist()
    pbytes, obytes = feats["param_bytes"].tolist(), feats["output_bytes"].tolist()
    op_s, src = costs.op_s.tolist(), costs.op_source.tolist()
    placement, reasons = plan.placement.tolist(), plan.reasons
    pinned: dict[int, object] = {}   # ops that may not take every device: their devices
    for i in np.flatnonzero(~arr.allowed.all(axis=1)).tolist():
        restricted = [devices[x] for x in np.flatnonzero(arr.allowed[i]).tolist()]
        pinned[i] = restricted[0] if len(restricted) == 1 else restricted
    ops = []
    for i, op in enumerate(net.ops):
        d = placement[i]
        entry = {
            "index": i, "name": names[i], "type": types[i], "device": devices[d], "device_kind": kinds[d],
            "time_s": dict(zip(devices, op_s[i])), "source": dict(zip(devices, src[i])),
            "cpu_s": op_s[i][0], "cpu_source": src[i][0],
            "reason": reasons.get(i, ""), "flops": flops[i], "param_bytes": pbytes[i],
            "output_bytes": obytes[i], "outputs": list(op.outputs), "pinned": pinned.get(i),
            "copies_in": copies_in.get(i, []), "copies_out": copies_out.get(i, [])}
        notes = costs.kernel_notes.get(i)
        if notes:
            entry["gpu_kernel"] = gpu_kernel_field(notes, devices)
        if first_gpu is not None:   # version 1 fields: the first GPU's figures
            entry["gpu_s"], entry["gpu_source"] = op_s[i][first_gpu], src[i][first_gpu]
        ops.append(entry)
    return ops


def _tensor_records(t, arr, first_gpu: int | None) -> list[dict]:
    """One record per tensor: producer, readers, bytes, and (version 1) the first GPU's
    copy times host -> GPU and back."""
    names, producer, nbytes = t.names, t.producer.tolist(), t.nbytes.tolist()
    ext, ptr, readers = t.external_output.tolist(), t.ptr.tolist(), t.consumers.tolist()
    every = np.arange(arr.n_tensors)
    h2d = arr.copy_s(every, 0, first_gpu).tolist() if first_gpu is not None else None
    d2h = arr.copy_s(every, first_gpu, 0).tolist() if first_gpu is not None else None
    tensors = []
    for x in range(len(names)):
        entry = {"name": names[x], "producer": producer[x], "consumers": readers[ptr[x]:ptr[x + 1]],
                 "bytes": nbytes[x], "external_output": ext[x]}
        if h2d is not None:
            entry["h2d_s"], entry["d2h_s"] = h2d[x], d2h[x]
        tensors.append(entry)
    return tensors


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _gap(plan: Plan) -> float | None:
    """The relative gap to the bound; rounding noise of a proven optimum reads 0."""
    if plan.gap is None:
        return None
    return 0.0 if plan.optimal and abs(plan.gap) < 1e-9 else float(plan.gap)


def _baselines(result: PlanResult) -> dict:
    out = {}
    arr = result.arrays
    for name, b in result.baselines.items():
        label = BASELINE_LABELS.get(name, name)
        if name == "lower_bound":
            out[name] = {"total_s": b.total_s, "label": label, "feasible": True}
            continue
        over = np.flatnonzero(b.memory_bytes > arr.capacity * (1 + 1e-9))
        entry = {"total_s": b.cost.total_s, "compute_s": b.cost.compute_s, "copy_s": b.cost.copy_s,
                 "gpu_memory_bytes": b.gpu_memory_bytes, "feasible": not len(over), "label": label,
                 "gpu_ops": int(sum(b.device_kinds[d] == "gpu" for d in b.placement.tolist())),
                 "devices_used": sorted({b.devices[d] for d in b.placement.tolist()})}
        if name in result.makespan.get("baselines", {}):
            entry["makespan_s"] = result.makespan["baselines"][name]
        if len(over):
            d = int(over[0])
            entry["why_infeasible"] = (f"needs {fmt_bytes(b.memory_bytes[d])} on {arr.devices[d]}; "
                                       f"{fmt_bytes(arr.capacity[d])} usable")
        if name == "existing":
            entry.update(_existing_caveat(result, b))
        out[name] = entry
    return out


def _existing_caveat(result: PlanResult, existing: Plan) -> dict:
    """The file's own placement may put ops where placer may not (no GPU kernel it knows
    of, or an unknown type priced at --unknown-op-cost): say so, since that is how it can
    look cheaper than an optimal plan."""
    arr = result.arrays
    forced = [i for i, d in enumerate(existing.placement.tolist()) if not arr.allowed[i, d]]
    if not forced:
        return {}
    types = sorted({arr.types[i] for i in forced})
    return {"note": f"places {len(forced)} op(s) where this plan may not put them "
                    f"({', '.join(types)}: no kernel there known to placer; their time there is a guess)"}


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
    the timeline whose length is the serial objective. Lanes: device names for ops,
    ``src->dst`` for copies."""
    plan, net = result.plan, result.typed.net
    pending: dict[int, list] = {}
    for c in plan.copies:
        first_reader = min([r for r in c.consumers if r >= 0], default=len(net.ops))
        when = c.producer + 1 if c.producer >= 0 and c.dst_kind == "cpu" else first_reader
        pending.setdefault(when, []).append(c)
    t, events = 0.0, []
    op_s = result.costs.op_s
    devices = result.arrays.devices
    for i in range(len(net.ops) + 1):
        for c in pending.get(i, []):
            events.append({"lane": f"{c.src}->{c.dst}", "kind": "copy", "name": c.tensor, "op": None,
                           "tensor": c.tensor, "type": None, "bytes": c.nbytes, "src": c.src, "dst": c.dst,
                           "start_s": t, "end_s": t + c.time_s})
            t += c.time_s
        if i == len(net.ops):
            break
        d = int(plan.placement[i])
        dur = float(op_s[i, d])
        events.append({"lane": devices[d], "kind": "op", "name": _op_name(net, i), "op": i,
                       "tensor": None, "type": net.ops[i].type, "bytes": None, "start_s": t, "end_s": t + dur})
        t += dur
    return {"makespan_s": t, "events": events}


def _event(result: PlanResult, e: dict) -> dict:
    """A makespan event with the names the report shows: the op's, or a copy's tensor
    (the simulator gives a copy's bytes)."""
    net, i = result.typed.net, e.get("op")
    out = dict(e)
    if e.get("kind") == "copy":
        out["name"], out["type"] = e.get("tensor"), None
        return out
    out.setdefault("name", _op_name(net, i) if i is not None else None)
    out.setdefault("type", net.ops[i].type if i is not None else None)
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
    by the C encoder and only the few enclosing dicts and lists are laid out here.

    The text is strict JSON (no ``NaN`` / ``Infinity`` tokens, which JSON has not): a
    value that is not finite (no limit, no figure) is written as null."""
    out: list[str] = []
    _lay_out(doc, 0, out)
    return "".join(out)


def _lay_out(value, depth: int, out: list[str]) -> None:
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        out.append("{\n")
        for k, (key, item) in enumerate(value.items()):
            out.append(f"{inner}{_strict(str(key))}: ")
            _lay_out(item, depth + 1, out)
            out.append(",\n" if k < len(value) - 1 else "\n")
        out.append(pad + "}")
    elif isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out.append("[\n" + ",\n".join(inner + _strict(item) for item in value) + "\n" + pad + "]")
    else:
        out.append(_strict(value))


def _strict(value) -> str:
    """One value in the C encoder; only a value holding a non-finite float is walked again."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(finite_json(value), allow_nan=False)


def finite_json(value):
    """``value`` with every float that is not finite (inf, NaN) as None: JSON's null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


__all__ = ["plan_json", "json_text", "finite_json", "serial_schedule", "optimality"]
