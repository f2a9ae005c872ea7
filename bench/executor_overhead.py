"""Executor overhead per op: a net of N cheap ops (Relu / Scale on a tiny tensor) run by
the Executor vs the same kernels called in a plain Python loop.

Usage: python bench/executor_overhead.py [--ops 1000] [--repeats 20]
                                         [--emulate-gpu | --emulate-gpus K [--interleave]]
Prints microseconds per op for both and their difference (the executor's cost: dict
look-ups, the device check, timers, output adoption, freeing). Target: < 10 us per op.

--emulate-gpus K places the chain over K emulated GPUs with placer.rewrite.netdef: K contiguous
blocks, one per GPU (a host -> GPU copy, K - 1 GPU -> GPU copies, a GPU -> host copy), or
with --interleave op i on GPU i mod K (a GPU -> GPU copy before every op). The overhead
is then per compute op with the copies' cost included, and the copies are counted.
A benchmark prints figures; it is not a test. Median and minimum of --repeats runs.
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
from placer.ops import registry  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402


def chain(n_ops: int, device_type: int | None):
    """x -> Relu -> Scale -> Relu -> ... (each op a new blob, so freeing is exercised)."""
    net = pb.NetDef(name=f"chain{n_ops}", external_input=["b0"], external_output=[f"b{n_ops}"])
    for i in range(n_ops):
        op = net.op.add(type="Relu" if i % 2 == 0 else "Scale", input=[f"b{i}"], output=[f"b{i + 1}"])
        if i % 2:
            op.arg.add(name="scale", f=0.5)
        if device_type is not None:
            op.device_option.device_type = device_type
    return net_from_netdef(net)


def over_gpus(net, gpus: int, interleave: bool):
    """``net`` placed by placer.rewrite.netdef over ``gpus`` GPUs (device i + 1 is cuda:i)."""
    from placer.hardware.machine import compose_machine
    from placer.hardware.profiles import load_device_profile
    from placer.rewrite.netdef import place
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"),
                              load_device_profile("v100-16gb-sxm2", "gpu"), gpus=gpus, gpu_link="nvlink2")
    n = len(net.ops)
    dev = [1 + (i % gpus if interleave else i * gpus // n) for i in range(n)]
    placed = place(net, dev, machine)
    return net_from_netdef(placed.predict, placed.init)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    emulate = parser.add_mutually_exclusive_group()
    emulate.add_argument("--emulate-gpu", action="store_true")
    emulate.add_argument("--emulate-gpus", type=int, metavar="K")
    parser.add_argument("--interleave", action="store_true", help="with --emulate-gpus: op i on GPU i mod K")
    a = parser.parse_args()
    plain_net = chain(a.ops, None)
    if a.emulate_gpus:
        net, label = over_gpus(plain_net, a.emulate_gpus, a.interleave), \
            f"{a.emulate_gpus} emulated GPUs{', interleaved' if a.interleave else ''}"
        ex = Executor(net, emulate_gpus=a.emulate_gpus)
    else:
        net = chain(a.ops, 1) if a.emulate_gpu else plain_net
        label = "emulated-cuda:0" if a.emulate_gpu else "cpu"
        ex = Executor(net, emulate_gpu=a.emulate_gpu)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    kernels = [(registry.get(op.type).kernel, op.args) for op in plain_net.ops]

    def plain() -> None:
        y = x
        for kernel, args in kernels:
            y = kernel(np, [y], args)[0]

    def executor() -> None:
        ex.run({"b0": x}, iterations=1, warmup=0)

    results = {}
    for name, fn in (("plain loop", plain), ("executor", executor)):
        fn()
        samples = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        results[name] = (statistics.median(samples) / a.ops * 1e6, min(samples) / a.ops * 1e6)
        print(f"{name:>10}: {results[name][0]:7.2f} us/op median, {results[name][1]:7.2f} min "
              f"({a.ops} ops, {a.repeats} runs)")
    copies = sum(1 for o in ex.record.ops if o.links)
    if copies:
        print(f"    copies: {copies} per run ({ex.record.copy_bytes():,} B), "
              + ", ".join(f"{d} {ex.record.copy_bytes(d):,} B" for d in ("h2d", "d2d", "d2h") if ex.record.copy_bytes(d)))
    med, best = (results["executor"][k] - results["plain loop"][k] for k in (0, 1))
    print(f"overhead ({label}): {med:.2f} us/op from medians, {best:.2f} from minima "
          f"(per compute op, copies included; the minimum is the figure least disturbed by other "
          f"load; target < 10)")


if __name__ == "__main__":
    main()
