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
    option = op.device_option
    option.device_type = pb.PROTO_CUDA if dev.is_gpu else pb.PROTO_CPU
    option.device_id = dev.index if dev.is_gpu else 0


def place(net: Net, placement: Sequence[Device], outputs_on_host: bool = True) -> PlacedNet:
    """Write ``net`` with op ``i`` on ``placement[i]`` (see the module docstring).

    Each step below is one pass over the ops or blobs (dicts and sets, no scans of
    protobuf lists), so a placed net of a million ops takes seconds."""
    if len(placement) != len(net.ops):
        raise PlacerError(f"placement has {len(placement)} entries for {len(net.ops)} ops")
    gpus = {d.index for d in placement if d.is_gpu}
    names = _Names(net, placement, Device("gpu", min(gpus) if gpus else 0), outputs_on_host)
    predict, copies = _placed_predict(net, placement, names)
    init = _placed_init(net, names) if net.init_proto is not None else None
    return PlacedNet(predict, init, copies)


class _Names:
    """Which version of a blob each op reads, and what each version is called on each device.

    1. versions: the producer of the version each op input reads (EXTERNAL, PARAM or an op);
    2. names: a version made on one device and read on the other gets a copy named
       ``<blob>_gpu<N>`` / ``<blob>_cpu``; an external output made on the GPU keeps the user's
       name for its host copy (and its in-place chain on the GPU gets the GPU name); a
       parameter read on both devices (or on the GPU but filled by a CPU-only op) gets a
       GPU twin ``<blob>_gpu<N>``."""

    def __init__(self, net: Net, placement: Sequence[Device], gpu: Device, outputs_on_host: bool):
        self.net, self.gpu = net, gpu
        self.kinds = [_kind(d) for d in placement]
        self.taken = _all_blob_names(net)
        self._host_inputs_of: dict[str, frozenset] = {}
        self.reads, consumers, final_version = self._versions(net)
        self.home: dict[tuple[str, int], str] = {}   # name of a version on its producer's device
        self.other: dict[tuple[str, int], str] = {}  # name of its copy on the other device
        if outputs_on_host:
            self._outputs_come_home(final_version)
        self.param_devices: dict[str, set[str]] = {}
        self._crossings(consumers)
        self.cpu_only = _cpu_only_fills(net)
        self.param_name: dict[tuple[str, str], str] = {}  # (param, device kind) -> blob name
        for name, kinds in self.param_devices.items():
            if kinds == {"cpu", "gpu"} or (kinds == {"gpu"} and name in self.cpu_only):
                self.param_name[(name, "cpu")] = name
                self.param_name[(name, "gpu")] = self.fresh(f"{name}_gpu{gpu.index}")
            else:
                self.param_name[(name, next(iter(kinds)))] = name

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def read_kind(self, op, k: int) -> str:
        """The device kind ``op`` reads input ``k`` on: its own, or the CPU for a host input."""
        return "cpu" if k in self._host_inputs(op.type) else self.kinds[op.index]

    def _host_inputs(self, op_type: str):
        """Inputs an op type reads from host memory on any device (``OpDef.host_inputs``)."""
        if op_type not in self._host_inputs_of:
            opdef = registry.get(op_type)
            self._host_inputs_of[op_type] = frozenset(opdef.host_inputs) if opdef is not None else frozenset()
        return self._host_inputs_of[op_type]

    def _versions(self, net: Net):
        """Each op's row of versions read, each version's read kinds, the last versions."""
        producer_of: dict[str, int] = {b: (PARAM if b in net.params else EXTERNAL) for b in net.external_inputs}
        reads: list[list[int]] = []
        consumers: dict[tuple[str, int], list[str]] = {}  # version -> device kind of each read
        for op, kind in zip(net.ops, self.kinds):
            row = [producer_of.get(name, EXTERNAL) for name in op.inputs]
            host = self._host_inputs(op.type)
            for k, key in enumerate(zip(op.inputs, row)):
                read = "cpu" if host and k in host else kind
                users = consumers.get(key)
                if users is None:
                    consumers[key] = [read]
                else:
                    users.append(read)
            reads.append(row)
            for name in op.outputs:
                producer_of[name] = op.index
        return reads, consumers, producer_of

    def dev_of(self, p: int) -> str:
        return "cpu" if p == EXTERNAL else self.kinds[p]

    def _outputs_come_home(self, final_version: dict[str, int]) -> None:
        ops, kinds = self.net.ops, self.kinds
        for out in self.net.external_outputs:
            p = final_version.get(out)
            if p is not None and p >= 0 and kinds[p] == "gpu":
                self.home[(out, p)] = self.fresh(f"{out}_gpu{self.gpu.index}")
                self.other[(out, p)] = out
                # the in-place chain that made it keeps one (GPU) name, so it stays in place
                while out in ops[p].inputs:
                    prev = self.reads[p][ops[p].inputs.index(out)]
                    if prev < 0 or kinds[prev] != "gpu":
                        break
                    self.home[(out, prev)] = self.home[(out, p)]
                    p = prev

    def _crossings(self, consumers: dict[tuple[str, int], list[str]]) -> None:
        for key, kinds in consumers.items():
            name, p = key
            if p == PARAM:
                self.param_devices.setdefault(name, set()).update(kinds)
                continue
            where = "cpu" if p == EXTERNAL else self.kinds[p]
            if key not in self.other and kinds.count(where) != len(kinds):  # read on the other device
                suffix = "_cpu" if where == "gpu" else f"_gpu{self.gpu.index}"
                self.other[key] = self.fresh(name + suffix)

    def on(self, name: str, p: int, kind: str) -> str:
        """The name of version ``(name, p)`` on device kind ``kind``."""
        if p == PARAM:
            return self.param_name.get((name, kind), name)
        if self.dev_of(p) == kind:
            return self.home.get((name, p), name)
        return self.other[(name, p)]


def _placed_predict(net: Net, placement: Sequence[Device], names: _Names):
    """Ops in order, each copy right after its producer (external inputs' at the top)."""
    out_net = pb.NetDef()
    out_net.CopyFrom(net.proto)
    del out_net.op[:]
    copies: list[tuple[str, str, str]] = []
    gpu, other, home = names.gpu, names.other, names.home

    def emit_copy(name: str, p: int) -> None:
        src, dst = names.on(name, p, names.dev_of(p)), other[(name, p)]
        to_gpu = names.dev_of(p) == "cpu"
        copy = out_net.op.add(type="CopyCPUToGPU" if to_gpu else "CopyGPUToCPU", input=[src], output=[dst])
        _set_device(copy, gpu)
        copies.append((name, "h2d" if to_gpu else "d2h", dst))

    for name, p in [key for key in other if key[1] == EXTERNAL]:
        emit_copy(name, p)
    renamed_versions = home.keys() | other.keys()
    for op, dev, kind, reads in zip(net.ops, placement, names.kinds, names.reads):
        new = out_net.op.add()
        new.CopyFrom(op.proto)
        for k, key in enumerate(zip(op.inputs, reads)):
            if key in renamed_versions or key[1] == PARAM:  # else read under its own name
                renamed = names.on(*key, names.read_kind(op, k))
                if renamed != key[0]:
                    new.input[k] = renamed
        _set_device(new, dev)
        i = op.index
        for k, name in enumerate(op.outputs):
            if (name, i) in renamed_versions:
                if (name, i) in home:
                    new.output[k] = home[(name, i)]
        for name in (dict.fromkeys(op.outputs) if len(op.outputs) > 1 else op.outputs):
            if (name, i) in other:
                emit_copy(name, i)
    listed = set(out_net.external_input)
    for (name, kind), blob in names.param_name.items():
        if blob != name and blob not in listed:
            out_net.external_input.append(blob)
            listed.add(blob)
    return out_net, copies


def _placed_init(net: Net, names: _Names) -> pb.NetDef:
    """Each fill op on the device of its parameter's consumers; a parameter used on both
    devices is filled on the CPU and copied once, at init time (a second fill would draw
    other random values)."""
    init = pb.NetDef()
    init.CopyFrom(net.init_proto)
    del init.op[:]
    gpu, param_devices, param_name, cpu_only = names.gpu, names.param_devices, names.param_name, names.cpu_only
    cpu = Device("cpu")
    for fill in net.init_proto.op:
        kinds = set().union(*(param_devices.get(o, ()) for o in fill.output)) or {"cpu"}
        new = init.op.add()
        new.CopyFrom(fill)
        on_gpu = kinds == {"gpu"} and not cpu_only.intersection(fill.output)
        _set_device(new, gpu if on_gpu else cpu)
        for o in fill.output:
            twin = param_name.get((o, "gpu"), o)
            if twin != o:
                copy = init.op.add(type="CopyCPUToGPU", input=[o], output=[twin])
                _set_device(copy, gpu)
                init.external_output.append(twin)
    return init


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
