"""Fit the GPU kernel model's constants (placer/costs/gpu_kernels.py) to DeepBench's kernel times.

Usage: python bench/fit_gpu_kernels.py [--reference DIR] [--write] [--check]

Reference: DeepBench's published GEMM and convolution times (``../shared/gpu-reference``,
its README.md names the source commit), the same rows ``bench/gpu_published.py`` reads.
Without the folder the script exits 2 with one line.

What is fitted, per GPU that has rows (V100: train fp32 and fp16_mixed; T4: the same, and
int8 inference) and per math class (fp32 rows: ``simt``; fp16_mixed: ``tensor``; int8:
``int8``):

1. the GEMM constants (efficiency, k_overhead, knee, fixed_s) on the class's GEMM rows;
2. with those fixed, each convolution pass's own efficiency factor, K overhead and fixed
   time (``conv_forward``, ``conv_forward.k_overhead``, ``conv_forward.fixed_s``, ... for
   backward_data and backward_filter), ``winograd`` and ``fft`` (SIMT) or ``unaligned``
   (tensor and int8: channels not multiples of 8), and ``reread`` (the share of the image's
   filter-tap re-reads that reach memory) for the forward pass and the tensor-core
   backward-data pass, on the class's convolution rows. The backward passes without
   ``reread`` keep the GEMM view's traffic (the expanded operand): the term was tried there
   and did not improve their fit (SIMT backward-data medians rose 2-4 points).

Each fit minimises a soft-L1 loss of log(predicted / published) (relative error: a 10 us
kernel counts as much as a 10 ms one; a few outlying rows pull less than with squares),
from several starting points, the best kept. Nothing is fitted to a whole network: the
networks in ``bench/gpu_published.py --networks`` only check the result.

``--write`` stores the constants in the shipped GPU profiles' ``kernel_model.classes``:
a GPU with rows gets its own fit (V100 SXM2 the V100's; T4 the T4's); the others carry a
fitted GPU's constants (efficiencies are shares of each GPU's own peak, so the datasheet
ratios carry them): V100 PCIe, A100, H100 and H200 the V100's ``simt`` and ``tensor``
classes (TF32 and bfloat16 run on the tensor class at their own peaks), every GPU with an
int8 peak the T4's ``int8`` class. ``--check`` refits and exits 1 when a stored profile's
constants describe the rows worse than the refit (median |error| more than 1 point
higher): the profiles can not drift from the data. Prints, per GPU, class and kernel
family, the rows, median and 90th-percentile |error|, and the fitted constants.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scipy.optimize import least_squares  # noqa: E402

from gpu_published import DEFAULT_REFERENCE, read_rows  # noqa: E402
from placer.costs import gpu_kernels as gk  # noqa: E402
from placer.fileio import atomic_write_text  # noqa: E402
from placer.hardware.profiles import load_device_profile, shipped_profiles_dir  # noqa: E402

# DeepBench GPU -> the shipped profile whose SMs, peaks and bandwidth price its rows
FIT_PROFILES = {"NVIDIA V100": "v100-16gb-sxm2", "NVIDIA T4": "t4-pcie3"}
# precision of the rows -> (peak key, element bytes, math class)
PRECISIONS = {"fp32": ("float32", 4.0, "simt"), "fp16_mixed": ("float16", 2.0, "tensor"),
              "int8": ("int8", 1.0, "int8")}
# profile -> (GPU whose fit it carries, classes); GPUs with rows carry their own
CARRIED = {
    "v100-16gb-sxm2": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "v100-16gb-pcie3": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "t4-pcie3": {"simt": "NVIDIA T4", "tensor": "NVIDIA T4", "int8": "NVIDIA T4"},
    "a100-40gb-sxm4": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "a100-40gb-pcie4": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "h100-80gb-sxm5": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "h100-pcie5": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    "h200-141gb-pcie5": {"simt": "NVIDIA V100", "tensor": "NVIDIA V100", "int8": "NVIDIA T4"},
    # Pascal: CUDA cores only; its DeepBench rows are not fitted, so they check the carry
    "p100-16gb-pcie3": {"simt": "NVIDIA V100"},
    "p100-16gb-sxm2": {"simt": "NVIDIA V100"},
}
GEMM_NAMES = ("efficiency", "k_overhead", "knee", "fixed_s")
GEMM_LO = (0.05, 0.1, 0.1, 1e-7)
GEMM_HI = (1.0, 4096.0, 1000.0, 1e-4)
GEMM_STARTS = ((0.9, 16.0, 20.0, 5e-6), (0.7, 64.0, 40.0, 8e-6), (0.5, 4.0, 5.0, 3e-6))
PASS_OF = {"conv_fwd": "forward", "conv_bwd_data": "backward_data", "conv_bwd_filter": "backward_filter"}
CONV_F_SCALE = 0.4   # soft-L1 scale of the convolution fits (log units: a factor 1.5)
VERBOSE = 0   # --worst N: print each group's N worst rows
SOURCE = ("fitted by bench/fit_gpu_kernels.py to DeepBench's published kernel times "
          "(github.com/baidu-research/DeepBench da81ba7, results/train and results/inference xlsx; "
          "CUDA 10.1, cuDNN 7.6.2): {detail}")


def conv_factor_names(cls: str, passes=gk.PASSES) -> list[str]:
    """The convolution constants a fit moves: those of the passes it has rows of (int8
    inference rows are forward only: its backward constants stay absent, the GEMM's)."""
    names = []
    for p in passes:
        names += [f"conv_{p}", f"conv_{p}.k_overhead", f"conv_{p}.fixed_s"]
        if p == "forward" or (p == "backward_data" and cls != "simt"):
            names.append(f"conv_{p}.reread")
        if cls != "simt":
            names.append(f"conv_{p}.unaligned")
    if cls == "simt":
        names += ["winograd", "winograd.k_overhead", "winograd.fixed_s", "fft"]
    return names


def factor_bounds(name: str) -> tuple[float, float]:
    if name.endswith(".reread"):
        return 1e-4, 1.0
    if name.endswith(".k_overhead"):
        return 0.1, 4096.0
    if name.endswith(".fixed_s"):
        return 1e-7, 2e-4
    return 0.02, 4.0


def factor_start(name: str, gemm: gk.ClassParams) -> float:
    if name.endswith(".reread"):
        return 0.1
    if name.endswith(".k_overhead"):
        return max(gemm.k_overhead, 1.0)
    if name.endswith(".fixed_s"):
        return gemm.fixed_s
    return 0.8


def gemm_arrays(rows):
    m, n, k = (np.array([r.dims[x] for r in rows], float) for x in ("M", "N", "K"))
    return m, n, k, np.array([r.time_us for r in rows]) * 1e-6


def conv_arrays(rows):
    names = {"n": "N", "c": "C", "h": "H", "w": "W", "k": "K", "r": "R", "s": "S", "pad_h": "pad_h",
             "pad_w": "pad_w", "stride_h": "stride_h", "stride_w": "stride_w"}
    cols = {f: np.array([r.dims[c] for r in rows], np.int64) for f, c in names.items()}
    ones = np.ones(len(rows), np.int64)
    return gk.ConvShapes(**cols, groups=ones, dilation_h=ones, dilation_w=ones), \
        np.array([r.time_us for r in rows]) * 1e-6


def base_model(profile: str, classes: dict) -> gk.GpuKernelModel:
    prof = load_device_profile(profile, "gpu")
    km = prof.kernel_model
    return gk.GpuKernelModel(sm_count=km["sm_count"], achieved_bandwidth_bytes_per_s=km["achieved_bandwidth_bytes_per_s"],
                             peaks=prof.peak_flops, classes=classes)


def with_class(model: gk.GpuKernelModel, cls: str, params: gk.ClassParams) -> gk.GpuKernelModel:
    classes = dict(model.classes)
    classes[cls] = params
    return gk.GpuKernelModel(model.sm_count, model.achieved_bandwidth_bytes_per_s, model.peaks, classes, model.source)


def gemm_log_errors(model, key, elt, arrays):
    m, n, k, t = arrays
    return np.log(gk.gemm_seconds(model, key, m, n, k, in_bytes=elt, out_bytes=elt)[0]) - np.log(t)


def conv_log_errors(model, key, elt, by_pass):
    return np.concatenate([np.log(gk.conv_seconds(model, key, shapes, p, elt)[0]) - np.log(t)
                           for p, (shapes, t) in by_pass.items()])


def fit_gemm(model, cls, key, elt, arrays) -> gk.ClassParams:
    def params(x):
        return gk.ClassParams(**dict(zip(GEMM_NAMES, np.exp(x).tolist())))

    def residuals(x):
        return gemm_log_errors(with_class(model, cls, params(x)), key, elt, arrays)
    lo, hi = np.log(GEMM_LO), np.log(GEMM_HI)
    best = None
    for start in GEMM_STARTS:
        res = least_squares(residuals, np.clip(np.log(start), lo + 1e-9, hi - 1e-9), bounds=(lo, hi),
                            loss="soft_l1", f_scale=0.1)
        if best is None or res.cost < best.cost:
            best = res
    return params(best.x)


def fit_conv(model, cls, key, elt, by_pass, gemm: gk.ClassParams) -> gk.ClassParams:
    names = conv_factor_names(cls, [p for p in gk.PASSES if p in by_pass])
    lo = np.log([factor_bounds(n)[0] for n in names])
    hi = np.log([factor_bounds(n)[1] for n in names])

    def params(y):
        return gk.ClassParams(gemm.efficiency, gemm.k_overhead, gemm.knee, gemm.fixed_s,
                              dict(zip(names, np.exp(y).tolist())))

    def residuals(y):
        return conv_log_errors(with_class(model, cls, params(y)), key, elt, by_pass)
    start = np.clip(np.log([factor_start(n, gemm) for n in names]), lo + 1e-9, hi - 1e-9)
    best = None
    for scale in (1.0, 0.5):
        x0 = np.clip(start + np.log(scale) * np.array([not ("." in n) for n in names]), lo + 1e-9, hi - 1e-9)
        res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=CONV_F_SCALE, diff_step=1e-3)
        if best is None or res.cost < best.cost:
            best = res
    return params(best.x)


def rows_by_gpu(rows):
    """{gpu: {precision: {"gemm": [...], "conv": {pass: [...]}}}} of the rows a fit reads."""
    out: dict = {}
    for r in rows:
        if r.gpu not in FIT_PROFILES or r.precision not in PRECISIONS:
            continue
        group = out.setdefault(r.gpu, {}).setdefault(r.precision, {"gemm": [], "conv": {}})
        if r.family == "gemm":
            group["gemm"].append(r)
        else:
            group["conv"].setdefault(PASS_OF[r.family], []).append(r)
    return out


def fit_all(rows) -> tuple[dict, list[dict]]:
    """({gpu: {class: ClassParams}}, quality rows)."""
    fitted: dict = {}
    quality: list[dict] = []
    for gpu, by_prec in sorted(rows_by_gpu(rows).items()):
        model = base_model(FIT_PROFILES[gpu], {})
        for prec, group in sorted(by_prec.items(), key=lambda kv: list(PRECISIONS).index(kv[0])):
            key, elt, cls = PRECISIONS[prec]
            arrays = gemm_arrays(group["gemm"])
            params = fit_gemm(model, cls, key, elt, arrays)
            by_pass = {p: conv_arrays(rs) for p, rs in group["conv"].items()}
            if by_pass:
                params = fit_conv(with_class(model, cls, params), cls, key, elt, by_pass, params)
            model = with_class(model, cls, params)
            fitted.setdefault(gpu, {})[cls] = params
            quality += describe(gpu, prec, model, key, elt, arrays, by_pass)
    return fitted, quality


def describe(gpu, prec, model, key, elt, arrays, by_pass) -> list[dict]:
    out = [quality_row(gpu, prec, "gemm", gemm_log_errors(model, key, elt, arrays))]
    for p, (shapes, t) in by_pass.items():
        secs, algos = gk.conv_seconds(model, key, shapes, p, elt)
        row = quality_row(gpu, prec, "conv_" + p, np.log(secs) - np.log(t))
        if VERBOSE:
            r = secs / t
            for i in np.argsort(-np.abs(np.log(r)))[:VERBOSE]:
                print(f"    {gpu} {prec} {p} N{shapes.n[i]} C{shapes.c[i]} H{shapes.h[i]} W{shapes.w[i]} K{shapes.k[i]} "
                      f"R{shapes.r[i]} S{shapes.s[i]} pad{shapes.pad_h[i]},{shapes.pad_w[i]} st{shapes.stride_h[i]} "
                      f"pub {t[i]*1e6:.0f} pred {secs[i]*1e6:.0f} r {r[i]:.2f} {algos[i]}")
        row["algorithms"] = {a: int((algos == a).sum()) for a in sorted(set(algos.tolist()))}
        out.append(row)
    return out


def quality_row(gpu, prec, family, log_err) -> dict:
    err = np.abs(np.exp(log_err) - 1.0) * 100
    return {"gpu": gpu, "precision": prec, "family": family, "rows": int(len(err)),
            "median_abs_pct_error": float(np.median(err)), "p90_abs_pct_error": float(np.percentile(err, 90))}


def stored_quality(rows) -> list[dict]:
    """The quality of the constants stored in the shipped profiles on the same rows."""
    quality: list[dict] = []
    for gpu, by_prec in sorted(rows_by_gpu(rows).items()):
        prof = load_device_profile(FIT_PROFILES[gpu], "gpu")
        model = gk.from_document(prof.kernel_model, prof.peak_flops)
        for prec, group in sorted(by_prec.items()):
            key, elt, cls = PRECISIONS[prec]
            if cls not in model.classes:
                continue
            by_pass = {p: conv_arrays(rs) for p, rs in group["conv"].items()}
            quality += describe(gpu, prec, model, key, elt, gemm_arrays(group["gemm"]), by_pass)
    return quality


def class_document(p: gk.ClassParams) -> dict:
    return {"efficiency": round(p.efficiency, 6), "k_overhead": round(p.k_overhead, 4), "knee": round(p.knee, 4),
            "fixed_s": float(f"{p.fixed_s:.4g}"), "conv": {k: float(f"{v:.5g}") for k, v in p.conv.items()}}


def write_profiles(fitted: dict, quality: list[dict]) -> list[str]:
    written = []
    for profile, carry in CARRIED.items():
        path = shipped_profiles_dir() / f"{profile}.json"
        doc = json.loads(path.read_text())
        dev = next(d for d in doc["devices"] if d["kind"] == "gpu")
        km = dev["kernel_model"]
        classes, detail = {}, []
        for cls, gpu in carry.items():
            if cls == "int8" and "int8" not in dev["peak_flops"]:
                continue
            if gpu in fitted and cls in fitted[gpu]:
                classes[cls] = class_document(fitted[gpu][cls])
                own = FIT_PROFILES.get(gpu) == profile
                detail.append(f"{cls} {'fitted to' if own else 'carried from'} the {gpu} rows")
        km["classes"] = classes
        km["classes_source"] = SOURCE.format(detail="; ".join(detail))
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
        written.append(str(path.relative_to(ROOT)))
    return written


def print_quality(title: str, quality: list[dict]) -> None:
    print(title)
    print(f"  {'GPU':<12} {'precision':<11} {'family':<22} {'rows':>5} {'median':>7} {'p90':>7}  algorithms")
    for q in quality:
        algos = ", ".join(f"{a} {n}" for a, n in q.get("algorithms", {}).items())
        print(f"  {q['gpu']:<12} {q['precision']:<11} {q['family']:<22} {q['rows']:>5} "
              f"{q['median_abs_pct_error']:>6.1f}% {q['p90_abs_pct_error']:>6.1f}%  {algos}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE)
    ap.add_argument("--write", action="store_true", help="store the fitted constants in the shipped GPU profiles")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the stored constants describe the rows worse than a refit")
    ap.add_argument("--worst", type=int, default=0, help="print each convolution group's N worst rows")
    args = ap.parse_args(argv)
    global VERBOSE
    VERBOSE = args.worst
    if not args.reference.is_dir():
        print(f"error: no reference folder {args.reference} (DeepBench CSVs; give --reference DIR)", file=sys.stderr)
        return 2
    rows = read_rows(args.reference)
    fitted, quality = fit_all(rows)
    print_quality("refit on the DeepBench rows (|predicted / published - 1|):", quality)
    for gpu, classes in fitted.items():
        for cls, p in classes.items():
            print(f"  {gpu} {cls}: {json.dumps(class_document(p))}")
    status = 0
    if args.write:
        for path in write_profiles(fitted, quality):
            print(f"wrote {path}")
    if args.check or args.write:
        stored = stored_quality(rows)
        print_quality("stored constants (the shipped profiles) on the same rows:", stored)
        refit = {(q["gpu"], q["precision"], q["family"]): q for q in quality}
        for q in stored:
            ref = refit[(q["gpu"], q["precision"], q["family"])]
            if q["median_abs_pct_error"] > ref["median_abs_pct_error"] + 1.0:
                print(f"stale: {q['gpu']} {q['precision']} {q['family']}: stored median "
                      f"{q['median_abs_pct_error']:.1f}% vs refit {ref['median_abs_pct_error']:.1f}% "
                      "(run with --write)")
                status = 1
    print(f"\nwall time {time.perf_counter() - _START:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
