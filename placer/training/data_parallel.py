"""A train net replicated over devices in the layout of Caffe2's ``data_parallel_model``.

``data_parallel(train, init, devices, kind)`` takes a one-device train net (placer's
``train-net`` output, or one Caffe2 wrote with ``AddGradientOperators`` and an
``optimizer.build_*``) and writes what ``data_parallel_model.Parallelize`` writes for the
same model built on every device (torch 1.8.1's caffe2/python/data_parallel_model.py):

1. **Forward, per device**, in the device's scope: ``<kind>_<d>/`` on every blob, the
   device option (CPU or CUDA, device_id d) on every op, and the loss scaled by
   ``loss_scale = 1/devices`` in place (``Scale(loss) -> loss``), as data_parallel_model
   asks of its ``forward_pass_builder_fun``.
2. **Loss seeds**, per device: ``ConstantFill(<p>/loss) -> <p>/loss_grad`` (value 1.0).
3. **Backward** of all devices at once (Caffe2's ``AddGradientOperators`` on the whole
   net; placer's ``training.backward``), so a parameter that devices share gets its
   contributions concatenated (sparse) as Caffe2 does.
4. **Gradient all-reduce**, gradients in reverse parameter order:
   CPU devices: ``Sum(group) -> group[0]`` on the CPU, then ``Copy`` back to each device;
   GPUs with NCCL: ``NCCLAllreduce(group) -> group`` on the first GPU, each chained to the
   previous one by ``control_input``; GPUs without NCCL: the pairwise ``Sum`` tree
   (``name: "dpm"``) on 2^k devices, then ``Copy`` from the first GPU to each;
   sparse gradients on GPUs: ``Concat`` of indices and of values on the first GPU, then
   ``Copy`` of both back to each GPU.
5. **Optimizer, per device** (the one-device update ops renamed), with what Caffe2's
   optimizer shares written once: the iteration counter, and on CPU devices the
   learning-rate blob (``<Optimizer>_<n>_lr_cpu``); per device the ``ONE_<type>_<id>`` and
   ``wd_<type>_<id>`` blobs and, on GPUs, the rate (``..._lr_gpu<id>``).
6. **Parameter broadcast** in the init net: every blob the init net makes per device is
   copied from the first device (``Copy``; on the CPU under device 0's scope, on a GPU
   under the destination's).

Net: type ``dag``, ``num_workers`` 4 per device, ``first_iter_only_one_worker: 1``.

Shared parameters (kept once, not replicated: the model's parameters data_parallel_model
finds already made before ``Parallelize``): on CPU devices every parameter with a sparse
gradient is shared by default, because data_parallel_model cannot all-reduce gradient
slices there (it asserts); its readers stay per device, its update runs once.

Where placer writes more than Caffe2: on GPUs, an op that Caffe2 lets read a peer GPU's
blob directly (the sparse ``Concat`` on the first GPU; the ``Sum`` tree where GPUs reach
each other) reads a ``Copy`` to its GPU instead, named as Caffe2 names the copies it writes
without peer access (``gpu_<d0>/<blob>_gpu<peer>_copy``): placer's executor reads a blob
only on its own device. The ``Sum`` tree is therefore always the one Caffe2 writes
without peer access.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.training.backward import AUTOGEN_GRAD_SUFFIX, IS_AUTO_GEN_SUM_OPS_TAG, backward_ops
from placer.training.gradient_registry import GradientSlice, make_op

CPU_TYPE, CUDA_TYPE = 0, 1
OVERRIDE_CPU = "device_type_override:cpu"   # ops Caffe2 keeps on the host (the iteration counter)
WORKERS_PER_DEVICE = 4                      # data_parallel_model's num_threads_per_device
# Blobs Caffe2's optimizers name after the device scope: ONE_<type>_<id> (SGD, weight decay,
# RmsProp), wd_<type>_<id> (weight decay's rate), <Optimizer>_<n>_<base>_cpu / _gpu<id>.
DEVICE_BLOB = re.compile(r"^(?P<base>ONE|wd)_\d+_\d+$")
RATE_BLOB = re.compile(r"^(?P<head>\w*Optimizer_\d+_.+?)(?P<dev>_cpu|_gpu\d+)(?P<tail>(?:_lr_mult_.+)?)$")
# Caffe2's SgdOptimizer writes one ONE_<type>_<id> fill per parameter it updates.
SGD_UPDATES = frozenset({"WeightedSum", "ScatterWeightedSum", "MomentumSGDUpdate", "SparseMomentumSGDUpdate"})


class DataParallelError(PlacerError):
    """A train net that cannot be laid out over these devices."""


@dataclass
class TrainParts:
    """A one-device train net cut where Caffe2's backward pass starts and ends."""

    forward: list
    losses: list[str]
    update: list


@dataclass
class DataParallelNets:
    train: object
    init: object
    devices: list[int]
    kind: str
    params: list[str]            # replicated, by their one-device names
    shared: list[str]            # kept once
    losses: list[str]


@dataclass
class _Layout:
    kind: str
    devices: list[int]
    use_nccl: bool
    ops: list = field(default_factory=list)    # what ``add`` writes (the all-reduce)

    def prefix(self, d: int) -> str:
        return f"{self.kind}_{d}/"

    def option(self, d: int):
        return pb.DeviceOption(device_type=CUDA_TYPE if self.kind == "gpu" else CPU_TYPE, device_id=d)

    def op(self, op_type: str, inputs, outputs, option, **kwargs):
        op = make_op(op_type, list(inputs), list(outputs), **kwargs)
        op.device_option.CopyFrom(option)
        return op

    def add(self, op_type: str, inputs, outputs, option, **kwargs):
        self.ops.append(self.op(op_type, inputs, outputs, option, **kwargs))
        return self.ops[-1]


# ------------------------------------------------------------------ reading the one-device net

def split_train_net(train) -> TrainParts:
    """Forward ops, losses (from the loss seeds ``ConstantFill(L) -> L_autogen_grad``) and
    the optimizer ops after the last gradient op."""
    ops = list(train.op)
    seeds = [i for i, op in enumerate(ops) if _is_seed(op)]
    if not seeds:
        raise DataParallelError(f"net '{train.name}': no loss seed (ConstantFill(loss) -> "
                                f"loss{AUTOGEN_GRAD_SUFFIX}): not a train net",
                                hint="make one with `placer train-net`, or Caffe2's AddGradientOperators")
    last = max(i for i, op in enumerate(ops) if op.is_gradient_op or _is_sum_of_gradients(op) or i in seeds)
    return TrainParts(ops[:seeds[0]], [ops[i].input[0] for i in seeds], ops[last + 1:])


def _is_seed(op) -> bool:
    return (op.type == "ConstantFill" and not op.is_gradient_op and len(op.input) == 1
            and list(op.output) == [op.input[0] + AUTOGEN_GRAD_SUFFIX])


def _is_sum_of_gradients(op) -> bool:
    return f"{IS_AUTO_GEN_SUM_OPS_TAG}:1" in op.device_option.extra_info


def _grad_names(g) -> tuple[str, ...]:
    return (g.indices, g.values) if isinstance(g, GradientSlice) else (g,)


# ------------------------------------------------------------------ the layout

def data_parallel(train, init, devices: int | Sequence[int] = 4, kind: str = "gpu", use_nccl: bool = True,
                  shared: Sequence[str] | None = None) -> DataParallelNets:
    """The data-parallel train net and init net of a one-device train net (module docstring)."""
    devices = list(range(devices)) if isinstance(devices, int) else [int(d) for d in devices]
    if kind not in ("cpu", "gpu") or not devices or len(set(devices)) != len(devices):
        raise DataParallelError(f"data parallelism over {kind} devices {devices}: give distinct device "
                                "numbers and kind cpu or gpu")
    parts = split_train_net(train)
    params, grads = _parameters(parts, init)
    shared = _shared(params, grads, kind, shared)
    replicated = [p for p in params if p not in shared]
    layout = _Layout(kind, devices, use_nccl)
    names = _Names(layout, parts, init, shared, grads)

    forward = _forward(layout, parts, names)                        # 1.
    seeds = _seeds(layout, parts, names)                            # 2.
    backward, dp_grads = _backward(forward, layout, parts.losses)   # 3.
    names.shared_grads(dp_grads)
    reduce_ops = _all_reduce(layout, replicated[::-1], grads, names)  # 4.
    update = _replicate(parts.update, layout, names, _roles(parts.update, names, params),
                        _passes(parts.update, params, grads))       # 5.
    net = copy.deepcopy(train)
    del net.op[:]
    net.op.extend(forward + seeds + backward + reduce_ops + update)
    _net_fields(net, layout, train, names)
    init_net = _init_net(init, layout, names, parts, params)        # 6.
    return DataParallelNets(net, init_net, devices, kind, replicated, shared, list(parts.losses))


def _parameters(parts: TrainParts, init) -> tuple[list[str], dict]:
    """The parameters (blobs the init net makes that the forward ops read and that get a
    gradient), in the init net's order (Caffe2's model order), and every blob's gradient."""
    _, grads = backward_ops(parts.forward, parts.losses)
    read = {b for op in parts.forward for b in op.input}
    params = list(dict.fromkeys(b for op in init.op for b in op.output if b in grads and b in read))
    return params, grads


def _shared(params: list[str], grads: dict, kind: str, shared: Sequence[str] | None) -> list[str]:
    sparse = [p for p in params if isinstance(grads[p], GradientSlice)]
    shared = list(sparse if shared is None and kind == "cpu" else shared or [])
    unknown = [p for p in shared if p not in params]
    if unknown:
        raise DataParallelError(f"shared parameters {unknown} are not parameters of the net",
                                hint=f"parameters: {', '.join(params)}")
    if kind == "cpu" and set(sparse) - set(shared):
        raise DataParallelError(f"parameters {sorted(set(sparse) - set(shared))} have sparse gradients: "
                                "data_parallel_model cannot all-reduce gradient slices on CPU devices",
                                hint="keep them shared (the default on CPU devices)")
    return shared


def _seeds(layout: _Layout, parts: TrainParts, names: _Names) -> list:
    """``ConstantFill(<p>/loss) -> <p>/loss_grad``, value 1.0, per device and loss."""
    return [layout.op("ConstantFill", [names.local(d, loss)], [names.local(d, loss) + "_grad"],
                      layout.option(d), value=1.0) for d in layout.devices for loss in parts.losses]


class _Names:
    """How a one-device blob is named on device d: shared blobs keep their names, the
    device-named optimizer blobs take the device's, everything else the device's scope."""

    def __init__(self, layout: _Layout, parts: TrainParts, init, shared: list[str], grads: dict):
        self.layout, self.shared_params, self.grads = layout, set(shared), grads
        overridden = [op for op in list(init.op) + parts.update if OVERRIDE_CPU in op.device_option.extra_info]
        self.iteration = {b for op in overridden for b in op.output}
        writes_shared = [op for op in parts.update if set(op.output) & self.shared_params]
        self.shared_state = {b for op in writes_shared for b in list(op.input) + list(op.output)
                             if not self._device_named(b) and b not in self.iteration
                             and not any(b in _grad_names(grads[p]) for p in self.shared_params)}
        self.slice_of: dict[str, str] = {}
        self.update_ops = parts.update

    def touches_shared(self, op) -> bool:
        """An op of a shared parameter's optimizer: it writes the parameter or its state."""
        return any(b in self.shared_params or b in self.shared_state for b in op.output)

    def shared_grads(self, dp_grads: dict) -> None:
        """The all-device gradient of each shared parameter replaces its one-device name."""
        for p in self.shared_params:
            for old, new in zip(_grad_names(self.grads[p]), _grad_names(dp_grads[p])):
                self.slice_of[old] = new

    def _device_named(self, blob: str) -> bool:
        return bool(DEVICE_BLOB.match(blob) or RATE_BLOB.match(blob))

    def is_shared(self, blob: str) -> bool:
        if blob in self.shared_params or blob in self.shared_state or blob in self.iteration:
            return True
        return self.layout.kind == "cpu" and bool(RATE_BLOB.match(blob))

    def local(self, d: int, blob: str) -> str:
        """The forward/backward name of ``blob`` on device d."""
        return blob if blob in self.shared_params else self.layout.prefix(d) + blob

    def update(self, d: int, blob: str) -> str:
        """The optimizer's (and init net's) name of ``blob`` on device d."""
        if blob in self.slice_of:
            return self.slice_of[blob]
        if self.is_shared(blob):
            return blob
        dtype = CUDA_TYPE if self.layout.kind == "gpu" else CPU_TYPE
        m = DEVICE_BLOB.match(blob)
        if m:
            return f"{m['base']}_{dtype}_{d}"
        m = RATE_BLOB.match(blob)
        if m:
            return m["head"] + f"_gpu{d}" + m["tail"]
        return self.layout.prefix(d) + blob


def _renamed(op, rename: Callable[[str], str], option):
    new = copy.deepcopy(op)
    new.input[:] = [rename(b) for b in op.input]
    new.output[:] = [rename(b) for b in op.output]
    new.control_input[:] = [rename(b) for b in op.control_input]
    if OVERRIDE_CPU not in op.device_option.extra_info:
        extra = list(op.device_option.extra_info)
        new.device_option.CopyFrom(option)
        new.device_option.extra_info.extend(extra)
    return new


def _forward(layout: _Layout, parts: TrainParts, names: _Names) -> list:
    ops = []
    scale = 1.0 / len(layout.devices)
    for d in layout.devices:
        ops += [_renamed(op, lambda b: names.local(d, b), layout.option(d)) for op in parts.forward]
        for loss in parts.losses:
            scaled = make_op("Scale", [names.local(d, loss)], [names.local(d, loss)], scale=scale)
            scaled.device_option.CopyFrom(layout.option(d))
            ops.append(scaled)
    return ops


def _backward(forward: list, layout: _Layout, losses: list[str]) -> tuple[list, dict]:
    """Caffe2's backward pass of every device at once, seeded by the per-device
    ``<p>/loss_grad`` blobs (the autogen seeds dropped, their names replaced)."""
    dp_losses = [layout.prefix(d) + loss for d in layout.devices for loss in losses]
    ops, grads = backward_ops(forward, dp_losses)
    seed_names = {loss + AUTOGEN_GRAD_SUFFIX: loss + "_grad" for loss in dp_losses}
    kept = []
    for op in ops:
        if _is_seed(op) and op.output[0] in seed_names:
            continue
        op.input[:] = [seed_names.get(b, b) for b in op.input]
        op.output[:] = [seed_names.get(b, b) for b in op.output]
        kept.append(op)
    grads = {b: (seed_names.get(g, g) if isinstance(g, str) else g) for b, g in grads.items()}
    return kept, grads


EACH, ONCE, ONCE_AS_IS = "each", "once", "once-as-is"


def _roles(ops: list, names: _Names, params: list[str]) -> list[str]:
    """Per optimizer op (update or init): written on EACH device, or ONCE, under the first
    device's scope or, for what Caffe2's optimizer built under a shared parameter's scope,
    with the one-device op's own device option (ONCE_AS_IS). The rate is built with the
    first parameter's optimizer, so it follows that parameter; the k-th ONE fill belongs
    to the k-th SGD update (Caffe2 writes one per update, in the same order)."""
    first_shared = bool(params) and params[0] in names.shared_params
    sgd = [op for op in names.update_ops if op.type in SGD_UPDATES]
    ones = [op for op in ops if _is_one_fill(op)]
    shared_ones = ({id(one) for one, upd in zip(ones, sgd) if names.touches_shared(upd)}
                   if len(ones) == len(sgd) else set())
    roles = []
    for op in ops:
        if id(op) in shared_ones or op.output and names.touches_shared(op):
            roles.append(ONCE_AS_IS)
        elif op.output and all(names.is_shared(b) for b in op.output):
            rate = all(RATE_BLOB.match(b) for b in op.output)
            roles.append(ONCE_AS_IS if rate and first_shared else ONCE)
        else:
            roles.append(EACH)
    return roles


def _is_one_fill(op) -> bool:
    return (op.type == "ConstantFill" and not op.input and len(op.output) == 1
            and op.output[0].startswith("ONE_") and bool(DEVICE_BLOB.match(op.output[0])))


def _passes(ops: list, params: list[str], grads: dict) -> list[list[int]]:
    """The optimizer ops cut into the builder passes that wrote them (weight decay, then the
    optimizer: each visits the parameters in order), so that each pass is written for
    every device before the next, as Caffe2's builders, run once over all devices, do.
    An op of no parameter (the iteration counter, the rate) goes with the next pass."""
    owned = [{p, *_grad_names(grads[p])} for p in params]

    def owner(op) -> int | None:
        return next((i for i, names in enumerate(owned)
                     if any(b in names or b.startswith(params[i] + "_") for b in op.output)), None)
    passes, current, pending, last = [], [], [], -1
    for j, op in enumerate(ops):
        i = owner(op)
        if i is None:
            pending.append(j)
            continue
        if i < last:
            passes.append(current)
            current = []
        current += pending + [j]
        pending, last = [], i
    return [p for p in passes + [current + pending] if p]


def _replicate(ops: list, layout: _Layout, names: _Names, roles: list[str],
               passes: list[list[int]] | None = None) -> list:
    """``ops`` renamed for each device (pass by pass), the ONCE ones on the first device only."""
    out = []
    for group in passes or [list(range(len(ops)))]:
        for k, d in enumerate(layout.devices):
            for j in group:
                op, role = ops[j], roles[j]
                if k and role != EACH:
                    continue
                new = _renamed(op, lambda b: names.update(d, b), layout.option(d))
                if role == ONCE_AS_IS:
                    new.device_option.CopyFrom(op.device_option)
                    new.device_option.SetInParent()
                out.append(new)
    return out


# ------------------------------------------------------------------ all-reduce

def _all_reduce(layout: _Layout, params: list[str], grads: dict, names: _Names) -> list:
    """data_parallel_model's ``_AllReduceBlobsSingleHost`` for the replicated gradients."""
    layout.ops = []
    if len(layout.devices) == 1:
        return layout.ops
    last, gathered = None, set()
    for p in params:
        g = grads[p]
        if isinstance(g, GradientSlice):
            _gather_slices(layout, g, names, gathered)
        elif layout.kind == "cpu":
            group = [names.local(d, g) for d in layout.devices]
            layout.add("Sum", group, [group[0]], layout.option(0))
            _broadcast(layout, group)
        elif layout.use_nccl:
            group = [names.local(d, g) for d in layout.devices]
            op = layout.add("NCCLAllreduce", group, group, layout.option(layout.devices[0]))
            if last is not None:
                op.control_input.append(last)
            last = group[0]
        else:
            _sum_tree(layout, g, names)
    return layout.ops


def _broadcast(layout: _Layout, group: list[str]) -> None:
    """``_Broadcast``: Copy from the first device's blob to every other device's."""
    for d, blob in zip(layout.devices[1:], group[1:]):
        option = layout.option(d) if layout.kind == "gpu" else layout.option(0)
        layout.add("Copy", [group[0]], [blob], option)


def _peer_copy(layout: _Layout, blob: str, stripped: str, src: int, dst: int) -> str:
    """``Copy`` of device src's ``blob`` onto GPU dst, as Caffe2 names it without peer access."""
    return layout.add("Copy", [blob], [f"{layout.prefix(dst)}{stripped}_gpu{src}_copy"],
                      layout.option(dst)).output[0]


def _sum_tree(layout: _Layout, g: str, names: _Names) -> None:
    """``_AllReduce`` without NCCL: Sums of pairs, then of pairs of pairs (16, 8 and 4
    devices; otherwise one Sum of all), each on its first GPU; then the broadcast."""
    devices, group = layout.devices, [names.local(d, g) for d in layout.devices]
    n = len(devices)
    if n in (4, 8, 16):
        rounds, width = [], 1
        while width < n:
            rounds += [(j, j + width) for j in range(0, n, 2 * width)]
            width *= 2
        steps = [list(pair) for pair in rounds]
    else:
        steps = [list(range(n))]
    for step in steps:
        first = devices[step[0]]
        blobs = [group[step[0]]] + [_peer_copy(layout, group[i], g, devices[i], first) for i in step[1:]]
        layout.add("Sum", blobs, [blobs[0]], layout.option(first)).name = "dpm"
    _broadcast(layout, group)


def _gather_slices(layout: _Layout, g: GradientSlice, names: _Names, gathered: set) -> None:
    """Sparse gradients on GPUs: indices and values of every GPU concatenated on the first
    (placer copies the peers' parts there first), then copied back to each GPU; indices
    another slice already gathered are not gathered again."""
    master = layout.devices[0]
    stripped = f"{g.indices}:{g.values}"
    parts = [(g.values, "val")] if g.indices in gathered else [(g.indices, "index"), (g.values, "val")]
    gathered.add(g.indices)
    for part, suffix in parts:
        blobs = [names.local(d, part) for d in layout.devices]
        local = [blobs[0]] + [_peer_copy(layout, b, part, d, master)
                              for d, b in zip(layout.devices[1:], blobs[1:])]
        concat = layout.add("Concat", local, [f"{layout.prefix(master)}{stripped}_{suffix}_concat",
                                              f"{layout.prefix(master)}{stripped}_{suffix}_splitinfo"],
                            layout.option(master), axis=0)
        concat.name = "note:data_parallel_model"
        for d, b in zip(layout.devices, blobs):
            layout.add("Copy", [concat.output[0]], [b], layout.option(d))


# ------------------------------------------------------------------ the init net

def _init_net(init, layout: _Layout, names: _Names, parts: TrainParts, params: list[str]):
    """Model fills per device (shared ones once, as they were), the optimizer's fills per
    device, then the broadcast of every per-device blob from the first device."""
    read = {b for op in parts.forward for b in op.input}
    model = [op for op in init.op if set(op.output) & read]
    optimizer = [op for op in init.op if not set(op.output) & read]
    out = copy.deepcopy(init)
    del out.op[:]
    for op in model:
        if all(b in names.shared_params for b in op.output):
            out.op.append(copy.deepcopy(op))
    for d in layout.devices:
        out.op.extend(_renamed(op, lambda b: names.local(d, b), layout.option(d))
                      for op in model if not all(b in names.shared_params for b in op.output))
    out.op.extend(_replicate(optimizer, layout, names, _roles(optimizer, names, params)))
    per_device = sorted({b[len(layout.prefix(layout.devices[0])):] for op in out.op for b in op.output
                         if b.startswith(layout.prefix(layout.devices[0]))})
    for blob in per_device:
        _broadcast_init(out, layout, blob)
    out.external_input[:] = _per_device(names, layout, out.external_input)
    out.external_output[:] = _per_device(names, layout, out.external_output)
    return out


def _per_device(names: _Names, layout: _Layout, blobs) -> list[str]:
    """A list of one-device blob names as the devices name them (shared ones once)."""
    out: list[str] = []
    for b in blobs:
        out += [b] if names.is_shared(b) else [names.update(d, b) for d in layout.devices]
    return list(dict.fromkeys(out))


def _broadcast_init(out, layout: _Layout, blob: str) -> None:
    first = layout.prefix(layout.devices[0]) + blob
    for d in layout.devices[1:]:
        option = layout.option(d) if layout.kind == "gpu" else layout.option(0)
        out.op.append(layout.op("Copy", [first], [layout.prefix(d) + blob], option))


def _net_fields(net, layout: _Layout, train, names: _Names) -> None:
    net.type = "dag"
    net.num_workers = len(layout.devices) * WORKERS_PER_DEVICE
    del net.arg[:]
    net.arg.extend(copy.deepcopy(list(train.arg)))
    net.arg.add(name="first_iter_only_one_worker", i=1)
    written: set[str] = set()
    inputs: dict[str, None] = {}
    for op in net.op:           # as Caffe2's Net adds them: read before any op writes them
        inputs.update((b, None) for b in op.input if b not in written)
        written.update(op.output)
    net.external_input[:] = list(inputs)
    net.external_output[:] = _per_device(names, layout, train.external_output)
