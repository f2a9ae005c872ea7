"""Plan + Net -> the placed Caffe2 NetDef and init net, with copy ops.

What changes in the user's net, and nothing else:
- every op gets a ``device_option`` (``device_type`` 1 and ``device_id`` N on the GPU, 0 on
  the CPU; other DeviceOption fields the op had are kept);
- a tensor consumed on the other device than the one that made it is copied once per
  direction, by ``CopyCPUToGPU`` / ``CopyGPUToCPU`` (Caffe2 runs both with the GPU's
  device option) inserted right after its producer (at the top of the net for external
  inputs), and its consumers on that device read the copy: ``<blob>_gpu<N>`` / ``<blob>_cpu``;
- an external output made on the GPU comes back to the host under the user's own name
  (the GPU-side blob is then ``<blob>_gpu<N>``, for the whole in-place chain that made
  it, so that the chain stays in place), when ``outputs_on_host`` is set;
- in the init net, each parameter's fill op runs on the device of its consumers; a
  parameter used on both devices (or only on the GPU, but made by a fill op with no GPU
  kernel) is filled on the CPU and copied to ``<blob>_gpu<N>`` once by the init net, so
  no per-run copy is paid for it; that copy is an init-net external output and a
  predict-net external input (the only names added to those lists).

Blobs written more than once (in-place ops) are handled per version: a copy copies the
version its consumer reads. An input an op reads from host memory on any device
(``OpDef.host_inputs``: the iteration counter of Adam and LearningRate) is read on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.ops import registry
from placer.types import Device, Net

EXTERNAL = -1   # producer of an external input fed from the host
PARAM = -2      # producer of a parameter made by the init net


@dataclass
class PlacedNet:
    predict: pb.NetDef
    init: pb.NetDef | None
    copies: list[tuple[str, str, str]] = field(default_factory=list)  # (blob, "h2d"|"d2h", copy name)


def _kind(dev: Device) -> str:
    return "gpu" if dev.is_gpu else "cpu"


def _set_device(op: pb.OperatorDef, dev: Device) -> None:
    op.device_option.device_type = pb.PROTO_CUDA if dev.is_gpu else pb.PROTO_CPU
    op.device_option.device_id = dev.index if dev.is_gpu else 0


def place(net: Net, placement: Sequence[Device], outputs_on_host: bool = True) -> PlacedNet:
    """Write ``net`` with op ``i`` on ``placement[i]`` (see the module docstring)."""
    if len(placement) != len(net.ops):
        raise PlacerError(f"placement has {len(placement)} entries for {len(net.ops)} ops")
    gpus = {d.index for d in placement if d.is_gpu}
    gpu = Device("gpu", min(gpus) if gpus else 0)
    taken = _all_blob_names(net)

    def fresh(base: str) -> str:
        name = base
        k = 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    # 1. versions: which producer made the blob each op input reads.
    producer_of: dict[str, int] = {b: (PARAM if b in net.params else EXTERNAL) for b in net.external_inputs}
    reads: list[list[int]] = []
    consumers: dict[tuple[str, int], list[str]] = {}  # version -> device kind of each read
    for op in net.ops:
        row = []
        for k, name in enumerate(op.inputs):
            p = producer_of.get(name, EXTERNAL)
            row.append(p)
            consumers.setdefault((name, p), []).append(_read_kind(op, k, placement))
        reads.append(row)
        for name in op.outputs:
            producer_of[name] = op.index
    final_version = dict(producer_of)

    def dev_of(p: int) -> str:
        return "cpu" if p == EXTERNAL else _kind(placement[p])

    # 2. names: where each version lives on each device.
    home: dict[tuple[str, int], str] = {}  # name of the version on its producer's device
    other: dict[tuple[str, int], str] = {}  # name of its copy on the other device
    for out in net.external_outputs:
        p = final_version.get(out)
        if outputs_on_host and p is not None and p >= 0 and placement[p].is_gpu:
            home[(out, p)] = fresh(f"{out}_gpu{gpu.index}")
            other[(out, p)] = out
            # the in-place chain that made it keeps one (GPU) name, so it stays in place
            while out in net.ops[p].inputs:
                prev = reads[p][net.ops[p].inputs.index(out)]
                if prev < 0 or not placement[prev].is_gpu:
                    break
                home[(out, prev)] = home[(out, p)]
                p = prev
    param_devices: dict[str, set[str]] = {}
    for (name, p), kinds in consumers.items():
        if p == PARAM:
            param_devices.setdefault(name, set()).update(kinds)
            continue
        if any(dev_of(p) != kind for kind in kinds) and (name, p) not in other:
            suffix = "_cpu" if dev_of(p) == "gpu" else f"_gpu{gpu.index}"
            other[(name, p)] = fresh(name + suffix)
    param_name = {}  # (param, device kind) -> blob name
    cpu_only = _cpu_only_fills(net)
    for name, kinds in param_devices.items():
        if kinds == {"cpu", "gpu"} or (kinds == {"gpu"} and name in cpu_only):
            param_name[(name, "cpu")] = name
            param_name[(name, "gpu")] = fresh(f"{name}_gpu{gpu.index}")
        else:
            param_name[(name, next(iter(kinds)))] = name

    def name_on(name: str, p: int, kind: str) -> str:
        if p == PARAM:
            return param_name.get((name, kind), name)
        if dev_of(p) == kind:
            return home.get((name, p), name)
        return other[(name, p)]

    # 3. the placed predict net: ops in order, copies right after their producers.
    out_net = pb.NetDef()
    out_net.CopyFrom(net.proto)
    del out_net.op[:]
    copies: list[tuple[str, str, str]] = []

    def emit_copies(versions: list[tuple[str, int]]) -> None:
        for name, p in versions:
            if (name, p) not in other:
                continue
            src, dst = name_on(name, p, dev_of(p)), other[(name, p)]
            to_gpu = dev_of(p) == "cpu"
            copy = pb.OperatorDef(type="CopyCPUToGPU" if to_gpu else "CopyGPUToCPU", input=[src], output=[dst])
            _set_device(copy, gpu)
            out_net.op.append(copy)
            copies.append((name, "h2d" if to_gpu else "d2h", dst))

    emit_copies([key for key in other if key[1] == EXTERNAL])
    for op in net.ops:
        dev = placement[op.index]
        new = pb.OperatorDef()
        new.CopyFrom(op.proto)
        for k, (name, p) in enumerate(zip(op.inputs, reads[op.index])):
            new.input[k] = name_on(name, p, _read_kind(op, k, placement))
        for k, name in enumerate(op.outputs):
            new.output[k] = home.get((name, op.index), name)
        _set_device(new, dev)
        out_net.op.append(new)
        emit_copies([(name, op.index) for name in dict.fromkeys(op.outputs)])
    for (name, kind), blob in param_name.items():
        if blob != name and blob not in out_net.external_input:
            out_net.external_input.append(blob)

    # 4. the placed init net: each fill op on the device of its parameter's consumers; a
    #    parameter used on both devices is filled on the CPU and copied once, at init time
    #    (a second fill would draw other random values).
    init = None
    if net.init_proto is not None:
        init = pb.NetDef()
        init.CopyFrom(net.init_proto)
        del init.op[:]
        for fill in net.init_proto.op:
            kinds = set().union(*(param_devices.get(o, set()) for o in fill.output)) or {"cpu"}
            new = pb.OperatorDef()
            new.CopyFrom(fill)
            on_gpu = kinds == {"gpu"} and not cpu_only.intersection(fill.output)
            _set_device(new, gpu if on_gpu else Device("cpu"))
            init.op.append(new)
            for o in fill.output:
                if param_name.get((o, "gpu"), o) != o:
                    copy = pb.OperatorDef(type="CopyCPUToGPU", input=[o], output=[param_name[(o, "gpu")]])
                    _set_device(copy, gpu)
                    init.op.append(copy)
                    init.external_output.append(param_name[(o, "gpu")])
    return PlacedNet(out_net, init, copies)


def _read_kind(op, k: int, placement: Sequence[Device]) -> str:
    """The device kind ``op`` reads input ``k`` on: its own, or the CPU for a host input."""
    opdef = registry.get(op.type)
    if opdef is not None and k in opdef.host_inputs:
        return "cpu"
    return _kind(placement[op.index])


def _cpu_only_fills(net: Net) -> set[str]:
    """Parameters whose init op has no GPU kernel: filled on the CPU, copied once."""
    out: set[str] = set()
    for fill in (net.init_proto.op if net.init_proto is not None else ()):
        opdef = registry.get(fill.type)
        if opdef is not None and "gpu" not in opdef.devices:
            out.update(fill.output)
    return out


def _all_blob_names(net: Net) -> set[str]:
    names = set(net.external_inputs) | set(net.external_outputs) | set(net.params)
    for op in net.ops:
        names.update(op.inputs)
        names.update(op.outputs)
    return names
