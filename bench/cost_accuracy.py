"""How well the fitted CPU cost model predicts op times it has never measured.

1. Train: time every op of AlexNet and ResNet-50 (Caffe prototxt) and a DLRM-shaped
   net (built in code) at batch 8 on this machine's CPU, with the runtime's kernels.
2. Hold out: time GoogLeNet (Caffe train_val, test phase), VGG-19 (the Caffe2 predict
   net, parameter shapes from the published VGG-19 widths) and the training nets at
   other batch sizes (1 and 16).
3. Predict every held-out op from the per-family fits of the training entries only
   (``CostModel(use_measured=False)``: no measured entry is looked up), and print the
   median and 90th-percentile absolute percentage error per op family and for the
   whole-net time (the sum of its ops' times, the serial objective).

Prints figures; not a test. ``--quick`` uses fewer nets and batches. Nets whose loader
or kernels are missing are reported and skipped.

BLAS threads: 1 by default (``--blas-threads N`` to change; set before numpy loads).
On a machine shared with other work, two-thread OpenBLAS GEMMs stall whenever one
thread is descheduled: the same AlexNet conv measured 8 to 174 GFLOP/s from run to run,
while single-threaded it stays within a few percent. The benchmark measures the model,
so it wants reproducible timings; on a quiet machine use the threads the runtime uses.
For the same reason ops are timed with the process CPU time by default (``--clock
cpu``): with one BLAS thread it is the kernel's own time, without the time slices other
work on a shared machine takes (load average 6 on 2 cores made wall times 3x longer).
Use ``--clock wall --blas-threads 2`` on a quiet machine for what users see.

    python bench/cost_accuracy.py [--quick] [--repeats 5] [--budget 0.3] [--blas-threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _blas_threads_from_argv() -> str:
    argv = sys.argv
    return argv[argv.index("--blas-threads") + 1] if "--blas-threads" in argv[:-1] else "1"


if __name__ == "__main__":  # before numpy is imported, or the thread count is fixed
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _blas_threads_from_argv()

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.costs import CostModel, family_of  # noqa: E402
from placer.profiling.bench import profile_net  # noqa: E402
from placer.profiling.host import measure_host  # noqa: E402
from placer.profiling.schema import op_key  # noqa: E402
from placer.types import DATA_TYPE_TO_DTYPE, TensorType, TypedNet  # noqa: E402

NETS = ROOT.parent / "shared" / "nets"
VGG19_CONV_WIDTHS = [64, 64, 128, 128, 256, 256, 256, 256, 512, 512, 512, 512, 512, 512, 512, 512]
VGG19_FC = [(4096, 512 * 7 * 7), (4096, 4096), (1000, 4096)]


# ------------------------------------------------------------------------- nets

def caffe_net(file: str, batch: int, phase: str = "test") -> TypedNet:
    from placer.formats import load_net
    from placer.shapes import infer
    path = NETS / "caffe" / file
    net = load_net(path, phase=phase)
    shapes = {b: TensorType((batch,) + t.shape[1:], t.dtype)
              for b, t in net.input_shapes.items() if b in net.data_inputs and t.ndim >= 1}
    net = load_net(path, phase=phase, input_shapes=shapes)
    return infer(net, shapes)


def vgg19_net(batch: int) -> TypedNet:
    """The Caffe2 VGG-19 predict net; its parameter shapes follow the published widths."""
    from placer.formats import load_net
    from placer.shapes import infer
    net = load_net(NETS / "caffe2" / "vgg19_predict_net.pbtxt")
    shapes = {"data": TensorType((batch, 3, 224, 224))}
    cin, convs, fcs = 3, iter(VGG19_CONV_WIDTHS), iter(VGG19_FC)
    for op in net.ops:
        if op.type == "Conv":
            k = next(convs)
            kernel = op.args.int("kernel", 3)
            shapes[op.inputs[1]] = TensorType((k, cin, kernel, kernel))
            shapes[op.inputs[2]] = TensorType((k,))
            cin = k
        elif op.type == "FC":
            n, kk = next(fcs)
            shapes[op.inputs[1]] = TensorType((n, kk))
            shapes[op.inputs[2]] = TensorType((n,))
    return infer(net, shapes)


def dlrm_net(batch: int) -> TypedNet:
    from placer.examples import dlrm
    from placer.formats import load_net
    from placer.shapes import infer
    folder = Path(tempfile.mkdtemp(prefix="placer-bench-"))
    paths = dlrm.build(dlrm.small(max_rows=20000, batch=batch)).save(folder, "dlrm")
    info = json.loads(paths["value_info"].read_text())
    shapes = {b: TensorType(tuple(shape), DATA_TYPE_TO_DTYPE[dt]) for b, (dt, shape) in info.items()}
    return infer(load_net(paths["predict"], paths["init"]), shapes)


LOADERS = {
    "alexnet": lambda b: caffe_net("bvlc_alexnet_deploy.prototxt", b),
    "resnet50": lambda b: caffe_net("resnet50_ResNet-50-deploy.prototxt", b),
    "dlrm": dlrm_net,
    "googlenet": lambda b: caffe_net("bvlc_googlenet_train_val.prototxt", b),
    "vgg19": vgg19_net,
}
TRAIN = [("alexnet", 8), ("resnet50", 8), ("dlrm", 8)]
HELD_OUT = [("googlenet", 1), ("googlenet", 16), ("vgg19", 1), ("vgg19", 16),
            ("alexnet", 1), ("alexnet", 16), ("resnet50", 1), ("dlrm", 1), ("dlrm", 64)]
QUICK_HELD_OUT = [("googlenet", 1), ("vgg19", 1), ("alexnet", 16), ("dlrm", 64)]


# ---------------------------------------------------------------------- measuring

def measure(name: str, batch: int, args) -> tuple[TypedNet, dict] | None:
    t0 = time.perf_counter()
    try:
        typed = LOADERS[name](batch)
    except Exception as e:  # a loader or op not written yet: say so and go on
        print(f"  {name} b{batch}: cannot load ({type(e).__name__}: {str(e)[:150]})")
        return None
    result = profile_net(typed, "cpu", repeats=args.repeats, warmup=1, budget_s=args.budget,
                         progress=False, clock=args.clock)
    print(f"  {name} b{batch}: {len(typed.net.ops)} ops, {result.ops_timed} distinct timed, "
          f"{len(result.skipped)} not timed, {time.perf_counter() - t0:.1f} s")
    reasons = {}
    for why in result.skipped.values():
        reasons[why.split(':')[0] if why.startswith("kernel failed") else why] = \
            reasons.get(why.split(':')[0] if why.startswith("kernel failed") else why, 0) + 1
    if reasons:
        print(f"    not timed: {reasons}")
    return typed, result.timings


def op_rows(typed: TypedNet, timings: dict, model: CostModel) -> list[dict]:
    """Measured vs predicted for every op instance that was timed."""
    rows = []
    for op, feats in zip(typed.net.ops, typed.features):
        types = [typed.blobs.get(b) for b in op.inputs]
        if any(t is None for t in types):
            continue
        hit = timings.get(op_key(op.type, types, op.args))
        if hit is None:
            continue
        pred, source = model.op_time(op.type, types, op.args, feats, "cpu")
        rows.append({"family": family_of(op.type), "type": op.type, "shape": str(types[0]),
                     "flops": feats.flops, "bytes": feats.bytes_read + feats.bytes_written,
                     "measured": hit.median_s,
                     "predicted": pred, "source": source})
    return rows


def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def worst(rows_by_net: dict[str, list[dict]], n: int) -> None:
    rows = [dict(r, net=net) for net, rs in rows_by_net.items() for r in rs]
    rows.sort(key=lambda r: -abs(r["predicted"] - r["measured"]))
    print(f"\nlargest absolute errors (top {n})")
    for r in rows[:n]:
        print(f"  {r['net']:<14} {r['type']:<14} {r['shape']:<24} measured {r['measured'] * 1e3:9.3f} ms "
              f"predicted {r['predicted'] * 1e3:9.3f} ms  {r['flops'] / 1e9:7.3f} GFLOP {r['bytes'] / 1e6:8.2f} MB")


def summarise(rows_by_net: dict[str, list[dict]]) -> None:
    all_rows = [r for rows in rows_by_net.values() for r in rows]
    if not all_rows:
        print("no held-out ops could be timed")
        return
    print("\nper-op absolute percentage error on held-out nets (op instances)")
    print(f"{'family':<12} {'ops':>5} {'median %':>9} {'p90 %':>8} {'share of time %':>16}")
    total = sum(r["measured"] for r in all_rows)
    fams = sorted({r["family"] for r in all_rows})
    for fam in fams + ["ALL"]:
        rs = [r for r in all_rows if fam == "ALL" or r["family"] == fam]
        errs = [ape(r["predicted"], r["measured"]) for r in rs]
        share = sum(r["measured"] for r in rs) / total * 100
        print(f"{fam:<12} {len(rs):>5} {np.median(errs):>9.1f} {np.percentile(errs, 90):>8.1f} {share:>16.1f}")
    print("\nwhole-net time (sum of timed ops)")
    print(f"{'net':<16} {'measured ms':>12} {'predicted ms':>13} {'error %':>8}")
    errs = []
    for net, rows in rows_by_net.items():
        m = sum(r["measured"] for r in rows)
        p = sum(r["predicted"] for r in rows)
        errs.append(ape(p, m))
        print(f"{net:<16} {m * 1e3:>12.2f} {p * 1e3:>13.2f} {errs[-1]:>8.1f}")
    print(f"{'median':<16} {'':>12} {'':>13} {np.median(errs):>8.1f}")
    print(f"{'p90':<16} {'':>12} {'':>13} {np.percentile(errs, 90):>8.1f}")


def noise_floor(first, args) -> None:
    """Re-time a training net: how much the machine's speed drifted during the run."""
    name, batch, before = first
    got = measure(name, batch, args)
    if not got:
        return
    common = [k for k in before if k in got[1]]
    t0 = sum(before[k].median_s for k in common)
    t1 = sum(got[1][k].median_s for k in common)
    per_op = [ape(got[1][k].median_s, before[k].median_s) for k in common]
    print(f"noise floor: {name} b{batch} re-timed at the end: whole net {ape(t1, t0):.1f}% "
          f"off its first timing, per op median {np.median(per_op):.1f}% / p90 {np.percentile(per_op, 90):.1f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer held-out nets and batches")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.3, help="seconds of samples per op at most")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="op timing clock: process CPU time (default, see above) or wall time")
    p.add_argument("--detail", type=int, default=0, metavar="N", help="list the N largest errors")
    p.add_argument("--blas-threads", default="1", help="BLAS threads (default 1, see above)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    host = measure_host(clock=time.process_time if args.clock == "cpu" else time.perf_counter)
    print(f"load average {os.getloadavg()[0]:.1f}, BLAS threads {os.environ.get('OPENBLAS_NUM_THREADS')}, "
          f"clock {args.clock}")
    print(f"host: {host.source['host']}\n  {host.peak_flops['float32'] / 1e9:.0f} GFLOP/s float32 GEMM, "
          f"{host.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s streaming, "
          f"{host.launch_overhead_s * 1e6:.2f} us per kernel call")
    print("training set (batch 8):")
    first_train = None
    for name, batch in TRAIN:
        got = measure(name, batch, args)
        if got:
            host.ops.update(got[1])
            first_train = first_train or (name, batch, got[1])
    model = CostModel(host, None, use_measured=False)
    print("\nfits from the training entries:")
    print(model.fit_report("cpu").to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print("\nheld out:")
    rows_by_net = {}
    for name, batch in (QUICK_HELD_OUT if args.quick else HELD_OUT):
        got = measure(name, batch, args)
        if got:
            rows_by_net[f"{name} b{batch}"] = op_rows(got[0], got[1], model)
    if args.detail:
        worst(rows_by_net, args.detail)
    summarise(rows_by_net)
    if first_train:
        noise_floor(first_train, args)
    print(f"\ntotal bench time {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
