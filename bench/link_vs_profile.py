"""Measured PCIe copy curves (``placer profile --link``) against a profile's curves.

Usage: python bench/link_vs_profile.py MEASURED.json [--reference NAME|FILE] [--json OUT.json]

MEASURED.json is a profile whose GPU device holds measured link points. The reference
defaults to the datasheet profile the measured device started from (its source's
``datasheet_figures_from``), else the shipped H200 profile. Prints per curve (H2D/D2H,
pinned/pageable) the fitted latency and bandwidth beside the reference's, and the measured
time over the reference time at a few sizes (``placer.profiling.link.compare_link``).
Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.errors import PlacerError  # noqa: E402
from placer.hardware.profiles import find_profile, load_profile  # noqa: E402
from placer.profiling.link import compare_link  # noqa: E402
from placer.units import fmt_bytes, fmt_rate, fmt_time  # noqa: E402

FALLBACK_REFERENCE = "h200-141gb-pcie5"
SHOWN_SIZES = (4096, 1 << 20, 1 << 30)  # small copies show the latency, large ones the rate


def reference_name(measured_source: dict) -> str:
    return measured_source.get("datasheet_figures_from") or FALLBACK_REFERENCE


def curve_lines(record: dict) -> list[str]:
    m, r = record["measured"], record["reference"]
    head = (f"{record['direction']} {record['memory']:<8}: latency {fmt_time(m['latency_s'])} "
            f"(profile {fmt_time(r['latency_s'])}), {fmt_rate(m['bytes_per_s'])} (profile {fmt_rate(r['bytes_per_s'])})")
    by_size = {p["nbytes"]: p for p in record["points"]}
    ratios = [f"{fmt_bytes(n)} {by_size[n]['ratio']:.2f}x" for n in SHOWN_SIZES if n in by_size]
    return [head] + ([f"    measured / profile time: {', '.join(ratios)}"] if ratios else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured")
    parser.add_argument("--reference", metavar="NAME|FILE")
    parser.add_argument("--json")
    a = parser.parse_args()
    try:
        gpu = load_profile(a.measured).device("gpu")
        ref_name = a.reference or reference_name(gpu.source)
        reference = load_profile(find_profile(ref_name)).device("gpu")
    except PlacerError as e:
        raise SystemExit(f"link_vs_profile: error: {e}") from None
    records = compare_link(gpu.link, reference.link)
    if not records:
        raise SystemExit(f"link_vs_profile: {a.measured} holds no measured link points "
                         "(run `placer profile --link --device cuda:0` first)")
    if a.json:
        Path(a.json).write_text(json.dumps({"measured": str(a.measured), "reference": ref_name,
                                            "curves": records}, indent=1) + "\n")
    print(f"{gpu.name}: measured copy curves against {ref_name}")
    for record in records:
        print("\n".join("  " + line for line in curve_lines(record)))


if __name__ == "__main__":
    main()
