"""Op family 'fill': the ops of init nets that create parameters and constants.

Shape rule shared by every fill (Caffe2's FillerOp): with no input, the ``shape``
argument; with one input, that input's shape (or, with ``input_as_shape=1``, the input's
int64 *values*, known only when run) followed by ``extra_shape``. Setting ``shape`` and
giving an input is an error, as in Caffe2. GivenTensor*Fill without ``shape`` takes the
number of values.

Random fills (Caffe2 formulas, checked against its filler_op.h):
- XavierFill: uniform(-s, s), s = sqrt(3 / fan_in), fan_in = size / shape[0];
- MSRAFill: normal(0, std), std = sqrt(2 / fan_out), fan_out = size / shape[1]
  (older Caffe2 releases drew uniform(+-sqrt(2 / fan_in)); the later formula is used);
- GaussianFill: normal(mean, std), defaults 0 and 1; UniformFill: uniform(min, max),
  defaults 0 and 1; UniformIntFill: integers in [min, max].
Values are drawn on the host with numpy's generator seeded from ``args.seed`` and then
moved to the kernel's array module, so a seed gives the same parameters on every device.
"""
from __future__ import annotations

from math import prod, sqrt
from typing import Sequence

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, register
from placer.types import DATA_TYPE_TO_DTYPE, Args, OpFeatures, TensorType, shape_str


def _fail(args: Args, op_type: str, inputs, what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


def fill_shape(op_type: str, input_shape: tuple | None, shape_values: list | None,
               args: Args) -> tuple[int, ...]:
    """The output shape from the input's shape (or values) or the ``shape`` argument."""
    extra = args.ints("extra_shape", [])
    if input_shape is None and shape_values is None:
        if extra or args.bool("input_as_shape", False):
            raise ArgumentError(f"op {args.op}: {op_type} extra_shape/input_as_shape need an input")
        return tuple(args.ints("shape", []))
    if "shape" in args:
        raise ArgumentError(f"op {args.op}: {op_type} takes a 'shape' argument or an input, not both")
    base = tuple(shape_values) if shape_values is not None else tuple(input_shape)
    return base + tuple(extra)


def _infer_shape(op_type: str, inputs: Sequence[TensorType], args: Args) -> tuple[int, ...] | None:
    if inputs and args.bool("input_as_shape", False):
        if inputs[0].ndim != 1:
            raise _fail(args, op_type, inputs, "input_as_shape needs a 1-D int64 input")
        if "shape" in args:
            raise ArgumentError(f"op {args.op}: {op_type} takes a 'shape' argument or an input, not both")
        return None  # the shape is in the input's values
    return fill_shape(op_type, inputs[0].shape if inputs else None, None, args)


def _kernel_shape(op_type: str, inputs, args: Args) -> tuple[int, ...]:
    if inputs and args.bool("input_as_shape", False):
        return fill_shape(op_type, None, [int(v) for v in inputs[0].reshape(-1).tolist()], args)
    return fill_shape(op_type, tuple(inputs[0].shape) if inputs else None, None, args)


def fill_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(bytes_written=float(sum(t.nbytes for t in outputs)))


def random_fill_cost(inputs, outputs, args) -> OpFeatures:
    """One operation per drawn value."""
    return OpFeatures(flops=float(sum(t.size for t in outputs)),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


# -- ConstantFill -------------------------------------------------------------------------

def constant_dtype(args: Args) -> str:
    """``dtype`` argument (TensorProto.DataType), else int64 for an integer ``value``, else float32."""
    if "dtype" in args:
        code = args.int("dtype")
        dtype = DATA_TYPE_TO_DTYPE.get(code)
        if dtype is None or dtype == "object":
            raise ArgumentError(f"op {args.op}: ConstantFill dtype {code} is not supported")
        return dtype
    value = args.get("value")
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return "int64"
    return "float32"


def infer_constant_fill(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    shape = _infer_shape("ConstantFill", inputs, args)
    return [None if shape is None else TensorType(shape, constant_dtype(args))]


def kernel_constant_fill(xp, inputs, args: Args) -> tuple:
    shape = _kernel_shape("ConstantFill", inputs, args)
    dtype = constant_dtype(args)
    return (xp.full(shape, np.array(args.get("value", 0)).astype(dtype).item(), dtype=dtype),)


# -- GivenTensor*Fill ---------------------------------------------------------------------

GIVEN_DTYPES = {
    "GivenTensorFill": "float32", "GivenTensorDoubleFill": "float64",
    "GivenTensorIntFill": "int32", "GivenTensorInt64Fill": "int64",
    "GivenTensorInt16Fill": "int16", "GivenTensorBoolFill": "bool",
}


def _given_values(op_type: str, args: Args) -> tuple[np.ndarray, str]:
    """The ``values`` argument as a flat host array of the op's dtype."""
    if op_type == "GivenTensorByteStringToUInt8Fill":
        raw = args.get("values")
        if not isinstance(raw, (list, tuple)) or len(raw) != 1:
            raise ArgumentError(f"op {args.op}: {op_type} needs 'values' holding exactly one string")
        if not isinstance(raw[0], (str, bytes)):
            raise ArgumentError(f"op {args.op}: {op_type} needs 'values' holding exactly one string, "
                                f"found {type(raw[0]).__name__} {raw[0]!r}"[:200])
        data = raw[0].encode("utf-8") if isinstance(raw[0], str) else raw[0]
        return np.frombuffer(data, dtype=np.uint8), "uint8"
    dtype = GIVEN_DTYPES[op_type]
    if op_type == "GivenTensorFill" and "dtype" in args:  # Caffe2 lets dtype pick the type
        dtype = DATA_TYPE_TO_DTYPE.get(args.int("dtype"), "float32")
    values = args.floats("values") if dtype.startswith("float") else args.ints("values")
    if values and dtype.startswith("int"):  # Caffe2 reads an argument only where the conversion is lossless
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        bad = next((v for v in values if not low <= v <= high), None)
        if bad is not None:
            raise ArgumentError(f"op {args.op}: {op_type} value {bad} does not fit {dtype} ({low}..{high})")
    return np.asarray(values, dtype=dtype), dtype


def _given_shape(op_type: str, n_values: int, input_shape, args: Args, inputs) -> tuple[int, ...]:
    if input_shape is None and "shape" not in args:
        return (n_values,)
    shape = fill_shape(op_type, input_shape, None, args)
    if prod(shape) != n_values:
        raise _fail(args, op_type, inputs, f"shape {list(shape)} holds {prod(shape)} values, "
                                           f"'values' has {n_values}")
    return shape


def given_infer(op_type: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        values, dtype = _given_values(op_type, args)
        shape = _given_shape(op_type, values.size, inputs[0].shape if inputs else None, args, inputs)
        return [TensorType(shape, dtype)]
    return infer


def given_kernel(op_type: str):
    def kernel(xp, inputs, args: Args) -> tuple:
        values, _ = _given_values(op_type, args)
        shape = _given_shape(op_type, values.size, tuple(inputs[0].shape) if inputs else None, args, ())
        return (xp.asarray(values.reshape(shape)),)
    return kernel


# -- random fills -------------------------------------------------------------------------

def _fan(op_type: str, shape: tuple[int, ...], axis: int, args: Args) -> int:
    if len(shape) <= axis or shape[axis] == 0:
        raise ShapeError(f"op {args.op}: {op_type} needs a shape with a non-zero dimension {axis}, "
                         f"found {list(shape)}")
    return prod(shape) // shape[axis]


def draw(op_type: str, shape: tuple[int, ...], args: Args) -> np.ndarray:
    """Host values for a random fill, reproducible from ``args.seed``."""
    rng = np.random.default_rng(args.seed)
    if op_type == "XavierFill":
        s = sqrt(3.0 / _fan(op_type, shape, 0, args))
        return rng.uniform(-s, s, shape).astype(np.float32)
    if op_type == "MSRAFill":
        std = sqrt(2.0 / _fan(op_type, shape, 1, args))
        return rng.normal(0.0, std, shape).astype(np.float32)
    if op_type == "GaussianFill":
        return rng.normal(args.float("mean", 0.0), args.float("std", 1.0), shape).astype(np.float32)
    if op_type == "UniformFill":
        lo, hi = args.float("min", 0.0), args.float("max", 1.0)
        if not lo < hi:
            raise ArgumentError(f"op {args.op}: UniformFill needs min < max, found {lo}, {hi}")
        return rng.uniform(lo, hi, shape).astype(np.float32)
    lo, hi = args.int("min", 0), args.int("max", 1)  # UniformIntFill: both ends included
    if not lo <= hi:
        raise ArgumentError(f"op {args.op}: UniformIntFill needs min <= max, found {lo}, {hi}")
    return rng.integers(lo, hi, shape, endpoint=True).astype(np.int32)


def random_infer(op_type: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
        shape = _infer_shape(op_type, inputs, args)
        if shape is None:
            return [None]
        if op_type in ("XavierFill", "MSRAFill"):
            _fan(op_type, shape, 0 if op_type == "XavierFill" else 1, args)
        return [TensorType(shape, "int32" if op_type == "UniformIntFill" else "float32")]
    return infer


def random_kernel(op_type: str):
    def kernel(xp, inputs, args: Args) -> tuple:
        return (xp.asarray(draw(op_type, _kernel_shape(op_type, inputs, args), args)),)
    return kernel


register(OpDef("ConstantFill", infer_constant_fill, kernel_constant_fill, fill_cost,
               min_inputs=0, max_inputs=1,
               doc="value (default 0) of dtype (TensorProto.DataType; default float32, or "
                   "int64 for an integer value) in the fill shape."))
for _type in GIVEN_DTYPES:
    register(OpDef(_type, given_infer(_type), given_kernel(_type), fill_cost,
                   devices=frozenset({"cpu"}) if _type == "GivenTensorInt16Fill"
                   else frozenset({"cpu", "gpu"}),
                   min_inputs=0, max_inputs=1,
                   doc=f"{GIVEN_DTYPES[_type]} values from the 'values' argument."))
register(OpDef("GivenTensorByteStringToUInt8Fill", given_infer("GivenTensorByteStringToUInt8Fill"),
               given_kernel("GivenTensorByteStringToUInt8Fill"), fill_cost, min_inputs=0, max_inputs=1,
               doc="uint8 tensor of the bytes of the single string in 'values'."))
for _type in ("XavierFill", "MSRAFill", "GaussianFill", "UniformFill", "UniformIntFill"):
    register(OpDef(_type, random_infer(_type), random_kernel(_type), random_fill_cost,
                   min_inputs=0, max_inputs=1, doc="Seeded random fill (see the module docstring)."))
