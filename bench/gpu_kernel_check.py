"""Convolution and GEMM kernels timed on this machine's GPU against the GPU cost model.

Usage: python bench/gpu_kernel_check.py [--gpu-profile h200-141gb-pcie5] [--repeat 10]
                                        [--warmup 3] [--csv OUT.csv] [--dry-run]

The GPU cost model describes a cuDNN / cuBLAS executor; this script checks it against
placer's own GPU kernels, which run convolutions through cuDNN where cupy has it
(placer/ops/cudnn_conv.py) and GEMMs through cupy's matmul (cuBLAS). The shapes are a
fixed DeepBench-style list (``SHAPES``):

- ResNet-50 v1.5 convolutions at batch 32, NCHW float32 (conv1 7x7/2; 3x3 and 1x1 of
  each stage, the stride-2 3x3 of res3), each in three directions, built as
  bench/gpu_published.py builds DeepBench's rows: forward ``Conv(X, W)``; backward data
  ``ConvTranspose(dY, W)`` with adj making dX the forward input's size (cuDNN's backward
  data convolution); backward filter ``ConvGradient(X, W, dY)`` with ``no_bias=1`` and
  ``no_gradient_to_input=1`` (dW only).
- square GEMMs ``MatMul(A, B)``, M = N = K from 512 to 8192, float32 and float16.

Each row is a one-op net made with ``NetBuilder`` and typed by ``placer.shapes.infer``;
the model column is ``CostModel(devices=[cpu, gpu]).op_time(op_type, inputs, args,
features, "gpu")[0]`` with the shipped profile ``--gpu-profile`` (and the default host
profile), the price ``placer plan`` gives the op. The measured column is the median of
``--repeat`` runs of the op's registered kernel on cupy arrays, each bracketed by CUDA
events on the current stream, after ``--warmup`` untimed runs (the first builds cuDNN
plans and compiles cupy kernels). ``engine`` says what ran the convolution (cudnn, or
matmul with the reason). Output: one row per shape (measured, model, ratio = model /
measured), then per family and overall the count, median and 90th percentile of
|ratio - 1| and the median ratio.

Without a GPU it exits 2 with one line; ``--dry-run`` builds and prices every row without
timing anything (no GPU needed) and prints the model column.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.costs.model import CostModel  # noqa: E402
from placer.examples.builder import NetBuilder  # noqa: E402
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.hardware.profiles import DEFAULT_CPU_PROFILE, load_device_profile, shipped_profile_names  # noqa: E402
from placer.ops import cudnn_conv, registry  # noqa: E402
from placer.shapes import infer  # noqa: E402
from placer.types import Args, TensorType  # noqa: E402

DEFAULT_GPU_PROFILE = "h200-141gb-pcie5"
BATCH = 32
# ResNet-50 v1.5 layers: name, C, K, H (= W), kernel, stride, pad (torchvision's resnet50;
# v1.5 puts the stride 2 of a downsampling block on its 3x3 conv).
RESNET50_CONVS = [
    ("conv1", 3, 64, 224, 7, 2, 3),
    ("res2_3x3", 64, 64, 56, 3, 1, 1),
    ("res2_1x1_expand", 64, 256, 56, 1, 1, 0),
    ("res3_3x3_s2", 128, 128, 56, 3, 2, 1),
    ("res4_3x3", 256, 256, 14, 3, 1, 1),
    ("res4_1x1_reduce", 1024, 256, 14, 1, 1, 0),
    ("res5_3x3", 512, 512, 7, 3, 1, 1),
    ("res5_1x1_expand", 512, 2048, 7, 1, 1, 0),
]
GEMM_SIZES = (512, 1024, 2048, 4096, 8192)
GEMM_DTYPES = ("float32", "float16")
DIRECTIONS = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")


@dataclass(frozen=True)
class Shape:
    """One row: a family (conv_fwd, conv_bwd_data, conv_bwd_filter, gemm) and its sizes."""

    family: str
    name: str
    dims: tuple          # conv: (N, C, K, H, kernel, stride, pad); gemm: (M, N, K)
    dtype: str = "float32"

    @property
    def label(self) -> str:
        if self.family == "gemm":
            return f"gemm {'x'.join(map(str, self.dims))} {self.dtype}"
        return f"{self.family} {self.name} b{self.dims[0]} {self.dtype}"


SHAPES = ([Shape(d, name, (BATCH, c, k, h, r, s, p)) for name, c, k, h, r, s, p in RESNET50_CONVS
           for d in DIRECTIONS]
          + [Shape("gemm", f"{n}", (n, n, n), dt) for dt in GEMM_DTYPES for n in GEMM_SIZES])


def build_net(shape: Shape) -> NetBuilder:
    """The one-op net of a row (module docstring), every operand an external input."""
    b = NetBuilder(shape.label.replace(" ", "_"))
    dt = shape.dtype
    if shape.family == "gemm":
        m, n, k = shape.dims
        b.input("A", (m, k), dt)
        b.input("B", (k, n), dt)
        b.output(b.op("MatMul", ["A", "B"], "Y"))
        return b
    n, c, k, h, r, s, p = shape.dims
    out = (h + 2 * p - r) // s + 1
    window = dict(kernel=r, stride=s, pad=p, order="NCHW")
    x, w, dy = (n, c, h, h), (k, c, r, r), (n, k, out, out)
    if shape.family == "conv_fwd":
        b.input("X", x, dt)
        b.input("W", w, dt)
        b.output(b.op("Conv", ["X", "W"], "Y", **window))
    elif shape.family == "conv_bwd_filter":
        for name, dims in (("X", x), ("W", w), ("dY", dy)):
            b.input(name, dims, dt)
        b.output(b.op("ConvGradient", ["X", "W", "dY"], "dW", no_bias=1, no_gradient_to_input=1, **window))
    else:   # ConvTranspose(dY, W) -> dX of the forward input's size
        adj = h - ((out - 1) * s + r - 2 * p)
        b.input("dY", dy, dt)
        b.input("W", w, dt)
        b.output(b.op("ConvTranspose", ["dY", "W"], "dX", adj=adj, **window))
    return b


def typed_one_op(b: NetBuilder):
    """(the op, its input types, its features) from shape inference on the builder's net."""
    net = net_from_netdef(b.predict)
    shapes = {name: TensorType(tuple(dims), dtype) for name, (dtype, dims) in b.value_info.items()}
    typed = infer(net, shapes)
    return net.ops[0], list(typed.op_inputs[0]), typed.features[0]


@dataclass
class Row:
    shape: Shape
    op_type: str
    model_s: float
    source: str
    measured_s: float | None = None
    engine: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.measured_s else self.model_s / self.measured_s


def price(shapes, gpu_profile: str) -> list[Row]:
    model = CostModel(devices=[load_device_profile(DEFAULT_CPU_PROFILE, "cpu"),
                               load_device_profile(gpu_profile, "gpu")])
    rows = []
    for shape in shapes:
        op, inputs, feats = typed_one_op(build_net(shape))
        seconds, source = model.op_time(op.type, inputs, op.args, feats, "gpu")
        rows.append(Row(shape, op.type, seconds, source))
    return rows


def time_row(cupy, row: Row, warmup: int, repeat: int) -> None:
    """The median of ``repeat`` event-timed runs of the op's kernel, after ``warmup``."""
    op, inputs, _ = typed_one_op(build_net(row.shape))
    rng = cupy.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape, dtype=np.float32).astype(t.dtype) for t in inputs]
    args = Args(dict(op.args), op=op.label, n_outputs=len(op.outputs))
    kernel = registry.get(op.type).kernel
    for _ in range(warmup):
        kernel(cupy, arrays, args)
    stream = cupy.cuda.get_current_stream()
    times = []
    for _ in range(repeat):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        kernel(cupy, arrays, args)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    row.measured_s = float(np.median(times))
    engine, why = cudnn_conv.conv_engines().get(op.label, ("", ""))
    row.engine = f"{engine} ({why})" if why else engine or "cupy matmul"


def quantile(values, q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default)."""
    return float(np.quantile(np.asarray(values, dtype=float), q))


def summary(rows: list[Row]) -> list[tuple[str, int, float, float, float]]:
    """(group, count, median |ratio - 1|, p90 |ratio - 1|, median ratio) per family and overall."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.ratio is None:
            continue
        key = r.shape.family if r.shape.family != "gemm" else f"gemm {r.shape.dtype}"
        groups.setdefault(key, []).append(r.ratio)
        groups.setdefault("all", []).append(r.ratio)
    return [(g, len(v), quantile([abs(x - 1) for x in v], 0.5), quantile([abs(x - 1) for x in v], 0.9),
             quantile(v, 0.5)) for g, v in groups.items()]


def table(rows: list[Row], gpu_profile: str, dry_run: bool) -> list[str]:
    head = f"{'shape':<44} {'op':<14} {'measured_us':>12} {'model_us':>10} {'ratio':>7}  {'source':<9} engine"
    lines = [f"model: CostModel.op_time(..., 'gpu') with profile {gpu_profile}"
             + ("; --dry-run: nothing timed" if dry_run else ""), head]
    for r in rows:
        measured = "-" if r.measured_s is None else f"{r.measured_s * 1e6:.1f}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(f"{r.shape.label:<44} {r.op_type:<14} {measured:>12} {r.model_s * 1e6:>10.1f} {ratio:>7}  "
                     f"{r.source:<9} {r.engine}")
    stats = summary(rows)
    if stats:
        lines.append(f"{'group':<22} {'n':>3} {'median|err|':>12} {'p90|err|':>9} {'median ratio':>13}")
        lines += [f"{g:<22} {n:>3} {med:>12.3f} {p90:>9.3f} {ratio:>13.3f}" for g, n, med, p90, ratio in stats]
    return lines


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["family", "shape", "dtype", "op", "measured_us", "model_us", "ratio", "source", "engine"])
        for r in rows:
            out.writerow([r.shape.family, r.shape.label, r.shape.dtype, r.op_type,
                          "" if r.measured_s is None else f"{r.measured_s * 1e6:.3f}", f"{r.model_s * 1e6:.3f}",
                          "" if r.ratio is None else f"{r.ratio:.6f}", r.source, r.engine])


def gpu_or_reason():
    """(cupy, "") with a visible GPU, else (None, why not)."""
    try:
        import cupy
    except ImportError as e:
        return None, f"cupy does not import ({e})"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy, ""
    except Exception as e:   # cupy's CUDARuntimeError when there is no driver or device
        return None, f"no CUDA GPU visible ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    return None, "no CUDA GPU visible"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-profile", default=DEFAULT_GPU_PROFILE,
                        help=f"shipped GPU profile (default {DEFAULT_GPU_PROFILE}; one of "
                             f"{', '.join(n for n in shipped_profile_names() if n != DEFAULT_CPU_PROFILE)})")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per shape (median; default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--csv", metavar="OUT.csv", help="write every row here")
    parser.add_argument("--dry-run", action="store_true", help="no timing: build and price every row")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        print("gpu_kernel_check: --repeat must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    if args.gpu_profile not in shipped_profile_names():
        print(f"gpu_kernel_check: no shipped profile {args.gpu_profile!r}", file=sys.stderr)
        return 2
    cupy = None
    if not args.dry_run:
        cupy, why = gpu_or_reason()
        if cupy is None:
            print(f"gpu_kernel_check: {why}; --dry-run prints the model column without a GPU", file=sys.stderr)
            return 2
    rows = price(SHAPES, args.gpu_profile)
    if cupy is not None:
        for row in rows:
            time_row(cupy, row, args.warmup, args.repeat)
            cupy.get_default_memory_pool().free_all_blocks()
    print("\n".join(table(rows, args.gpu_profile, args.dry_run)))
    if args.csv:
        write_csv(rows, args.csv)
    bad = [r.shape.label for r in rows if not math.isfinite(r.model_s) or r.model_s <= 0]
    if bad:
        print(f"gpu_kernel_check: the model gave no time for {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
