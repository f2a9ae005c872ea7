"""Op family 'layout': NCHW2NHWC and NHWC2NCHW, Caffe2's storage-order switches
(caffe2/operators/order_switch_ops.h).

- NCHW2NHWC(X) -> Y: X of rank >= 3 as (N, C, D1, ..., Dk); Y is (N, D1, ..., Dk, C);
- NHWC2NCHW(X) -> Y: X (N, D1, ..., Dk, C); Y (N, C, D1, ..., Dk).

Both are float32 ops (Caffe2 registers them for float only). Caffe2 1.8.1 has CPU kernels
(order_switch_ops.cc), CUDA kernels (order_switch_ops.cu) and a cuDNN engine
(order_switch_ops_cudnn.cc), so they run on every device here too; the kernel is one
transposed copy. Cost: data movement only (every byte read and written once).
"""
from __future__ import annotations

from placer.errors import ShapeError
from placer.ops.registry import OpDef, movement_cost, register
from placer.types import Args, TensorType, shape_str


def _check(inputs, args: Args, op_type: str) -> TensorType:
    x = inputs[0]
    if x.ndim < 3:
        raise ShapeError(f"op {args.op}: {op_type} needs X of rank >= 3, found {shape_str([x])}")
    if x.dtype != "float32":
        raise ShapeError(f"op {args.op}: {op_type} takes float32 X (Caffe2 has only float kernels), "
                         f"found {x.dtype} {shape_str([x])}")
    return x


def _to_nhwc_axes(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim), 1)


def _to_nchw_axes(ndim: int) -> tuple[int, ...]:
    return (0, ndim - 1, *range(1, ndim - 1))


def _infer(op_type: str, axes_of):
    def infer(inputs, args: Args):
        x = _check(inputs, args, op_type)
        return [TensorType(tuple(x.shape[a] for a in axes_of(x.ndim)), x.dtype)]
    return infer


def _kernel(op_type: str, axes_of):
    def kernel(xp, inputs, args: Args):
        x = inputs[0]
        _check([TensorType(x.shape, str(x.dtype))], args, op_type)
        return (xp.ascontiguousarray(xp.transpose(x, axes_of(x.ndim))),)
    return kernel


register(OpDef("NCHW2NHWC", _infer("NCHW2NHWC", _to_nhwc_axes), _kernel("NCHW2NHWC", _to_nhwc_axes),
               cost=movement_cost, min_inputs=1, max_inputs=1, scratch=0.0,
               doc="(N, C, D1..Dk) -> (N, D1..Dk, C)"))
register(OpDef("NHWC2NCHW", _infer("NHWC2NCHW", _to_nchw_axes), _kernel("NHWC2NCHW", _to_nchw_axes),
               cost=movement_cost, min_inputs=1, max_inputs=1, scratch=0.0,
               doc="(N, D1..Dk, C) -> (N, C, D1..Dk)"))
