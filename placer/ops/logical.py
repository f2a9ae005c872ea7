"""Op family 'logical': comparisons, boolean logic, IsNaN, Where, and the whole-tensor sums
SumElements / SumSqrElements (with SumElementsGradient): what a train net needs to test
its gradients for overflow and choose between two values (dynamic loss scaling as ops).

Semantics of torch 1.8.1's Caffe2, each checked against it (tests/test_ops_logical.py):
- EQ, NE, LT, LE, GT, GE (A, B) -> bool, elementwise (elementwise_ops.cc,
  elementwise_ops_schema.cc). A and B have one dtype, of bool, int32, int64, float32 or
  float64 (float16, int8, uint8, ... are refused, as Caffe2's kernels do). Broadcasting as
  Add's (placer/ops/elementwise.py): ``broadcast=1`` is the old rule (B a contiguous run of
  A's dims at ``axis`` / ``axis_str``, output A's shape; a B of one value, whatever its
  dims and the axis, is compared with every value, as Caffe2 does without checking), else
  numpy broadcasting (Caffe2's run broadcasts so; only its unused shape function asks for
  equal shapes). NaN compares unequal to everything, itself included (IEEE, as C++).
- And, Or, Xor (A, B) -> bool, on bool inputs only, broadcast the same way; Not (X) -> bool.
- IsNaN (X) -> uint8 (1 where NaN, else 0; Caffe2 writes uint8, not bool), X float32 or
  float64 (utility_ops.h, IsNanOp).
- Where (C, X, Y) -> C ? X : Y (elementwise_logical_ops.h, WhereOp). C is bool; X and Y
  share one dtype: float32, float64, int32, int64 or bool (Caffe2 also takes strings,
  which placer does not hold). Without ``broadcast_on_rows`` C, X and Y have one shape;
  with it C is 1-D with one value per row (dim 0) of X and Y, which have one shape, and
  picks whole rows. The output has X's shape and dtype.
- SumElements (X) -> 0-d sum of X's values, float32 only; ``average=1`` multiplies it by
  float32(1 / N) (in float32, as math::Scale does), except for an empty X, whose sum 0 is
  kept (reduction_ops.h). SumSqrElements: the sum of squares, float32 or float64 (float64
  is scaled by the float32 1 / N too). placer sums in float64 and rounds once (Caffe2 sums
  in float32: the tests bound the difference by the float32 summation error).
- SumElementsGradient (X, dY) -> dX of X's shape, float32, every value
  float32(dY * (1.0 / N)) with ``average`` (the product in double, as the CPU kernel; the
  CUDA kernel divides dY / N in float32, which can differ by one ulp), else dY. X's values
  are not read (any dtype); dY is a one-value float32 tensor (Caffe2 reads its first value
  and only debug builds check the count; placer refuses any other count).

Costs: one flop per output element (per input element for the sums), every input read
once, every output written once (``default_cost``); SumElementsGradient reads dY only.

Devices (torch 1.8.1): CUDA kernels exist for the comparisons, And/Or/Xor and Not
(caffe2/operators/elementwise_ops.cu) and for SumElements, SumSqrElements and
SumElementsGradient (caffe2/operators/reduction_ops.cu). IsNaN (utility_ops.cc) and Where
(elementwise_logical_ops.cc) are registered for the CPU only (utility_ops.cu and the rest
of caffe2/operators register no CUDA kernel for them): placer runs them on a GPU, Caffe2
does not (``caffe2_devices``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from placer.ops.elementwise import legacy_sizes, numpy_broadcast_shape, shape_error
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType

CPU_ONLY = frozenset({"cpu"})

# The dtypes Caffe2 1.8.1's CPU and CUDA kernels dispatch on.
COMPARE_DTYPES = ("bool", "int32", "int64", "float32", "float64")
WHERE_DTYPES = ("float32", "float64", "int32", "int64", "bool")
NAN_DTYPES = ("float32", "float64")
SUM_SQR_DTYPES = ("float32", "float64")


def _check_dtype(args: Args, t: TensorType, index: int, name: str, allowed: Sequence[str]) -> None:
    if t.dtype not in allowed:
        raise shape_error(args, f"{name} is {t.dtype}; Caffe2's kernel takes {' or '.join(allowed)}",
                          (index, name, t))


def _same_dtype(args: Args, a: TensorType, ia: int, na: str, b: TensorType, ib: int, nb: str) -> None:
    if a.dtype != b.dtype:
        raise shape_error(args, f"{nb} must have {na}'s dtype (Caffe2 reads both as {a.dtype})",
                          (ia, na, a), (ib, nb, b))


# ---------------------------------------------------------------- binary, bool output
def _binary_shape(a: TensorType, b: TensorType, args: Args) -> tuple[int, ...]:
    """The output shape: A's under ``broadcast=1`` (checked by the old rule, except for a
    one-value B, which Caffe2 compares with every value of A unchecked), else numpy's."""
    if args.bool("broadcast", False):
        if b.size != 1:
            legacy_sizes(a, b, args)
        return a.shape
    return numpy_broadcast_shape(a, b, args)


def _binary_infer(allowed: Sequence[str]):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        a, b = inputs
        _check_dtype(args, a, 0, "A", allowed)
        _same_dtype(args, a, 0, "A", b, 1, "B")
        return [TensorType(_binary_shape(a, b, args), "bool")]
    return infer


def _binary_kernel(ufunc: str):
    """xp.<ufunc>(A, B) into a fresh bool array (a 0-d one too: numpy would return a scalar)."""
    def kernel(xp, inputs, args):
        a, b = inputs
        fn = getattr(xp, ufunc)
        if args.bool("broadcast", False) and b.size == 1:
            return (fn(a, b.reshape(()), out=xp.empty(a.shape, dtype=bool)),)
        if args.bool("broadcast", False):
            pre, n, post = legacy_sizes(TensorType(a.shape, str(a.dtype)), TensorType(b.shape, str(b.dtype)), args)
            out = xp.empty(a.shape, dtype=bool)
            fn(a.reshape(pre, n, post), b.reshape(1, n, 1), out=out.reshape(pre, n, post))
            return (out,)
        shape = numpy_broadcast_shape(TensorType(a.shape, str(a.dtype)), TensorType(b.shape, str(b.dtype)), args)
        return (fn(a, b, out=xp.empty(shape, dtype=bool)),)
    return kernel


_COMPARISONS = {"EQ": "equal", "NE": "not_equal", "LT": "less", "LE": "less_equal",
                "GT": "greater", "GE": "greater_equal"}
_SYMBOLS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
_LOGICAL = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}

for _name, _ufunc in _COMPARISONS.items():
    register(OpDef(_name, _binary_infer(COMPARE_DTYPES), _binary_kernel(_ufunc), min_inputs=2, max_inputs=2,
                   scratch=0.0,
                   doc=f"A {_SYMBOLS[_name]} B -> bool, with Caffe2 broadcast (broadcast/axis) or numpy broadcasting"))

for _name, _ufunc in _LOGICAL.items():
    register(OpDef(_name, _binary_infer(("bool",)), _binary_kernel(_ufunc), min_inputs=2, max_inputs=2,
                   scratch=0.0,
                   doc=f"A {_name.lower()} B on bool tensors, with Caffe2 broadcast (broadcast/axis) or numpy broadcasting"))


# ---------------------------------------------------------------- unary: Not, IsNaN
def _not_infer(inputs, args):
    _check_dtype(args, inputs[0], 0, "X", ("bool",))
    return [TensorType(inputs[0].shape, "bool")]


def _not_kernel(xp, inputs, args):
    x = inputs[0]
    return (xp.logical_not(x, out=xp.empty(x.shape, dtype=bool)),)


register(OpDef("Not", _not_infer, _not_kernel, min_inputs=1, max_inputs=1, scratch=0.0,
               doc="elementwise negation of a bool tensor"))


def _isnan_infer(inputs, args):
    _check_dtype(args, inputs[0], 0, "X", NAN_DTYPES)
    return [TensorType(inputs[0].shape, "uint8")]


def _isnan_kernel(xp, inputs, args):
    x = inputs[0]
    return (xp.isnan(x, out=xp.empty(x.shape, dtype=bool)).view(xp.uint8),)   # bool -> uint8: a view


register(OpDef("IsNaN", _isnan_infer, _isnan_kernel, min_inputs=1, max_inputs=1, scratch=0.0,
               caffe2_devices=CPU_ONLY,
               doc="1 (uint8) where X is NaN, else 0; X float32 or float64"))


# ---------------------------------------------------------------- Where
def _where_infer(inputs, args):
    c, x, y = inputs
    _check_dtype(args, c, 0, "C", ("bool",))
    if x.dtype == "object":
        raise shape_error(args, "X holds strings: Caffe2 selects those, placer's kernels do not", (1, "X", x))
    _check_dtype(args, x, 1, "X", WHERE_DTYPES)
    _same_dtype(args, x, 1, "X", y, 2, "Y")
    if x.shape != y.shape:
        raise shape_error(args, "X and Y must have the same shape", (1, "X", x), (2, "Y", y))
    if args.bool("broadcast_on_rows", False):
        if c.ndim != 1 or x.ndim < 1 or c.shape[0] != x.shape[0]:
            raise shape_error(args, "with broadcast_on_rows=1, C must be 1-D with one value per row "
                              "(dim 0) of X and Y", (0, "C", c), (1, "X", x))
    elif c.shape != x.shape:
        raise shape_error(args, "C, X and Y must have the same shape (or set broadcast_on_rows=1 "
                          "for one C value per row)", (0, "C", c), (1, "X", x))
    return [TensorType(x.shape, x.dtype)]


def _where_kernel(xp, inputs, args):
    c, x, y = inputs
    if args.bool("broadcast_on_rows", False):
        c = c.reshape((c.shape[0],) + (1,) * (x.ndim - 1))
    return (xp.where(c, x, y),)


register(OpDef("Where", _where_infer, _where_kernel, min_inputs=3, max_inputs=3, scratch=0.0,
               caffe2_devices=CPU_ONLY,
               doc="C ? X : Y elementwise, or one C value per row of X and Y (broadcast_on_rows=1)"))


# ---------------------------------------------------------------- SumElements, SumSqrElements
def _sum_infer(allowed: Sequence[str]):
    def infer(inputs, args):
        x = inputs[0]
        _check_dtype(args, x, 0, "X", allowed)
        return [TensorType((), x.dtype)]
    return infer


def _sum_cost(inputs, outputs, args) -> OpFeatures:
    """One flop per input value (an add; SumSqrElements a multiply-add), the input read once."""
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(inputs[0].size), bytes_read=read, bytes_written=written)


def _average(xp, total, n: int, args: Args):
    """``average=1``: total * float32(1 / n) in total's dtype (math::Scale<float, T>); an
    empty input keeps its sum, 0."""
    if not args.bool("average", False) or n == 0:
        return total
    alpha = float(np.float32(1.0) / np.float32(n))      # float(1.) / X.numel() in float32
    total *= alpha          # exact in a float64 total; a float32 total rounds the product once
    return total


def _sum_kernel(xp, inputs, args):
    x = inputs[0]
    total = xp.asarray(x.sum(dtype=xp.float64), dtype=x.dtype)
    return (_average(xp, total, x.size, args),)


def _sum_sqr_kernel(xp, inputs, args):
    x = inputs[0]
    squares = xp.multiply(x, x)              # each square rounded once in X's dtype
    total = xp.asarray(squares.sum(dtype=xp.float64), dtype=x.dtype)
    return (_average(xp, total, x.size, args),)


def _sum_launches(inputs, args) -> int:
    """The float64 sum, its rounding to X's dtype, the average's scale."""
    x = inputs[0]
    rounding = x.dtype != "float64"
    return 1 + rounding + (args.bool("average", False) and x.size > 0)


def _cast_buffer(inputs, outputs, args) -> float:
    """numpy's sum with a float64 accumulator converts through a buffer of 8192 values."""
    return float(min(inputs[0].size, 8192) * 8)


register(OpDef("SumElements", _sum_infer(("float32",)), _sum_kernel, cost=_sum_cost, min_inputs=1,
               max_inputs=1, launches=_sum_launches, scratch=_cast_buffer,
               doc="0-d sum of all values (float32); average=1 divides by their count"))
register(OpDef("SumSqrElements", _sum_infer(SUM_SQR_DTYPES), _sum_sqr_kernel, cost=_sum_cost, min_inputs=1,
               max_inputs=1, launches=lambda inputs, args: 1 + _sum_launches(inputs, args),
               scratch=lambda inputs, outputs, args: inputs[0].nbytes + _cast_buffer(inputs, outputs, args),
               doc="0-d sum of squares (float32 or float64); average=1 divides by the count"))


def _sum_grad_infer(inputs, args):
    x, dy = inputs
    _check_dtype(args, dy, 1, "dY", ("float32",))
    if dy.size != 1:
        raise shape_error(args, "dY must hold exactly one value (the gradient of the sum)", (1, "dY", dy))
    return [TensorType(x.shape, "float32")]


def _sum_grad_kernel(xp, inputs, args):
    x, dy = inputs
    value = dy.reshape(-1)[:1]
    if args.bool("average", False):
        value = value.astype(xp.float64) * (1.0 / x.size if x.size else 1.0)
    out = xp.empty(x.shape, dtype=xp.float32)
    out[...] = value.astype(xp.float32, copy=False).reshape(())
    return (out,)


def _sum_grad_cost(inputs, outputs, args) -> OpFeatures:
    """X's shape only is used: dY read, dX written, one flop per dX value (the fill)."""
    return OpFeatures(flops=float(outputs[0].size), bytes_read=float(inputs[1].nbytes),
                      bytes_written=float(outputs[0].nbytes))


register(OpDef("SumElementsGradient", _sum_grad_infer, _sum_grad_kernel, cost=_sum_grad_cost,
               min_inputs=2, max_inputs=2, scratch=0.0,
               launches=lambda inputs, args: 4 if args.bool("average", False) else 1,   # (to float64, x 1/N, to float32), fill
               doc="(X, dY) -> dX like X, every value dY (/ X's count with average=1)"))

