"""Host<->GPU copy curves: H2D and D2H, pinned and pageable host memory, 4 KiB .. 1 GiB;
and, on a host with several GPUs, GPU->GPU curves for every ordered pair (``measure_peers``).

Each size is copied a few times between CUDA events through cupy; the median is a point
of the curve, and a line t = latency + bytes / bandwidth is fitted to the points (least
squares on relative error, so small copies weigh as much as large ones). The cost model
interpolates the points and uses the line outside them.

``compare_link`` sets measured curves against a profile's (a datasheet's, say): at every
measured size, the measured time over the time the profile's curve gives there.
"""
from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from placer.costs.model import curve_time
from placer.documents.profiles import DIRECTIONS, MEMORY_KINDS, PROFILE_SCHEMA_VERSION
from placer.hardware.device_profile import LinkCurve
from placer.runtime.devices import import_cupy

SIZES = [4096 * 4 ** k for k in range(10)]  # 4 KiB, 16 KiB, ..., 1 GiB (powers of 4)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(latency_s, bytes_per_s) of t = latency + n / bandwidth, minimising relative error."""
    n = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (latency, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_bw <= 0:  # degenerate (all sizes equally fast): take the largest copy's rate
        inv_bw = t[-1] / n[-1]
    return max(float(latency), 0.0), float(1.0 / inv_bw)


def measure_link(device_index: int = 0, sizes: list[int] | None = None, repeats: int = 5,
                 progress=None) -> dict[str, dict[str, LinkCurve]]:
    """Copy curves of one GPU (a DeviceError when there is no GPU)."""
    cupy = import_cupy()
    sizes = sizes or SIZES
    link: dict[str, dict[str, LinkCurve]] = {d: {} for d in DIRECTIONS}
    done = 0
    with cupy.cuda.Device(device_index):
        for mem in MEMORY_KINDS:
            for direction in DIRECTIONS:
                points = []
                for size in sizes:
                    points.append((size, _median_copy_s(cupy, size, direction, mem == "pinned", repeats)))
                    done += 1
                    if progress is not None:
                        progress.update(done)
                latency, bandwidth = fit_line(points)
                link[direction][mem] = LinkCurve(latency, bandwidth, points)
    return link


def _median_copy_s(cupy: Any, size: int, direction: str, pinned: bool, repeats: int) -> float:
    if pinned:
        mem = cupy.cuda.alloc_pinned_memory(size)
        host = np.frombuffer(mem, dtype=np.uint8, count=size)
    else:
        host = np.empty(size, dtype=np.uint8)
    host[:] = 1
    dev = cupy.empty(size, dtype=np.uint8)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for i in range(repeats + 1):  # the first copy warms up page tables and the driver
        start.record()
        if direction == "h2d":
            dev.set(host)
        else:
            dev.get(out=host)
        end.record()
        end.synchronize()
        if i:
            samples.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    del dev
    return float(np.median(samples))


def measure_peers(gpus: list[int], sizes: list[int] | None = None, repeats: int = 5,
                  progress=None) -> list[dict[str, Any]]:
    """GPU -> GPU copy curves for every ordered pair of ``gpus`` (cupy device numbers), as
    a machine profile's ``peer_curves``: ``{"src", "dst", "p2p", "latency_s",
    "bytes_per_s", "points"}`` with ``src``/``dst`` the positions in ``gpus``. ``p2p`` is
    ``deviceCanAccessPeer``; where it holds, peer access is enabled first, so the copy is
    a direct one, else the driver stages it through host memory (what a run does too)."""
    cupy = import_cupy()
    sizes = sizes or SIZES

    def p2p(a: int, b: int) -> bool:
        if not cupy.cuda.runtime.deviceCanAccessPeer(a, b):
            return False
        with cupy.cuda.Device(a):
            try:
                cupy.cuda.runtime.deviceEnablePeerAccess(b)
            except cupy.cuda.runtime.CUDARuntimeError as e:   # already enabled: fine
                if "PeerAccessAlreadyEnabled" not in str(e):
                    raise
        return True

    def copy_s(a: int, b: int, size: int) -> float:
        with cupy.cuda.Device(b):
            dst = cupy.empty(size, dtype=np.uint8)
        with cupy.cuda.Device(a):
            src = cupy.ones(size, dtype=np.uint8)
            stream = cupy.cuda.Stream(non_blocking=True)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            samples = []
            for i in range(repeats + 1):     # the first copy warms up the path
                start.record(stream)
                cupy.cuda.runtime.memcpyPeerAsync(dst.data.ptr, b, src.data.ptr, a, size, stream.ptr)
                end.record(stream)
                end.synchronize()
                if i:
                    samples.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        del src, dst
        return float(np.median(samples))

    return peer_curves(gpus, sizes, p2p, copy_s, progress)


def peer_curves(gpus: list[int], sizes: list[int], p2p, copy_s, progress=None) -> list[dict[str, Any]]:
    """``measure_peers``' curves from ``p2p(a, b)`` and ``copy_s(a, b, size)`` (seconds):
    the points, and the line fitted to them (``fit_line``)."""
    out, done = [], 0
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if a == b:
                continue
            direct = bool(p2p(a, b))
            points = []
            for size in sizes:
                points.append((int(size), float(copy_s(a, b, size))))
                done += 1
                if progress is not None:
                    progress.update(done)
            latency, bandwidth = fit_line(points)
            out.append({"src": i, "dst": j, "p2p": direct, "latency_s": latency, "bytes_per_s": bandwidth,
                        "points": [list(p) for p in points]})
    return out


def machine_profile(name: str, host: str, gpu: str, curves: list[dict[str, Any]], n_gpus: int,
                    where: str) -> dict[str, Any]:
    """A machine profile of ``n_gpus`` GPUs of profile ``gpu`` on host profile ``host``
    with the measured ``curves`` (``measure_peers``): pairs without them (none, normally)
    default to P2P over PCIe when every measured pair had it, else to staged copies."""
    all_p2p = bool(curves) and all(c["p2p"] for c in curves)
    return {"schema_version": PROFILE_SCHEMA_VERSION, "kind": "machine", "name": name,
            "description": f"{n_gpus} GPUs with GPU->GPU copies measured by placer profile --link",
            "host": host, "gpus": [{"profile": gpu, "count": n_gpus}],
            "peer_default": "pcie-p2p" if all_p2p else "staged", "peer_curves": curves,
            "sources": {"peer_curves": f"measured by placer profile --link on {where}, "
                                       f"{datetime.date.today().isoformat()} (p2p: deviceCanAccessPeer)"}}


def compare_link(measured: dict[str, dict[str, LinkCurve]],
                 reference: dict[str, dict[str, LinkCurve]]) -> list[dict[str, Any]]:
    """One record per curve present in both: the fitted lines side by side, and per measured
    size the measured time, the reference curve's time (``placer.costs.model.curve_time``: the cost
    model's own reading of it) and their ratio (above 1: slower than the reference says)."""
    out = []
    for direction in DIRECTIONS:
        for mem in MEMORY_KINDS:
            mine, ref = measured.get(direction, {}).get(mem), reference.get(direction, {}).get(mem)
            if mine is None or ref is None or not mine.points:
                continue
            points = [{"nbytes": n, "measured_s": t, "reference_s": curve_time(ref, n),
                       "ratio": t / curve_time(ref, n)} for n, t in mine.points]
            out.append({"direction": direction, "memory": mem,
                        "measured": {"latency_s": mine.latency_s, "bytes_per_s": mine.bytes_per_s},
                        "reference": {"latency_s": ref.latency_s, "bytes_per_s": ref.bytes_per_s},
                        "points": points})
    return out
