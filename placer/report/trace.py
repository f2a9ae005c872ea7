"""Chrome trace event files (open in Perfetto or chrome://tracing) of a predicted
schedule and of a measured run, and a validator for them.

Layout: one process per device ("CPU", "GPU"), one thread per lane: the CPU's ops; the
GPU stream; the H2D and D2H copy engines (threads of the GPU process, since the copy
engines sit on the GPU). Each op or copy is one complete event (``"ph": "X"``) with
``ts``/``dur`` in microseconds and ``args`` holding the op type, op index and bytes.
Processes and threads are named by metadata events (``process_name`` / ``thread_name``).
A predicted and a measured timeline can share one file: they get separate processes.

A measured run is timed op by op (the executor runs one op at a time), so its events are
laid end to end in execution order, each on its device's lane and copies on copy lanes.
"""
from __future__ import annotations

import json
import math
import os

from placer.fileio import atomic_write_text
from placer.report.tables import COPY_TYPES, device_kind

# lane -> (device process, thread id, thread name)
LANES = {"cpu": ("cpu", 1, "CPU ops"), "gpu": ("gpu", 1, "GPU stream"),
         "h2d": ("gpu", 2, "H2D copies (PCIe)"), "d2h": ("gpu", 3, "D2H copies (PCIe)")}
DEVICES = ("cpu", "gpu")
US = 1e6             # trace timestamps are microseconds
TOLERANCE_US = 1e-3  # float rounding when seconds become microseconds


def predicted_events(plan: dict, schedule: str | None = None, pid_base: int = 1) -> list[dict]:
    """Events of one schedule of a plan dict (default: the one its objective names)."""
    schedules = plan.get("schedules") or {}
    name = schedule or (plan.get("objective") if plan.get("objective") in schedules else None) \
        or next(iter(schedules), None)
    if name is None or name not in schedules:
        return []
    ops = {o.get("index"): o for o in plan.get("ops") or []}
    tensors = {t.get("name"): t for t in plan.get("tensors") or []}
    out = _metadata(f"predicted ({name} schedule)", pid_base, {})
    for ev in schedules[name].get("events") or []:
        op = ops.get(ev.get("op"))
        is_copy = ev.get("kind") == "copy"
        tensor = ev.get("tensor")
        nbytes = ev.get("bytes")
        if nbytes is None:
            nbytes = (tensors.get(tensor) or {}).get("bytes") if is_copy else (op or {}).get("output_bytes")
        label = ev.get("name") or (f"copy {tensor}" if is_copy else (op or {}).get("name")) \
            or f"#{ev.get('op')} {(op or {}).get('type', '?')}"
        if is_copy:
            args = {"type": ev.get("type") or f"copy {ev.get('lane', '')}", "tensor": tensor}
        else:
            args = {"type": ev.get("type") or (op or {}).get("type"), "op": ev.get("op")}
        args["bytes"] = nbytes
        out.append(_complete(label, "copy" if is_copy else "op", ev.get("lane", "cpu"), pid_base,
                             ev["start_s"], ev["end_s"] - ev["start_s"], args))
    return out


def measured_events(run: dict, pid_base: int = 3) -> list[dict]:
    """Events of a RunRecord dict: ops end to end in execution order (module docstring)."""
    labels = {device_kind(str(name)): label for name, label in (run.get("timing_labels") or {}).items()}
    suffix = {d: f" [{labels[d]}]" for d in labels if labels[d] not in ("cpu",)}
    title = "measured" + (" (emulated GPU: CPU timings)" if run.get("emulated") else "")
    out = _metadata(title, pid_base, suffix)
    t = 0.0
    for o in run.get("ops") or []:
        direction = o.get("copy_direction") or ""
        kind = device_kind(str(o.get("device", "cpu")))
        lane = direction if direction in ("h2d", "d2h") else kind
        dur = float(o.get("time_s") or 0.0)
        is_copy = bool(direction) or o.get("type") in COPY_TYPES
        args = {"type": o.get("type"), "op": o.get("index"), "device": o.get("device"),
                "bytes": o.get("copy_bytes") if is_copy else None}
        name = o.get("name") or f"#{o.get('index')} {o.get('type')}"
        out.append(_complete(name, "copy" if is_copy else "op", lane, pid_base, t, dur, args))
        t += dur
    return out


def build_trace(plan: dict | None = None, run: dict | None = None,
                schedule: str | None = None) -> dict:
    """One trace object with the predicted timeline (from ``plan``) and/or the measured
    one (from ``run``), each in its own pair of processes."""
    events = []
    if plan is not None:
        events += predicted_events(plan, schedule, pid_base=1)
    if run is not None:
        events += measured_events(run, pid_base=3 if plan is not None else 1)
    meta = [e for e in events if e["ph"] == "M"]
    spans = sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + spans, "displayTimeUnit": "ms",
            "otherData": {"generator": "placer", "time_unit": "microseconds",
                          "net": (plan or {}).get("net") or (run or {}).get("net_name", "")}}


def write_trace(plan: dict | None, path: str | os.PathLike, run: dict | None = None,
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


def _metadata(title: str, pid_base: int, suffix: dict) -> list[dict]:
    out = []
    for k, dev in enumerate(DEVICES):
        pid = pid_base + k
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": f"{title}: {dev.upper()}{suffix.get(dev, '')}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
    for lane, (dev, tid, name) in LANES.items():
        out.append({"name": "thread_name", "ph": "M", "pid": pid_base + DEVICES.index(dev),
                    "tid": tid, "args": {"name": name}})
    return out


def _complete(name, cat, lane, pid_base, start_s, dur_s, args) -> dict:
    dev, tid, _ = LANES.get(lane, LANES["cpu"])
    return {"name": str(name), "cat": cat, "ph": "X", "ts": start_s * US, "dur": max(dur_s, 0.0) * US,
            "pid": pid_base + DEVICES.index(dev), "tid": tid,
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
