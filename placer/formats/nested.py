"""The nested nets of Caffe2's control-flow ops (``If``'s ``then_net`` / ``else_net``):
their ops as placer ``Op``s, and their shapes inferred on the outer net's blobs. The op
entries themselves are in ``placer/ops/control.py``; this part converts NetDefs, so it
lives with the format readers.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from placer.errors import ShapeError
from placer.formats.caffe2 import net_from_netdef, op_from_proto
from placer.ops.control import BRANCHES, IF_BOUND, branch_netdef, check_condition
from placer.types import Op, OpFeatures, TypedNet


def branch_ops(op: Op, branch: str) -> list[Op]:
    """The ops of ``branch``, placed on the If op's device (the whole If runs on one)."""
    netdef = branch_netdef(op, branch)
    if netdef is None:
        return []
    return [replace(op_from_proto(i, p), device=op.device) for i, p in enumerate(netdef.op)]


def infer_nested(typed: TypedNet, op: Op, infer: Callable) -> tuple[dict, OpFeatures]:
    """The outer blobs an If's branches write, with their types, and the If's features:
    each branch inferred on the outer types (see the module's docstring)."""
    if branch_netdef(op, "then_net") is None:
        raise ShapeError(f"op {op.label}: If needs a then_net argument (a NetDef)")
    check_condition(typed.blobs[op.inputs[0]], op.label)
    known = {b: t for b, t in typed.blobs.items() if t is not None}
    results = []
    for branch in BRANCHES:
        netdef = branch_netdef(op, branch)
        if netdef is None:
            results.append(({}, OpFeatures()))
            continue
        read = {b for p in netdef.op for b in p.input}
        net = net_from_netdef(netdef, path=f"{op.label} {branch}", fed=list(typed.blobs),
                              source_format=typed.net.source_format)
        net.params = {b: t for b, t in typed.net.params.items() if b in read}
        net.init_proto = typed.net.init_proto   # for the hints of missing shapes
        # the branch's inputs: the outer blobs it reads before it writes them
        sub = infer(net, {b: known[b] for b in net.external_inputs if b in known and b not in net.params})
        for blob, why in sub.missing.items():
            typed.missing.setdefault(blob, f"{why} (in {op.label} {branch})")
        written = {o: sub.blobs.get(o) for p in net.ops for o in p.outputs}
        total = OpFeatures()
        for f in sub.features:
            total = total + f
        results.append((written, total))
    (then_out, then_cost), (else_out, else_cost) = results
    # the larger by work, then by what it writes (a branch whose ops lack shapes counts 0 work)
    larger = ((else_cost.flops + else_cost.bytes_written, len(else_out))
              > (then_cost.flops + then_cost.bytes_written, len(then_out)))
    (chosen, cost), (other, _) = (results[1], results[0]) if larger else (results[0], results[1])
    outputs = {**other, **chosen}
    # a blob is data-dependent where the branches leave it at different types; one a branch
    # does not write keeps its type from before the If (a parameter updated in one branch)
    outputs = {b: (t if t is None or then_out.get(b, known.get(b)) == else_out.get(b, known.get(b))
                   else replace(t, bound=IF_BOUND if not t.bound else f"{t.bound}; {IF_BOUND}"))
               for b, t in outputs.items()}
    for name in op.outputs:
        outputs.setdefault(name, None)
    for name, t in outputs.items():  # an external output the branch leaves untyped: say where
        if t is None and name in typed.net.external_outputs:
            typed.missing.setdefault(name, f"blob '{name}' has no shape: {op.label}'s branch writes "
                                           "it from blobs without shape (see the other blobs named)")
    return outputs, cost
