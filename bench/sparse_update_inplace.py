"""A sparse optimizer step on a big table, out of place vs in place, through the executor.

Usage: python bench/sparse_update_inplace.py [--rows 1000000] [--dim 64] [--lookups 4096]
                                             [--op SparseAdagrad] [--repeats 10] [--emulate-gpu]

A one-op train net ``<op>([table, moment, indices, grad, lr]) -> [table, moment]`` (in place,
as Caffe2's optimizer writes it) runs in placer's Executor, whose state carries the table
from one iteration to the next. "out of place" is the same net with the op's in-place
rights withheld (``args.inplace`` empty: the kernel copies the table and its moment every
step, as every kernel did before the in-place protocol); "in place" is the executor's
normal run. Prints the median and minimum seconds per step of each. A benchmark prints
figures; it is not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.formats import caffe2_pb as pb  # noqa: E402
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402


def one_op_net(op_type: str, rows: int, dim: int, device_type: int | None):
    init = pb.NetDef(name="init")
    for name, value in (("table", 0.01), ("moment", 0.0)):
        op = init.op.add(type="ConstantFill", output=[name])
        op.arg.add(name="shape").ints.extend([rows, dim] if name == "table" or op_type == "SparseAdagrad"
                                             else [rows])
        op.arg.add(name="value").f = value
    net = pb.NetDef(name="sparse_step", external_input=["table", "moment", "indices", "grad", "lr"])
    op = net.op.add(type=op_type, input=["table", "moment", "indices", "grad", "lr"], output=["table", "moment"])
    if device_type is not None:
        op.device_option.device_type = device_type
        for fill in init.op:
            fill.device_option.device_type = device_type
    return net_from_netdef(net, init)


def time_steps(ex: Executor, feed: dict, repeats: int, rights: frozenset) -> list[float]:
    samples = []
    for _ in range(repeats):
        ex.steps[0].args.inplace = rights
        t0 = time.perf_counter()
        ex.run(feed, iterations=1, warmup=0)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--lookups", type=int, default=4096)
    parser.add_argument("--op", default="SparseAdagrad", choices=["SparseAdagrad", "RowWiseSparseAdagrad"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--emulate-gpu", action="store_true")
    a = parser.parse_args()
    rng = np.random.default_rng(0)
    feed = {"indices": rng.integers(0, a.rows, a.lookups).astype(np.int64),
            "grad": rng.standard_normal((a.lookups, a.dim)).astype(np.float32),
            "lr": np.array([-0.01], np.float32)}
    ex = Executor(one_op_net(a.op, a.rows, a.dim, 1 if a.emulate_gpu else None), emulate_gpu=a.emulate_gpu)
    ex.run_init()
    ex.run(feed, iterations=1, warmup=0)              # grants in place, first touch of the pages
    granted = ex.steps[0].args.inplace
    table_mb = a.rows * a.dim * 4 / 1e6
    print(f"{a.op}: table {a.rows} x {a.dim} float32 ({table_mb:.0f} MB), {a.lookups} lookups, "
          f"{'emulated-cuda:0' if a.emulate_gpu else 'cpu'}")
    print(f"  in-place inputs granted: {sorted(granted)}")
    for label, rights in (("out of place", frozenset()), ("in place", granted)):
        samples = time_steps(ex, feed, a.repeats, rights)
        print(f"  {label:>12}: {statistics.median(samples) * 1e3:9.2f} ms per step median, "
              f"{min(samples) * 1e3:9.2f} min ({a.repeats} steps)")


if __name__ == "__main__":
    main()
