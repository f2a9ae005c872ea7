"""Device profiles: the JSON records the cost model reads (schema in profiles/README.md).

A profile file names one device or a (host, GPU) pair. ``load_profile`` validates every
field and raises a ``ProfileError`` naming the file and the field (``devices[1].ops[3].
median_s``) for a wrong version, a missing field, a negative time or garbage;
``save_profile`` writes atomically. Profiles are plain records: the profiler writes
them, the cost model only reads them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from placer.documents import check_model, parse_document, read_document
from placer.documents.profiles import (DIRECTIONS, MEMORY_KINDS, PROFILE_SCHEMA_VERSION, Device,
                                       DeviceProfileDocument, OpEntry)
from placer.errors import ProfileError
from placer.fileio import atomic_write_text
from placer.types import shape_problem
from placer.types import TensorType

# Figures a datasheet profile must give a source for (when the figure is present).
SOURCED_FIGURES = ("peak_flops", "memory_bandwidth_bytes_per_s", "memory_capacity_bytes",
                   "launch_overhead_s", "link")
# Arguments that never change what an op computes or how fast (engine hints, names).
COST_NEUTRAL_ARGS = frozenset({
    "ws_nbytes_limit", "exhaustive_search", "shared_buffer", "cudnn_exhaustive_search",
    "use_cudnn", "init_params", "float16_compute", "name", "device_option",
})


@dataclass
class LinkCurve:
    """Copy time over sizes for one direction and host memory kind.

    ``points`` are measured (nbytes, seconds) pairs, sorted by size (may be empty);
    ``latency_s`` and ``bytes_per_s`` are the fitted (or datasheet) line
    t = latency + nbytes / bandwidth used outside the measured range.
    """

    latency_s: float
    bytes_per_s: float
    points: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class OpTiming:
    """A measured op: its key parts, the sample statistics, its roofline features, and how
    it was timed (``method``, one of ``placer.documents.profiles.TIMING_METHODS``)."""

    type: str
    inputs: tuple[TensorType, ...]
    args: dict[str, Any]
    samples: int
    median_s: float
    iqr_s: float
    flops: float = 0.0
    bytes: float = 0.0
    method: str = "isolated"

    @property
    def spread(self) -> float:
        """Run-to-run spread as a fraction of the median: IQR / median (0 for a zero median)."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0

    @property
    def key(self) -> str:
        return op_key(self.type, self.inputs, self.args)


@dataclass
class FamilyFit:
    """Fitted roofline of one op family on one device, with its quality.

    ``half_efficiency_rows`` (matrix-product families only, else None): the compute
    efficiency grows with the product's row count M as ``compute_efficiency * M / (M +
    half_efficiency_rows)``, so ``compute_efficiency`` is then the large-M limit.

    Quality: ``median_abs_pct_error`` and ``p90_abs_pct_error`` of the fit on its own
    points; ``spread_pct`` the median run-to-run spread (IQR / median) of those points;
    ``covered`` False when the median error is above ``FIT_MAX_MEDIAN_ERROR_PCT``: one
    roofline does not describe the group, and estimates from it are labelled so. The
    three are None / True in fits stored before they existed.
    """

    overhead_s: float
    compute_efficiency: float
    memory_efficiency: float
    points: int
    median_abs_pct_error: float
    half_efficiency_rows: float | None = None
    p90_abs_pct_error: float | None = None
    spread_pct: float | None = None
    covered: bool = True


@dataclass
class DeviceProfile:
    """One device's figures. ``source`` is {"kind": "measured", "host", "date"} or
    {"kind": "datasheet", "figures": {figure: origin}}."""

    kind: str
    name: str
    source: dict[str, Any]
    peak_flops: dict[str, float]
    memory_bandwidth_bytes_per_s: float
    memory_capacity_bytes: float
    launch_overhead_s: float
    link: dict[str, dict[str, LinkCurve]] = field(default_factory=dict)
    ops: dict[str, OpTiming] = field(default_factory=dict)
    fits: dict[str, FamilyFit] = field(default_factory=dict)
    fits_digest: str = ""   # fit_inputs_digest() of what ``fits`` were fitted to
    # GPU kernel-model figures and fitted constants (profiles/README.md, "kernel_model";
    # read by placer.costs.gpu_kernels), None where the profile has none
    kernel_model: dict[str, Any] | None = None

    def fit_inputs_digest(self, fit_version: int) -> str:
        """A digest of what the fits are made from: the entries (keys, medians, spreads,
        methods), the peaks, bandwidth and launch overhead they are relative to, and the
        version of the fitting code. Stored fits whose digest matches need no refitting."""
        import hashlib
        h = hashlib.sha256(f"fit-version {fit_version}\n{sorted(self.peak_flops.items())!r}\n"
                           f"{self.memory_bandwidth_bytes_per_s!r} {self.launch_overhead_s!r}\n".encode())
        for key in sorted(self.ops):
            t = self.ops[key]
            h.update(f"{key}\t{t.median_s!r}\t{t.iqr_s!r}\t{t.method}\n".encode())
        return h.hexdigest()[:16]

    def fits_are_current(self, fit_version: int) -> bool:
        """True when the stored fits were made from exactly this device's figures and
        entries by this fitting code."""
        return bool(self.fits) and self.fits_digest == self.fit_inputs_digest(fit_version)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype, else the float32 figure. Quantized uint8 tensors (Caffe2's
        Int8 ops) run at the "int8" peak where the profile has one (GPUs' dp4a / tensor
        cores); no shipped CPU profile has one, so the CPU prices them at its float32 rate."""
        return (self.peak_flops.get(dtype) or self.peak_flops.get(PEAK_ALIASES.get(dtype, ""))
                or self.peak_flops["float32"])


# dtypes priced at another dtype's peak
PEAK_ALIASES = {"uint8": "int8"}


@dataclass
class Profile:
    """A profile file: one device or a (cpu, gpu) pair."""

    name: str
    devices: dict[str, DeviceProfile]
    description: str = ""
    path: str = ""

    def device(self, kind: str) -> DeviceProfile:
        if kind not in self.devices:
            raise ProfileError(f"{self.path or self.name}: profile has no '{kind}' device "
                               f"(it has {', '.join(self.devices) or 'none'})",
                               hint=f"pass a profile with a {kind} device")
        return self.devices[kind]


# ---------------------------------------------------------------------------- keys

def cost_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments that can change an op's cost, as JSON-able values."""
    out = {}
    for name in sorted(args):
        value = _jsonable(args[name])
        if name not in COST_NEUTRAL_ARGS and value is not None:
            out[name] = value
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        return value
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        return None if any(v is None for v in items) else items
    return None  # nested nets and other messages do not enter the key


def op_key(op_type: str, inputs: Sequence[TensorType | None], args: Mapping[str, Any]) -> str:
    """`Conv|float32[1,3,224,224];float32[64,3,7,7]|{"kernel": 7, ...}`: one per distinct cost."""
    shapes = ";".join("?" if t is None else str(t) for t in inputs)
    return f"{op_type}|{shapes}|{json.dumps(cost_args(args), sort_keys=True)}"


# ---------------------------------------------------------------------- validation

PROFILE_HINT = "fix the field or re-create the profile with `placer profile`"


def _fail(path: str, where: str, msg: str) -> ProfileError:
    return ProfileError(f"{path}: field '{where}': {msg}", hint=PROFILE_HINT)


def _dtype_name(name: str) -> bool:
    """A numpy dtype written the way placer writes it (``float32``, ``int64``, ...)."""
    import numpy as np
    try:
        return str(np.dtype(name)) == name
    except TypeError:
        return False


def profile_from_dict(data: Any, path: str = "<profile>") -> Profile:
    """Check a decoded JSON document against ``DeviceProfileDocument`` and what a model
    cannot say (one device per kind, datasheet origins, dtype names, addressable shapes),
    and build the Profile."""
    return profile_from_document(check_model(data, DeviceProfileDocument, path, ProfileError, PROFILE_HINT), path)


def profile_from_document(doc: DeviceProfileDocument, path: str) -> Profile:
    devices: dict[str, DeviceProfile] = {}
    for i, raw in enumerate(doc.devices):
        dev = _device_from_document(path, raw, f"devices[{i}]")
        if dev.kind in devices:
            raise _fail(path, f"devices[{i}].kind", f"a second '{dev.kind}' device in one file")
        devices[dev.kind] = dev
    return Profile(name=doc.name, devices=devices, description=doc.description or "", path=path)


def _device_from_document(path: str, raw: Device, where: str) -> DeviceProfile:
    _check_origins(path, raw, f"{where}.source")
    dev = DeviceProfile(
        kind=raw.kind, name=raw.name, source=raw.source.model_dump(),
        peak_flops=raw.peak_flops.model_dump(), memory_bandwidth_bytes_per_s=raw.memory_bandwidth_bytes_per_s,
        memory_capacity_bytes=raw.memory_capacity_bytes, launch_overhead_s=raw.launch_overhead_s)
    if raw.link is not None:
        dev.link = {d: {m: LinkCurve(c.latency_s, c.bytes_per_s, sorted((int(b), t) for b, t in c.points))
                        for m, c in ((m, getattr(getattr(raw.link, d), m)) for m in MEMORY_KINDS)}
                    for d in DIRECTIONS}
    for i, op_raw in enumerate(raw.ops):
        timing = _op_timing(path, op_raw, f"{where}.ops[{i}]")
        dev.ops[timing.key] = timing
    dev.fits_digest = raw.fits_digest
    if raw.kernel_model is not None:
        dev.kernel_model = raw.kernel_model.model_dump()
    for fam, f in raw.fits.items():
        dev.fits[fam] = FamilyFit(
            overhead_s=f.overhead_s, compute_efficiency=f.compute_efficiency,
            memory_efficiency=f.memory_efficiency, points=int(f.points),
            median_abs_pct_error=f.median_abs_pct_error, half_efficiency_rows=f.half_efficiency_rows,
            p90_abs_pct_error=f.p90_abs_pct_error, spread_pct=f.spread_pct, covered=f.covered)
    return dev


def _check_origins(path: str, device: Device, where: str) -> None:
    """A datasheet profile names the origin of every figure it gives."""
    if device.source.kind != "datasheet":
        return
    figures = device.source.figures
    for fig in SOURCED_FIGURES:
        if fig in device.model_fields_set and not (isinstance(figures.get(fig), str) and figures[fig].strip()):
            raise _fail(path, f"{where}.figures.{fig}", "a datasheet figure needs its origin")


def _op_timing(path: str, raw: OpEntry, where: str) -> OpTiming:
    inputs = []
    for j, t in enumerate(raw.inputs):
        w = f"{where}.inputs[{j}]"
        if shape_problem(t.shape):
            raise _fail(path, f"{w}.shape", shape_problem(t.shape))
        if not _dtype_name(t.dtype):
            raise _fail(path, f"{w}.dtype", f"expected a numpy dtype name (float32, int64, ...), "
                                            f"found {t.dtype!r:.40}")
        inputs.append(TensorType(tuple(t.shape), t.dtype))
    # entries written before ``method`` existed were every one timed alone (its default)
    return OpTiming(type=raw.type, inputs=tuple(inputs), args=dict(raw.args), samples=int(raw.samples),
                    median_s=raw.median_s, iqr_s=raw.iqr_s, flops=raw.flops, bytes=raw.bytes, method=raw.method)


# ------------------------------------------------------------------ load and save

def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file."""
    data = read_document(path, "profile", ProfileError, hint="check the path, or re-create it with `placer profile`")
    return profile_from_dict(data, str(path))


def profile_to_dict(profile: Profile) -> dict:
    return {"schema_version": PROFILE_SCHEMA_VERSION, "name": profile.name,
            "description": profile.description,
            "devices": [_device_to_dict(d) for d in profile.devices.values()]}


def _device_to_dict(d: DeviceProfile) -> dict:
    out: dict[str, Any] = {
        "kind": d.kind, "name": d.name, "source": d.source, "peak_flops": d.peak_flops,
        "memory_bandwidth_bytes_per_s": d.memory_bandwidth_bytes_per_s,
        "memory_capacity_bytes": d.memory_capacity_bytes, "launch_overhead_s": d.launch_overhead_s}
    if d.link:
        out["link"] = {dr: {m: {"latency_s": c.latency_s, "bytes_per_s": c.bytes_per_s,
                                "points": [list(p) for p in c.points]}
                            for m, c in mems.items()} for dr, mems in d.link.items()}
    if d.ops:
        out["ops"] = [{"type": t.type,
                       "inputs": [{"shape": list(x.shape), "dtype": x.dtype} for x in t.inputs],
                       "args": cost_args(t.args), "samples": t.samples, "median_s": t.median_s,
                       "iqr_s": t.iqr_s, "flops": t.flops, "bytes": t.bytes, "method": t.method}
                      for t in sorted(d.ops.values(), key=lambda t: t.key)]
    if d.kernel_model is not None:
        out["kernel_model"] = d.kernel_model
    if d.fits:
        out["fits"] = {fam: {k: v for k, v in vars(f).items() if v is not None}
                       for fam, f in sorted(d.fits.items())}
        if d.fits_digest:
            out["fits_digest"] = d.fits_digest
    return out


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write atomically (a crash leaves the previous file) and validate what was written."""
    data = profile_to_dict(profile)
    text = json.dumps(data, indent=1) + "\n"
    profile_from_dict(parse_document(text.encode(), str(path), "profile", ProfileError), str(path))  # never write
    return atomic_write_text(path, text)                                           # a file we cannot read
