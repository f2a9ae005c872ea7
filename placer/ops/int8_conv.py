"""Op family 'int8_conv': Caffe2's quantized Int8 ops for convolutions and fully connected
layers, and the ops that make and read their tensors, bit for bit as torch 1.8.1 runs them.

- Int8Quantize(X float32) -> Y (Int8 uint8, ``Y_scale``, ``Y_zero_point``);
  Int8Dequantize(X Int8) -> Y float32 (caffe2/operators/quantized/int8_quantize_op.h,
  int8_dequantize_op.h; the arithmetic is in ``int8_base``);
- Int8GivenTensorFill: uint8 values given as *one string* argument ``values`` (its bytes),
  ``shape``, ``Y_scale``, ``Y_zero_point``; Int8GivenIntTensorFill: int32 ``values`` (ints)
  for a bias (int8_given_tensor_fill_op.h);
- Int8Conv / Int8ConvRelu(X, W, B): NHWC only (``order`` must say so, as Caffe2 enforces),
  the ConvPoolOpBase arguments of Conv (kernel, stride, pads, dilation, legacy_pad, group);
  W is (M, kH, kW, C/group) uint8 with its own scale and zero point, B an int32 Int8 tensor
  of M values (its scale is X_scale * W_scale by convention; QNNPACK reads only the values);
  Y takes ``Y_scale`` / ``Y_zero_point`` (int8_conv_op.h);
- Int8ConvTranspose(X, W, B): NHWC, W (C, kH, kW, M), one group whatever ``group`` says
  (Caffe2 passes 1 to QNNPACK), no dilation (int8_conv_transpose_op.h);
- Int8FC(X, W, B): X flattened to (X.dims[0], K), W (N, K), Y (X.dims[0], N) -- always 2-D,
  unlike FC (int8_fc_op.h).

Numerics: the accumulator is sum((x - x_zp) * (w - w_zp)) + bias, exact: it is computed
with the float kernels of ops/conv.py and ops/fc.py on float64 copies of the centred
integers, where every product (|.| <= 255^2) and every partial sum stays an integer below
2^53 and is therefore exact (a padded pixel is x_zp, which centres to 0, as QNNPACK's zero
buffer). It is then requantized with QNNPACK's SSE2 fixed-point scheme
(``int8_base.requantize``), clamped for Int8ConvRelu from ``QuantizeUint8(Y_scale,
Y_zero_point, 0)`` (int8_utils.h ``activationLimits``). Zero points are QNNPACK's uint8s:
outside 0..255 is an ArgumentError; so is a requantization scale >= 1, which QNNPACK refuses.

Devices: Caffe2 1.8.1 has CPU kernels only for these ops (QNNPACK; no CUDA Int8 op exists
under caffe2/operators/quantized/), and placer's kernels compute on the host: ``devices``
is {"cpu"}, so the planner pins them to the CPU.

Types and costs: an Int8 blob's TensorType is its data's shape with dtype "uint8" ("int32"
for Int8GivenIntTensorFill); its runtime value is an ``int8_base.Int8Tensor``. MACs are
those of the float op (ops/conv.py, ops/fc.py cost functions), bytes are the int8 tensors'
own (1 byte per element, 4 for the bias).
"""
from __future__ import annotations

from math import prod

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops import conv
from placer.ops.int8_base import (Int8Tensor, dequantize, f32, int8_input, qnnpack_zero_point,
                                  quantize, quantize_scalar, requantization_scale, requantize)
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType, shape_str

CPU = frozenset({"cpu"})


def _y_quantization(args: Args) -> tuple[float, int]:
    """The output's (``Y_scale``, ``Y_zero_point``), defaults 1 and 0 as in Caffe2."""
    return float(f32(args.float("Y_scale", 1.0))), args.int("Y_zero_point", 0)


def _check_dtype(args: Args, t: TensorType, position: int, what: str, dtype: str) -> None:
    if t.dtype != dtype:
        raise ShapeError(f"op {args.op}: input {position} ({what}) must be an Int8 tensor of "
                         f"{dtype}, found {t.dtype} {shape_str([t])}")


# ---------------------------------------------------------------- Int8Quantize / Int8Dequantize

def _quantize_infer(inputs, args: Args):
    if inputs[0].dtype != "float32":
        raise ShapeError(f"op {args.op}: Int8Quantize takes a float32 X, found {inputs[0].dtype}")
    _y_quantization(args)
    return [TensorType(inputs[0].shape, "uint8")]


def _quantize_kernel(xp, inputs, args: Args):
    scale, zero_point = _y_quantization(args)
    return (Int8Tensor(quantize(xp, inputs[0], scale, zero_point), scale, zero_point),)


def _dequantize_infer(inputs, args: Args):
    _check_dtype(args, inputs[0], 0, "X", "uint8")
    return [TensorType(inputs[0].shape, "float32")]


def _dequantize_kernel(xp, inputs, args: Args):
    x = int8_input(inputs[0], args.op, 0, "X")
    _check_dtype(args, TensorType(x.shape, str(x.dtype)), 0, "X", "uint8")
    return (dequantize(xp, x.data, x.scale, x.zero_point),)


# Int8Quantize's temporaries: the float32 quotient and its rounding, the float64 and int64
# conversions and the wrapped sum, ~21 bytes per output byte under tracemalloc (2^20
# values); 24 leaves room.
QUANTIZE_SCRATCH = 24.0


def _elementwise_cost(inputs, outputs, args) -> OpFeatures:
    """One multiply (and a round) per element."""
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(outputs[0].size), bytes_read=read, bytes_written=written)


register(OpDef("Int8Quantize", _quantize_infer, _quantize_kernel, cost=_elementwise_cost,
               devices=CPU, min_inputs=1, max_inputs=1, scratch=QUANTIZE_SCRATCH,
               doc="float32 X -> Int8 Y = clamp(Y_zero_point + round(X / Y_scale), 0, 255)"))
register(OpDef("Int8Dequantize", _dequantize_infer, _dequantize_kernel, cost=_elementwise_cost,
               devices=CPU, min_inputs=1, max_inputs=1,
               doc="Int8 X -> float32 (X - zero_point) * scale"))


# ---------------------------------------------------------------- Int8 fills

def _fill_shape(args: Args) -> tuple[int, ...]:
    shape = tuple(args.ints("shape", []))
    if any(d < 0 for d in shape):
        raise ArgumentError(f"op {args.op}: 'shape' {list(shape)} has a negative dimension")
    return shape


def _byte_values(args: Args) -> bytes:
    """Int8GivenTensorFill's ``values``: one string argument whose bytes are the uint8s (the
    loader gives it as text when the bytes are valid UTF-8, which encodes back losslessly)."""
    raw = args.get("values", b"")
    if isinstance(raw, str):
        return raw.encode("utf-8")
    if isinstance(raw, bytes):
        return raw
    raise ArgumentError(f"op {args.op}: Int8GivenTensorFill 'values' must be one string of bytes "
                        f"(arg s), found {type(raw).__name__}"[:200],
                        hint="Caffe2 reads it with GetSingleArgument<string>")


def _int_values(args: Args) -> np.ndarray:
    values = args.ints("values", [])
    bad = next((v for v in values if not -2 ** 31 <= v < 2 ** 31), None)
    if bad is not None:
        raise ArgumentError(f"op {args.op}: Int8GivenIntTensorFill value {bad} does not fit int32")
    return np.asarray(values, dtype=np.int32)


def _check_count(args: Args, op_type: str, shape, n: int) -> None:
    if prod(shape) != n:
        raise ShapeError(f"op {args.op}: {op_type} shape {list(shape)} holds {prod(shape)} values, "
                         f"'values' has {n}")


def _byte_fill_infer(inputs, args: Args):
    shape = _fill_shape(args)
    _check_count(args, "Int8GivenTensorFill", shape, len(_byte_values(args)))
    _y_quantization(args)
    return [TensorType(shape, "uint8")]


def _byte_fill_kernel(xp, inputs, args: Args):
    shape = _fill_shape(args)
    data = np.frombuffer(_byte_values(args), dtype=np.uint8)
    _check_count(args, "Int8GivenTensorFill", shape, data.size)
    scale, zero_point = _y_quantization(args)
    return (Int8Tensor(xp.asarray(data.reshape(shape)).copy(), scale, zero_point),)


def _int_fill_infer(inputs, args: Args):
    shape = _fill_shape(args)
    _check_count(args, "Int8GivenIntTensorFill", shape, _int_values(args).size)
    _y_quantization(args)
    return [TensorType(shape, "int32")]


def _int_fill_kernel(xp, inputs, args: Args):
    shape = _fill_shape(args)
    data = _int_values(args)
    _check_count(args, "Int8GivenIntTensorFill", shape, data.size)
    scale, zero_point = _y_quantization(args)
    return (Int8Tensor(xp.asarray(data.reshape(shape)), scale, zero_point),)


def _fill_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(bytes_written=float(sum(t.nbytes for t in outputs)))


register(OpDef("Int8GivenTensorFill", _byte_fill_infer, _byte_fill_kernel, cost=_fill_cost,
               devices=CPU, min_inputs=0, max_inputs=0,
               doc="Int8 uint8 tensor from the bytes of the string 'values', shape, Y_scale, Y_zero_point"))
register(OpDef("Int8GivenIntTensorFill", _int_fill_infer, _int_fill_kernel, cost=_fill_cost,
               devices=CPU, min_inputs=0, max_inputs=0,
               doc="Int8 int32 tensor (a bias) from the ints 'values', shape, Y_scale, Y_zero_point"))


# ---------------------------------------------------------------- Int8Conv / Int8ConvRelu

def _nhwc(args: Args, op_type: str) -> None:
    """NHWC order and an explicit kernel size: Caffe2's Int8 ops take neither from elsewhere
    (ConvPoolOpBase enforces kernel > 0 when no kernel argument is given)."""
    if not any(k in args for k in ("kernel", "kernels", "kernel_h", "kernel_w")):
        raise ArgumentError(f"op {args.op}: {op_type} needs its kernel size as an argument "
                            "(Caffe2 does not take it from the Int8 filter)",
                            hint="set 'kernel' or 'kernel_h'/'kernel_w'")
    if args.str("order", "NCHW").upper() != "NHWC":
        raise ArgumentError(f"op {args.op}: {op_type} only supports order NHWC "
                            f"(found {args.str('order', 'NCHW')!r}; Caffe2's default NCHW is refused)",
                            hint="add arg { name: \"order\" s: \"NHWC\" }")


def _check_int8_types(inputs, args: Args) -> None:
    for i, (what, dtype) in enumerate((("X", "uint8"), ("W", "uint8"), ("B", "int32"))):
        _check_dtype(args, inputs[i], i, what, dtype)


def _conv_infer(op_type: str):
    def infer(inputs, args: Args):
        _nhwc(args, op_type)
        _check_int8_types(inputs, args)
        _y_quantization(args)
        (y,) = conv.conv_infer(inputs, args)
        return [TensorType(y.shape, "uint8")]
    return infer


def _conv_cost(inputs, outputs, args: Args) -> OpFeatures:
    return conv.conv_cost(inputs, outputs, args)


def _scratch(inputs, outputs, args: Args) -> float:
    """Temporaries of the conv and FC kernels: float64 copies of X and W and the float
    kernel's padded / phase copies of them (4 x 8 bytes per element), then per output
    element the float64 accumulator, the float kernel's own temporaries and the int64 steps
    of the requantization (80 bytes). tracemalloc saw at most 18.9 MB where this gives 30 MB
    (3x3 conv, 4x32x32x64 -> 64), 8.7 of 11.3 MB (7x7/2, 64 -> 16), 14.6 of 35 MB (FC
    256x1024 by 512x1024), 9.5 of 13.8 MB (3x3/2 transpose, 4x16x16x64 -> 32).
    ConvTranspose also holds every tap of every input pixel, X.size * W.size / C^2 values."""
    x, w, y = inputs[0], inputs[1], outputs[0]
    return 32.0 * (x.size + w.size) + 80.0 * y.size


def _transpose_scratch(inputs, outputs, args: Args) -> float:
    x, w = inputs[0], inputs[1]
    return _scratch(inputs, outputs, args) + 8.0 * x.size * w.size / max(w.shape[0], 1) ** 2


def _centred(xp, t: Int8Tensor, op: str, what: str):
    """The data less its zero point, as exact float64 integers."""
    zp = qnnpack_zero_point(op, what, t.zero_point)
    return t.data.astype(xp.float64) - float(zp)


def _bias(xp, b: Int8Tensor):
    return b.data.astype(xp.float64).reshape(-1)


def _output(xp, acc, x: Int8Tensor, w: Int8Tensor, args: Args, relu: bool) -> Int8Tensor:
    """Requantize exact accumulators (float64 integers) to Y's scale and zero point."""
    y_scale, y_zp = _y_quantization(args)
    scale = requantization_scale(args.op, x.scale, w.scale, y_scale)
    qnnpack_zero_point(args.op, "output (Y_zero_point)", y_zp)
    qmin = quantize_scalar(y_scale, y_zp, 0.0) if relu else 0
    acc = xp.rint(acc).astype(xp.int64)
    acc = ((acc + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)       # QNNPACK accumulates in int32
    return Int8Tensor(requantize(xp, acc, scale, y_zp, qmin, 255), y_scale, y_zp)


def _int8_args(inputs, args: Args, op_type: str):
    x = int8_input(inputs[0], args.op, 0, "X")
    w = int8_input(inputs[1], args.op, 1, "W")
    b = int8_input(inputs[2], args.op, 2, "B")
    _nhwc(args, op_type)
    _check_int8_types([TensorType(t.shape, str(t.dtype)) for t in (x, w, b)], args)
    return x, w, b


def _conv_kernel(op_type: str, relu: bool):
    def kernel(xp, inputs, args: Args):
        x, w, b = _int8_args(inputs, args, op_type)
        xc, wc = _centred(xp, x, args.op, "input X"), _centred(xp, w, args.op, "weight W")
        (acc,) = conv.conv_kernel(xp, [xc, wc, _bias(xp, b)], args)
        return (_output(xp, acc, x, w, args, relu),)
    return kernel


for _type, _relu in (("Int8Conv", False), ("Int8ConvRelu", True)):
    register(OpDef(_type, _conv_infer(_type), _conv_kernel(_type, _relu), cost=_conv_cost,
                   devices=CPU, min_inputs=3, max_inputs=3, scratch=_scratch,
                   doc="quantized NHWC 2-D convolution (QNNPACK): Int8 X, W (M, kH, kW, C/group), "
                       "int32 B -> Int8 Y (Y_scale, Y_zero_point)" + (", fused Relu" if _relu else "")))


# ---------------------------------------------------------------- Int8ConvTranspose

def _transpose_args(args: Args) -> Args:
    """Caffe2's Int8ConvTranspose runs one group whatever ``group`` says."""
    values = {k: args[k] for k in args if k != "group"}
    return Args(values, op=args.op, seed=args.seed, n_outputs=args.n_outputs)


def _transpose_infer(inputs, args: Args):
    _nhwc(args, "Int8ConvTranspose")
    _check_int8_types(inputs, args)
    _y_quantization(args)
    (y,) = conv.conv_transpose_infer(inputs, _transpose_args(args))
    return [TensorType(y.shape, "uint8")]


def _transpose_cost(inputs, outputs, args: Args) -> OpFeatures:
    return conv.conv_transpose_cost(inputs, outputs, _transpose_args(args))


def _transpose_kernel(xp, inputs, args: Args):
    x, w, b = _int8_args(inputs, args, "Int8ConvTranspose")
    xc, wc = _centred(xp, x, args.op, "input X"), _centred(xp, w, args.op, "weight W")
    (acc,) = conv.conv_transpose_kernel(xp, [xc, wc, _bias(xp, b)], _transpose_args(args))
    return (_output(xp, acc, x, w, args, False),)


register(OpDef("Int8ConvTranspose", _transpose_infer, _transpose_kernel, cost=_transpose_cost,
               devices=CPU, min_inputs=3, max_inputs=3, scratch=_transpose_scratch,
               doc="quantized NHWC 2-D transposed convolution (QNNPACK): Int8 X, W (C, kH, kW, M), "
                   "int32 B -> Int8 Y"))


# ---------------------------------------------------------------- Int8FC

def _fc_dims(inputs, args: Args) -> tuple[int, int, int]:
    """(M, K, N) of an Int8FC: X as (X.dims[0], rest), W (N, K), B of N values."""
    x, w, b = inputs
    if x.ndim < 1 or w.ndim != 2:
        raise ShapeError(f"op {args.op}: Int8FC takes X of rank >= 1 and a 2-D W (N, K), found "
                         f"X {shape_str([x])}, W {shape_str([w])}")
    k, n = prod(x.shape[1:]), w.shape[0]
    if w.shape[1] != k:
        raise ShapeError(f"op {args.op}: Int8FC input X {shape_str([x])} has K={k} per row but W "
                         f"{shape_str([w])} has K={w.shape[1]}")
    if b.size != n:
        raise ShapeError(f"op {args.op}: Int8FC bias B {shape_str([b])} should hold N={n} values "
                         f"(rows of W {shape_str([w])})")
    return x.shape[0], k, n


def _fc_infer(inputs, args: Args):
    _check_int8_types(inputs, args)
    _y_quantization(args)
    m, _, n = _fc_dims(inputs, args)
    return [TensorType((m, n), "uint8")]


def _fc_cost(inputs, outputs, args: Args) -> OpFeatures:
    m, k, n = _fc_dims(inputs, args)
    macs = float(m * k * n)
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=2 * macs + float(m * n), macs=macs, bytes_read=read, bytes_written=written)


def _fc_kernel(xp, inputs, args: Args):
    x = int8_input(inputs[0], args.op, 0, "X")
    w = int8_input(inputs[1], args.op, 1, "W")
    b = int8_input(inputs[2], args.op, 2, "B")
    types = [TensorType(t.shape, str(t.dtype)) for t in (x, w, b)]
    _check_int8_types(types, args)
    m, k, _ = _fc_dims(types, args)
    xc, wc = _centred(xp, x, args.op, "input X"), _centred(xp, w, args.op, "weight W")
    acc = xp.matmul(xc.reshape(m, k), wc.T) + _bias(xp, b)
    return (_output(xp, acc, x, w, args, False),)


register(OpDef("Int8FC", _fc_infer, _fc_kernel, cost=_fc_cost, devices=CPU, min_inputs=3, max_inputs=3,
               scratch=_scratch,
               doc="quantized fully connected (QNNPACK): Int8 X (M, K...), W (N, K), int32 B -> Int8 Y (M, N)"))
