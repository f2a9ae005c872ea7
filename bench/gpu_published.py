"""placer's GPU cost model against published per-kernel GPU times (DeepBench) and whole-network throughputs.

Usage: python bench/gpu_published.py [--reference DIR] [--csv OUT.csv] [--worst 3]
                                     [--v100-profile v100-16gb-sxm2] [--check-plan 5]
       python bench/gpu_published.py --networks

Reference: the DeepBench GEMM and convolution results on V100, T4 and P100 as CSV, in
``../shared/gpu-reference`` beside the checkout (its README.md documents the columns), or
``--reference DIR``. Without that folder the script exits 2 with one line. Measurement
only: nothing here changes the cost model (``bench/fit_gpu_kernels.py`` fits its constants
on the same rows).

Each kernel row becomes the one-op Caffe2 net it describes, built with placer's own
``NetBuilder`` (every operand an external input whose shape and dtype go to value_info):

- GEMM: ``MatMul(A, B)`` with ``trans_a`` / ``trans_b`` from the row's transposes, A
  (M, K) or (K, M) with trans_a, B (K, N) or (N, K) with trans_b: Y (M, N).
- conv forward: ``Conv(X, W)`` NCHW, X (N, C, H, W), W (K, C, R, S), pads pad_h/pad_w on
  both sides, strides stride_h/stride_w, no bias (DeepBench times cuDNN's convolution
  without one).
- conv backward_filter: ``ConvGradient(X, W, dY)`` with ``no_bias=1`` and
  ``no_gradient_to_input=1``: the op then makes dW only, the product DeepBench times.
- conv backward_data: the registry has no op that makes dX alone (ConvGradient always
  makes dW), so these rows are priced as ``ConvTranspose(dY, W) -> dX`` with W (K, C, R,
  S) read as ConvTranspose's (input channels, output channels, kH, kW), the same pads
  and strides, and ``adj_h``/``adj_w`` so that dX is (N, C, H, W). Its MACs equal the
  forward's, and a cuDNN ConvTranspose is cudnnConvolutionBackwardData (Caffe2's
  CudnnConvTransposeOp); the summary lists them as ``conv_bwd_data``.

Dtypes: fp32 rows float32, fp16_mixed rows float16 (tensor cores), fp16_pseudo rows (P100:
fp16 operands, fp32 math) float16 on a profile whose only peak is float32's, int8 rows
int8. The P100 all-reduce file (a collective, not a kernel) is not read.

Profiles: V100 rows on ``v100-16gb-sxm2`` (the DeepBench sheets name a DGX-1, i.e. SXM2;
``--v100-profile v100-16gb-pcie3`` for the PCIe part), T4 rows on ``t4-pcie3``, P100 rows
on ``p100-16gb-pcie3``, each paired with the default host profile. Pricing goes straight
through ``CostModel.op_time(..., "gpu")``, the call ``annotate`` makes for every op of a
plan: shape inference (``placer.shapes.infer``) gives the op's input types and features.
The shipped GPU profiles carry a ``kernel_model``, so every row is priced by the GPU
kernel model (source ``kernel-model``; ``CostModel.op_kernel`` says which cuDNN algorithm
or cuBLAS GEMM it assumed); a profile without one falls back to the datasheet roofline.

Check against ``placer plan`` (``--check-plan N``): N priced rows spread over the
families are saved as one-op nets (``NetBuilder.save``: pbtxt + value_info.json) and
run through ``python cli.py plan NET --gpu-profile P --json --stability-draws 0`` in a
subprocess; the op's ``gpu_s`` in the plan JSON must equal the direct price (relative
difference under 1e-9), else the script exits 1.

Output: per row the published time, the prediction, ratio = predicted / published and
what priced it (``--summary-only`` leaves the rows out); per (GPU, kernel family,
precision) the count, median and 90th percentile of |ratio - 1|, the median ratio, the
algorithms that priced its rows, and the worst rows (ranked by the factor off, max(r,
1/r)); the model's forward algorithm against the one cuDNN recorded (``fwd_algo``); the
rows not priced and why; the wall time from the script's first import. ``--csv OUT``
writes every row, priced or not.

Whole networks (``--networks``, instead of the kernel rows; no reference folder needed):
NVIDIA DeepLearningExamples' published ResNet-50 v1.5 (PyTorch) throughputs, as recorded
with their sources in ``bench/data/published_resnet50.csv`` (README tables; the training
rows' per-GPU batch from configs.yml). The net is ResNet-50 v1.5 at 224x224 built here
with ``NetBuilder`` (bottleneck blocks, stride 2 on the 3x3 conv; 53 convs, 25.6 M
parameters, 4.1 GMACs per image). Inference rows price the predict net; training rows
the train step ``make_train_nets`` makes (SpatialBN in training mode, SoftmaxWithLoss,
Caffe2's gradient ops, MomentumSGDUpdate), as ``placer train-net`` does. The step's
seconds are the sum of ``CostModel.op_time(..., "gpu")`` over its ops: every op on the
GPU, no host copies, no overlap, under the row's math mode as ``placer plan --precision``
prices it (FP32 ``fp32``, TF32 ``tf32``, AMP ``amp``). Predicted img/s = GPUs x batch per
GPU / step seconds; the 8-GPU rows use the one-GPU step (data parallel at the per-GPU
batch): no all-reduce is added. Approximations: the A100 rows were published on A100
80GB, priced on the shipped ``a100-40gb-sxm4``; V100 rows on ``v100-16gb-sxm2`` (DGX-1), T4 on
``t4-pcie3``. Output: per row published and predicted img/s and their ratio; per group
(inference FP32 batch>=32, training FP32, TF32, AMP, batch 1) the median and worst of
exp|ln(ratio)|, the factor off either way.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_START = time.perf_counter()   # the wall time printed at the end counts placer's imports too
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.costs.model import CostModel, family_of  # noqa: E402
from placer.examples import train_nets as train_examples  # noqa: E402
from placer.examples.builder import NetBuilder  # noqa: E402
from placer.examples.resnet import _conv_bn as conv_bn  # noqa: E402  (the bundled ResNet's conv/BN/Relu unit)
from placer.formats.caffe2 import net_from_netdef  # noqa: E402
from placer.hardware.constants import default_efficiency  # noqa: E402
from placer.hardware.profiles import DEFAULT_CPU_PROFILE, load_device_profile  # noqa: E402
from placer.ops import registry  # noqa: E402
from placer.shapes import infer  # noqa: E402
from placer.types import TensorType  # noqa: E402

DEFAULT_REFERENCE = ROOT.parent / "shared" / "gpu-reference"
GPU_PROFILES = {"NVIDIA V100": "v100-16gb-sxm2", "NVIDIA T4": "t4-pcie3", "NVIDIA Tesla P100": "p100-16gb-pcie3"}
# fp16_pseudo (P100): float16 operands, float32 math: float16 tensors on a profile whose only
# peak is float32's
PRECISION_DTYPES = {"fp32": "float32", "fp16_mixed": "float16", "fp16_pseudo": "float16", "int8": "int8"}
CONV_FAMILIES = {"forward": "conv_fwd", "backward_data": "conv_bwd_data", "backward_filter": "conv_bwd_filter"}
GPU_SHORT = {"NVIDIA V100": "V100", "NVIDIA T4": "T4", "NVIDIA Tesla P100": "P100"}
CSV_COLUMNS = ["file", "source_row", "gpu", "suite", "precision", "family", "shape", "note", "dtype",
               "profile", "op", "published_us", "predicted_us", "ratio", "abs_error", "source", "bound", "launches",
               "not_priced"]


@dataclass
class KernelRow:
    """One published kernel time: the file and Excel row it comes from, what it computes."""

    file: str
    source_row: int
    gpu: str
    suite: str
    precision: str
    family: str           # gemm, conv_fwd, conv_bwd_data, conv_bwd_filter
    dims: dict            # gemm: M N K a_t b_t; conv: N C H W K R S pad_h pad_w stride_h stride_w
    time_us: float
    note: str = ""
    fwd_algo: str = ""    # cuDNN's forward algorithm as the sheet records it (train forward rows)

    @property
    def shape(self) -> str:
        d = self.dims
        if self.family == "gemm":
            return f"M={d['M']} N={d['N']} K={d['K']} {'T' if d['a_t'] else 'N'}{'T' if d['b_t'] else 'N'}"
        return (f"N={d['N']} C={d['C']} H={d['H']} W={d['W']} K={d['K']} R={d['R']} S={d['S']} "
                f"pad={d['pad_h']},{d['pad_w']} stride={d['stride_h']},{d['stride_w']}")


@dataclass
class Priced:
    """A row and what placer says of it (predicted_us None with the reason when not priced)."""

    row: KernelRow
    dtype: str = ""
    profile: str = ""
    op: str = ""
    predicted_us: float | None = None
    source: str = ""
    bound: str = ""       # what priced it: the kernel model's note, or the roofline's largest term
    launches: int = 0     # GPU kernel launches the roofline's overhead charges
    not_priced: str = ""
    net: NetBuilder | None = field(default=None, repr=False)

    @property
    def ratio(self) -> float | None:
        return None if self.predicted_us is None else self.predicted_us / self.row.time_us

    @property
    def abs_error(self) -> float | None:
        return None if self.ratio is None else abs(self.ratio - 1.0)


# ------------------------------------------------------------------ reading

def read_rows(folder: Path) -> list[KernelRow]:
    """Every GEMM and conv row of the reference CSVs (all-reduce files are not kernels)."""
    rows: list[KernelRow] = []
    for path in sorted(folder.glob("deepbench_*.csv")):
        kind = path.stem.rsplit("_", 1)[-1]
        if kind not in ("gemm", "conv"):
            continue
        with path.open(newline="") as f:
            for rec in csv.DictReader(f):
                rows.append(parse_row(path.name, kind, rec))
    return rows


def parse_row(file: str, kind: str, rec: dict) -> KernelRow:
    if kind == "gemm":
        dims = {"M": int(rec["M"]), "N": int(rec["N"]), "K": int(rec["K"]),
                "a_t": rec["a_transpose"] == "T", "b_t": rec["b_transpose"] == "T"}
        family = "gemm"
    else:
        dims = {k: int(rec[k]) for k in ("N", "C", "H", "W", "K", "R", "S", "pad_h", "pad_w",
                                         "stride_h", "stride_w", "out_h", "out_w")}
        family = CONV_FAMILIES[rec["pass"]]
    return KernelRow(file=file, source_row=int(rec["source_row"]), gpu=rec["gpu"], suite=rec["suite"],
                     precision=rec["precision"], family=family, dims=dims, time_us=float(rec["time_us"]),
                     note=rec.get("note", "") or "", fwd_algo=rec.get("fwd_algo", "") or "")


# ------------------------------------------------------------------ nets

def build_net(row: KernelRow, dtype: str) -> tuple[NetBuilder, str]:
    """The one-op net a row describes (module docstring), and its op type."""
    d = row.dims
    b = NetBuilder(f"{row.family}_{Path(row.file).stem}_{row.source_row}")
    if row.family == "gemm":
        m, n, k = d["M"], d["N"], d["K"]
        b.input("A", (k, m) if d["a_t"] else (m, k), dtype)
        b.input("B", (n, k) if d["b_t"] else (k, n), dtype)
        b.output(b.op("MatMul", ["A", "B"], "Y", trans_a=int(d["a_t"]), trans_b=int(d["b_t"])))
        return b, "MatMul"
    window = dict(kernel_h=d["R"], kernel_w=d["S"], stride_h=d["stride_h"], stride_w=d["stride_w"],
                  pad_t=d["pad_h"], pad_b=d["pad_h"], pad_l=d["pad_w"], pad_r=d["pad_w"], order="NCHW")
    x, w = (d["N"], d["C"], d["H"], d["W"]), (d["K"], d["C"], d["R"], d["S"])
    dy = (d["N"], d["K"], d["out_h"], d["out_w"])
    if row.family == "conv_fwd":
        b.input("X", x, dtype)
        b.input("W", w, dtype)
        b.output(b.op("Conv", ["X", "W"], "Y", **window))
        return b, "Conv"
    if row.family == "conv_bwd_filter":
        b.input("X", x, dtype)
        b.input("W", w, dtype)
        b.input("dY", dy, dtype)
        b.output(b.op("ConvGradient", ["X", "W", "dY"], "dW", no_bias=1, no_gradient_to_input=1, **window))
        return b, "ConvGradient"
    # backward_data: ConvTranspose(dY, W) -> dX, adj making dX's size the forward input's
    adj_h = d["H"] - ((d["out_h"] - 1) * d["stride_h"] + d["R"] - 2 * d["pad_h"])
    adj_w = d["W"] - ((d["out_w"] - 1) * d["stride_w"] + d["S"] - 2 * d["pad_w"])
    b.input("dY", dy, dtype)
    b.input("W", w, dtype)
    b.output(b.op("ConvTranspose", ["dY", "W"], "dX", adj_h=adj_h, adj_w=adj_w, **window))
    return b, "ConvTranspose"


def typed_one_op(b: NetBuilder):
    """(net, typed net) of a builder's predict net, its inputs typed from value_info."""
    net = net_from_netdef(b.predict)
    shapes = {name: TensorType(tuple(shape), dtype) for name, (dtype, shape) in b.value_info.items()}
    return net, infer(net, shapes)


# ------------------------------------------------------------------ pricing

def not_priced_reason(row: KernelRow, profiles: dict[str, str]) -> str:
    """Why a row is not priced, or "" when it is."""
    if row.gpu not in profiles:
        return f"no shipped profile for {row.gpu}"
    if row.precision not in PRECISION_DTYPES:
        return f"precision {row.precision} has no dtype here"
    return ""


class Pricer:
    """One ``CostModel`` per GPU profile (the default host beside it), as ``placer plan``
    builds for ``--gpu-profile P``."""

    def __init__(self, profiles: dict[str, str]):
        self.profiles = profiles
        host = load_device_profile(DEFAULT_CPU_PROFILE, "cpu")
        self.models = {name: CostModel(host, load_device_profile(name, "gpu"))
                       for name in sorted(set(profiles.values()))}

    def price(self, row: KernelRow, keep_net: bool = False) -> Priced:
        reason = not_priced_reason(row, self.profiles)
        if reason:
            return Priced(row, not_priced=reason)
        dtype, profile = PRECISION_DTYPES[row.precision], self.profiles[row.gpu]
        b, op_type = build_net(row, dtype)
        net, typed = typed_one_op(b)
        op, inputs, feats = net.ops[0], list(typed.op_inputs[0]), typed.features[0]
        model = self.models[profile]
        seconds, source = model.op_time(op.type, inputs, op.args, feats, "gpu")
        if source == "roofline":
            bound, launches = roofline_bound(model, op.type, inputs, op.args, feats)
        else:
            bound, launches = model.op_kernel(op.type, inputs, op.args, feats, "gpu"), 0
        return Priced(row, dtype=dtype, profile=profile, op=op_type, predicted_us=seconds * 1e6, source=source,
                      bound=bound, launches=launches, net=b if keep_net else None)


def roofline_bound(model: CostModel, op_type: str, inputs, args, feats) -> tuple[str, int]:
    """(the largest term of the datasheet roofline: "overhead", "compute" or "memory";
    the kernel launches the overhead charges), from the pieces ``CostModel.op_time`` adds."""
    prof = model.profile("gpu")
    launches = registry.get(op_type).launch_count(inputs, args)
    eff_c, eff_m = default_efficiency(family_of(op_type), "gpu")
    terms = {"overhead": launches * prof.launch_overhead_s,
             "compute": feats.flops / (prof.peak(inputs[0].dtype) * eff_c),
             "memory": (feats.bytes_read + feats.bytes_written) / (prof.memory_bandwidth_bytes_per_s * eff_m)}
    return max(terms, key=terms.get), launches


def price_all(rows: list[KernelRow], profiles: dict[str, str]) -> list[Priced]:
    pricer = Pricer(profiles)
    return [pricer.price(r) for r in rows]


# ------------------------------------------------------------------ summary

def factor_off(ratio: float) -> float:
    return max(ratio, 1.0 / ratio)


def summarize(results: list[Priced], worst: int = 3) -> list[dict]:
    """One entry per (GPU, family, precision) of the priced rows."""
    groups: dict[tuple, list[Priced]] = {}
    for p in results:
        if p.predicted_us is not None:
            groups.setdefault((p.row.gpu, p.row.family, p.row.precision), []).append(p)
    out = []
    for (gpu, fam, prec), items in sorted(groups.items()):
        ratios = np.array([p.ratio for p in items])
        errors = np.abs(ratios - 1.0)
        kernels: dict[str, int] = {}
        for p in items:
            name = kernel_name(p)
            kernels[name] = kernels.get(name, 0) + 1
        out.append({"gpu": gpu, "family": fam, "precision": prec, "count": len(items),
                    "median_abs_error": float(np.median(errors)), "p90_abs_error": float(np.percentile(errors, 90)),
                    "median_ratio": float(np.median(ratios)),
                    "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
                    "profile": items[0].profile, "op": items[0].op,
                    "worst": sorted(items, key=lambda p: -factor_off(p.ratio))[:worst]})
    return out


def kernel_name(p: Priced) -> str:
    """What priced a row, short: the cuDNN algorithm ("winograd"), "GEMM", or the roofline's
    largest term for a profile without a kernel model."""
    if p.source != "kernel-model":
        return f"roofline {p.bound}"
    note = p.bound.split(" (")[0]
    for pass_ in ("forward ", "backward-data ", "backward-filter "):
        if pass_ in note:
            return note.split(pass_, 1)[1]
    return note.replace("cuBLAS ", "").replace(" x1", "")


# cuDNN's forward algorithm names (cudnnConvolutionFwdAlgo_t, as the sheets write them) -> the
# kernel model's algorithm family
CUDNN_FAMILIES = {"IMPLICIT_GEMM": "implicit gemm", "IMPLICIT_PRECOMP_GEMM": "implicit gemm",
                  "LICIT_PRECOMP_GEMM": "implicit gemm", "GEMM": "implicit gemm", "WINOGRAD": "winograd",
                  "WINOGRAD_NONFUSED": "winograd", "FFT": "fft", "FFT_TILING": "fft", "DIRECT": "direct"}


def algorithm_agreement(results: list[Priced]) -> list[tuple[str, str, int, int, dict]]:
    """(GPU, precision, rows agreeing, rows, {recorded -> modelled: count} of the others):
    the kernel model's forward algorithm against the one cuDNN's heuristics chose for
    DeepBench (the model's 1x1 "gemm" counts as cuDNN's implicit GEMM: the same product)."""
    groups: dict[tuple[str, str], list[Priced]] = {}
    for p in results:
        if p.predicted_us is not None and p.row.family == "conv_fwd" and p.row.fwd_algo and p.source == "kernel-model":
            groups.setdefault((p.row.gpu, p.row.precision), []).append(p)
    out = []
    for (gpu, prec), items in sorted(groups.items()):
        agree, misses = 0, {}
        for p in items:
            recorded = CUDNN_FAMILIES.get(p.row.fwd_algo, p.row.fwd_algo.lower())
            modelled = kernel_name(p).replace("gemm", "implicit gemm") if kernel_name(p) == "gemm" else kernel_name(p)
            if recorded == modelled:
                agree += 1
            else:
                key = f"{p.row.fwd_algo} -> {modelled}"
                misses[key] = misses.get(key, 0) + 1
        out.append((gpu, prec, agree, len(items), misses))
    return out


def skipped_summary(results: list[Priced]) -> list[tuple[str, str, int]]:
    """(file, reason, rows) of the rows not priced."""
    counts: dict[tuple[str, str], int] = {}
    for p in results:
        if p.not_priced:
            key = (p.row.file, p.not_priced)
            counts[key] = counts.get(key, 0) + 1
    return [(f, r, n) for (f, r), n in sorted(counts.items())]


def summary_markdown(summary: list[dict]) -> str:
    lines = ["| GPU | kernel family | precision | rows | median \\|error\\| | p90 \\|error\\| | median pred/pub "
             "| priced as (rows) |", "|---|---|---|---:|---:|---:|---:|---|"]
    for s in summary:
        terms = ", ".join(f"{k} {n}" for k, n in s["kernels"].items())
        lines.append(f"| {GPU_SHORT.get(s['gpu'], s['gpu'])} ({s['profile']}) | {s['family']} ({s['op']}) "
                     f"| {s['precision']} | {s['count']} | {s['median_abs_error']:.0%} | {s['p90_abs_error']:.0%} "
                     f"| {s['median_ratio']:.2f} | {terms} |")
    return "\n".join(lines)


def write_csv(results: list[Priced], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for p in results:
            r = p.row
            w.writerow([r.file, r.source_row, r.gpu, r.suite, r.precision, r.family, r.shape, r.note, p.dtype,
                        p.profile, p.op, r.time_us,
                        "" if p.predicted_us is None else f"{p.predicted_us:.4g}",
                        "" if p.ratio is None else f"{p.ratio:.4g}",
                        "" if p.abs_error is None else f"{p.abs_error:.4g}", p.source, p.bound,
                        p.launches or "", p.not_priced])


# ------------------------------------------------------------------ check against `placer plan`

def check_plan(results: list[Priced], profiles: dict[str, str], count: int) -> list[tuple[Priced, float, float]]:
    """(row, direct us, plan us) for ``count`` priced rows spread over the groups."""
    by_group: dict[tuple, list[Priced]] = {}
    for p in results:
        if p.predicted_us is not None:
            by_group.setdefault((p.row.gpu, p.row.precision, p.row.family), []).append(p)
    lists = [by_group[k] for k in sorted(by_group)]
    # groups evenly spaced over (GPU, precision, family), the middle row of each
    picks = [lists[i * len(lists) // count][len(lists[i * len(lists) // count]) // 2]
             for i in range(min(count, len(lists)))]
    pricer = Pricer(profiles)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, p in enumerate(picks):
            again = pricer.price(p.row, keep_net=True)
            paths = again.net.save(tmp, f"row{k}")
            proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", str(paths["predict"]),
                                   "--gpu-profile", again.profile, "--json", "--stability-draws", "0"],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"gpu_published: placer plan failed on {p.row.shape}: {proc.stderr.strip()}")
            plan = json.loads(proc.stdout)
            out.append((p, p.predicted_us, plan["ops"][0]["gpu_s"] * 1e6))
    return out


# ------------------------------------------------------------------ whole networks (--networks)

NETWORKS_CSV = ROOT / "bench" / "data" / "published_resnet50.csv"
# An independent set: tf_cnn_benchmarks' published P100 training throughputs (other nets,
# another framework, older cuDNN), priced the same way.
TF_BENCHMARKS_CSV = ROOT / "bench" / "data" / "published_tf_cnn_benchmarks.csv"
NETWORK_PROFILES = {"V100-16GB-SXM2": "v100-16gb-sxm2", "T4": "t4-pcie3", "A100-80GB-SXM4": "a100-40gb-sxm4",
                    "P100-16GB-SXM2": "p100-16gb-sxm2"}
# the published math mode -> placer's --precision (the nets stay float32, as the frameworks' are)
NETWORK_PRECISIONS = {"FP32": "fp32", "TF32": "tf32", "AMP": "amp"}
RESNET50_STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))   # (bottleneck width, blocks); out = 4 x width
RESNET152_STAGES = ((64, 3), (128, 8), (256, 36), (512, 3))
# VGG16 (configuration D): 3x3 convs per stage, each stage ending in a 2x2 max pool
VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


@dataclass
class NetworkRow:
    """One published ResNet-50 v1.5 throughput (bench/data/published_resnet50.csv)."""

    gpu: str
    precision: str        # FP32, TF32, AMP
    mode: str             # inference, training
    gpus: int
    batch_per_gpu: int
    images_per_s: float
    source: str
    model: str = "resnet50_v15"   # the net (NETWORK_MODELS)
    independent: bool = False     # a row of the independent set (TF_BENCHMARKS_CSV)


def read_network_rows(path: Path = NETWORKS_CSV) -> list[NetworkRow]:
    independent = path == TF_BENCHMARKS_CSV
    with path.open(newline="") as f:
        return [NetworkRow(r["gpu"], r["precision"], r["mode"], int(r["gpus"]), int(r["batch_per_gpu"]),
                           float(r["images_per_s"]), r["source"], r.get("model") or "resnet50_v15", independent)
                for r in csv.DictReader(f)]


def build_resnet50(batch: int, stages=RESNET50_STAGES, v15: bool = True, name: str = "resnet50_v15") -> NetBuilder:
    """ResNet-50 v1.5 at 224x224, NCHW: the bundled example's conv -> SpatialBN -> Relu
    unit in bottleneck blocks (1x1, 3x3, 1x1 x4), v1.5's stride 2 on the 3x3 conv, a
    1x1 projection on each stage's first block, global average pool, FC 1000, Softmax.
    ``v15=False``: v1, the stride on the first 1x1 (tf_cnn_benchmarks' 2017 ResNets);
    ``stages`` (width, blocks) per stage: ResNet-152 is (3, 8, 36, 3) blocks."""
    b = NetBuilder(f"{name}_b{batch}")
    x = b.input("data", (batch, 3, 224, 224))
    x = conv_bn(b, "conv1", x, 3, 64, kernel=7, stride=2, pad=3, relu=True)
    x = b.op("MaxPool", [x], "pool1", kernel=3, stride=2, pad=1)
    cin = 64
    for s, (width, blocks) in enumerate(stages):
        for k in range(blocks):
            stride, name, cout = (2 if s > 0 and k == 0 else 1), f"res{s + 2}_{k}", 4 * width
            y = conv_bn(b, f"{name}_a", x, cin, width, 1, 1 if v15 else stride, 0, relu=True)
            y = conv_bn(b, f"{name}_b", y, width, width, 3, stride if v15 else 1, 1, relu=True)
            y = conv_bn(b, f"{name}_c", y, width, cout, 1, 1, 0, relu=False)
            short = x if k > 0 else conv_bn(b, f"{name}_proj", x, cin, cout, 1, stride, 0, relu=False)
            x = b.op("Relu", [b.op("Sum", [y, short], f"{name}_sum")], f"{name}_sum")
            cin = cout
    x = b.op("AveragePool", [x], "pool5", global_pooling=1)
    w = b.param("pred_w", (1000, cin), "XavierFill")
    bias = b.param("pred_b", (1000,), "ConstantFill", value=0.0)
    b.output(b.op("Softmax", [b.op("FC", [x, w, bias], "pred")], "softmax"))
    return b


def build_vgg16(batch: int) -> NetBuilder:
    """VGG16 (configuration D) at 224x224, NCHW: 13 3x3 convs with bias and Relu in five
    stages, each ending in a 2x2 max pool, FC 4096 -> Relu -> FC 4096 -> Relu -> FC 1000,
    Softmax (no dropout: it is elementwise, and tf_cnn_benchmarks' VGG16 has none)."""
    b = NetBuilder(f"vgg16_b{batch}")
    x = b.input("data", (batch, 3, 224, 224))
    cin = 3
    for s, (width, convs) in enumerate(VGG16_STAGES):
        for k in range(convs):
            w = b.param(f"conv{s + 1}_{k + 1}_w", (width, cin, 3, 3), "MSRAFill")
            bias = b.param(f"conv{s + 1}_{k + 1}_b", (width,), "ConstantFill", value=0.0)
            x = b.op("Relu", [b.op("Conv", [x, w, bias], f"conv{s + 1}_{k + 1}", kernel=3, pad=1)],
                     f"conv{s + 1}_{k + 1}")
            cin = width
        x = b.op("MaxPool", [x], f"pool{s + 1}", kernel=2, stride=2)
    features = cin * 7 * 7
    for i, (n_in, n_out) in enumerate(((features, 4096), (4096, 4096), (4096, 1000))):
        w = b.param(f"fc{i + 6}_w", (n_out, n_in), "XavierFill")
        bias = b.param(f"fc{i + 6}_b", (n_out,), "ConstantFill", value=0.0)
        x = b.op("FC", [x, w, bias], f"fc{i + 6}")
        if i < 2:
            x = b.op("Relu", [x], x)
    b.output(b.op("Softmax", [x], "softmax"))
    return b


NETWORK_MODELS = {
    "resnet50_v15": lambda batch: build_resnet50(batch),
    "resnet50_v1": lambda batch: build_resnet50(batch, v15=False, name="resnet50_v1"),
    "resnet152_v1": lambda batch: build_resnet50(batch, RESNET152_STAGES, v15=False, name="resnet152_v1"),
    "vgg16": build_vgg16,
}


def network_net(mode: str, batch: int, model: str = "resnet50_v15"):
    """(Net, the fed inputs' types) of the inference net, or of the train step: SpatialBN in
    training mode, SoftmaxWithLoss, Caffe2's gradient ops and momentum SGD, made by
    ``make_train_nets`` as ``placer train-net --optimizer momentum`` does."""
    b = NETWORK_MODELS[model](batch)
    if mode == "inference":
        return net_from_netdef(b.predict, b.init, path=b.predict.name), dict(b.value_info)
    made = train_examples.make(train_examples.in_training_mode(b, batch), "momentum", lr=0.1)
    return net_from_netdef(made.train, made.init, path=made.train.name), made.value_info


@dataclass
class NetworkPriced:
    row: NetworkRow
    profile: str
    dtype: str
    ops: int
    step_s: float
    unknown_ops: int

    @property
    def predicted_images_per_s(self) -> float:
        return self.row.gpus * self.row.batch_per_gpu / self.step_s

    @property
    def ratio(self) -> float:
        return self.predicted_images_per_s / self.row.images_per_s


def price_network(row: NetworkRow, models: dict[tuple[str, str], CostModel], cache: dict) -> NetworkPriced:
    """The step's seconds with every op on the GPU: the sum of ``CostModel.op_time(...,
    "gpu")`` over the ops (no host copies, no overlap), under the row's math mode as
    ``placer plan --precision`` prices it (FP32 fp32, TF32 tf32, AMP amp)."""
    profile, dtype = NETWORK_PROFILES[row.gpu], NETWORK_PRECISIONS[row.precision]
    key = (row.model, row.mode, row.batch_per_gpu, dtype, profile)
    if key not in cache:
        net_key = ("net", row.model, row.mode, row.batch_per_gpu)
        if net_key not in cache:   # one net per (model, mode, batch), typed once per (dtype, profile)
            cache[net_key] = network_net(row.mode, row.batch_per_gpu, row.model)
        net, fed = cache[net_key]
        shapes = {name: TensorType(tuple(shape), dt) for name, (dt, shape) in fed.items()}
        typed = infer(net, shapes)
        total, unknown = 0.0, 0
        for i, op in enumerate(net.ops):
            seconds, source = models[(profile, dtype)].op_time(op.type, list(typed.op_inputs[i]), op.args,
                                                      typed.features[i], "gpu")
            total += seconds
            unknown += source == "unknown"
        cache[key] = (len(net.ops), total, unknown)
    ops, total, unknown = cache[key]
    return NetworkPriced(row, profile, dtype, ops, total, unknown)


def network_group(row: NetworkRow) -> str:
    if row.independent:
        return "independent: tf_cnn_benchmarks P100 FP32 training"
    if row.batch_per_gpu == 1:
        return "batch 1"
    if row.precision == "AMP":
        return "AMP"
    if row.precision == "TF32":
        return "TF32"
    return "inference FP32 batch>=32" if row.mode == "inference" else "training FP32"


def network_summary(results: list[NetworkPriced]) -> list[tuple[str, int, float, float]]:
    """(group, rows, median, worst) of exp|ln(ratio)|, the factor off either way."""
    groups: dict[str, list[float]] = {}
    for p in results:
        groups.setdefault(network_group(p.row), []).append(math.exp(abs(math.log(p.ratio))))
    order = ["inference FP32 batch>=32", "training FP32", "TF32", "AMP", "batch 1",
             "independent: tf_cnn_benchmarks P100 FP32 training"]
    return [(g, len(groups[g]), float(np.median(groups[g])), max(groups[g])) for g in order if g in groups]


def run_networks() -> int:
    rows = read_network_rows() + read_network_rows(TF_BENCHMARKS_CSV)
    host = load_device_profile(DEFAULT_CPU_PROFILE, "cpu")
    models = {(p, mode): CostModel(host, load_device_profile(p, "gpu"), precision=mode)
              for p in sorted(set(NETWORK_PROFILES.values())) for mode in sorted(set(NETWORK_PRECISIONS.values()))}
    cache: dict = {}
    results = [price_network(r, models, cache) for r in rows]
    print(f"ResNet-50 v1.5 (224x224) vs NVIDIA DeepLearningExamples (PyTorch), from {NETWORKS_CSV.relative_to(ROOT)}; "
          f"ResNet-50/152 v1 and VGG16 vs tf_cnn_benchmarks (TensorFlow), from {TF_BENCHMARKS_CSV.relative_to(ROOT)}")
    print("| GPU (profile) | net | precision (mode) | mode | GPUs | batch/GPU | ops | published img/s "
          "| predicted img/s | pred/pub |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for p in results:
        r = p.row
        print(f"| {r.gpu} ({p.profile}) | {r.model} | {r.precision} ({p.dtype}) | {r.mode} | {r.gpus} | {r.batch_per_gpu} "
              f"| {p.ops} | {r.images_per_s:.3g} | {p.predicted_images_per_s:.3g} | {p.ratio:.2f} |")
    unknown = sum(p.unknown_ops for p in results)
    if unknown:
        print(f"\n{unknown} op(s) priced at the unknown-op cost")
    print("\n| group | rows | median exp\\|ln(pred/pub)\\| | worst |")
    print("|---|---:|---:|---:|")
    for group, n, med, worst in network_summary(results):
        print(f"| {group} | {n} | {med:.2f} | {worst:.2f} |")
    return 0


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE,
                    help=f"folder of the DeepBench CSVs (default: {DEFAULT_REFERENCE})")
    ap.add_argument("--csv", type=Path, metavar="OUT", help="write every row (priced or not) to OUT")
    ap.add_argument("--worst", type=int, default=3, help="worst rows shown per group (default 3)")
    ap.add_argument("--v100-profile", default=GPU_PROFILES["NVIDIA V100"],
                    help="profile of the V100 rows (default: %(default)s)")
    ap.add_argument("--check-plan", type=int, default=0, metavar="N",
                    help="price N rows again through `placer plan` and compare (default 0)")
    ap.add_argument("--summary-only", action="store_true", help="leave out the per-row listing")
    ap.add_argument("--networks", action="store_true",
                    help="price the whole-network rows (ResNet-50 v1.5, bench/data/published_resnet50.csv) "
                         "instead of the kernel rows; needs no reference folder")
    args = ap.parse_args(argv)
    if args.networks:
        status = run_networks()
        print(f"\nwall time {time.perf_counter() - _START:.1f} s (the script's, from its first import)")
        return status
    if not args.reference.is_dir() or not list(args.reference.glob("deepbench_*.csv")):
        print(f"gpu_published: reference folder {args.reference} not found (give --reference DIR)", file=sys.stderr)
        return 2
    profiles = {**GPU_PROFILES, "NVIDIA V100": args.v100_profile}
    rows = read_rows(args.reference)
    results = price_all(rows, profiles)
    priced = [p for p in results if p.predicted_us is not None]
    summary = summarize(results, args.worst)

    if not args.summary_only:
        print(f"{'gpu':5s} {'family':15s} {'precision':10s} {'shape':68s} {'pub_us':>8s} {'pred_us':>9s} "
              f"{'pred/pub':>8s}  priced as")
        for p in priced:
            print(f"{GPU_SHORT.get(p.row.gpu):5s} {p.row.family:15s} {p.row.precision:10s} {p.row.shape:68s} "
                  f"{p.row.time_us:8.0f} {p.predicted_us:9.1f} {p.ratio:8.3f}  {p.bound}")
        print()
    print(f"GPU kernel model vs DeepBench: {len(priced)} of {len(rows)} kernel rows "
          f"priced, from {args.reference}")
    print()
    print(summary_markdown(summary))
    print()
    print("worst rows per group (by factor off, max(r, 1/r); what priced them):")
    for s in summary:
        print(f"  {GPU_SHORT.get(s['gpu'])} {s['family']} {s['precision']}:")
        for p in s["worst"]:
            print(f"    {p.row.shape}: published {p.row.time_us:.0f} us, predicted {p.predicted_us:.1f} us, "
                  f"ratio {p.ratio:.3g} ({p.bound}; {p.row.file} row {p.row.source_row})")
    print()
    print("forward algorithm: the model's choice against cuDNN's recorded one (fwd_algo):")
    for gpu, prec, agree, n, misses in algorithm_agreement(results):
        other = "; ".join(f"{k} {v}" for k, v in sorted(misses.items(), key=lambda kv: -kv[1]))
        print(f"  {GPU_SHORT.get(gpu)} {prec}: {agree} of {n} agree" + (f" (others: {other})" if other else ""))
    print()
    print("not priced:")
    for file, reason, n in skipped_summary(results):
        print(f"  {file}: {n} rows: {reason}")
    print(f"  {len([f for f in args.reference.glob('deepbench_*allreduce*.csv')])} all-reduce file(s): "
          "a collective, not a kernel: not read")
    if args.csv:
        write_csv(results, args.csv)
        print(f"\nwrote {args.csv} ({len(results)} rows)")
    status = 0
    if args.check_plan:
        print(f"\n`placer plan` check on {args.check_plan} rows (op gpu_s in the plan JSON vs the direct price):")
        for p, direct, planned in check_plan(results, profiles, args.check_plan):
            same = math.isclose(direct, planned, rel_tol=1e-9)
            status |= 0 if same else 1
            print(f"  {GPU_SHORT.get(p.row.gpu)} {p.row.family} {p.row.precision} {p.row.shape}: "
                  f"direct {direct:.6g} us, plan {planned:.6g} us: {'same' if same else 'DIFFERENT'}")
    print(f"\nwall time {time.perf_counter() - _START:.1f} s (the script's, from its first import)")
    return status


if __name__ == "__main__":
    sys.exit(main())
