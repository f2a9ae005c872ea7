"""Control flow: IsEmpty and If with its nested nets, as Mask R-CNN2Go uses them.

Mask R-CNN2Go tests its detections with ``IsEmpty(bbox_nms) -> is_bbox_rois_empty``
and runs ``If(is_bbox_rois_empty)`` whose ``then_net`` is empty and whose ``else_net``
("mask_net") is the whole mask head.

- ``IsEmpty``: X -> a bool scalar (shape ``()``), True iff X has no elements. Caffe2 has
  only a CPU kernel (caffe2/operators/is_empty_op.cc: ``REGISTER_CPU_OPERATOR(IsEmpty,
  ...)``, no .cu); placer's kernel is one ``xp.asarray`` and runs on both.
- ``If``: input 0 is the condition (a tensor of exactly one bool); the ``then_net`` argument
  (required) runs when it is True, ``else_net`` (optional) when it is False. Caffe2 runs the
  branch as a net in the same workspace (caffe2/operators/if_op.h: ``CreateNet(then_net_def,
  ws)``): the branch reads and writes the outer blobs directly, whether or not the If op
  lists them as inputs or outputs (Mask R-CNN2Go's If lists only the condition). Kernels:
  CPU (if_op.cc) and CUDA (if_op_gpu.cc, ``REGISTER_CUDA_OPERATOR(If, IfOp<CUDAContext>)``;
  the CUDA op wants its condition in a CUDA tensor). Building the If builds both branch
  nets, so Caffe2 creates the blobs either branch writes, uninitialized, before either runs
  (seen in Caffe2 1.8.1: after a True condition the else branch's ``z`` exists, empty);
  placer's executor makes only what the branch taken writes.

Placement: the planner places the whole If, nested net included, on one device: the
branch's ops run on the If op's device (``runtime.executor`` runs them with the registry
kernels, on the outer blobs), so a branch whose ops have no kernel there cannot run there.

Shape inference (``infer_nested``, called by ``shapes.infer`` for the types in
``NESTED``): each branch is converted to a ``Net`` and inferred with the outer blobs'
types as its inputs (and the outer parameters it reads as its parameters); what a branch
writes becomes an outer blob. Where the branches disagree (one writes a blob the other
does not, or at another type) the larger branch's types win -- the else branch when the
then branch is empty -- and its outputs are marked ``bound="If: the larger branch"``. The
If's cost is the sum of that branch's ops' features (flops, MACs, bytes, parameter bytes);
its ``launches`` is 0 (the branch's kernel launches are not counted in it).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from placer.errors import ShapeError
from placer.formats.caffe2 import net_from_netdef, op_from_proto
from placer.ops.registry import OpDef, register
from placer.types import Args, Op, OpFeatures, TensorType, TypedNet

BRANCHES = ("then_net", "else_net")
IF_BOUND = "If: the larger branch"


# ---------------------------------------------------------------- IsEmpty

def _is_empty_infer(inputs, args: Args):
    return [TensorType((), "bool")]


def _is_empty_kernel(xp, inputs, args: Args) -> tuple:
    return (xp.asarray(inputs[0].size == 0),)


def _is_empty_cost(inputs, outputs, args: Args) -> OpFeatures:
    return OpFeatures(bytes_written=1.0)   # reads only the shape


register(OpDef("IsEmpty", _is_empty_infer, kernel=_is_empty_kernel, cost=_is_empty_cost,
               caffe2_devices=frozenset({"cpu"}), min_inputs=1, max_inputs=1, scratch=0.0,
               doc="True iff X has no elements: a bool scalar (Caffe2: CPU only, is_empty_op.cc)"))


# ---------------------------------------------------------------- If

def branch_netdef(op: Op, branch: str) -> Any:
    """The NetDef of ``branch`` ("then_net" / "else_net"), or None when the op has none."""
    value = op.args.get(branch)
    return value if hasattr(value, "op") else None


def branch_ops(op: Op, branch: str) -> list[Op]:
    """The ops of ``branch``, placed on the If op's device (the whole If runs on one)."""
    netdef = branch_netdef(op, branch)
    if netdef is None:
        return []
    return [replace(op_from_proto(i, p), device=op.device) for i, p in enumerate(netdef.op)]


def branch_blobs(op: Op) -> tuple[str, ...]:
    """Every blob either branch of a nested-net op reads or writes (() for other ops)."""
    if op.type not in NESTED:
        return ()
    names: dict[str, None] = {}
    for branch in BRANCHES:
        netdef = branch_netdef(op, branch)
        for p in (netdef.op if netdef is not None else ()):
            names.update(dict.fromkeys(list(p.input) + list(p.output)))
    return tuple(names)


def branch_taken(condition: Any, op: Op) -> str | None:
    """The branch the condition value selects (None: False and no else_net)."""
    if condition.size != 1:
        raise ShapeError(f"op {op.label}: If's condition must hold one value, found shape "
                         f"{tuple(condition.shape)}")
    if bool(condition.reshape(-1)[0].item()):
        return "then_net"
    return "else_net" if branch_netdef(op, "else_net") is not None else None


def _check_condition(t: TensorType, label: str) -> None:
    if t.size != 1:
        raise ShapeError(f"op {label}: If's condition must hold one value, found {t}",
                         hint="the condition is a bool scalar, e.g. IsEmpty's output")


def _if_infer(inputs, args: Args):
    _check_condition(inputs[0], args.op if isinstance(args, Args) else "?")
    return []   # what the branches write: infer_nested, with the outer blobs


def _if_kernel(xp, inputs, args: Args) -> tuple:
    raise ShapeError(f"op {args.op}: If runs its branch in the executor (runtime/executor.py), "
                     "not as a kernel")


def infer_nested(typed: TypedNet, op: Op, infer: Callable) -> tuple[dict, OpFeatures]:
    """The outer blobs an If's branches write, with their types, and the If's features:
    each branch inferred on the outer types (see the module's docstring)."""
    if branch_netdef(op, "then_net") is None:
        raise ShapeError(f"op {op.label}: If needs a then_net argument (a NetDef)")
    _check_condition(typed.blobs[op.inputs[0]], op.label)
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
    disagree = set(then_out) != set(else_out) or any(then_out[b] != else_out[b] for b in then_out)
    outputs = {**other, **chosen}
    if disagree:
        outputs = {b: (t if t is None else replace(t, bound=IF_BOUND if not t.bound else
                                                   f"{t.bound}; {IF_BOUND}"))
                   for b, t in outputs.items()}
    for name in op.outputs:
        outputs.setdefault(name, None)
    for name, t in outputs.items():  # an external output the branch leaves untyped: say where
        if t is None and name in typed.net.external_outputs:
            typed.missing.setdefault(name, f"blob '{name}' has no shape: {op.label}'s branch writes "
                                           "it from blobs without shape (see the other blobs named)")
    return outputs, cost


register(OpDef("If", _if_infer, kernel=_if_kernel, cost=lambda i, o, a: OpFeatures(),
               min_inputs=1, launches=0, scratch=0.0,
               doc="runs then_net / else_net on the outer blobs (Caffe2: CPU if_op.cc, CUDA "
                   "if_op_gpu.cc); the planner places the whole If, nested net included, on one device"))

# op types whose nested nets shapes.infer and the executor handle (see the module's docstring)
NESTED = frozenset({"If"})
