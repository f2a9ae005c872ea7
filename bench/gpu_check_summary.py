"""The short summary of a ``bench/gpu_check.sh`` folder, from the files its steps wrote.

Usage: python bench/gpu_check_summary.py DIR     (prints it; the script saves it as DIR/summary.txt)

Reads DIR/meta.txt and DIR/steps.tsv (one line per step: name, status, seconds, note; a
later line for a step overrides an earlier one), DIR/gpu.log, the GPU tests' JUnit XML,
the ops_*.json of bench/gpu_vs_cpu_ops.py, link_compare.json of bench/link_vs_profile.py
and the plan JSON. Whatever a failed step did not write is reported as missing, never
guessed. Needs nothing but the standard library and placer.units (itself standard-library
only), so that it runs where placer's dependencies are missing.
"""
from __future__ import annotations

import csv
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.units import fmt_bytes, fmt_rate, fmt_time  # noqa: E402

SHOWN_SIZES = (4096, 1 << 20, 1 << 30)
FAILING = ("failed", "timeout", "no-time")


def read_meta(folder: Path) -> dict[str, str]:
    path = folder / "meta.txt"
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def read_steps(folder: Path) -> dict[str, dict]:
    """Step name -> its last record, in the order the steps first appeared."""
    path = folder / "steps.tsv"
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {row["step"]: row for row in csv.DictReader(f, delimiter="\t")}


def junit_counts(path: Path) -> dict | None:
    """passed / failed / skipped counts and skip reasons of a pytest JUnit XML file."""
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "reasons": {}}
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = (skip.get("message") or "").strip()[:90]
            counts["reasons"][reason] = counts["reasons"].get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts


def load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps_lines(steps: dict) -> list[str]:
    by_status: dict[str, list[str]] = {}
    for name, row in steps.items():
        by_status.setdefault(row["status"], []).append(name)
    lines = ["steps: " + ", ".join(f"{len(v)} {k}" for k, v in by_status.items())]
    for name, row in steps.items():
        if row["status"] != "ok":
            lines.append(f"  {name}: {row['status']}" + (f" ({row['note']})" if row["note"] else ""))
    return lines


def gpu_tests_lines(folder: Path, steps: dict, mode: str) -> list[str]:
    counts = junit_counts(folder / "gpu_tests.xml")
    status = steps.get("gpu_tests", {}).get("status", "not run")
    if counts is None:
        return [f"GPU tests (pytest -m gpu): no results ({status})"]
    line = (f"GPU tests (pytest -m gpu): {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['skipped']} skipped")
    if mode == "cpu-only" and counts["passed"] == 0:
        line += " (no GPU here: expected)"
    lines = [line]
    for reason, n in sorted(counts["reasons"].items(), key=lambda kv: -kv[1])[:4]:
        lines.append(f"  skipped x{n}: {reason}")
    return lines


def ops_lines(folder: Path, steps: dict) -> list[str]:
    lines = ["per-op times, GPU vs CPU (measured), and the cost model's predicted GPU times "
             "(error = predicted / measured - 1):"]
    names = [n[len("ops_"):] for n in steps if n.startswith("ops_")]
    for net in names:
        doc = load_json(folder / f"ops_{net}.json")
        if doc is None:
            lines.append(f"  {net}: no figures ({steps[f'ops_{net}']['status']})")
            continue
        lines.append(f"  {net}: {doc['ops']} ops, {doc['ops_on_gpu']} on the GPU: CPU {fmt_time(doc['cpu_total_s'])}, "
                     f"{doc['gpu_label']} {fmt_time(doc['gpu_total_s'])} (x{doc['cpu_total_s'] / max(doc['gpu_total_s'], 1e-12):.1f}) "
                     f"+ copies {fmt_time(doc['gpu_copies_s'])}; outputs differ by {doc['max_abs_diff']:.1e} at most")
        for label, p in doc["predictions"].items():
            if p["net_error_pct"] is None:
                lines.append(f"    predicted ({label}): no op ran on the GPU")
                continue
            worst = p["worst_ops"][0] if p["worst_ops"] else None
            lines.append(f"    predicted ({label}): {fmt_time(p['predicted_s'])}, net error {p['net_error_pct']:+.0f}%; "
                         f"per op |error| median {p['median_abs_op_error_pct']:.0f}%, p90 {p['p90_abs_op_error_pct']:.0f}%"
                         + (f"; worst {worst['op']}: {fmt_time(worst['predicted_s'])} vs {fmt_time(worst['measured_s'])}"
                            if worst else ""))
    if not names:
        lines.append("  (no ops step ran)")
    return lines


def link_lines(folder: Path, steps: dict) -> list[str]:
    doc = load_json(folder / "link_compare.json")
    if doc is None:
        return [f"PCIe copy curves: no figures ({steps.get('link_compare', {}).get('status', 'not run')})"]
    lines = [f"PCIe copy curves, measured against {doc['reference']} (time ratio measured / profile):"]
    for c in doc["curves"]:
        m, r = c["measured"], c["reference"]
        ratios = {p["nbytes"]: p["ratio"] for p in c["points"]}
        shown = ", ".join(f"{fmt_bytes(n)} {ratios[n]:.2f}x" for n in SHOWN_SIZES if n in ratios)
        lines.append(f"  {c['direction']} {c['memory']:<8}: latency {fmt_time(m['latency_s'])} "
                     f"(profile {fmt_time(r['latency_s'])}), {fmt_rate(m['bytes_per_s'])} "
                     f"(profile {fmt_rate(r['bytes_per_s'])}); {shown}")
    return lines


def plan_lines(folder: Path, steps: dict) -> list[str]:
    doc = load_json(folder / "plan_dlrm_small.json")
    if doc is None:
        return [f"plan: none ({steps.get('plan', {}).get('status', 'not run')})"]
    base = doc["baselines"]
    on_gpu = sum(o["device"] == "gpu" for o in doc["ops"])
    gpu = doc["profiles"]["gpu"]
    return [f"plan of {doc['net']} with the {gpu['source']} GPU profile ({gpu['name']}): "
            f"{doc['method']} {fmt_time(doc['total_s'])}, {on_gpu}/{len(doc['ops'])} ops on the GPU; "
            f"all-CPU {fmt_time(base['all_cpu']['total_s'])}, all-GPU {fmt_time(base['all_gpu']['total_s'])}"]


def summary(folder: Path) -> list[str]:
    meta, steps = read_meta(folder), read_steps(folder)
    mode = meta.get("mode", "?")
    lines = [f"gpu_check summary: {folder} (mode {mode}, commit {meta.get('commit', '?')}, "
             f"host {meta.get('host', '?')}, {meta.get('started', '?')})"]
    gpu_log = folder / "gpu.log"
    if steps.get("gpu", {}).get("status") == "ok" and gpu_log.exists():
        lines.append("GPU: " + gpu_log.read_text().splitlines()[0])
    else:
        lines.append(f"GPU: none ({steps.get('gpu', {}).get('status', 'not probed')})")
    lines += steps_lines(steps)
    lines += gpu_tests_lines(folder, steps, mode)
    lines += ops_lines(folder, steps)
    lines += link_lines(folder, steps)
    lines += plan_lines(folder, steps)
    failing = [n for n, row in steps.items() if row["status"] in FAILING]
    lines.append("result: " + (f"FAILED ({', '.join(failing)})" if failing else
                               "PASSED" + (" (GPU steps skipped: --cpu-only)" if mode == "cpu-only" else "")))
    return lines


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/gpu_check_summary.py DIR")
    print("\n".join(summary(Path(sys.argv[1]))))


if __name__ == "__main__":
    main()
