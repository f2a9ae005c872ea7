"""Per-op timing of a net on one device with the runtime's own kernels.

Every op is run at its inferred shapes on random inputs (index-like inputs are made
valid for their op: embedding indices below the table's row count, lengths that add up
to the number of indices, labels below the class count), after warm-up calls, until
``repeats`` samples or a time budget per op is reached. The median and interquartile
range go into the profile; ops with the same key (type, shapes, arguments that change
cost) are timed once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from placer.errors import DeviceError
from placer.ops import registry
from placer.hardware.device_profile import OpTiming, cost_args, op_key
from placer.progress import Progress
from placer.runtime.devices import CpuDevice, CudaDevice
from placer.types import Op, TensorType, TypedNet

# Op type -> (position of the indices input, position of the table it indexes, axis).
_INDEX_INPUTS = {
    "Gather": (1, 0, 0), "BatchGather": (1, 0, 1),
    "SparseLengthsSum": (1, 0, 0), "SparseLengthsMean": (1, 0, 0),
    "SparseLengthsWeightedSum": (2, 0, 0), "SparseLengthsSumFused8BitRowwise": (1, 0, 0),
    "SparseLengthsWeightedSumFused8BitRowwise": (2, 0, 0),
    "SparseLengthsMeanFused8BitRowwise": (1, 0, 0),
}
# Op type -> (position of the lengths input, position of what the lengths segment).
_LENGTHS_INPUTS = {
    "SparseLengthsSum": (2, 1), "SparseLengthsMean": (2, 1), "SparseLengthsWeightedSum": (3, 2),
    "SparseLengthsSumFused8BitRowwise": (2, 1), "SparseLengthsMeanFused8BitRowwise": (2, 1),
    "SparseLengthsWeightedSumFused8BitRowwise": (3, 2),
    "LengthsSum": (1, 0), "LengthsMean": (1, 0), "LengthsMax": (1, 0),
    "LengthsToSegmentIds": (0, None), "LengthsToRanges": (0, None),
}
NOISY_RATIO = 1.5  # median / fastest sample above which an op is timed again

# Op types whose second input is a class label below the first input's last dimension.
_LABEL_OPS = {"LabelCrossEntropy", "SoftmaxWithLoss", "Accuracy", "CrossEntropy"}


def make_inputs(op: Op, types: Sequence[TensorType], rng: np.random.Generator) -> list[np.ndarray]:
    """Host arrays of the given types, valid for the op (see module docstring)."""
    arrays = [_random(t, rng) for t in types]
    if op.type in _INDEX_INPUTS:
        pos, table, axis = _INDEX_INPUTS[op.type]
        if pos < len(types) and table < len(types) and types[table].ndim > axis:
            rows = max(1, types[table].shape[axis])
            arrays[pos] = rng.integers(0, rows, size=types[pos].shape).astype(types[pos].dtype)
    if op.type in _LENGTHS_INPUTS:
        pos, seg = _LENGTHS_INPUTS[op.type]
        if pos < len(types):
            total = types[seg].shape[0] if seg is not None and seg < len(types) and types[seg].ndim else None
            arrays[pos] = _lengths(types[pos], total, rng)
    if op.type in _LABEL_OPS and len(types) >= 2 and types[0].ndim >= 1:
        classes = max(1, types[0].shape[-1])
        arrays[1] = rng.integers(0, classes, size=types[1].shape).astype(types[1].dtype)
    return arrays


def _random(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    if t.dtype in ("float16", "float32", "float64"):
        # Positive values: log, sqrt, division and variances stay finite.
        return (rng.random(t.shape, dtype=np.float32) + 0.5).astype(t.dtype)
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    if t.dtype == "object":
        return np.full(t.shape, b"", dtype=object)
    info = np.iinfo(t.dtype)
    return rng.integers(0, min(2, info.max) + 1, size=t.shape).astype(t.dtype)


def _lengths(t: TensorType, total: int | None, rng: np.random.Generator) -> np.ndarray:
    """Segment lengths adding up to ``total`` (the rows they segment), spread evenly."""
    n = t.size
    if total is None:
        return rng.integers(0, 4, size=t.shape).astype(t.dtype)
    base = np.full(n, total // max(n, 1), dtype=np.int64)
    base[: total - base.sum()] += 1
    return base.reshape(t.shape).astype(t.dtype)


# ------------------------------------------------------------------------- devices

def get_device(name: str) -> Any:
    """The runtime's device object for "cpu" or "cuda:N" (a DeviceError without a GPU)."""
    if name == "cpu":
        return CpuDevice()
    if name.startswith("cuda"):
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        return CudaDevice(index)
    raise DeviceError(f"unknown device '{name}'", hint="use cpu or cuda:N")


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_call(fn: Callable[[], Any], device: Any, warmup: int, repeats: int,
              budget_s: float, clock: str = "wall") -> list[float]:
    """Samples of one call in seconds: CUDA events on a GPU, ``clock`` on the CPU.

    The "cpu" clock (process CPU time) leaves out time the process spent descheduled on a
    machine shared with other work; it equals wall time only for single-threaded kernels
    on a quiet machine, so it is for model studies with one BLAS thread, not for profiles.

    Stops early once ``budget_s`` is spent (keeping at least 3 samples), so that a slow
    op at a large batch does not dominate a profiling run.
    """
    for _ in range(warmup):
        fn()
    device.sync()
    samples: list[float] = []
    spent = 0.0
    use_events = getattr(device, "kind", "cpu") == "gpu"
    now = CLOCKS[clock]
    while len(samples) < repeats and (len(samples) < 3 or spent < budget_s):
        if use_events:
            timer = device.timer()
            timer.start()
            fn()
            timer.stop()
            samples.append(timer.seconds())
        else:
            t0 = now()
            fn()
            samples.append(now() - t0)
        spent += samples[-1]
    return samples


@dataclass
class BenchResult:
    """Timings by key, plus the ops that could not be timed and why."""

    timings: dict[str, OpTiming] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # op label -> reason
    ops_timed: int = 0


def profile_net(typed_net: TypedNet, device_name: str = "cpu", repeats: int = 10, warmup: int = 2,
                budget_s: float = 0.5, seed: int = 0, progress: bool = True,
                skip_keys: set[str] | None = None, retries: int = 2, clock: str = "wall") -> BenchResult:
    """Time every distinct op of a typed net on one device.

    A machine shared with other work stalls now and then for milliseconds, in bursts;
    an op whose median is more than ``NOISY_RATIO`` times its fastest sample was likely
    timed during one, so it is timed again after the pass (up to ``retries`` times) and
    the quieter run (the lower median) is kept.
    """
    device = get_device(device_name)
    rng = np.random.default_rng(seed)
    result = BenchResult()
    jobs = _distinct_ops(typed_net, result, skip_keys or set())
    bar = Progress(len(jobs), f"profile {device_name}", quiet=not progress)
    fastest: dict[str, float] = {}
    try:
        for i, (key, op, types, feats) in enumerate(jobs):
            fastest[key] = _time_one(op, types, feats, key, device, rng, warmup, repeats, budget_s, result, clock)
            bar.update(i + 1)
    finally:
        bar.close()
    for _ in range(retries):
        noisy = [j for j in jobs if j[0] in result.timings
                 and result.timings[j[0]].median_s > NOISY_RATIO * fastest[j[0]]]
        for key, op, types, feats in noisy:
            kept = result.timings[key]
            _time_one(op, types, feats, key, device, rng, warmup, repeats, budget_s, result, clock)
            if kept.median_s < result.timings[key].median_s:
                result.timings[key] = kept
    return result


def _distinct_ops(typed_net: TypedNet, result: BenchResult, skip_keys: set[str]) -> list:
    jobs, seen = [], set(skip_keys)
    for op, feats in zip(typed_net.net.ops, typed_net.features):
        types = [typed_net.blobs.get(b) for b in op.inputs]
        opdef = registry.get(op.type)
        if opdef is None or opdef.kernel is None:
            result.skipped[op.label] = "no kernel" if opdef else "unknown op type"
            continue
        if any(t is None for t in types) or not feats.known:
            result.skipped[op.label] = "unknown input shapes"
            continue
        key = op_key(op.type, types, op.args)
        if key not in seen:
            seen.add(key)
            jobs.append((key, op, types, feats))
    return jobs


def _time_one(op, types, feats, key, device, rng, warmup, repeats, budget_s, result, clock) -> float:
    """Time one op into ``result``; returns its fastest sample (inf when it failed)."""
    kernel = registry.get(op.type).kernel
    try:
        inputs = [device.to_device(a) for a in make_inputs(op, types, rng)]
        samples = time_call(lambda: kernel(device.xp, inputs, op.args), device, warmup, repeats,
                            budget_s, clock)
    except Exception as e:  # a kernel that fails on random data is reported, not fatal
        result.skipped[op.label] = f"kernel failed: {type(e).__name__}: {str(e)[:120]}"
        return float("inf")
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    timing = OpTiming(type=op.type, inputs=tuple(types), args=cost_args(op.args),
                      samples=len(samples), median_s=float(med), iqr_s=float(q3 - q1),
                      flops=feats.flops, bytes=feats.bytes_read + feats.bytes_written)
    if key not in result.timings:
        result.ops_timed += 1
    result.timings[key] = timing
    return float(min(samples))

