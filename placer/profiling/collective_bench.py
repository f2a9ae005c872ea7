"""Collectives measured on a multi-GPU host through cupy's NCCL bindings, as nccl-tests does.

For each collective and size S (nccl-tests' size: one rank's buffer for all-reduce,
broadcast and all-to-all, the gathered tensor for all-gather and reduce-scatter), every
GPU of the set runs its part of one NCCL call inside ncclGroupStart/End, on a stream of
its own, between two CUDA events on that stream; the time of a run is the slowest GPU's,
a point the median of ``repeats`` runs after one warm-up. From the points:

- algbw = S / t and busbw = algbw * (2(n-1)/n for all-reduce, (n-1)/n for all-gather,
  reduce-scatter, all-to-all, 1 for broadcast), nccl-tests' definitions;
- a line t = latency + (bus bytes: S times that factor) / B fitted per collective
  (``link.fit_line``, relative error), whose B is the bus bandwidth the cost model uses
  (``placer.hardware.collectives``), and whose latency is the model's latency term;
- beside them, when a machine profile is given, the model's own time and busbw at every
  size (``compare``), their ratio above 1 where the machine is slower than its profile.

The records go to a JSON file (``kind: "collectives"``); ``placer profile --collectives``
writes it. Without two GPUs or NCCL this is a one-line DeviceError.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import json
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from placer.hardware.collectives import CollectiveModel, bus_bytes
from placer.documents import check_model, read_document
from placer.documents.collectives import MEASUREMENTS_KIND, MEASUREMENTS_VERSION, Measurements
from placer.errors import DeviceError, ProfileError
from placer.fileio import atomic_write_text
from placer.ops.collective_kernels import _NCCL_DTYPES, SUM
from placer.profiling.link import fit_line
from placer.runtime.devices import import_cupy

KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall")
SIZES = [4096 * 4 ** k for k in range(10)]   # 4 KiB .. 1 GiB, powers of 4 (as --link)
FLOAT32 = _NCCL_DTYPES["float32"]


@dataclass
class CollectivePoint:
    kind: str
    nbytes: int
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass
class CollectiveMeasurements:
    """What one ``placer profile --collectives`` measured on one set of GPUs."""

    gpus: list[int]
    gpu_names: list[str]
    nccl_version: int
    points: list[CollectivePoint] = field(default_factory=list)
    fits: dict[str, dict[str, float]] = field(default_factory=dict)
    model: list[dict[str, Any]] = field(default_factory=list)
    host: str = ""
    date: str = ""


def nccl_for(cupy: Any) -> Any:
    """cupy's NCCL module, or a DeviceError saying why not."""
    with warnings.catch_warnings():             # cupy warns when libnccl is missing
        warnings.simplefilter("ignore")
        try:
            nccl = importlib.import_module("cupy.cuda.nccl")
        except ImportError as e:
            raise DeviceError(f"cupy has no NCCL bindings ({e})",
                              hint="pip install nvidia-nccl-cu12 (the NCCL cupy was built for)") from None
    if not getattr(nccl, "available", False):
        raise DeviceError("cupy finds no NCCL library", hint="pip install nvidia-nccl-cu12")
    return nccl


def measure_collectives(gpus: Sequence[int] | None = None, sizes: Sequence[int] | None = None,
                        kinds: Sequence[str] = KINDS, repeats: int = 5, progress: Any = None,
                        cupy: Any = None) -> CollectiveMeasurements:
    """Time every collective of ``kinds`` at every size over ``gpus`` (default: all visible)."""
    if cupy is None:
        cupy = import_cupy()
    count = cupy.cuda.runtime.getDeviceCount()
    gpus = list(range(count)) if gpus is None else [int(g) for g in gpus]
    if len(gpus) < 2 or any(not 0 <= g < count for g in gpus) or len(set(gpus)) != len(gpus):
        raise DeviceError(f"collectives need two or more distinct visible GPUs; asked for {gpus}, "
                          f"{count} visible", hint="run on a host with several GPUs")
    nccl = nccl_for(cupy)
    comms = nccl.NcclCommunicator.initAll(gpus)
    streams = []
    for g in gpus:
        with cupy.cuda.Device(g):
            streams.append(cupy.cuda.Stream(non_blocking=True))
    names = [_gpu_name(cupy, g) for g in gpus]
    out = CollectiveMeasurements(gpus, names, int(nccl.get_version()))
    done = 0
    for kind in kinds:
        for size in sizes or SIZES:
            t = _median_time(cupy, nccl, comms, streams, gpus, kind, size, repeats)
            out.points.append(CollectivePoint(kind, int(size), t, size / t, bus_bytes(kind, size, len(gpus)) / t))
            done += 1
            if progress is not None:
                progress.update(done)
    out.fits = fit_collectives(out.points, len(gpus))
    return out


def _gpu_name(cupy: Any, g: int) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(g)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _buffers(cupy: Any, kind: str, size: int, n: int) -> tuple[int, int]:
    """(send, receive) float32 counts of one rank for S = ``size`` bytes."""
    count = max(size // 4 // n * n, n)        # divisible by n, as nccl-tests rounds
    return {"allreduce": (count, count), "broadcast": (count, count), "alltoall": (count, count),
            "allgather": (count // n, count), "reducescatter": (count, count // n)}[kind]


def _median_time(cupy, nccl, comms, streams, gpus, kind: str, size: int, repeats: int) -> float:
    n = len(gpus)
    send_count, recv_count = _buffers(cupy, kind, size, n)
    sends, recvs = [], []
    for g in gpus:
        with cupy.cuda.Device(g):
            sends.append(cupy.ones(send_count, dtype=np.float32))
            recvs.append(cupy.empty(recv_count, dtype=np.float32))
    samples = []
    for r in range(repeats + 1):               # the first run sets NCCL's buffers up
        starts, ends = [], []
        for g, s in zip(gpus, streams):
            with cupy.cuda.Device(g):
                starts.append(cupy.cuda.Event())
                starts[-1].record(s)
        nccl.groupStart()
        try:
            for rank, (g, comm, s, x, y) in enumerate(zip(gpus, comms, streams, sends, recvs)):
                with cupy.cuda.Device(g):
                    _call(comm, kind, rank, n, x, y, s.ptr)
        finally:
            nccl.groupEnd()
        for g, s in zip(gpus, streams):
            with cupy.cuda.Device(g):
                ends.append(cupy.cuda.Event())
                ends[-1].record(s)
        for e in ends:
            e.synchronize()
        if r:
            samples.append(max(cupy.cuda.get_elapsed_time(a, b) for a, b in zip(starts, ends)) / 1e3)
    return float(np.median(samples))


def _call(comm, kind: str, rank: int, n: int, x, y, stream: int) -> None:
    if kind == "allreduce":
        comm.allReduce(x.data.ptr, y.data.ptr, x.size, FLOAT32, SUM, stream)
    elif kind == "broadcast":
        comm.broadcast(x.data.ptr, y.data.ptr, x.size, FLOAT32, 0, stream)
    elif kind == "allgather":
        comm.allGather(x.data.ptr, y.data.ptr, x.size, FLOAT32, stream)
    elif kind == "reducescatter":
        comm.reduceScatter(x.data.ptr, y.data.ptr, y.size, FLOAT32, SUM, stream)
    else:                                      # all-to-all: a send and a receive per peer
        block = x.size // n
        for peer in range(n):
            comm.send(x.data.ptr + 4 * peer * block, block, FLOAT32, peer, stream)
            comm.recv(y.data.ptr + 4 * peer * block, block, FLOAT32, peer, stream)


def fit_collectives(points: Sequence[CollectivePoint], n: int) -> dict[str, dict[str, float]]:
    """Per collective: t = latency + (bus bytes) / B, fitted; B is the bus bandwidth."""
    fits = {}
    for kind in dict.fromkeys(p.kind for p in points):
        pts = [(bus_bytes(kind, p.nbytes, n), p.time_s) for p in points if p.kind == kind]
        if len(pts) >= 2:
            latency, bandwidth = fit_line(pts)
            fits[kind] = {"latency_s": latency, "bus_bytes_per_s": bandwidth}
    return fits


def compare(measured: CollectiveMeasurements, machine) -> list[dict[str, Any]]:
    """Every measured point beside the cost model's on ``machine`` (its GPUs ``measured.gpus``):
    time and busbw of both, and measured / model time."""
    model = CollectiveModel(machine)
    ranks = [machine.index(f"cuda:{g}") for g in measured.gpus]
    rows = []
    for p in measured.points:
        c = model.time(p.kind, p.nbytes, ranks)
        rows.append({"kind": p.kind, "nbytes": p.nbytes, "measured_s": p.time_s, "model_s": c.time_s,
                     "ratio": p.time_s / c.time_s if c.time_s else float("inf"),
                     "measured_busbw": p.busbw_bytes_per_s, "model_busbw": c.bus_bytes_per_s,
                     "model_algorithm": c.algorithm})
    return rows


def save_measurements(m: CollectiveMeasurements, path: str) -> None:
    data = {"schema_version": MEASUREMENTS_VERSION, "kind": MEASUREMENTS_KIND, **asdict(m)}
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


def load_measurements(path: str) -> CollectiveMeasurements:
    data = read_document(path, "collectives measurement file", ProfileError)
    if (not isinstance(data, dict) or data.get("kind") != MEASUREMENTS_KIND
            or data.get("schema_version") != MEASUREMENTS_VERSION):
        raise ProfileError(f"{path}: not a collectives measurement file (kind \"{MEASUREMENTS_KIND}\", "
                           f"schema_version {MEASUREMENTS_VERSION})")
    doc = check_model(data, Measurements, str(path), ProfileError)
    points = [CollectivePoint(p.kind, p.nbytes, p.time_s, p.algbw_bytes_per_s, p.busbw_bytes_per_s)
              for p in doc.points]
    return CollectiveMeasurements(doc.gpus, doc.gpu_names, doc.nccl_version, points, doc.fits, doc.model,
                                  doc.host, doc.date)


def today() -> str:
    return _dt.date.today().isoformat()
