"""The quantized tensor of Caffe2's Int8 ops, shared by the Int8 op families.

Caffe2's ``Int8TensorCPU`` (caffe2/core/tensor_int8.h) is a tensor of ``uint8`` values
(``int32`` for a bias filled by ``Int8GivenIntTensorFill``) with one per-tensor ``scale``
and ``zero_point``: the real value of ``q`` is ``scale * (q - zero_point)``. Every op that
writes one takes the output's quantization from its own arguments (``Y_scale``,
``Y_zero_point``); the ops that read one take the input's from the tensor. The runtime
therefore carries an ``Int8Tensor`` as a blob's value: the array with its two numbers.

The shape pass sees only the array part (``TensorType`` of dtype ``uint8`` or ``int32``):
costs and memory follow the bytes; scale and zero point are values, like the data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from placer.errors import ArgumentError


@dataclass(frozen=True)
class Int8Tensor:
    """``data`` (uint8 or int32 array, numpy or cupy), ``scale`` (float32 in Caffe2,
    held as a Python float of that value) and ``zero_point`` (int)."""

    data: Any
    scale: float
    zero_point: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def ndim(self) -> int:
        return int(self.data.ndim)


# ---------------------------------------------------------------- quantization arithmetic
#
# Caffe2's Int8 ops (caffe2/operators/quantized/) quantize and dequantize with the scalar
# helpers of int8_utils.h, and run Conv, ConvTranspose and FC through QNNPACK (the
# third_party/QNNPACK of torch 1.8.1: qnnp_create_convolution2d_nhwc_q8,
# qnnp_create_deconvolution2d_nhwc_q8, qnnp_create_fully_connected_nc_q8). QNNPACK sums
# (x - x_zero_point) * (w - w_zero_point) exactly in int32, adds the int32 bias, and
# requantizes with src/qnnpack/requantization.h (qnnp_compute_conv_quantization_params)
# as its x86 SSE2 micro-kernels apply it (src/q8gemm/4x4c2-sse2.c, q8conv, q8dw):
#
#   scale       = x_scale * w_scale / y_scale, in float32, which must be < 1;
#   multiplier  = (mantissa bits of scale | 1 << 23) << 7    (in [2^30, 2^31));
#   shift       = 126 - (biased exponent of scale)           (in [0, 31]);
#   q31         = (acc * multiplier + 2^30) >> 31             (64-bit product, low 32 bits);
#   remainder   = (q31 & (2^shift - 1)) - (q31 < 0);
#   out         = (q31 >> shift) + (remainder > (2^shift - 1) >> 1);
#   y           = clamp(sat16(sat16(out) + y_zero_point) to 0..255, output_min, output_max).
#
# The two roundings (half up on the 31-bit product, half away from zero on the shift)
# differ from a float round(acc * scale) (half to even) on ties and near ties: about 3 in
# 10,000 outputs of random cases, half the ties where the scale is a power of two. The
# tests hold placer to Caffe2 bit for bit on both kinds of case.

UINT8_MIN, UINT8_MAX = 0, 255


def f32(value) -> np.float32:
    """A Python number as the float32 Caffe2 holds (``GetSingleArgument<float>``)."""
    return np.float32(value)


def requantization_scale(op: str, x_scale, w_scale, y_scale) -> np.float32:
    """QNNPACK's ``input_scale * kernel_scale / output_scale`` in float32, with its checks:
    every scale finite, positive and normal, and the product below 1."""
    for what, s in (("input", x_scale), ("weight", w_scale), ("output (Y_scale)", y_scale)):
        s32 = f32(s)
        if not (np.isfinite(s32) and s32 > 0 and s32 >= np.finfo(np.float32).tiny):
            raise ArgumentError(f"op {op}: the {what} scale {float(s)!r} must be finite, positive "
                                "and normal (QNNPACK refuses it)")
    with np.errstate(over="ignore", under="ignore"):
        scale = f32(x_scale) * f32(w_scale) / f32(y_scale)
    if not scale < 1:
        raise ArgumentError(f"op {op}: requantization scale X_scale * W_scale / Y_scale = "
                            f"{float(scale):.7g} must be < 1 (QNNPACK refuses it)",
                            hint="raise Y_scale")
    if scale < np.float32(2.0 ** -32):
        raise ArgumentError(f"op {op}: requantization scale {float(scale):.7g} is below 2^-32 "
                            "(outside QNNPACK's range)")
    return scale


def qnnpack_zero_point(op: str, what: str, zero_point: int) -> int:
    """A zero point QNNPACK takes (a uint8): 0..255, else an ArgumentError naming it."""
    if not UINT8_MIN <= int(zero_point) <= UINT8_MAX:
        raise ArgumentError(f"op {op}: {what} zero point {zero_point} is outside 0..255 "
                            "(QNNPACK holds zero points as uint8)")
    return int(zero_point)


def requantize(xp, acc, scale: np.float32, zero_point: int, qmin: int = UINT8_MIN,
               qmax: int = UINT8_MAX):
    """int32 accumulators -> uint8 with QNNPACK's fixed-point requantization (see above)."""
    bits = int(np.asarray(scale, dtype=np.float32).view(np.uint32))
    multiplier = ((bits & 0x007FFFFF) | 0x00800000) << 7
    shift = 127 + 31 - 32 - (bits >> 23)
    acc = acc.astype(xp.int64)
    q31 = (acc * multiplier + (1 << 30)) >> 31
    q31 = ((q31 + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)      # the low 32 bits, as int32
    mask = (1 << shift) - 1
    remainder = (q31 & mask) - (q31 < 0).astype(xp.int64)
    out = (q31 >> shift) + (remainder > (mask >> 1)).astype(xp.int64)
    out = xp.clip(xp.clip(out, -32768, 32767) + zero_point, -32768, 32767)   # packs, adds_epi16
    return xp.clip(out, max(qmin, UINT8_MIN), min(qmax, UINT8_MAX)).astype(xp.uint8)


def quantize(xp, x, scale, zero_point: int):
    """float32 -> uint8 as ``QuantizeUint8`` (int8_utils.h): zero_point + (int32)
    nearbyint(x / scale), clamped to 0..255. The float -> int32 conversion of a value
    outside int32 (or NaN) gives INT32_MIN on x86, and the sum wraps in int32, as in Caffe2."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        r = xp.rint(x.astype(xp.float32) / f32(scale))
        inside = (r >= -2.0 ** 31) & (r < 2.0 ** 31)
        q = xp.where(inside, r, -2.0 ** 31).astype(xp.int64)
    q = ((q + int(zero_point) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    return xp.clip(q, UINT8_MIN, UINT8_MAX).astype(xp.uint8)


def quantize_scalar(scale, zero_point: int, value: float) -> int:
    """``QuantizeUint8`` of one value (the lower bound of a fused Relu)."""
    return int(quantize(np, np.asarray([value], np.float32), scale, zero_point)[0])


def dequantize(xp, q, scale, zero_point: int):
    """uint8 -> float32 as ``Int8Dequantize``: (int32(q) - zero_point) * scale in float32."""
    return (q.astype(xp.int32) - np.int32(zero_point)).astype(xp.float32) * f32(scale)


def int8_input(value: Any, op: str, position: int, what: str) -> Int8Tensor:
    """Input ``position`` of an Int8 op, which must hold an ``Int8Tensor``."""
    if not isinstance(value, Int8Tensor):
        raise ArgumentError(f"op {op}: input {position} ({what}) must be an Int8 tensor (made by "
                            f"Int8Quantize or an Int8 fill), found {type(value).__name__}")
    return value
