"""Op family 'half': float16 casts, fills and update, and placer's own bfloat16 casts.

Caffe2 1.8.1 (caffe2/operators/half_float_ops.{h,cc,cu}, caffe2/sgd/fp16_momentum_sgd_op.{h,cu}):

- FloatToHalf(X float32) -> float16, round to nearest even (c10::Half on the reference path,
  F16C ``vcvtps2ph`` through fbgemm on AVX2; the oracle agrees with numpy's ``astype`` bit
  for bit on every non-NaN float32, overflow to inf and subnormals included). A NaN keeps
  the top 10 payload bits and gets the quiet bit (0x0200) set, as ``vcvtps2ph`` does
  (numpy does not set it, so the kernel does). ``clip=1`` clamps to +-65504 first, and a
  NaN then becomes +65504 (fbgemm's min-then-max order). fbgemm converts 8 values at a
  time and the last ``size % 8`` with its scalar code, where a NaN becomes 0x7FFF (with
  ``clip``: std::max(-65504, std::min(x, 65504)) = -65504); the kernel does the same, so
  NaN bits too match the CPU oracle (AVX2). Caffe2's CUDA kernel ignores ``clip`` and
  writes __float2half's NaN; placer applies the CPU rules on every device.
- HalfToFloat(X float16) -> float32, exact; a NaN gets the float32 quiet bit (0x00400000),
  as ``vcvtph2ps`` does, and is 0x7FFFFFFF in the scalar tail (last ``size % 8``).
- Float16ConstantFill(): ``value`` (a float argument, default 0; an integer ``value`` is
  an error, as in Caffe2) read as float32 and rounded to float16, in the ``shape``
  argument (default: a 0-d tensor). No inputs. CPU only in Caffe2 (no CUDA registration in
  half_float_ops.cu); placer's kernel runs on both.
- Float16UniformFill(): uniform float32 values in [min, max) (defaults 0 and 1; min < max
  or an error) rounded to float16, so max itself can occur, as in Caffe2. ``shape`` needs
  a first dimension > 0: Caffe2 divides by it (a 0-d shape is an error there, a zero first
  dimension a crash). Drawn on the host from ``args.seed`` (same values on every device).
- GivenTensorFp16Fill(): the float ``values`` rounded (float32, then float16) in the
  ``shape`` argument (default: one dimension, the number of values). Caffe2 1.8.1 has no
  such op (neither its CPU nor its CUDA library names it); nets written for other
  Caffe2-based runtimes use it, and placer's reader knows its dtype
  (formats/caffe2.py), so placer runs it, with ``caffe2_devices`` empty.
- FP16MomentumSGDUpdate(grad, moment, lr, param) -> (grad', moment', param'): CUDA only in
  Caffe2 (fp16_momentum_sgd_op.cu); placer's kernel runs on both. Arguments momentum
  (default 0), nesterov, weight_decay (default 0), fp32_update. As the .cu computes it:
  * fp32_update=0: lr, momentum and weight_decay rounded to float16, then every step a
    float16 operation, each fused multiply-add rounded once:
    g1 = fma(wd, p, g); plain: m' = g' = fma(lr, g1, mom*m), p' = p - g';
    nesterov: mm = mom*m, m' = fma(lr, g1, mm), g' = fma(m', mom, m') - mm, p' = p - g'.
    The CUDA loop works on pairs; an odd last element is updated by the thread of pair 0
    only when there is a pair (one element alone is never updated), and with nesterov its
    parameter is p'[0] - g'[N-1] (the .cu reads ``param_half[i]`` with i = 0 there).
  * fp32_update=1: the float16 values read as float32, the same formulas in float32
    (``__fmaf_rn``, ``__fmul_rn``, ``__fsub_rn``), m', g', p' rounded to float16 at the
    end. This kernel has no odd-element tail: with N odd the last element is not updated.
  An element the CUDA kernel does not update keeps its input value here (Caffe2 runs the
  op in place, so it is left as it was).
  Each fused multiply-add is computed in float64 and rounded once to float16 (through
  float32 rounded to odd, ``to_half_once``) or to float32. The product is exact in float64
  (11 + 11 or 24 + 24 bits); the sum with the addend is exact too unless the addend is
  below about 2^-30 (float16) or 2^-5 (float32) of the product's last bit, and then it is
  off only where the product lies exactly on a tie of the target format and the lost
  addend would have broken the tie: a 1-ulp difference from the CUDA kernel there.

placer only, for the amp-bf16 precision mode (Caffe2 has no bfloat16 and numpy has no
bfloat16 dtype):

- FloatToBFloat16(X float32) -> uint16: the upper 16 bits of the float32 after rounding
  to nearest even on the lower 16 (as PyTorch's c10::BFloat16 rounds); a NaN becomes the
  quiet NaN with the top 7 payload bits kept (bits >> 16 | 0x0040); overflow rounds to inf.
- BFloat16ToFloat(X uint16) -> float32: the bits shifted up by 16, exact.
  A bfloat16 blob has dtype "bfloat16" in shape inference (2 bytes per value in costs,
  memory and copies; the GPU cost model prices work on it at the bfloat16 peak) and is a
  uint16 array of the bits at run time. Only these casts run on it: placer's executor
  refuses any other op reading one (numpy and cupy have no bfloat16 arithmetic), so an
  amp-bf16 net plans but does not run.
  ``caffe2_devices`` is empty: no Caffe2 build can run a net holding these ops.

Costs: a cast or a fill is one operation per output element plus its bytes; the update
counts its float16 operations per element (6, nesterov 9; an fma 2).
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

from placer.errors import ArgumentError
from placer.ops.elementwise import shape_error
from placer.ops.fill import fill_cost, fill_shape, random_fill_cost
from placer.ops.registry import OpDef, default_cost, io_bytes, register
from placer.types import Args, OpFeatures, TensorType

FP16_MAX = 65504.0
NO_CAFFE2 = frozenset()


def _need(args: Args, t: TensorType, dtype: str, index: int, name: str) -> None:
    if t.dtype != dtype:
        raise shape_error(args, f"{name} must be {dtype}, found {t.dtype}", (index, name, t))


# ---------------------------------------------------------------- casts
def _cast_infer(src: str, dst: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        _need(args, inputs[0], src, 0, "X")
        return [TensorType(inputs[0].shape, dst)]
    return infer


def _vector_part(x) -> int:
    """Elements fbgemm's AVX2 conversions do 8 at a time; the last ``size % 8`` go
    through its scalar code, which treats NaN differently (module docstring)."""
    return x.size - x.size % 8


def _float_to_half(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    nan = xp.isnan(x)
    clip = args.bool("clip", False)
    if clip:
        x = xp.where(nan, xp.float32(FP16_MAX), xp.clip(x, -FP16_MAX, FP16_MAX))
    with np.errstate(over="ignore"):          # beyond 65504 rounds to inf, as in Caffe2
        y = x.astype(xp.float16)
    bits = y.view(xp.uint16) | (nan.astype(xp.uint16) << 9)   # the quiet bit on NaNs
    cut = _vector_part(bits)
    if cut < bits.size:
        flat, tail_nan = bits.reshape(-1), nan.reshape(-1)[cut:]
        flat[cut:] = xp.where(tail_nan, xp.uint16(0xFBFF if clip else 0x7FFF), flat[cut:])
    return (bits.view(xp.float16),)


def _half_to_float(xp, inputs, args: Args) -> tuple:
    h = inputs[0]
    nan = xp.isnan(h)
    bits = h.astype(xp.float32).view(xp.uint32) | (nan.astype(xp.uint32) << 22)
    cut = _vector_part(bits)
    if cut < bits.size:
        flat = bits.reshape(-1)
        flat[cut:] = xp.where(nan.reshape(-1)[cut:], xp.uint32(0x7FFFFFFF), flat[cut:])
    return (bits.view(xp.float32),)


def float_to_bfloat16(xp, x):
    """float32 -> bfloat16 bits (uint16): round to nearest even; NaN quiet."""
    bits = x.view(xp.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    quiet = (bits >> 16) | 0x0040
    return xp.where(xp.isnan(x), quiet, rounded).astype(xp.uint16)


def bfloat16_to_float(xp, b):
    """bfloat16 bits (uint16) -> float32, exact."""
    return (b.astype(xp.uint32) << 16).view(xp.float32)


# ---------------------------------------------------------------- fills
def _round_half(values) -> np.ndarray:
    """Host values read as float32 (Caffe2's float arguments), then rounded to float16;
    beyond the range they become inf, as in Caffe2."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).astype(np.float16)


def _shape_arg(op_type: str, args: Args) -> tuple[int, ...]:
    shape = fill_shape(op_type, None, None, args)
    if any(d < 0 for d in shape):
        raise ArgumentError(f"op {args.op}: {op_type} shape {list(shape)} has a negative dimension")
    return shape


def _constant_value(args: Args) -> np.float16:
    value = args.get("value", 0.0)
    if not isinstance(value, (float, np.floating)):
        raise ArgumentError(f"op {args.op}: Float16ConstantFill 'value' must be a float argument, "
                            f"found {value!r}"[:200])
    return _round_half(value)[()]


def _constant_infer(inputs, args: Args) -> list[TensorType]:
    _constant_value(args)
    return [TensorType(_shape_arg("Float16ConstantFill", args), "float16")]


def _constant_kernel(xp, inputs, args: Args) -> tuple:
    return (xp.full(_shape_arg("Float16ConstantFill", args), _constant_value(args), dtype=xp.float16),)


def _uniform_checked(args: Args) -> tuple[tuple[int, ...], float, float]:
    shape = _shape_arg("Float16UniformFill", args)
    lo, hi = args.float("min", 0.0), args.float("max", 1.0)
    if not np.float32(lo) < np.float32(hi):
        raise ArgumentError(f"op {args.op}: Float16UniformFill needs min < max, found {lo}, {hi}")
    if not shape or shape[0] == 0:
        raise ArgumentError(f"op {args.op}: Float16UniformFill needs a shape with a first dimension > 0 "
                            f"(Caffe2 divides by it), found {list(shape)}")
    return shape, lo, hi


def _uniform_infer(inputs, args: Args) -> list[TensorType]:
    return [TensorType(_uniform_checked(args)[0], "float16")]


def _uniform_kernel(xp, inputs, args: Args) -> tuple:
    shape, lo, hi = _uniform_checked(args)
    rng = np.random.default_rng(args.seed)
    values = rng.uniform(lo, hi, shape).astype(np.float32)
    values = np.minimum(values, np.nextafter(np.float32(hi), np.float32(lo)))  # [min, max) in float32
    return (xp.asarray(_round_half(values)),)


def _given_values(args: Args) -> np.ndarray:
    return _round_half(args.floats("values"))


def _given_shape(args: Args, n: int) -> tuple[int, ...]:
    if "shape" not in args:
        return (n,)
    shape = _shape_arg("GivenTensorFp16Fill", args)
    if prod(shape) != n:
        raise shape_error(args, f"GivenTensorFp16Fill shape {list(shape)} holds {prod(shape)} values, "
                          f"'values' has {n}")
    return shape


def _given_infer(inputs, args: Args) -> list[TensorType]:
    return [TensorType(_given_shape(args, _given_values(args).size), "float16")]


def _given_kernel(xp, inputs, args: Args) -> tuple:
    values = _given_values(args)
    return (xp.asarray(values.reshape(_given_shape(args, values.size))),)


# ---------------------------------------------------------------- FP16MomentumSGDUpdate
def to_half_once(xp, v):
    """float64 ``v`` rounded once to float16: to float32 rounded to odd (truncated, the
    last bit set when inexact), then to nearest even; exact because float32 has at least
    two more bits than float16's 11 (Boldo and Melquiond, round-to-odd)."""
    f = v.astype(xp.float32)
    back = f.astype(xp.float64)
    bits = f.view(xp.uint32) - (xp.abs(back) > xp.abs(v)).astype(xp.uint32)   # toward zero
    bits = bits | (back != v).astype(xp.uint32)
    with np.errstate(over="ignore"):
        return bits.view(xp.float32).astype(xp.float16)


def _sgd_infer(inputs, args: Args) -> list[TensorType]:
    g, m, lr, p = inputs
    for i, name in ((0, "grad"), (1, "moment"), (3, "param")):
        _need(args, inputs[i], "float16", i, name)
    _need(args, lr, "float32", 2, "lr")
    if lr.size != 1:
        raise shape_error(args, "lr must hold exactly one value", (2, "lr", lr))
    for i, name, t in ((1, "moment", m), (3, "param", p)):
        if t.size != g.size:
            raise shape_error(args, f"grad and {name} must have the same number of elements",
                              (0, "grad", g), (i, name, t))
    return [g, m, p]


def _sgd_kernel(xp, inputs, args: Args) -> tuple:
    g, m, lr, p = inputs
    shape_g, shape_m, shape_p = g.shape, m.shape, p.shape
    f64 = xp.float64
    g, m, p = (a.reshape(-1).astype(f64) for a in (g, m, p))
    n = g.size
    nesterov = args.bool("nesterov", False)
    if args.bool("fp32_update", False):
        def r(v):
            return v.astype(xp.float32).astype(f64)
        mom, wd = (np.float64(np.float32(args.float(k, 0.0))) for k in ("momentum", "weight_decay"))
        rate = lr.reshape(()).astype(f64)
        done = n - n % 2                      # no odd-element tail in the float32 kernel
    else:
        def r(v):
            return to_half_once(xp, v).astype(f64)
        mom, wd = (np.float64(np.float32(args.float(k, 0.0)).astype(np.float16))
                   for k in ("momentum", "weight_decay"))
        rate = lr.reshape(()).astype(xp.float16).astype(f64)
        done = n if n >= 2 else 0             # the tail runs in the thread of pair 0
    g1 = r(wd * p + g)
    mm = r(mom * m)
    new_m = r(rate * g1 + mm)
    new_g = r(r(new_m * mom + new_m) - mm) if nesterov else new_m
    new_p = r(p - new_g)
    if nesterov and not args.bool("fp32_update", False) and n % 2 and n >= 3:
        new_p[-1:] = r(new_p[:1] - new_g[-1:])
    outs = []
    for new, old, shape in ((new_g, g, shape_g), (new_m, m, shape_m), (new_p, p, shape_p)):
        if done < n:
            new[done:] = old[done:]
        outs.append(new.astype(xp.float16).reshape(shape))
    return tuple(outs)


def _sgd_cost(inputs, outputs, args) -> OpFeatures:
    read, written = io_bytes(inputs, outputs)
    per = 9.0 if (args if isinstance(args, Args) else Args(args)).bool("nesterov", False) else 6.0
    return OpFeatures(flops=per * inputs[0].size, bytes_read=read, bytes_written=written)


def _sgd_launches(inputs, args: Args) -> int:
    """Counted on the strict cupy stand-in: each rounding to float16 is 9 launches (``to_half_once``)."""
    nesterov, odd = args.bool("nesterov", False), inputs[0].size % 2 or inputs[0].size < 2
    if args.bool("fp32_update", False):
        return 21 + 7 * nesterov + 3 * bool(odd)
    return 62 + 27 * nesterov + (3 + 11 * nesterov) * bool(odd)


# ---------------------------------------------------------------- registrations
register(OpDef("FloatToHalf", _cast_infer("float32", "float16"), _float_to_half, default_cost,
               min_inputs=1, max_inputs=1, launches=lambda i, a: 5 + 2 * a.bool("clip", False) + 2 * bool(i[0].size % 8),
               doc="float32 -> float16, round to nearest even (clip=1: clamp to +-65504 first)"))
register(OpDef("HalfToFloat", _cast_infer("float16", "float32"), _half_to_float, default_cost,
               min_inputs=1, max_inputs=1, launches=lambda i, a: 5 + 2 * bool(i[0].size % 8),
               doc="float16 -> float32, exact"))
register(OpDef("Float16ConstantFill", _constant_infer, _constant_kernel, fill_cost,
               caffe2_devices=frozenset({"cpu"}), min_inputs=0, max_inputs=0,
               doc="float16 'value' (a float) in 'shape'; Caffe2 has it on the CPU only"))
register(OpDef("Float16UniformFill", _uniform_infer, _uniform_kernel, random_fill_cost,
               min_inputs=0, max_inputs=0, doc="float16 uniform [min, max) in 'shape' (seeded)"))
register(OpDef("GivenTensorFp16Fill", _given_infer, _given_kernel, fill_cost, caffe2_devices=NO_CAFFE2,
               min_inputs=0, max_inputs=0, doc="float16 'values' (not an op of Caffe2 1.8.1)"))
register(OpDef("FP16MomentumSGDUpdate", _sgd_infer, _sgd_kernel, _sgd_cost,
               caffe2_devices=frozenset({"gpu"}), min_inputs=4, max_inputs=4, launches=_sgd_launches,
               doc="(grad, moment, lr, param) -> (grad', moment', param') in float16, as Caffe2's "
                   "CUDA kernel (fp32_update: float32 arithmetic)"))
register(OpDef("FloatToBFloat16", _cast_infer("float32", "bfloat16"),
               lambda xp, inputs, args: (float_to_bfloat16(xp, inputs[0]),), default_cost,
               caffe2_devices=NO_CAFFE2, min_inputs=1, max_inputs=1, launches=10,
               doc="float32 -> bfloat16 bits (uint16), round to nearest even; placer only"))
register(OpDef("BFloat16ToFloat", _cast_infer("bfloat16", "float32"),
               lambda xp, inputs, args: (bfloat16_to_float(xp, inputs[0]),), default_cost,
               caffe2_devices=NO_CAFFE2, min_inputs=1, max_inputs=1, launches=2,
               doc="bfloat16 bits (uint16) -> float32, exact; placer only"))
