"""A quick characterisation of the host CPU for the roofline.

Three numbers, each a best-of-a-few (peak figures, the roofline divides by them):
float32 GEMM FLOP/s (numpy matmul of n x n), streaming bandwidth (a copy between two
arrays much larger than the caches: bytes read + written per second), and the per-call
overhead of a numpy op on a tiny array (what a cheap op costs at least).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import time

import numpy as np

from placer.hardware.device_profile import DeviceProfile
from placer.ops import registry
from placer.types import Args


def gemm_flops(n: int = 1024, repeats: int = 3, clock=time.perf_counter) -> float:
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b  # warm-up: thread pool start, page faults
    best = min(_seconds(lambda: a @ b, clock) for _ in range(repeats))
    return 2.0 * n ** 3 / best


def stream_bytes_per_s(nbytes: int = 128 * 2 ** 20, repeats: int = 3, clock=time.perf_counter) -> float:
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_seconds(lambda: np.copyto(dst, src), clock) for _ in range(repeats))
    return 2.0 * src.nbytes / best


def call_overhead_s(calls: int = 2000) -> float:
    """Seconds per call of the registry's Relu kernel on one element (np.add without it):
    what the cheapest op costs through the same path the profiler and runtime use."""
    x = np.ones(1, dtype=np.float32)
    fn = lambda: np.add(x, x)  # noqa: E731
    try:
        relu = registry.get("Relu")
        if relu is not None and relu.kernel is not None:
            args = Args({}, op="Relu")
            fn = lambda: relu.kernel(np, [x], args)  # noqa: E731
    except Exception:
        pass
    fn()
    per_call = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls)
    return float(np.median(per_call))


def _seconds(fn, clock=time.perf_counter) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{platform.node()}: {cpu}, {os.cpu_count()} logical CPUs, "
            f"{platform.system()} {platform.release()}, numpy {np.__version__}")


def memory_capacity_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2 ** 30


def measure_host(clock=time.perf_counter) -> DeviceProfile:
    """A measured CPU device profile (no op entries; `placer profile NET` adds those).

    ``clock`` times the GEMM and the copy: wall time for profiles; process CPU time for model studies
    that time ops the same way (``bench.time_call(clock="cpu")``).
    """
    f32 = gemm_flops(clock=clock)
    return DeviceProfile(
        kind="cpu", name=host_description().split(": ", 1)[-1].split(",")[0],
        source={"kind": "measured", "host": host_description(),
                "date": _dt.date.today().isoformat(),
                "method": "float32 matmul 1024^3 best of 3; np.copyto of 128 MiB best of 3 "
                          "(read+write bytes); registry Relu kernel on 1 element, median of 5 x 2000 calls"},
        peak_flops={"float32": f32, "float64": gemm_flops_f64()},
        memory_bandwidth_bytes_per_s=stream_bytes_per_s(clock=clock),
        memory_capacity_bytes=memory_capacity_bytes(),
        launch_overhead_s=call_overhead_s())


def gemm_flops_f64(n: int = 768) -> float:
    a = np.random.default_rng(0).random((n, n))
    a @ a
    return 2.0 * n ** 3 / min(_seconds(lambda: a @ a) for _ in range(2))
