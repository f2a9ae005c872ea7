"""Ray's cost per iteration per worker when a cluster plan runs with ``placer run --ray``.

Usage: python bench/ray_overhead.py [--iterations 30] [--warmup 3] [--cpus 2] [--threads 1]
                                    [--cluster local-2hosts]

Two plans over two simulated hosts of a local Ray instance (GPUs emulated):
- ``chain``: 2 x 20 cheap ops (Relu / Scale on 256 floats), half on each host, one tensor
  sent each way: almost all of an iteration is overhead;
- ``dlrm_small``: the small DLRM with its bottom MLP, two tables and part of the top MLP
  pinned to the second host's devices (messages of 13 KiB to 128 KiB).
For each: the median per-iteration wall time seen by the driver, each worker's time inside
its step (the executor running its net, receives waiting included) and Ray's overhead per
worker (the round trip of its one call less the time inside it), the same placed net in
one process (``one_process.pbtxt`` on the executor), and the plan's predicted step.
Every process runs BLAS on ``--threads`` threads (default 1: Ray gives its actors one, and a
multi-threaded BLAS on a loaded 2-core host was measured 7x slower than one thread).
A benchmark prints figures; it is not a test. Timings from a busy machine say so.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from placer.hardware.cluster import load_cluster  # noqa: E402
from placer.planning.cluster_plan import plan_cluster  # noqa: E402
from placer.commands.plan import _profiles  # noqa: E402
from placer.formats import caffe2_pb as pb, load_net  # noqa: E402
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.rewrite.manifest import read_manifest, write_plan_dir  # noqa: E402
from placer.planning.planner import PlanOptions  # noqa: E402
from placer.planning.view import plan_json  # noqa: E402
from placer.runtime.ray.driver import run_on_ray  # noqa: E402
from placer.commands.run_ray import one_process_inputs  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402
from placer.shapes import infer  # noqa: E402
from placer.types import TensorType  # noqa: E402
from placer.units import fmt_time  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "placer" / "examples" / "data"


def chain_net(n_ops: int = 40, size: int = 256):
    net = pb.NetDef(name="chain", external_input=["b0"], external_output=[f"b{n_ops}"])
    for i in range(n_ops):
        op = net.op.add(type="Relu" if i % 2 == 0 else "Scale", input=[f"b{i}"], output=[f"b{i + 1}"], name=f"op{i}")
        if i % 2:
            op.arg.add(name="scale", f=0.5)
    out = net_from_netdef(net)
    out.input_shapes["b0"] = TensorType((size,), "float32")
    return out, (f"op{i}=h1/cpu" for i in range(n_ops // 4, 3 * n_ops // 4))


def dlrm_net():
    pins = ("bot*=h1/cuda:1", "emb:::sls1_*=h1/cpu", "emb:::sls2_*=h1/cpu", "top:::fc1*=h1/cuda:0")
    return load_net(EXAMPLES / "dlrm_small.pbtxt"), pins


def one_process_s(outdir: Path, inputs: dict, iterations: int, warmup: int) -> float:
    m = read_manifest(outdir)
    ex = Executor(load_net(outdir / m["one_process_net"]), emulate_gpus=m["one_process_gpus"] or None)
    ex.run(inputs, iterations=1, warmup=warmup)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        ex.run(inputs, iterations=1, warmup=0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, net, pins, cluster: str, tmp: Path, iterations: int, warmup: int, threads: int) -> list[str]:
    typed = infer(net, {})
    result = plan_cluster(typed, load_cluster(cluster), PlanOptions(pins=tuple(pins), time_limit_s=2.0))
    out = tmp / name
    write_plan_dir(out, result, plan_json(result, _profiles(result.machine)))
    m = read_manifest(out)
    inputs = one_process_inputs(out, m, None, 0)
    run = run_on_ray(out, inputs=inputs, iterations=iterations, warmup=warmup, emulate=True, threads=threads)
    wall = statistics.median(run.iteration_s)
    single = one_process_s(out, inputs, iterations, warmup)
    rows = [f"{name}: {len(m['messages'])} messages, {sum(x['nbytes'] for x in m['messages']):,} bytes per iteration; "
            f"predicted step {fmt_time(m['predicted']['serial_s'])} serial, {fmt_time(m['predicted']['makespan_s'])} "
            f"overlapped",
            f"  Ray: {fmt_time(wall)} per iteration (median of {iterations}); one process: {fmt_time(single)}; "
            f"difference {fmt_time(wall - single)}"]
    for h in run.records:
        rows.append(f"  worker {h}: {fmt_time(run.busy_s[h])} inside its step, Ray overhead "
                    f"{fmt_time(run.call_overhead_s[h])} per iteration (its one call's round trip less that)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cluster", default="local-2hosts")
    args = ap.parse_args()
    import os

    from placer.runtime.threads import set_blas_threads
    set_blas_threads(args.threads)

    import ray
    hosts = list(load_cluster(args.cluster).hosts)
    t0 = time.perf_counter()
    ray.init(num_cpus=args.cpus, resources={f"placer_host_{h}": 100 for h in hosts}, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    print(f"ray {ray.__version__}: local instance with {args.cpus} CPUs started in {time.perf_counter() - t0:.1f} s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (net, pins) in (("chain", chain_net()), ("dlrm_small", dlrm_net())):
            print("\n".join(measure(name, net, pins, args.cluster, Path(tmp), args.iterations, args.warmup,
                                     args.threads)))
    ray.shutdown()


if __name__ == "__main__":
    main()
