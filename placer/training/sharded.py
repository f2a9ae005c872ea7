"""A train net with its embedding tables sharded table-wise over GPUs, the rest data-parallel.

``sharded(train, init, owners, devices)`` writes, for a one-device train net, the layout
of DLRM-style hybrid parallelism on ``devices`` GPUs, in data_parallel_model's naming
(``placer.training.data_parallel``, whose layout it extends):

1. **Lookups on the owners**: each table stays whole on its owner GPU (``owners``), under
   its one-device name, and its SparseLengths* lookup runs there over the *global* batch
   (its indices and lengths fed to the owner as ``gpu_<o>/<blob>``, G samples).
2. **Exchange**: the pooled outputs go to the GPUs whose samples they are by
   ``AllToAll`` (``placer.ops.collective``: row block i of every rank's input to rank i).
   Tables are dealt into slots (the s-th table of each owner); slot s's input on a GPU
   is its s-th table's pooled output, zero-padded to the slot's width (``Concat`` with
   a ``ConstantFill``), or zeros if it owns fewer tables. GPU i then takes each table's
   rows from its owner's block with ``Slice`` (and its columns, if padded).
3. **Dense part per GPU**: the forward ops of data_parallel_model's layout (``gpu_<i>/``
   scope, loss scaled by 1/n), its backward of all GPUs at once, ``NCCLAllreduce`` of
   every dense gradient, the optimizer per GPU.
4. **Backward of the exchange**: Caffe2's gradient makers: Slice's is SliceGradient,
   AllToAll's is AllToAll of the gradients (a permutation of blocks that is its own
   inverse), Concat's is Split; the lookup's gradient rows end on the owner, whose
   sparse update of the table runs once, there (data_parallel's shared parameters, with
   the owner's device option and rate blob).
5. **Init net**: dense parameters per GPU (broadcast from the first, as
   data_parallel_model does), each table and its optimizer state on its owner only.

Running it on n GPUs with each feeding its b dense rows and the owners the global
indices gives the one-device step's loss and parameters (tests/test_sharding_run.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping

from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import params_from_init
from placer.training.data_parallel import (CUDA_TYPE, DEVICE_BLOB, RATE_BLOB, DataParallelError, _all_reduce,
                                           _backward, _init_net, _Layout, _Names, _net_fields, _parameters,
                                           _passes, _renamed, _replicate, _roles, _seeds, split_train_net)
from placer.training.gradients import make_op

LOOKUP_TYPES = ("SparseLengthsSum", "SparseLengthsMean", "SparseLengthsWeightedSum")


@dataclass
class ShardedNets:
    train: object
    init: object
    devices: list[int]
    owners: dict[str, int]
    replicated: list[str]           # dense parameters, one per GPU
    table_inputs: dict[str, str]    # one-device fed blob of a lookup -> its name on the owner
    losses: list[str]


def sharded(train, init, owners: Mapping[str, int], devices: int, global_batch: int,
            use_nccl: bool = True) -> ShardedNets:
    """The sharded train and init nets (module docstring). ``global_batch``: samples per
    step over all GPUs (each GPU's dense inputs take global_batch / devices rows)."""
    devs = list(range(devices))
    if global_batch % devices:
        raise DataParallelError(f"global batch {global_batch} does not split over {devices} GPUs")
    parts = split_train_net(train)
    params, grads = _parameters(parts, init)
    owners = dict(owners)
    unknown = [t for t in owners if t not in params]
    bad = [t for t, o in owners.items() if o not in devs]
    if unknown or bad:
        raise DataParallelError(f"tables {unknown or bad}: " + ("not parameters of the net" if unknown else
                                f"owners outside GPUs 0..{devices - 1}"))
    layout = _Layout("gpu", devs, use_nccl)
    names = _Names(layout, parts, init, list(owners), grads)
    lookups = {i: op for i, op in enumerate(parts.forward) if op.type in LOOKUP_TYPES and op.input[0] in owners}
    dims = {t: params_from_init(init)[t].shape[-1] for t in owners}
    exchange, fed = _exchange(layout, names, lookups, owners, dims, global_batch // devices, devices)
    dense = copy.copy(parts)
    dense.forward = [op for i, op in enumerate(parts.forward) if i not in lookups]
    forward = exchange + _dense_forward(layout, dense, names)
    seeds = _seeds(layout, parts, names)
    backward, dp_grads = _backward(forward, layout, parts.losses)
    names.shared_grads(dp_grads)
    replicated = [p for p in params if p not in owners]
    reduce_ops = _all_reduce(layout, replicated[::-1], grads, names)
    update = _replicate(parts.update, layout, names, _roles(parts.update, names, params),
                        _passes(parts.update, params, grads))
    table_of = {b: t for op in parts.update for t in op.output if t in owners for b in op.output}
    _to_owners(update, table_of, owners)
    # a table's update reads its owner's rate, which the owner's pass writes: updates last
    update = ([op for op in update if not set(op.output) & set(table_of)]
              + [op for op in update if set(op.output) & set(table_of)])
    net = copy.deepcopy(train)
    del net.op[:]
    net.op.extend(forward + seeds + backward + reduce_ops + update)
    _net_fields(net, layout, train, names)
    init_net = _init_net(init, layout, names, parts, params)
    _to_owners(init_net.op, table_of, owners)
    return ShardedNets(net, init_net, devs, owners, replicated, fed, list(parts.losses))


def _dense_forward(layout: _Layout, parts, names: _Names) -> list:
    """data_parallel's forward: each op per GPU in its scope, each loss scaled by 1/n."""
    ops = []
    for d in layout.devices:
        ops += [_renamed(op, lambda b: names.local(d, b), layout.option(d)) for op in parts.forward]
        for loss in parts.losses:
            scaled = make_op("Scale", [names.local(d, loss)], [names.local(d, loss)], scale=1.0 / len(layout.devices))
            scaled.device_option.CopyFrom(layout.option(d))
            ops.append(scaled)
    return ops


def _exchange(layout: _Layout, names: _Names, lookups: dict, owners: dict[str, int], dims: dict[str, int],
              batch: int, n: int) -> tuple[list, dict[str, str]]:
    """Lookups on the owners, the AllToAll per slot and the Slices (module docstring)."""
    ops, fed = [], {}
    by_owner: dict[int, list] = {d: [] for d in layout.devices}
    for op in lookups.values():
        o = owners[op.input[0]]
        lookup = _renamed(op, lambda b: names.local(o, b), layout.option(o))
        lookup.output[0] = f"{layout.prefix(o)}{op.output[0]}_owned"
        for b in op.input[1:]:
            fed[b] = names.local(o, b)
        ops.append(lookup)
        by_owner[o].append((op, lookup.output[0]))
    widths = {o: [dims[op.input[0]] for op, _ in tables] for o, tables in by_owner.items()}
    slots = max((len(v) for v in by_owner.values()), default=0)
    for s in range(slots):
        width = max(widths[o][s] for o in layout.devices if s < len(widths[o]))
        sends = []
        for o in layout.devices:
            send = f"{layout.prefix(o)}_shard_send_{s}"
            if s < len(by_owner[o]):
                own = by_owner[o][s][1]
                if widths[o][s] < width:
                    pad = layout.op("ConstantFill", [], [f"{send}_pad"], layout.option(o),
                                    shape=[batch * n, width - widths[o][s]], value=0.0)
                    ops.append(pad)
                    ops.append(layout.op("Concat", [own, pad.output[0]], [send, f"{send}_dims"], layout.option(o),
                                         axis=1))
                else:
                    send = own
            else:
                ops.append(layout.op("ConstantFill", [], [send], layout.option(o), shape=[batch * n, width], value=0.0))
            sends.append(send)
        recv = [f"{layout.prefix(d)}_shard_recv_{s}" for d in layout.devices]
        ops.append(layout.op("AllToAll", sends, recv, layout.option(layout.devices[0])))
        for d, r in zip(layout.devices, recv):
            for o in layout.devices:
                if s >= len(by_owner[o]):
                    continue
                op, _ = by_owner[o][s]
                rows = layout.op("Slice", [r], [names.local(d, op.output[0]) if widths[o][s] == width
                                               else f"{names.local(d, op.output[0])}_padded"],
                                 layout.option(d), starts=[o * batch, 0], ends=[(o + 1) * batch, -1])
                ops.append(rows)
                if widths[o][s] < width:
                    ops.append(layout.op("Slice", [rows.output[0]], [names.local(d, op.output[0])], layout.option(d),
                                         starts=[0, 0], ends=[-1, widths[o][s]]))
    return ops, fed


def _to_owners(ops, table_of: dict[str, str], owners: dict[str, int]) -> None:
    """Ops that write a table or its optimizer state run on the table's owner, and read the
    owner's per-device blobs (its rate and ONE blobs) instead of the first GPU's."""
    for op in ops:
        table = next((table_of[b] for b in op.output if b in table_of), None)
        if table is None:
            continue
        o = owners[table]
        extra = [e for e in op.device_option.extra_info]
        op.device_option.CopyFrom(pb.DeviceOption(device_type=CUDA_TYPE, device_id=o))
        op.device_option.extra_info.extend(extra)
        op.input[:] = [_owner_blob(b, o) for b in op.input]


def _owner_blob(blob: str, o: int) -> str:
    if blob.startswith("gpu_"):
        scope, _, rest = blob.partition("/")
        if RATE_BLOB.match(rest) or DEVICE_BLOB.match(rest):
            return f"gpu_{o}/{rest}"
    m = RATE_BLOB.match(blob)
    if m and m["dev"].startswith("_gpu"):
        return m["head"] + f"_gpu{o}" + m["tail"]
    m = DEVICE_BLOB.match(blob)
    if m:
        return f"{m['base']}_{CUDA_TYPE}_{o}"
    return blob
