"""The numbers a report shows, taken from a plan dict (``placer plan --json``) and a run
record dict (``placer run --record``), with no drawing in them.

Every function tolerates older plans that lack a key: it returns None (or an empty list)
and the page says that part is not available, rather than failing.
"""
from __future__ import annotations

import math

import numpy as np

from placer.units import fmt_time

BASELINE_LABELS = {
    "all_cpu": "all-CPU",
    "all_gpu": "all-GPU (CPU fallback)",
    "greedy": "greedy (each op on its faster device)",
    "existing": "your placement (the file's device options)",
    "lower_bound": "lower bound (sum of min(CPU, GPU))",
}
COPY_TYPES = ("CopyCPUToGPU", "CopyGPUToCPU", "EnsureCPUOutput", "Copy")
MAX_TABLE_ROWS = 20000  # a bigger per-op table makes a page no browser scrolls happily


def op_display_name(op: dict) -> str:
    """An op's name, else its first output blob (Caffe2 ops are often unnamed), else ""."""
    return op.get("name") or next(iter(op.get("outputs") or []), "") or ""


def op_label(op: dict, width: int = 34) -> str:
    """`#12 Conv conv2_1` cut to ``width`` characters (axis labels, graph nodes)."""
    text = f"#{op.get('index', '?')} {op.get('type', '?')}"
    if op_display_name(op):
        text += f" {op_display_name(op)}"
    return text if len(text) <= width else text[:width - 1] + "…"


# --- summary -------------------------------------------------------------------------


def baseline_rows(plan: dict) -> list[dict]:
    """The plan and every baseline: label, total, whether it fits, how the plan compares.

    A baseline marked ``"feasible": false`` (it does not fit the GPU memory) keeps its time,
    which is what it would cost with unlimited memory, and says why it cannot be run.
    """
    plan_s = plan.get("total_s")
    rows = [{"key": "plan", "label": f"this plan ({plan.get('method', '?')}, "
                                     f"{plan.get('objective', 'serial')} objective)",
             "total_s": plan_s, "feasible": True, "vs_plan": "—", "note": ""}]
    for key, base in (plan.get("baselines") or {}).items():
        base = base if isinstance(base, dict) else {}
        total = base.get("total_s")
        feasible = bool(base.get("feasible", True)) and (total is None or math.isfinite(total))
        rows.append({"key": key, "label": base.get("label") or BASELINE_LABELS.get(key, key),
                     "total_s": total, "feasible": feasible,
                     "vs_plan": _ratio_text(total, plan_s, key) if feasible else "cannot run: does not fit",
                     "note": _base_note(base)})
    for r in rows:
        total = r["total_s"]
        r["time_text"] = ("n/a" if total is None else "infeasible" if not math.isfinite(total)
                          else fmt_time(total) + ("" if r["feasible"] else " (if it fitted)"))
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


def _base_note(base: dict) -> str:
    for key in ("why_infeasible", "note", "reason"):
        if base.get(key):
            return str(base[key])
    return "" if base.get("feasible", True) else "does not fit the GPU memory"


def summary(plan: dict) -> dict:
    """Headline figures: net, profiles, GPU memory, PCIe bytes, optimality."""
    mem = plan.get("gpu_memory") or {}
    pcie = plan.get("pcie_bytes") or {}
    ops = plan.get("ops") or []
    on_gpu = sum(1 for o in ops if o.get("device") == "gpu")
    used, cap = mem.get("used_bytes"), mem.get("capacity_bytes")
    return {
        "net": plan.get("net", "?"), "path": plan.get("path", ""),
        "method": plan.get("method", "?"), "objective": plan.get("objective", "serial"),
        "total_s": plan.get("total_s"), "compute_s": plan.get("compute_s"), "copy_s": plan.get("copy_s"),
        "n_ops": len(ops), "n_gpu": on_gpu,
        "n_cpu": len(ops) - on_gpu, "n_copies": len(plan.get("copies") or []),
        "profiles": plan.get("profiles") or {}, "notes": list(plan.get("notes") or []),
        "gpu_used": used, "gpu_capacity": cap, "gpu_usable": mem.get("usable_bytes"),
        "gpu_fraction": (used / cap) if used is not None and cap else None,
        "gpu_params": mem.get("param_bytes"), "gpu_peak_activations": mem.get("peak_activation_bytes"),
        "h2d_bytes": pcie.get("h2d"), "d2h_bytes": pcie.get("d2h"),
        "optimality": plan.get("optimality") or _optimality_text(plan),
        "makespans": {k: s.get("makespan_s") for k, s in (plan.get("schedules") or {}).items()},
        "overlap_gain_pct": _overlap_gain(plan.get("schedules") or {}),
    }


def _overlap_gain(schedules: dict) -> float | None:
    """How much shorter the overlapped (makespan) schedule is than the serial one, in %."""
    serial = (schedules.get("serial") or {}).get("makespan_s")
    overlapped = (schedules.get("makespan") or {}).get("makespan_s")
    if not serial or overlapped is None:
        return None
    return 100.0 * (serial - overlapped) / serial


def _optimality_text(plan: dict) -> str:
    if plan.get("optimal"):
        return f"optimal for the {plan.get('objective', 'serial')} objective"
    if plan.get("gap") is not None:
        return f"within {100 * plan['gap']:.2g}% of the best lower bound"
    return "no optimality proof for this plan"


# --- per op --------------------------------------------------------------------------


def op_rows(plan: dict, measured: dict[int, float] | None = None) -> list[dict]:
    """One row per op for the sortable table (times in seconds, saved = cpu - gpu)."""
    rows = []
    for k, o in enumerate((plan.get("ops") or [])[:MAX_TABLE_ROWS]):
        row = {"index": k, "name": "", "type": "?", "device": "?", "cpu_s": None, "gpu_s": None,
               "cpu_source": "", "gpu_source": "", "reason": "", "pinned": None}
        row.update({key: v for key, v in o.items() if v is not None})
        row["name"] = op_display_name(o)
        cpu, gpu = row["cpu_s"], row["gpu_s"]
        row["saved_s"] = (cpu - gpu) if cpu is not None and gpu is not None else None
        row["measured_s"] = (measured or {}).get(row["index"])
        rows.append(row)
    return rows


def top_savers(plan: dict, limit: int = 40) -> tuple[list[dict], int]:
    """Ops sorted by |cpu_s - gpu_s| (time saved by the better device), the first ``limit``;
    also how many ops have both times, so the page can say when it shows only some. An op
    with an infinite time on one device (no kernel there) has no bar to draw."""
    ops = [o for o in plan.get("ops") or [] if _finite(o.get("cpu_s")) and _finite(o.get("gpu_s"))]
    ops.sort(key=lambda o: (-abs(o["cpu_s"] - o["gpu_s"]), o.get("index", 0)))
    return ops[:limit], len(ops)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# --- predicted vs measured -----------------------------------------------------------


def device_kind(name: str) -> str:
    """"cpu" for the host, "gpu" for "cuda:0" / "emulated-cuda:0" / "gpu0"."""
    return "cpu" if name in ("cpu", "") or name.startswith("cpu") else "gpu"


def match_run(plan: dict, run: dict) -> list[dict]:
    """Pair each op of the plan with the op of the run that executed it.

    The placed net is the planned net with copy ops inserted, in the same order, so the two
    sequences are aligned in order: a run op of the same type (and name, where both have one)
    as the next plan op is that op; a copy op in between is one the rewrite inserted.
    Each pair carries the predicted time on the device the op actually ran on; an op of an
    emulated GPU ran on the CPU, so its reference is its predicted CPU time
    (``emulated`` True), which is what its measured time can be held to.
    """
    ops = plan.get("ops") or []
    pairs, j = [], 0
    for r in run.get("ops") or []:
        if j >= len(ops):
            break
        p = ops[j]
        same = r.get("type") == p.get("type") and (not r.get("name") or not p.get("name")
                                                   or r.get("name") == p.get("name"))
        if same:
            name = str(r.get("device", "cpu"))
            dev, emulated = device_kind(name), name.startswith("emulated")
            predicted = p.get("gpu_s") if dev == "gpu" and not emulated else p.get("cpu_s")
            ran_on = "cpu" if dev == "cpu" or emulated else "gpu"
            pairs.append({"index": p.get("index", j), "name": op_display_name(p), "type": p.get("type"),
                          "device": dev, "emulated": emulated, "predicted_s": predicted,
                          "measured_s": r.get("time_s"), "source": p.get(f"{ran_on}_source") or ""})
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
    """Where the model is off, by op family (``placer.costs.family_of``): per family the
    timed ops, their measured share of the run, predicted and measured sums, the error of
    the sum and the median per-op |error| (percent), and how the predictions were made
    (``measured: 3, fitted: 9``); the largest measured share first."""
    from placer.costs import family_of
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


def run_totals(plan: dict, run: dict) -> dict:
    """Whole-net figures: predicted serial total vs measured sum of op times, by part."""
    ops = run.get("ops") or []
    copies = [o for o in ops if o.get("copy_direction") in ("h2d", "d2h")]
    measured = sum(float(o.get("time_s") or 0.0) for o in ops)
    predicted = plan.get("total_s")
    by_dev: dict[str, float] = {}
    for o in ops:
        if o.get("copy_direction") in ("h2d", "d2h"):
            continue
        kind = device_kind(str(o.get("device", "cpu")))
        by_dev[kind] = by_dev.get(kind, 0.0) + float(o.get("time_s") or 0.0)
    pred_copy = sum(float(c.get("time_s") or 0.0) for c in plan.get("copies") or [])
    pred_dev = {"cpu": 0.0, "gpu": 0.0}
    for o in plan.get("ops") or []:
        d = o.get("device", "cpu")
        pred_dev[d] = pred_dev.get(d, 0.0) + float(o.get(f"{d}_s") or 0.0)
    pairs = match_run(plan, run)
    ops_measured = sum(float(p["measured_s"] or 0.0) for p in pairs)
    ops_reference = sum(float(p["predicted_s"] or 0.0) for p in pairs if _finite(p["predicted_s"]))
    return {
        "predicted_s": predicted, "measured_s": measured,
        "ops_reference_s": ops_reference, "ops_measured_s": ops_measured,
        "ops_error_pct": (100 * abs(ops_reference - ops_measured) / ops_measured) if ops_measured > 0 else None,
        "error_pct": (100 * abs(predicted - measured) / measured) if predicted is not None and measured > 0 else None,
        "rows": [
            {"part": "CPU ops", "predicted_s": pred_dev.get("cpu", 0.0), "measured_s": by_dev.get("cpu", 0.0)},
            {"part": "GPU ops", "predicted_s": pred_dev.get("gpu", 0.0), "measured_s": by_dev.get("gpu", 0.0)},
            {"part": "PCIe copies", "predicted_s": pred_copy,
             "measured_s": sum(float(o.get("time_s") or 0.0) for o in copies)},
        ],
        "copy_bytes": {d: sum(o.get("copy_bytes") or 0 for o in copies if o.get("copy_direction") == d)
                       for d in ("h2d", "d2h")},
        "peak_bytes": run.get("peak_bytes") or {},
    }
