"""Op family 'norm': SpatialBN, LRN and PadImage with Caffe2's semantics.

SpatialBN (inputs X, scale, bias, mean, var; ``order``, ``epsilon`` default 1e-5,
``momentum`` default 0.9, ``is_test`` default 0 as in Caffe2):
- is_test=1: Y = (X - mean) / sqrt(var + epsilon) * scale + bias; one output.
- is_test=0: normalises with the batch statistics (biased variance over N, H, W) and has
  five outputs, as Caffe2 requires: Y, running_mean = momentum * mean + (1 - momentum) *
  batch_mean, running_var = momentum * var + (1 - momentum) * unbiased batch variance,
  saved_mean = batch mean, saved_inv_std = 1 / sqrt(batch variance + epsilon).
Cost: 2 flops per element at inference (one multiply-add with folded per-channel
coefficients); 5 per element in training (mean, variance, normalise).

LRN (``size``, ``alpha``, ``beta``, ``bias`` default 1, ``order``): across channels,
scale = bias + alpha / size * sum of x^2 over the ``size`` channels starting (size-1)//2
before the current one, Y = X * scale^-beta. Caffe and Caffe2 both divide alpha by size;
so does PyTorch's local_response_norm (same alpha), which however starts an even-size
window size//2 channels before, one more than Caffe2.
Outputs: Y and the optional scale blob (AlexNet's ``_norm1_scale``); infer and the kernel
return both and the caller keeps as many as the op names.
Cost: size + 5 flops per element (square, window sum, scale affine, power, product).

PadImage (``pads``/``pad``/``pad_t``..; ``mode`` constant | reflect | edge; ``value``
default 0; ``order``): output H + pad_t + pad_b. reflect mirrors without repeating the
edge (numpy's "reflect"), edge repeats it.
"""
from __future__ import annotations

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, movement_cost, register
from placer.ops.spatial_args import parse_window, shape_of
from placer.types import Args, OpFeatures, TensorType, shape_str


def _order(args: Args) -> str:
    order = args.str("order", "NCHW").upper()
    if order not in ("NCHW", "NHWC"):
        raise ArgumentError(f"op {args.op}: order should be NCHW or NHWC, found {order!r}")
    return order


def _channel_axis(ndim: int, order: str) -> int:
    return 1 if order == "NCHW" else ndim - 1


# ---------------------------------------------------------------- SpatialBN

def spatial_bn_infer(inputs, args: Args):
    x = inputs[0]
    if x.ndim < 2:
        raise ShapeError(f"op {args.op}: SpatialBN input X must have >= 2 dims, found {shape_str([x])}")
    c = x.shape[_channel_axis(x.ndim, _order(args))]
    for name, t in zip(("scale", "bias", "mean", "var"), inputs[1:5]):
        if tuple(t.shape) != (c,):
            raise ShapeError(f"op {args.op}: SpatialBN {name} {shape_str([t])} should have shape "
                             f"({c},), the channels of X {shape_str([x])} ({_order(args)})")
    if args.bool("is_test", False):
        return [x]
    stat = TensorType((c,), x.dtype)
    return [x, stat, stat, stat, stat]


def spatial_bn_cost(inputs, outputs, args: Args) -> OpFeatures:
    per = 2.0 if args.bool("is_test", False) else 5.0
    return OpFeatures(flops=per * inputs[0].size,
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


def spatial_bn_kernel(xp, inputs, args: Args):
    x, scale, bias, mean, var = inputs[:5]
    order = _order(args)
    eps = args.float("epsilon", 1e-5)
    axis = _channel_axis(x.ndim, order)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if args.bool("is_test", False):
        inv = 1.0 / xp.sqrt(var + eps)
    else:
        reduce = tuple(a for a in range(x.ndim) if a != axis)
        batch_mean = x.mean(axis=reduce, dtype=x.dtype)
        batch_var = xp.square(x - batch_mean.reshape(shape)).mean(axis=reduce, dtype=x.dtype)
        count = x.size // x.shape[axis]
        inv = 1.0 / xp.sqrt(batch_var + eps)
        m = args.float("momentum", 0.9)
        unbiased = batch_var * (count / max(count - 1, 1))
        running_mean = m * mean + (1 - m) * batch_mean
        running_var = m * var + (1 - m) * unbiased
        mean = batch_mean
    a = (scale * inv).astype(x.dtype, copy=False)
    b = (bias - mean * a).astype(x.dtype, copy=False)
    y = x * a.reshape(shape)
    y += b.reshape(shape)
    if args.bool("is_test", False):
        return (y,)
    cast = (lambda v: v.astype(x.dtype, copy=False))
    return (y, cast(running_mean), cast(running_var), cast(batch_mean), cast(inv))


# ---------------------------------------------------------------- LRN

def lrn_infer(inputs, args: Args):
    x = inputs[0]
    if x.ndim != 4:
        raise ShapeError(f"op {args.op}: LRN input X must be 4-D, found {shape_str([x])}")
    size = args.int("size")
    if size < 1:
        raise ArgumentError(f"op {args.op}: LRN size should be >= 1, found {size}")
    _order(args)
    return [x, x]


def lrn_cost(inputs, outputs, args: Args) -> OpFeatures:
    x = inputs[0]
    return OpFeatures(flops=float((args.int("size") + 5) * x.size),
                      bytes_read=float(x.nbytes), bytes_written=float(sum(t.nbytes for t in outputs)))


def lrn_kernel(xp, inputs, args: Args):
    """Window sum over channels as ``size`` shifted adds of the padded squares."""
    x = inputs[0]
    size, alpha, beta = args.int("size"), args.float("alpha"), args.float("beta")
    bias = args.float("bias", 1.0)
    axis = _channel_axis(x.ndim, _order(args))
    c, pre = x.shape[axis], (size - 1) // 2
    widths = [(0, 0)] * x.ndim
    widths[axis] = (pre, size - 1 - pre)
    sq = xp.pad(xp.square(x), widths)
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, c)
    acc = xp.array(sq[tuple(index)], copy=True)
    for k in range(1, size):
        index[axis] = slice(k, k + c)
        acc += sq[tuple(index)]
    acc *= x.dtype.type(alpha / size)
    acc += x.dtype.type(bias)
    y = x * xp.power(acc, x.dtype.type(-beta))
    return (y, acc)


# ---------------------------------------------------------------- PadImage

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}


def _pad_geometry(x: TensorType, args: Args):
    win = parse_window(args.with_values(kernel=1) if "kernel" not in args else args)
    n, c, h, w = win.image_dims(x, args.op)
    mode = args.str("mode", "constant").lower()
    if mode not in _PAD_MODES:
        raise ArgumentError(f"op {args.op}: PadImage mode should be constant, reflect or edge, "
                            f"found {mode!r}")
    t, l, b, r = win.pads
    if mode == "reflect" and (max(t, b) >= h or max(l, r) >= w):
        raise ShapeError(f"op {args.op}: reflect padding {list(win.pads)} needs pads smaller than "
                         f"the image {h}x{w} of X {shape_str([x])}")
    return win, (n, c, h + t + b, w + l + r), mode


def pad_image_infer(inputs, args: Args):
    win, (n, c, h, w), _ = _pad_geometry(inputs[0], args)
    return [TensorType((n, c, h, w) if win.nchw else (n, h, w, c), inputs[0].dtype)]


def pad_image_kernel(xp, inputs, args: Args):
    x = inputs[0]
    win, _, mode = _pad_geometry(shape_of(x), args)
    t, l, b, r = win.pads
    widths = ((0, 0), (0, 0), (t, b), (l, r)) if win.nchw else ((0, 0), (t, b), (l, r), (0, 0))
    if mode == "constant":
        return (xp.pad(x, widths, constant_values=x.dtype.type(args.float("value", 0.0))),)
    return (xp.pad(x, widths, mode=_PAD_MODES[mode]),)


register(OpDef(type="SpatialBN", infer=spatial_bn_infer, kernel=spatial_bn_kernel,
               launches=lambda inputs, args: 8 if args.bool("is_test", False) else 19,
               cost=spatial_bn_cost, min_inputs=5, max_inputs=5,
               doc="batch normalisation over channels; is_test=1 inference, is_test=0 batch statistics"))
register(OpDef(type="LRN", infer=lrn_infer, kernel=lrn_kernel, cost=lrn_cost,
               launches=lambda inputs, args: 6 + args.int("size"),   # one add per window tap
               min_inputs=1, max_inputs=1,
               doc="local response normalisation across channels; outputs Y and the scale"))
register(OpDef(type="PadImage", infer=pad_image_infer, kernel=pad_image_kernel,
               cost=movement_cost, min_inputs=1, max_inputs=1,
               doc="pads H and W: mode constant (value), reflect or edge"))
