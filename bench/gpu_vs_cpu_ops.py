"""Every op of a net timed on the CPU (numpy) and on the GPU (cupy, CUDA events), beside the
cost model's predicted GPU time of each op.

Usage: python bench/gpu_vs_cpu_ops.py NET [--batch N] [--repeats 5] [--gpu-profile P]...
                                      [--csv OUT.csv] [--json OUT.json] [--emulate-gpu]

NET is a net file, the name of a bundled example (``dlrm_small``, ``resnet_small``) or of a
net generated here (``GENERATED``: ``resnet18_b8``, ``dlrm_b2048``), so that the script
needs nothing beside the repository. ``--batch`` sets the first dimension of every input
of a file (a generated net takes it as its batch size).

The CPU run puts every op on the CPU. The GPU run puts every op that has a GPU kernel on
cuda:0 and the others on the CPU, with the copies ``placer.rewrite.netdef`` inserts (all-GPU with
CPU fallback, as Caffe2 runs a net by itself); the per-op rows are its non-copy ops, in
the net's order. Each run is ``--repeats`` timed iterations after two warm-ups; an op's
time is its median.

Predictions: for each ``--gpu-profile`` (default: the shipped H200 datasheet profile) the
cost model's GPU time of every op at its shapes, with measured entries left out of the
answer (``CostModel(use_measured=False)``): a profile measured on this very net still
predicts through its fitted families instead of echoing its own timings. Error of an op:
predicted / measured - 1; of the net: the same over the sums of the ops that ran on the GPU.

``--emulate-gpu`` exercises the same path without a GPU: its "GPU" times are CPU times
(labelled so), and its errors say nothing about the model. Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer import examples  # noqa: E402
from placer.rewrite import netdef as rewrite  # noqa: E402
from placer.costs.model import CostModel  # noqa: E402
from placer.errors import PlacerError  # noqa: E402
from placer.examples import dlrm, resnet  # noqa: E402
from placer.formats import load_net  # noqa: E402
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.hardware.machine import compose_machine  # noqa: E402
from placer.ops import registry  # noqa: E402
from placer.hardware.profiles import default_profiles, find_profile, load_profile  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402
from placer.runtime.inputs import random_inputs  # noqa: E402
from placer.shapes import infer  # noqa: E402
from placer.types import Net, TensorType  # noqa: E402
from placer.units import fmt_bytes, fmt_time  # noqa: E402

DEFAULT_GPU_PROFILE = "h200-141gb-pcie5"
WARMUP = 2
# Nets made in code at sizes where a GPU has work to do (the bundled ones are small).
GENERATED = {
    "resnet18_b8": lambda batch: resnet.build(resnet.ResNetConfig(
        name="resnet18_b8", batch=batch or 8, image=224, widths=(64, 128, 256, 512),
        blocks_per_stage=2, classes=1000)),
    "dlrm_b2048": lambda batch: dlrm.build(replace(dlrm.small(max_rows=20000, batch=batch or 2048),
                                                   name="dlrm_b2048")),
}


def resolve_net(spec: str, folder: Path, batch: int | None) -> Path:
    """A net file for ``spec``: a path, a bundled example, or a generated net saved in ``folder``."""
    if Path(spec).exists():
        return Path(spec)
    if spec in GENERATED:
        return GENERATED[spec](batch).save(folder, spec)["predict"]
    if spec in examples.builders():
        return examples.path(spec)
    raise SystemExit(f"gpu_vs_cpu_ops: {spec}: not a file, a bundled example "
                     f"({', '.join(examples.builders())}) or a generated net ({', '.join(GENERATED)})")


def input_types(net: Net, batch: int | None, generated: bool) -> dict[str, TensorType]:
    types = dict(net.input_shapes)
    if batch and not generated:
        types = {n: TensorType((batch,) + t.shape[1:], t.dtype) for n, t in types.items()}
    return types


def fallback_placement(net: Net, machine) -> list[int]:
    """cuda:0 for every op with a GPU kernel, the CPU for the rest (device indices of ``machine``)."""
    cpu, gpu = machine.index("cpu"), machine.index("cuda:0")
    return [gpu if "gpu" in registry.get(op.type).devices else cpu for op in net.ops]


def timed_run(net: Net, types: dict, feed: dict, repeats: int, emulate: bool):
    ex = Executor(net, emulate_gpu=emulate, input_types=types)
    out = ex.run(feed, iterations=repeats, warmup=WARMUP)
    return ex.record, out


def predict_gpu_s(net: Net, types: dict, profile_path: Path) -> tuple[list[float], list[str]]:
    """The cost model's GPU time and its source for every op (module docstring)."""
    model = CostModel(gpu_profile=load_profile(profile_path).device("gpu"), use_measured=False)
    typed = infer(net, types)
    times, sources = [], []
    for op, feats in zip(net.ops, typed.features):
        inputs = [typed.blobs.get(b) for b in op.inputs]
        seconds, source = model.op_time(op.type, inputs, op.args, feats, "gpu")
        times.append(seconds)
        sources.append(source)
    return times, sources


def error_stats(rows: list[dict], label: str) -> dict:
    """Per-op and per-net error of one profile's predictions over the ops run on the GPU."""
    gpu_rows = [r for r in rows if r["device"] != "cpu" and r["gpu_s"] > 0]
    errors = [r[f"pred_{label}_s"] / r["gpu_s"] - 1 for r in gpu_rows]
    measured = sum(r["gpu_s"] for r in gpu_rows)
    predicted = sum(r[f"pred_{label}_s"] for r in gpu_rows)
    worst = sorted(gpu_rows, key=lambda r: -abs(r[f"pred_{label}_s"] / r["gpu_s"] - 1))[:3]
    abs_pct = [100 * abs(e) for e in errors]
    return {
        "ops": len(gpu_rows), "measured_s": measured, "predicted_s": predicted,
        "net_error_pct": 100 * (predicted / measured - 1) if measured else None,
        "median_abs_op_error_pct": statistics.median(abs_pct) if abs_pct else None,
        "p90_abs_op_error_pct": float(np.percentile(abs_pct, 90)) if abs_pct else None,
        "worst_ops": [{"op": f"#{r['index']} {r['type']} {r['name']}".rstrip(), "measured_s": r["gpu_s"],
                       "predicted_s": r[f"pred_{label}_s"]} for r in worst],
    }


def per_op_rows(net: Net, cpu_rec, gpu_rec, predictions: dict) -> list[dict]:
    gpu_ops = [o for o in gpu_rec.ops if not o.copy_direction]
    if [o.type for o in gpu_ops] != [op.type for op in net.ops]:
        raise SystemExit("gpu_vs_cpu_ops: the placed net's ops do not follow the original's")
    rows = []
    for op, c, g in zip(net.ops, cpu_rec.ops, gpu_ops):
        row = {"index": op.index, "name": op.name or (op.outputs[0] if op.outputs else ""), "type": op.type,
               "device": g.device, "cpu_s": c.time_s, "gpu_s": g.time_s,
               "speedup": c.time_s / g.time_s if g.time_s else float("nan")}
        for label, (times, sources) in predictions.items():
            row[f"pred_{label}_s"] = times[op.index]
            row[f"source_{label}"] = sources[op.index]
        rows.append(row)
    return rows


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    try:
        run(parse_args())
    except PlacerError as e:  # a bad profile or net: one line, as the placer command says it
        raise SystemExit(f"gpu_vs_cpu_ops: error: {e}") from None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu-profile", action="append", metavar="NAME|FILE",
                        help=f"profile whose predictions are compared (repeatable; default {DEFAULT_GPU_PROFILE})")
    parser.add_argument("--csv")
    parser.add_argument("--json")
    parser.add_argument("--emulate-gpu", action="store_true")
    return parser.parse_args()


def run(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = resolve_net(a.net, Path(tmp), a.batch)
        net = load_net(path)
        types = input_types(net, a.batch, a.net in GENERATED)
        feed = random_inputs(net, infer(net, types).blobs, net.data_inputs, seed=0)
        cpu_rec, out_c = timed_run(net, types, feed, a.repeats, a.emulate_gpu)
        machine = compose_machine(*default_profiles())      # the host and cuda:0
        placed = rewrite.place(net, fallback_placement(net, machine), machine)
        gpu_rec, out_g = timed_run(net_from_netdef(placed.predict, placed.init), types, feed,
                                   a.repeats, a.emulate_gpu)
    profiles = {Path(p).stem: find_profile(p) for p in (a.gpu_profile or [DEFAULT_GPU_PROFILE])}
    predictions = {label: predict_gpu_s(net, types, p) for label, p in profiles.items()}
    rows = per_op_rows(net, cpu_rec, gpu_rec, predictions)
    diff = max(float(np.max(np.abs(out_c[n].astype(np.float64) - out_g[n]))) for n in out_c)
    gpu_device = next((o.device for o in gpu_rec.ops if o.device != "cpu"), "cuda:0")
    summary = {
        "net": a.net, "file": path.name, "batch": a.batch, "ops": len(rows), "repeats": a.repeats,
        "emulated": gpu_rec.emulated, "gpu_label": gpu_rec.timing_labels.get(gpu_device, gpu_device),
        "ops_on_gpu": sum(r["device"] != "cpu" for r in rows),
        "cpu_total_s": sum(r["cpu_s"] for r in rows), "gpu_total_s": sum(r["gpu_s"] for r in rows),
        "gpu_copies_s": sum(o.time_s for o in gpu_rec.ops if o.copy_direction),
        "max_abs_diff": diff, "gpu_peak_bytes": max(gpu_rec.peak_bytes.values(), default=0),
        "predictions": {label: {"profile": str(p), **error_stats(rows, label)} for label, p in profiles.items()},
    }
    if a.csv:
        write_csv(a.csv, rows)
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(report(summary))


def report(s: dict) -> str:
    lines = [f"{s['net']}: {s['ops']} ops ({s['ops_on_gpu']} on the GPU): cpu {fmt_time(s['cpu_total_s'])}, "
             f"{s['gpu_label']} {fmt_time(s['gpu_total_s'])} + copies {fmt_time(s['gpu_copies_s'])} "
             f"(x{s['cpu_total_s'] / max(s['gpu_total_s'], 1e-12):.1f}), max |diff| {s['max_abs_diff']:.2e}, "
             f"gpu peak {fmt_bytes(s['gpu_peak_bytes'])}"]
    for label, p in s["predictions"].items():
        if p["net_error_pct"] is None:
            lines.append(f"  predicted by {label}: no op ran on the GPU")
            continue
        lines.append(f"  predicted by {label}: {fmt_time(p['predicted_s'])} vs measured {fmt_time(p['measured_s'])} "
                     f"(net {p['net_error_pct']:+.0f}%); per op |error| median {p['median_abs_op_error_pct']:.0f}%, "
                     f"p90 {p['p90_abs_op_error_pct']:.0f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
