"""Comparing generated nets with the ones real Caffe2 writes: op for op, in an order that
only depends on what each op reads and writes (so two nets that differ only in the order of
independent ops compare equal), and the unit tests of that comparison.

Other training tests import ``canonical_ops`` and ``assert_same_ops`` from here.
"""
from __future__ import annotations

import difflib
import heapq

from google.protobuf import text_format

from placer.formats import caffe2_pb as pb


def op_text(op) -> str:
    """One op as one line of protobuf text (type, inputs, outputs, args, device, engine, ...)."""
    return text_format.MessageToString(op, as_one_line=True)


def dependencies(ops) -> list[set[int]]:
    """For each op, the earlier ops it must follow: it reads what they wrote (RAW), it
    overwrites what they read (WAR) or wrote (WAW)."""
    last_writer: dict[str, int] = {}
    readers_since_write: dict[str, list[int]] = {}
    deps = []
    for j, op in enumerate(ops):
        d = set()
        for blob in op.input:
            if blob in last_writer:
                d.add(last_writer[blob])
        for blob in op.output:
            if blob in last_writer:
                d.add(last_writer[blob])
            d.update(readers_since_write.get(blob, ()))
        d.discard(j)
        deps.append(d)
        for blob in op.input:
            readers_since_write.setdefault(blob, []).append(j)
        for blob in op.output:
            last_writer[blob] = j
            readers_since_write[blob] = []
    return deps


def canonical_ops(ops) -> list[str]:
    """The ops as text in the topological order that, among ready ops, takes the smallest
    text first: equal for any two orders of the same ops with the same dependencies."""
    ops = list(ops)
    texts = [op_text(op) for op in ops]
    deps = dependencies(ops)
    waiting = [len(d) for d in deps]
    followers: list[list[int]] = [[] for _ in ops]
    for j, d in enumerate(deps):
        for i in d:
            followers[i].append(j)
    ready = [(texts[j], j) for j, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        text, j = heapq.heappop(ready)
        order.append(text)
        for k in followers[j]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, (texts[k], k))
    return order


def assert_same_ops(ours, theirs, what: str = "net") -> None:
    """Both op lists hold the same ops with the same dependencies; a unified diff otherwise."""
    a, b = canonical_ops(ours), canonical_ops(theirs)
    if a != b:
        diff = "\n".join(difflib.unified_diff(b, a, "caffe2", "placer", lineterm="", n=2))
        raise AssertionError(f"{what}: ops differ from real Caffe2's\n{diff}")


def parse_net(text: str):
    net = pb.NetDef()
    text_format.Parse(text, net)
    return net


def _op(t, ins, outs):
    op = pb.OperatorDef(type=t)
    op.input.extend(ins)
    op.output.extend(outs)
    return op


# ---------------------------------------------------------------- tests of the comparison

def test_independent_ops_in_either_order_compare_equal():
    a = [_op("Relu", ["x"], ["y"]), _op("Sigmoid", ["x"], ["z"]), _op("Sum", ["y", "z"], ["s"])]
    b = [a[1], a[0], a[2]]
    assert canonical_ops(a) == canonical_ops(b)


def test_dependent_ops_in_another_order_differ():
    a = [_op("Relu", ["x"], ["y"]), _op("Sigmoid", ["y"], ["y"]), _op("Tanh", ["y"], ["z"])]
    b = [a[0], a[2], a[1]]  # Tanh now reads y before Sigmoid overwrites it
    assert canonical_ops(a) != canonical_ops(b)


def test_write_after_read_is_a_dependency():
    ops = [_op("Copy", ["w"], ["c"]), _op("WeightedSum", ["w", "g"], ["w"])]
    assert dependencies(ops) == [set(), {0}]


def test_a_different_argument_makes_nets_differ():
    a = _op("Scale", ["x"], ["y"])
    b = _op("Scale", ["x"], ["y"])
    b.arg.add(name="scale", f=2.0)
    try:
        assert_same_ops([a], [b])
    except AssertionError as e:
        assert "scale" in str(e)
    else:
        raise AssertionError("nets with different arguments compared equal")
