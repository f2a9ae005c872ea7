"""Gradient ops of the activations and n-ary elementwise ops, as torch 1.8.1's Caffe2 has them.

Each reads what its forward op's gradient maker hands it (``GetGradientForOp``): the
forward output Y where the derivative is a function of Y (so that the op can run in
place on X), the input X where it is not. Formulas are those of the Caffe2 CPU kernels:

  ReluGradient(Y, dY)            dY * (Y > 0)
  SigmoidGradient(Y, dY)         dY * Y * (1 - Y)
  TanhGradient(Y, dY)            dY * (1 - Y^2)
  SoftmaxGradient(Y, dY)         Y * (dY - sum(dY * Y)) over X coerced to 2-D at ``axis``
  EluGradient(Y, dY)             dY where Y > 0, else dY * (Y + alpha)
  LeakyReluGradient(Y, dY)       dY where Y > 0, else dY * alpha
  ClipGradient(Y, dY)            dY where min < Y < max, else 0
  ThresholdedReluGradient(Y, dY) dY * sign(Y) (Y is 0 or > alpha: dY where the unit fired)
  ReciprocalGradient(Y, dY)      -dY * Y^2
  RsqrtGradient(dY, Y)           -0.5 * dY * Y^3
  SoftplusGradient(Y, dY)        dY * (1 - exp(-Y))
  AbsGradient(X, dY)             dY * sign(X)
  CosGradient(X, dY)             -dY * sin(X);  SinGradient(X, dY)  dY * cos(X)
  SoftsignGradient(X, dY)        dY / (1 + |X|)^2
  LogitGradient(X, dY)           dY / (X (1 - X)) inside [eps, 1 - eps], else 0
  SwishGradient(X, Y, dY)        dY * (Y + sigmoid(X) * (1 - Y))
  MaxGradient / MinGradient(Y, dY, X0, X1, ...) -> dX_i = dY where X_i == Y (ties all get it)
  MeanGradient(dY) -> dX_i = dY / n for each of the n outputs
  PReluGradient(Y, dY, X, slope) -> (dX, dslope): dX = dY where X > 0 else slope * dY;
                                 dslope = sum of dY * X where X <= 0, per channel or shared
Costs: one flop per element per arithmetic step written above (Softmax 4), inputs read
once, outputs written once; all have CUDA kernels in Caffe2. GPU launches (``launches``,
counted on the strict cupy stand-in): one per ufunc each formula applies as written here
(a compare, a multiply, ...; casts to dY's dtype are free when the dtypes agree).
"""
from __future__ import annotations

from math import prod

from placer.ops.elementwise import canonical_axis, shape_error
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import OpFeatures, TensorType


def _like_last(inputs, args):
    """Output shaped like the incoming gradient (which is shaped like the forward's X)."""
    ref = inputs[-1] if len(inputs) == 2 else inputs[0]
    for i, t in enumerate(inputs):
        if t.shape != ref.shape:
            raise shape_error(args, "all inputs must have the same shape", (0, "first", inputs[0]), (i, "input", t))
    return [ref]


def _per_element(flops: float):
    def cost(inputs, outputs, args) -> OpFeatures:
        read, written = io_bytes(inputs, outputs)
        return OpFeatures(flops=float(flops * outputs[0].size), bytes_read=read, bytes_written=written)
    return cost


def _sigmoid(xp, x):
    return 1 / (1 + xp.exp(-x))


def _softmax_grad(xp, y, dy, args):
    axis = canonical_axis(args.int("axis", 1), y.ndim, args)
    n = prod(y.shape[:axis])
    y2, dy2 = y.reshape(n, prod(y.shape[axis:])), dy.reshape(n, prod(y.shape[axis:]))  # n may be 0
    dot = (y2 * dy2).sum(axis=1, keepdims=True, dtype=y.dtype)
    return (y2 * (dy2 - dot)).reshape(y.shape)


def _clip_grad(xp, y, dy, args):
    keep = xp.ones(y.shape, dtype=bool)
    if args.float("min", None) is not None:
        keep &= y > args.float("min")
    if args.float("max", None) is not None:
        keep &= y < args.float("max")
    return dy * keep


def _logit_grad(xp, x, dy, args):
    eps = args.float("eps", 1e-6)
    inside = (x >= eps) & (x <= 1 - eps)
    return xp.where(inside, dy / (x * (1 - x)), xp.zeros((), dtype=dy.dtype))


def _clip_launches(inputs, args) -> int:
    """The all-true mask, a compare and an ``&=`` per bound given, the multiply."""
    return 2 + 2 * sum(args.float(bound, None) is not None for bound in ("min", "max"))


# Launches of the rules below (counted on tests/cupy_standin.py).
_UNARY_LAUNCHES = {"ReluGradient": 2, "SigmoidGradient": 3, "TanhGradient": 3, "SoftmaxGradient": 4,
                   "EluGradient": 4, "LeakyReluGradient": 3, "ClipGradient": _clip_launches,
                   "ThresholdedReluGradient": 2, "ReciprocalGradient": 3, "RsqrtGradient": 4,
                   "SoftplusGradient": 4, "AbsGradient": 2, "CosGradient": 3, "SinGradient": 2,
                   "SoftsignGradient": 4, "LogitGradient": 8}

# name -> (elementwise rule on the op's inputs in order, flops per element)
_UNARY = {
    "ReluGradient": (lambda xp, y, dy, a: dy * (y > 0), 1),
    "SigmoidGradient": (lambda xp, y, dy, a: dy * y * (1 - y), 3),
    "TanhGradient": (lambda xp, y, dy, a: dy * (1 - y * y), 3),
    "SoftmaxGradient": (_softmax_grad, 4),
    "EluGradient": (lambda xp, y, dy, a: xp.where(y > 0, dy, dy * (y + y.dtype.type(a.float("alpha", 1.0)))), 2),
    "LeakyReluGradient": (lambda xp, y, dy, a: xp.where(y > 0, dy, dy * dy.dtype.type(a.float("alpha", 0.01))), 1),
    "ClipGradient": (_clip_grad, 2),
    "ThresholdedReluGradient": (lambda xp, y, dy, a: dy * xp.sign(y), 1),
    "ReciprocalGradient": (lambda xp, y, dy, a: -dy * (y * y), 2),
    "RsqrtGradient": (lambda xp, dy, y, a: dy * (y * y * y) * dy.dtype.type(-0.5), 3),
    "SoftplusGradient": (lambda xp, y, dy, a: dy * (1 - xp.exp(-y)), 3),
    "AbsGradient": (lambda xp, x, dy, a: dy * xp.sign(x), 1),
    "CosGradient": (lambda xp, x, dy, a: -dy * xp.sin(x), 2),
    "SinGradient": (lambda xp, x, dy, a: dy * xp.cos(x), 2),
    "SoftsignGradient": (lambda xp, x, dy, a: dy / xp.square(1 + xp.abs(x)), 3),
    "LogitGradient": (_logit_grad, 4),
}


def _unary_kernel(rule):
    def kernel(xp, inputs, args):
        first, second = inputs
        dy = first if rule is _UNARY["RsqrtGradient"][0] else second
        return (rule(xp, first, second, args).astype(dy.dtype, copy=False),)
    return kernel


for _type, (_rule, _flops) in _UNARY.items():
    register(OpDef(_type, _like_last, _unary_kernel(_rule), cost=_per_element(_flops),
                   min_inputs=2, max_inputs=2, launches=_UNARY_LAUNCHES[_type],
                   doc=f"dX of {_type[:-8]} (see the module docstring)"))


def _swish_grad(xp, inputs, args):
    x, y, dy = inputs
    return ((dy * (y + _sigmoid(xp, x) * (1 - y))).astype(dy.dtype, copy=False),)


register(OpDef("SwishGradient", _like_last, _swish_grad, cost=_per_element(6), min_inputs=3, max_inputs=3, launches=8,
               doc="(X, Y, dY) -> dX of Swish"))


# ---------------------------------------------------------------- n-ary
def _select_infer(inputs, args):
    y, dy = inputs[:2]
    for i, t in enumerate(inputs):
        if t.shape != y.shape:
            raise shape_error(args, "Y, dY and every X must have the same shape", (0, "Y", y), (i, "input", t))
    return [TensorType(y.shape, dy.dtype)] * (len(inputs) - 2)


def _select_kernel(xp, inputs, args):
    y, dy = inputs[:2]
    return tuple((dy * (x == y)).astype(dy.dtype, copy=False) for x in inputs[2:])


for _type in ("MaxGradient", "MinGradient"):
    register(OpDef(_type, _select_infer, _select_kernel, cost=_per_element(1), min_inputs=3,
                   launches=lambda inputs, args: 2 * (len(inputs) - 2),    # a compare and a multiply per X
                   doc=f"(Y, dY, X0, X1, ...) -> dX_i = dY where X_i == Y ({_type[:3]})"))


def _mean_grad_infer(inputs, args):
    return [inputs[0]] * (args.n_outputs or 1)


def _mean_grad_kernel(xp, inputs, args):
    dy = inputs[0]
    n = args.n_outputs or 1
    part = dy * dy.dtype.type(1.0 / n)
    return tuple(part.copy() for _ in range(n))


register(OpDef("MeanGradient", _mean_grad_infer, _mean_grad_kernel, cost=_per_element(1),
               min_inputs=1, max_inputs=1, launches=lambda inputs, args: (args.n_outputs or 1) + 1,
               doc="dY -> dY / n for each of the n inputs of Mean"))


# ---------------------------------------------------------------- PRelu
def _prelu_channel_shape(x, slope, args) -> tuple:
    if slope.size == 1:
        return ()
    nchw = args.str("order", "NCHW") == "NCHW"
    return (-1,) + (1,) * (x.ndim - 2) if nchw else (-1,)


def _prelu_grad_infer(inputs, args):
    y, dy, x, slope = inputs
    return [TensorType(x.shape, dy.dtype), TensorType(slope.shape, dy.dtype)]


def _prelu_grad_kernel(xp, inputs, args):
    y, dy, x, slope = inputs
    shape = _prelu_channel_shape(x, slope, args)
    w = slope.reshape(shape) if shape else slope.reshape(())
    negative = x <= 0
    dx = xp.where(negative, dy * w, dy)
    contrib = dy * x * negative
    if not shape:
        dw = contrib.sum(dtype=dy.dtype).reshape(slope.shape)
    else:
        axis = 1 if args.str("order", "NCHW") == "NCHW" else x.ndim - 1
        dw = contrib.sum(axis=tuple(a for a in range(x.ndim) if a != axis), dtype=dy.dtype).reshape(slope.shape)
    return dx.astype(dy.dtype, copy=False), dw


register(OpDef("PReluGradient", _prelu_grad_infer, _prelu_grad_kernel, cost=_per_element(3),
               min_inputs=4, max_inputs=4, launches=6, doc="(Y, dY, X, slope) -> (dX, dslope)"))
