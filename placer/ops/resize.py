"""Nearest-neighbour resizing: ``ResizeNearest`` (Caffe2, used by Detectron and Mask
R-CNN2Go) and ``Upsample`` (the integer-scale nearest upsampling of the YOLOv3 Caffe2
port).

ResizeNearest: X (N, C, H, W) (or NHWC with ``order``), ``height_scale`` / ``width_scale``
(default 1.0); output (N, C, int(H * hs), int(W * ws)); output row y reads input row
min(int(y / hs), H - 1), as Caffe2's kernel does. Upsample: ``scale`` (an integer, default
2), each pixel repeated ``scale`` times along H and W.
Costs: no arithmetic, one read of the input and one write of the output.
"""
from __future__ import annotations

import numpy as np

from placer.errors import ShapeError
from placer.ops.registry import OpDef, movement_cost, register
from placer.types import TensorType


def _spatial_axes(x: TensorType, args, op_type: str) -> tuple[int, int]:
    if x.ndim != 4:
        raise ShapeError(f"op {args.op}: {op_type} needs a 4-D image batch, found {x}")
    order = args.str("order", "NCHW").upper()
    if order not in ("NCHW", "NHWC"):
        raise ShapeError(f"op {args.op}: order must be NCHW or NHWC, not {order!r}")
    return (2, 3) if order == "NCHW" else (1, 2)


def _scales(args) -> tuple[float, float]:
    hs, ws = args.float("height_scale", 1.0), args.float("width_scale", 1.0)
    if hs <= 0 or ws <= 0:
        raise ShapeError(f"op {args.op}: height_scale and width_scale must be positive, "
                         f"found {hs}, {ws}")
    return hs, ws


def _resize_infer(inputs, args):
    x = inputs[0]
    h_ax, w_ax = _spatial_axes(x, args, "ResizeNearest")
    hs, ws = _scales(args)
    shape = list(x.shape)
    shape[h_ax], shape[w_ax] = int(x.shape[h_ax] * hs), int(x.shape[w_ax] * ws)
    return [TensorType(tuple(shape), x.dtype)]


def _resize_kernel(xp, inputs, args):
    x = inputs[0]
    h_ax, w_ax = _spatial_axes(TensorType(x.shape, str(x.dtype)), args, "ResizeNearest")
    hs, ws = _scales(args)
    H, W = x.shape[h_ax], x.shape[w_ax]
    # The source rows and columns follow from the shapes: made on the host, copied once each.
    rows = np.minimum((np.arange(int(H * hs)) / hs).astype(np.int64), H - 1)
    cols = np.minimum((np.arange(int(W * ws)) / ws).astype(np.int64), W - 1)
    return (xp.take(xp.take(x, xp.asarray(rows), axis=h_ax), xp.asarray(cols), axis=w_ax),)


def _upsample_scale(args) -> int:
    scale = args.int("scale", 2)
    if scale < 1:
        raise ShapeError(f"op {args.op}: Upsample scale must be a positive integer, found {scale}")
    return scale


def _upsample_infer(inputs, args):
    x = inputs[0]
    h_ax, w_ax = _spatial_axes(x, args, "Upsample")
    s = _upsample_scale(args)
    shape = list(x.shape)
    shape[h_ax] *= s
    shape[w_ax] *= s
    return [TensorType(tuple(shape), x.dtype)]


def _upsample_kernel(xp, inputs, args):
    x = inputs[0]
    h_ax, w_ax = _spatial_axes(TensorType(x.shape, str(x.dtype)), args, "Upsample")
    s = _upsample_scale(args)
    return (xp.repeat(xp.repeat(x, s, axis=h_ax), s, axis=w_ax),)


register(OpDef("ResizeNearest", _resize_infer, _resize_kernel, movement_cost, min_inputs=1, max_inputs=1,
               launches=4,
               doc="nearest-neighbour resize by height_scale / width_scale (Caffe2 semantics)"))
register(OpDef("Upsample", _upsample_infer, _upsample_kernel, movement_cost, min_inputs=1, max_inputs=1,
               launches=2,
               doc="nearest-neighbour upsampling by an integer scale (YOLOv3 Caffe2 port)"))
