"""Op family 'transformer': Caffe2's LayerNorm and Gelu with their gradients.

Semantics are torch 1.8.1's Caffe2 CPU operators (caffe2/operators/layer_norm_op.cc,
layer_norm_op.h, gelu_op.cc, gelu_op.h):

- ``LayerNorm`` (X, and gamma, beta when ``elementwise_affine`` = 1) -> Y, mean, std.
  Normalises over the dims ``[axis:]`` (``axis`` 1 by default, negative counts from the
  end); mean and std have shape ``X.shape[:axis] + (1,)`` (``(1,)`` for axis 0), and
  std = sqrt(var + epsilon) (``epsilon`` 1e-5). gamma and beta have shape ``X.shape[axis:]``.
- ``LayerNormGradient`` (dY, Y, mean, std, X, and gamma when affine) -> dX, and dgamma,
  dbeta when affine: the inputs Caffe2's gradient maker gives it (GO(0), O(0), O(1), O(2),
  I(0), I(1)). With xhat = (X - mean) / std and g = dY * gamma:
  dX = (g - mean(g) - xhat * mean(g * xhat)) / std; dgamma = sum dY * xhat, dbeta = sum dY
  over the leading dims.
- ``Gelu`` (X) -> Y = 0.5 x (1 + erf(x / sqrt 2)), or with ``fast_gelu`` the tanh form
  0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). ``GeluGradient`` (dY, X) -> dX.

The kernels compute in float64 and return X's dtype. numpy has no erf and the cupy rules
allow no cupyx.scipy, so ``_erf`` evaluates it in xp: for |t| < 3 the positive-term series
erf(t) = 2/sqrt(pi) exp(-t^2) sum_n (2t^2)^n t / (1 * 3 * ... * (2n + 1)) (46 terms, no
cancellation), for |t| >= 3 the continued fraction of erfc (24 levels). Its error is
below 2e-15 over the float64 range (tests/test_ops_transformer.py checks it against
scipy.special.erf on a dense grid).

Devices: Caffe2 1.8.1 registers CUDA kernels for all four (caffe2/operators/layer_norm_op.cu,
REGISTER_CUDA_OPERATOR(LayerNorm, ...) and LayerNormGradient; caffe2/operators/gelu_op.cu,
REGISTER_CUDA_OPERATOR(Gelu, ...) and GeluGradient).
"""
from __future__ import annotations

import math

from placer.errors import ShapeError
from placer.ops.registry import OpDef, register
from placer.types import OpFeatures, TensorType, shape_str

ERF_SERIES_TERMS = 46
ERF_CF_DEPTH = 24
ERF_SPLIT = 3.0
GELU_FAST_C = 0.044715
LN_FLOPS = 8          # per element, forward: sum, square-sum, subtract, divide (+ affine)
LN_GRAD_FLOPS = 14    # per element, gradient: xhat, g, two reductions, the combination
GELU_FLOPS = 2 * ERF_SERIES_TERMS + 2 * ERF_CF_DEPTH + 10   # series, fraction, select
GELU_FAST_FLOPS = 10

CUDA_BOTH = frozenset({"cpu", "gpu"})

# GPU kernel launches of one run (elementwise ops, casts and reductions, counted on the
# strict cupy stand-in): the exact Gelu's erf is two launches per series term and per
# fraction level.
LN_LAUNCHES, LN_AFFINE_LAUNCHES = 12, 16
LN_GRAD_LAUNCHES, LN_GRAD_AFFINE_LAUNCHES = 14, 21
GELU_LAUNCHES = 2 * ERF_SERIES_TERMS + 2 * ERF_CF_DEPTH + 27
GELU_FAST_LAUNCHES = 11
GELU_GRAD_EXTRA = 7           # the derivative's exp term and the product with dY
GELU_FAST_GRAD_LAUNCHES = 22


_SERIES_COEFFS = [1.0]
for _n in range(1, ERF_SERIES_TERMS):
    _SERIES_COEFFS.append(_SERIES_COEFFS[-1] / (2 * _n + 1))


def _erf(xp, t):
    """erf of a float64 array, in xp alone (see the module docstring; error < 1e-15)."""
    a = xp.abs(t)
    s = xp.minimum(a, ERF_SPLIT)
    u = 2.0 * s * s
    acc = xp.full_like(s, _SERIES_COEFFS[-1])
    for c in reversed(_SERIES_COEFFS[:-1]):      # Horner in u = 2 t^2: sum_n u^n / (1 * 3 * ... * (2n + 1))
        acc = acc * u + c
    series = (2.0 / math.sqrt(math.pi)) * xp.exp(-s * s) * s * acc
    c = xp.maximum(a, ERF_SPLIT)
    f = c
    for k in range(ERF_CF_DEPTH, 0, -1):          # erfc(c) = exp(-c^2) / (sqrt(pi) (c + (1/2)/(c + 1/(c + ...))))
        f = c + (k / 2.0) / f
    frac = 1.0 - xp.exp(-c * c) / (math.sqrt(math.pi) * f)
    e = xp.where(a < ERF_SPLIT, series, frac)
    return xp.where(t < 0, -e, e)


# -- LayerNorm ----------------------------------------------------------------------------

def _axis(x: TensorType, args, op_type: str) -> int:
    axis = args.int("axis", 1)
    nd = len(x.shape)
    a = axis + nd if axis < 0 else axis
    if not 0 <= a < nd:
        raise ShapeError(f"op {args.op}: {op_type} axis {axis} is out of range for X of shape "
                         f"{shape_str([x])}")
    return a


def _ln_check(inputs, args, op_type: str, x: TensorType, gamma_at: int | None) -> int:
    a = _axis(x, args, op_type)
    affine = args.bool("elementwise_affine", False)
    fail = f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): "
    if affine:
        if gamma_at is None or len(inputs) <= gamma_at + (1 if op_type == "LayerNorm" else 0):
            raise ShapeError(fail + "elementwise_affine=1 needs gamma"
                             + (" and beta" if op_type == "LayerNorm" else ""))
        want = tuple(x.shape[a:])
        names = ("gamma", "beta") if op_type == "LayerNorm" else ("gamma",)
        for i, name in enumerate(names):
            t = inputs[gamma_at + i]
            if tuple(t.shape) != want and math.prod(t.shape) != math.prod(want):
                raise ShapeError(fail + f"{name} must hold X.shape[{a}:] = {want} elements")
    return a


def _stat_shape(x: TensorType, a: int) -> tuple[int, ...]:
    return tuple(x.shape[:a]) + (1,)


def _ln_infer(inputs, args):
    x = inputs[0]
    if len(inputs) > 1 and not args.bool("elementwise_affine", False):
        raise ShapeError(f"op {args.op}: LayerNorm takes gamma and beta only with elementwise_affine=1")
    a = _ln_check(inputs, args, "LayerNorm", x, 1)
    st = _stat_shape(x, a)
    return [TensorType(tuple(x.shape), x.dtype), TensorType(st, x.dtype), TensorType(st, x.dtype)]


def _ln_kernel(xp, inputs, args):
    x = inputs[0]
    a = _ln_check([TensorType(t.shape, str(t.dtype)) for t in inputs], args, "LayerNorm",
                  TensorType(x.shape, str(x.dtype)), 1)
    m = math.prod(x.shape[:a])
    n = math.prod(x.shape[a:])
    x2 = x.reshape(m, n).astype(xp.float64)
    mean = x2.mean(axis=1, keepdims=True)
    var = ((x2 - mean) ** 2).mean(axis=1, keepdims=True)
    std = xp.sqrt(var + args.float("epsilon", 1e-5))
    y = (x2 - mean) / std
    if args.bool("elementwise_affine", False):
        y = y * inputs[1].reshape(1, n).astype(xp.float64) + inputs[2].reshape(1, n).astype(xp.float64)
    st = tuple(x.shape[:a]) + (1,)
    return (y.reshape(x.shape).astype(x.dtype), mean.reshape(st).astype(x.dtype),
            std.reshape(st).astype(x.dtype))


def _ln_cost(inputs, outputs, args):
    """X read twice (statistics, then normalisation), gamma and beta once; Y, mean, std written."""
    x = inputs[0]
    n = math.prod(x.shape)
    affine = args.bool("elementwise_affine", False)
    return OpFeatures(flops=float(n * (LN_FLOPS + (2 if affine else 0))),
                      bytes_read=float(2 * x.nbytes + sum(t.nbytes for t in inputs[1:])),
                      bytes_written=float(sum(t.nbytes for t in outputs if t is not None)))


def _ln_grad_check(inputs, args):
    dy, y, mean, std, x = inputs[:5]
    fail = f"op {args.op}: LayerNormGradient on inputs ({shape_str(inputs)}): "
    if tuple(dy.shape) != tuple(x.shape) or tuple(y.shape) != tuple(x.shape):
        raise ShapeError(fail + "dY and Y must have X's shape")
    a = _ln_check(inputs, args, "LayerNormGradient", x, 5)
    st = _stat_shape(x, a)
    if math.prod(mean.shape) != math.prod(st) or math.prod(std.shape) != math.prod(st):
        raise ShapeError(fail + f"mean and std must have shape {st}")
    return a


def _ln_grad_infer(inputs, args):
    _ln_grad_check(inputs, args)
    x = inputs[4]
    outs = [TensorType(tuple(x.shape), x.dtype)]
    if args.bool("elementwise_affine", False):
        g = inputs[5]
        outs += [TensorType(tuple(g.shape), g.dtype), TensorType(tuple(g.shape), g.dtype)]
    return outs


def _ln_grad_kernel(xp, inputs, args):
    a = _ln_grad_check([TensorType(t.shape, str(t.dtype)) for t in inputs], args)
    dy, _y, mean, std, x = inputs[:5]
    m = math.prod(x.shape[:a])
    n = math.prod(x.shape[a:])
    dy2 = dy.reshape(m, n).astype(xp.float64)
    s = std.reshape(m, 1).astype(xp.float64)
    xhat = (x.reshape(m, n).astype(xp.float64) - mean.reshape(m, 1).astype(xp.float64)) / s
    affine = args.bool("elementwise_affine", False)
    g = dy2 * inputs[5].reshape(1, n).astype(xp.float64) if affine else dy2
    dx = (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True)) / s
    outs = [dx.reshape(x.shape).astype(x.dtype)]
    if affine:
        gamma = inputs[5]
        outs.append((dy2 * xhat).sum(axis=0).reshape(gamma.shape).astype(gamma.dtype))
        outs.append(dy2.sum(axis=0).reshape(gamma.shape).astype(gamma.dtype))
    return tuple(outs)


def _ln_grad_cost(inputs, outputs, args):
    """dY and X read twice (reductions, then dX), mean, std and gamma once; Y is not read."""
    dy, _y, mean, std, x = inputs[:5]
    n = math.prod(x.shape)
    return OpFeatures(flops=float(n * LN_GRAD_FLOPS),
                      bytes_read=float(2 * (dy.nbytes + x.nbytes) + mean.nbytes + std.nbytes
                                       + sum(t.nbytes for t in inputs[5:])),
                      bytes_written=float(sum(t.nbytes for t in outputs if t is not None)))


# -- Gelu ---------------------------------------------------------------------------------

def _gelu_infer(inputs, args):
    x = inputs[0]
    return [TensorType(tuple(x.shape), x.dtype)]


def _gelu_kernel(xp, inputs, args):
    x = inputs[0]
    v = x.astype(xp.float64)
    if args.bool("fast_gelu", False):
        k = math.sqrt(2.0 / math.pi)
        y = 0.5 * v * (1.0 + xp.tanh(k * (v + GELU_FAST_C * v * v * v)))
    else:
        y = 0.5 * v * (1.0 + _erf(xp, v / math.sqrt(2.0)))
    return (y.astype(x.dtype),)


def _gelu_grad_infer(inputs, args):
    dy, x = inputs[0], inputs[1]
    if tuple(dy.shape) != tuple(x.shape):
        raise ShapeError(f"op {args.op}: GeluGradient on inputs ({shape_str(inputs)}): "
                         f"dY and X must have the same shape")
    return [TensorType(tuple(x.shape), x.dtype)]


def _gelu_grad_kernel(xp, inputs, args):
    _gelu_grad_infer([TensorType(t.shape, str(t.dtype)) for t in inputs], args)
    dy, x = inputs[0], inputs[1]
    v = x.astype(xp.float64)
    if args.bool("fast_gelu", False):
        k = math.sqrt(2.0 / math.pi)
        th = xp.tanh(k * (v + GELU_FAST_C * v * v * v))
        d = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * k * (1.0 + 3.0 * GELU_FAST_C * v * v)
    else:
        d = 0.5 * (1.0 + _erf(xp, v / math.sqrt(2.0))) + v * xp.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
    return ((dy.astype(xp.float64) * d).astype(x.dtype),)


def _gelu_flops(args) -> int:
    return GELU_FAST_FLOPS if args.bool("fast_gelu", False) else GELU_FLOPS


def _gelu_cost(inputs, outputs, args):
    n = math.prod(inputs[0].shape)
    return OpFeatures(flops=float(n * _gelu_flops(args)),
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs if t is not None)))


def _gelu_grad_cost(inputs, outputs, args):
    n = math.prod(inputs[1].shape)
    return OpFeatures(flops=float(n * (_gelu_flops(args) + 4)),
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs if t is not None)))


def _ln_launches(inputs, args):
    return LN_AFFINE_LAUNCHES if args.bool("elementwise_affine", False) else LN_LAUNCHES


def _ln_grad_launches(inputs, args):
    return LN_GRAD_AFFINE_LAUNCHES if args.bool("elementwise_affine", False) else LN_GRAD_LAUNCHES


def _gelu_launches(inputs, args):
    return GELU_FAST_LAUNCHES if args.bool("fast_gelu", False) else GELU_LAUNCHES


def _gelu_grad_launches(inputs, args):
    return GELU_FAST_GRAD_LAUNCHES if args.bool("fast_gelu", False) else GELU_LAUNCHES + GELU_GRAD_EXTRA


register(OpDef("LayerNorm", _ln_infer, _ln_kernel, _ln_cost, min_inputs=1, max_inputs=3,
               devices=CUDA_BOTH, caffe2_devices=CUDA_BOTH, launches=_ln_launches,
               doc="Layer normalisation over dims [axis:]: Y, mean, std = sqrt(var + eps) (Caffe2 semantics)"))
register(OpDef("LayerNormGradient", _ln_grad_infer, _ln_grad_kernel, _ln_grad_cost,
               min_inputs=5, max_inputs=6, devices=CUDA_BOTH, caffe2_devices=CUDA_BOTH,
               launches=_ln_grad_launches,
               doc="LayerNorm's gradient: dX, and dgamma, dbeta when affine (Caffe2 semantics)"))
register(OpDef("Gelu", _gelu_infer, _gelu_kernel, _gelu_cost, min_inputs=1, max_inputs=1,
               devices=CUDA_BOTH, caffe2_devices=CUDA_BOTH, launches=_gelu_launches,
               doc="GELU, exact (erf) or with fast_gelu the tanh approximation (Caffe2 semantics)"))
register(OpDef("GeluGradient", _gelu_grad_infer, _gelu_grad_kernel, _gelu_grad_cost,
               min_inputs=2, max_inputs=2, devices=CUDA_BOTH, caffe2_devices=CUDA_BOTH,
               launches=_gelu_grad_launches,
               doc="Gelu's gradient: dY times the derivative of the chosen form (Caffe2 semantics)"))
