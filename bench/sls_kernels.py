"""SparseLengthsSum kernel time: placer's registry kernel against the alternatives.

Table 1,000,000 x 64 float32, batch 512 bags of 8 lookups (4096 indices), int32 and
int64 indices. Prints the median over repeats (milliseconds) of:
- placer's kernel (CSR product through scipy.sparse on numpy, with its input checks);
- gather + np.add.reduceat; np.add.at into zeros (what the kernel avoids);
- torch's embedding_bag on the CPU, one thread, when torch is installed (a reference point).
With ``--gpu`` (cupy and a visible GPU), also the kernel on cupy (gather + scatter-add
per segment) over tables of 0.1M, 1M and 10M rows, timed with CUDA events: its time
should follow the lookups, not the table.
A figure, not a test: run ``python bench/sls_kernels.py [--repeats N] [--gpu]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.ops import registry  # noqa: E402
from placer.types import Args  # noqa: E402

ROWS, DIM, BATCH, PER_BAG = 1_000_000, 64, 512, 8


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def variants(table, indices, lengths):
    kernel = registry.get("SparseLengthsSum").kernel
    args = Args(op="bench SparseLengthsSum")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])

    def add_at():
        out = np.zeros((len(lengths), table.shape[1]), table.dtype)
        np.add.at(out, np.repeat(np.arange(len(lengths)), lengths), table[indices])
        return out

    found = {
        "placer kernel (scipy CSR on numpy)": lambda: kernel(np, [table, indices, lengths], args),
        "gather + add.reduceat": lambda: np.add.reduceat(table[indices], starts, axis=0),
        "np.add.at": add_at,
    }
    try:
        import torch
        torch.set_num_threads(1)  # on a shared 2-core machine more threads only contend
        t_table, t_idx = torch.from_numpy(table), torch.from_numpy(indices.astype(np.int64))
        t_off = torch.from_numpy(starts.astype(np.int64))
        found["torch embedding_bag (reference)"] = lambda: torch.nn.functional.embedding_bag(
            t_idx, t_table, t_off, mode="sum")
    except ImportError:
        pass
    return found


def gpu_median_ms(cupy, fn, repeats: int) -> float:
    fn()  # warm-up (and kernel compilation)
    begin, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(begin, end))
    return float(np.median(times))


def gpu_figures(repeats: int) -> None:
    """The registry kernel on cupy, same lookups, tables of growing size."""
    import cupy
    if not cupy.is_available():
        raise SystemExit("--gpu: cupy sees no CUDA GPU here")
    kernel = registry.get("SparseLengthsSum").kernel
    args = Args(op="bench SparseLengthsSum (GPU)")
    rng = np.random.default_rng(1)
    lengths = cupy.asarray(np.full(BATCH, PER_BAG, np.int32))
    print(f"SparseLengthsSum on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: "
          f"{BATCH} bags x {PER_BAG} lookups, {DIM} wide, median of {repeats} (ms, CUDA events)")
    for rows in (100_000, 1_000_000, 10_000_000):
        table = cupy.asarray(rng.standard_normal((rows, DIM), dtype=np.float32))
        for index_dtype in (np.int32, np.int64):
            indices = cupy.asarray(rng.integers(0, rows, BATCH * PER_BAG).astype(index_dtype))
            want = table[indices].reshape(BATCH, PER_BAG, DIM).sum(axis=1)
            got = kernel(cupy, [table, indices, lengths], args)[0]
            assert bool(cupy.allclose(got, want, atol=1e-4)), (rows, index_dtype)
            ms = gpu_median_ms(cupy, lambda: kernel(cupy, [table, indices, lengths], args), repeats)
            print(f"  {rows:>10,d} rows  {np.dtype(index_dtype).name:5s}  {ms:8.3f}")
        del table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--gpu", action="store_true", help="also time the kernel on cupy")
    options = parser.parse_args()
    repeats = options.repeats
    rng = np.random.default_rng(0)
    table = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    lengths = np.full(BATCH, PER_BAG, np.int32)
    print(f"SparseLengthsSum: table {ROWS}x{DIM} float32, {BATCH} bags x {PER_BAG} lookups, "
          f"median of {repeats} (ms)")
    for index_dtype in (np.int32, np.int64):
        indices = rng.integers(0, ROWS, BATCH * PER_BAG).astype(index_dtype)
        reference = table[indices].reshape(BATCH, PER_BAG, DIM).sum(axis=1)
        for name, fn in variants(table, indices, lengths).items():
            result = np.asarray(fn())
            assert np.allclose(result, reference, atol=1e-4), name
            print(f"  {np.dtype(index_dtype).name:5s}  {name:36s} {median_ms(fn, repeats):8.3f}")
    if options.gpu:
        gpu_figures(repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
