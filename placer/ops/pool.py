"""Op family 'pool': MaxPool and AveragePool with Caffe2's semantics.

Arguments are Caffe2's ConvPoolOpBase family (see ``spatial_args``), plus ``global_pooling``
and, for AveragePool, ``count_include_pad`` (Caffe2 default 0):

- MaxPool takes the maximum over the window positions that fall inside the image; padding
  never wins (Caffe and Caffe2 agree).
- AveragePool with count_include_pad=0 divides by the number of window positions inside
  the image (Caffe2's default). With count_include_pad=1 it divides by kH*kW, as Caffe2's
  CPU and CUDA kernels do.
- legacy_pad=3 (CAFFE_LEGACY_POOLING) gives Caffe's ceil-mode output size; the extra
  row/column gets a tail pad of pad + stride, as in Caffe2. Max pooling then equals Caffe
  exactly. Caffe's own average pooling divides by the window clipped to H + pad (so it
  differs from both Caffe2 modes on the extra row/column whenever pad > 0); what placer
  runs is Caffe2's rule, which is what a converted net runs in Caffe2.

Cost: flops = output elements x window size; bytes read = X, bytes written = Y.
The kernels loop over the window taps (not over pixels or channels), separably: kW strided
slices along W, then kH along H, each one vectorised max/add over the whole batch.
"""
from __future__ import annotations

import numpy as np

from placer.ops.registry import OpDef, register
from placer.ops.spatial_args import Window, parse_window, shape_of
from placer.types import Args, OpFeatures, TensorType


def _geometry(x: TensorType, args: Args):
    win = parse_window(args, pooling=True)
    n, c, h, w = win.image_dims(x, args.op)
    kernel = win.kernel_for(h, w)
    if win.global_pooling:
        return win, (n, c, h, w), kernel, (1, 1), (0, 0, 0, 0)
    out, pads = win.resolve(h, w, args.op)
    return win, (n, c, h, w), kernel, out, pads


def pool_infer(inputs, args: Args):
    win, (n, c, _, _), _, out, _ = _geometry(inputs[0], args)
    shape = (n, c, *out) if win.nchw else (n, *out, c)
    return [TensorType(shape, inputs[0].dtype)]


def pool_cost(inputs, outputs, args: Args) -> OpFeatures:
    """One comparison or add per window position of every output element."""
    _, _, kernel, _, _ = _geometry(inputs[0], args)
    return OpFeatures(flops=float(outputs[0].size * kernel[0] * kernel[1]),
                      bytes_read=float(inputs[0].nbytes), bytes_written=float(outputs[0].nbytes))


def _reduce_windows(xp, x, win: Window, hw, kernel, out, pads, fill, combine):
    """Pads X with ``fill`` and folds every window with ``combine`` (max or add), separably.

    Max and sum are separable: first over the kW taps along W (kW strided slices), then over
    the kH taps along H, so a kH x kW window costs kH + kW passes instead of kH * kW.
    """
    (h, w), (ho, wo), (sh, sw), (dh, dw) = hw, out, win.stride, win.dilation
    need_h, need_w = (ho - 1) * sh + dh * (kernel[0] - 1) + 1, (wo - 1) * sw + dw * (kernel[1] - 1) + 1
    spatial = ((pads[0], max(need_h - h - pads[0], 0)), (pads[1], max(need_w - w - pads[1], 0)))
    if any(p for pair in spatial for p in pair):
        widths = ((0, 0), (0, 0), *spatial) if win.nchw else ((0, 0), *spatial, (0, 0))
        x = xp.pad(x, widths, constant_values=fill)
    h_axis = 2 if win.nchw else 1

    def fold(a, axis, k, step, dil, n_out):
        def tap(i):
            index = [slice(None)] * a.ndim
            index[axis] = slice(i * dil, i * dil + (n_out - 1) * step + 1, step)
            return a[tuple(index)]
        acc = xp.array(tap(0), copy=True)
        for i in range(1, k):
            combine(acc, tap(i), out=acc)
        return acc

    cols = fold(x, h_axis + 1, kernel[1], sw, dw, wo)
    return fold(cols, h_axis, kernel[0], sh, dh, ho)


def max_pool_kernel(xp, inputs, args: Args):
    x = inputs[0]
    win, (_, _, h, w), kernel, out, pads = _geometry(shape_of(x), args)
    axes = (2, 3) if win.nchw else (1, 2)
    if win.global_pooling:
        return (x.max(axis=axes, keepdims=True),)
    return (_reduce_windows(xp, x, win, (h, w), kernel, out, pads, float("-inf"), xp.maximum),)


def _valid_counts(size, k, s, d, pad, n_out) -> np.ndarray:
    """How many of each output's window positions fall inside [0, size) along one axis
    (from shapes only: computed on the host)."""
    pos = np.arange(n_out)[:, None] * s - pad + np.arange(k)[None, :] * d
    return ((pos >= 0) & (pos < size)).sum(axis=1)


def average_pool_kernel(xp, inputs, args: Args):
    x = inputs[0]
    win, (_, _, h, w), kernel, out, pads = _geometry(shape_of(x), args)
    axes = (2, 3) if win.nchw else (1, 2)
    if win.global_pooling:
        return (x.mean(axis=axes, keepdims=True, dtype=x.dtype),)
    y = _reduce_windows(xp, x, win, (h, w), kernel, out, pads, 0, xp.add)
    if args.bool("count_include_pad", False):
        y *= x.dtype.type(1.0 / (kernel[0] * kernel[1]))
        return (y,)
    rows = _valid_counts(h, kernel[0], win.stride[0], win.dilation[0], pads[0], out[0])
    cols = _valid_counts(w, kernel[1], win.stride[1], win.dilation[1], pads[1], out[1])
    count = xp.asarray((rows[:, None] * cols[None, :]).astype(x.dtype))   # one copy to the device
    y /= count if win.nchw else count[:, :, None]
    return (y,)


def pool_launches(extra: int):
    """A global pool is one reduction; a windowed one pads, copies the first tap along W
    and along H, and folds each further tap in (kH + kW passes), plus ``extra``."""
    def launches(inputs, args: Args) -> int:
        win, _, kernel, _, _ = _geometry(inputs[0], args)
        return 1 if win.global_pooling else kernel[0] + kernel[1] + 1 + extra
    return launches


register(OpDef(type="MaxPool", infer=pool_infer, kernel=max_pool_kernel, cost=pool_cost,
               min_inputs=1, max_inputs=1, launches=pool_launches(0),
               doc="2-D max pooling (Caffe2 arguments, global_pooling, legacy_pad incl. Caffe ceil mode)"))
register(OpDef(type="AveragePool", infer=pool_infer, kernel=average_pool_kernel, cost=pool_cost,
               min_inputs=1, max_inputs=1, launches=pool_launches(2),   # the window counts, a divide
               doc="2-D average pooling; count_include_pad (default 0) as in Caffe2"))
