"""Where a train net's parameter updates run: after the whole backward pass, as Caffe2's
optimizer builders append them, or each as soon as its gradient is final.

Caffe2 appends the optimizer ops after the backward pass, so every gradient is alive at
once at the end of it: for a model of P parameters in float16, 2P bytes of gradients on
the GPU at the peak. ZeRO-Offload (Ren et al., USENIX ATC 2021, section 4.2) instead
moves each gradient off the GPU as soon as the backward pass has made it, overlapping the
copy with the rest of the backward pass, so the GPU never holds more than a few of them.

``interleave_updates`` writes that order into the net: each op after the backward pass
moves up to just after the last op it depends on (one that writes what it reads, or
reads or writes what it writes), keeping the order of the ops otherwise. The net
computes the same values (every dependency is kept), and the planner, whose memory
model follows the net's op order, then sees each gradient die at its update.
"""
from __future__ import annotations

from placer.formats import caffe2_pb as pb


def interleave_updates(train: pb.NetDef, first: int) -> int:
    """Move each op of ``train.op[first:]`` to just after the last op it depends on;
    returns how many ops moved earlier."""
    head = list(train.op[:first])
    tail = list(train.op[first:])
    last_write: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for k, op in enumerate(head):
        _note(op, k, last_write, last_read)
    after: dict[int, list] = {}       # position in head -> the tail ops that go after it
    placed = len(head)                 # tail ops get virtual positions after the head
    moved = 0
    slot_of: list[int] = []
    for op in tail:
        deps = [last_write.get(b, -1) for b in op.input]
        deps += [last_write.get(b, -1) for b in op.output] + [last_read.get(b, -1) for b in op.output]
        slot = max((_slot(d, slot_of, len(head)) for d in deps), default=-1)
        after.setdefault(slot, []).append(op)
        if slot < len(head) - 1:
            moved += 1
        slot_of.append(slot)
        _note(op, placed, last_write, last_read)
        placed += 1
    ordered = list(after.pop(-1, []))
    for k, op in enumerate(head):
        ordered.append(op)
        ordered.extend(after.pop(k, []))
    del train.op[:]
    train.op.extend(ordered)
    return moved


def _slot(position: int, slot_of: list[int], n_head: int) -> int:
    """The head position after which an op that depends on the op at ``position`` can go:
    a head op's own position, or the slot of a tail op (tail ops hold positions >= n_head).
    -1: it depends on nothing in the net."""
    return position if position < n_head else slot_of[position - n_head]


def _note(op, position: int, last_write: dict, last_read: dict) -> None:
    for b in op.input:
        last_read[b] = max(last_read.get(b, -1), position)
    for b in op.output:
        last_write[b] = position
