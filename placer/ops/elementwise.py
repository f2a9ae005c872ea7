"""Elementwise ops: arithmetic with Caffe2's broadcast rules, n-ary Sum/Max/Min,
activations, Dropout and Cast.

Broadcasting (binary Add/Sub/Mul/Div/Pow), as Caffe2 does it:
- ``broadcast=1`` is the old rule: B's shape must equal a contiguous run of A's dims
  starting at ``axis`` (default -1: aligned to the end; ``axis_str`` + ``order`` may name
  the axis instead). Leading and trailing 1s of B are ignored. The output has A's shape.
- without ``broadcast``, the newer Caffe2 kernels broadcast the numpy way (the oldest
  ones required equal shapes; numpy broadcasting is a superset of that).
The output has A's dtype. Integer Div truncates toward zero, like C++.

Costs: one flop per output element for every elementwise op, transcendentals (exp,
log, tanh, sqrt) included, as Caffe2's pointwise cost inference counts them; Sum/Max/Min
of n inputs count n-1 per element; Cast and test-mode Dropout move data only.

The shared helpers (``shape_error``, ``canonical_axis``) are used by fc.py and loss.py.
"""
from __future__ import annotations

import weakref
from math import prod
from typing import Any, Sequence

from placer.errors import ArgumentError, InputError, ShapeError
from placer.ops.registry import OpDef, default_cost, io_bytes, movement_cost, register
from placer.ops.segments import on_host
from placer.types import DATA_TYPE_TO_DTYPE, Args, OpFeatures, TensorType


# ---------------------------------------------------------------- shared helpers
def describe(i: int, name: str, t: TensorType) -> str:
    """`input 1 (W) float32[4096,9000]`: how messages name an input without its blob name."""
    return f"input {i} ({name}) {t}"


def shape_error(args: Args, what: str, *named: tuple[int, str, TensorType]) -> ShapeError:
    """A ShapeError naming the op, the inputs involved with their shapes, and the misfit."""
    shown = ", ".join(describe(i, n, t) for i, n, t in named)
    return ShapeError(f"op {args.op}: {what}" + (f" ({shown})" if shown else ""))


def canonical_axis(axis: int, ndim: int, args: Args, name: str = "axis") -> int:
    """Caffe2's canonical_axis_index: -ndim <= axis < ndim, negatives count from the end."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"op {args.op}: argument '{name}' = {axis} is out of range "
                            f"for a {ndim}-d input (valid: {-ndim}..{ndim - 1})")
    return axis + ndim if axis < 0 else axis


# ---------------------------------------------------------------- binary broadcast
def _legacy_axis(a: TensorType, b: TensorType, args: Args) -> int:
    axis_str = args.str("axis_str", "")
    if axis_str:
        order = args.str("order", "NCHW")
        if len(axis_str) != 1 or axis_str not in order:
            raise ArgumentError(f"op {args.op}: axis_str '{axis_str}' is not one letter of order '{order}'")
        return order.index(axis_str)
    return args.int("axis", -1)


def legacy_sizes(a: TensorType, b: TensorType, args: Args) -> tuple[int, int, int]:
    """(pre, n, post): A viewed as (pre, n, post) and B as (n,), Caffe2's broadcast=1 rule."""
    if b.ndim > a.ndim:
        raise shape_error(args, "with broadcast=1, B must not have more dims than A",
                          (0, "A", a), (1, "B", b))
    axis = _legacy_axis(a, b, args)
    if axis == -1:
        axis = a.ndim - b.ndim
    if not 0 <= axis <= a.ndim - b.ndim:
        raise shape_error(args, f"broadcast axis {axis} is outside 0..{a.ndim - b.ndim}",
                          (0, "A", a), (1, "B", b))
    start, end = 0, b.ndim - 1
    while start < b.ndim and b.shape[start] == 1:
        start += 1
    while end >= start and b.shape[end] == 1:
        end -= 1
    for i in range(start, end + 1):
        if a.shape[axis + i] != b.shape[i]:
            raise shape_error(args, f"with broadcast=1 and axis={axis}, B's dim {i} ({b.shape[i]}) "
                              f"does not match A's dim {axis + i} ({a.shape[axis + i]})",
                              (0, "A", a), (1, "B", b))
    pre = prod(a.shape[:axis + start])
    n = prod(b.shape[start:end + 1])
    return pre, n, a.size // (pre * n) if pre * n else 0


def numpy_broadcast_shape(a: TensorType, b: TensorType, args: Args) -> tuple[int, ...]:
    out = []
    for i in range(1, max(a.ndim, b.ndim) + 1):
        da = a.shape[-i] if i <= a.ndim else 1
        db = b.shape[-i] if i <= b.ndim else 1
        if da != db and 1 not in (da, db):
            raise shape_error(args, f"shapes do not broadcast (dim -{i}: {da} vs {db}); "
                              "set broadcast=1 and axis for Caffe2's old rule",
                              (0, "A", a), (1, "B", b))
        out.append(db if da == 1 else da)
    return tuple(reversed(out))


def _binary_infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    a, b = inputs
    if args.bool("broadcast", False):
        legacy_sizes(a, b, args)
        return [TensorType(a.shape, a.dtype)]
    return [TensorType(numpy_broadcast_shape(a, b, args), a.dtype)]


def _int_div(xp, a, b):
    """C++ integer division (truncates toward zero); numpy's // floors."""
    q = a // b
    return q + ((a % b != 0) & ((a < 0) != (b < 0)))


def _div(xp, a, b):
    return a / b if a.dtype.kind in "fc" else _int_div(xp, a, b)


def _binary_kernel(fn):
    def kernel(xp, inputs, args):
        a, b = inputs
        if args.bool("broadcast", False):
            pre, n, post = legacy_sizes(TensorType(a.shape, str(a.dtype)), TensorType(b.shape, str(b.dtype)), args)
            out = fn(xp, a.reshape(pre, n, post), b.reshape(1, n, 1)).reshape(a.shape)
        else:
            out = fn(xp, a, b)
        return (out.astype(a.dtype, copy=False),)
    return kernel


_BINARY = {
    "Add": lambda xp, a, b: a + b,
    "Sub": lambda xp, a, b: a - b,
    "Mul": lambda xp, a, b: a * b,
    "Div": _div,
}
def _binary_launches(inputs, args) -> int:
    """One ufunc; integer Div adds the C++ truncation (floor divide, remainder, fixes)."""
    return 1 if inputs[0].dtype.startswith("float") else 8


for _name, _fn in _BINARY.items():
    register(OpDef(_name, _binary_infer, _binary_kernel(_fn), min_inputs=2, max_inputs=2,
                   launches=_binary_launches if _name == "Div" else 1,
                   doc=f"{_name} with Caffe2 broadcast (broadcast/axis) or numpy broadcasting"))


def _pow_infer(inputs, args):
    return _binary_infer(inputs, args) if len(inputs) == 2 else [inputs[0]]


def _pow_kernel(xp, inputs, args):
    if len(inputs) == 2:
        return _binary_kernel(lambda xp, a, b: a ** b)(xp, inputs, args)
    x = inputs[0]
    return ((x ** args.float("exponent")).astype(x.dtype, copy=False),)


register(OpDef("Pow", _pow_infer, _pow_kernel, min_inputs=1, max_inputs=2,
               doc="X ** exponent (argument) or X ** E (second input, broadcast like Mul)"))


# ---------------------------------------------------------------- n-ary, equal shapes
def _same_shape_infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    first = inputs[0]
    for i, t in enumerate(inputs[1:], 1):
        if t.shape != first.shape:
            raise shape_error(args, "all inputs must have the same shape",
                              (0, "X0", first), (i, f"X{i}", t))
    return [first]


def _nary_cost(inputs, outputs, args) -> OpFeatures:
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(outputs[0].size * max(len(inputs) - 1, 1)),
                      bytes_read=read, bytes_written=written)


def _nary_kernel(ufunc: str):
    """Folds inputs with xp.<ufunc>, accumulating in place into one fresh output."""
    def kernel(xp, inputs, args):
        if len(inputs) == 1:
            return (inputs[0].copy(),)
        fn = getattr(xp, ufunc)
        out = fn(inputs[0], inputs[1])
        if not isinstance(out, xp.ndarray):   # numpy gives a scalar for 0-d inputs: no out=
            out = xp.asarray(out)
        for x in inputs[2:]:
            fn(out, x, out=out)
        return (out,)
    return kernel


def _nary_launches(inputs, args) -> int:
    """One ufunc per input after the first (a copy for a single input)."""
    return max(len(inputs) - 1, 1)


for _name, _ufunc in (("Sum", "add"), ("Max", "maximum"), ("Min", "minimum")):
    register(OpDef(_name, _same_shape_infer, _nary_kernel(_ufunc), cost=_nary_cost, min_inputs=1,
                   launches=_nary_launches,
                   doc=f"elementwise {_ufunc} of n inputs of equal shape"))


def _mean_kernel(xp, inputs, args):
    (total,) = _nary_kernel("add")(xp, inputs, args)
    total /= len(inputs)
    return (total,)


register(OpDef("Mean", _same_shape_infer, _mean_kernel, cost=_nary_cost, min_inputs=1,
               launches=lambda inputs, args: _nary_launches(inputs, args) + 1,
               doc="elementwise mean of n inputs of equal shape"))


# ---------------------------------------------------------------- unary
def _same_infer(inputs, args):
    return [inputs[0]]


# Large temporaries cost page faults and xp.where is slow on the CPU, so these kernels
# allocate one output and work in place on it where they can.
_EXP_LIMIT = {2: 11.0, 4: 88.0, 8: 709.0}   # largest z with exp(z) finite, by itemsize


def _sigmoid(xp, x, args):
    """1 / (1 + exp(-x)) as Caffe2 computes it; -x is capped so exp never overflows."""
    y = -x
    xp.minimum(y, _EXP_LIMIT.get(x.dtype.itemsize, 88.0), out=y)
    xp.exp(y, out=y)
    y += 1
    return xp.reciprocal(y, out=y)


def leaky(xp, x, slope, unit_interval: bool):
    """x where x > 0, else slope * x (exactly: one rounding, as Caffe2)."""
    y = x * slope
    if unit_interval:               # then max(x, slope*x) picks the right branch
        return xp.maximum(x, y, out=y)
    xp.minimum(x, 0, out=y)
    y *= slope
    y += xp.maximum(x, 0)
    return y


def _leaky_relu(xp, x, args):
    alpha = args.float("alpha", 0.01)
    return leaky(xp, x, alpha, 0 <= alpha <= 1)


def _elu(xp, x, args):
    y = xp.minimum(x, 0)
    xp.expm1(y, out=y)
    y *= args.float("alpha", 1.0)
    y += xp.maximum(x, 0)
    return y


def _softplus(xp, x, args):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), never overflowing."""
    y = xp.abs(x)
    xp.negative(y, out=y)
    xp.exp(y, out=y)
    xp.log1p(y, out=y)
    y += xp.maximum(x, 0)
    return y


def _clip(xp, x, args):
    lo, hi = args.float("min", None), args.float("max", None)
    if lo is None and hi is None:
        return x.copy()
    out = xp.maximum(x, lo) if lo is not None else xp.minimum(x, hi)
    if lo is not None and hi is not None:
        xp.minimum(out, hi, out=out)
    return out


def _swish(xp, x, args):
    y = _sigmoid(xp, x, args)
    y *= x
    return y


def _logit(xp, x, args):
    eps = args.float("eps", 1e-6)
    c = xp.minimum(xp.maximum(x, eps), 1 - eps)
    return xp.log(c / (1 - c))


def _replace_nan(xp, x, args):
    return xp.where(xp.isnan(x), args.float("value", 0.0), x)


_UNARY = {
    "Relu": lambda xp, x, a: xp.maximum(x, 0),
    "LeakyRelu": _leaky_relu,
    "Elu": _elu,
    "Sigmoid": _sigmoid,
    "Tanh": lambda xp, x, a: xp.tanh(x),
    "Softplus": _softplus,
    "Exp": lambda xp, x, a: xp.exp(x),
    "Log": lambda xp, x, a: xp.log(x),
    "Sqrt": lambda xp, x, a: xp.sqrt(x),
    "Sqr": lambda xp, x, a: x * x,
    "Abs": lambda xp, x, a: xp.abs(x),
    "Negative": lambda xp, x, a: -x,
    "Scale": lambda xp, x, a: x * a.float("scale", 1.0),
    "Clip": _clip,
    "Logit": _logit,
    "ReplaceNaN": _replace_nan,
    "Swish": _swish,
    "Softsign": lambda xp, x, a: x / (xp.abs(x) + 1),
    "ThresholdedRelu": lambda xp, x, a: x * (x > a.float("alpha", 1.0)),
    "Reciprocal": lambda xp, x, a: xp.reciprocal(x),
    "Rsqrt": lambda xp, x, a: xp.reciprocal(xp.sqrt(x)),
    "Cos": lambda xp, x, a: xp.cos(x),
    "Sin": lambda xp, x, a: xp.sin(x),
}


def _unary_kernel(fn):
    def kernel(xp, inputs, args):
        x = inputs[0]
        return (fn(xp, x, args).astype(x.dtype, copy=False),)
    return kernel


# Launches of the unary kernels above that make more than one (counted on tests/cupy_standin.py).
_UNARY_LAUNCHES = {"Elu": 5, "Sigmoid": 5, "Softplus": 6, "Swish": 6, "Logit": 5, "ReplaceNaN": 2,
                   "Softsign": 3, "ThresholdedRelu": 2, "Rsqrt": 2, "Clip": 2,
                   "LeakyRelu": lambda inputs, args: 2 if 0 <= args.float("alpha", 0.01) <= 1 else 5}

# Temporaries of the unary kernels, per byte of the output: tracemalloc's peak during the
# kernel less its output, on 2^20 float32 (c and c / (1 - c) beside log's output in Logit;
# one array in Elu, Softplus, Softsign, Rsqrt; a bool mask, 1 byte an element, in
# ThresholdedRelu and ReplaceNaN, counted as 1 for any dtype). The others write in place.
_UNARY_SCRATCH = {"Logit": 2.0, "Elu": 1.0, "Softplus": 1.0, "Softsign": 1.0, "Rsqrt": 1.0,
                  "ThresholdedRelu": 1.0, "ReplaceNaN": 1.0}

for _name, _fn in _UNARY.items():
    register(OpDef(_name, _same_infer, _unary_kernel(_fn), min_inputs=1, max_inputs=1,
                   launches=_UNARY_LAUNCHES.get(_name, 1), scratch=_UNARY_SCRATCH.get(_name, 0.0),
                   doc=f"elementwise {_name}, output like the input"))


# ---------------------------------------------------------------- PRelu
def _prelu_channels(x: TensorType, args: Args) -> int:
    order = args.str("order", "NCHW")
    if x.ndim < 2:
        raise shape_error(args, "PRelu needs an input with at least 2 dims (N, C, ...)", (0, "X", x))
    return x.shape[1] if order == "NCHW" else x.shape[-1]


def _prelu_infer(inputs, args):
    x, slope = inputs
    c = _prelu_channels(x, args)
    if slope.size not in (1, c):
        raise shape_error(args, f"slope has {slope.size} values; expected 1 or C={c} "
                          f"(order {args.str('order', 'NCHW')})", (0, "X", x), (1, "slope", slope))
    return [x]


def _prelu_kernel(xp, inputs, args):
    x, slope = inputs
    if slope.size > 1 and args.str("order", "NCHW") == "NCHW":
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    else:
        slope = slope.reshape(-1)
    # Slopes in [0, 1] allow the cheaper max(x, slope * x); knowing that needs the slope
    # values on the host, free on the CPU but a sync on a GPU, which takes the general form.
    unit = on_host(xp) and bool(((slope >= 0) & (slope <= 1)).all())
    return (leaky(xp, x, slope, unit).astype(x.dtype, copy=False),)


register(OpDef("PRelu", _prelu_infer, _prelu_kernel, min_inputs=2, max_inputs=2, launches=5,
               doc="x if x > 0 else slope[c] * x; one slope per channel (order NCHW/NHWC) or shared"))


# ---------------------------------------------------------------- Dropout
def _dropout_infer(inputs, args):
    """Output Y and the mask (bool) Caffe2 writes in training; extra outputs are dropped."""
    x = inputs[0]
    return [x, TensorType(x.shape, "bool")]


# One generator per op and array module, seeded with the op's seed on first use and kept
# while the op's arguments live (the executor makes them once per op): every iteration
# draws a new mask, as Caffe2's per-device generator does, and no generator is built per
# call. Keyed by object ids; the entry goes when the arguments are collected.
_GENERATORS: dict[tuple[int, int], Any] = {}


def op_generator(xp, args: Args):
    """The random generator of the op ``args`` belong to, on ``xp``'s device."""
    key = (id(xp), id(args))
    rng = _GENERATORS.get(key)
    if rng is None:
        rng = _GENERATORS[key] = xp.random.default_rng(args.seed)
        weakref.finalize(args, _GENERATORS.pop, key, None)
    return rng


def _dropout_kernel(xp, inputs, args):
    x = inputs[0]
    if args.bool("is_test", False):
        if getattr(args, "n_outputs", None) == 1:   # no mask asked for: skip making one
            return (x.copy(),)
        return x.copy(), xp.ones(x.shape, dtype=bool)
    ratio = args.float("ratio", 0.5)
    mask = op_generator(xp, args).random(x.shape, dtype=xp.float32) >= ratio
    scale = 0.0 if ratio >= 1.0 else 1.0 / (1.0 - ratio)
    return (x * mask * scale).astype(x.dtype, copy=False), mask


def _dropout_cost(inputs, outputs, args):
    if args.bool("is_test", False):
        return movement_cost(inputs, outputs[:1], args)
    return default_cost(inputs, outputs, args)


register(OpDef("Dropout", _dropout_infer, _dropout_kernel, cost=_dropout_cost,
               launches=lambda inputs, args: 2 if args.bool("is_test", False) else 4,
               min_inputs=1, max_inputs=1,
               doc="is_test=1: identity (mask all true); else keeps each value with p=1-ratio, scaled"))


# ---------------------------------------------------------------- Cast
_DATA_TYPE_NAMES = {"FLOAT": 1, "INT32": 2, "BYTE": 3, "STRING": 4, "BOOL": 5, "UINT8": 6, "INT8": 7,
                    "UINT16": 8, "INT16": 9, "INT64": 10, "FLOAT16": 12, "DOUBLE": 13}


def cast_dtype(args: Args) -> str:
    """The numpy dtype named by Cast's `to` (a TensorProto.DataType number or its name)."""
    raw = args["to"] if "to" in args else 1          # Caffe2's default: FLOAT
    number = _DATA_TYPE_NAMES.get(args.str("to").upper()) if isinstance(raw, (str, bytes)) else args.int("to", 1)
    dtype = DATA_TYPE_TO_DTYPE.get(number)
    if dtype is None or dtype == "object":
        raise ArgumentError(f"op {args.op}: Cast to={raw!r} is not a numeric TensorProto.DataType",
                            hint="use 1 FLOAT, 2 INT32, 5 BOOL, 10 INT64, 12 FLOAT16, 13 DOUBLE, ...")
    return dtype


register(OpDef("Cast", lambda inputs, args: [TensorType(inputs[0].shape, cast_dtype(args))],
               lambda xp, inputs, args: (inputs[0].astype(cast_dtype(args)),),
               cost=movement_cost, min_inputs=1, max_inputs=1,
               doc="converts to the dtype named by `to` (TensorProto.DataType); floats truncate to ints"))


# ---------------------------------------------------------------- EnforceFinite
def _enforce_finite(xp, inputs, args):
    if not xp.isfinite(inputs[0]).all().tolist():   # its one host read: the answer
        raise InputError(f"op {args.op}: input holds NaN or infinite values")
    return ()


register(OpDef("EnforceFinite", lambda inputs, args: [], _enforce_finite, cost=movement_cost, launches=2,
               min_inputs=1, max_inputs=1, doc="fails the run when its input is not all finite"))
