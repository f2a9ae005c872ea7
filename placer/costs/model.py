"""The cost model: how long an op takes on a device, how long a copy takes, with provenance.

Order of trust for an op on a device (``CostModel.op_time``):

1. ``measured``: the device profile has an entry for the same key (op type, input
   shapes and dtypes, the arguments that change cost); its median is the answer.
2. ``fitted``: the profile has measured entries of the op's variant (``variant_of``)
   or type (at least ``MIN_TYPE_POINTS``) or else of its *family* (conv, fc, pool,
   ...); a roofline ``overhead + max(flops / (peak * eff_c), bytes / (bw * eff_m))``
   whose overhead and efficiencies were fitted to those entries by least squares on the
   log of time (relative error, so that a 10 us op counts as much as a 10 ms one).
   Matrix products (the fc family) get a compute efficiency that grows with the rows M
   of the product, ``eff_c * M / (M + M0)`` (see ``gemm_dims``), with M0 fitted and the
   large-M limit anchored on the device's peak: a fit on batch-8 FCs then predicts
   batch-64 ones. The finest group whose fit covers its points (median error at most
   ``FIT_MAX_MEDIAN_ERROR_PCT``) answers; where no fit of the op's groups covers its
   points, the finest one still answers but the source is ``poor-fit``: one roofline
   does not describe that group, and the estimate says so instead of passing for a fit.
3. ``kernel-model``: on a GPU whose profile has a ``kernel_model``, the kernel-level model
   of ``placer.costs.gpu_kernels`` (cuBLAS GEMM tiles in waves over the SMs, cuDNN's
   convolution algorithm per shape and pass, memory-bound ops at the achieved bandwidth),
   with constants fitted to published kernel times; ``op_kernel`` says which kernels and
   algorithm it assumed.
4. ``roofline``: the same formula as a fit with the datasheet peak and bandwidth and the
   default efficiencies of ``placer.hardware.constants``.
5. ``unknown``: an op type with no registry entry or with unknown shapes costs
   ``unknown_op_cost_s`` (default 0) on each device.

``annotate`` prices a whole typed net and returns ``NetCosts``: a per-op DataFrame and a
per-tensor DataFrame (the columns are listed on ``NetCosts``), which the planner and the
report read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from placer.costs import gpu_kernels, gpu_ops
from placer.costs.precision import (AMP_FP32_OPS, byte_scale, check_precision, fallback_notes, gemm_dtype, resolve,
                                    scales_bytes)
from placer.errors import ProfileError
from placer.hardware.constants import (DEFAULT_HALF_EFFICIENCY_ROWS, FIT_MAX_MEDIAN_ERROR_PCT, PEAK_GEMM_ROWS,
                                       default_efficiency)
from placer.hardware.device_profile import DeviceProfile, FamilyFit, LinkCurve, OpTiming, op_key
from placer.hardware.profiles import default_profiles
from placer.ops import registry
from placer.shapes import args_key
from placer.types import OpFeatures, TensorType, TypedNet

SOURCES = ("measured", "fitted", "poor-fit", "kernel-model", "roofline", "unknown")
# Weight of the pull toward default efficiencies, in log units: being a factor e off the
# default costs as much as a 20% error on one point.
PRIOR_WEIGHT = 0.2
# A weaker pull of the overhead toward the device's launch overhead: a group timed only
# at large sizes says nothing about its fixed cost, which must not swallow the time.
OVERHEAD_PRIOR_WEIGHT = 0.02
MAX_OVERHEAD_LAUNCHES = 100  # a fitted overhead is at most this many launch overheads
MIN_TYPE_POINTS = 2  # measured entries an op type needs for a fit of its own
CONCAT_FEW_INPUTS = 8  # a Concat of more inputs is fitted as "many" (see variant_of)
# Matrix products: the pull of the efficiency at PEAK_GEMM_ROWS toward the peak anchor
# (points at one batch size cannot split eff_c from M0 without it; points at several
# batch sizes outweigh it), a weak pull of M0 toward its default for points that never
# bind on compute...
PEAK_ANCHOR_WEIGHT = 0.5
# ... and of their memory efficiency toward its default: with the row term, points of
# more than one row bind on compute and say little of it, while a matrix-vector product
# (batch 1) streams its matrix much as the bandwidth probe does.
GEMM_MEMORY_PRIOR_WEIGHT = 1.0
ROWS_PRIOR_WEIGHT = 0.02
GEMM_FAMILY = "fc"
# Version of the fitting code (groups, model, priors): stored fits made by another version
# are refitted. Raise it whenever a change here would fit the same entries differently.
FIT_VERSION = 2

# Op type -> family where the registry module's name is not the right grouping.
_FAMILY_OVERRIDES = {
    "Softmax": "loss", "SoftmaxWithLoss": "loss", "Dropout": "elementwise",
    "MatMul": "fc", "BatchMatMul": "fc", "FCTransposed": "fc",
    "Gather": "embedding", "BatchGather": "embedding",
    # Views: Alias hands its input on (no bytes move, no kernel on a GPU). Reshape, Flatten,
    # FlattenToVec, Squeeze and ExpandDims are not views: their kernels copy on both
    # devices, as Caffe2's do (an output never aliases its input), so they stay in their
    # module's family (movement) and pay for their bytes.
    "Alias": "view",
    # Caffe2's quantized ops (QNNPACK): the same GEMM-shaped work as their float ops
    "Int8Conv": "conv", "Int8ConvRelu": "conv", "Int8ConvTranspose": "conv", "Int8FC": "fc",
}
# Registry module (placer/ops/<module>.py) -> family.
_MODULE_FAMILY = {
    "conv": "conv", "pool": "pool", "norm": "norm", "fc": "fc", "elementwise": "elementwise",
    "loss": "loss", "embedding": "embedding", "tensor": "movement", "fill": "movement",
    "copy": "movement", "gradients_sparse": "embedding", "gradients_segment": "embedding",
    "gradients_dense": "elementwise", "collective": "movement", "p2p": "movement",
}


def family_of(op_type: str) -> str:
    """The family an op type is fitted with: an override; a gradient op's forward op's
    family (``ConvGradient`` runs the same GEMMs as ``Conv``, about twice the work: its
    features count that work, the family sets the efficiency it runs at); else its
    registry module's."""
    if op_type in _FAMILY_OVERRIDES:
        return _FAMILY_OVERRIDES[op_type]
    opdef = registry.get(op_type)
    if opdef is None:
        return "other"
    for suffix in ("Gradient", "Grad"):
        forward = op_type.removesuffix(suffix)
        if forward != op_type and registry.get(forward) is not None:
            return family_of(forward)
    module = getattr(opdef.infer, "__module__", "").rsplit(".", 1)[-1]
    if module == "optimizers":   # dense updates stream their tensors; sparse ones gather rows
        return "embedding" if op_type.startswith(("Sparse", "RowWise", "Scatter")) else "elementwise"
    return _MODULE_FAMILY.get(module, "other")


def variant_of(op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any]) -> str | None:
    """A finer fit group for op types whose kernels behave differently by argument.

    Convolutions run as one GEMM per filter tap (or a broadcast multiply-add when each
    group has one channel), so memory traffic grows with the tap count while the
    features count each input once: 1x1, 3x3, larger, grouped and depthwise convs are
    fitted apart. A depthwise conv (one channel per group) is elementwise work, a
    multiply-add pass over the image per tap, bound by bytes rather than flops; a grouped
    one runs a batch of small GEMMs (one per group), far below the efficiency of one
    large GEMM. A Concat pays a call per input: one of many small inputs (DLRM's
    interaction stacks 27 vectors) costs far more per byte than one of a few large ones
    (Inception's four branches), so the two are fitted apart. None for every other op type.
    """
    if op_type == "Concat":
        return f"Concat/{'many' if len(inputs) > CONCAT_FEW_INPUTS else 'few'}"
    if op_type not in ("Conv", "ConvTranspose") or len(inputs) < 2 or inputs[1] is None:
        return None
    w = inputs[1].shape
    if len(w) != 4:
        return None
    order = args.get("order", "NCHW")
    order = order.decode() if isinstance(order, bytes) else order
    kh, kw, cg = (w[2], w[3], w[1]) if order != "NHWC" else (w[1], w[2], w[3])
    if cg == 1 and op_type == "Conv":
        return f"{op_type}/depthwise"
    if _group(args) > 1:
        return f"{op_type}/grouped"
    taps = kh * kw
    return f"{op_type}/{'k1' if taps == 1 else 'k3' if taps <= 9 else 'k5+'}"


def _group(args: Mapping[str, Any]) -> int:
    value = args.get("group", 1)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 1


def gemm_dims(op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any]) -> tuple[int, int] | None:
    """(rows M, columns N) of the matrix product an fc-family op runs, or None.

    FC: X flattened at ``axis`` (rows: the dims before it), N from W. MatMul: A and B
    coerced to 2-D at ``axis_a``/``axis_b``, after ``trans_a``/``trans_b``. BatchMatMul:
    one product of the batch (numpy and cuBLAS run them one after another or side by
    side, each with its own M).
    """
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        return None
    a, b = inputs[0].shape, inputs[1].shape

    def arg(name, default):
        value = args.get(name, default)
        return int(value) if not isinstance(value, (bytes, str)) else default

    def split(shape, axis):
        axis = axis + len(shape) if axis < 0 else axis
        return math.prod(shape[:axis]), math.prod(shape[axis:])
    try:
        if op_type in ("FC", "FCTransposed"):
            rows = split(a, arg("axis", 1))[0]
            w0, w1 = split(b, arg("axis_w", 1))
            return rows, (w1 if op_type == "FCTransposed" else w0)
        if op_type == "MatMul":
            a0, a1 = split(a, arg("axis_a", 1))
            b0, b1 = split(b, arg("axis_b", 1))
            return (a1 if arg("trans_a", 0) else a0), (b0 if arg("trans_b", 0) else b1)
        if op_type == "BatchMatMul":
            rows = 1 if len(a) < 2 else a[-1] if arg("trans_a", 0) else a[-2]
            cols = 1 if len(b) < 2 else b[-2] if arg("trans_b", 0) else b[-1]
            return rows, cols
    except (TypeError, ValueError):
        return None
    return None


def row_efficiency(dims: tuple[int, int] | None, half_rows: float | None) -> float:
    """Fraction of the large-M compute efficiency a product of ``dims`` reaches: M / (M + M0).

    1 without M0 or dims, and for a matrix-vector product (one row or one column):
    BLAS runs it as a GEMV that streams the matrix without packing it, so the memory term
    prices it.
    """
    if half_rows is None or dims is None or min(dims) <= 1:
        return 1.0
    return dims[0] / (dims[0] + half_rows)


def roofline_s(flops: float, nbytes: float, peak: float, bandwidth: float,
               overhead_s: float, eff_compute: float, eff_memory: float) -> float:
    """overhead + max(compute time, memory time) at the given efficiencies."""
    return overhead_s + max(flops / (peak * eff_compute), nbytes / (bandwidth * eff_memory))


# ------------------------------------------------------------------------- fitting

def fit_family(points: Sequence[OpTiming], peak: float, bandwidth: float,
               default_overhead_s: float, family: str = "other", device_kind: str = "gpu",
               dims: Sequence[tuple[int, int] | None] | None = None,
               anchor_efficiency: float | None = None) -> FamilyFit:
    """Least-squares fit of (overhead, eff_compute, eff_memory) to measured entries.

    Residuals are log(predicted / measured) under a soft-L1 loss (an op slowed by a busy
    machine pulls the fit less than with plain squares), plus weak priors pulling each
    efficiency toward its default (``PRIOR_WEIGHT``) and the overhead toward the launch
    overhead (``OVERHEAD_PRIOR_WEIGHT``): where the points cannot tell the terms apart
    (every embedding lookup of a batch-8 net does the same few flops) the fit keeps a
    sensible split instead of an arbitrary one. The best of nine starting points wins.

    With ``dims`` (one ``gemm_dims`` per point) the compute efficiency of a point is
    ``eff_compute * row_efficiency(dims, M0)`` and M0 is fitted too; instead of the
    default, the efficiency at ``PEAK_GEMM_ROWS`` rows is pulled toward
    ``anchor_efficiency`` (``PEAK_ANCHOR_WEIGHT``), which fixes eff_compute when every
    point has the same M, and M0 weakly toward its default (``ROWS_PRIOR_WEIGHT``).
    """
    from scipy.optimize import least_squares

    flops = np.array([p.flops for p in points], float)
    nbytes = np.array([p.bytes for p in points], float)
    t = np.maximum(np.array([p.median_s for p in points], float), 1e-9)
    prior = np.log(default_efficiency(family, device_kind))
    log_overhead0 = math.log(max(default_overhead_s, 1e-9))
    by_rows = dims is not None
    if by_rows:
        # rows of each product; 0 marks a matrix-vector product (or unknown dims): no row term
        rows = np.array([d[0] if d is not None and min(d) > 1 else 0 for d in dims], float)
        anchor = math.log(anchor_efficiency or math.exp(prior[0]))
        log_m0 = math.log(DEFAULT_HALF_EFFICIENCY_ROWS.get(device_kind, 8.0))

    def row_scale(x):
        if not by_rows:
            return 1.0
        return np.where(rows > 0, rows / (rows + math.exp(x[3])), 1.0)

    def predict(x):
        o, ec, em = np.exp(x[:3])
        return o + np.maximum(flops / (peak * ec * row_scale(x)), nbytes / (bandwidth * em))

    def residuals(x):
        fit = np.log(predict(x)) - np.log(t)
        over = [OVERHEAD_PRIOR_WEIGHT * (x[0] - log_overhead0)]
        if not by_rows:
            return np.concatenate([fit, PRIOR_WEIGHT * (x[1:] - prior), over])
        at_peak = x[1] + math.log(PEAK_GEMM_ROWS) - np.logaddexp(math.log(PEAK_GEMM_ROWS), x[3])
        return np.concatenate([fit, [GEMM_MEMORY_PRIOR_WEIGHT * (x[2] - prior[1]),
                                     PEAK_ANCHOR_WEIGHT * (at_peak - anchor),
                                     ROWS_PRIOR_WEIGHT * (x[3] - log_m0)], over])

    # Every op of the group pays the overhead, so it cannot exceed the fastest one; nor
    # is a fixed cost ever a hundred launches (a group timed only large says nothing of it).
    lo = np.log([1e-9, 1e-6, 1e-6] + ([1e-2] if by_rows else []))
    hi = np.log([max(min(float(t.min()), MAX_OVERHEAD_LAUNCHES * default_overhead_s), 2e-9), 1e3, 1e3]
                + ([1e5] if by_rows else []))
    best = None
    for o0 in (float(t.min()) * 0.5, default_overhead_s, float(t.min()) * 0.01):
        for scale in (0.1, 1.0, 10.0):
            x0 = np.concatenate([[math.log(max(o0, 1e-9))], prior + math.log(scale)]
                                + ([[log_m0]] if by_rows else []))
            x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
            res = least_squares(residuals, x0, bounds=(lo, hi), method="trf", loss="soft_l1", f_scale=0.1)
            if best is None or res.cost < best.cost:
                best = res
    o, ec, em = np.exp(best.x[:3])
    err_pct = np.abs(predict(best.x) - t) / t * 100
    median_err = float(np.median(err_pct))
    return FamilyFit(overhead_s=float(o), compute_efficiency=float(ec), memory_efficiency=float(em),
                     points=len(points), median_abs_pct_error=median_err,
                     half_efficiency_rows=float(math.exp(best.x[3])) if by_rows else None,
                     p90_abs_pct_error=float(np.percentile(err_pct, 90)),
                     spread_pct=float(np.median([p.spread for p in points]) * 100),
                     covered=median_err <= FIT_MAX_MEDIAN_ERROR_PCT)


def fit_groups(timing: OpTiming) -> list[str]:
    """The fit groups a measured entry belongs to, finest first: its variant
    (``type:Conv/k3``), its op type (``type:Conv``), its family (``conv``)."""
    variant = variant_of(timing.type, timing.inputs, timing.args)
    return ([f"type:{variant}"] if variant else []) + [f"type:{timing.type}", family_of(timing.type)]


def choose_fit(fits: Mapping[str, FamilyFit], op_type: str, inputs: Sequence[TensorType | None],
               args: Mapping[str, Any]) -> FamilyFit | None:
    """The fit that prices an op: the finest of its groups whose fit covers its points,
    else the finest fit it has (the caller labels that estimate ``poor-fit``), else None."""
    variant = variant_of(op_type, inputs, args)
    names = ([f"type:{variant}"] if variant else []) + [f"type:{op_type}", family_of(op_type)]
    present = [fits[n] for n in names if n in fits]
    return next((f for f in present if f.covered), present[0] if present else None)


FIT_REPORT_COLUMNS = ["group", "overhead_s", "compute_efficiency", "memory_efficiency", "half_efficiency_rows",
                      "points", "median_abs_pct_error", "p90_abs_pct_error", "spread_pct", "covered"]

# ---------------------------------------------------------------------- the model

class CostModel:
    """Op and copy times on a machine's devices, each with its source.

    Devices are given by index into ``devices`` (a machine's device profiles, index 0 the
    host), or by kind: "cpu" / "gpu" name the first device of that kind. ``CostModel(cpu,
    gpu)`` is the CPU + one GPU pair (its defaults: the shipped default profiles);
    ``CostModel.for_machine(machine)`` prices every device of a machine. Fits are made once
    per distinct profile (eight identical GPUs share one).

    ``use_measured=False`` ignores measured entries for the answer (they still train
    the family fits): how the accuracy benchmark predicts shapes it has not timed.

    ``precision`` is the math mode of GPU work (``placer.costs.precision``: None = auto,
    the net's own dtypes, or one of ``PRECISIONS``); ``annotate`` sizes tensors by it.
    """

    def __init__(self, cpu_profile: DeviceProfile | None = None, gpu_profile: DeviceProfile | None = None,
                 unknown_op_cost_s: float = 0.0, use_measured: bool = True,
                 devices: Sequence[DeviceProfile] | None = None, precision: str | None = None):
        if devices is None:
            if cpu_profile is None or gpu_profile is None:
                cpu_default, gpu_default = default_profiles()
                cpu_profile = cpu_profile or cpu_default
                gpu_profile = gpu_profile or gpu_default
            devices = (cpu_profile, gpu_profile)
        self.devices: tuple[DeviceProfile, ...] = tuple(devices)
        self.unknown_op_cost_s = float(unknown_op_cost_s)
        self.use_measured = use_measured
        self.precision = check_precision(precision)
        self._fits: dict[int, dict[str, FamilyFit]] = {}
        self._kernel_models: dict[int, gpu_kernels.GpuKernelModel] = {}

    @classmethod
    def for_machine(cls, machine, unknown_op_cost_s: float = 0.0, use_measured: bool = True,
                    precision: str | None = None) -> "CostModel":
        return cls(devices=[d.profile for d in machine.devices], unknown_op_cost_s=unknown_op_cost_s,
                   use_measured=use_measured, precision=precision)

    @property
    def profiles(self) -> dict[str, DeviceProfile]:
        """The first profile of each device kind ("cpu", "gpu")."""
        out: dict[str, DeviceProfile] = {}
        for prof in self.devices:
            out.setdefault(prof.kind, prof)
        return out

    def _index(self, device: int | str) -> int:
        if isinstance(device, (int, np.integer)):
            return int(device)
        for i, prof in enumerate(self.devices):
            if prof.kind == device:
                return i
        raise ProfileError(f"no profile for device kind '{device}' (cpu or gpu)")

    def profile(self, device: int | str) -> DeviceProfile:
        return self.devices[self._index(device)]

    def distinct(self) -> list[int]:
        """One device index per distinct profile (the first device that has it)."""
        seen: dict[int, int] = {}
        for i, prof in enumerate(self.devices):
            seen.setdefault(id(prof), i)
        return sorted(seen.values())

    def fits(self, device: int | str) -> dict[str, FamilyFit]:
        """Fits of a device keyed by family (``conv``), op type (``type:Conv``) and variant
        (``type:Conv/k3``, see ``variant_of``).

        A type or variant gets its own fit once it has ``MIN_TYPE_POINTS`` measured entries
        (op types of one family can differ in fixed cost by 5x: a Gather vs a
        SparseLengthsSum); every family with entries gets one. ``choose_fit`` picks the
        one that prices an op. Without measured entries, the fits stored in the file; the
        stored fits also when they were made from exactly the file's entries by this
        fitting code (``fits_digest``), which saves refitting on every plan.
        """
        prof = self.profile(device)
        key = id(prof)
        if key not in self._fits:
            device_kind = prof.kind
            if prof.fits_are_current(FIT_VERSION):  # fitted by `placer profile` from these entries
                self._fits[key] = dict(prof.fits)
                return self._fits[key]
            groups: dict[str, list[OpTiming]] = {}
            for timing in prof.ops.values():
                for name in fit_groups(timing):
                    groups.setdefault(name, []).append(timing)
            fits = dict(prof.fits)
            for name, points in groups.items():
                if name.startswith("type:") and len(points) < MIN_TYPE_POINTS:
                    continue
                fam = family_of(points[0].type)
                dtype = points[0].inputs[0].dtype if points[0].inputs else "float32"
                dims = [gemm_dims(p.type, p.inputs, p.args) for p in points] if fam == GEMM_FAMILY else None
                fits[name] = fit_family(points, prof.peak(dtype), prof.memory_bandwidth_bytes_per_s,
                                        prof.launch_overhead_s, fam, device_kind, dims,
                                        self._anchor_efficiency(prof, fam))
            self._fits[key] = fits
        return self._fits[key]

    @staticmethod
    def _anchor_efficiency(prof: DeviceProfile, family: str) -> float:
        """Compute efficiency of a ``PEAK_GEMM_ROWS``-row product: 1 where the peak was
        measured (with such a GEMM), else the family's default share of a datasheet peak."""
        if prof.source.get("kind") == "measured":
            return 1.0
        return default_efficiency(family, prof.kind)[0]

    def fit_report(self, device: int | str) -> pd.DataFrame:
        """One row per fit (family or ``type:X``): points, overhead, efficiencies, M0 of
        matrix products, and the fit's quality: median and p90 |error| %, the run-to-run
        spread of its points (IQR / median, %), and whether it covers them."""
        rows = [{"group": name, **vars(fit)} for name, fit in sorted(self.fits(device).items())]
        return pd.DataFrame(rows, columns=FIT_REPORT_COLUMNS)

    def op_spread(self, op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any],
                  features: OpFeatures, device: int | str) -> float:
        """Run-to-run spread of ``op_time``'s answer as a fraction of it (IQR / median).

        A measured entry's own spread; a fitted estimate's, the median spread of the points
        of its fit; 0 for a datasheet roofline or an unknown op, which were never measured.
        """
        if not features.known or registry.get(op_type) is None or any(t is None for t in inputs):
            return 0.0
        if self.use_measured:
            hit = self.profile(device).ops.get(op_key(op_type, inputs, args))
            if hit is not None:
                return hit.spread
        fit = choose_fit(self.fits(device), op_type, inputs, args)
        return (fit.spread_pct or 0.0) / 100 if fit is not None else 0.0

    def op_time(self, op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any],
                features: OpFeatures, device: int | str) -> tuple[float, str]:
        """(seconds, source) of one op on a device (an index, or "cpu" / "gpu")."""
        if not features.known or registry.get(op_type) is None or any(t is None for t in inputs):
            return self.unknown_op_cost_s, "unknown"
        prof = self.profile(device)
        device_kind = prof.kind
        if self.use_measured:
            hit = prof.ops.get(op_key(op_type, inputs, args))
            if hit is not None:
                return hit.median_s, "measured"
        dtype = inputs[0].dtype if inputs else "float32"
        nbytes = features.bytes_read + features.bytes_written
        fam = family_of(op_type)
        fit = choose_fit(self.fits(device), op_type, inputs, args)
        if fit is not None:
            eff_c = fit.compute_efficiency
            if fit.half_efficiency_rows is not None:
                eff_c *= row_efficiency(gemm_dims(op_type, inputs, args), fit.half_efficiency_rows)
            return roofline_s(features.flops, nbytes, prof.peak(dtype), prof.memory_bandwidth_bytes_per_s,
                              fit.overhead_s, eff_c, fit.memory_efficiency), \
                "fitted" if fit.covered else "poor-fit"
        kernel = self._kernel_model_price(prof, op_type, inputs, args, features)
        if kernel is not None:
            return kernel[0], "kernel-model"
        return roofline_s(features.flops, nbytes, prof.peak(dtype), prof.memory_bandwidth_bytes_per_s,
                          self._fixed_cost_s(prof, op_type, inputs, args),
                          *default_efficiency(fam, device_kind)), "roofline"

    def gemm_key(self, prof: DeviceProfile, dtype: str) -> str:
        """The peak key conv- and GEMM-shaped work of ``dtype`` tensors runs at on ``prof``
        under this model's precision (``placer.costs.precision.gemm_dtype``)."""
        return gemm_dtype(self.precision, dtype, prof.peak_flops)

    def _kernel_model_price(self, prof: DeviceProfile, op_type: str, inputs: Sequence[TensorType],
                            args: Mapping[str, Any], features: OpFeatures) -> tuple[float, str] | None:
        """(seconds, explanation) from the GPU kernel model, or None (no kernel model, or an
        op it does not know)."""
        if prof.kind != "gpu" or not gpu_ops.has_kernel_model(prof) or family_of(op_type) == "view":
            return None     # a view launches nothing: the roofline's zero stands
        key_id = id(prof)
        model = self._kernel_models.get(key_id)
        if model is None:
            model = self._kernel_models[key_id] = gpu_kernels.from_document(prof.kernel_model, prof.peak_flops)
        dtype = inputs[0].dtype if inputs else "float32"
        key = self.gemm_key(prof, dtype)
        if gpu_kernels.math_class(key) not in model.classes:
            key = "float32" if "simt" in model.classes else key
        keeps = op_type in AMP_FP32_OPS
        scale = byte_scale(self.precision, dtype, is_param=False, keeps_fp32=keeps)
        return gpu_ops.price(model, prof.launch_overhead_s, op_type, inputs, args, features, key, scale,
                             launches=gpu_ops.registry_launches(op_type, inputs, args))

    def op_kernel(self, op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any],
                  features: OpFeatures, device: int | str, source: str | None = None) -> str:
        """What the GPU kernel model assumed for an op on a device ("cuDNN forward winograd
        (float32 on CUDA cores)"), or "" where it did not price it. ``source``: the op's
        ``op_time`` source where the caller has it (not priced again)."""
        if not features.known or registry.get(op_type) is None or any(t is None for t in inputs):
            return ""
        if source is None:
            _, source = self.op_time(op_type, inputs, args, features, device)
        if source != "kernel-model":
            return ""
        found = self._kernel_model_price(self.profile(device), op_type, list(inputs), args, features)
        return found[1] if found else ""

    @staticmethod
    def _fixed_cost_s(prof: DeviceProfile, op_type: str, inputs: Sequence[TensorType],
                      args: Mapping[str, Any]) -> float:
        """The roofline's overhead: on the host one call; on a GPU one launch overhead per
        kernel the op's GPU kernel launches (``OpDef.launches``: a cupy Sigmoid is 5, a
        3x3 convolution ~20), since each launch costs host time that tiny kernels cannot hide."""
        if prof.kind != "gpu":
            return prof.launch_overhead_s
        return registry.get(op_type).launch_count(inputs, args) * prof.launch_overhead_s

    def copy_time(self, nbytes: float, direction: str, pinned: bool = True) -> float:
        """Seconds to copy ``nbytes`` host->GPU ("h2d") or GPU->host ("d2h") over the first
        GPU's PCIe link (a machine's other links: ``placer.hardware.machine``)."""
        if nbytes <= 0:
            return 0.0
        link = self.profiles["gpu"].link
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be 'h2d' or 'd2h', not {direction!r}")
        if not link:
            raise ProfileError(f"GPU profile '{self.profiles['gpu'].name}' has no host link figures",
                               hint="use a shipped GPU profile or run `placer profile --link`")
        return curve_time(link[direction]["pinned" if pinned else "pageable"], nbytes)


def curve_time(curve: LinkCurve, nbytes: float) -> float:
    """Interpolate measured points (log-log) inside their range; the fitted line outside."""
    pts = curve.points
    if len(pts) >= 2 and pts[0][0] <= nbytes <= pts[-1][0]:
        sizes = np.log([p[0] for p in pts])
        times = np.log([max(p[1], 1e-12) for p in pts])
        return float(np.exp(np.interp(math.log(nbytes), sizes, times)))
    return curve.latency_s + nbytes / curve.bytes_per_s


# -------------------------------------------------------------------- annotating

OP_COLUMNS = ["index", "name", "type", "flops", "macs", "bytes_read", "bytes_written", "param_bytes",
              "output_bytes", "known"]
EXTERNAL_INPUT = -1   # producer of a blob fed from the host
PARAMETER = -2        # producer of a blob the init net makes


@dataclass
class TensorTable:
    """Every blob version that is read or is an external output, as arrays.

    One row per *version* of a blob: ``producer`` is the op index that wrote that version
    (an in-place op starts a new one), ``EXTERNAL_INPUT`` (-1) for a blob fed from the
    host, ``PARAMETER`` (-2) for one made by the init net. The readers of tensor t are
    ``consumers[ptr[t]:ptr[t + 1]]`` (op indices, each once, in net order).
    """

    names: list[str]
    producer: np.ndarray
    ptr: np.ndarray
    consumers: np.ndarray
    nbytes: np.ndarray
    external_output: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    def readers(self, t: int) -> np.ndarray:
        return self.consumers[self.ptr[t]:self.ptr[t + 1]]


@dataclass
class NetCosts:
    """A net priced on every device of a machine.

    ``ops``: one row per op in net order, columns ``OP_COLUMNS`` (features from shape
    inference; ``output_bytes`` the sum of the op's output sizes; ``known`` whether the
    type and shapes are known; ``param_bytes`` and ``output_bytes`` sized by the precision,
    as the tensors are). ``op_s[i, d]``: seconds of op i on device d, with
    ``op_source[i, d]`` in ``SOURCES``; ``kernels[i, d]``: the registry has a kernel of
    op i for device d's kind. ``tensors``: the ``TensorTable``; copy times come from the
    machine's links (``machine.link_classes()``) and the tensors' bytes. ``precision``:
    what ran (``placer.costs.precision.resolve``: "fp32" for a float32 net priced in auto);
    ``sized_by``: the precision the bytes were sized by (``stored_nbytes``), None where
    they are the net's own (auto, fp32, tf32, or a machine with no GPU).
    """

    ops: pd.DataFrame
    op_s: np.ndarray
    op_source: np.ndarray
    kernels: np.ndarray
    tensors: TensorTable
    machine: Any
    model: CostModel
    fit_quality: dict[str, pd.DataFrame] = field(default_factory=dict)
    precision: str = "fp32"
    sized_by: str | None = None    # the precision tensor bytes are sized by; None: the net's own
    # op index -> {device index: what the GPU kernel model assumed ("cuDNN forward winograd
    # (float32 on CUDA cores)")}, for the ops and GPUs it priced
    kernel_notes: dict[int, dict[int, str]] = field(default_factory=dict)
    # GPUs that lack the math the precision asks for, and what they were priced in
    precision_notes: list[str] = field(default_factory=list)

    @property
    def param_bytes(self) -> int:
        """Bytes of all parameters (each counted once)."""
        t = self.tensors
        return int(t.nbytes[t.producer == PARAMETER].sum())

    @property
    def activation_bytes(self) -> int:
        """Bytes of every other blob, each counted once (versions of an in-place blob share
        its buffer: the largest counts). An upper bound on live activations: the planner's
        peak-memory walk over blob lifetimes is the tight figure."""
        t = self.tensors
        largest: dict[str, float] = {}
        for name, p, b in zip(t.names, t.producer.tolist(), t.nbytes.tolist()):
            if p != PARAMETER and b > largest.get(name, -1.0):
                largest[name] = b
        return int(sum(largest.values()))

    def memory_footprint(self) -> dict[str, int]:
        """Parameters and activations (each once), in bytes."""
        return {"param_bytes": self.param_bytes, "activation_bytes": self.activation_bytes}


def annotate(typed_net: TypedNet, machine, unknown_op_cost_s: float = 0.0,
             model: CostModel | None = None, precision: str | None = None) -> NetCosts:
    """Price every op on every device of ``machine`` (once per distinct device profile)
    and list every tensor with its readers and bytes.

    An op's prices are a function of its type, argument values, input and output types
    and features, so ops that agree on all of them (the layers of a deep net) are priced
    once; the tables are built column by column. Both keep a million-op net to seconds.

    ``precision`` (``placer.costs.precision``) builds the model when none is given; a
    given model's own precision is used. On a machine with a GPU, fp16 / bf16 / amp size
    the tensor table (copies, the memory walk) and the ops' ``param_bytes`` /
    ``output_bytes`` by ``byte_scale``; a tensor has one size, the GPU's, also where it
    lives on the host: a copy between the two moves the 2-byte form. A CPU-only machine
    runs the net's own dtypes, and its costs are those of auto."""
    has_gpu = any(d.kind == "gpu" for d in machine.devices)
    model = model or CostModel.for_machine(machine, unknown_op_cost_s=unknown_op_cost_s,
                                           precision=check_precision(precision) if has_gpu else None)
    sized_by = model.precision if has_gpu and scales_bytes(model.precision) else None
    net = typed_net.net
    n, k = len(net.ops), machine.k
    kinds = [d.kind for d in machine.devices]
    distinct = model.distinct()
    same_as = [next(j for j in distinct if model.devices[j] is model.devices[i]) for i in range(k)]
    priced: dict[tuple, int] = {}   # op signature -> its row in `rows`
    rows: list[tuple] = []          # distinct priced rows (see _priced_row)
    row_of = np.empty(n, np.int64)  # op -> its priced row
    for op, feats in zip(net.ops, typed_net.features):
        inputs = _op_types(typed_net, op, "inputs")
        outs = _op_types(typed_net, op, "outputs")
        key = op_signature(op, inputs, outs, feats)
        r = priced.get(key) if key is not None else None
        if r is None:
            r = len(rows)
            rows.append(_priced_row(model, op, inputs, outs, feats, distinct, kinds))
            if key is not None:
                priced[key] = r
        row_of[op.index] = r
    op_s, source, kernels, features = _op_tables(rows, row_of, distinct, same_as, k)
    kernel_notes = _kernel_notes(rows, row_of, same_as)
    columns = {"index": np.arange(n), "name": [op.name for op in net.ops], "type": [op.type for op in net.ops],
               **features}
    if sized_by is not None:
        columns.update(_sized_op_bytes(typed_net, sized_by, features["param_bytes"], features["output_bytes"]))
    ops = pd.DataFrame(columns, columns=OP_COLUMNS) if n else pd.DataFrame([], columns=OP_COLUMNS)
    ran = resolve(model.precision, {t.dtype for t in typed_net.blobs.values() if t is not None}, has_gpu)
    return NetCosts(ops=ops, op_s=op_s, op_source=source, kernels=kernels,
                    tensors=tensor_table(typed_net, sized_by), machine=machine, model=model,
                    fit_quality={machine.devices[d].name: model.fit_report(d) for d in distinct},
                    precision=ran, sized_by=sized_by, kernel_notes=kernel_notes,
                    precision_notes=fallback_notes(model.precision, [(d.name, d.peak_flops) for d in model.devices
                                                                     if d.kind == "gpu"]))


def _kernel_notes(rows: list[tuple], row_of: np.ndarray, same_as: list[int]) -> dict[int, dict[int, str]]:
    """Op index -> {device: the kernel model's note} from the priced rows (identical
    devices share their profile's note)."""
    out: dict[int, dict[int, str]] = {}
    for i, r in enumerate(row_of.tolist()):
        notes = rows[r][4]
        if notes:
            out[i] = {d: notes[same_as[d]] for d in range(len(same_as)) if same_as[d] in notes}
    return out


def stored_nbytes(t: TensorType, blob: str, producer_type: str | None, params, precision: str | None) -> float:
    """Bytes of ``blob`` (of type ``t``, made by an op of ``producer_type``; None: fed or
    a parameter) as stored under ``precision`` (``byte_scale``: a parameter is a blob of
    ``params``; ``keeps_fp32`` where its maker's type is in ``AMP_FP32_OPS``)."""
    size = float(t.nbytes)
    if precision is None:
        return size
    return size * byte_scale(precision, t.dtype, blob in params, producer_type in AMP_FP32_OPS)


def _sized_op_bytes(typed_net: TypedNet, precision: str, param_bytes, output_bytes) -> dict[str, np.ndarray]:
    """The ops' ``param_bytes`` and ``output_bytes`` under a precision that re-sizes
    tensors: outputs by their own ``byte_scale``; parameter bytes by the share the op's
    parameter inputs keep (the features count them as the shape inference saw them)."""
    net = typed_net.net
    params = np.asarray(param_bytes, np.float64).copy()
    outputs = np.asarray(output_bytes, np.float64).copy()
    for op in net.ops:
        outs = [(b, t) for b, t in zip(op.outputs, _op_types(typed_net, op, "outputs")) if t is not None]
        outputs[op.index] = sum(stored_nbytes(t, b, op.type, net.params, precision) for b, t in outs)
        ins = [t for b, t in zip(op.inputs, _op_types(typed_net, op, "inputs")) if t is not None and b in net.params]
        raw = sum(t.nbytes for t in ins)
        if raw > 0:
            params[op.index] *= sum(t.nbytes * byte_scale(precision, t.dtype, True) for t in ins) / raw
    return {"param_bytes": params, "output_bytes": outputs}


def _priced_row(model: CostModel, op, inputs: tuple, outs: tuple, feats: OpFeatures,
                distinct: list[int], kinds: list[str]) -> tuple:
    """(seconds per distinct device, sources, kernel per device, feature columns) of one op."""
    times, sources = zip(*(model.op_time(op.type, list(inputs), op.args, feats, d) for d in distinct))
    opdef = registry.get(op.type)
    if opdef is not None and opdef.host_kernel and "cpu" in kinds:
        # its kernel computes on the host wherever it is placed: a GPU's price is the host's
        host = distinct.index(next(j for j in distinct if kinds[j] == "cpu"))
        times = tuple(times[host] if kinds[d] == "gpu" else t for d, t in zip(distinct, times))
        sources = tuple(sources[host] if kinds[d] == "gpu" else s for d, s in zip(distinct, sources))
    kernels = tuple(kind in opdef.devices for kind in kinds) if opdef is not None else (False,) * len(kinds)
    features = (feats.flops, feats.macs, feats.bytes_read, feats.bytes_written, feats.param_bytes,
                float(sum(t.nbytes for t in outs if t is not None)), bool(feats.known and opdef is not None))
    notes = {d: model.op_kernel(op.type, list(inputs), op.args, feats, d, source=src)
             for d, src in zip(distinct, sources) if src == "kernel-model"}
    return times, sources, kernels, features, {d: v for d, v in notes.items() if v}


def _op_tables(rows: list[tuple], row_of: np.ndarray, distinct: list[int], same_as: list[int], k: int):
    """op_s [n, k], op_source [n, k], kernels [n, k] and the feature columns from the
    distinct priced rows: each table is its rows' table indexed by ``row_of``."""
    n, m = len(row_of), len(rows)
    times = np.array([r[0] for r in rows], np.float64).reshape(m, len(distinct))
    sources = np.array([r[1] for r in rows], dtype=object).reshape(m, len(distinct))
    column = {d: j for j, d in enumerate(distinct)}
    pick = [column[same_as[d]] for d in range(k)]   # identical devices share their profile's column
    op_s = times[:, pick][row_of] if m else np.zeros((n, k))
    source = sources[:, pick][row_of] if m else np.empty((n, k), dtype=object)
    kernels = np.array([r[2] for r in rows], bool).reshape(m, k)[row_of] if m else np.zeros((n, k), bool)
    # each feature column as numpy infers it (as pandas does from rows: int where all are int)
    features = {name: np.asarray(values)[row_of] for name, values in zip(OP_COLUMNS[3:], zip(*(r[3] for r in rows)))}
    return op_s, source, kernels, features


def op_signature(op, inputs: tuple, outs: tuple, feats: OpFeatures) -> tuple | None:
    """What an op's prices (and their spreads) depend on, hashable: its type, argument
    values, input and output types and features; None when an argument has no plain
    value (a nested net): such an op is priced on its own."""
    arguments = args_key(op.args)
    return None if arguments is None else (op.type, inputs, outs, feats, arguments)


def tensor_table(typed_net: TypedNet, precision: str | None = None) -> TensorTable:
    """One row per version of a blob: an in-place op's output is a new tensor (same name,
    its own producer), so a copy is priced for the version its reader actually reads.

    ``precision`` sizes each tensor by ``byte_scale``: a parameter is a blob of
    ``net.params`` (every version of it: an update writes the fp32 master weights);
    ``keeps_fp32`` where its producer's type is in ``AMP_FP32_OPS``. None: the net's own sizes."""
    net = typed_net.net
    ops = net.ops
    current: dict[str, int] = {}           # blob -> tensor id of its live version
    names: list[str] = []
    producer: list[int] = []
    nbytes: list[float] = []
    readers: list[list[int]] = []

    def new(b: str, p: int, t: TensorType | None) -> int:
        names.append(b)
        producer.append(p)
        nbytes.append(stored_nbytes(t, b, ops[p].type if p >= 0 else None, net.params, precision)
                      if t is not None else 0.0)
        readers.append([])
        return len(names) - 1

    def version(b: str, t: TensorType | None) -> int:
        tid = current.get(b)
        if tid is None:
            tid = current[b] = new(b, PARAMETER if b in net.params else EXTERNAL_INPUT, t)
        return tid

    for op in net.ops:
        for b, t in zip(op.inputs, _op_types(typed_net, op, "inputs")):
            users = readers[version(b, t)]
            if not users or users[-1] != op.index:
                users.append(op.index)
        for b, t in zip(op.outputs, _op_types(typed_net, op, "outputs")):
            current[b] = new(b, op.index, t)
    outputs = {version(b, typed_net.blobs.get(b)) for b in net.external_outputs}
    ext = np.zeros(len(names), bool)
    ext[list(outputs)] = True
    # keep tensors that are read or are external outputs (an unread output is scratch)
    counts = np.array([len(r) for r in readers], np.int64)
    keep = np.flatnonzero((counts > 0) | ext)
    ptr = np.zeros(len(keep) + 1, np.int64)
    ptr[1:] = np.cumsum(counts[keep])
    cons = np.fromiter((c for t in keep.tolist() for c in readers[t]), np.int64, count=int(ptr[-1]))
    return TensorTable([names[t] for t in keep.tolist()], np.array(producer, np.int64)[keep], ptr, cons,
                       np.array(nbytes, np.float64)[keep], ext[keep])


def _op_types(typed_net: TypedNet, op, which: str) -> tuple:
    """The types an op read or wrote, as shape inference saw them at that op."""
    seen = typed_net.op_inputs if which == "inputs" else typed_net.op_outputs
    if op.index < len(seen):
        return seen[op.index]
    return tuple(typed_net.blobs.get(b) for b in getattr(op, which))