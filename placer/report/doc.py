"""The plan document of either version, read the same way (docs/PLAN_JSON.md), as a
``documents.plan.PlanDocument``: ``read_plan`` reads one from a file, ``as_plan`` makes
one of the dict ``placer plan`` builds in memory; the report reads nothing else.

Version 2 names the machine's devices (``cpu``, ``cuda:0``, ...) and gives each op a time
per device, memory per device and bytes per link; version 1 knew one GPU, named ``gpu``,
with ``cpu_s``/``gpu_s`` per op, one ``gpu_memory`` and PCIe bytes per direction. These
functions answer the same questions for both (which devices, what kind, an op's time on
one, memory and bytes per link), so that the report is written once, for N devices.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any

from placer.documents import MAX_PLAN_BYTES, NonFinite, check_model, read_document
from placer.documents.plan import CopyInfo, Memory, OpInfo, PlanDocument
from placer.errors import InputError

V1_DEVICES = ("cpu", "gpu")   # a version-1 plan's two devices

PLAN_HINT = "write it with `placer plan NET --json > plan.json`"


def read_plan(path: str | os.PathLike) -> PlanDocument:
    """A plan document from a file, checked (``documents.plan.PlanDocument``). ``Infinity`` is read
    as a number in a baseline's costs only (a baseline that cannot run at all: the report
    draws it as infeasible; plans written before the plan JSON became strict JSON carry
    it); anywhere else, and NaN anywhere, is refused at its field."""
    data = read_document(path, "plan", InputError, PLAN_HINT, max_bytes=MAX_PLAN_BYTES)
    if isinstance(data, dict) and data.get("schema") == "placer.run_record":
        raise InputError(f"{path}: this is a run record (placer run --record), not a plan",
                         hint="give it with --run: placer report PLAN.json --run RUN.json -o OUT.html")
    baselines = data.get("baselines") if isinstance(data, dict) else None
    for entry in (baselines.values() if isinstance(baselines, dict) else ()):
        for key, value in (entry.items() if isinstance(entry, dict) else ()):
            if isinstance(value, NonFinite) and value.text == "Infinity":
                entry[key] = math.inf
    return check_model(data, PlanDocument, str(path), InputError, PLAN_HINT)


def as_plan(doc: dict) -> PlanDocument:
    """A plan document built in memory (``placer.planning.view.plan_json``, a test's
    plan) as the model the report reads: the one place a plan dict becomes a
    ``PlanDocument`` short of a file (``read_plan``)."""
    return PlanDocument.model_validate(doc)


def or_default(value: Any, default: Any) -> Any:
    """``value``, or ``default`` where the plan does not give it (None: the model's value
    for an absent field, where a plan dict's ``.get(key, default)`` gave ``default``)."""
    return default if value is None else value


def device_kind(name: str) -> str:
    """"cpu" for the host, "gpu" for "cuda:0" / "emulated-cuda:0" / "gpu" / "h1/cuda:0"."""
    base = str(name).rsplit("/", 1)[-1]
    return "cpu" if base in ("cpu", "") or base.startswith("cpu") else "gpu"


def plan_devices(plan: PlanDocument) -> list[str]:
    """Device names in index order, the host first: version 2's ``devices``; a version-1
    plan's ``cpu`` and ``gpu``; any other name an op carries is appended."""
    names = list(plan.devices or V1_DEVICES)
    seen = set(names)
    for o in plan.ops:
        d = o.device
        if d is not None and d not in seen:
            names.append(d)
            seen.add(d)
    return names


def device_kinds(plan: PlanDocument) -> dict[str, str]:
    """Device name -> "cpu" / "gpu": the plan's machine where it says, else by name."""
    said = {d.name: d.kind for d in (plan.machine.devices if plan.machine is not None else None) or []}
    return {name: said.get(name) or device_kind(name) for name in plan_devices(plan)}


def op_time(op: OpInfo, device: str, kind: str | None = None) -> float | None:
    """The op's predicted seconds on ``device``: version 2's ``time_s``, else version 1's
    ``cpu_s`` / ``gpu_s`` by the device's kind."""
    times = op.time_s
    if times is not None and times.get(device) is not None:
        return times[device]
    return op.cpu_s if (kind or device_kind(device)) == "cpu" else op.gpu_s


def op_source(op: OpInfo, device: str, kind: str | None = None) -> str:
    """How the op's time on ``device`` was made (``measured``, ``fitted``, ...)."""
    sources = op.source
    if sources is not None and sources.get(device):
        return str(sources[device])
    return str((op.cpu_source if (kind or device_kind(device)) == "cpu" else op.gpu_source) or "")


def span_label(names: list[str]) -> str:
    """``cuda:0-3`` for four consecutive GPUs, ``cuda:0, cuda:2`` otherwise, one name alone."""
    if len(names) <= 1:
        return "".join(names)
    found = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    parts = [p for p in found if p is not None]
    if len(names) > 2 and len(parts) == len(names) and len({p.group(1) for p in parts}) == 1:
        nums = [int(p.group(2)) for p in parts]
        if nums == list(range(nums[0], nums[0] + len(nums))):
            return f"{parts[0].group(1)}{nums[0]}-{nums[-1]}"
    return ", ".join(names)


def time_columns(plan: PlanDocument) -> list[dict]:
    """The per-op time columns: one for each host device, one per group of GPUs whose
    predicted times are the same for every op (identical GPUs share a column). Each is
    ``{"devices": [...], "device": the first of them, "kind", "label"}``."""
    ops = plan.ops
    kinds = device_kinds(plan)
    groups: dict[tuple, list[str]] = {}
    for d in plan_devices(plan):
        kind = kinds[d]
        key = (kind, d if kind == "cpu" else "") + tuple(op_time(o, d, kind) for o in ops)
        groups.setdefault(key, []).append(d)
    return [{"devices": names, "device": names[0], "kind": kinds[names[0]], "label": span_label(names)}
            for names in groups.values()]


def memory_rows(plan: PlanDocument) -> list[dict]:
    """Per device: used, parameter and peak activation bytes, capacity and what plans may
    use (None: no limit), and the used fraction of the capacity. Version 1 had one GPU
    entry (``gpu_memory``)."""
    mem: dict[str, Memory] | None = plan.memory
    if mem is None:
        mem = {"gpu": plan.gpu_memory} if plan.gpu_memory is not None else {}
    kinds = device_kinds(plan)
    rows = []
    for device, m in mem.items():
        used, cap = m.used_bytes, m.capacity_bytes
        rows.append({"device": device, "kind": kinds.get(device) or device_kind(device), "used_bytes": used,
                     "param_bytes": m.param_bytes, "peak_activation_bytes": m.peak_activation_bytes,
                     "capacity_bytes": cap, "usable_bytes": m.usable_bytes,
                     "fraction": (used / cap) if used is not None and cap else None})
    return rows


def memory_timelines(plan: PlanDocument) -> dict[str, list]:
    """Device -> live bytes after each op step; the version-1 alias ``gpu`` of a plan
    whose GPU has a name is left out."""
    timeline = plan.memory_timeline
    if timeline is None:
        return {}
    devices = plan_devices(plan)
    return {d: v for d, v in timeline.items() if d in devices or d != "gpu"}


def copy_ends(c: CopyInfo) -> tuple[str, str]:
    """(source, destination) device of a copy: version 2 names them; version 1's
    direction is between ``cpu`` and ``gpu``."""
    if c.src and c.dst:
        return str(c.src), str(c.dst)
    return ("gpu", "cpu") if c.direction == "d2h" else ("cpu", "gpu")


def direction(src: str, dst: str) -> str:
    """h2d, d2h, d2d or h2h from the two devices' kinds."""
    a, b = device_kind(src), device_kind(dst)
    return {("cpu", "gpu"): "h2d", ("gpu", "cpu"): "d2h", ("gpu", "gpu"): "d2d"}.get((a, b), "h2h")


def link_rows(plan: PlanDocument) -> list[dict]:
    """Per ordered pair of devices that copies cross: bytes, copies and predicted copy
    seconds per run (``link_bytes``; summed from ``copies`` in a version-1 plan)."""
    given = plan.link_bytes
    rows: list[dict[str, Any]]
    if given is not None:
        rows = [{"src": x.src, "dst": x.dst, "bytes": x.bytes, "copies": x.copies, "time_s": x.time_s}
                for x in given]
    else:
        sums: dict[tuple[str, str], dict] = {}
        for c in plan.copies or []:
            row = sums.setdefault(copy_ends(c), {"bytes": 0.0, "copies": 0, "time_s": 0.0})
            row["bytes"] += float(c.bytes or 0.0)
            row["copies"] += 1
            row["time_s"] += float(c.time_s or 0.0)
        rows = [{"src": a, "dst": b, **v} for (a, b), v in sorted(sums.items())]
    for r in rows:
        r["direction"] = direction(r["src"], r["dst"])
        r["link"] = f"{r['src']}->{r['dst']}"
    return rows
