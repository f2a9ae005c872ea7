"""The numbers a report shows, taken from a plan (``placer plan --json``, read as a
``documents.plan.PlanDocument``) and a run record dict (``placer run --record``), with no
drawing in them.

Plans of both versions of the plan document are read through ``placer.report.doc``
(devices, op times per device, memory and bytes per link), so everything here is written
once, for N devices.

Every function tolerates older plans that lack a key: it returns None (or an empty list)
and the page says that part is not available, rather than failing.
"""
from __future__ import annotations

import math

import numpy as np

from placer.costs.model import family_of
from placer.documents.plan import Baseline, OpInfo, PlanDocument, Schedule
from placer.report.doc import (device_kind, device_kinds, direction, link_rows, memory_rows, op_source,
                               op_time, or_default, plan_devices, span_label, time_columns)
from placer.types import RunRecord, display_name
from placer.units import fmt_bytes, fmt_time

# What the report calls a baseline the plan gives no label (placer plan labels each one:
# placer.planning.view.BASELINE_LABELS; a plan written by hand or another tool may not).
UNLABELLED_BASELINES = {
    "all_cpu": "all-CPU",
    "all_gpu": "all-GPU (CPU fallback)",
    "greedy": "greedy (each op on its faster device)",
    "existing": "your placement (the file's device options)",
    "pipeline": "pipeline split over the GPUs (balanced by compute)",
    "m_topo": "Baechi m-TOPO",
    "m_etf": "Baechi m-ETF",
    "lower_bound": "lower bound (sum of min(CPU, GPU))",
}
MAX_TABLE_ROWS = 20000  # a bigger per-op table makes a page no browser scrolls happily
EMULATED = "emulated-"        # a run's name for an emulated GPU: "emulated-cuda:1"


def op_label(op: OpInfo, width: int = 34) -> str:
    """`#12 Conv conv2_1` cut to ``width`` characters (axis labels, graph nodes)."""
    text = f"#{or_default(op.index, '?')} {or_default(op.type, '?')}"
    name = display_name(op.name, op.outputs)
    if name:
        text += f" {name}"
    return text if len(text) <= width else text[:width - 1] + "…"


# --- summary -------------------------------------------------------------------------


def baseline_rows(plan: PlanDocument) -> list[dict]:
    """The plan and every baseline: label, serial total, overlapped makespan where the
    plan has them, whether it fits, the devices it uses and how the plan compares.

    A baseline marked ``"feasible": false`` (it does not fit some device's memory) keeps
    its time, which is what it would cost with unlimited memory, and says why it cannot
    be run. Under the makespan objective the comparison is by makespan, where the
    baseline has one.
    """
    plan_s = plan.total_s
    plan_ms = _makespan(plan.schedules, "makespan")
    by_makespan = plan.objective == "makespan" and plan_ms is not None
    used = sorted({o.device for o in plan.ops if o.device is not None}, key=plan_devices(plan).index)
    rows = [{"key": "plan", "label": f"this plan ({or_default(plan.method, '?')}, "
                                     f"{or_default(plan.objective, 'serial')} objective)",
             "total_s": plan_s, "makespan_s": plan_ms if by_makespan else None, "feasible": True,
             "devices": span_label(used), "vs_plan": "—", "note": ""}]
    for key, base in (plan.baselines or {}).items():
        total, span = base.total_s, base.makespan_s
        feasible = bool(or_default(base.feasible, True)) and (total is None or math.isfinite(total))
        vs = (_ratio_text(span, plan_ms, key) if by_makespan and span is not None
              else _ratio_text(total, plan_s, key))
        rows.append({"key": key, "label": base.label or UNLABELLED_BASELINES.get(key, key),
                     "total_s": total, "makespan_s": span, "feasible": feasible,
                     "devices": span_label(list(base.devices_used or [])),
                     "vs_plan": vs if feasible else "cannot run: does not fit",
                     "note": _base_note(base)})
    for r in rows:
        total = r["total_s"]
        r["time_text"] = ("n/a" if total is None else "infeasible" if not math.isfinite(total)
                          else fmt_time(total) + ("" if r["feasible"] else " (if it fitted)"))
        r["makespan_text"] = "" if r["makespan_s"] is None else fmt_time(r["makespan_s"])
    return rows


def _ratio_text(total: float | None, plan_s: float | None, key: str) -> str:
    if total is None or plan_s is None:
        return "n/a"
    if key == "lower_bound":
        return f"plan is {plan_s / total:.2f}x the bound" if total > 0 else "n/a"
    if plan_s <= 0:
        return "n/a"
    return f"plan is {total / plan_s:.2f}x faster" if total >= plan_s else \
        f"plan is {plan_s / total:.2f}x slower"


def _base_note(base: Baseline) -> str:
    for said in (base.why_infeasible, base.note, base.reason):
        if said:
            return str(said)
    return "" if or_default(base.feasible, True) else "does not fit the GPU memory"


def summary(plan: PlanDocument) -> dict:
    """Headline figures: net, machine, profiles, ops and memory per device, bytes per
    link, optimality."""
    mem = plan.gpu_memory
    pcie = plan.pcie_bytes or {}
    ops = plan.ops
    kinds = device_kinds(plan)
    counts = {d: 0 for d in plan_devices(plan)}
    for o in ops:
        if o.device is not None:
            counts[o.device] += 1
    on_gpu = sum(n for d, n in counts.items() if kinds[d] == "gpu")
    used, cap = (mem.used_bytes, mem.capacity_bytes) if mem is not None else (None, None)
    return {
        "net": or_default(plan.net, "?"), "path": or_default(plan.path, ""),
        "method": or_default(plan.method, "?"), "objective": or_default(plan.objective, "serial"),
        "total_s": plan.total_s, "compute_s": plan.compute_s, "copy_s": plan.copy_s,
        "machine": (plan.machine.description if plan.machine is not None else None)
        or ("the CPU and one GPU (a version-1 plan)" if not plan.devices else "not recorded"),
        "precision": (plan.precision or "not recorded (a plan written before --precision: the net's own dtypes)")
                     + "".join(f" ({note})" for note in plan.precision_notes or []),
        "n_ops": len(ops), "n_gpu": on_gpu, "n_cpu": len(ops) - on_gpu,
        "device_counts": [{"device": d, "kind": kinds[d], "ops": n} for d, n in counts.items()],
        "n_copies": len(plan.copies or []),
        "profiles": profile_rows(plan), "notes": list(plan.notes or []),
        "gpu_used": used, "gpu_capacity": cap, "gpu_usable": mem.usable_bytes if mem is not None else None,
        "gpu_fraction": (used / cap) if used is not None and cap else None,
        "memory": memory_rows(plan), "links": link_rows(plan),
        "h2d_bytes": pcie.get("h2d"), "d2h_bytes": pcie.get("d2h"), "d2d_bytes": pcie.get("d2d"),
        "optimality": plan.optimality or _optimality_text(plan),
        "makespans": {k: s.makespan_s for k, s in (plan.schedules or {}).items()},
        "overlap_gain_pct": _overlap_gain(plan.schedules or {}),
    }


def profile_rows(plan: PlanDocument) -> list[dict]:
    """The host's profile, then one row per GPU profile naming the GPUs that use it; a
    version-1 plan has ``cpu`` and ``gpu`` entries only."""
    profiles = plan.profiles or {}
    kinds = device_kinds(plan)
    gpus = [d for d in plan_devices(plan) if kinds[d] == "gpu" and d in profiles]
    rows = [{"label": "CPU", "profile": profiles["cpu"]}] if "cpu" in profiles else []
    if not gpus:
        if "gpu" in profiles:
            rows.append({"label": "GPU", "profile": profiles["gpu"]})
        return rows
    groups: dict[tuple, list[str]] = {}
    for d in gpus:
        groups.setdefault((profiles[d].name, profiles[d].source), []).append(d)
    for names in groups.values():
        rows.append({"label": span_label(names), "profile": profiles[names[0]]})
    return rows


def _makespan(schedules: dict[str, Schedule] | None, name: str) -> float | None:
    """The ``makespan_s`` of the plan's schedule ``name``; None if it has none."""
    schedule = (schedules or {}).get(name)
    return schedule.makespan_s if schedule is not None else None


def _overlap_gain(schedules: dict[str, Schedule]) -> float | None:
    """How much shorter the overlapped (makespan) schedule is than the serial one, in %."""
    serial = _makespan(schedules, "serial")
    overlapped = _makespan(schedules, "makespan")
    if not serial or overlapped is None:
        return None
    return 100.0 * (serial - overlapped) / serial


def _optimality_text(plan: PlanDocument) -> str:
    if plan.optimal:
        return f"optimal for the {or_default(plan.objective, 'serial')} objective"
    if plan.gap is not None:
        return f"within {100 * plan.gap:.2g}% of the best lower bound"
    return "no optimality proof for this plan"


# --- per op --------------------------------------------------------------------------


def op_rows(plan: PlanDocument, measured: dict[int, float] | None = None,
            columns: list[dict] | None = None) -> list[dict]:
    """One row per op for the sortable table: its device, its time on every column of
    ``time_columns`` (``times``), on its own device (``time_s``), and ``saved_s``: the
    host's time less that (what placing it off the host saves; 0 on the host)."""
    columns = time_columns(plan) if columns is None else columns
    kinds = device_kinds(plan)
    host = next((c["device"] for c in columns if c["kind"] == "cpu"), "cpu")
    rows = []
    for k, o in enumerate(plan.ops[:MAX_TABLE_ROWS]):
        row: dict = {"index": k, "name": "", "type": "?", "device": "?", "reason": "", "pinned": None}
        row.update({key: v for key, v in o if v is not None})
        row["name"] = display_name(o.name, o.outputs)
        dev = row["device"]
        row["kind"] = kinds.get(dev) or device_kind(dev)
        row["times"] = [op_time(o, c["device"], c["kind"]) for c in columns]
        row["sources"] = _sources_text(o, columns)
        kernel = o.gpu_kernel or {}                           # what the GPU kernel model assumed
        notes = [kernel] if isinstance(kernel, str) else sorted(set(kernel.values()))
        row["gpu_kernel"] = "; ".join(notes)
        row["time_s"] = op_time(o, dev, row["kind"]) if dev != "?" else None
        here, cpu = row["time_s"], op_time(o, host, "cpu")
        row["saved_s"] = (cpu - here) if _finite(cpu) and _finite(here) else None
        row["pinned"] = _pinned_text(row["pinned"])
        row["measured_s"] = (measured or {}).get(row["index"])
        rows.append(row)
    return rows


def _sources_text(op: OpInfo, columns: list[dict]) -> str:
    """``measured`` when every column says so, else ``cpu measured; cuda:0-3 roofline``."""
    found = [(c["label"], op_source(op, c["device"], c["kind"])) for c in columns]
    found = [(label, s) for label, s in found if s]
    if len({s for _, s in found}) <= 1:
        return found[0][1] if found else ""
    return "; ".join(f"{label} {s}" for label, s in found)


def _pinned_text(pinned) -> str:
    if isinstance(pinned, (list, tuple)):
        return span_label([str(p) for p in pinned])
    return str(pinned or "")


def top_savers(plan: PlanDocument, limit: int = 40) -> tuple[list[OpInfo], int]:
    """Ops sorted by the spread of their times over the devices (slowest less fastest:
    what choosing the device decides), the first ``limit``; also how many ops have at
    least two finite times, so the page can say when it shows only some. An op with an
    infinite time on a device (no kernel there) is ranked by its finite times."""
    columns = time_columns(plan)
    ranked = []
    for o in plan.ops:
        times = [t for t in (op_time(o, c["device"], c["kind"]) for c in columns) if _finite(t)]
        if len(times) >= 2:
            ranked.append((max(times) - min(times), o))
    ranked.sort(key=lambda x: (-x[0], or_default(x[1].index, 0)))
    return [o for _, o in ranked[:limit]], len(ranked)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# --- predicted vs measured -----------------------------------------------------------


def run_device(plan: PlanDocument, name: str) -> str:
    """The plan's name for a device of a run: ``emulated-cuda:1`` ran as ``cuda:1``; a
    version-1 plan's only GPU is ``gpu`` whatever the run called it."""
    base = str(name).removeprefix(EMULATED)
    devices = plan_devices(plan)
    if base in devices:
        return base
    kinds = device_kinds(plan)
    gpus = [d for d in devices if kinds[d] == "gpu"]
    return gpus[0] if device_kind(base) == "gpu" and len(gpus) == 1 else base


def _predicted_where_ran(op: OpInfo, device: str, emulated: bool) -> float | None:
    """The op's predicted time where it ran: on an emulated GPU it ran on the host, so
    its host (CPU) time, which is what its measured time can be held to."""
    if emulated or device_kind(device) == "cpu":
        return op_time(op, "cpu", "cpu")
    return op_time(op, device.removeprefix(EMULATED), "gpu")


def match_run(plan: PlanDocument, run: dict) -> list[dict]:
    """Pair each op of the plan with the op of the run that executed it.

    The placed net is the planned net with copy ops inserted, in the same order, so the two
    sequences are aligned in order: a run op of the same type (and name, where both have one)
    as the next plan op is that op; a copy op in between is one the rewrite inserted.
    Each pair carries the predicted time on the device the op actually ran on; an op of an
    emulated GPU ran on the CPU, so its reference is its predicted CPU time
    (``emulated`` True), which is what its measured time can be held to.
    """
    ops = plan.ops
    pairs, j = [], 0
    for r in run.get("ops") or []:
        if j >= len(ops):
            break
        p = ops[j]
        same = r.get("type") == p.type and (not r.get("name") or not p.name or r.get("name") == p.name)
        if same:
            name = str(r.get("device", "cpu"))
            dev, emulated = device_kind(name), name.startswith("emulated")
            predicted = _predicted_where_ran(p, name, emulated)
            ran_on = "cpu" if dev == "cpu" or emulated else name.removeprefix(EMULATED)
            pairs.append({"index": or_default(p.index, j), "name": display_name(p.name, p.outputs),
                          "type": p.type, "device": dev, "emulated": emulated, "predicted_s": predicted,
                          "measured_s": r.get("time_s"), "source": op_source(p, ran_on)})
            j += 1
    return pairs


def error_stats(pairs: list[dict]) -> dict:
    """Median and p90 of |predicted - measured| / measured, in percent, over timed ops."""
    pred = np.array([p["predicted_s"] if _finite(p["predicted_s"]) else np.nan for p in pairs], float)
    meas = np.array([p["measured_s"] if _finite(p["measured_s"]) else 0.0 for p in pairs], float)
    ok = (meas > 0) & np.isfinite(pred)
    if not ok.any():
        return {"n": 0, "median_pct": None, "p90_pct": None}
    err = 100.0 * np.abs(pred[ok] - meas[ok]) / meas[ok]
    return {"n": int(ok.sum()), "median_pct": float(np.median(err)),
            "p90_pct": float(np.percentile(err, 90))}


def family_errors(pairs: list[dict]) -> list[dict]:
    """Where the model is off, by op family (``placer.costs.model.family_of``): per family the
    timed ops, their measured share of the run, predicted and measured sums, the error of
    the sum and the median per-op |error| (percent), and how the predictions were made
    (``measured: 3, fitted: 9``); the largest measured share first."""
    groups: dict[str, list[dict]] = {}
    for p in pairs:
        if _finite(p["predicted_s"]) and _finite(p["measured_s"]) and p["measured_s"] > 0:
            groups.setdefault(family_of(str(p["type"])), []).append(p)
    total = sum(p["measured_s"] for ps in groups.values() for p in ps)
    rows = []
    for family, ps in groups.items():
        pred, meas = sum(p["predicted_s"] for p in ps), sum(p["measured_s"] for p in ps)
        errs = [100.0 * abs(p["predicted_s"] - p["measured_s"]) / p["measured_s"] for p in ps]
        sources: dict[str, int] = {}
        for p in ps:
            sources[p.get("source") or "?"] = sources.get(p.get("source") or "?", 0) + 1
        rows.append({"family": family, "ops": len(ps), "share_pct": 100.0 * meas / total if total else 0.0,
                     "predicted_s": pred, "measured_s": meas, "sum_error_pct": 100.0 * (pred - meas) / meas,
                     "median_pct": float(np.median(errs)),
                     "sources": ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))})
    return sorted(rows, key=lambda r: -r["measured_s"])


def run_links(plan: PlanDocument, run: dict) -> dict[tuple[str, str], dict]:
    """Measured bytes, copies and seconds per (source, destination) plan device. A copy
    op's ``links`` list its transfers; its time is shared among them by bytes. Run
    records from before ``links`` give the direction only: h2d from the host to the op's
    device, d2h back."""
    out: dict[tuple[str, str], dict] = {}
    for o in run.get("ops") or []:
        links = [tuple(x) for x in o.get("links") or []]
        if not links and o.get("copy_direction") in ("h2d", "d2h"):
            dev = str(o.get("device", "cpu"))
            links = [("cpu", dev, o.get("copy_bytes") or 0) if o["copy_direction"] == "h2d"
                     else (dev, "cpu", o.get("copy_bytes") or 0)]
        total = sum(float(n or 0) for _, _, n in links)
        for src, dst, nbytes in links:
            key = (run_device(plan, src), run_device(plan, dst))
            row = out.setdefault(key, {"bytes": 0.0, "copies": 0, "time_s": 0.0})
            share = float(nbytes or 0) / total if total > 0 else 1.0 / len(links)
            row["bytes"] += float(nbytes or 0)
            row["copies"] += 1
            row["time_s"] += share * float(o.get("time_s") or 0.0)
    return out


def run_totals(plan: PlanDocument, run: dict) -> dict:
    """Whole-net figures: predicted serial total vs measured sum of op times, per device
    (ops, and memory: the plan's bytes used against the run's peak live bytes) and per
    link (bytes, copies and seconds)."""
    ops = run.get("ops") or []
    is_copy = [bool(o.get("copy_direction")) or bool(o.get("links")) for o in ops]
    measured = sum(float(o.get("time_s") or 0.0) for o in ops)
    predicted = plan.total_s
    kinds = device_kinds(plan)
    ran: dict[str, float] = {}
    for o, copy in zip(ops, is_copy):
        if not copy:
            d = run_device(plan, str(o.get("device", "cpu")))
            ran[d] = ran.get(d, 0.0) + float(o.get("time_s") or 0.0)
    planned: dict[str, float] = {}
    for o in plan.ops:
        d = or_default(o.device, "cpu")
        planned[d] = planned.get(d, 0.0) + float(op_time(o, d, kinds.get(d)) or 0.0)
    peaks = {run_device(plan, k): v for k, v in (run.get("peak_bytes") or {}).items()}
    used = {m["device"]: m["used_bytes"] for m in memory_rows(plan)}
    devices = [d for d in plan_devices(plan) if d in ran or planned.get(d) or d in peaks] + \
        [d for d in ran if d not in plan_devices(plan)]
    by_device = [{"device": d, "predicted_s": planned.get(d, 0.0), "measured_s": ran.get(d, 0.0),
                  "predicted_bytes": used.get(d), "peak_bytes": peaks.get(d)} for d in devices]
    links = _link_comparison(plan, run)
    pairs = match_run(plan, run)
    ops_measured = sum(float(p["measured_s"] or 0.0) for p in pairs)
    ops_reference = sum(float(p["predicted_s"] or 0.0) for p in pairs if _finite(p["predicted_s"]))
    rows = [{"part": f"ops on {r['device']}", "predicted_s": r["predicted_s"], "measured_s": r["measured_s"]}
            for r in by_device]
    rows.append({"part": "copies between devices", "predicted_s": sum(x["predicted_s"] for x in links),
                 "measured_s": sum(float(o.get("time_s") or 0.0) for o, c in zip(ops, is_copy) if c)})
    return {
        "predicted_s": predicted, "measured_s": measured,
        "ops_reference_s": ops_reference, "ops_measured_s": ops_measured,
        "ops_error_pct": (100 * abs(ops_reference - ops_measured) / ops_measured) if ops_measured > 0 else None,
        "error_pct": (100 * abs(predicted - measured) / measured) if predicted is not None and measured > 0 else None,
        "rows": rows, "devices": by_device, "links": links,
        "copy_bytes": {d: sum(o.get("copy_bytes") or 0 for o in ops if o.get("copy_direction") == d)
                       for d in ("h2d", "d2h", "d2d")},
        "peak_bytes": run.get("peak_bytes") or {},
    }


def _link_comparison(plan: PlanDocument, run: dict) -> list[dict]:
    """Per link the plan or the run crossed: predicted and measured bytes, copies, seconds."""
    predicted = {(r["src"], r["dst"]): r for r in link_rows(plan)}
    measured = run_links(plan, run)
    out = []
    for key in list(predicted) + sorted(k for k in measured if k not in predicted):
        p, m = predicted.get(key) or {}, measured.get(key) or {}
        out.append({"link": f"{key[0]}->{key[1]}", "direction": direction(*key),
                    "predicted_bytes": float(p.get("bytes") or 0.0), "measured_bytes": float(m.get("bytes") or 0.0),
                    "predicted_copies": int(p.get("copies") or 0), "measured_copies": int(m.get("copies") or 0),
                    "predicted_s": float(p.get("time_s") or 0.0), "measured_s": float(m.get("time_s") or 0.0)})
    return out


def run_table(rec: RunRecord) -> str:
    """Per-op times, then per device its time and peak memory, per link its bytes."""
    rows = [f"{'#':>4}  {'op':<28} {'type':<20} {'device':<16} {'ms':>9}  copy"]
    for o in rec.ops:
        copy = f"{o.copy_bytes:,} B {o.copy_direction}" if o.copy_direction else ""
        rows.append(f"{o.index:>4}  {(o.name or '-')[:28]:<28} {o.type[:20]:<20} {o.device:<16} "
                    f"{o.time_s * 1e3:>9.3f}  {copy}")
    rows.append(f"total {rec.total_s * 1e3:.3f} ms (median of {rec.iterations} run(s) "
                f"after {rec.warmup} warm-up) over {len(rec.ops)} ops")
    times = rec.time_by_device_s()
    for dev in rec.devices:
        rows.append(f"  {rec.timing_labels.get(dev, dev)}: {times.get(dev, 0.0) * 1e3:.3f} ms, "
                    f"peak {fmt_bytes(rec.peak_bytes.get(dev, 0))}")
    for way in ("h2d", "d2h", "d2d"):
        if rec.copy_bytes(way):
            rows.append(f"  copies {way}: {rec.copy_bytes(way):,} B")
    rows += _link_rows(rec)
    if rec.emulated:
        rows.append("  GPU emulated on the CPU: times are CPU times (a structure check, not a speed figure)")
    return "\n".join(rows)


def _link_rows(rec: RunRecord) -> list[str]:
    """One row per link and direction: copies, bytes, and the time of the copies that used
    only that link (an op moving over several links is counted in bytes, not in time)."""
    links: dict[tuple[str, str], list] = {}
    for o in rec.ops:
        for src, dst, nbytes in o.links:
            row = links.setdefault((src, dst), [0, 0, 0.0])
            row[0] += 1
            row[1] += nbytes
            row[2] += o.time_s if len(o.links) == 1 else 0.0
    return [f"  link {src} -> {dst}: {n} cop{'y' if n == 1 else 'ies'}, {fmt_bytes(nbytes)}, {t * 1e3:.3f} ms"
            for (src, dst), (n, nbytes, t) in sorted(links.items())]
