"""Plan + Net -> the placed Caffe2 NetDef and init net, with copy ops, over a machine's devices.

What changes in the user's net, and nothing else:
- every op gets a ``device_option`` (``device_type`` 1 and ``device_id`` N on GPU N, 0 on
  the CPU; on a cluster, ``node_name`` = the device's host; other DeviceOption fields the
  op had are kept);
- a tensor read on another device than the one that made it is copied once per
  destination device, the way Caffe2's own ``core.InjectCrossDeviceCopies`` does it:
  ``CopyCPUToGPU`` under the destination GPU's device option, ``CopyGPUToCPU`` under the
  source GPU's, and ``Copy`` under the destination GPU's for GPU -> GPU (Caffe2 has no
  CopyGPUToGPU op); the copy is named ``<blob>_gpu_<N>`` on GPU N and ``<blob>_cpu`` on the
  CPU (Caffe2's names too), and that device's readers read it. Unlike Caffe2, which puts
  a copy just before its first reader, placer puts it right after the blob's producer (at
  the top of the net for external inputs), so that a copy can overlap the ops between
  (``copies_at=READER`` puts it where Caffe2 does: ``inject_copies``, for ``placer run
  --inject-copies`` on a net whose ops name their devices but that has no copies);
- an external output made on a GPU comes back to the host under the user's own name (the
  GPU-side blob is then ``<blob>_gpu_<N>``, for the whole in-place chain that made it,
  so that the chain stays in place), when ``outputs_on_host`` is set;
- in the init net, a parameter read on one device only is filled there (when its fill
  op has a kernel for that device); otherwise it is filled on the CPU and copied once, by
  the init net, to ``<blob>_gpu_<N>`` on each GPU that reads it, so no per-run copy is
  paid; those copies are init-net external outputs and predict-net external inputs (the
  only names added to those lists). A parameter the net itself writes (a train net's
  parameters and optimizer state) is made on the device of the ops that write it, and a
  device that only reads it gets a fresh copy at the top of every run (it changes every
  run), named as any other copy.

Blobs written more than once (in-place ops) are handled per version: a copy copies the
version its reader reads. An input an op reads from host memory on any device
(``OpDef.host_inputs``: the iteration counter of Adam and LearningRate) is read on the CPU.

Each step is one pass over the ops or blobs (dicts and sets, no scans of protobuf lists,
an op's registry entry looked up once per op type), so a placed net of a million ops
takes seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import existing_placement
from placer.ops import registry
from placer.training.placement import state_writers
from placer.types import Net

EXTERNAL = -1   # producer of an external input fed from the host
PARAM = -2      # producer of a parameter made by the init net
HOST = 0        # the host CPU's device index
PRODUCER = "producer"   # copies_at: each copy right after the op that makes its blob
READER = "reader"       # copies_at: just before its first reader on the copy's device (Caffe2)


@dataclass
class PlacedNet:
    predict: pb.NetDef
    init: pb.NetDef | None
    copies: list[tuple[str, str, str, str]] = field(default_factory=list)  # (blob, src, dst, copy name)


@dataclass(frozen=True)
class _Devices:
    """The machine's devices as the rewrite needs them: name, kind, CUDA ordinal."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    ordinals: tuple[int, ...]
    hosts: tuple[str, ...] = ()     # cluster host of each device ("" on one machine)

    @classmethod
    def of(cls, machine) -> "_Devices":
        return cls(tuple(d.name for d in machine.devices), tuple(d.kind for d in machine.devices),
                   tuple(d.ordinal for d in machine.devices), tuple(d.host for d in machine.devices))

    def suffix(self, d: int) -> str:
        """Caffe2's copy-name suffix for a blob on device d."""
        return "_cpu" if self.kinds[d] == "cpu" else f"_gpu_{self.ordinals[d]}"

    def set_option(self, op: pb.OperatorDef, d: int) -> None:
        gpu = self.kinds[d] == "gpu"
        op.device_option.device_type = pb.PROTO_CUDA if gpu else pb.PROTO_CPU
        op.device_option.device_id = self.ordinals[d] if gpu else 0
        if self.hosts and self.hosts[d]:
            op.device_option.node_name = self.hosts[d]

    def copy_op(self, src: int, dst: int, blob: str, out: str) -> pb.OperatorDef:
        """The copy Caffe2 would insert from device src to device dst (between two hosts of
        a cluster: ``Copy`` on the destination, which the per-worker split turns into a
        send and a receive)."""
        if self.hosts and self.hosts[src] != self.hosts[dst]:
            kind, where = "Copy", dst
        elif self.kinds[src] == "cpu" and self.kinds[dst] == "gpu":
            kind, where = "CopyCPUToGPU", dst
        elif self.kinds[src] == "gpu" and self.kinds[dst] == "cpu":
            kind, where = "CopyGPUToCPU", src
        else:
            kind, where = "Copy", dst
        op = pb.OperatorDef(type=kind, input=[blob], output=[out])
        self.set_option(op, where)
        return op


def place(net: Net, placement: Sequence[int], machine, outputs_on_host: bool = True,
          copies_at: str = PRODUCER) -> PlacedNet:
    """Write ``net`` with op ``i`` on device ``placement[i]`` of ``machine`` (module
    docstring); ``copies_at`` ``READER`` puts each copy where Caffe2 does."""
    return _place(net, placement, _Devices.of(machine), outputs_on_host, copies_at)


def inject_copies(net: Net) -> Net:
    """``net`` as it runs on the devices its own device options name, with the copies
    between them that Caffe2's ``core.InjectCrossDeviceCopies`` inserts: the same ops,
    names, device options and places (before the first reader), the external outputs left
    where they are made. It is ``place`` with the file's placement (what ``placer plan
    --keep-existing --no-outputs-on-host`` writes where it keeps every op's device, but
    with each copy after its producer), so a parameter an init net makes is filled on the
    device that reads it, or copied there once by the init net, where Caffe2 would copy it
    on every run. A net
    without device options is returned as it is; one that has copy ops already is refused
    (which blob each copy moves is the file's own choice, not inferred here)."""
    copies = registry.copy_types()
    for op in net.ops:
        if op.type in copies:
            raise PlacerError(f"{net.path or net.name}: --inject-copies: op {op.label} already copies between "
                              f"devices", hint="remove the net's copy ops, or run it without --inject-copies")
    # every GPU the net names, however many (cuda:0..N-1, or any subset of them)
    gpus = sorted({op.device.index for op in net.ops if op.device is not None and op.device.is_gpu})
    devs = _Devices(("cpu", *(f"cuda:{g}" for g in gpus)), ("cpu", *("gpu" for _ in gpus)), (0, *gpus))
    placement = existing_placement(net, devs)
    if placement is None:
        return net
    placed = _place(net, placement, devs, outputs_on_host=False, copies_at=READER)
    new = net_from_netdef(placed.predict, placed.init, path=net.path, init_path=net.init_path,
                          source_format=net.source_format, fed=net.external_inputs)
    return replace(new, input_shapes=dict(net.input_shapes), notes=list(net.notes),
                   shape_hints=dict(net.shape_hints))


def _place(net: Net, placement: Sequence[int], devs: "_Devices", outputs_on_host: bool,
           copies_at: str) -> PlacedNet:
    """``place`` over the devices ``devs`` (a machine's, or those a net names)."""
    if copies_at not in (PRODUCER, READER):
        raise ValueError(f"copies_at {copies_at!r}: expected {PRODUCER!r} or {READER!r}")
    placement = [int(d) for d in placement]
    if len(placement) != len(net.ops):
        raise PlacerError(f"placement has {len(placement)} entries for {len(net.ops)} ops")
    if any(not 0 <= d < len(devs.names) for d in placement):
        raise PlacerError(f"placement names a device outside the machine's {len(devs.names)}")
    names = _Names(net)
    host_inputs = _HostInputs()
    reads, readers, final = _versions(net, placement, host_inputs)
    home, other = _copy_names(net, placement, reads, readers, final, devs, names, outputs_on_host)
    state_home = {name: placement[ops[0]] for name, ops in state_writers(net).items()}
    state_copy = _state_copy_names(readers, state_home, devs, names)
    param_name, param_devices, cpu_only = _parameter_names(net, readers, devs, names, state_home)

    def name_on(name: str, p: int, d: int) -> str:
        if p == PARAM:
            return state_copy.get((name, d)) or param_name.get((name, d), name)
        src = HOST if p == EXTERNAL else placement[p]
        return home.get((name, p), name) if src == d else other[(name, p, d)]

    state_copies = [(name, state_home[name], name_on(name, PARAM, state_home[name]), d, blob)
                    for (name, d), blob in state_copy.items()]
    at_reader = readers if copies_at == READER else None
    predict, copies = _predict_net(net, placement, reads, other, home, name_on, devs, host_inputs, state_copies,
                                   at_reader)
    listed = set(predict.external_input)
    for (name, d), blob in param_name.items():
        if blob != name and blob not in listed:
            predict.external_input.append(blob)
            listed.add(blob)
    init = _init_net(net, param_name, param_devices, cpu_only, devs)
    return PlacedNet(predict, init, copies)


class _Names:
    """Fresh blob names: the wanted one, else with _1, _2, ... until unused."""

    def __init__(self, net: Net):
        self.taken = set(net.external_inputs) | set(net.external_outputs) | set(net.params)
        for op in net.ops:
            self.taken.update(op.inputs)
            self.taken.update(op.outputs)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


class _HostInputs:
    """Inputs each op type reads from host memory on any device (``OpDef.host_inputs``),
    looked up in the registry once per type."""

    def __init__(self):
        self._of: dict[str, frozenset] = {}

    def __call__(self, op_type: str) -> frozenset:
        got = self._of.get(op_type)
        if got is None:
            opdef = registry.get(op_type)
            got = self._of[op_type] = frozenset(opdef.host_inputs) if opdef is not None else frozenset()
        return got


def _versions(net: Net, placement: Sequence[int], host_inputs: _HostInputs):
    """Which producer made the blob each op input reads; the devices that read each
    version (one entry per read); the producer of each blob's final version."""
    producer_of = {b: (PARAM if b in net.params else EXTERNAL) for b in net.external_inputs}
    reads: list[list[int]] = []
    readers: dict[tuple[str, int], list[int]] = {}
    for op in net.ops:
        row = [producer_of.get(name, EXTERNAL) for name in op.inputs]
        host, own = host_inputs(op.type), placement[op.index]
        for k, key in enumerate(zip(op.inputs, row)):
            d = HOST if host and k in host else own
            seen = readers.get(key)
            if seen is None:
                readers[key] = [d]
            else:
                seen.append(d)
        reads.append(row)
        for name in op.outputs:
            producer_of[name] = op.index
    return reads, readers, producer_of


def _copy_names(net, placement, reads, readers, final, devs, names, outputs_on_host):
    """Names of each version on its producer's device (``home``, when it must change) and
    of its copy on every other device that reads it (``other[(blob, producer, device)]``)."""
    home: dict[tuple[str, int], str] = {}
    other: dict[tuple[str, int, int], str] = {}
    for out in net.external_outputs:
        p = final.get(out)
        if outputs_on_host and p is not None and p >= 0 and placement[p] != HOST:
            gpu_name = names.fresh(out + devs.suffix(placement[p]))
            home[(out, p)] = gpu_name
            other[(out, p, HOST)] = out
            # the in-place chain that made it keeps one name on that device, so it stays in place
            while out in net.ops[p].inputs:
                prev = reads[p][net.ops[p].inputs.index(out)]
                if prev < 0 or placement[prev] != placement[p]:
                    break
                home[(out, prev)] = gpu_name
                p = prev
    for (name, p), devices in readers.items():
        if p == PARAM:
            continue
        src = HOST if p == EXTERNAL else placement[p]
        for d in dict.fromkeys(devices):
            if d != src and (name, p, d) not in other:
                other[(name, p, d)] = names.fresh(name + devs.suffix(d))
    return home, other


def _state_copy_names(readers, state_home, devs, names) -> dict[tuple[str, int], str]:
    """(state blob, device) -> the name of its per-run copy on a device that reads it away
    from its home (the device of the ops that write it): state changes every run, so the
    copy is made at the top of every run, not once by the init net."""
    out: dict[tuple[str, int], str] = {}
    for (name, p), reading in readers.items():
        if p == PARAM and name in state_home:
            for d in dict.fromkeys(reading):
                if d != state_home[name] and (name, d) not in out:
                    out[(name, d)] = names.fresh(name + devs.suffix(d))
    return out


def _parameter_names(net, readers, devs, names, state_home):
    """(parameter, device) -> the blob name that device reads; which devices read each
    parameter (state: its home only); which parameters' fill ops have no GPU kernel
    (filled on the CPU)."""
    devices: dict[str, list[int]] = {name: [d] for name, d in state_home.items()}
    for (name, p), reading in readers.items():
        if p == PARAM and name not in state_home:
            devices.setdefault(name, [])
            for d in reading:
                if d not in devices[name]:
                    devices[name].append(d)
    cpu_only = _cpu_only_fills(net)
    param_name: dict[tuple[str, int], str] = {}
    for name, used in devices.items():
        if len(used) == 1 and (devs.kinds[used[0]] == "cpu" or name not in cpu_only):
            param_name[(name, used[0])] = name
            continue
        param_name[(name, HOST)] = name
        for d in used:
            if d != HOST:
                param_name[(name, d)] = names.fresh(name + devs.suffix(d))
    return param_name, devices, cpu_only


def _predict_net(net, placement, reads, other, home, name_on, devs, host_inputs, state_copies=(),
                 at_reader=None):
    """Ops in order with their device options and renamed blobs, copies right after
    their producers (external inputs' and state's per-run copies first); with
    ``at_reader`` (the devices reading each version), a copy that a device reads is put
    just before its first reader there instead, as Caffe2 does. Only the inputs and
    outputs whose name changes are written (most keep theirs)."""
    out = pb.NetDef()
    out.CopyFrom(net.proto)
    del out.op[:]
    copies: list[tuple[str, str, str, str]] = []
    for name, src, blob, d, dst in state_copies:
        out.op.append(devs.copy_op(src, d, blob, dst))
        copies.append((name, devs.names[src], devs.names[d], dst))
    by_version: dict[tuple[str, int], list[int]] = {}
    for (name, p, d) in other:
        if at_reader is None or d not in at_reader.get((name, p), ()):
            by_version.setdefault((name, p), []).append(d)

    def copy(name: str, p: int, d: int) -> None:
        src = HOST if p == EXTERNAL else placement[p]
        dst = other[(name, p, d)]
        out.op.append(devs.copy_op(src, d, name_on(name, p, src), dst))
        copies.append((name, devs.names[src], devs.names[d], dst))

    def emit(versions) -> None:
        for name, p in versions:
            for d in by_version.get((name, p), ()):
                copy(name, p, d)

    emit([key for key in by_version if key[1] == EXTERNAL])
    copied: set[tuple[str, int, int]] = set()
    renamed = {(name, p) for name, p, _ in other} | home.keys()   # versions read under another name somewhere
    for op, row, d in zip(net.ops, reads, placement):
        i = op.index
        host = host_inputs(op.type)
        if at_reader is not None:
            for k, (name, p) in enumerate(zip(op.inputs, row)):
                key = (name, p, HOST if host and k in host else d)
                if key in other and key not in copied:
                    copied.add(key)
                    copy(*key)
        new = out.op.add()
        new.CopyFrom(op.proto)
        for k, key in enumerate(zip(op.inputs, row)):
            if key[1] == PARAM or key in renamed:
                name = name_on(*key, HOST if host and k in host else d)
                if name != key[0]:
                    new.input[k] = name
        if home:
            for k, name in enumerate(op.outputs):
                if (name, i) in home:
                    new.output[k] = home[(name, i)]
        devs.set_option(new, d)
        if by_version:
            emit([(name, i) for name in dict.fromkeys(op.outputs) if (name, i) in by_version])
    return out, copies


def _init_net(net, param_name, param_devices, cpu_only, devs):
    """Each fill op on the one device that reads its parameter, else on the CPU with one
    copy per GPU that reads it (a second fill would draw other random values)."""
    if net.init_proto is None:
        return None
    init = pb.NetDef()
    init.CopyFrom(net.init_proto)
    del init.op[:]
    for fill in net.init_proto.op:
        used = [d for o in fill.output for d in param_devices.get(o, [])]
        where = used[0] if len(set(used)) == 1 and param_name.get((fill.output[0], used[0])) == fill.output[0] \
            and not cpu_only.intersection(fill.output) else HOST
        new = init.op.add()
        new.CopyFrom(fill)
        devs.set_option(new, where)
        for o in fill.output:
            for d in param_devices.get(o, []):
                blob = param_name.get((o, d), o)
                if blob != o:
                    init.op.append(devs.copy_op(HOST, d, o, blob))
                    init.external_output.append(blob)
    return init


def _cpu_only_fills(net: Net) -> set[str]:
    """Parameters whose init op has no GPU kernel: filled on the CPU, copied once."""
    out: set[str] = set()
    for fill in (net.init_proto.op if net.init_proto is not None else ()):
        opdef = registry.get(fill.type)
        if opdef is not None and "gpu" not in opdef.devices:
            out.update(fill.output)
    return out


__all__ = ["place", "inject_copies", "PlacedNet", "PRODUCER", "READER"]
