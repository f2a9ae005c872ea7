"""Chrome trace event files (open in Perfetto or chrome://tracing) of a predicted
schedule and of a measured run, and a validator for them.

Layout: one process per device ("cpu", "cuda:0", ...), whose one thread is that device's
ops, and one process "copies" with a thread per copy lane: a link (``cpu->cuda:0``), a
PCIe switch's engine (``pcie[switch0]:h2d``), an NVLink pair. Each op or copy is one
complete event (``"ph": "X"``) with ``ts``/``dur`` in microseconds and ``args`` holding
the op type, op index, bytes and, for a copy, its source and destination devices.
Processes and threads are named by metadata events (``process_name`` /
``thread_name``). A predicted and a measured timeline can share one file: the measured
one's processes are numbered after the predicted one's.

A measured run is timed op by op (the executor runs one op at a time), so its events are
laid end to end in execution order, each op on its device's lane and each copy on the
lane of its link (source -> destination). Plans of version 1 (lanes ``cpu``, ``gpu``,
``h2d``, ``d2h``) and run records without per-copy links read the same way.
"""
from __future__ import annotations

import json
import math
import os

from placer.fileio import atomic_write_text
from placer.ops.registry import copy_types
from placer.documents.plan import Event, OpInfo, PlanDocument
from placer.report.doc import or_default, plan_devices
from placer.report.tables import run_device

US = 1e6             # trace timestamps are microseconds
TOLERANCE_US = 1e-3  # float rounding when seconds become microseconds
COPY_LANE_NAMES = {"h2d": "H2D copies (PCIe)", "d2h": "D2H copies (PCIe)"}   # version-1 lanes


class _Lanes:
    """Process and thread ids of one timeline: a process per device, then one for the
    copy lanes, numbered from ``pid_base``. Every device is named up front (the copies'
    process comes after them); copy lanes are added as events name them."""

    def __init__(self, title: str, devices: list[str], pid_base: int, suffix: dict | None = None):
        self.title, self.pid_base, self.suffix = title, pid_base, suffix or {}
        self.devices = list(dict.fromkeys(devices))
        self.copy_lanes: list[str] = []

    def device(self, name: str) -> tuple[int, int]:
        return self.pid_base + self.devices.index(name), 1

    def copy(self, lane: str) -> tuple[int, int]:
        if lane not in self.copy_lanes:
            self.copy_lanes.append(lane)
        return self.copies_pid, 1 + self.copy_lanes.index(lane)

    @property
    def copies_pid(self) -> int:
        return self.pid_base + len(self.devices)

    @property
    def next_pid(self) -> int:
        return self.copies_pid + 1

    def metadata(self) -> list[dict]:
        """Names and sort order of every process and thread; the copies process is
        numbered after the devices, all of which are known once the events are made."""
        out = []
        for k, dev in enumerate(self.devices):
            pid = self.pid_base + k
            out += _process(pid, f"{self.title}: {dev}{self.suffix.get(dev, '')}")
            out.append(_thread(pid, 1, f"{dev} ops"))
        if self.copy_lanes:
            out += _process(self.copies_pid, f"{self.title}: copies")
            out += [_thread(self.copies_pid, 1 + k, COPY_LANE_NAMES.get(lane, lane))
                    for k, lane in enumerate(self.copy_lanes)]
        return out


def _process(pid: int, name: str) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]


def _thread(pid: int, tid: int, name: str) -> dict:
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def predicted_events(plan: PlanDocument, schedule: str | None = None, pid_base: int = 1) -> list[dict]:
    """Events of one schedule of a plan (default: the one its objective names)."""
    return _predicted(plan, schedule, pid_base)[0]


def _predicted(plan: PlanDocument, schedule: str | None, pid_base: int) -> tuple[list[dict], int]:
    schedules = plan.schedules or {}
    name = schedule or (plan.objective if plan.objective in schedules else None) \
        or next(iter(schedules), None)
    if name is None or name not in schedules:
        return [], pid_base
    ops = {o.index: o for o in plan.ops}
    tensors = {t.name: t for t in plan.tensors or []}
    events = schedules[name].events or []
    op_lanes = [_op_lane(ev, ops) for ev in events if ev.kind != "copy"]
    lanes = _Lanes(f"predicted ({name} schedule)", plan_devices(plan) + op_lanes, pid_base)
    spans = []
    for ev in events:
        is_copy = ev.kind == "copy"
        op = ops.get(ev.op)
        tensor = ev.tensor
        nbytes = ev.bytes
        if nbytes is None:
            found = tensors.get(tensor)
            nbytes = (found.bytes if found is not None else None) if is_copy else \
                (op.output_bytes if op is not None else None)
        if is_copy:   # a copy's "op" is its producer: its name is the tensor's
            label = f"copy {tensor}" if tensor else ev.name or "copy"
            args = {"type": f"copy {or_default(ev.src, '')}->{or_default(ev.dst, '')}" if ev.src
                    else f"copy {or_default(ev.lane, '')}", "tensor": tensor, "src": ev.src, "dst": ev.dst}
            pid, tid = lanes.copy(ev.lane or f"{ev.src}->{ev.dst}")
        else:
            label = ev.name or (op.name if op is not None else None) or \
                f"#{ev.op} {or_default(op.type, '?') if op is not None else '?'}"
            args = {"type": ev.type or (op.type if op is not None else None), "op": ev.op}
            pid, tid = lanes.device(_op_lane(ev, ops))
        args["bytes"] = nbytes
        spans.append(_complete(label, "copy" if is_copy else "op", pid, tid, ev.start_s,
                               ev.end_s - ev.start_s, args))
    return lanes.metadata() + spans, lanes.next_pid


def _op_lane(ev: Event, ops: dict[int | None, OpInfo]) -> str:
    op = ops.get(ev.op)
    return str(ev.lane or (op.device if op is not None else None) or "cpu")


def measured_events(run: dict, pid_base: int = 1, plan: PlanDocument | None = None) -> list[dict]:
    """Events of a RunRecord dict: ops end to end in execution order (module docstring).
    Device names are the run's (``emulated-cuda:0``), or the plan's when it is given."""
    name_of = (lambda d: run_device(plan, d)) if plan is not None else (lambda d: str(d))
    devices = [name_of(d) for d in run.get("devices") or ["cpu"]] + \
        [name_of(o.get("device", "cpu")) for o in run.get("ops") or []]
    labels = {name_of(d): label for d, label in (run.get("timing_labels") or {}).items()}
    suffix = {d: f" [{label}]" for d, label in labels.items() if label not in (d, "cpu")}
    title = "measured" + (" (emulated GPU: CPU timings)" if run.get("emulated") else "")
    lanes = _Lanes(title, devices, pid_base, suffix)
    spans, t = [], 0.0
    copies = copy_types()
    for o in run.get("ops") or []:
        links = [tuple(x) for x in o.get("links") or []]
        direction = o.get("copy_direction") or ""
        is_copy = bool(direction) or bool(links) or o.get("type") in copies
        dur = float(o.get("time_s") or 0.0)
        args = {"type": o.get("type"), "op": o.get("index"), "device": o.get("device"),
                "bytes": o.get("copy_bytes") if is_copy else None}
        if is_copy:
            pid, tid = lanes.copy(_measured_copy_lane(o, links, direction, name_of))
        else:
            pid, tid = lanes.device(name_of(o.get("device", "cpu")))
        name = o.get("name") or f"#{o.get('index')} {o.get('type')}"
        spans.append(_complete(name, "copy" if is_copy else "op", pid, tid, t, dur, args))
        t += dur
    return lanes.metadata() + spans


def _measured_copy_lane(o: dict, links: list, direction: str, name_of) -> str:
    """The link a copy op crossed (``cpu->cuda:1``); one whose transfers went several
    ways is on its first link's lane; a record without links gives its direction."""
    if links:
        return f"{name_of(links[0][0])}->{name_of(links[0][1])}"
    if direction in ("h2d", "d2h"):
        return direction
    return f"copies on {name_of(o.get('device', 'cpu'))}"


def build_trace(plan: PlanDocument | None = None, run: dict | None = None,
                schedule: str | None = None) -> dict:
    """One trace object with the predicted timeline (from ``plan``) and/or the measured
    one (from ``run``), each in its own processes."""
    events, pid = [], 1
    if plan is not None:
        predicted, pid = _predicted(plan, schedule, 1)
        events += predicted
    if run is not None:
        events += measured_events(run, pid_base=pid, plan=plan)
    meta = [e for e in events if e["ph"] == "M"]
    spans = sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + spans, "displayTimeUnit": "ms",
            "otherData": {"generator": "placer", "time_unit": "microseconds",
                          "net": (plan.net if plan is not None else None) or (run or {}).get("net_name", "")}}


def write_trace(plan: PlanDocument | None, path: str | os.PathLike, run: dict | None = None,
                schedule: str | None = None) -> None:
    """Write the predicted timeline of ``plan`` and/or the measured one of ``run`` (a
    RunRecord dict): ``placer plan --trace`` passes the plan, ``placer run --trace`` passes
    ``None`` and the run. The trace is validated first: a malformed one is a bug here."""
    trace = build_trace(plan, run, schedule)
    problems = validate_trace(trace)
    if problems:
        raise AssertionError("trace failed validation: " + "; ".join(problems[:5]))
    atomic_write_text(path, json.dumps(trace, allow_nan=False, default=_plain) + "\n")


def cluster_trace(workers: dict, title: str = "measured") -> dict:
    """One trace of several workers' measured runs (``runtime.cluster``): a process per
    worker, a thread per device, each worker's ops end to end from the wall-clock start of
    its step (``workers[host] = (run record dict, start_s)``), so that a receive waiting on
    another worker lines up with that worker's send."""
    origin = min((start for _, start in workers.values()), default=0.0)
    events: list[dict] = []
    for pid, (host, (run, start)) in enumerate(workers.items(), start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{title}: worker {host}"}})
        tids = {d: k for k, d in enumerate(run.get("devices") or [], start=1)}
        for d, tid in tids.items():
            label = (run.get("timing_labels") or {}).get(d, d)
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        t = start - origin
        for o in run.get("ops") or []:
            dur = float(o.get("time_s") or 0.0)
            tid = tids.setdefault(o.get("device"), len(tids) + 1)
            events.append({"name": o.get("name") or f"#{o.get('index')} {o.get('type')}", "cat": "op", "ph": "X",
                           "ts": t * US, "dur": dur * US, "pid": pid, "tid": tid,
                           "args": {"type": o.get("type"), "op": o.get("index"), "device": o.get("device")}})
            t += dur
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": "placer"}}


def write_cluster_trace(workers: dict, path: str | os.PathLike) -> None:
    """Write ``cluster_trace(workers)`` after validating it (a malformed one is a bug here)."""
    trace = cluster_trace(workers)
    problems = validate_trace(trace)
    if problems:
        raise AssertionError("trace failed validation: " + "; ".join(problems[:5]))
    atomic_write_text(path, json.dumps(trace, allow_nan=False, default=_plain) + "\n")


def _plain(value):
    """numpy scalars as JSON numbers (non-finite ones as null)."""
    if hasattr(value, "item"):
        v = value.item()
        return v if not isinstance(v, float) or math.isfinite(v) else None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _complete(name, cat, pid, tid, start_s, dur_s, args) -> dict:
    return {"name": str(name), "cat": cat, "ph": "X", "ts": start_s * US, "dur": max(dur_s, 0.0) * US,
            "pid": pid, "tid": tid,
            "args": {k: v for k, v in args.items() if v is not None
                     and not (isinstance(v, float) and not math.isfinite(v))}}


# --- validation ----------------------------------------------------------------------

PHASES = set("BEXiIbenSTpFsftPOND") | {"M", "C", "R", "(", ")"}


def validate_trace(obj) -> list[str]:
    """Problems with a trace object, empty when it is well formed: the JSON object format
    (``traceEvents``), required fields per event, named processes and threads, and on
    each lane (pid, tid) timestamps that never go back and events that do not overlap."""
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        return ["no 'traceEvents' list"]
    problems: list[str] = []
    procs, threads, lanes = set(), set(), {}
    for k, e in enumerate(events):
        where = f"event {k}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: unknown or missing phase 'ph' ({ph!r})")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"{where}: missing 'name'")
        if not _is_int(e.get("pid")):
            problems.append(f"{where}: 'pid' must be an integer")
        if ph == "M":
            _check_metadata(e, where, problems, procs, threads)
        elif ph == "X":
            if _check_complete(e, where, problems):
                lanes.setdefault((e["pid"], e["tid"]), []).append((k, e))
    for (pid, tid), evs in lanes.items():
        if pid not in procs:
            problems.append(f"process {pid} has events but no process_name")
        if (pid, tid) not in threads:
            problems.append(f"thread {pid}/{tid} has events but no thread_name")
        problems += _check_lane(pid, tid, evs)
    return problems


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _check_metadata(e, where, problems, procs, threads):
    args = e.get("args")
    if e.get("name") in ("process_name", "thread_name"):
        if not isinstance(args, dict) or not isinstance(args.get("name"), str):
            problems.append(f"{where}: {e['name']} needs args.name")
            return
        if e["name"] == "process_name":
            procs.add(e.get("pid"))
        elif not _is_int(e.get("tid")):
            problems.append(f"{where}: thread_name needs an integer 'tid'")
        else:
            threads.add((e.get("pid"), e.get("tid")))


def _check_complete(e, where, problems) -> bool:
    ok = True
    for key in ("ts", "dur"):
        if not _is_time(e.get(key)):
            problems.append(f"{where} '{e.get('name')}': '{key}' must be a finite number >= 0, not {e.get(key)!r}")
            ok = False
    if not _is_int(e.get("tid")):
        problems.append(f"{where} '{e.get('name')}': 'tid' must be an integer")
        ok = False
    if "args" in e and not isinstance(e["args"], dict):
        problems.append(f"{where} '{e.get('name')}': 'args' must be an object")
    return ok and _is_int(e.get("pid"))


def _check_lane(pid, tid, evs) -> list[str]:
    problems = []
    for (k0, a), (k1, b) in zip(evs, evs[1:]):
        if b["ts"] < a["ts"]:
            problems.append(f"lane {pid}/{tid}: event {k1} '{b['name']}' starts at {b['ts']:.3f} us, "
                            f"before event {k0} '{a['name']}' at {a['ts']:.3f} us (not monotonic)")
        elif b["ts"] < a["ts"] + a["dur"] - TOLERANCE_US:
            problems.append(f"lane {pid}/{tid}: event {k1} '{b['name']}' at {b['ts']:.3f} us overlaps "
                            f"event {k0} '{a['name']}' ({a['ts']:.3f} + {a['dur']:.3f} us)")
    return problems
