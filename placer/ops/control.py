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

from typing import Any

from placer.errors import ShapeError
from placer.ops.registry import OpDef, register
from placer.types import Args, Op, OpFeatures, TensorType

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


def check_condition(t: TensorType, label: str) -> None:
    if t.size != 1:
        raise ShapeError(f"op {label}: If's condition must hold one value, found {t}",
                         hint="the condition is a bool scalar, e.g. IsEmpty's output")


def _if_infer(inputs, args: Args):
    check_condition(inputs[0], args.op if isinstance(args, Args) else "?")
    return []   # what the branches write: infer_nested, with the outer blobs


def _if_kernel(xp, inputs, args: Args) -> tuple:
    raise ShapeError(f"op {args.op}: If runs its branch in the executor (runtime/executor.py), "
                     "not as a kernel")


register(OpDef("If", _if_infer, kernel=_if_kernel, cost=lambda i, o, a: OpFeatures(),
               min_inputs=1, launches=0, scratch=0.0,
               doc="runs then_net / else_net on the outer blobs (Caffe2: CPU if_op.cc, CUDA "
                   "if_op_gpu.cc); the planner places the whole If, nested net included, on one device"))

# op types whose nested nets shapes.infer and the executor handle (see the module's docstring)
NESTED = frozenset({"If"})
