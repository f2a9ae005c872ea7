"""Prints GFLOP/s of placer's Conv kernel (numpy) on typical shapes, batch 1 and 8.

Usage: python bench/conv_kernels.py [--repeats 5] [--threshold]
  --threshold also times both GEMM strategies (one GEMM per tap vs one stacked GEMM)
  on each shape, which is how ``conv._ACCUMULATE_MIN_CHANNELS`` was chosen.
A benchmark prints figures; it is not a test. FLOPs count a multiply-add as 2.
Where torch is installed, its CPU conv2d on the same shapes is printed beside ours for scale.
On a shared machine pin the threads for stable figures: OPENBLAS_NUM_THREADS=1 (torch then
gets the same thread count).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.ops import conv  # noqa: E402
from placer.types import Args  # noqa: E402

# name, C, M, H (=W), kernel, stride, pad, group
SHAPES = [
    ("3x3 64->64 56^2", 64, 64, 56, 3, 1, 1, 1),
    ("1x1 256->64 56^2", 256, 64, 56, 1, 1, 0, 1),
    ("depthwise 3x3 32ch 112^2", 32, 32, 112, 3, 1, 1, 32),
    ("AlexNet conv1 11x11/4 3->96 227^2", 3, 96, 227, 11, 4, 0, 1),
]


def best_of(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_conv(n, c, m, hw, k, s, p, g, repeats, torch=None):
    """(seconds, GFLOP/s) of our kernel, or of torch's conv2d when ``torch`` is given."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hw, hw), dtype=np.float32)
    w = rng.standard_normal((m, c // g, k, k), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    args = Args({"kernel": k, "stride": s, "pad": p, "group": g}, op="bench")
    y = conv.conv_kernel(np, [x, w, b], args)[0]
    if torch is None:
        sec = best_of(lambda: conv.conv_kernel(np, [x, w, b], args), repeats)
    else:
        tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
        conv2d = torch.nn.functional.conv2d
        sec = best_of(lambda: conv2d(tx, tw, tb, stride=s, padding=p, groups=g), repeats)
    ho, wo = y.shape[2:]
    flops = 2.0 * n * m * ho * wo * (c // g) * k * k
    return sec, flops / sec / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threshold", action="store_true")
    opts = parser.parse_args()
    try:
        import torch
        if os.environ.get("OPENBLAS_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OPENBLAS_NUM_THREADS"]))
    except ImportError:
        torch = None
    print(f"{'shape':36} {'N':>2} {'ms':>8} {'GFLOP/s':>8}" + ("  torch ms  GFLOP/s" if torch else ""))
    for name, c, m, hw, k, s, p, g in SHAPES:
        for n in (1, 8):
            sec, gf = time_conv(n, c, m, hw, k, s, p, g, opts.repeats)
            line = f"{name:36} {n:>2} {sec * 1e3:8.2f} {gf:8.1f}"
            if torch is not None:
                tsec, tgf = time_conv(n, c, m, hw, k, s, p, g, opts.repeats, torch)
                line += f"  {tsec * 1e3:8.2f} {tgf:8.1f}"
            print(line)
            if opts.threshold and g == 1 and k > 1:
                saved = conv._ACCUMULATE_MIN_CHANNELS
                for label, value in (("  per-tap GEMMs", 0), ("  stacked GEMM", 10 ** 9)):
                    conv._ACCUMULATE_MIN_CHANNELS = value
                    sec, gf = time_conv(n, c, m, hw, k, s, p, g, opts.repeats)
                    print(f"{label:36} {n:>2} {sec * 1e3:8.2f} {gf:8.1f}")
                conv._ACCUMULATE_MIN_CHANNELS = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
