"""Gradient ops of the spatial family: Conv, pools, SpatialBN, LRN and Dropout.

What torch 1.8.1's ``AddGradientOperators`` writes for each forward op:
- Conv(X, W[, b]) -> ConvGradient(X, W, dY) -> (dW[, db][, dX]); ``no_bias=1`` when the
  forward had no bias, ``no_gradient_to_input=1`` drops dX. Same arguments as Conv.
- MaxPool / AveragePool(X) -> MaxPoolGradient / AveragePoolGradient(X, Y, dY) -> dX.
- SpatialBN (training: Y, running mean and var in place, saved_mean, saved_inv_std) ->
  SpatialBNGradient(X, scale, dY, saved_mean, saved_inv_std) -> (dX, dscale, dbias), the
  batch-statistics gradient. Caffe2's kernel ignores ``is_test``: for an is_test=1 forward
  the maker passes the running mean and var in those slots and the kernel still reads
  them as mean and inverse std; placer does the same, so results match Caffe2's.
- LRN(X) -> (Y, scale) -> LRNGradient(X, Y, dY) -> dX (the scale is recomputed from X).
- Dropout(X) -> (Y, mask) -> DropoutGrad(dY, mask) -> dX = dY * mask / (1 - ratio);
  with is_test=1 DropoutGrad(dY) -> dX = dY.

Kernels (NCHW; NHWC inputs are transposed to NCHW and back): the only Python loops are
over the kH x kW window taps. Conv: per tap, one GEMM per image and group for dW (dY x the
tap's strided input slice, summed over images) and one for dX (the tap's filter slice x
dY, added into the padded input gradient), dY used in place as (N, G, M/G, Ho*Wo). On a GPU with cuDNN, dW and dX come from cuDNN's
backward filter and data convolutions instead (``cudnn_conv.gradient``; this path is the
fallback, e.g. for asymmetric pads).
Pools: per tap, the strided slice of the padded input gradient receives dY where the
input equals the max (every tied position, as Caffe2's CPU kernel) or dY / window count;
a global pool's gradient is one broadcast pass, no taps. Window geometry (pads,
legacy_pad, global_pooling) comes from ``spatial_args`` exactly as the forward kernels
use it.

Costs: ConvGradient = 2x the forward MACs (dW and dX; 1x without dX) plus one add per
dY element for db; pools one flop per window position of every output (max: a compare
and an add); SpatialBN ~8 flops per element; LRN size + 8; DropoutGrad 2 (a copy with
is_test). All have CUDA kernels in Caffe2. GPU launches (``launches``) are counted on the
strict cupy stand-in (tests/cupy_standin.py); Conv's and the pools' grow with the taps.
"""
from __future__ import annotations

import numpy as np

from placer.errors import ShapeError
from placer.ops import cudnn_conv
from placer.ops.conv import conv_kernel, conv_launches
from placer.ops.registry import OpDef, io_bytes, register
from placer.ops.spatial_args import parse_window, shape_of
from placer.types import Args, OpFeatures, TensorType, shape_str


def _to_nchw(x, nchw: bool):
    return x if nchw else x.transpose(0, 3, 1, 2)


def _from_nchw(xp, x, nchw: bool):
    return xp.ascontiguousarray(x if nchw else x.transpose(0, 2, 3, 1))


def _tap(i: int, j: int, out, stride, dilation):
    """The strided slice of a padded NCHW image that window tap (i, j) reads."""
    (ho, wo), (sh, sw), (dh, dw) = out, stride, dilation
    return (slice(None), slice(None), slice(i * dh, i * dh + (ho - 1) * sh + 1, sh),
            slice(j * dw, j * dw + (wo - 1) * sw + 1, sw))


def _padded_size(size: int, head: int, tail: int, k: int, out: int, s: int, d: int) -> tuple[int, int]:
    """(head pad, tail pad) so that every tap's slice lies inside the padded image."""
    need = (out - 1) * s + d * (k - 1) + 1
    return head, max(tail, need - size - head, 0)


# ---------------------------------------------------------------- Conv
def _conv_geometry(x: TensorType, w: TensorType, args: Args):
    order_nchw = args.str("order", "NCHW").upper() != "NHWC"
    kernel = ((w.shape[2], w.shape[3]) if order_nchw else (w.shape[1], w.shape[2])) if w.ndim == 4 else None
    win = parse_window(args, kernel_from=kernel)
    n, c, h, wd = win.image_dims(x, args.op)
    group = args.int("group", 1)
    m = w.shape[0]
    cg = w.shape[1] if win.nchw else w.shape[3]
    if w.ndim != 4 or group < 1 or c % group or m % group or cg * group != c:
        raise ShapeError(f"op {args.op}: filter {shape_str([w])} does not fit X {shape_str([x])} "
                         f"with group={group} ({win.order})")
    out, pads = win.resolve(h, wd, args.op)
    return win, (n, c, h, wd), m, out, pads, group


def _conv_outputs(args: Args) -> tuple[bool, bool]:
    """(has db, has dX)."""
    return not args.bool("no_bias", False), not args.bool("no_gradient_to_input", False)


def _conv_grad_infer(inputs, args):
    x, w, dy = inputs
    win, (n, _, _, _), m, out, _, _ = _conv_geometry(x, w, args)
    want = (n, m, *out) if win.nchw else (n, *out, m)
    if dy.shape != want:
        raise ShapeError(f"op {args.op}: dY {shape_str([dy])} should have the forward output's shape "
                         f"{want} (X {shape_str([x])}, W {shape_str([w])})")
    has_db, has_dx = _conv_outputs(args)
    return [w] + ([TensorType((m,), dy.dtype)] if has_db else []) + ([x] if has_dx else [])


def _conv_grad_cost(inputs, outputs, args) -> OpFeatures:
    x, w, dy = inputs
    _, (_, c, _, _), m, (ho, wo), _, group = _conv_geometry(x, w, args)
    kk = (w.shape[2] * w.shape[3]) if args.str("order", "NCHW").upper() != "NHWC" else w.shape[1] * w.shape[2]
    forward_macs = float(x.shape[0] * m * ho * wo * (c // group) * kk)
    has_db, has_dx = _conv_outputs(args)
    macs = forward_macs * (2 if has_dx else 1)
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=2 * macs + (dy.size if has_db else 0), macs=macs, bytes_read=read, bytes_written=written)


def _conv_grad_kernel(xp, inputs, args):
    if all(a.dtype == xp.float16 for a in inputs):
        # float16 gradients are accumulated in float32 and rounded once, as cuDNN's half
        # convolutions compute in float (CUDNN_DATA_FLOAT) for Caffe2's float16 ConvGradient
        outs = _conv_grad_kernel(xp, [a.astype(xp.float32) for a in inputs], args)
        return tuple(o.astype(xp.float16) for o in outs)
    x, w, dy = inputs
    win, _, _, _, pads, group = _conv_geometry(shape_of(x), shape_of(w), args)
    has_db, has_dx = _conv_outputs(args)
    grads = cudnn_conv.gradient(xp, args.op, x, w, dy, win, pads, group, has_dx)
    if grads is None:
        return conv_grad_matmul(xp, x, w, dy, args)
    dw, dx = grads
    db = [dy.sum(axis=(0, 2, 3) if win.nchw else (0, 1, 2), dtype=dy.dtype)] if has_db else []
    return (dw, *db, *([dx] if has_dx else []))


def conv_grad_matmul(xp, x, w, dy, args):
    """ConvGradient as the per-tap GEMMs of the module docstring (dW[, db][, dX])."""
    win, (n, c, h, wd), m, out, pads, group = _conv_geometry(shape_of(x), shape_of(w), args)
    x4, dy4 = _to_nchw(x, win.nchw), _to_nchw(dy, win.nchw)
    w4 = w if win.nchw else w.transpose(0, 3, 1, 2)               # (M, Cg, kh, kw)
    (kh, kw), cg, mg = win.kernel, c // group, m // group
    length = out[0] * out[1]
    top, bottom = _padded_size(h, pads[0], pads[2], kh, out[0], win.stride[0], win.dilation[0])
    left, right = _padded_size(wd, pads[1], pads[3], kw, out[1], win.stride[1], win.dilation[1])
    xpad = xp.pad(x4, ((0, 0), (0, 0), (top, bottom), (left, right)))
    dy_g = dy4.reshape(n, group, mg, length)                     # a view: no copy of dY
    has_db, has_dx = _conv_outputs(args)
    dw = xp.empty((m, cg, kh, kw), dtype=dy.dtype)
    dxpad = xp.zeros(xpad.shape, dtype=dy.dtype) if has_dx else None
    for i in range(kh):
        for j in range(kw):
            where = _tap(i, j, out, win.stride, win.dilation)
            cols = xpad[where].reshape(n, group, cg, length)         # the tap's input, (N, G, Cg, L)
            dw[:, :, i, j] = xp.matmul(dy_g, cols.transpose(0, 1, 3, 2)).sum(axis=0).reshape(m, cg)
            if has_dx:
                w_tap = w4[:, :, i, j].reshape(group, mg, cg).transpose(0, 2, 1)   # (G, Cg, Mg)
                dxpad[where] += xp.matmul(w_tap, dy_g).reshape(n, c, *out)
    outs = [dw if win.nchw else xp.ascontiguousarray(dw.transpose(0, 2, 3, 1))]
    if has_db:
        outs.append(dy4.sum(axis=(0, 2, 3), dtype=dy.dtype))
    if has_dx:
        outs.append(_from_nchw(xp, dxpad[:, :, top:top + h, left:left + wd], win.nchw))
    return tuple(outs)


def _conv_grad_launches(inputs, args) -> int:
    """Per window tap: a copy of the tap's input (none where the tap is a view: a 1-wide,
    stride-1 column over the whole padded width), the dW GEMM, its sum over images and its
    store, and with dX the tap's GEMM and its add. Around them: the pad, the zeroed dX, the
    db sum, the crop of dX (a copy when there is padding or an NHWC transpose) and NHWC's
    dW transpose (a copy for filters larger than 1x1)."""
    x, w, _ = inputs
    win, (_, _, h, wd), _, out, pads, _ = _conv_geometry(x, w, args)
    (kh, kw), (sh, sw) = win.kernel, win.stride
    top, bottom = _padded_size(h, pads[0], pads[2], kh, out[0], sh, win.dilation[0])
    left, right = _padded_size(wd, pads[1], pads[3], kw, out[1], sw, win.dilation[1])
    padded = any((top, bottom, left, right))
    tap_is_view = kw == 1 and sw == 1 and out[1] == wd + left + right and (sh == 1 or out[0] == 1)
    has_db, has_dx = _conv_outputs(args)
    per_tap = (not tap_is_view) + 3 + 2 * has_dx
    dw_transposed = not win.nchw and kh * kw > 1            # a 1x1 filter's transpose is a view
    around = 1 + has_db + dw_transposed + has_dx * (1 + (padded or not win.nchw))
    return kh * kw * per_tap + around


register(OpDef("ConvGradient", _conv_grad_infer, _conv_grad_kernel, cost=_conv_grad_cost,
               min_inputs=3, max_inputs=3, launches=_conv_grad_launches,
               doc="(X, W, dY) -> (dW[, db][, dX]); no_bias / no_gradient_to_input drop db / dX"))


# ---------------------------------------------------------------- pools
def _pool_geometry(x: TensorType, args: Args):
    win = parse_window(args, pooling=True)
    n, c, h, w = win.image_dims(x, args.op)
    kernel = win.kernel_for(h, w)
    if win.global_pooling:
        return win, (n, c, h, w), kernel, (1, 1), (0, 0, 0, 0)
    out, pads = win.resolve(h, w, args.op)
    return win, (n, c, h, w), kernel, out, pads


def _pool_grad_infer(inputs, args):
    x, y, dy = inputs
    win, (n, c, _, _), _, out, _ = _pool_geometry(x, args)
    want = (n, c, *out) if win.nchw else (n, *out, c)
    if y.shape != want or dy.shape != want:
        raise ShapeError(f"op {args.op}: Y and dY {shape_str([y, dy])} should have the pooled shape {want} "
                         f"of X {shape_str([x])}")
    return [x]


def _pool_grad_cost(inputs, outputs, args) -> OpFeatures:
    _, _, kernel, _, _ = _pool_geometry(inputs[0], args)
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(2 * inputs[2].size * kernel[0] * kernel[1]), bytes_read=read,
                      bytes_written=written)


def _scatter_taps(xp, x, win, hw, kernel, out, pads, contribution):
    """Sum over window taps of ``contribution(tap slice of padded X)`` into the padded
    input gradient, then cropped to X: the transpose of the forward's window gather."""
    (h, w), (kh, kw) = hw, kernel
    top, bottom = _padded_size(h, pads[0], pads[2], kh, out[0], win.stride[0], win.dilation[0])
    left, right = _padded_size(w, pads[1], pads[3], kw, out[1], win.stride[1], win.dilation[1])
    xpad = xp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=float("-inf")) \
        if contribution.needs_input else None
    grad = xp.zeros((x.shape[0], x.shape[1], h + top + bottom, w + left + right), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            where = _tap(i, j, out, win.stride, win.dilation)
            grad[where] += contribution(None if xpad is None else xpad[where])
    return grad[:, :, top:top + h, left:left + w]


class _MaxShare:
    """dY goes to every input position equal to the window's maximum."""
    needs_input = True

    def __init__(self, y, dy):
        self.y, self.dy = y, dy

    def __call__(self, tap):
        return self.dy * (tap == self.y)


class _AverageShare:
    """dY / (the output's window count) goes to every position of the window."""
    needs_input = False

    def __init__(self, share):
        self.share = share

    def __call__(self, tap):
        return self.share


def _pool_grad_kernel(average: bool):
    def kernel(xp, inputs, args):
        x, y, dy = inputs
        win, (_, _, h, w), kern, out, pads = _pool_geometry(shape_of(x), args)
        if win.global_pooling:                  # one window: no taps, either layout broadcasts
            dx = _global_pool_grad(xp, x, y, dy, average, x.dtype.type(h * w))
            return (dx.astype(dy.dtype, copy=False),)
        x4, y4, dy4 = (_to_nchw(a, win.nchw) for a in (x, y, dy))
        if average:
            if args.bool("count_include_pad", False):
                count = x.dtype.type(kern[0] * kern[1])
            else:
                count = xp.asarray(_window_counts(win, (h, w), kern, out, pads).astype(x.dtype))
            dx = _scatter_taps(xp, x4, win, (h, w), kern, out, pads, _AverageShare(dy4 / count))
        else:
            dx = _scatter_taps(xp, x4, win, (h, w), kern, out, pads, _MaxShare(y4, dy4))
        return (_from_nchw(xp, dx, win.nchw).astype(dy.dtype, copy=False),)
    return kernel


def _global_pool_grad(xp, x, y, dy, average: bool, count):
    """Max: dY to every position equal to its image's maximum; average: dY / (H*W) everywhere
    (Y and dY hold one value per image and channel, in X's layout)."""
    if not average:
        return dy * (x == y)
    dx = xp.zeros(x.shape, dtype=x.dtype)
    dx += dy / count
    return dx


def _window_counts(win, hw, kernel, out, pads) -> np.ndarray:
    """(Ho, Wo) counts of each output's window positions inside the image (host numpy, from
    shapes only: one copy to the device instead of a dozen tiny kernels)."""
    def along(size, k, s, d, pad, n_out):
        pos = np.arange(n_out)[:, None] * s - pad + np.arange(k)[None, :] * d
        return ((pos >= 0) & (pos < size)).sum(axis=1)
    rows = along(hw[0], kernel[0], win.stride[0], win.dilation[0], pads[0], out[0])
    cols = along(hw[1], kernel[1], win.stride[1], win.dilation[1], pads[1], out[1])
    return rows[:, None] * cols[None, :]


def _pool_grad_launches(average: bool):
    """Global: the mask and its product (max) or the zeroed dX, the divide and its add
    (average), in X's layout. Windowed max: the padded X, the zeroed dX, per tap a compare,
    a product and an add; average: the zeroed dX, the window counts' copy (none with
    count_include_pad), the divide, an add per tap. Then the crop or NHWC transpose of dX,
    a copy unless it is a view."""
    def launches(inputs, args) -> int:
        win, (_, _, h, w), kernel, out, pads = _pool_geometry(inputs[0], args)
        back = not win.nchw
        if win.global_pooling:
            return 3 if average else 2
        top, bottom = _padded_size(h, pads[0], pads[2], kernel[0], out[0], win.stride[0], win.dilation[0])
        left, right = _padded_size(w, pads[1], pads[3], kernel[1], out[1], win.stride[1], win.dilation[1])
        cropped = any((top, bottom, left, right)) or back
        taps = kernel[0] * kernel[1]
        if average:
            return 2 + (not args.bool("count_include_pad", False)) + taps + cropped
        return 2 + 3 * taps + cropped
    return launches


register(OpDef("MaxPoolGradient", _pool_grad_infer, _pool_grad_kernel(False), cost=_pool_grad_cost,
               min_inputs=3, max_inputs=3, launches=_pool_grad_launches(False),
               doc="(X, Y, dY) -> dX: dY to every position equal to its window max"))
register(OpDef("AveragePoolGradient", _pool_grad_infer, _pool_grad_kernel(True), cost=_pool_grad_cost,
               min_inputs=3, max_inputs=3, launches=_pool_grad_launches(True),
               doc="(X, Y, dY) -> dX: dY / window count to every window position"))


# ---------------------------------------------------------------- SpatialBN
def _channel_axis(x: TensorType, args: Args) -> int:
    return 1 if args.str("order", "NCHW").upper() == "NCHW" else x.ndim - 1


def _bn_grad_infer(inputs, args):
    x, scale, dy = inputs[:3]
    c = x.shape[_channel_axis(x, args)]
    if dy.shape != x.shape:
        raise ShapeError(f"op {args.op}: dY {shape_str([dy])} should have X's shape {shape_str([x])}")
    for i, t in enumerate(inputs[1:5], 1):
        if i != 2 and t.shape != (c,):
            raise ShapeError(f"op {args.op}: input {i} {shape_str([t])} should have shape ({c},)")
    stat = TensorType((c,), dy.dtype)
    return [x, stat, stat]


def _bn_grad_kernel(xp, inputs, args):
    x, scale, dy, mean, inv_std = inputs[:5]
    axis = _channel_axis(shape_of(x), args)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    reduce = tuple(a for a in range(x.ndim) if a != axis)
    count = x.dtype.type(x.size // x.shape[axis])
    xhat = (x - mean.reshape(shape)) * inv_std.reshape(shape)
    dbias = dy.sum(axis=reduce, dtype=dy.dtype)
    dscale = (dy * xhat).sum(axis=reduce, dtype=dy.dtype)
    dx = (dy - (xhat * dscale.reshape(shape) + dbias.reshape(shape)) / count) * (scale * inv_std).reshape(shape)
    return dx.astype(dy.dtype, copy=False), dscale, dbias


register(OpDef("SpatialBNGradient", _bn_grad_infer, _bn_grad_kernel,
               cost=lambda i, o, a: OpFeatures(flops=8.0 * i[0].size, bytes_read=float(sum(t.nbytes for t in i)),
                                               bytes_written=float(sum(t.nbytes for t in o))),
               min_inputs=5, max_inputs=5, launches=11,
               doc="(X, scale, dY, saved_mean, saved_inv_std) -> (dX, dscale, dbias)"))


# ---------------------------------------------------------------- LRN
def _window_sum(xp, a, axis: int, before: int, after: int):
    """Sum over the channel window [c - before, c + after] (zero outside)."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (before, after)
    padded = xp.pad(a, widths)
    c = a.shape[axis]
    index = [slice(None)] * a.ndim
    index[axis] = slice(0, c)
    acc = xp.array(padded[tuple(index)], copy=True)
    for k in range(1, before + after + 1):
        index[axis] = slice(k, k + c)
        acc += padded[tuple(index)]
    return acc


def _lrn_grad_kernel(xp, inputs, args):
    x, y, dy = inputs
    size, alpha, beta = args.int("size"), args.float("alpha"), args.float("beta")
    bias = x.dtype.type(args.float("bias", 1.0))
    axis = 1 if args.str("order", "NCHW").upper() == "NCHW" else x.ndim - 1
    pre = (size - 1) // 2
    scale = _window_sum(xp, x * x, axis, pre, size - 1 - pre) * x.dtype.type(alpha / size) + bias
    ratio = dy * y / scale
    back = _window_sum(xp, ratio, axis, size - 1 - pre, pre)   # the forward window, transposed
    dx = dy * xp.power(scale, x.dtype.type(-beta)) - x.dtype.type(2 * alpha * beta / size) * x * back
    return (dx.astype(dy.dtype, copy=False),)


register(OpDef("LRNGradient", lambda i, a: [i[0]], _lrn_grad_kernel,
               cost=lambda i, o, a: OpFeatures(flops=float((a.int("size") + 8) * i[0].size),
                                               bytes_read=float(sum(t.nbytes for t in i)),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=3, max_inputs=3, doc="(X, Y, dY) -> dX of cross-channel LRN",
               launches=lambda inputs, args: 2 * (args.int("size") + 1) + 10))   # two window sums


# ---------------------------------------------------------------- Dropout
def _dropout_grad_kernel(xp, inputs, args):
    dy = inputs[0]
    if args.bool("is_test", False) or len(inputs) == 1:
        return (dy.copy(),)
    ratio = args.float("ratio", 0.5)
    scale = dy.dtype.type(0.0 if ratio >= 1.0 else 1.0 / (1.0 - ratio))
    return ((dy * inputs[1]) * scale,)


def _dropout_grad_infer(inputs, args):
    if len(inputs) == 2 and inputs[1].shape != inputs[0].shape:
        raise ShapeError(f"op {args.op}: the mask {shape_str(inputs[1:])} should have dY's shape "
                         f"{shape_str(inputs[:1])}")
    return [inputs[0]]


register(OpDef("DropoutGrad", _dropout_grad_infer, _dropout_grad_kernel,
               cost=lambda i, o, a: OpFeatures(flops=2.0 * i[0].size if len(i) > 1 else 0.0,
                                               bytes_read=float(sum(t.nbytes for t in i)),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=1, max_inputs=2, doc="(dY[, mask]) -> dY * mask / (1 - ratio); dY with is_test=1",
               launches=lambda inputs, args: 1 if args.bool("is_test", False) or len(inputs) == 1 else 2))


# ---------------------------------------------------------------- PadImage
def _matrix_adjoint_launches(inputs, args) -> int:
    """The two source matrices' copies to the device, two GEMMs, NHWC's transposes."""
    return 4 + (args.str("order", "NCHW").upper() == "NHWC")


def _pad_window(args: Args):
    win = parse_window(args.with_values(kernel=1) if "kernel" not in args else args)
    mode = args.str("mode", "constant").lower()
    if mode not in ("constant", "reflect", "edge"):
        raise ShapeError(f"op {args.op}: PadImage mode should be constant, reflect or edge, found {mode!r}")
    return win, mode


def _pad_grad_infer(inputs, args):
    win, _ = _pad_window(args)
    n, c, h, w = win.image_dims(inputs[0], args.op, "dY")
    t, l, b, r = win.pads
    if h <= t + b or w <= l + r:
        raise ShapeError(f"op {args.op}: dY {shape_str(inputs)} is not larger than the pads {list(win.pads)}")
    shape = (n, c, h - t - b, w - l - r) if win.nchw else (n, h - t - b, w - l - r, c)
    return [TensorType(shape, inputs[0].dtype)]


def _source_matrix(size: int, head: int, tail: int, mode: str, dtype):
    """(size + head + tail, size) 0/1 matrix: padded position j reads input position i."""
    src = np.pad(np.arange(size), (head, tail), mode="constant", constant_values=-1) if mode == "constant" \
        else np.pad(np.arange(size), (head, tail), mode=mode)
    return (src[:, None] == np.arange(size)[None, :]).astype(dtype)


def _pad_grad_kernel(xp, inputs, args):
    """The adjoint of the padding: dX = S_h^T dY S_w with the source matrices of each axis
    (a mirrored or repeated edge pixel sends its gradient back to the pixel it copied)."""
    dy = inputs[0]
    win, mode = _pad_window(args)
    t, l, b, r = win.pads
    d4 = _to_nchw(dy, win.nchw)
    h, w = d4.shape[2] - t - b, d4.shape[3] - l - r
    rows = xp.asarray(_source_matrix(h, t, b, mode, dy.dtype))
    cols = xp.asarray(_source_matrix(w, l, r, mode, dy.dtype))
    dx = xp.matmul(xp.matmul(rows.T, d4), cols)
    return (_from_nchw(xp, dx, win.nchw),)


register(OpDef("PadImageGradient", _pad_grad_infer, _pad_grad_kernel,
               cost=lambda i, o, a: OpFeatures(flops=float(i[0].size), bytes_read=float(i[0].nbytes),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=1, max_inputs=1, doc="dY -> dX of PadImage (constant, reflect or edge)",
               launches=_matrix_adjoint_launches))


# ---------------------------------------------------------------- ResizeNearest
def _resize_sources(size_in: int, size_out: int, scale: float):
    """(size_out, size_in) 0/1 matrix: output position y reads min(int(y / scale), size_in - 1)
    (float32 division, as Caffe2's kernel)."""
    src = np.minimum((np.arange(size_out, dtype=np.float32) / np.float32(scale)).astype(np.int64), size_in - 1)
    return src[:, None] == np.arange(size_in)[None, :]


def _resize_grad_infer(inputs, args):
    dy, x = inputs[0], inputs[1]
    if dy.ndim != 4 or x.ndim != 4:
        raise ShapeError(f"op {args.op}: ResizeNearestGradient needs 4-D dY and X, found {shape_str(inputs[:2])}")
    return [TensorType(x.shape, dy.dtype)]


def _resize_grad_kernel(xp, inputs, args):
    """dX = R_h^T dY R_w: each output pixel's gradient goes back to the pixel it copied."""
    dy, x = inputs[0], inputs[1]
    nchw = args.str("order", "NCHW").upper() == "NCHW"
    d4, x_shape = _to_nchw(dy, nchw), _to_nchw(x, nchw).shape
    hs, ws = args.float("height_scale", 1.0), args.float("width_scale", 1.0)
    if len(inputs) > 2:                       # scales given as a tensor [height, width]
        hs, ws = (float(v) for v in inputs[2].reshape(-1)[:2].tolist())
    rows = xp.asarray(_resize_sources(x_shape[2], d4.shape[2], hs).astype(dy.dtype))
    cols = xp.asarray(_resize_sources(x_shape[3], d4.shape[3], ws).astype(dy.dtype))
    return (_from_nchw(xp, xp.matmul(xp.matmul(rows.T, d4), cols), nchw),)


register(OpDef("ResizeNearestGradient", _resize_grad_infer, _resize_grad_kernel,
               cost=lambda i, o, a: OpFeatures(flops=float(i[0].size), bytes_read=float(i[0].nbytes),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=2, max_inputs=3, doc="(dY, X[, scales]) -> dX of ResizeNearest",
               launches=_matrix_adjoint_launches))


# ---------------------------------------------------------------- ConvTranspose
def _conv_args(args: Args) -> Args:
    """ConvTranspose's arguments for the Conv that is its adjoint (no adj, pads as given)."""
    values = {k: v for k, v in args.items() if k not in ("adj", "adjs", "adj_h", "adj_w")}
    return Args(values, op=args.op, seed=args.seed, n_outputs=args.n_outputs)


def _conv_transpose_grad_infer(inputs, args):
    x, w, dy = inputs
    has_db, has_dx = _conv_outputs(args)
    per_group = w.shape[1] if args.str("order", "NCHW").upper() != "NHWC" else w.shape[3]
    m = per_group * args.int("group", 1)                  # output channels of the forward op
    _conv_grad_infer([dy, w, x], _conv_args(args).with_values(no_bias=1, no_gradient_to_input=1))
    return [w] + ([TensorType((m,), dy.dtype)] if has_db else []) + ([x] if has_dx else [])


def _conv_transpose_grad_kernel(xp, inputs, args):
    """ConvTranspose is the adjoint of Conv with X and Y swapped, so its dW is Conv's dW for
    input dY and output gradient X, and its dX is Conv(dY, W)."""
    x, w, dy = inputs
    conv_args = _conv_args(args)
    (dw,) = _conv_grad_kernel(xp, [dy, w, x], conv_args.with_values(no_bias=1, no_gradient_to_input=1))
    has_db, has_dx = _conv_outputs(args)
    nchw = args.str("order", "NCHW").upper() != "NHWC"
    outs = [dw]
    if has_db:
        outs.append(dy.sum(axis=(0, 2, 3) if nchw else (0, 1, 2), dtype=dy.dtype))
    if has_dx:
        outs.append(conv_kernel(xp, [dy, w], conv_args)[0].astype(dy.dtype, copy=False))
    return tuple(outs)


def _conv_transpose_grad_cost(inputs, outputs, args) -> OpFeatures:
    x, w, dy = inputs
    adjoint = _conv_grad_cost([dy, w, x], outputs, _conv_args(args))
    return OpFeatures(flops=adjoint.flops, macs=adjoint.macs, bytes_read=adjoint.bytes_read,
                      bytes_written=adjoint.bytes_written)


def _conv_transpose_grad_launches(inputs, args) -> int:
    """Conv's dW launches for input dY and output gradient X, the db sum, Conv(dY, W)'s."""
    x, w, dy = inputs
    conv_args = _conv_args(args)
    has_db, has_dx = _conv_outputs(args)
    dw = _conv_grad_launches([dy, w, x], conv_args.with_values(no_bias=1, no_gradient_to_input=1))
    return dw + has_db + (conv_launches([dy, w], conv_args) if has_dx else 0)


register(OpDef("ConvTransposeGradient", _conv_transpose_grad_infer, _conv_transpose_grad_kernel,
               cost=_conv_transpose_grad_cost, min_inputs=3, max_inputs=3, launches=_conv_transpose_grad_launches,
               doc="(X, W, dY) -> (dW[, db][, dX]) of ConvTranspose"))
