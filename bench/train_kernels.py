"""CPU (numpy) time of the heaviest training kernels, at the sizes a train net gives them.

- ConvGradient: X (8, 64, 56, 56), W (64, 64, 3, 3), pad 1 -> dW, db, dX;
- FCGradient: X (256, 4096), W (4096, 4096), dY (256, 4096) -> dW, db, dX;
- SparseLengthsIndicesInGradientSumGradient: dY (512, 64), 512 segments of 8, 4096 indices
  into a 1,000,000-row table -> one gradient row per index.
Prints, per kernel, the median wall time over ``--repeats`` runs (after one warm-up), in
milliseconds. A figure, not a test: ``python bench/train_kernels.py [--repeats N] [--op TYPE]``.
To compare two checkouts on a busy host, run each checkout's copy of this script in turn,
one repeat at a time, and take the medians of the interleaved runs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from placer.ops import registry  # noqa: E402
from placer.types import Args  # noqa: E402
from sls_kernels import median_ms  # noqa: E402  (one timing loop for the kernel benches)


def cases() -> dict:
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)   # noqa: E731
    lengths = np.full(512, 8, np.int32)
    return {
        "ConvGradient": ([f32(8, 64, 56, 56), f32(64, 64, 3, 3), f32(8, 64, 56, 56)],
                         Args({"kernel": 3, "pad": 1}, op="bench ConvGradient")),
        "FCGradient": ([f32(256, 4096), f32(4096, 4096), f32(256, 4096)], Args(op="bench FCGradient")),
        "SparseLengthsIndicesInGradientSumGradient": (
            [f32(512, 64), lengths, rng.integers(0, 1_000_000, 4096).astype(np.int64)],
            Args(op="bench SparseLengthsIndicesInGradientSumGradient")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--op", action="append", help="only this op type (repeatable)")
    opts = parser.parse_args()
    for op_type, (inputs, args) in cases().items():
        if opts.op and op_type not in opts.op:
            continue
        kernel = registry.get(op_type).kernel
        ms = median_ms(lambda: kernel(np, inputs, args), opts.repeats)
        print(f"{op_type:45s} {ms:10.2f} ms (median of {opts.repeats})", flush=True)


if __name__ == "__main__":
    main()
