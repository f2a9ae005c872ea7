"""The embedding tables of a sharded train net: how each is laid out, and the ops that
look it up, route its indices, fill and update its shards (``placer.sharding.train_net``
writes the net around them).

A table's ``TableLayout`` is one of

    table_wise    whole on one GPU, under its one-device name
    row_wise      rows split over GPUs in contiguous blocks (``<table>_rows_<a>_<b>``)
    column_wise   columns split over GPUs (``<table>_cols_<a>_<b>``), two shards may
                  share a GPU
    host          whole in host memory on the CPU (``cpu_0/`` scope for what it reads)

Each GPU shard's lookup runs over the global batch and is a *piece* of the exchange
(``Piece``): its pooled output goes to the GPUs whose samples they are by the AllToAll
of its slot, and GPU d combines the pieces of a lookup: the one piece of a table-wise
table as it is, the column-wise pieces by ``Concat`` along the columns (in column
order), the row-wise pieces (partial sums, rows of other shards contributing nothing)
by ``Sum``. AllToAll then Sum is a reduce-scatter: each GPU receives and adds one block
per shard, the bytes NCCL's ReduceScatter would move, and the gradients flow back by the
makers' AllToAll and Sum (the same rows to every piece).

Routing a row-wise lookup (on the host CPU, where the fed indices are): the shard of
each index is ``Div(idx, block)`` (integer division by the rows per shard), its row in
the shard ``Sub(idx, Mul(shard, block))``; Caffe2's ``LengthsPartition`` splits the
indices (and a weighted lookup's weights) by shard, keeping each sample's count per
shard, and ``CopyCPUToGPU`` sends each part to its shard's GPU. A mean lookup cannot be
split into partial means and is refused.

A host table's lookup, its gradient and its sparse update run on the CPU over the
global batch; ``Split`` cuts the pooled rows into the GPUs' blocks and ``CopyCPUToGPU``
sends each (their gradients: ``CopyGPUToCPU``, then ``Concat``). Its optimizer reads the
CPU's rate (``<Optimizer>_<n>_lr_cpu``, the one-device LearningRate on the CPU) and the
CPU's ``ONE``/``wd`` blobs. Caffe2 has no unified memory: a plan's uvm and uvm_caching
tables are written as host tables (``TableLayout.note`` says so).

Shards are filled in the init net on their device: a GivenTensor*Fill's values are cut,
ConstantFill/UniformFill/GaussianFill (and Xavier/MSRA fills cut by rows, whose fan-in
stays) take the shard's shape; any other fill makes the whole table there and
``Slice`` cuts it. Optimizer state with a row per table row is cut by rows, and by
columns when it has the table's columns too; a column shard of a row-wise optimizer
keeps its own per-row state over its columns (as TorchRec's column-wise tables do), so
its step is not the one-device step.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from placer.formats import caffe2_pb as pb
from placer.formats.convert import set_arg
from placer.sharding import types as st
from placer.sharding.types import COLUMN_WISE, HOST, ROW_WISE, TABLE_WISE
from placer.training.data_parallel import CPU_TYPE, CUDA_TYPE, DEVICE_BLOB, RATE_BLOB, DataParallelError
from placer.training.gradient_registry import make_op

HOST_DEVICE = -1                   # a shard in host memory, on the CPU
HOST_SCOPE = "cpu_0/"
LOOKUP_TYPES = ("SparseLengthsSum", "SparseLengthsMean", "SparseLengthsWeightedSum")
SHAPED_FILLS = ("ConstantFill", "UniformFill", "GaussianFill", "UniformIntFill")
FAN_IN_FILLS = ("XavierFill", "MSRAFill")      # scale from shape[1:]: a row block keeps it


@dataclass(frozen=True)
class TableShard:
    """Rows [rows[0], rows[1]) x columns [cols[0], cols[1]) of a table on GPU ``device``
    (``HOST_DEVICE``: the CPU)."""

    device: int
    rows: tuple[int, int]
    cols: tuple[int, int]

    def suffix(self, kind: str) -> str:
        if kind == ROW_WISE:
            return f"_rows_{self.rows[0]}_{self.rows[1]}"
        if kind == COLUMN_WISE:
            return f"_cols_{self.cols[0]}_{self.cols[1]}"
        return ""


@dataclass(frozen=True)
class TableLayout:
    kind: str
    shards: tuple[TableShard, ...]
    note: str = ""

    @staticmethod
    def table_wise(owner: int, rows: int, dim: int) -> "TableLayout":
        return TableLayout(TABLE_WISE, (TableShard(owner, (0, rows), (0, dim)),))

    @staticmethod
    def row_wise(devices, rows: int, dim: int) -> "TableLayout":
        """Blocks of ceil(rows / n) rows (the last one shorter), in ``devices`` order."""
        block = math.ceil(rows / len(devices))
        return TableLayout(ROW_WISE, tuple(TableShard(d, (i * block, min(rows, (i + 1) * block)), (0, dim))
                                           for i, d in enumerate(devices) if i * block < rows))

    @staticmethod
    def column_wise(devices, rows: int, dim: int) -> "TableLayout":
        """Equal column blocks, the j-th on ``devices[j]``."""
        if dim % len(devices):
            raise DataParallelError(f"{dim} columns do not split evenly over {len(devices)} shards")
        w = dim // len(devices)
        return TableLayout(COLUMN_WISE, tuple(TableShard(d, (0, rows), (j * w, (j + 1) * w))
                                              for j, d in enumerate(devices)))

    @staticmethod
    def host(rows: int, dim: int, note: str = "") -> "TableLayout":
        return TableLayout(HOST, (TableShard(HOST_DEVICE, (0, rows), (0, dim)),), note)

    def blob(self, table: str, shard: TableShard) -> str:
        return table + shard.suffix(self.kind)


def check_layout(table: str, layout: TableLayout, shape, devices: int) -> None:
    """The shards tile the table (rows x columns) the way its kind lays it out, and sit
    on GPUs 0..devices-1 (a host table's on the CPU)."""
    rows, dim = shape[0], (shape[1] if len(shape) > 1 else 1)
    where = {s.device for s in layout.shards}
    if layout.kind not in (TABLE_WISE, ROW_WISE, COLUMN_WISE, HOST) or not layout.shards:
        raise DataParallelError(f"table {table}: unknown layout {layout.kind!r} or no shards")
    if layout.kind == HOST and where != {HOST_DEVICE}:
        raise DataParallelError(f"table {table}: a host table's shard sits on the CPU (device {HOST_DEVICE}), "
                                f"not on {sorted(where)}")
    if layout.kind != HOST and not where <= set(range(devices)):
        raise DataParallelError(f"table {table}: shards on {sorted(where)}, outside GPUs 0..{devices - 1}")
    if layout.kind == ROW_WISE:
        block = layout.shards[0].rows[1]
        want = [TableShard(s.device, (i * block, min(rows, (i + 1) * block)), (0, dim))
                for i, s in enumerate(layout.shards)]
        what = f"blocks of {block} rows in row order (the last one shorter), as lookups are routed by division"
    elif layout.kind == COLUMN_WISE:
        ends = [0] + [s.cols[1] for s in layout.shards]
        want = [TableShard(s.device, (0, rows), (ends[j], s.cols[1])) for j, s in enumerate(layout.shards)]
        what = "column blocks side by side in column order"
    else:
        want = [TableShard(layout.shards[0].device, (0, rows), (0, dim))]
        what = "one shard of the whole table"
    covers = (want[-1].rows[1] == rows if layout.kind == ROW_WISE else want[-1].cols[1] == dim)
    if list(layout.shards) != want or not covers or any(s.rows[0] >= s.rows[1] or s.cols[0] >= s.cols[1]
                                                        for s in layout.shards):
        raise DataParallelError(f"table {table} [{rows}, {dim}]: its {layout.kind} shards must be {what}, "
                                f"covering the table")


UVM_NOTE = ("planned as {planned}; Caffe2 has no unified memory (no UVM tables), so it is written as a host table: "
            "rows, lookups and the sparse update on the CPU, pooled rows copied to the GPUs")


def layout_of_option(option, ranks: list, shape) -> TableLayout | None:
    """The layout a plan's ``ShardingOption`` is written as (None: data-parallel, the
    net's own layout); ``ranks``: the plan's GPUs, whose positions number the GPUs of the
    net. uvm and uvm_caching tables become host tables with a note (module docstring)."""
    rows, dim = shape[0], shape[-1]
    if option.sharding_type == st.DATA_PARALLEL:
        return None
    if option.kernel == st.HOST:
        return TableLayout.host(rows, dim)
    if option.kernel in (st.UVM, st.UVM_CACHING):
        return TableLayout.host(rows, dim, UVM_NOTE.format(planned=f"{option.sharding_type}/{option.kernel}"))
    gpus = [ranks.index(s.rank) for s in option.shards]
    if option.sharding_type == st.TABLE_WISE:
        return TableLayout.table_wise(gpus[0], rows, dim)
    if option.sharding_type == st.ROW_WISE:
        return TableLayout(ROW_WISE, tuple(TableShard(g, (s.row_offset, min(rows, s.row_offset + s.rows)), (0, dim))
                                           for g, s in zip(gpus, option.shards) if s.row_offset < rows))
    return TableLayout(COLUMN_WISE, tuple(TableShard(g, (0, rows), (s.col_offset, s.col_offset + s.cols))
                                          for g, s in zip(gpus, option.shards)))


@dataclass
class Piece:
    """One GPU's lookup of one shard over the global batch, as the exchange sends it."""

    lookup: object          # the one-device lookup op
    shard: TableShard
    kind: str
    output: str             # its pooled rows on the shard's GPU (global batch x width)
    width: int

    def at(self, d: int) -> str:
        """GPU d's block of it (its samples)."""
        base = f"gpu_{d}/{self.lookup.output[0]}"
        return base + self.shard.suffix(self.kind)


@dataclass
class TableOps:
    """What the tables other than table-wise ones add to the forward pass."""

    ops: list = field(default_factory=list)      # routing, host lookups and copies, GPU lookups
    pieces: list = field(default_factory=list)
    fed: dict = field(default_factory=dict)      # one-device blob -> names it is fed as


def _option(device: int):
    if device == HOST_DEVICE:
        return pb.DeviceOption(device_type=CPU_TYPE, device_id=0)
    return pb.DeviceOption(device_type=CUDA_TYPE, device_id=device)


def _op(op_type: str, inputs, outputs, device: int, **kwargs):
    op = make_op(op_type, list(inputs), list(outputs), **kwargs)
    op.device_option.CopyFrom(_option(device))
    return op


def _feed(fed: dict, blob: str, name: str) -> str:
    names = fed.setdefault(blob, [])
    if name not in names:
        names.append(name)
    return name


def lookup_ops(lookups: list, layouts: dict, dims: dict, batch: int, n: int) -> TableOps:
    """The forward ops of every lookup of a row-wise, column-wise or host table (module
    docstring); ``batch``: samples per GPU, ``n`` GPUs."""
    out = TableOps()
    for op in lookups:
        layout = layouts[op.input[0]]
        if layout.kind == HOST:
            _host_lookup(out, op, layout, batch, n)
        elif layout.kind == COLUMN_WISE:
            for shard in layout.shards:
                gpu = f"gpu_{shard.device}/"
                look = copy.deepcopy(op)
                look.input[:] = [layout.blob(op.input[0], shard)] + [_feed(out.fed, b, gpu + b) for b in op.input[1:]]
                look.output[:] = [gpu + op.output[0] + shard.suffix(COLUMN_WISE)]
                look.device_option.CopyFrom(_option(shard.device))
                out.ops.append(look)
                out.pieces.append(Piece(op, shard, COLUMN_WISE, look.output[0], shard.cols[1] - shard.cols[0]))
        else:
            _row_wise_lookup(out, op, layout, dims[op.input[0]])
    return out


def _host_lookup(out: TableOps, op, layout: TableLayout, batch: int, n: int) -> None:
    look = copy.deepcopy(op)
    look.input[1:] = [_feed(out.fed, b, HOST_SCOPE + b) for b in op.input[1:]]
    look.output[:] = [HOST_SCOPE + op.output[0]]
    look.device_option.CopyFrom(_option(HOST_DEVICE))
    blocks = [f"{HOST_SCOPE}{op.output[0]}_gpu{d}" for d in range(n)]
    out.ops += [look, _op("Split", look.output, blocks, HOST_DEVICE, axis=0, split=[batch] * n)]
    out.ops += [_op("CopyCPUToGPU", [b], [f"gpu_{d}/{op.output[0]}"], d) for d, b in enumerate(blocks)]


def _row_wise_lookup(out: TableOps, op, layout: TableLayout, dim: int) -> None:
    if op.type == "SparseLengthsMean":
        raise DataParallelError(f"table {op.input[0]}: a row-wise SparseLengthsMean cannot be written (the "
                                "shards' partial means do not add up to the mean)",
                                hint="lay the table out table-wise, column-wise or on the host")
    weighted = op.type == "SparseLengthsWeightedSum"
    table = op.input[0]
    weights, idx, lengths = (op.input[1], op.input[2], op.input[3]) if weighted else (None, op.input[1], op.input[2])
    h_idx, h_len = (_feed(out.fed, b, HOST_SCOPE + b) for b in (idx, lengths))
    block = layout.shards[0].rows[1] - layout.shards[0].rows[0]
    base = f"{HOST_SCOPE}{op.output[0]}_route"
    out.ops += [_op("ConstantFill", [], [f"{base}_block"], HOST_DEVICE, shape=[1], value=block, dtype=10),
                _op("Div", [h_idx, f"{base}_block"], [f"{base}_shard"], HOST_DEVICE, broadcast=1),
                _op("Mul", [f"{base}_shard", f"{base}_block"], [f"{base}_first"], HOST_DEVICE, broadcast=1),
                _op("Sub", [h_idx, f"{base}_first"], [f"{base}_row"], HOST_DEVICE, broadcast=1)]
    values = [f"{base}_shard", f"{base}_row"] + ([_feed(out.fed, weights, HOST_SCOPE + weights)] if weighted else [])
    parts = []
    for shard in layout.shards:
        s = shard.suffix(ROW_WISE)
        parts += [f"{HOST_SCOPE}{lengths}{s}", f"{base}{s}_shard", f"{HOST_SCOPE}{idx}{s}"]
        parts += [f"{HOST_SCOPE}{weights}{s}"] if weighted else []
    out.ops.append(_op("LengthsPartition", [h_len] + values, parts, HOST_DEVICE))
    for shard in layout.shards:
        s, gpu = shard.suffix(ROW_WISE), f"gpu_{shard.device}/"
        sent = [f"{lengths}{s}", f"{idx}{s}"] + ([f"{weights}{s}"] if weighted else [])
        out.ops += [_op("CopyCPUToGPU", [HOST_SCOPE + b], [gpu + b], shard.device) for b in sent]
        inputs = [f"{gpu}{weights}{s}"] if weighted else []
        look = copy.deepcopy(op)
        look.input[:] = [layout.blob(table, shard)] + inputs + [f"{gpu}{idx}{s}", f"{gpu}{lengths}{s}"]
        look.output[:] = [f"{gpu}{op.output[0]}{s}"]
        look.device_option.CopyFrom(_option(shard.device))
        out.ops.append(look)
        out.pieces.append(Piece(op, shard, ROW_WISE, look.output[0], dim))


def combine_ops(pieces: list, n: int) -> list:
    """On every GPU, the pooled rows of each lookup from its pieces' blocks: Concat of the
    column pieces in column order, Sum of the row pieces."""
    by_lookup: dict[int, list] = {}
    for p in pieces:
        by_lookup.setdefault(id(p.lookup), []).append(p)
    ops = []
    for group in by_lookup.values():
        lookup, kind = group[0].lookup, group[0].kind
        group = sorted(group, key=lambda p: p.shard.cols if kind == COLUMN_WISE else p.shard.rows)
        for d in range(n):
            pooled = f"gpu_{d}/{lookup.output[0]}"
            if kind == COLUMN_WISE:
                ops.append(_op("Concat", [p.at(d) for p in group], [pooled, pooled + "_cols_dims"], d, axis=1))
            else:
                ops.append(_op("Sum", [p.at(d) for p in group], [pooled], d))
    return ops


# ------------------------------------------------------------------ optimizer and init net

def device_blob(blob: str, device: int) -> str:
    """The name of a device-named optimizer blob (rate, ONE, wd) on a GPU or the CPU."""
    m = RATE_BLOB.match(blob)
    if m:
        return m["head"] + ("_cpu" if device == HOST_DEVICE else f"_gpu{device}") + m["tail"]
    m = DEVICE_BLOB.match(blob)
    if m:
        return f"{m['base']}_{CPU_TYPE}_0" if device == HOST_DEVICE else f"{m['base']}_{CUDA_TYPE}_{device}"
    return blob


def table_update_ops(update: list, table: str, layout: TableLayout, group: set, grad, dp_grads: dict) -> list:
    """The one-device optimizer ops of ``table`` (those writing a blob of ``group``: the
    table, its state, its gradient) written once per shard on the shard's device."""
    ops = []
    for shard in layout.shards:
        s = shard.suffix(layout.kind)
        mine = dp_grads[layout.blob(table, shard)]
        renames = {b: b + s for b in group}
        renames.update({grad.indices: mine.indices, grad.values: mine.values})
        for op in update:
            if not set(op.output) & (group | {grad.indices, grad.values}):
                continue
            new = copy.deepcopy(op)
            new.input[:] = [renames.get(b) or device_blob(b, shard.device) for b in op.input]
            new.output[:] = [renames.get(b) or device_blob(b, shard.device) for b in op.output]
            extra = list(op.device_option.extra_info)
            new.device_option.CopyFrom(_option(shard.device))
            new.device_option.extra_info.extend(extra)
            ops.append(new)
    return ops


def host_producers(ops: list, written: set, sources: list) -> list:
    """Ops making the CPU's device-named blobs that ``ops`` read and nothing writes yet:
    each a copy of the one-device op (in ``sources``) that makes the same blob, on the CPU."""
    out = []
    for op in ops:
        for b in op.input:
            if b in written or not (RATE_BLOB.match(b) or DEVICE_BLOB.match(b)):
                continue
            maker = next((m for m in sources if any(device_blob(o, HOST_DEVICE) == b for o in m.output)), None)
            if maker is None:
                continue
            new = copy.deepcopy(maker)
            new.output[:] = [device_blob(o, HOST_DEVICE) for o in maker.output]
            extra = list(maker.device_option.extra_info)
            new.device_option.CopyFrom(_option(HOST_DEVICE))
            new.device_option.extra_info.extend(extra)
            out.append(new)
            written.update(new.output)
    return out


def shard_fill_ops(init_ops: list, table: str, layout: TableLayout, group: set, shapes: dict) -> list:
    """The init ops of the table's blobs (``group``) cut into the shards, each on its device."""
    rows, dim = shapes[table].shape[0], shapes[table].shape[-1]
    out = []
    for op in init_ops:
        if not set(op.output) & group:
            continue
        for shard in layout.shards:
            out += _shard_fill(op, shard, layout.kind, group, shapes, rows, dim)
    return out


def _cut(shape: tuple, shard: TableShard, rows: int, dim: int) -> tuple[tuple, tuple]:
    """(starts, ends) of the shard in a blob of ``shape`` (rows cut where the blob has a
    row per table row, columns where it has the table's columns too)."""
    starts, ends = [0] * len(shape), list(shape)
    if shape and shape[0] == rows:
        starts[0], ends[0] = shard.rows
        if len(shape) > 1 and shape[1] == dim:
            starts[1], ends[1] = shard.cols
    return tuple(starts), tuple(ends)


def _shard_fill(op, shard: TableShard, kind: str, group: set, shapes: dict, rows: int, dim: int) -> list:
    s = shard.suffix(kind)
    blob = op.output[0]
    shape = shapes[blob].shape
    starts, ends = _cut(shape, shard, rows, dim)
    new = copy.deepcopy(op)
    new.output[:] = [b + s if b in group else b for b in op.output]
    new.input[:] = [b + s if b in group else b for b in op.input]
    new.device_option.CopyFrom(_option(shard.device))
    new_shape = [e - b for b, e in zip(starts, ends)]
    if op.input or (starts, ends) == ((0,) * len(shape), tuple(shape)):
        return [new]                           # shaped like its (cut) input, or whole
    if op.type.startswith("GivenTensor"):
        arg = next(a for a in op.arg if a.name == "values")
        field_name = next(f for f in ("floats", "ints", "strings") if len(getattr(arg, f)))
        block = tuple(slice(b, e) for b, e in zip(starts, ends))
        values = np.array(list(getattr(arg, field_name))).reshape(shape)[block]
        _set(new, "values", values.ravel().tolist())
        _set(new, "shape", new_shape)
        return [new]
    if op.type in SHAPED_FILLS or op.type in FAN_IN_FILLS and starts[1:] == (0,) * (len(shape) - 1) \
            and tuple(ends[1:]) == tuple(shape[1:]):
        _set(new, "shape", new_shape)
        return [new]
    whole = f"{blob}{s}_whole"
    new.output[:] = [whole]
    return [new, _op("Slice", [whole], [blob + s], shard.device, starts=list(starts), ends=list(ends))]


def _set(op, name: str, value) -> None:
    kept = [a for a in op.arg if a.name != name]
    del op.arg[:]
    op.arg.extend(kept)
    set_arg(op.arg.add(name=name), value)
