"""Per-op timing of a whole net as it runs: the default of ``placer profile NET``.

An op timed alone (``bench.profile_net``) is called again and again on the same inputs:
its inputs and weights sit in the caches, its output buffer is recycled by the
allocator, and no producer ran before it. In a run none of that holds: each op reads
what the previous ops left (often evicted from the caches by them), allocates its
outputs (page faults for large ones) and pays the executor's dispatch. On the 2-core
host an op took 1.4x (Conv) to 3x (FC, pooling) longer in a ResNet-50 run than alone,
and the sum of isolated times under-predicted ``placer run`` by 12-61%.

So the net is run by the runtime's own executor (``placer.runtime.executor``: the same
kernels, the same blob handling as ``placer run``), ``warmup`` untimed iterations and
then ``iterations`` timed ones, and each op's executor timer is the sample. Ops that
share a key (type, input shapes, cost arguments: ResNet's repeated blocks) pool their
samples: the entry is the median and interquartile range of every sample of every
instance, so it prices the op as the net runs it on average.

On a GPU every op runs on that GPU (the executor feeds inputs and makes parameters where
their first reader runs); a net with an op that has no GPU kernel cannot run there whole,
and ``InNetworkUnavailable`` says so, as it does for ops without a kernel, unknown
shapes, or a net that fails to run (an init net that gives parameter shapes but no
values): the caller times such nets op by op instead.
"""
from __future__ import annotations

import numpy as np

from placer.errors import PlacerError
from placer.ops import registry
from placer.profiling.bench import BenchResult
from placer.hardware.device_profile import OpTiming, cost_args, op_key
from placer.progress import Progress
from placer.runtime.executor import Executor
from placer.runtime.inputs import random_inputs
from placer.types import Device, TensorType, TypedNet


class InNetworkUnavailable(PlacerError):
    """The net cannot run whole on the device (a reason per op in ``reasons``)."""

    def __init__(self, message: str, reasons: dict[str, str]):
        super().__init__(message)
        self.reasons = reasons


def profile_in_network(typed_net: TypedNet, device_name: str = "cpu", iterations: int = 10,
                       warmup: int = 2, seed: int = 0, progress: bool = True) -> BenchResult:
    """Time every op of ``typed_net`` where it runs in a whole-net run (module docstring)."""
    if iterations < 1 or warmup < 0:
        raise ValueError("iterations must be >= 1 and warmup >= 0")
    net = typed_net.net
    gpu = _gpu_index(device_name)
    _check_runnable(typed_net, "cpu" if gpu is None else "gpu")
    device_map = None if gpu is None else {op.index: Device("gpu", gpu) for op in net.ops}
    try:
        executor = Executor(net, device_map=device_map, seed=seed)
        executor.run_init()  # an init net that gives only shapes (no values) fails here
        names = executor.expected_inputs()
        inputs = random_inputs(net, typed_net.blobs, names, seed=seed)
        executor.input_types.update({n: TensorType(a.shape, str(a.dtype)) for n, a in inputs.items()})
        total = (warmup + iterations) * len(net.ops)
        with Progress(total, f"profile {device_name} (in network)", quiet=not progress) as bar:
            executor.run(inputs, iterations=iterations, warmup=warmup,
                         progress=lambda done, _total: bar.update(done))
    except PlacerError as e:
        raise InNetworkUnavailable(f"the net does not run: {e}", {}) from e
    return _entries(typed_net, [(o.samples_s, o.count) for o in executor.record.ops])


def _gpu_index(device_name: str) -> int | None:
    if device_name == "cpu":
        return None
    if device_name.startswith("cuda"):
        return int(device_name.split(":", 1)[1]) if ":" in device_name else 0
    raise ValueError(f"unknown device '{device_name}' (cpu or cuda:N)")


def _check_runnable(typed_net: TypedNet, device_kind: str) -> None:
    """InNetworkUnavailable naming every op that stops the net from running whole on a
    device of ``device_kind`` ("cpu" or "gpu")."""
    reasons: dict[str, str] = {}
    for op, feats in zip(typed_net.net.ops, typed_net.features):
        opdef = registry.get(op.type)
        if opdef is None or opdef.kernel is None:
            reasons[op.label] = "no kernel" if opdef else "unknown op type"
        elif device_kind not in opdef.devices:
            reasons[op.label] = f"no {device_kind.upper()} kernel"
        elif not feats.known:
            reasons[op.label] = "unknown input shapes"
    if reasons:
        shown = "; ".join(f"{label}: {why}" for label, why in list(reasons.items())[:3])
        more = f" and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        raise InNetworkUnavailable(f"{len(reasons)} op(s) keep the net from running whole: {shown}{more}",
                                   reasons)


def _entries(typed_net: TypedNet, samples_per_op: list) -> BenchResult:
    """One OpTiming per key from the pooled samples of the ops that share it; each op's
    entry of ``samples_per_op`` is (its kept samples, how many times it was timed)."""
    net, result = typed_net.net, BenchResult()
    pooled: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    first: dict[str, tuple] = {}
    for op, feats, (samples, count) in zip(net.ops, typed_net.features, samples_per_op):
        types = _input_types(typed_net, op)
        key = op_key(op.type, types, op.args)
        pooled.setdefault(key, []).extend(samples)
        counts[key] = counts.get(key, 0) + count
        first.setdefault(key, (op, types, feats))
    for key, samples in pooled.items():
        op, types, feats = first[key]
        q1, med, q3 = np.percentile(samples, [25, 50, 75])
        result.timings[key] = OpTiming(
            type=op.type, inputs=tuple(types), args=cost_args(op.args), samples=counts[key],
            median_s=float(med), iqr_s=float(q3 - q1), flops=feats.flops,
            bytes=feats.bytes_read + feats.bytes_written, method="in-network")
    result.ops_timed = len(result.timings)
    return result


def _input_types(typed_net: TypedNet, op) -> tuple:
    """The input types shape inference saw at this op (what the cost model looks up)."""
    if op.index < len(typed_net.op_inputs):
        return tuple(typed_net.op_inputs[op.index])
    return tuple(typed_net.blobs.get(b) for b in op.inputs)
