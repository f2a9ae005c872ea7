"""Op family 'int8_tensor': Caffe2's quantized (Int8) elementwise, pooling and data-movement ops.

Semantics, rounding and saturation are torch 1.8.1's Caffe2 CPU operators
(caffe2/operators/quantized/int8_*_op.h), most of which call QNNPACK (third_party/QNNPACK,
``qnnp_*``; the x86 SSE2 micro-kernels). Every blob is an ``Int8Tensor`` (placer.ops.int8_base):
uint8 data, one scale and one zero point, NHWC where the op is spatial.

- ``Int8Add`` / ``Int8Sum`` (exactly two inputs of one shape), ``Int8AddRelu`` / ``Int8SumRelu``:
  ``qnnp_create_add_nc_q8`` with the output's ``Y_scale`` / ``Y_zero_point``. The ratios
  a = X0.scale / Y_scale and b = X1.scale / Y_scale (float32, each in [2^-14, 2^8)) become
  integer multipliers ``lrintf(r * 2^shift)`` with shift = 21 - exponent(max(a, b)); the sum
  ``ma * (x0 - z0) + mb * (x1 - z1)`` is shifted right by ``shift``, rounding half away from
  zero, plus Y_zero_point, clamped to [0, 255] ([Y_zero_point, 255] for Relu). Below a
  larger ratio of 2^-10 the shift passes 31, which QNNPACK asserts against and its release
  build computes with undefined shifts: placer refuses it (ArgumentError).
- ``Int8Relu``: clamp to [zero_point, 255] (``qnnp_create_clamp_nc_u8``); Y's quantization
  must equal X's.
- ``Int8MaxPool`` / ``Int8MaxPoolRelu`` (``qnnp_create_max_pooling2d_nhwc_u8``): the window
  maximum over the pixels inside the image; Y's quantization must equal X's. The Int8 pools
  run NHWC only and take no dilation (Caffe2 sizes the output without it while QNNPACK
  reads with it, past the output buffer).
- ``Int8AveragePool`` / ``Int8AveragePoolRelu`` (``qnnp_create_average_pooling2d_nhwc_q8``;
  ``global_pooling`` -> ``qnnp_create_global_average_pooling_nwc_q8``): padding reads X's zero
  point and the divisor is always kH * kW (H * W when global). The window sum minus
  kH * kW * X.zero_point is multiplied by the float32 scale X.scale / (Y_scale * kH * kW),
  applied as its 24-bit mantissa and a right shift (rounding half away from zero); the
  ratio X.scale / Y_scale must lie in [2^-8, 2^8).
- ``Int8Softmax`` (``qnnp_create_softargmax_nc_q8``): over all elements after the first
  dimension; Y_scale must be 1/256 and Y_zero_point 0. A table t[i] = lrint(q * exp((i - 255)
  * X.scale)), q = min(2^32-1 / channels, 2^23 - 1), is read at x - max + 255, and
  y = min(255, (t * 256 + sum / 2) // sum) in integers.
- ``Int8Sigmoid`` (``qnnp_create_sigmoid_nc_q8``): Y_scale 1/256, Y_zero_point 0; a float32
  table lrintf(clamp(256 / (1 + expf(-X.scale * (i - z))), 0, 255)).
- ``Int8LeakyRelu`` (``qnnp_create_leaky_relu_nc_q8``): alpha in (0, 1); a float32 table of
  r * (i - z) (times alpha below 0), r = X.scale / Y_scale, clamped, lrintf, + Y_zero_point.
- ``Int8Concat`` (axis 0 unless ``axis``, or ``order`` NCHW -> 1 / NHWC -> 3), ``Int8Reshape``
  (second output: the old shape), ``Int8Flatten``, ``Int8Transpose``, ``Int8ResizeNearest``,
  ``Int8Slice`` (one sliced dimension; a negative index i means size + 1 + i), ``Int8ChannelShuffle`` (NHWC, ``group``; like Caffe2's
  ConvPoolOpBase it wants a ``kernel`` argument, unused): bytes moved unchanged;
  Y's quantization must equal X's (Int8Concat checks the first input only: the others'
  bytes are copied as they are, whatever their quantization, as Caffe2 does).
- ``Int8RoIAlign`` (NHWC; rois float32 (R, 5) or (R, 4)): Caffe2's own integer RoIAlign
  (int8_roi_align_op.h): bilinear weights rounded to w * 255 in uint8, accumulated in int32
  minus 255 * X.zero_point per sample, then gemmlowp's fixed-point multiplier for
  X.scale / (Y_scale * 255 * count) (QuantizeMultiplierSmallerThanOne) and Y_zero_point.

Where Caffe2 aborts or refuses (a CHECK on the output quantization, a QNNPACK create
failure) placer raises an ArgumentError naming the op; so it does for a Y_zero_point outside
[0, 255], which Caffe2 would truncate to uint8 in the data while keeping it in the tensor.

Devices: Caffe2 1.8.1 registers these ops for the CPU only (REGISTER_CPU_OPERATOR in
caffe2/operators/quantized/int8_add_op.cc, int8_relu_op.cc, int8_max_pool_op.cc,
int8_average_pool_op.cc, int8_softmax_op.cc, int8_sigmoid_op.cc, int8_leaky_relu_op.cc,
int8_concat_op.cc, int8_reshape_op.cc, int8_flatten_op.cc, int8_transpose_op.cc,
int8_resize_nearest_op.cc, int8_roi_align_op.cc, int8_slice_op.cc,
int8_channel_shuffle_op.cc; there is no CUDA Int8 kernel), so ``devices={"cpu"}``.

The kernels are written against ``xp``; the 256-entry tables (Softmax, Sigmoid, LeakyRelu)
are built on the host, and Int8RoIAlign runs on the host RoI by RoI (vectorised over its
samples and channels), as Caffe2's CPU kernel does.

Costs: bytes at one byte per element; flops like the float op (one per output element for
elementwise ops, one per window tap for pools, ~5 per element for softmax).
"""
from __future__ import annotations

import math
from math import prod

import numpy as np

from placer.errors import ArgumentError, InputError, ShapeError
from placer.ops.int8_base import Int8Tensor
from placer.ops.registry import OpDef, register
from placer.ops.spatial_args import parse_window
from placer.ops.tensor import reshaped
from placer.types import Args, OpFeatures, TensorType, shape_str

CPU = frozenset({"cpu"})
BLOCK = 1 << 16          # elements per block of a kernel's int64 temporaries
SCRATCH_PER_ELEMENT = 64  # bytes of int64 temporaries per element of a block (measured: < 56)
REDUCE_BUFFER_BYTES = 2 * 8192 * 8
SOFTMAX_FLOPS = 5        # per element: max, table read, sum, multiply-divide, clamp
ROI_FLOPS_PER_TAP = 2    # a weight times a value, added


# -- quantization helpers ------------------------------------------------------------------

def _f32(v) -> np.float32:
    return np.float32(v)


def _f32_bits(v) -> int:
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def _quantized(x, args: Args, op_type: str, i: int = 0) -> Int8Tensor:
    if not isinstance(x, Int8Tensor):
        raise InputError(f"op {args.op}: {op_type} input {i} must be an Int8 tensor "
                         f"(Int8TensorCPU), found {type(x).__name__}")
    if str(x.dtype) != "uint8":
        raise InputError(f"op {args.op}: {op_type} input {i} must hold uint8 data, found {x.dtype}")
    return x


def _y_quant(args: Args) -> tuple[float, int]:
    scale = _f32(args.float("Y_scale", 1.0))
    if not (np.isfinite(scale) and scale > 0):
        raise ArgumentError(f"op {args.op}: Y_scale must be finite and positive, found {float(scale)}")
    return float(scale), args.int("Y_zero_point", 0)


def _same_quant(x: Int8Tensor, args: Args, op_type: str) -> tuple[float, int]:
    """Y_scale / Y_zero_point, which Caffe2 CHECKs equal to X's (it aborts otherwise)."""
    scale, zp = _y_quant(args)
    if zp != x.zero_point or _f32(scale) != _f32(x.scale):
        raise ArgumentError(f"op {args.op}: {op_type} keeps its input's quantization: Y_scale "
                            f"{scale:.9g} and Y_zero_point {zp} must equal X's {x.scale:.9g} and "
                            f"{x.zero_point}")
    return float(_f32(x.scale)), int(x.zero_point)


def _check_zero_point(zp: int, args: Args, what: str) -> None:
    if not 0 <= zp <= 255:
        raise ArgumentError(f"op {args.op}: {what} {zp} is outside [0, 255]")


def _relu_floor(relu: bool, zp: int, args: Args, op_type: str) -> int:
    """The clamp's lower end; QNNPACK refuses an empty range (min must be below max)."""
    if relu and zp >= 255:
        raise ArgumentError(f"op {args.op}: {op_type} with Y_zero_point 255 leaves the output range "
                            f"[255, 255] empty, which QNNPACK refuses")
    return zp if relu else 0


def _flat_blocks(n: int, per: int):
    """[start, end) blocks of ``n`` items of ``per`` elements each, about BLOCK elements a
    block (one item at least): the kernels' int64 temporaries stay a few MiB."""
    step = max(1, BLOCK // max(per, 1))
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def _round_shift(xp, acc, shift: int):
    """acc >> shift rounding half away from zero (QNNPACK's remainder test), acc int64."""
    mask = (1 << shift) - 1
    rem = (acc & mask) - (acc < 0).astype(xp.int64)
    return (acc >> shift) + (rem > (mask >> 1)).astype(xp.int64)


def _clamp_u8(xp, v, lo: int = 0, hi: int = 255):
    return xp.clip(v, lo, hi).astype(xp.uint8)


def _quantize_multiplier_smaller_than_one(real: float) -> tuple[int, int]:
    """gemmlowp's QuantizeMultiplierSmallerThanOne: (multiplier in Q31, right shift)."""
    if real == 0.0:
        return 0, 0
    q, exponent = math.frexp(real)
    shift = -exponent
    fixed = int(math.floor(q * (1 << 31) + 0.5))    # std::round: halves away from zero (q > 0)
    if fixed == 1 << 31:
        fixed //= 2
        shift -= 1
    return fixed, shift


def _multiply_by_quantized_multiplier(xp, x, multiplier: int, shift: int):
    """gemmlowp's SaturatingRoundingDoublingHighMul then RoundingDivideByPOT; x int64."""
    ab = x * multiplier
    nudge = xp.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    t = ab + nudge
    high = xp.where(t >= 0, t >> 31, -((-t) >> 31))      # C division: toward zero
    mask = (1 << shift) - 1
    rem = high & mask
    threshold = (mask >> 1) + (high < 0).astype(xp.int64)
    return (high >> shift) + (rem > threshold).astype(xp.int64)


# -- shapes and costs ------------------------------------------------------------------------

def _u8(shape) -> TensorType:
    return TensorType(tuple(int(d) for d in shape), "uint8")


def _elementwise_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(flops=float(outputs[0].size), bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


def _move_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(flops=0.0, bytes_read=float(inputs[0].nbytes) if len(inputs) == 1
                      else float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


def _same_infer(inputs, args):
    return [_u8(inputs[0].shape)]


# -- Add / Sum -----------------------------------------------------------------------------

def _add_infer(op_type):
    def infer(inputs, args):
        a, b = inputs
        if tuple(a.shape) != tuple(b.shape):
            raise ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): the two "
                             f"inputs must have one shape (no broadcast)")
        return [_u8(a.shape)]
    return infer


def _add_kernel(op_type: str, relu: bool):
    def kernel(xp, inputs, args):
        a = _quantized(inputs[0], args, op_type, 0)
        b = _quantized(inputs[1], args, op_type, 1)
        _add_infer(op_type)([_u8(a.shape), _u8(b.shape)], args)
        y_scale, y_zp = _y_quant(args)
        _check_zero_point(y_zp, args, "Y_zero_point")
        ra = _f32(a.scale) / _f32(y_scale)
        rb = _f32(b.scale) / _f32(y_scale)
        for r, name in ((ra, "X0"), (rb, "X1")):
            if not (2.0 ** -14 <= r < 2.0 ** 8):
                raise ArgumentError(f"op {args.op}: {op_type}: the {name}-to-output scale ratio "
                                    f"{float(r):.7g} must be in [2**-14, 2**8) (QNNPACK)")
        if max(ra, rb) < 2.0 ** -10:
            # QNNPACK asserts this (shift <= 31); its release build shifts by 32+ (undefined)
            raise ArgumentError(f"op {args.op}: {op_type}: the larger input-to-output scale ratio "
                                f"{float(max(ra, rb)):.7g} must be at least 2**-10 (QNNPACK's "
                                f"requantization shift exceeds 31 below it)")
        exponent = (_f32_bits(max(ra, rb)) >> 23) - 127
        shift = 21 - exponent
        scale_multiplier = _f32(2.0 ** shift)
        ma = int(np.rint(ra * scale_multiplier))
        mb = int(np.rint(rb * scale_multiplier))
        lo = _relu_floor(relu, y_zp, args, op_type)
        fa, fb = a.data.reshape(-1), b.data.reshape(-1)
        y = xp.empty(fa.shape, dtype=xp.uint8)
        for s, e in _flat_blocks(fa.size, 1):
            acc = ma * (fa[s:e].astype(xp.int64) - int(a.zero_point))
            acc += mb * (fb[s:e].astype(xp.int64) - int(b.zero_point))
            y[s:e] = _clamp_u8(xp, _round_shift(xp, acc, shift) + y_zp, lo, 255)
        return (Int8Tensor(y.reshape(a.shape), y_scale, y_zp),)
    return kernel


# -- Relu ----------------------------------------------------------------------------------

def _relu_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Relu")
    scale, zp = _same_quant(x, args, "Int8Relu")
    return (Int8Tensor(xp.maximum(x.data, xp.uint8(zp)), scale, zp),)


# -- pools ---------------------------------------------------------------------------------

def _pool_geometry(x_shape, args: Args, op_type: str):
    win = parse_window(args, pooling=True)
    if win.nchw:
        raise ArgumentError(f"op {args.op}: {op_type} runs NHWC only (Caffe2 has no NCHW Int8 "
                            f"kernel): set order NHWC")
    if win.dilation != (1, 1):
        raise ArgumentError(f"op {args.op}: {op_type} takes no dilation (Caffe2 sizes the output "
                            f"without it while QNNPACK reads with it)")
    n, c, h, w = win.image_dims(TensorType(tuple(x_shape)), args.op)
    kernel = win.kernel_for(h, w)
    if win.global_pooling:
        return win, (n, c, h, w), kernel, (1, 1), (0, 0, 0, 0)
    out, pads = win.resolve(h, w, args.op)
    return win, (n, c, h, w), kernel, out, pads


def _pool_infer(op_type):
    def infer(inputs, args):
        _, (n, c, _, _), _, out, _ = _pool_geometry(inputs[0].shape, args, op_type)
        return [_u8((n, *out, c))]
    return infer


def _pool_cost(op_type):
    def cost(inputs, outputs, args):
        _, _, kernel, _, _ = _pool_geometry(inputs[0].shape, args, op_type)
        return OpFeatures(flops=float(outputs[0].size * kernel[0] * kernel[1]),
                          bytes_read=float(inputs[0].nbytes), bytes_written=float(outputs[0].nbytes))
    return cost


def _window_taps(xp, data, win, hw, kernel, out, pads, fill: int):
    """The kH * kW window taps of NHWC ``data`` padded with ``fill``: a list of (N, Ho, Wo, C)."""
    (h, w), (ho, wo), (sh, sw), (dh, dw) = hw, out, win.stride, win.dilation
    need_h = (ho - 1) * sh + dh * (kernel[0] - 1) + 1
    need_w = (wo - 1) * sw + dw * (kernel[1] - 1) + 1
    pt, pl = pads[0], pads[1]
    pb, pr = max(need_h - h - pt, 0), max(need_w - w - pl, 0)
    if pt or pl or pb or pr:
        data = xp.pad(data, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    taps = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            taps.append(data[:, i * dh: i * dh + (ho - 1) * sh + 1: sh,
                             j * dw: j * dw + (wo - 1) * sw + 1: sw, :])
    return taps


def _max_pool_kernel(op_type: str, relu: bool):
    def kernel(xp, inputs, args):
        x = _quantized(inputs[0], args, op_type)
        scale, zp = _same_quant(x, args, op_type)
        _relu_floor(relu, zp, args, op_type)
        win, (_, _, h, w), k, out, pads = _pool_geometry(x.shape, args, op_type)
        if win.global_pooling:
            y = x.data.max(axis=(1, 2), keepdims=True)
        else:
            # padding 0 never wins a uint8 maximum: the maximum over the pixels inside
            taps = _window_taps(xp, x.data, win, (h, w), k, out, pads, 0)
            y = taps[0].copy()
            for t in taps[1:]:
                xp.maximum(y, t, out=y)
        if relu:
            y = xp.maximum(y, xp.uint8(zp))
        return (Int8Tensor(xp.ascontiguousarray(y), scale, zp),)
    return kernel


def _avgpool_params(x_scale: float, y_scale: float, count: int, args: Args, op_type: str):
    ratio = _f32(x_scale) / _f32(y_scale)
    if not (2.0 ** -8 <= ratio < 2.0 ** 8):
        raise ArgumentError(f"op {args.op}: {op_type}: input-to-output scale ratio {float(ratio):.7g} "
                            f"must be in [2**-8, 2**8) (QNNPACK)")
    scale = _f32(x_scale) / (_f32(y_scale) * _f32(count))
    bits = _f32_bits(scale)
    multiplier = (bits & 0x007FFFFF) | 0x00800000
    shift = 127 + 23 - (bits >> 23)
    return multiplier, shift


def _avg_requantize(xp, acc, multiplier: int, shift: int, y_zp: int, lo: int):
    """QNNPACK's SSE2 average requantization: |acc| * multiplier, rounded half up, shifted,
    the sign put back (halves away from zero), plus the zero point, clamped."""
    mag = (xp.abs(acc) * multiplier + (1 << (shift - 1))) >> shift
    return _clamp_u8(xp, xp.where(acc < 0, -mag, mag) + y_zp, lo, 255)


def _avg_pool_kernel(op_type: str, relu: bool):
    def kernel(xp, inputs, args):
        x = _quantized(inputs[0], args, op_type)
        y_scale, y_zp = _y_quant(args)
        _check_zero_point(y_zp, args, "Y_zero_point")
        win, (_, _, h, w), k, out, pads = _pool_geometry(x.shape, args, op_type)
        count = k[0] * k[1]
        multiplier, shift = _avgpool_params(x.scale, y_scale, count, args, op_type)
        lo = _relu_floor(relu, y_zp, args, op_type)
        if win.global_pooling:
            acc = x.data.sum(axis=(1, 2), keepdims=True, dtype=xp.int64) - count * int(x.zero_point)
            return (Int8Tensor(_avg_requantize(xp, acc, multiplier, shift, y_zp, lo), y_scale, y_zp),)
        n, c = x.shape[0], x.shape[3]
        y = xp.empty((n, *out, c), dtype=xp.uint8)
        for c0, c1 in _flat_blocks(c, out[0] * out[1]):      # channel blocks, image by image
            for i in range(n):
                taps = _window_taps(xp, x.data[i:i + 1, :, :, c0:c1], win, (h, w), k, out, pads,
                                    int(x.zero_point))
                total = taps[0].astype(xp.int64)
                for t in taps[1:]:
                    total += t
                total -= count * int(x.zero_point)
                y[i:i + 1, :, :, c0:c1] = _avg_requantize(xp, total, multiplier, shift, y_zp, lo)
        return (Int8Tensor(y, y_scale, y_zp),)
    return kernel


# -- Softmax, Sigmoid, LeakyRelu (table lookups) -------------------------------------------

def _fixed_output(args: Args, op_type: str) -> tuple[float, int]:
    scale, zp = _y_quant(args)
    if zp != 0 or _f32(scale) != _f32(1.0 / 256.0):
        raise ArgumentError(f"op {args.op}: {op_type} writes Y_scale 1/256 and Y_zero_point 0 "
                            f"only (QNNPACK), found {scale:.9g} and {zp}")
    return scale, zp


def _softmax_infer(inputs, args):
    if inputs[0].ndim < 1 or inputs[0].size == 0:
        raise ShapeError(f"op {args.op}: Int8Softmax on inputs ({shape_str(inputs)}): needs a "
                         f"non-empty input of at least 1 dimension")
    return [_u8(inputs[0].shape)]


def _softmax_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Softmax")
    _softmax_infer([_u8(x.shape)], args)
    y_scale, y_zp = _fixed_output(args, "Int8Softmax")
    rows = x.shape[0]
    channels = x.size // rows
    qscale = min(float(0xFFFFFFFF) / float(channels), 8388607.0)
    in_scale = float(_f32(x.scale))
    table = np.array([np.rint(qscale * math.exp(float(i - 255) * in_scale)) for i in range(256)],
                     dtype=np.int64)
    table = xp.asarray(table)
    data = x.data.reshape(rows, channels)
    y = xp.empty((rows, channels), dtype=xp.uint8)
    for r0, r1 in _flat_blocks(rows, channels):
        block = data[r0:r1].astype(xp.int16)
        block += 255 - block.max(axis=1, keepdims=True)
        t = table[block]
        total = t.sum(axis=1, keepdims=True)
        t *= 256
        t += total >> 1
        t //= total
        y[r0:r1] = xp.minimum(t, 255)
    return (Int8Tensor(y.reshape(x.shape), y_scale, y_zp),)


def _sigmoid_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Sigmoid")
    y_scale, y_zp = _fixed_output(args, "Int8Sigmoid")
    i = np.arange(256, dtype=np.int32) - int(x.zero_point)
    v = _f32(x.scale) * i.astype(np.float32)
    s = np.float32(256.0) / (np.float32(1.0) + np.exp(-v))
    s = np.clip(s, np.float32(0.0), np.float32(255.0))
    table = (np.rint(s).astype(np.int32) + y_zp).astype(np.uint8)
    return (Int8Tensor(xp.asarray(table)[x.data], y_scale, y_zp),)


def _leaky_relu_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8LeakyRelu")
    alpha = args.float("alpha", 0.01)
    if not 0.0 < alpha < 1.0:
        raise ArgumentError(f"op {args.op}: Int8LeakyRelu alpha must be in (0, 1), found {alpha}")
    y_scale, y_zp = _y_quant(args)
    _check_zero_point(y_zp, args, "Y_zero_point")
    ratio = _f32(x.scale) / _f32(y_scale)
    if not (2.0 ** -8 <= ratio < 2.0 ** 8):
        raise ArgumentError(f"op {args.op}: Int8LeakyRelu: input-to-output scale ratio "
                            f"{float(ratio):.7g} must be in [2**-8, 2**8) (QNNPACK)")
    i = (np.arange(256, dtype=np.int32) - int(x.zero_point)).astype(np.float32)
    v = ratio * i
    v = np.where(v < 0, v * _f32(alpha), v)
    v = np.clip(v, np.float32(0 - y_zp), np.float32(255 - y_zp))
    table = (np.rint(v).astype(np.int32) + y_zp).astype(np.uint8)
    return (Int8Tensor(xp.asarray(table)[x.data], y_scale, y_zp),)


# -- data movement ---------------------------------------------------------------------------

def _concat_axis(args: Args) -> int:
    if "order" in args:
        order = args.str("order").upper()
        if order not in ("NCHW", "NHWC"):
            raise ArgumentError(f"op {args.op}: Int8Concat order must be NCHW or NHWC, not {order!r}")
        return 1 if order == "NCHW" else 3
    return args.int("axis", 0)


def _concat_infer(inputs, args):
    ndim = inputs[0].ndim
    axis = _concat_axis(args)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"op {args.op}: Int8Concat on inputs ({shape_str(inputs)}): axis {axis} is "
                         f"out of range for {ndim} dimensions")
    axis %= ndim
    first = inputs[0].shape
    for t in inputs[1:]:
        if t.ndim != ndim or any(d != e for k, (d, e) in enumerate(zip(t.shape, first)) if k != axis):
            raise ShapeError(f"op {args.op}: Int8Concat on inputs ({shape_str(inputs)}): the inputs "
                             f"must agree on every dimension but axis {axis}")
    shape = list(first)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return [_u8(shape)]


def _concat_kernel(xp, inputs, args):
    xs = [_quantized(x, args, "Int8Concat", i) for i, x in enumerate(inputs)]
    scale, zp = _same_quant(xs[0], args, "Int8Concat")
    _concat_infer([_u8(x.shape) for x in xs], args)
    axis = _concat_axis(args) % xs[0].ndim
    return (Int8Tensor(xp.concatenate([x.data for x in xs], axis=axis), scale, zp),)


def _reshape_infer(inputs, args):
    x = inputs[0]
    if args.n_outputs is not None and args.n_outputs != 2:
        raise ArgumentError(f"op {args.op}: Int8Reshape has two outputs (the reshaped tensor and the "
                            f"old shape), found {args.n_outputs}", hint="add an output for the old shape")
    if len(inputs) == 2:
        if "shape" in args:
            raise ArgumentError(f"op {args.op}: Int8Reshape takes the shape as an argument or as "
                                f"an input, not both")
        if inputs[1].values is None:
            return [None, TensorType((x.ndim,), "int64", values=x.shape)]
        new = list(inputs[1].values)
    else:
        new = args.ints("shape")
    return [_u8(reshaped(tuple(x.shape), new, args, inputs)),
            TensorType((x.ndim,), "int64", values=tuple(x.shape))]


def _reshape_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Reshape")
    scale, zp = _same_quant(x, args, "Int8Reshape")
    if len(inputs) == 2:
        s = inputs[1]
        new = [int(v) for v in (s.get() if hasattr(s, "get") else np.asarray(s)).reshape(-1)]
    else:
        new = args.ints("shape")
    shape = reshaped(x.shape, new, args, [_u8(x.shape)])
    return (Int8Tensor(x.data.reshape(shape).copy(), scale, zp),
            xp.asarray(np.array(x.shape, dtype=np.int64)))


def _flatten_infer(inputs, args):
    x, axis = inputs[0], args.int("axis", 1)
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"op {args.op}: Int8Flatten on inputs ({shape_str(inputs)}): axis {axis} is "
                         f"out of range for {x.ndim} dimensions")
    return [_u8((prod(x.shape[:axis]), prod(x.shape[axis:])))]


def _flatten_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Flatten")
    scale, zp = _same_quant(x, args, "Int8Flatten")
    (t,) = _flatten_infer([_u8(x.shape)], args)
    return (Int8Tensor(x.data.reshape(t.shape).copy(), scale, zp),)


def _transpose_axes(ndim: int, args: Args, inputs) -> list[int]:
    axes = args.ints("axes", []) or list(range(ndim))[::-1]
    if len(axes) != ndim or sorted(a % ndim for a in axes) != list(range(ndim)):
        raise ShapeError(f"op {args.op}: Int8Transpose on inputs ({shape_str(inputs)}): axes {axes} "
                         f"are not a permutation of {ndim} dimensions")
    return [a % ndim for a in axes]


def _transpose_infer(inputs, args):
    axes = _transpose_axes(inputs[0].ndim, args, inputs)
    return [_u8(tuple(inputs[0].shape[a] for a in axes))]


def _transpose_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Transpose")
    scale, zp = _same_quant(x, args, "Int8Transpose")
    axes = _transpose_axes(x.ndim, args, [_u8(x.shape)])
    return (Int8Tensor(xp.ascontiguousarray(x.data.transpose(axes)), scale, zp),)


def _resize_scales(args: Args) -> tuple[np.float32, np.float32]:
    ws, hs = _f32(args.float("width_scale", 1.0)), _f32(args.float("height_scale", 1.0))
    if not (ws > 0 and hs > 0):
        raise ArgumentError(f"op {args.op}: Int8ResizeNearest width_scale and height_scale must be "
                            f"positive, found {float(ws)}, {float(hs)}")
    return ws, hs


def _resize_infer(inputs, args):
    x = inputs[0]
    if x.ndim != 4:
        raise ShapeError(f"op {args.op}: Int8ResizeNearest on inputs ({shape_str(inputs)}): X must "
                         f"be 4-D (NHWC)")
    ws, hs = _resize_scales(args)
    n, h, w, c = x.shape
    return [_u8((n, int(_f32(h) * hs), int(_f32(w) * ws), c))]


def _resize_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8ResizeNearest")
    scale, zp = _same_quant(x, args, "Int8ResizeNearest")
    (t,) = _resize_infer([_u8(x.shape)], args)
    ws, hs = _resize_scales(args)
    _, h, w, _ = x.shape
    _, oh, ow, _ = t.shape
    rows = np.minimum((np.arange(oh, dtype=np.float32) / hs).astype(np.int64), h - 1)
    cols = np.minimum((np.arange(ow, dtype=np.float32) / ws).astype(np.int64), w - 1)
    y = x.data[:, xp.asarray(rows)][:, :, xp.asarray(cols)]
    return (Int8Tensor(xp.ascontiguousarray(y), scale, zp),)


def _slice_bounds(shape, args: Args, inputs) -> list[tuple[int, int]]:
    starts, ends = args.ints("starts", []), args.ints("ends", [])
    if len(starts) != len(shape) or len(ends) != len(shape):
        raise ShapeError(f"op {args.op}: Int8Slice on inputs ({shape_str(inputs)}): starts {starts} "
                         f"and ends {ends} must have one entry per dimension ({len(shape)})")
    bounds, sliced = [], 0
    for d, (s, e) in enumerate(zip(starts, ends)):
        size = shape[d]
        s = s + size + 1 if s < 0 else s
        e = e + size + 1 if e < 0 else e
        if not (0 <= s <= e <= size):
            raise ShapeError(f"op {args.op}: Int8Slice on inputs ({shape_str(inputs)}): dimension {d} "
                             f"slice [{starts[d]}, {ends[d]}) is out of range for size {size}")
        if (s, e) != (0, size):
            sliced += 1
        bounds.append((s, e))
    if sliced > 1:
        raise ShapeError(f"op {args.op}: Int8Slice on inputs ({shape_str(inputs)}): Caffe2 slices "
                         f"one dimension only, starts {starts} ends {ends} slice {sliced}")
    return bounds


def _slice_infer(inputs, args):
    return [_u8(tuple(e - s for s, e in _slice_bounds(inputs[0].shape, args, inputs)))]


def _slice_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8Slice")
    scale, zp = _same_quant(x, args, "Int8Slice")
    bounds = _slice_bounds(x.shape, args, [_u8(x.shape)])
    y = x.data[tuple(slice(s, e) for s, e in bounds)]
    return (Int8Tensor(xp.ascontiguousarray(y), scale, zp),)


def _shuffle_groups(shape, args: Args, inputs) -> int:
    if args.str("order", "NCHW").upper() != "NHWC":
        raise ArgumentError(f"op {args.op}: Int8ChannelShuffle runs NHWC only: set order NHWC")
    parse_window(args)      # a ConvPoolOpBase in Caffe2: it refuses a missing kernel too
    if len(shape) != 4:
        raise ShapeError(f"op {args.op}: Int8ChannelShuffle on inputs ({shape_str(inputs)}): X must "
                         f"be 4-D (NHWC)")
    g = args.int("group", 1)
    if g < 1 or shape[3] % g:
        raise ShapeError(f"op {args.op}: Int8ChannelShuffle on inputs ({shape_str(inputs)}): group "
                         f"{g} does not divide the {shape[3]} channels")
    return g


def _shuffle_infer(inputs, args):
    _shuffle_groups(inputs[0].shape, args, inputs)
    return [_u8(inputs[0].shape)]


def _shuffle_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8ChannelShuffle")
    scale, zp = _same_quant(x, args, "Int8ChannelShuffle")
    g = _shuffle_groups(x.shape, args, [_u8(x.shape)])
    n, h, w, c = x.shape
    y = x.data.reshape(n, h, w, g, c // g).transpose(0, 1, 2, 4, 3).reshape(n, h, w, c)
    return (Int8Tensor(xp.ascontiguousarray(y), scale, zp),)


# -- RoIAlign --------------------------------------------------------------------------------

def _roi_args(args: Args):
    if args.str("order", "NHWC").upper() != "NHWC":
        raise ArgumentError(f"op {args.op}: Int8RoIAlign runs NHWC only")
    ph, pw = args.int("pooled_h", 1), args.int("pooled_w", 1)
    if ph < 1 or pw < 1:
        raise ArgumentError(f"op {args.op}: Int8RoIAlign pooled_h and pooled_w must be positive, "
                            f"found {ph}, {pw}")
    return _f32(args.float("spatial_scale", 1.0)), ph, pw, args.int("sampling_ratio", -1)


def _roi_infer(inputs, args):
    x, rois = inputs[0], inputs[1]
    _, ph, pw, _ = _roi_args(args)
    fail = f"op {args.op}: Int8RoIAlign on inputs ({shape_str(inputs)}): "
    if x.ndim != 4:
        raise ShapeError(fail + "X must be 4-D (NHWC)")
    if rois.size and (rois.ndim != 2 or rois.shape[1] not in (4, 5)):
        raise ShapeError(fail + "rois must be (R, 5) = (image, x1, y1, x2, y2) or (R, 4)")
    r = rois.shape[0] if rois.size else 0
    return [TensorType((r, ph, pw, x.shape[3]), "uint8", bound=rois.bound)]


def _roi_axis(start, bin_size, grid: int, pooled: int, size: int):
    """Per (pooled, grid) sample along one axis: low, high (int), frac (float32), inside (bool)."""
    p = np.arange(pooled, dtype=np.float32)[:, None]
    i = np.arange(grid, dtype=np.float32)[None, :] + np.float32(0.5)
    v = start + p * bin_size + i * bin_size / np.float32(grid)
    inside = (v.astype(np.float64) >= -1.0) & (v <= size)
    v = np.where(v <= 0, np.float32(0), v).astype(np.float32)
    low = v.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, low, low + 1)
    v = np.where(edge, low.astype(np.float32), v)
    return low, high, (v - low.astype(np.float32)).astype(np.float32), inside


def _roi_kernel(xp, inputs, args):
    x = _quantized(inputs[0], args, "Int8RoIAlign")
    rois = inputs[1]
    rois = np.asarray(rois.get() if hasattr(rois, "get") else rois, dtype=np.float32)
    (t,) = _roi_infer([_u8(x.shape), TensorType(rois.shape, "float32")], args)
    scale, ph, pw, sampling = _roi_args(args)
    y_scale, y_zp = _y_quant(args)
    _, h, w, c = x.shape
    out = np.zeros(t.shape, dtype=np.uint8)
    data = np.asarray(x.data.get() if hasattr(x.data, "get") else x.data)
    w255 = np.float32(255.0)
    for n in range(t.shape[0]):
        row = rois[n]
        image = int(row[0]) if rois.shape[1] == 5 else 0
        box = row[1:] if rois.shape[1] == 5 else row
        sw, sh, ew, eh = (box[k] * scale for k in range(4))
        rw = max(np.float32(ew - sw), np.float32(1.0))
        rh = max(np.float32(eh - sh), np.float32(1.0))
        bh, bw = np.float32(rh / np.float32(ph)), np.float32(rw / np.float32(pw))
        gh = sampling if sampling > 0 else int(math.ceil(rh / ph))
        gw = sampling if sampling > 0 else int(math.ceil(rw / pw))
        count = gh * gw
        mult, shift = _quantize_multiplier_smaller_than_one(
            float(_f32(x.scale)) / (float(_f32(y_scale)) * 255.0 * count))
        ylo, yhi, ly, yin = _roi_axis(np.float32(sh), bh, gh, ph, h)
        xlo, xhi, lx, xin = _roi_axis(np.float32(sw), bw, gw, pw, w)
        hy, hx = (np.float32(1.0) - ly), (np.float32(1.0) - lx)
        # weights per (ph, gh, pw, gw): uint8(round(h * h' * 255)), zero outside the map
        inside = yin[:, :, None, None] & xin[None, None, :, :]

        def weight(a, b):
            v = (a[:, :, None, None] * b[None, None, :, :]) * w255
            return np.where(inside, np.rint(v), 0).astype(np.int64)
        w1, w2, w3, w4 = weight(hy, hx), weight(hy, lx), weight(ly, hx), weight(ly, lx)
        img = data[image]
        yl, yh = ylo[:, :, None, None], yhi[:, :, None, None]
        xl, xh = xlo[None, None, :, :], xhi[None, None, :, :]
        yl, yh = np.where(inside, yl, 0), np.where(inside, yh, 0)
        xl, xh = np.where(inside, xl, 0), np.where(inside, xh, 0)
        acc = (w1[..., None] * img[yl, xl] + w2[..., None] * img[yl, xh]
               + w3[..., None] * img[yh, xl] + w4[..., None] * img[yh, xh])
        acc = acc.sum(axis=(1, 3)) - count * 255 * int(x.zero_point)          # (ph, pw, C)
        acc = ((acc + 2 ** 31) % 2 ** 32) - 2 ** 31                              # int32 wrap
        v = _multiply_by_quantized_multiplier(np, acc, mult, shift) + y_zp
        out[n] = np.clip(v, 0, 255).astype(np.uint8)
    return (Int8Tensor(xp.asarray(out), y_scale, y_zp),)


def _roi_cost(inputs, outputs, args):
    _, ph, pw, sampling = _roi_args(args)
    g = sampling if sampling > 0 else 2
    taps = float(outputs[0].size) * g * g * 4
    return OpFeatures(flops=ROI_FLOPS_PER_TAP * taps, bytes_read=min(taps, float(inputs[0].nbytes) * 4)
                      + float(inputs[1].nbytes), bytes_written=float(outputs[0].nbytes))


def _softmax_cost(inputs, outputs, args):
    return OpFeatures(flops=SOFTMAX_FLOPS * float(outputs[0].size), bytes_read=float(inputs[0].nbytes),
                      bytes_written=float(outputs[0].nbytes))


# -- temporaries (``scratch``): the int64 blocks of the kernels ---------------------------------

def _block_scratch(inputs, outputs, args) -> int:
    return SCRATCH_PER_ELEMENT * min(outputs[0].size, BLOCK)


def _avg_pool_scratch(op_type):
    def scratch(inputs, outputs, args) -> int:
        win, (_, c, h, w), k, out, pads = _pool_geometry(inputs[0].shape, args, op_type)
        if win.global_pooling:     # numpy's buffered int64 reduction: 8192-element buffers
            return SCRATCH_PER_ELEMENT * outputs[0].size + REDUCE_BUFFER_BYTES
        cb = min(c, max(1, BLOCK // max(out[0] * out[1], 1)))
        padded = (h + pads[0] + pads[2] + win.stride[0]) * (w + pads[1] + pads[3] + win.stride[1]) * cb
        return SCRATCH_PER_ELEMENT * out[0] * out[1] * cb + padded
    return scratch


def _softmax_scratch(inputs, outputs, args) -> int:
    x = inputs[0]
    channels = x.size // max(x.shape[0], 1)
    return SCRATCH_PER_ELEMENT * max(channels, min(x.size, BLOCK))


def _roi_scratch(inputs, outputs, args) -> int:
    """One RoI's samples at a time (the adaptive grid guessed at 2 x 2, as the cost does)."""
    _, ph, pw, sampling = _roi_args(args)
    g = sampling if sampling > 0 else 2
    return SCRATCH_PER_ELEMENT * ph * pw * g * g * max(inputs[0].shape[-1], 1)


# -- registrations ---------------------------------------------------------------------------

for _type, _relu in (("Int8Add", False), ("Int8AddRelu", True), ("Int8Sum", False), ("Int8SumRelu", True)):
    register(OpDef(_type, _add_infer(_type), _add_kernel(_type, _relu), _elementwise_cost, devices=CPU,
                   min_inputs=2, max_inputs=2, scratch=_block_scratch,
                   doc="X0 + X1 requantized to Y_scale / Y_zero_point (QNNPACK add)"
                       + ("; clamped at the zero point" if _relu else "")))

register(OpDef("Int8Relu", _same_infer, _relu_kernel, _elementwise_cost, devices=CPU, min_inputs=1,
               max_inputs=1, doc="max(X, zero_point), X's quantization"))

for _type, _relu in (("Int8MaxPool", False), ("Int8MaxPoolRelu", True)):
    register(OpDef(_type, _pool_infer(_type), _max_pool_kernel(_type, _relu), _pool_cost(_type),
                   devices=CPU, min_inputs=1, max_inputs=1, doc="NHWC window maximum, X's quantization"))

for _type, _relu in (("Int8AveragePool", False), ("Int8AveragePoolRelu", True)):
    register(OpDef(_type, _pool_infer(_type), _avg_pool_kernel(_type, _relu), _pool_cost(_type),
                   devices=CPU, min_inputs=1, max_inputs=1, scratch=_avg_pool_scratch(_type),
                   doc="NHWC window mean (zero-point padding, divisor kH*kW) requantized to Y"))

register(OpDef("Int8Softmax", _softmax_infer, _softmax_kernel, _softmax_cost, devices=CPU,
               min_inputs=1, max_inputs=1, scratch=_softmax_scratch, doc="softmax over all but the first dim; Y 1/256, 0"))
register(OpDef("Int8Sigmoid", _same_infer, _sigmoid_kernel, _elementwise_cost, devices=CPU,
               min_inputs=1, max_inputs=1, doc="sigmoid by a 256-entry table; Y 1/256, 0"))
register(OpDef("Int8LeakyRelu", _same_infer, _leaky_relu_kernel, _elementwise_cost, devices=CPU,
               min_inputs=1, max_inputs=1, doc="leaky relu (alpha) by a 256-entry table, requantized"))
register(OpDef("Int8Concat", _concat_infer, _concat_kernel, _move_cost, devices=CPU, min_inputs=1,
               doc="concatenation along axis (default 0; order NCHW -> 1, NHWC -> 3)"))
register(OpDef("Int8Reshape", _reshape_infer, _reshape_kernel, _move_cost, devices=CPU, min_inputs=1,
               max_inputs=2, host_inputs=(1,), doc="reshape (shape arg or input); old shape out"))
register(OpDef("Int8Flatten", _flatten_infer, _flatten_kernel, _move_cost, devices=CPU, min_inputs=1,
               max_inputs=1, doc="flatten to 2-D at axis (default 1)"))
register(OpDef("Int8Transpose", _transpose_infer, _transpose_kernel, _move_cost, devices=CPU,
               min_inputs=1, max_inputs=1, doc="permute axes (default reversed)"))
register(OpDef("Int8ResizeNearest", _resize_infer, _resize_kernel, _move_cost, devices=CPU,
               min_inputs=1, max_inputs=1, doc="NHWC nearest resize by width_scale / height_scale"))
register(OpDef("Int8Slice", _slice_infer, _slice_kernel, _move_cost, devices=CPU, min_inputs=1,
               max_inputs=1, doc="slice of one dimension (starts / ends args, -1 = the end)"))
register(OpDef("Int8ChannelShuffle", _shuffle_infer, _shuffle_kernel, _move_cost, devices=CPU,
               min_inputs=1, max_inputs=1, doc="NHWC channel shuffle over group groups"))
register(OpDef("Int8RoIAlign", _roi_infer, _roi_kernel, _roi_cost, devices=CPU, min_inputs=2,
               max_inputs=2, scratch=_roi_scratch, host_inputs=(1,), doc="integer RoIAlign, NHWC, requantized to Y"))
