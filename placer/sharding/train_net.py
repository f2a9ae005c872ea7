"""A train net with its embedding tables sharded over GPUs (or kept on the host), the rest data-parallel.

``sharded(train, init, layouts, devices)`` writes, for a one-device train net, the layout
of DLRM-style hybrid parallelism on ``devices`` GPUs, in data_parallel_model's naming
(``placer.training.data_parallel``, whose layout it extends). ``layouts`` gives each
sharded table a ``TableLayout`` (``placer.sharding.tables``: table-wise,
row-wise, column-wise, host) or, for a table-wise one, its owner GPU; a table it does
not name stays data-parallel.

1. **Lookups on the shards**: a table-wise table stays whole on its owner GPU under its
   one-device name and its SparseLengths* lookup runs there over the *global* batch (its
   indices and lengths fed to the owner as ``gpu_<o>/<blob>``, G samples); a column-wise
   shard likewise for its columns; a row-wise table's indices are routed to its shards
   on the host CPU and each shard sums its own rows; a host table is looked up on the CPU
   (sharded_tables' docstring).
2. **Exchange**: every GPU shard's pooled output (a *piece*) goes to the GPUs whose
   samples they are by ``AllToAll`` (``placer.ops.collective``: row block i of every
   rank's input to rank i). Pieces are dealt into slots (the s-th piece of each GPU);
   slot s's input on a GPU is its s-th piece, zero-padded to the slot's width (``Concat``
   with a ``ConstantFill``), or zeros if it holds fewer pieces. GPU i then takes each
   piece's rows from its GPU's block with ``Slice`` (and its columns, if padded), and
   joins a lookup's pieces (column pieces by ``Concat``, row pieces by ``Sum``).
3. **Dense part per GPU**: the forward ops of data_parallel_model's layout (``gpu_<i>/``
   scope, loss scaled by 1/n), its backward of all GPUs at once, ``NCCLAllreduce`` of
   every dense gradient, the optimizer per GPU.
4. **Backward of the exchange**: Caffe2's gradient makers: Slice's is SliceGradient,
   AllToAll's is AllToAll of the gradients (a permutation of blocks that is its own
   inverse), Concat's is Split, Sum's passes the gradient to every input, CopyCPUToGPU's
   is CopyGPUToCPU; each shard's gradient rows end on its device, whose sparse update of
   the shard runs once, there (data_parallel's shared parameters, with the device's
   rate blob).
5. **Init net**: dense parameters per GPU (broadcast from the first, as
   data_parallel_model does), each table (or shard) and its optimizer state on its
   device only.

Running it on n GPUs with each feeding its b dense rows and the shards the global
indices gives the one-device step's loss and parameters (tests/test_sharding_run.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Mapping

from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import params_from_init
from placer.training.data_parallel import (CUDA_TYPE, DEVICE_BLOB, RATE_BLOB, DataParallelError, _all_reduce,
                                           _backward, _init_net, _Layout, _Names, _net_fields, _parameters,
                                           _passes, _renamed, _replicate, _roles, _seeds, split_train_net)
from placer.training.gradient_registry import GradientSlice, make_op
from placer.sharding.tables import (LOOKUP_TYPES, Piece, TableLayout, TableShard, check_layout, combine_ops,
                                   host_producers, lookup_ops, shard_fill_ops, table_update_ops)
from placer.sharding.types import COLUMN_WISE, TABLE_WISE


@dataclass
class ShardedNets:
    train: object
    init: object
    devices: list[int]
    owners: dict[str, int]          # table-wise tables -> owner GPU
    replicated: list[str]           # dense parameters, one per GPU
    table_inputs: dict[str, list]   # one-device fed blob of a sharded lookup -> the names it is fed as
    losses: list[str]
    layouts: dict[str, TableLayout] = field(default_factory=dict)
    shards: dict[str, list] = field(default_factory=dict)   # table -> [(blob, TableShard)]
    notes: list[str] = field(default_factory=list)          # where the net is not the plan's or the one-device step


def sharded(train, init, layouts: Mapping[str, int | TableLayout], devices: int, global_batch: int,
            use_nccl: bool = True) -> ShardedNets:
    """The sharded train and init nets (module docstring). ``layouts``: table -> its
    ``TableLayout``, or the owner GPU of a table-wise one. ``global_batch``: samples per
    step over all GPUs (each GPU's dense inputs take global_batch / devices rows)."""
    devs = list(range(devices))
    if global_batch % devices:
        raise DataParallelError(f"global batch {global_batch} does not split over {devices} GPUs")
    parts = split_train_net(train)
    params, grads = _parameters(parts, init)
    shapes = params_from_init(init)
    layouts = _checked_layouts(layouts, params, grads, shapes, devices)
    owners = {t: lay.shards[0].device for t, lay in layouts.items() if lay.kind == TABLE_WISE}
    placed = {t: lay for t, lay in layouts.items() if lay.kind != TABLE_WISE}
    table_of = {b: t for op in parts.update for t in op.output if t in layouts for b in op.output}
    group = {t: {b for b, tt in table_of.items() if tt == t} | {t} for t in placed}
    kept, init_kept = _without(parts, init, placed, group, grads)
    kept_params = [p for p in params if p not in placed]

    layout = _Layout("gpu", devs, use_nccl)
    names = _Names(layout, kept, init_kept, list(owners), grads)
    forward, fed = _forward(layout, names, parts, layouts, shapes, global_batch // devices)
    seeds = _seeds(layout, parts, names)
    backward, dp_grads = _backward(forward, layout, parts.losses)
    names.shared_grads(dp_grads)
    replicated = [p for p in params if p not in layouts]
    reduce_ops = _all_reduce(layout, replicated[::-1], grads, names)
    update = _replicate(kept.update, layout, names, _roles(kept.update, names, kept_params),
                        _passes(kept.update, kept_params, grads))
    owned_of = {b: t for b, t in table_of.items() if t in owners}
    _to_owners(update, owned_of, owners)
    # a table's update reads its owner's rate, which the owner's pass writes: updates last
    update = ([op for op in update if not set(op.output) & set(owned_of)]
              + [op for op in update if set(op.output) & set(owned_of)])
    shard_updates = [op for t, lay in placed.items()
                     for op in table_update_ops(parts.update, t, lay, group[t], grads[t], dp_grads)]
    ops = forward + seeds + backward + reduce_ops + update
    written = {b for op in ops for b in op.output}
    ops += host_producers(shard_updates, written, parts.update) + shard_updates    # the CPU's rate first
    net = copy.deepcopy(train)
    del net.op[:]
    net.op.extend(ops)
    _net_fields(net, layout, train, names)
    init_net = _init_net(init_kept, layout, names, kept, kept_params)
    _to_owners(init_net.op, owned_of, owners)
    init_net.op.extend(op for t, lay in placed.items()
                       for op in shard_fill_ops(list(init.op), t, lay, group[t], shapes))
    written |= {b for op in init_net.op for b in op.output}
    init_net.op.extend(host_producers(shard_updates, written, list(init.op)))     # the CPU's ONE / wd blobs
    shard_blobs = {t: [(lay.blob(t, s), s) for s in lay.shards] for t, lay in layouts.items()}
    return ShardedNets(net, init_net, devs, owners, replicated, fed, list(parts.losses), layouts, shard_blobs,
                       _notes(layouts, group, shapes))


def _checked_layouts(layouts: Mapping, params: list[str], grads: dict, shapes: dict, devices: int) -> dict:
    """Every table's ``TableLayout`` (an owner GPU given for a table-wise one), checked."""
    unknown = [t for t in layouts if t not in params]
    if unknown:
        raise DataParallelError(f"tables {unknown}: not parameters of the net")
    out = {t: (TableLayout.table_wise(v, shapes[t].shape[0], shapes[t].shape[-1]) if isinstance(v, int) else v)
           for t, v in layouts.items()}
    for t, lay in out.items():
        check_layout(t, lay, shapes[t].shape, devices)
        if not isinstance(grads[t], GradientSlice):
            raise DataParallelError(f"table {t}: its gradient is dense; only tables read by SparseLengths* "
                                    "lookups can be sharded")
    return out


def _forward(layout: _Layout, names: _Names, parts, layouts: dict, shapes: dict, batch: int) -> tuple[list, dict]:
    """The lookups (and routing) of every sharded table, the exchange, the joins of the
    pieces and the dense forward per GPU; and the names each sharded lookup input is fed as."""
    n = len(layout.devices)
    owners = {t: lay.shards[0].device for t, lay in layouts.items() if lay.kind == TABLE_WISE}
    placed = {t: lay for t, lay in layouts.items() if lay.kind != TABLE_WISE}
    lookups = [op for op in parts.forward if op.type in LOOKUP_TYPES and op.input[0] in layouts]
    others = lookup_ops([op for op in lookups if op.input[0] in placed], placed,
                        {t: shapes[t].shape[-1] for t in placed}, batch, n)
    owned, owned_lookups, fed = _owned_pieces(layout, names, [op for op in lookups if op.input[0] in owners],
                                              owners, {t: shapes[t].shape[-1] for t in owners})
    for b, there in others.fed.items():
        fed.setdefault(b, []).extend(name for name in there if name not in fed[b])
    exchange = owned_lookups + others.ops + _exchange(layout, owned + others.pieces, batch, n)
    dense = copy.copy(parts)
    dense.forward = [op for op in parts.forward if not any(op is lk for lk in lookups)]
    return exchange + combine_ops(others.pieces, n) + _dense_forward(layout, dense, names), fed


def _notes(layouts: dict, group: dict, shapes: dict) -> list[str]:
    """The layouts' notes, and one for the column-wise tables whose optimizer keeps a state
    per row (RowWise*): each shard's is over its own columns. Tables with the same note
    share one line."""
    by_text: dict[str, list[str]] = {}
    for t, lay in layouts.items():
        if lay.note:
            by_text.setdefault(lay.note, []).append(t)
    for t, lay in layouts.items():
        if lay.kind == COLUMN_WISE and any(b in shapes and shapes[b].shape == shapes[t].shape[:1] for b in group[t]):
            by_text.setdefault("column-wise under a row-wise optimizer: each shard keeps its own per-row state over "
                               "its columns (as TorchRec's column-wise tables do), so the steps differ from the "
                               "one-device net's", []).append(t)
    return [f"{_tables_text(tables)}: {text}" for text, tables in by_text.items()]


def _tables_text(tables: list[str]) -> str:
    shown = ", ".join(tables[:3])
    return shown if len(tables) <= 3 else f"{len(tables)} tables ({shown}, ...)"


def _without(parts, init, placed: dict, group: dict, grads: dict):
    """The one-device parts and init net less the optimizer and init ops of the tables in
    ``placed`` (written per shard instead)."""
    blobs = set().union(*group.values()) if group else set()
    blobs |= {b for t in placed for b in (grads[t].indices, grads[t].values)}
    kept = copy.copy(parts)
    kept.update = [op for op in parts.update if not set(op.output) & blobs]
    init_kept = copy.deepcopy(init)
    del init_kept.op[:]
    init_kept.op.extend(op for op in init.op if not set(op.output) & blobs)
    return kept, init_kept


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


def _owned_pieces(layout: _Layout, names: _Names, lookups: list, owners: dict[str, int], dims: dict[str, int]):
    """Each table-wise lookup on its owner, as a piece of the exchange (the pieces, the
    lookups, the fed blobs)."""
    pieces, ops, fed = [], [], {}
    for op in lookups:
        o = owners[op.input[0]]
        lookup = _renamed(op, lambda b: names.local(o, b), layout.option(o))
        lookup.output[0] = f"{layout.prefix(o)}{op.output[0]}_owned"
        for b in op.input[1:]:
            fed.setdefault(b, [])
            if names.local(o, b) not in fed[b]:
                fed[b].append(names.local(o, b))
        ops.append(lookup)
        pieces.append(Piece(op, TableShard(o, (0, 0), (0, 0)), TABLE_WISE, lookup.output[0], dims[op.input[0]]))
    return pieces, ops, fed


def _exchange(layout: _Layout, pieces: list, batch: int, n: int) -> list:
    """The AllToAll per slot of the pieces and the Slices (module docstring)."""
    ops = []
    by_gpu: dict[int, list] = {d: [p for p in pieces if p.shard.device == d] for d in layout.devices}
    slots = max((len(v) for v in by_gpu.values()), default=0)
    for s in range(slots):
        width = max(by_gpu[o][s].width for o in layout.devices if s < len(by_gpu[o]))
        sends = []
        for o in layout.devices:
            send = f"{layout.prefix(o)}_shard_send_{s}"
            if s < len(by_gpu[o]):
                piece = by_gpu[o][s]
                if piece.width < width:
                    pad = layout.op("ConstantFill", [], [f"{send}_pad"], layout.option(o),
                                    shape=[batch * n, width - piece.width], value=0.0)
                    ops.append(pad)
                    ops.append(layout.op("Concat", [piece.output, pad.output[0]], [send, f"{send}_dims"],
                                         layout.option(o), axis=1))
                else:
                    send = piece.output
            else:
                ops.append(layout.op("ConstantFill", [], [send], layout.option(o), shape=[batch * n, width], value=0.0))
            sends.append(send)
        recv = [f"{layout.prefix(d)}_shard_recv_{s}" for d in layout.devices]
        ops.append(layout.op("AllToAll", sends, recv, layout.option(layout.devices[0])))
        for d, r in zip(layout.devices, recv):
            for o in layout.devices:
                if s >= len(by_gpu[o]):
                    continue
                piece = by_gpu[o][s]
                mine = piece.at(d)
                rows = layout.op("Slice", [r], [mine if piece.width == width else f"{mine}_padded"],
                                 layout.option(d), starts=[o * batch, 0], ends=[(o + 1) * batch, -1])
                ops.append(rows)
                if piece.width < width:
                    ops.append(layout.op("Slice", [rows.output[0]], [mine], layout.option(d),
                                         starts=[0, 0], ends=[-1, piece.width]))
    return ops


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
