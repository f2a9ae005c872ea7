"""Where a training step's state lives, and what the other ops pay to reach it.

A train net is one training step (forward, backward, update) run over and over on the
same workspace. The planner prices one step; these are the rules it places by.

1. **State lives on one device.** A blob the init net makes and the train net writes
   (a parameter, its optimizer state -- momentum, squared sums, moments --, the
   iteration counter, SpatialBN's running statistics) is *state*: it persists from step
   to step, so it has one home, and every op that writes it runs there (an op writes its
   outputs on its own device; a copy written elsewhere would be lost or stale by the next
   step). An op that writes several state blobs ties them together: MomentumSGDUpdate
   writes a parameter and its momentum, Adagrad a parameter and its squared sum, so a
   parameter, its update op(s) and its optimizer state form one colocation group
   (``state_groups``).

2. **Reading state elsewhere costs a copy per step.** Any other op that reads state (the
   forward and backward ops that read a weight, LearningRate reading the counter) reads
   the value the previous step's update left at home. On another device that is a copy
   *every step*, because the state changes every step -- unlike an inference parameter,
   which the init net makes once on every device that reads it and never copies again.
   It is priced as a blob made at home by the state's last writer and copied once per
   step to each other device that reads it (``with_state_reads``: a row of the tensor
   table named like the state, its producer the last writer, its readers every reader
   that does not write it). Such a blob is read *before* its producer runs in net order:
   it is the previous step's value, present at home when the step starts, so the makespan
   simulator issues its copies at time 0, as it does a host-fed input's.
   Memory: the copy is counted on the reader's device for the whole step, as a parameter
   is (the state row keeps every reader). A weight is read in the forward pass and again
   by its gradient op in the backward pass, so its copy lives from the first forward
   reader through the backward pass -- all of the step but the updates -- and the step's
   memory peaks at the turn from forward to backward, where every such copy is live: the
   whole-step count is exact at the peak for weights, an upper bound for state read only
   in the forward pass (biases). The copy row itself therefore carries no bytes of its own
   (``t_bytes`` 0); its copy seconds are those of the state's bytes, and the plan's copy
   list reports those bytes (``state_copy_bytes``). The versions of state its writers
   make during the step live in the state's own buffer and carry no bytes either (a read
   of such an updated value later in the same step, on another device -- which Caffe2's
   optimizers never do -- is priced as a copy but not counted in memory).

3. **A dense gradient made elsewhere is copied once to the state's device.** It is a blob
   like any other: made by a backward op on its device, copied once to every other device
   that reads it, however many update ops read it there. An update op that overwrites its
   gradient in place (MomentumSGDUpdate returns the adjusted gradient in its input's
   buffer) writes the copy, so that in-place write does not tie the update to the
   gradient's producer (``inplace_pairs``); every other in-place op still shares a device
   with the producer of the blob it overwrites.

4. **A sparse gradient is copied as rows.** Caffe2's gradient of an embedding lookup is a
   GradientSlice: ``<table>_grad_indices`` (the looked-up row ids) and
   ``<table>_grad_values`` (one row of the table's width per lookup). The sparse update
   (SparseAdagrad, RowWiseSparseAdagrad, SparseMomentumSGDUpdate, ScatterWeightedSum, ...)
   reads those two blobs and the table in place, so a lookup's backward on another device
   costs a copy of lookups x width, never of the table (rule 3 applied to the two blobs).
   The table itself is state (rule 1); a forward lookup placed away from it would copy
   the whole table every step (rule 2), which is why plans keep lookups with their table.

5. Parameters the train net only reads (the constant ONE, weight-decay factors, the
   iteration counter's mutex) are inference parameters: made by the init net on every
   device that reads them, no copy per step.

6. **An in-place output nobody reads adds no memory** (train nets and inference nets
   alike). An op that writes an output named like one of its inputs writes into that
   input's buffer, as Caffe2 and placer's executor do, so an update op's parameter,
   optimizer state and gradient outputs are not counted as scratch memory of its step
   (without this every update step would count its state twice: an embedding table and
   its Adagrad squared sums double). An in-place output that is read later is a version
   of its own: it is live from the in-place op on, and the version it overwrites up to
   that op, so the two overlap during that one op's step (a one-step overcount by the
   blob's size; the executor counts the buffer once).

Tests: ``tests/test_training_plan.py`` checks these rules against brute force (every
placement of small hand-built train nets, costs and memory computed by plain loops from
the rules above).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from placer.costs.model import PARAMETER, TensorTable, stored_nbytes
from placer.types import Net


def state_writers(net: Net) -> dict[str, list[int]]:
    """State blob -> the ops that write it, in net order (rule 1): blobs the init net makes
    (``net.params``) that an op of the net writes."""
    writers: dict[str, list[int]] = {}
    for op in net.ops:
        for name in dict.fromkeys(op.outputs):
            if name in net.params:
                writers.setdefault(name, []).append(op.index)
    return writers


def state_groups(net: Net) -> list[set[int]]:
    """Ops that must share a device (rule 1): the writers of each state blob, merged where
    one op writes several state blobs (a parameter and its optimizer state). Merged by
    union-find over the writers, so many parameters cost one pass."""
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for ops in state_writers(net).values():
        for i in ops:
            parent.setdefault(i, i)
        first = root(ops[0])
        for i in ops[1:]:
            r = root(i)
            if r != first:
                parent[r] = first
    groups: dict[int, set[int]] = {}
    for i in parent:
        groups.setdefault(root(i), set()).add(i)
    return [g for g in groups.values() if len(g) > 1]


def inplace_writes(net: Net) -> list[tuple[int, int, str]]:
    """(op, producer, blob) for every op that overwrites a blob an earlier op made: the two
    share a device. An op that writes state is placed with its state instead: its in-place
    write of a blob that is not state (an update op's gradient) is a write to a copy
    (rule 3)."""
    writer: dict[str, int] = {}
    writes_state = set().union(*state_writers(net).values()) if net.ops else set()
    out = []
    for op in net.ops:
        for name in sorted(set(op.outputs) & set(op.inputs)):
            if name in writer and (op.index not in writes_state or name in net.params):
                out.append((op.index, writer[name], name))
        for name in op.outputs:
            writer[name] = op.index
    return out


def inplace_pairs(net: Net) -> list[tuple[int, int]]:
    """(op, producer of the blob it overwrites) for every in-place op (``inplace_writes``)."""
    return [(op, producer) for op, producer, _ in inplace_writes(net)]


def step_costs(typed, costs):
    """``costs`` (``placer.costs.model.NetCosts``) as the planner prices one step of the net:
    an in-place output nobody reads adds no memory (rule 6) and, on a train net, state
    read away from its device is copied every step (rule 2). Returns (costs, the
    state-copy rows)."""
    tensors, reads = with_state_reads(typed.net, costs.tensors)
    ops = costs.ops.assign(output_bytes=_new_output_bytes(typed, costs.ops["output_bytes"].to_numpy(float),
                                                          costs.sized_by))
    return dataclasses.replace(costs, ops=ops, tensors=tensors), reads


def _new_output_bytes(typed, output_bytes: np.ndarray, precision: str | None = None) -> np.ndarray:
    """Bytes each op's outputs add: an output named like one of the op's inputs is written
    into that input's buffer and adds none (rule 6). ``precision``: the one ``output_bytes``
    was sized by (``NetCosts.sized_by``), so that what is taken off is what was counted."""
    out = output_bytes.copy()
    for op in typed.net.ops:
        types = typed.op_outputs[op.index] if op.index < len(typed.op_outputs) else ()
        for name, t in zip(op.outputs, types):
            if name in op.inputs and t is not None:
                out[op.index] -= stored_nbytes(t, name, op.type, typed.net.params, precision)
    return np.maximum(out, 0.0)


@dataclasses.dataclass(frozen=True)
class StateReads:
    """The copy rows ``with_state_reads`` added: tensor ids and the state's bytes."""

    tensors: np.ndarray     # int [m]: rows of the tensor table
    nbytes: np.ndarray      # float [m]: bytes of the state each row copies

    def __len__(self) -> int:
        return len(self.tensors)


def with_state_reads(net: Net, tensors: TensorTable) -> tuple[TensorTable, StateReads]:
    """``tensors`` with one row per state blob read by an op that does not write it
    (rule 2): named like the state, made by its last writer, read by those ops, zero
    bytes of its own (the state row already counts the memory on every reader's device).
    The versions of state that its writers make in the step are zeroed the same way (they
    are written into the state's own buffer). Returns the table and those rows."""
    writers = state_writers(net)
    names, producer, readers, nbytes = [], [], [], []
    for t in range(len(tensors)):
        name = tensors.names[t]
        if tensors.producer[t] != PARAMETER or name not in writers:
            continue
        others = [int(c) for c in tensors.readers(t) if c not in writers[name]]
        if others:
            names.append(name)
            producer.append(writers[name][-1])
            readers.append(others)
            nbytes.append(float(tensors.nbytes[t]))
    made = np.array([t for t in range(len(tensors)) if tensors.producer[t] >= 0 and tensors.names[t] in writers],
                    np.int64)
    if not names and not len(made):
        return tensors, StateReads(np.zeros(0, np.int64), np.zeros(0))
    counts = np.array([len(r) for r in readers], np.int64)
    own = tensors.nbytes.copy()
    made_bytes = own[made]
    own[made] = 0.0
    table = TensorTable(
        names=list(tensors.names) + names,
        producer=np.concatenate([tensors.producer, np.array(producer, np.int64)]),
        ptr=np.concatenate([tensors.ptr, tensors.ptr[-1] + np.cumsum(counts)]),
        consumers=np.concatenate([tensors.consumers, np.fromiter((c for r in readers for c in r), np.int64)]),
        nbytes=np.concatenate([own, np.zeros(len(names))]),
        external_output=np.concatenate([tensors.external_output, np.zeros(len(names), bool)]))
    ids = np.concatenate([made, np.arange(len(tensors), len(table.names), dtype=np.int64)])
    return table, StateReads(ids, np.concatenate([made_bytes, np.array(nbytes)]))


def price_state_reads(class_s: np.ndarray, machine, reads: StateReads) -> None:
    """Give the copy rows of ``reads`` the copy seconds of the state's bytes over every
    link class (in place: ``class_s``, float [classes, tensors], the cost arrays' or the
    cost graph's ``graph["class_s"]``)."""
    if len(reads):
        class_s[:, reads.tensors] = machine.link_classes().class_seconds(reads.nbytes)


def state_copy_bytes(reads: StateReads, names: list[str], *plans) -> None:
    """Put the bytes of every per-step state copy into the copy lists of ``plans`` (in
    place; a copy row carries none of its own, see rule 2; a PlanCost is skipped)."""
    if not len(reads):
        return
    size = {names[t]: b for t, b in zip(reads.tensors.tolist(), reads.nbytes.tolist())}
    for plan in plans:
        if getattr(plan, "copies", None):
            plan.copies = [dataclasses.replace(c, nbytes=size[c.tensor])
                           if c.tensor in size and c.nbytes == 0 else c for c in plan.copies]


__all__ = ["state_writers", "state_groups", "inplace_writes", "inplace_pairs", "step_costs", "StateReads",
           "with_state_reads", "price_state_reads", "state_copy_bytes"]
