"""Device profiles: the JSON records the cost model reads (schema in profiles/README.md).

A profile file names one device or a (host, GPU) pair. ``load_profile`` validates every
field and raises a ``ProfileError`` naming the file and the field (``devices[1].ops[3].
median_s``) for a wrong version, a missing field, a negative time or garbage;
``save_profile`` writes atomically. Profiles are plain records: the profiler writes
them, the cost model only reads them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from placer.constants import PROFILE_SCHEMA_VERSION
from placer.errors import ProfileError
from placer.fileio import atomic_write_text, note_read
from placer.formats import shape_problem
from placer.types import TensorType

DIRECTIONS = ("h2d", "d2h")
# How an op entry was timed: "in-network" (the whole net run by the executor, each op
# after its producer, on the inputs the previous op left, allocating its outputs: what a
# run sees) or "isolated" (the op alone, called again and again on the same inputs:
# warm caches, no producer). Entries written before the field existed were isolated.
TIMING_METHODS = ("in-network", "isolated")
MEMORY_KINDS = ("pinned", "pageable")
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
    it was timed (``method``, one of ``TIMING_METHODS``)."""

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
        """Peak FLOP/s for a dtype, else the float32 figure."""
        return self.peak_flops.get(dtype) or self.peak_flops["float32"]


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

class _Reader:
    """Typed field access that names the file and the field in every error."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, msg: str) -> ProfileError:
        return ProfileError(f"{self.path}: field '{where}': {msg}",
                            hint="fix the field or re-create the profile with `placer profile`")

    def get(self, obj: Mapping, key: str, where: str, kind: type | tuple, optional=False):
        at = f"{where}.{key}" if where else key
        if not isinstance(obj, Mapping):
            raise self.fail(where or "<top>", f"expected an object, found {type(obj).__name__}")
        if key not in obj:
            if optional:
                return None
            raise self.fail(at, "missing")
        value = obj[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(at, f"expected {_kind_name(kind)}, found {value!r}")
        if not isinstance(value, kind):
            raise self.fail(at, f"expected {_kind_name(kind)}, found {value!r:.60}")
        return value

    def number(self, obj: Mapping, key: str, where: str, optional=False, positive=False):
        value = self.get(obj, key, where, (int, float), optional)
        if value is None:
            return None
        at = f"{where}.{key}" if where else key
        if not _finite(value) or value < 0 or (positive and value == 0):
            raise self.fail(at, f"must be a {'positive' if positive else 'non-negative'} "
                                f"finite number, found {value!r}")
        return float(value)


def _finite(value) -> bool:
    """``math.isfinite`` that also says False for an int too large for a float (10**400)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _dtype_name(name: str) -> bool:
    """A numpy dtype written the way placer writes it (``float32``, ``int64``, ...)."""
    import numpy as np
    try:
        return str(np.dtype(name)) == name
    except TypeError:
        return False


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a number", float: "a number", str: "a string", list: "a list",
             dict: "an object", Mapping: "an object", bool: "true/false"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def profile_from_dict(data: Any, path: str = "<profile>") -> Profile:
    """Validate a decoded JSON document and build the Profile."""
    r = _Reader(path)
    if not isinstance(data, Mapping):
        raise r.fail("<top>", f"expected a JSON object, found {type(data).__name__}")
    version = r.get(data, "schema_version", "", int)
    if version != PROFILE_SCHEMA_VERSION:
        raise r.fail("schema_version", f"version {version} is not supported "
                                       f"(this placer reads version {PROFILE_SCHEMA_VERSION})")
    name = r.get(data, "name", "", str)
    description = r.get(data, "description", "", str, optional=True) or ""
    devices_raw = r.get(data, "devices", "", list)
    if not devices_raw:
        raise r.fail("devices", "a profile needs at least one device")
    devices: dict[str, DeviceProfile] = {}
    for i, raw in enumerate(devices_raw):
        dev = _device_from_dict(r, raw, f"devices[{i}]")
        if dev.kind in devices:
            raise r.fail(f"devices[{i}].kind", f"a second '{dev.kind}' device in one file")
        devices[dev.kind] = dev
    return Profile(name=name, devices=devices, description=description, path=path)


def _device_from_dict(r: _Reader, raw: Any, where: str) -> DeviceProfile:
    kind = r.get(raw, "kind", where, str)
    if kind not in ("cpu", "gpu"):
        raise r.fail(f"{where}.kind", f"must be 'cpu' or 'gpu', found {kind!r}")
    source = _source(r, r.get(raw, "source", where, Mapping), f"{where}.source", raw)
    peaks_raw = r.get(raw, "peak_flops", where, Mapping)
    peaks = {dt: r.number(peaks_raw, dt, f"{where}.peak_flops", positive=True) for dt in peaks_raw}
    if "float32" not in peaks:
        raise r.fail(f"{where}.peak_flops.float32", "missing")
    dev = DeviceProfile(
        kind=kind, name=r.get(raw, "name", where, str), source=source, peak_flops=peaks,
        memory_bandwidth_bytes_per_s=r.number(raw, "memory_bandwidth_bytes_per_s", where, positive=True),
        memory_capacity_bytes=r.number(raw, "memory_capacity_bytes", where, positive=True),
        launch_overhead_s=r.number(raw, "launch_overhead_s", where))
    link_raw = r.get(raw, "link", where, Mapping, optional=True)
    if link_raw is not None:
        dev.link = _link(r, link_raw, f"{where}.link")
    for i, op_raw in enumerate(r.get(raw, "ops", where, list, optional=True) or []):
        timing = _op_timing(r, op_raw, f"{where}.ops[{i}]")
        dev.ops[timing.key] = timing
    dev.fits_digest = r.get(raw, "fits_digest", where, str, optional=True) or ""
    for fam, fit_raw in (r.get(raw, "fits", where, Mapping, optional=True) or {}).items():
        w = f"{where}.fits.{fam}"
        dev.fits[fam] = FamilyFit(
            overhead_s=r.number(fit_raw, "overhead_s", w),
            compute_efficiency=r.number(fit_raw, "compute_efficiency", w, positive=True),
            memory_efficiency=r.number(fit_raw, "memory_efficiency", w, positive=True),
            points=int(r.number(fit_raw, "points", w)),
            median_abs_pct_error=r.number(fit_raw, "median_abs_pct_error", w),
            half_efficiency_rows=r.number(fit_raw, "half_efficiency_rows", w, optional=True, positive=True),
            p90_abs_pct_error=r.number(fit_raw, "p90_abs_pct_error", w, optional=True),
            spread_pct=r.number(fit_raw, "spread_pct", w, optional=True),
            covered=_flag(r, fit_raw, "covered", w, default=True))
    return dev


def _flag(r: _Reader, obj: Mapping, key: str, where: str, default: bool) -> bool:
    value = r.get(obj, key, where, bool, optional=True)
    return default if value is None else value


def _source(r: _Reader, src: Mapping, where: str, device_raw: Mapping) -> dict:
    kind = r.get(src, "kind", where, str)
    if kind == "measured":
        r.get(src, "host", where, str)
        r.get(src, "date", where, str)
    elif kind == "datasheet":
        figures = r.get(src, "figures", where, Mapping)
        for fig in SOURCED_FIGURES:
            if fig in device_raw and not (isinstance(figures.get(fig), str) and figures[fig].strip()):
                raise r.fail(f"{where}.figures.{fig}", "a datasheet figure needs its origin")
    else:
        raise r.fail(f"{where}.kind", f"must be 'measured' or 'datasheet', found {kind!r}")
    return dict(src)


def _link(r: _Reader, raw: Mapping, where: str) -> dict[str, dict[str, LinkCurve]]:
    link: dict[str, dict[str, LinkCurve]] = {}
    for direction in DIRECTIONS:
        d_raw = r.get(raw, direction, where, Mapping)
        link[direction] = {}
        for mem in MEMORY_KINDS:
            w = f"{where}.{direction}"
            c_raw = r.get(d_raw, mem, w, Mapping)
            w = f"{w}.{mem}"
            points = []
            for j, pt in enumerate(r.get(c_raw, "points", w, list, optional=True) or []):
                if (not isinstance(pt, list) or len(pt) != 2
                        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pt)
                        or not _finite(pt[0]) or pt[0] <= 0 or pt[1] < 0 or not _finite(pt[1])):
                    raise r.fail(f"{w}.points[{j}]", f"expected [bytes > 0, seconds >= 0], found {pt!r:.60}")
                points.append((int(pt[0]), float(pt[1])))
            link[direction][mem] = LinkCurve(
                latency_s=r.number(c_raw, "latency_s", w),
                bytes_per_s=r.number(c_raw, "bytes_per_s", w, positive=True),
                points=sorted(points))
    return link


def _op_timing(r: _Reader, raw: Any, where: str) -> OpTiming:
    inputs = []
    for j, t in enumerate(r.get(raw, "inputs", where, list)):
        w = f"{where}.inputs[{j}]"
        shape = r.get(t, "shape", w, list)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise r.fail(f"{w}.shape", f"expected non-negative integers, found {shape!r:.60}")
        if shape_problem(shape):
            raise r.fail(f"{w}.shape", shape_problem(shape))
        dtype = r.get(t, "dtype", w, str)
        if not _dtype_name(dtype):
            raise r.fail(f"{w}.dtype", f"expected a numpy dtype name (float32, int64, ...), found {dtype!r:.40}")
        inputs.append(TensorType(tuple(shape), dtype))
    return OpTiming(
        type=r.get(raw, "type", where, str), inputs=tuple(inputs),
        args=dict(r.get(raw, "args", where, Mapping, optional=True) or {}),
        samples=int(r.number(raw, "samples", where, positive=True)),
        median_s=r.number(raw, "median_s", where), iqr_s=r.number(raw, "iqr_s", where),
        flops=r.number(raw, "flops", where, optional=True) or 0.0,
        bytes=r.number(raw, "bytes", where, optional=True) or 0.0,
        method=_method(r, raw, where))


def _method(r: _Reader, raw: Mapping, where: str) -> str:
    method = r.get(raw, "method", where, str, optional=True)
    if method is None:
        return "isolated"  # written before the field existed: every entry was timed alone
    if method not in TIMING_METHODS:
        raise r.fail(f"{where}.method", f"must be one of {', '.join(TIMING_METHODS)}, found {method!r}")
    return method


# ------------------------------------------------------------------ load and save

def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file."""
    path = Path(path)
    note_read(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror or e}",
                           hint="check the path, or list shipped profiles in profiles/") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not a JSON profile: the file is not UTF-8 text",
                           hint="re-create it with `placer profile`") from None
    try:
        data = json.loads(text)
    except RecursionError:  # the decoder recurses per level of nesting
        raise ProfileError(f"{path}: not a JSON profile: nested too deeply to read",
                           hint="re-create it with `placer profile`") from None
    except ValueError as e:  # JSONDecodeError, and integers past Python's digit limit
        raise ProfileError(f"{path}: not a JSON profile: {e}",
                           hint="re-create it with `placer profile`") from None
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
    if d.fits:
        out["fits"] = {fam: {k: v for k, v in vars(f).items() if v is not None}
                       for fam, f in sorted(d.fits.items())}
        if d.fits_digest:
            out["fits_digest"] = d.fits_digest
    return out


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write atomically (a crash leaves the previous file) and validate what was written."""
    data = profile_to_dict(profile)
    profile_from_dict(json.loads(json.dumps(data)), str(path))  # never write a file we cannot read
    return atomic_write_text(path, json.dumps(data, indent=1) + "\n")
