"""Every op of a net timed on the CPU (numpy) and on the GPU (cupy, CUDA events).

Usage: python bench/gpu_vs_cpu_ops.py NET [--batch 8] [--repeats 5] [--csv out.csv] [--emulate-gpu]
NET is a corpus file name under ../shared/nets/caffe (or $PLACER_CORPUS/caffe; converted
with random weights) or a path. Writes one CSV row per op (index, type, cpu_s, gpu_s, speedup) and prints totals
and the max output difference between the two runs. --emulate-gpu exercises the same
path without a GPU (its "gpu" times are then CPU times). Not a test: it prints figures.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.formats import load_net  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402
from placer.types import Device, TensorType  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("net")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv")
    parser.add_argument("--emulate-gpu", action="store_true")
    a = parser.parse_args()
    corpus = Path(os.environ.get("PLACER_CORPUS", ROOT.parent / "shared" / "nets"))
    path = Path(a.net) if Path(a.net).exists() else corpus / "caffe" / a.net
    net = load_net(path)
    shapes = {n: TensorType((a.batch,) + t.shape[1:], t.dtype) for n, t in net.input_shapes.items()}
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(t.shape).astype(t.dtype) for n, t in shapes.items()}
    runs = {}
    for where, device_map in (("cpu", {}), ("gpu", {op.index: Device("gpu", 0) for op in net.ops})):
        ex = Executor(net, device_map=device_map, emulate_gpu=a.emulate_gpu, input_types=shapes)
        out = ex.run(feed, iterations=a.repeats, warmup=2)
        runs[where] = (ex.record, out)
    (cpu, out_c), (gpu, out_g) = runs["cpu"], runs["gpu"]
    diff = max(float(np.max(np.abs(out_c[n] - out_g[n]))) for n in out_c)
    rows = [(c.index, c.type, c.time_s, g.time_s, c.time_s / g.time_s if g.time_s else float("nan"))
            for c, g in zip(cpu.ops, gpu.ops)]
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["index", "type", "cpu_s", "gpu_s", "speedup"])
            w.writerows(rows)
    label = gpu.timing_labels.get(gpu.ops[0].device, gpu.ops[0].device) if gpu.ops else "gpu"
    print(f"{path.name} batch {a.batch}: cpu {cpu.total_s * 1e3:.2f} ms, {label} {gpu.total_s * 1e3:.2f} ms "
          f"(x{cpu.total_s / max(gpu.total_s, 1e-12):.1f}), max |diff| {diff:.2e}, "
          f"gpu peak {max(gpu.peak_bytes.values()) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
