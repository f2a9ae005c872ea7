"""A train net as the sharding planner sees it: embedding tables and the dense part.

**Tables.** A table is a parameter read by a SparseLengths{Sum,Mean,WeightedSum} lookup
and updated in place by an op after the backward pass (RowWiseSparseAdagrad,
SparseAdagrad, ScatterWeightedSum, ...). Its *group* of ops: the lookups, the update
ops, and every op whose outputs only the group reads (its gradient op: the
SparseLengthsIndicesInGradient*Gradient that turns the pooled output's gradient into the
gradient rows). Everything else is the *dense part*, which data parallelism replicates.

**Pricing a shard** (``TableOps.price``): the group's ops re-typed for the shard (rows x
columns of the table and of its optimizer state; the lookups' indices and the pooled
outputs for the samples it serves) and priced one by one by placer's cost model
(``CostModel.op_time``, the same figures ``placer plan`` uses), output types coming from
the ops' own shape inference. The bytes of the group's other tensors (indices, pooled
outputs and their gradients, gradient rows) are the shard's transient memory.

**The dense part at a per-replica batch** (``dense_model``): forward, backward and
optimizer seconds of the dense ops on each device, when each dense gradient is ready
(into the backward pass: the all-reduce can start then), when the pooled outputs'
gradients are (the backward exchange can start then), and the memory of one replica:
dense parameters, their gradients and optimizer state, and the peak of its live
activations (pooled outputs included), from the ops' order as ``placer plan`` counts it.

A train net at another batch: ``ScaledTrainNet`` divides the first dimension of every fed
blob (a file's train net, at its global batch); ``DlrmTrainNet`` builds the DLRM of a
config at that batch (MSE loss, as facebookresearch/dlrm's default).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from placer.costs.model import CostModel, annotate, tensor_table
from placer.costs.precision import byte_scale, scales_bytes
from placer.errors import PlacerError
from placer.examples import dlrm
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.sharding.types import Table
from placer.shapes import infer, require_complete
from placer.training.backward import backward_ops
from placer.training.data_parallel import split_train_net
from placer.training.recipe import OptimizerChoice, make_train_nets
from placer.types import Net, TensorType, TypedNet

# lookup op type -> input positions (data, weights, indices, lengths); -1: none
LOOKUPS = {"SparseLengthsSum": (0, -1, 1, 2), "SparseLengthsMean": (0, -1, 1, 2),
           "SparseLengthsWeightedSum": (0, 1, 2, 3)}
GRAD_SUFFIX = re.compile(r"^_?(?P<blob>.+?)_grad(?:_autosplit_\d+)?$")


class ShardingInputError(PlacerError):
    """A net the sharding planner cannot read as a train net with embedding tables."""


# ------------------------------------------------------------------ typing a train net

def typed_train_net(net: Net, shapes: dict[str, TensorType] | None = None) -> TypedNet:
    """Shapes of every blob of a train net: the init net's blobs from its own shape
    inference (optimizer state filled like its parameter), the fed blobs from ``shapes``,
    and a gradient whose shape depends on values (Split by a Concat's split info) from
    the blob it is the gradient of."""
    given = dict(_init_types(net))
    given.update(shapes or {})
    for _ in range(4):
        typed = infer(net, given)
        hints = {blob: typed.blobs[m["blob"]] for blob in typed.missing
                 for m in [GRAD_SUFFIX.match(blob)] if m and typed.blobs.get(m["blob"]) is not None}
        if not hints:
            break
        given.update(hints)
    return require_complete(typed)


def _init_types(net: Net) -> dict[str, TensorType]:
    if net.init_proto is None:
        return {}
    init = net_from_netdef(net.init_proto)
    return {b: t for b, t in infer(init, {}).blobs.items() if t is not None and b not in net.params}


def init_blobs(net: Net) -> set[str]:
    return {b for op in (net.init_proto.op if net.init_proto is not None else ()) for b in op.output}


# ------------------------------------------------------------------ the phases of a train net

def phases(net: Net) -> tuple[int, int]:
    """(first backward op, first optimizer op): the loss seeds start the backward pass, the
    op after the last gradient op starts the optimizer (``data_parallel.split_train_net``)."""
    parts = split_train_net(net.proto)
    n = len(net.ops)
    return len(parts.forward), n - len(parts.update)


def gradient_names(net: Net) -> dict:
    """{blob: its gradient's name (or GradientSlice)} as the backward pass names them."""
    parts = split_train_net(net.proto)
    return backward_ops(parts.forward, parts.losses)[1]


# ------------------------------------------------------------------ tables

@dataclass
class TableOps:
    """A table, the ops of its group (net order) and the blobs its pricing re-types."""

    table: Table
    ops: list[int]
    lookups: list[int]
    updates: list[int]
    state: list[str]
    indices: set[str]
    lengths: set[str]
    pooled: list[str]                       # the lookups' outputs (read by the dense part)
    batch: int                              # samples per replica in the net it came from

    def price(self, typed: TypedNet, model: CostModel, device: int, rows: int, cols: int,
              lookups: float, samples: int, update_lookups: float | None = None) -> "GroupCost":
        """Seconds of the group's forward ops, backward ops and update ops for a shard of
        ``rows`` x ``cols`` serving ``samples`` samples with ``lookups`` indices
        (``update_lookups``: the rows the update visits, if not ``lookups``), on
        ``device``; and the bytes of the group's tensors other than the table and state."""
        return _price_group(self, typed, model, device, rows, cols, int(round(lookups)), samples,
                            int(round(lookups if update_lookups is None else update_lookups)))


@dataclass(frozen=True)
class GroupCost:
    forward_s: float
    backward_s: float
    update_s: float
    transient_bytes: float


def find_tables(typed: TypedNet, first_backward: int, first_update: int,
                precision: str | None = None) -> list[TableOps]:
    """Every embedding table of a train net with its group of ops (module docstring); its
    row and state bytes sized by ``precision`` (``placer.costs.precision``; None: the net's)."""
    net = typed.net
    made_by_init = init_blobs(net)
    readers: dict[str, list[int]] = {}
    for op in net.ops:
        for b in set(op.inputs):
            readers.setdefault(b, []).append(op.index)
    producer = {out: op.index for op in net.ops for out in op.outputs}
    found = []
    for name, t in net.params.items():
        lookups = [i for i in readers.get(name, []) if net.ops[i].type in LOOKUPS
                   and net.ops[i].inputs[0] == name and i < first_backward]
        if not lookups:
            continue
        updates = [op.index for op in net.ops[first_update:] if name in op.outputs]
        others = [i for i in readers.get(name, []) if i not in lookups and i not in updates]
        if not updates or others:
            what = "no update op writes it" if not updates else f"op {net.ops[others[0]].label} reads it too"
            raise ShardingInputError(f"{net.path or net.name}: embedding table '{name}': {what}",
                                     hint="a table is read by SparseLengths* lookups and updated by its "
                                          "sparse optimizer only; make the train net with `placer train-net`")
        found.append(_table_ops(typed, name, t, lookups, updates, readers, producer, made_by_init, precision))
    return found


def _table_ops(typed, name, t: TensorType, lookups, updates, readers, producer, made_by_init,
               precision: str | None = None) -> TableOps:
    net = typed.net
    group = set(lookups) | set(updates)
    grew = True
    while grew:  # producers all of whose outputs only the group reads
        grew = False
        for i in sorted(group):
            for b in net.ops[i].inputs:
                p = producer.get(b)
                if p is None or p in group or p in lookups:
                    continue
                outs = net.ops[p].outputs
                if all(set(readers.get(o, [])) <= group for o in outs) and p > max(lookups):
                    group.add(p)
                    grew = True
    first = net.ops[lookups[0]]
    _, w, ix, ln = LOOKUPS[first.type]
    indices = {net.ops[i].inputs[LOOKUPS[net.ops[i].type][2]] for i in lookups}
    indices |= {net.ops[i].inputs[LOOKUPS[net.ops[i].type][1]] for i in lookups if LOOKUPS[net.ops[i].type][1] >= 0}
    lengths = {net.ops[i].inputs[LOOKUPS[net.ops[i].type][3]] for i in lookups}
    state = sorted({b for i in updates for b in net.ops[i].outputs if b != name and b in made_by_init})
    n_idx = typed.blobs[first.inputs[ix]].shape[0]
    samples = typed.blobs[first.inputs[ln]].shape[0]
    if len(t.shape) != 2:
        raise ShardingInputError(f"{net.path or net.name}: embedding table '{name}' is {t}; a table has 2 dimensions")
    state_row = sum(float(np.prod(typed.blobs[s].shape[1:], dtype=np.float64)) * typed.blobs[s].itemsize
                    * _param_scale(precision, typed.blobs[s].dtype)
                    for s in state if typed.blobs.get(s) is not None and typed.blobs[s].shape[:1] == t.shape[:1])
    table = Table(name, int(t.shape[0]), int(t.shape[1]), int(t.itemsize * _param_scale(precision, t.dtype)),
                  pooling=n_idx * len(lookups) / max(samples, 1), state_bytes_per_row=state_row,
                  index_bytes=typed.blobs[first.inputs[ix]].itemsize)
    return TableOps(table, sorted(group), lookups, updates, state, indices, lengths,
                    [out for i in lookups for out in net.ops[i].outputs], samples)


def _price_group(ops: TableOps, typed: TypedNet, model: CostModel, device: int, rows: int, cols: int,
                 lookups: int, samples: int, update_lookups: int) -> GroupCost:
    net, table = typed.net, ops.table
    blobs: dict[str, TensorType] = {}
    seconds = {"forward": 0.0, "backward": 0.0, "update": 0.0}
    transient = 0.0
    made_here: set[str] = set()
    for i in ops.ops:
        op = net.ops[i]
        phase = "forward" if i in ops.lookups else "update" if i in ops.updates else "backward"
        n_idx = update_lookups if phase == "update" else lookups
        inputs = [blobs.get(b) or _shard_type(ops, typed, b, rows, cols, n_idx, samples) for b in op.inputs]
        if phase == "update" and update_lookups != lookups:  # the update visits the gathered rows
            inputs = [TensorType((update_lookups,) + t.shape[1:], t.dtype)
                      if (b in ops.indices or b in made_here) and t.shape[:1] == (lookups,) else t
                      for b, t in zip(op.inputs, inputs)]
        opdef = registry.get(op.type)
        outputs = [t for t in opdef.infer(inputs, op.args) if t is not None]
        feats = opdef.cost(inputs, outputs, op.args)
        seconds[phase] += model.op_time(op.type, inputs, op.args, feats, device)[0]
        for b, tt in zip(op.outputs, outputs):
            if b not in blobs and b != table.name and b not in ops.state and b not in made_here:
                transient += tt.nbytes
                made_here.add(b)
            blobs[b] = tt
        for b, tt in zip(op.inputs, inputs):
            if b not in blobs and b != table.name and b not in ops.state and b not in made_here:
                transient += tt.nbytes if b in ops.indices | ops.lengths or tt.ndim > 1 else 0.0
                made_here.add(b)
            blobs.setdefault(b, tt)
    return GroupCost(seconds["forward"], seconds["backward"], seconds["update"], transient)


def _shard_type(ops: TableOps, typed: TypedNet, blob: str, rows: int, cols: int, lookups: int,
                samples: int) -> TensorType:
    """A blob entering the group, re-typed for the shard (module docstring)."""
    t = typed.blobs[blob]
    table = ops.table
    if blob == table.name:
        return TensorType((rows, cols), t.dtype)
    if blob in ops.state:
        shape = list(t.shape)
        if shape and shape[0] == table.rows:
            shape[0] = rows
        if len(shape) > 1 and shape[-1] == table.dim:
            shape[-1] = cols
        return TensorType(tuple(shape), t.dtype)
    if blob in ops.indices:
        return TensorType((lookups,) + t.shape[1:], t.dtype)
    if blob in ops.lengths:
        return TensorType((samples,) + t.shape[1:], t.dtype)
    if t.ndim >= 1 and t.shape[0] == ops.batch:  # the pooled output's gradient
        rest = t.shape[1:-1] + ((cols,) if t.ndim > 1 and t.shape[-1] == table.dim else t.shape[-1:])
        return TensorType((samples,) + rest if t.ndim > 1 else (samples,), t.dtype)
    return t


# ------------------------------------------------------------------ the dense part

@dataclass
class DenseModel:
    """The dense part of one replica at ``batch`` samples; seconds per machine device."""

    batch: int
    forward_s: np.ndarray                   # [k]
    backward_s: np.ndarray                  # [k]
    optimizer_s: np.ndarray                 # [k]
    exchange_ready_s: np.ndarray            # [k] into the backward: pooled outputs' gradients made
    gradients: list[tuple[str, float, np.ndarray]]  # (param, bytes, [k] ready into the backward)
    param_bytes: float                      # dense parameters and their optimizer state
    gradient_bytes: float
    activation_bytes: float                 # peak of live activations (gradients included)

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.activation_bytes


@dataclass
class TrainView:
    """One typed train net at a per-replica batch: its tables and dense part."""

    typed: TypedNet
    tables: list[TableOps]
    dense: DenseModel
    model: CostModel
    precision: str = "fp32"                 # what ran (``NetCosts.precision``)


def train_view(typed: TypedNet, machine, model: CostModel | None = None, precision: str | None = None) -> TrainView:
    """The view of ``typed`` priced on ``machine`` by ``model`` (or one built with
    ``precision``), tables and dense memory sized by the model's precision."""
    first_backward, first_update = phases(typed.net)
    costs = annotate(typed, machine, model=model, precision=precision)
    sized = costs.model.precision if scales_bytes(costs.model.precision) else None
    tables = find_tables(typed, first_backward, first_update, sized)
    dense = dense_model(typed, tables, costs.op_s, first_backward, first_update, sized)
    return TrainView(typed, tables, dense, costs.model, costs.precision)


def _param_scale(precision: str | None, dtype: str) -> float:
    """How a parameter's (or its optimizer state's) bytes scale under ``precision``."""
    return 1.0 if precision is None else byte_scale(precision, dtype, True)


def dense_model(typed: TypedNet, tables: list[TableOps], op_s: np.ndarray, first_backward: int,
                first_update: int, precision: str | None = None) -> DenseModel:
    net = typed.net
    n = len(net.ops)
    in_table = np.zeros(n, bool)
    for t in tables:
        in_table[t.ops] = True
    dense = ~in_table
    phase = np.zeros(n, np.int64)
    phase[first_backward:first_update] = 1
    phase[first_update:] = 2
    times = op_s * dense[:, None]
    backward_cum = np.cumsum(times * (phase == 1)[:, None], axis=0)
    grads = gradient_names(net)
    last_writer = {}
    for op in net.ops[first_backward:first_update]:
        for b in op.outputs:
            last_writer[b] = op.index
    table_names = {t.table.name for t in tables}
    made_by_init = init_blobs(net)
    read_forward = {b for op in net.ops[:first_backward] for b in op.inputs}
    gradients = []
    for p in net.params:
        g = grads.get(p)
        if p in table_names or p not in read_forward or not isinstance(g, str) or g not in last_writer:
            continue
        gradients.append((p, float(typed.blobs[p].nbytes) * _param_scale(precision, typed.blobs[p].dtype),
                          backward_cum[last_writer[g]].copy()))
    gradients.sort(key=lambda x: float(x[2].max()))
    pooled_grads = [grads.get(b) for t in tables for b in t.pooled]
    ready = [last_writer[g] for g in pooled_grads if isinstance(g, str) and g in last_writer]
    exchange = backward_cum[max(ready)].copy() if ready else np.zeros(op_s.shape[1])
    params, activations = _dense_memory(typed, dense, table_names, made_by_init, tables, precision)
    return DenseModel(batch=_batch(tables, typed), forward_s=times[phase == 0].sum(axis=0),
                      backward_s=times[phase == 1].sum(axis=0), optimizer_s=times[phase == 2].sum(axis=0),
                      exchange_ready_s=exchange, gradients=gradients, param_bytes=params,
                      gradient_bytes=float(sum(g[1] for g in gradients)), activation_bytes=activations)


def _batch(tables: list[TableOps], typed: TypedNet) -> int:
    if tables:
        return tables[0].batch
    fed = [typed.blobs[b] for b in typed.net.data_inputs if typed.blobs.get(b) is not None and typed.blobs[b].ndim]
    return int(fed[0].shape[0]) if fed else 1


def _dense_memory(typed: TypedNet, dense: np.ndarray, table_names: set[str], made_by_init: set[str],
                  tables: list[TableOps], precision: str | None = None) -> tuple[float, float]:
    """(bytes of the dense parameters and optimizer state, peak bytes of the activations a
    replica keeps live): tensors the dense ops make or read, each live from its maker (or
    first reader) to its last reader, params and state excluded."""
    net = typed.net
    table_state = {s for t in tables for s in t.state} | table_names
    touched_state = {b for op in net.ops if dense[op.index] for b in (*op.inputs, *op.outputs)
                     if b in made_by_init and b not in table_state}
    params = float(sum(typed.blobs[b].nbytes * _param_scale(precision, typed.blobs[b].dtype)
                       for b in touched_state if typed.blobs.get(b) is not None))
    tt = tensor_table(typed, precision)
    n = len(net.ops)
    diff = np.zeros(n + 1)
    for t in range(len(tt)):
        name = tt.names[t]
        if name in made_by_init or name in table_state:
            continue
        readers = tt.readers(t)
        p = int(tt.producer[t])
        users = ([p] if p >= 0 else []) + readers.tolist()
        if not users or not any(dense[u] for u in users):
            continue
        diff[min(users)] += tt.nbytes[t]
        diff[max(users) + 1] -= tt.nbytes[t]
    return params, float(np.cumsum(diff)[:n].max()) if n else 0.0


# ------------------------------------------------------------------ train nets at a batch

class ScaledTrainNet:
    """A train net from a file: at another per-replica batch, every fed blob's first
    dimension scaled by batch / (the file's batch)."""

    def __init__(self, net: Net, shapes: dict[str, TensorType] | None = None):
        self.net = net
        typed = typed_train_net(net, shapes)
        made = init_blobs(net)
        self.fed = {b: typed.blobs[b] for b in net.data_inputs if typed.blobs.get(b) is not None and b not in made}
        self.extra = dict(shapes or {})
        first_backward, first_update = phases(net)
        tables = find_tables(typed, first_backward, first_update)
        self.batch = _batch(tables, typed)
        if self.batch < 1:  # every other batch is scaled from this one: it must hold a sample
            fed = ", ".join(f"'{b}' {t}" for b, t in list(self.fed.items())[:3])
            raise ShardingInputError(f"net {net.name or net.path}: batch {self.batch} (fed {fed or 'blobs'}): "
                                     "a training step needs at least one sample",
                                     hint="give the fed blobs a batch of 1 or more with --input")
        self.name = net.name or net.path
        self._typed = {self.batch: typed}

    def typed_at_batch(self, batch: int) -> TypedNet:
        if batch not in self._typed:
            shapes = dict(self.extra)
            for b, t in self.fed.items():
                if not t.ndim:
                    continue
                first = t.shape[0] * batch
                if first % self.batch:
                    raise ShardingInputError(f"fed blob '{b}' {t}: its first dimension does not scale from batch "
                                             f"{self.batch} to {batch}", hint="choose a batch the net's inputs divide by")
                shapes[b] = TensorType((first // self.batch,) + t.shape[1:], t.dtype)
            self._typed[batch] = typed_train_net(self.net, shapes)
        return self._typed[batch]


@dataclass
class DlrmTrainNet:
    """The DLRM of ``config`` (``placer.examples.dlrm``) as a train net at any batch:
    SquaredL2Distance + AveragedLoss on the click probability (dlrm_s_caffe2.py's default
    MSE loss), ``optimizer`` from ``placer train-net`` (rowwise-adagrad: Adagrad on the
    MLPs, RowWiseSparseAdagrad on the tables, as MLPerf's DLRM trains)."""

    config: dlrm.DlrmConfig
    optimizer: str = "rowwise-adagrad"
    lr: float = 0.01
    name: str = field(init=False, default="")
    _typed: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self):
        self.name = self.config.name

    @property
    def batch(self) -> int:
        return self.config.batch

    def typed_at_batch(self, batch: int) -> TypedNet:
        if batch not in self._typed:
            self._typed[batch] = _dlrm_typed(self.config, batch, self.optimizer, self.lr)
        return self._typed[batch]


def _dlrm_typed(config, batch: int, optimizer: str, lr: float) -> TypedNet:
    b = dlrm.build(replace(config, batch=batch))
    b.input("target", (batch, 1))
    b.op("SquaredL2Distance", ["prob_click", "target"], "loss:::sd")
    b.op("AveragedLoss", ["loss:::sd"], "loss")
    net = net_from_netdef(b.predict, b.init, path=f"{config.name}")
    nets = make_train_nets(net, ["loss"], OptimizerChoice(optimizer, lr))
    train = net_from_netdef(nets.train, nets.init, path=f"{config.name} (train net)")
    shapes = {k: TensorType(tuple(s), dt) for k, (dt, s) in b.value_info.items()}
    return typed_train_net(train, shapes)


