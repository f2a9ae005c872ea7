"""Gradient ops of the losses, as torch 1.8.1's Caffe2 writes and computes them.

  SoftmaxWithLossGradient(X, label[, weight], P, dL) -> dX
      dX = (P - onehot(label)) * w_i * scale * dL / sum(w)  (label_prob=1: P - label rows)
  AveragedLossGradient(X, dL) -> dX = dL / size(X) everywhere
  LabelCrossEntropyGradient(X, label, dY) -> dX[i, label_i] = -dY_i / max(X[i, label_i], 1e-20)
  SigmoidCrossEntropyWithLogitsGradient(dY, X, T) -> dX = dY_i / D * (sigmoid(X) - T)
      (log_D_trick: -dY_i / D * (2T - 1) * (1 - sigmoid(X))), D the last dim
  SquaredL2DistanceGradient(X, Y, dD) -> (dX, dY) = ((X - Y) * dD_i, -(X - Y) * dD_i)
  MakeTwoClassGradient(dY) -> dX = dY[..., 1] - dY[..., 0]
Costs: a few flops per element of X (written beside each kernel); all have CUDA kernels.
GPU launches (``launches``) are counted on the strict cupy stand-in: one per ufunc,
reduction, gather and fancy-index update each kernel below makes.
"""
from __future__ import annotations

from math import prod

from placer.errors import ArgumentError
from placer.ops.elementwise import canonical_axis, shape_error
from placer.ops.loss import LOG_THRESHOLD
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType


def _flops(per: float, which: int = 0):
    def cost(inputs, outputs, args) -> OpFeatures:
        read, written = io_bytes(inputs, outputs)
        return OpFeatures(flops=float(per * inputs[which].size), bytes_read=read, bytes_written=written)
    return cost


def _rows(x: TensorType, args: Args) -> tuple[int, int]:
    axis = canonical_axis(args.int("axis", 1), x.ndim, args)
    return prod(x.shape[:axis]), prod(x.shape[axis:])


# ---------------------------------------------------------------- SoftmaxWithLoss
def _swl_grad_infer(inputs, args):
    x, p = inputs[0], inputs[-2]
    if args.bool("spatial", False):
        raise ArgumentError(f"op {args.op}: SoftmaxWithLossGradient with spatial=1 is not supported")
    if p.shape != x.shape:
        raise shape_error(args, "P must have X's shape", (0, "X", x), (len(inputs) - 2, "P", p))
    if inputs[-1].size != 1:
        raise shape_error(args, "the loss gradient must hold one value", (len(inputs) - 1, "dL", inputs[-1]))
    return [x]


def _swl_grad_kernel(xp, inputs, args):
    x, label, p, dl = inputs[0], inputs[1], inputs[-2], inputs[-1]
    weight = inputs[2] if len(inputs) == 5 else None
    n, d = _rows(TensorType(x.shape), args)
    dx = p.reshape(n, d).copy()
    if args.bool("label_prob", False):
        dx -= label.reshape(n, d).astype(dx.dtype)
    else:
        dx[xp.arange(n), label.reshape(n)] -= 1
    w = xp.ones(n, dtype=dx.dtype) if weight is None else weight.reshape(n).astype(dx.dtype)
    total = w.sum()
    factor = dl.reshape(()).astype(dx.dtype) * dx.dtype.type(args.float("scale", 1.0)) / xp.where(total != 0, total, 1)
    dx *= (w * factor)[:, None]
    return (dx.reshape(x.shape),)


register(OpDef("SoftmaxWithLossGradient", _swl_grad_infer, _swl_grad_kernel, cost=_flops(3),
               min_inputs=4, max_inputs=5,       # label rows subtract in 2 launches, one-hot labels in 4
               launches=lambda inputs, args: 12 if args.bool("label_prob", False) else 14,
               doc="(X, label[, weight], P, dL) -> dX"))


# ---------------------------------------------------------------- AveragedLoss
def _averaged_loss_grad(xp, inputs, args):
    x, dl = inputs
    value = dl.reshape(()).astype(x.dtype) / x.dtype.type(max(x.size, 1))
    return (xp.full(x.shape, value, dtype=x.dtype),)


register(OpDef("AveragedLossGradient", lambda i, a: [i[0]], _averaged_loss_grad,
               cost=lambda i, o, a: OpFeatures(flops=1.0, bytes_read=float(i[1].nbytes),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=2, max_inputs=2, launches=3, doc="(X, dL) -> dL / size(X) in X's shape"))


# ---------------------------------------------------------------- LabelCrossEntropy
def _lce_grad_infer(inputs, args):
    x, label, dy = inputs
    n = x.shape[0] if x.ndim > 1 else 1
    if label.size != n or dy.size != n:
        raise shape_error(args, f"needs {n} labels and {n} loss gradients", (0, "X", x), (1, "label", label),
                          (2, "dY", dy))
    return [x]


def _lce_grad_kernel(xp, inputs, args):
    x, label, dy = inputs
    n = x.shape[0] if x.ndim > 1 else 1
    x2 = x.reshape(n, x.size // n if n else prod(x.shape[1:]))  # no -1: n may be 0
    rows, labels = xp.arange(n), label.reshape(n)
    dx = xp.zeros_like(x2)
    dx[rows, labels] = -dy.reshape(n) / xp.maximum(x2[rows, labels], x.dtype.type(LOG_THRESHOLD))
    return (dx.reshape(x.shape),)


register(OpDef("LabelCrossEntropyGradient", _lce_grad_infer, _lce_grad_kernel, cost=_flops(1),
               min_inputs=3, max_inputs=3, launches=7, doc="(X, label, dY) -> dX, nonzero at each row's label"))


# ---------------------------------------------------------------- SigmoidCrossEntropyWithLogits
def _sxe_grad_infer(inputs, args):
    dy, x, t = inputs
    if x.shape != t.shape or dy.shape != x.shape[:-1]:
        raise shape_error(args, "X and T must share a shape and dY be X without its last dim",
                          (0, "dY", dy), (1, "X", x), (2, "T", t))
    return [x]


def _sxe_grad_kernel(xp, inputs, args):
    dy, x, t = inputs
    if args.bool("unjoined_lr_loss", False):
        raise ArgumentError(f"op {args.op}: unjoined_lr_loss gradients are not supported")
    inner = x.shape[-1] if x.ndim else 1
    sig = 1 / (1 + xp.exp(-x))
    scale = (dy / x.dtype.type(inner))[..., None]
    if args.bool("log_D_trick", False):
        dx = -scale * (2 * t - 1) * (1 - sig)
    else:
        dx = scale * (sig - t)
    return (dx.astype(x.dtype, copy=False),)


register(OpDef("SigmoidCrossEntropyWithLogitsGradient", _sxe_grad_infer, _sxe_grad_kernel, cost=_flops(5, 1),
               min_inputs=3, max_inputs=3, launches=lambda inputs, args: 11 if args.bool("log_D_trick", False) else 7,
               doc="(dY, X, T) -> dX of the mean logistic loss"))


# ---------------------------------------------------------------- SquaredL2Distance, MakeTwoClass
def _l2_grad_infer(inputs, args):
    x, y, dd = inputs
    n = x.shape[0] if x.ndim else 1
    if x.shape != y.shape or dd.size != n:
        raise shape_error(args, f"X and Y must share a shape and dD hold {n} values",
                          (0, "X", x), (1, "Y", y), (2, "dD", dd))
    return [x, y]


def _l2_grad_kernel(xp, inputs, args):
    x, y, dd = inputs
    n = x.shape[0] if x.ndim else 1
    dx = ((x - y).reshape(n, prod(x.shape[1:])) * dd.reshape(n, 1)).reshape(x.shape).astype(x.dtype, copy=False)
    return dx, -dx


register(OpDef("SquaredL2DistanceGradient", _l2_grad_infer, _l2_grad_kernel, cost=_flops(3),
               min_inputs=3, max_inputs=3, launches=3, doc="(X, Y, dD) -> ((X - Y) dD, -(X - Y) dD) per row"))


def _two_class_grad_infer(inputs, args):
    dy = inputs[0]
    if dy.ndim < 1 or dy.shape[-1] != 2:
        raise shape_error(args, "dY must end in a dimension of 2", (0, "dY", dy))
    return [TensorType(dy.shape[:-1], dy.dtype)]


register(OpDef("MakeTwoClassGradient", _two_class_grad_infer,
               lambda xp, i, a: ((i[0][..., 1] - i[0][..., 0]),), cost=_flops(0.5),
               min_inputs=1, max_inputs=1, doc="dY (..., 2) -> dY[..., 1] - dY[..., 0]"))


# ---------------------------------------------------------------- SpatialSoftmaxWithLoss
def _spatial_swl_grad_infer(inputs, args):
    x, label, p = inputs[0], inputs[1], inputs[-2]
    if x.ndim != 4 or label.shape != (x.shape[0],) + x.shape[2:] or p.shape != x.shape:
        raise shape_error(args, "needs NCHW X and P and (N, H, W) labels", (0, "X", x), (1, "label", label),
                          (len(inputs) - 2, "P", p))
    return [x]


def _spatial_swl_grad_kernel(xp, inputs, args):
    """dX = (P - onehot(label)) * w * dL / sum(w over labelled pixels); 0 where label = -1."""
    x, label, p, dl = inputs[0], inputs[1], inputs[-2], inputs[-1]
    valid = label != -1
    w = valid.astype(x.dtype)
    if len(inputs) == 5:
        w = w * inputs[2].reshape(label.shape).astype(x.dtype)
    onehot = (xp.arange(x.shape[1]).reshape(1, -1, 1, 1) == label[:, None]).astype(x.dtype)
    total = w.sum()
    factor = dl.reshape(()).astype(x.dtype) / xp.where(total != 0, total, 1)
    return (((p - onehot) * (w * factor)[:, None]).astype(x.dtype, copy=False),)


register(OpDef("SpatialSoftmaxWithLossGradient", _spatial_swl_grad_infer, _spatial_swl_grad_kernel,
               cost=_flops(3), min_inputs=4, max_inputs=5, launches=lambda inputs, args: 13 + 2 * (len(inputs) == 5),
               doc="(X, label[, weight], P, dL) -> dX, per pixel"))
