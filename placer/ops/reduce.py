"""Reductions over listed axes, and the elementwise HardSigmoid and Erf: the Caffe2 ops its
ONNX backend writes for ReduceMean/Sum/Max/Min/L1/L2, HardSigmoid and Erf.

- ``ReduceMean``, ``ReduceSum``, ``ReduceMax``, ``ReduceMin``, ``ReduceL1`` (sum of |x|),
  ``ReduceL2`` (sqrt of the sum of squares) (X) -> Y over ``axes`` (default: every axis;
  negative ones count from the end), keeping them as size 1 with ``keepdims`` (default 1),
  as caffe2/operators/reduce_ops.cc. float32 inputs, and also int32, int64 and float64 for
  Sum, Max and Min; Y has X's dtype (float sums accumulate in float64 and round once; int
  sums wrap as Caffe2's). Caffe2 has CUDA kernels for Mean, Sum, Max and Min only. Max and
  Min over an empty axis are refused (Caffe2 gives the type's lowest / highest value).
- ``HardSigmoid`` (X) -> max(0, min(1, alpha x + beta)), alpha 0.2 and beta 0.5 by default
  (caffe2/operators/hard_sigmoid_op.cc).
- ``Erf`` (X) -> erf(x) (caffe2/operators/erf_op.cc), evaluated in float64 by the xp-only
  ``ops.transformer._erf`` (error under 1e-15) and rounded to X's dtype.
"""
from __future__ import annotations

import numpy as np

from placer.errors import ShapeError
from placer.ops.registry import OpDef, default_cost, register
from placer.ops.transformer import _erf
from placer.types import TensorType

REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")
INT_REDUCTIONS = ("ReduceSum", "ReduceMax", "ReduceMin")   # also int32/int64/float64 in Caffe2
CPU_ONLY_IN_CAFFE2 = ("ReduceL1", "ReduceL2")   # reduce_ops.cu has Min, Max, Sum, Mean only


def _axes(x: TensorType, args) -> tuple[int, ...]:
    rank = len(x.shape)
    axes = args.ints("axes", list(range(rank)))
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise ShapeError(f"op {args.op}: axis {a} is out of range for a {rank}-D input {x.shape}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise ShapeError(f"op {args.op}: axes {axes} repeat an axis")
    return tuple(sorted(out))


def _reduce_infer_of(op_type: str):
    return lambda inputs, args: _reduce_infer(op_type, inputs, args)


def _reduce_infer(op_type: str, inputs, args):
    x = inputs[0]
    allowed = ("float32", "float64", "int32", "int64") if op_type in INT_REDUCTIONS else ("float32",)
    if x.dtype not in allowed:
        raise ShapeError(f"op {args.op}: {op_type} takes {', '.join(allowed)}, not {x.dtype} (as Caffe2)")
    axes = _axes(x, args)
    if args.int("keepdims", 1):
        shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
    else:
        shape = tuple(d for k, d in enumerate(x.shape) if k not in axes)
    if any(x.shape[k] == 0 for k in axes) and op_type in ("ReduceMax", "ReduceMin"):
        raise ShapeError(f"op {args.op}: {op_type} over an empty axis has no value")
    return [TensorType(shape, x.dtype)]


def _reduce_kernel(op_type: str):
    def kernel(xp, inputs, args):
        x = inputs[0]
        axes = _axes(TensorType(x.shape, str(x.dtype)), args)
        keep = bool(args.int("keepdims", 1))
        if op_type == "ReduceMax":
            y = xp.max(x, axis=axes, keepdims=keep)
        elif op_type == "ReduceMin":
            y = xp.min(x, axis=axes, keepdims=keep)
        elif op_type == "ReduceL1":
            y = xp.sum(xp.abs(x.astype(np.float64)), axis=axes, keepdims=keep)
        elif op_type == "ReduceL2":
            x64 = x.astype(np.float64)
            y = xp.sqrt(xp.sum(x64 * x64, axis=axes, keepdims=keep))
        elif op_type == "ReduceSum" and x.dtype.kind in "iu":
            y = xp.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)  # wraps around, as Caffe2's
        elif op_type == "ReduceSum":
            y = xp.sum(x.astype(np.float64), axis=axes, keepdims=keep)
        else:
            y = xp.mean(x.astype(np.float64), axis=axes, keepdims=keep)
        return (xp.asarray(y).astype(x.dtype, copy=False),)
    return kernel


def _reduce_cost(inputs, outputs, args):
    feats = default_cost(inputs, outputs, args)
    return type(feats)(flops=float(inputs[0].size), bytes_read=feats.bytes_read, bytes_written=feats.bytes_written)


# GPU launches of each kernel (counted on tests/cupy_standin.py): the float64 cast, the
# elementwise steps, the reduction, the cast back.
_LAUNCHES = {"ReduceL1": 4, "ReduceL2": 5}

for _name in REDUCTIONS:
    register(OpDef(_name, _reduce_infer_of(_name), _reduce_kernel(_name), cost=_reduce_cost, min_inputs=1, max_inputs=1,
                   launches=_LAUNCHES.get(_name, 2),
                   caffe2_devices=frozenset({"cpu"}) if _name in CPU_ONLY_IN_CAFFE2 else None, scratch=2.0, doc=f"{_name} over axes (default all), keepdims (default 1)"))


def _float_same(inputs, args):
    if not inputs[0].dtype.startswith("float"):
        raise ShapeError(f"op {args.op}: takes a float tensor, not {inputs[0].dtype}")
    return [inputs[0]]


def _hard_sigmoid(xp, inputs, args):
    x = inputs[0]
    y = x * x.dtype.type(args.float("alpha", 0.2)) + x.dtype.type(args.float("beta", 0.5))
    return (xp.clip(y, 0, 1).astype(x.dtype, copy=False),)


def _erf_kernel(xp, inputs, args):
    x = inputs[0]
    return (_erf(xp, x.astype(np.float64)).astype(x.dtype),)


register(OpDef("HardSigmoid", _float_same, _hard_sigmoid, min_inputs=1, max_inputs=1, launches=3, scratch=1.0,
               doc="max(0, min(1, alpha x + beta)), alpha 0.2, beta 0.5 by default"))
register(OpDef("Erf", _float_same, _erf_kernel, cost=lambda i, o, a: type(default_cost(i, o, a))(
    flops=60.0 * o[0].size, bytes_read=float(i[0].nbytes), bytes_written=float(o[0].nbytes)),
    min_inputs=1, max_inputs=1, launches=163, scratch=8.0, doc="elementwise erf"))  # _erf's series and fraction
