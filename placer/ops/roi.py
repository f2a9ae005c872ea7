"""Op family 'roi': Caffe2's region-of-interest pooling, as Mask / Faster R-CNN heads use it.

Semantics are torch 1.8.1's Caffe2 CPU operators (caffe2/operators/roi_align_op.cc,
roi_align_gradient_op.cc):

- ``RoIAlign`` (X (N, C, H, W), or (N, H, W, C) with ``order`` NHWC; rois (R, 5) =
  (image, x1, y1, x2, y2), or (R, 4) for one image) -> Y (R, C, pooled_h, pooled_w)
  (NHWC: (R, pooled_h, pooled_w, C)). Arguments ``spatial_scale`` (1.0), ``pooled_h``,
  ``pooled_w`` (1), ``sampling_ratio`` (-1: <= 0 samples each bin on an adaptive
  ceil(roi_h / pooled_h) x ceil(roi_w / pooled_w) grid, per RoI), ``aligned`` (0; 1 shifts
  the RoI by -0.5 pixel and drops the minimum RoI size of 1). Each bin is the mean of its
  grid's bilinear samples; a sample with y < -1, y > H, x < -1 or x > W counts as 0,
  coordinates below 0 are clamped to 0, and a sample at or past the last row (column)
  reads that row (column) alone.
- ``RoIAlignGradient`` (X, rois, dY) -> dX (X's shape): each sample's four bilinear
  weights times dY / count, added back into dX.

The kernels are vectorised over RoIs: the sample grid is the largest grid over the RoIs
(one device-to-host read of that size when ``sampling_ratio`` <= 0), the samples past a
RoI's own grid masked out; the four taps of every sample are gathered at once (the
gradient scatters them back with ``add.at``, cupy's atomic scatter-add). Blocks of RoIs
keep the gathered taps under ``TAP_BLOCK`` elements; a block is a handful of launches.
The output's ``bound`` is the rois' (RoIs from a proposal op are an upper bound).

Devices: Caffe2 1.8.1 registers CUDA kernels for both (caffe2/operators/roi_align_op.cu,
REGISTER_CUDA_OPERATOR(RoIAlign, ...); roi_align_gradient_op.cu,
REGISTER_CUDA_OPERATOR(RoIAlignGradient, ...)).
"""
from __future__ import annotations

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, register
from placer.types import OpFeatures, TensorType, shape_str

TAP_BLOCK = 1 << 25      # most gathered tap values one block of RoIs holds (128 MiB float32)
FLOPS_PER_TAP = 2        # a weight times a value, added
WEIGHT_FLOPS = 12        # per sample: coordinates, clamps, the two axes' weights, the product
ADAPTIVE_GRID_GUESS = 2  # samples per bin side assumed for costs when the grid is adaptive


class _RoIArgs:
    def __init__(self, args, op_type: str):
        self.scale = args.float("spatial_scale", 1.0)
        self.ph = args.int("pooled_h", 1)
        self.pw = args.int("pooled_w", 1)
        self.sampling = args.int("sampling_ratio", -1)
        self.aligned = args.bool("aligned", False)
        self.order = args.str("order", "NCHW").upper()
        if self.order not in ("NCHW", "NHWC"):
            raise ArgumentError(f"op {args.op}: {op_type} order must be NCHW or NHWC, not {self.order!r}")
        if self.ph < 1 or self.pw < 1:
            raise ArgumentError(f"op {args.op}: {op_type} pooled_h and pooled_w must be positive, "
                                f"found {self.ph}, {self.pw}")

    def grid_guess(self) -> int:
        return self.sampling if self.sampling > 0 else ADAPTIVE_GRID_GUESS


def _dims(inputs, args, op_type: str, p: _RoIArgs) -> tuple[int, int, int, int, int]:
    """(N, C, H, W, R) of X and rois."""
    x, rois = inputs[0], inputs[1]
    fail = f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): "
    if x.ndim != 4:
        raise ShapeError(fail + f"X must be 4-D ({p.order})")
    if rois.ndim != 2 or rois.shape[1] not in (4, 5):
        if not (rois.ndim >= 1 and 0 in rois.shape):
            raise ShapeError(fail + "rois must be (R, 5) = (image, x1, y1, x2, y2) or (R, 4)")
    n, c, h, w = x.shape if p.order == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    r = rois.shape[0]
    if rois.ndim == 2 and rois.shape[1] == 4 and n != 1 and r:
        raise ShapeError(fail + f"rois (R, 4) carry no image index: X must hold one image, not {n}")
    return n, c, h, w, r


def _out_shape(p: _RoIArgs, c: int, r: int) -> tuple[int, ...]:
    return (r, c, p.ph, p.pw) if p.order == "NCHW" else (r, p.ph, p.pw, c)


def _align_infer(inputs, args):
    p = _RoIArgs(args, "RoIAlign")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlign", p)
    return [TensorType(_out_shape(p, c, r), inputs[0].dtype, bound=inputs[1].bound)]


def _axis(xp, start, bin_size, grid, grid_f, pooled: int, g: int, size: int):
    """One axis of the samples: (low, high) indices (R, pooled, g, 2) int and their
    weights (R, pooled, g, 2) float32, zero for samples outside the map or past a RoI's grid.
    ``start``, ``bin_size``, ``grid_f`` (R,) float32, ``grid`` (R,) int."""
    p = xp.arange(pooled, dtype=xp.float32)[None, :, None]
    i = xp.arange(g, dtype=xp.float32)[None, None, :] + 0.5
    # Caffe2's order of operations: (start + p * bin) + ((i + .5) * bin) / grid, in float32.
    v = (start[:, None, None] + p * bin_size[:, None, None]
         + i * bin_size[:, None, None] / grid_f[:, None, None])
    keep = (v >= -1.0) & (v <= float(size)) & (xp.arange(g)[None, None, :] < grid[:, None, None])
    v = xp.maximum(v, 0.0)
    low = v.astype(xp.int32)
    edge = low >= size - 1
    low = xp.where(edge, size - 1, low)
    v = xp.where(edge, low.astype(xp.float32), v)
    lv = v - low.astype(xp.float32)
    hv = 1.0 - lv
    high = xp.where(edge, low, low + 1)
    zero = xp.zeros((), dtype=xp.float32)
    weights = xp.stack([xp.where(keep, hv, zero), xp.where(keep, lv, zero)], axis=-1)
    return xp.stack([low, high], axis=-1), weights


def _samples(xp, rois, p: _RoIArgs, h: int, w: int):
    """Per RoI: image index (R,), the y and x taps and weights (_axis), 1 / count (R,)."""
    rois = rois.astype(xp.float32, copy=False)
    r = rois.shape[0]
    if rois.shape[1] == 5:
        image = rois[:, 0].astype(xp.int64)
        box = rois[:, 1:5]
    else:
        image = xp.zeros((r,), dtype=xp.int64)
        box = rois
    offset = 0.5 if p.aligned else 0.0
    scale = np.float32(p.scale)
    x1, y1 = box[:, 0] * scale - offset, box[:, 1] * scale - offset
    x2, y2 = box[:, 2] * scale - offset, box[:, 3] * scale - offset
    rw, rh = x2 - x1, y2 - y1
    if not p.aligned:               # malformed RoIs become 1 x 1
        rw, rh = xp.maximum(rw, 1.0), xp.maximum(rh, 1.0)
    bin_h, bin_w = rh / np.float32(p.ph), rw / np.float32(p.pw)
    if p.sampling > 0:
        grid_h = grid_w = xp.full((r,), p.sampling, dtype=xp.int32)
        gh = gw = p.sampling
    else:
        grid_h, grid_w = xp.ceil(bin_h).astype(xp.int32), xp.ceil(bin_w).astype(xp.int32)
        grid_h, grid_w = xp.maximum(grid_h, 0), xp.maximum(grid_w, 0)
        largest = xp.stack([grid_h.max(), grid_w.max()])
        largest = largest.get() if hasattr(largest, "get") else largest   # one device read
        gh, gw = max(int(largest[0]), 1), max(int(largest[1]), 1)
    count = xp.maximum(grid_h * grid_w, 1).astype(xp.float32)
    ys, wys = _axis(xp, y1, bin_h, grid_h, grid_h.astype(xp.float32), p.ph, gh, h)
    xs, wxs = _axis(xp, x1, bin_w, grid_w, grid_w.astype(xp.float32), p.pw, gw, w)
    return image, ys, wys, xs, wxs, 1.0 / count, gh * gw


def _blocks(r: int, per_roi: int):
    step = max(1, TAP_BLOCK // max(per_roi, 1))
    return [(s, min(r, s + step)) for s in range(0, r, step)]


def _align_kernel(xp, inputs, args):
    p = _RoIArgs(args, "RoIAlign")
    x, rois = inputs[0], inputs[1]
    n, c, h, w, r = _dims([TensorType(a.shape, str(a.dtype)) for a in inputs[:2]], args, "RoIAlign", p)
    if r == 0:
        return (xp.zeros(_out_shape(p, c, 0), dtype=xp.float32),)
    xn = x.transpose(0, 2, 3, 1) if p.order == "NCHW" else x       # (N, H, W, C), a view
    image, ys, wys, xs, wxs, inv_count, samples = _samples(xp, rois, p, h, w)
    parts = []
    for a, b in _blocks(r, p.ph * p.pw * samples * 4 * c):
        # taps (R, ph, gh, 2, pw, gw, 2, C)
        taps = xn[image[a:b, None, None, None, None, None, None],
                  ys[a:b, :, :, :, None, None, None], xs[a:b, None, None, None, :, :, :]]
        out = xp.einsum("rpiaqjbc,rpia,rqjb->rpqc", taps, wys[a:b], wxs[a:b])
        parts.append(out * inv_count[a:b, None, None, None])
    y = parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=0)
    if p.order == "NCHW":
        y = xp.ascontiguousarray(y.transpose(0, 3, 1, 2))
    return (y.astype(x.dtype, copy=False),)


def _taps(p: _RoIArgs, c: int, r: int) -> float:
    return float(r) * p.ph * p.pw * p.grid_guess() ** 2 * 4 * c


def _align_cost(inputs, outputs, args):
    """The taps each read once (not all of X), four per sample; two flops a tap."""
    p = _RoIArgs(args, "RoIAlign")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlign", p)
    taps = _taps(p, c, r)
    samples = float(r) * p.ph * p.pw * p.grid_guess() ** 2
    item = np.dtype(inputs[0].dtype).itemsize
    return OpFeatures(flops=FLOPS_PER_TAP * taps + WEIGHT_FLOPS * samples,
                      bytes_read=taps * item + inputs[1].nbytes,
                      bytes_written=float(outputs[0].nbytes))


# Launches of one block: the RoI coordinates and grids (~20), two axes (~25 each), the
# gather, the einsum, the scale, the transpose copy.
ALIGN_LAUNCHES = 75


def _align_launches(inputs, args):
    p = _RoIArgs(args, "RoIAlign")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlign", p)
    return ALIGN_LAUNCHES + 3 * (len(_blocks(r, p.ph * p.pw * p.grid_guess() ** 2 * 4 * c)) - 1)


def _grad_infer(inputs, args):
    p = _RoIArgs(args, "RoIAlignGradient")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlignGradient", p)
    if tuple(inputs[2].shape) != _out_shape(p, c, r):
        raise ShapeError(f"op {args.op}: RoIAlignGradient on inputs ({shape_str(inputs)}): dY must be "
                         f"RoIAlign's output {_out_shape(p, c, r)}")
    return [TensorType(inputs[0].shape, inputs[0].dtype)]


def _grad_kernel(xp, inputs, args):
    p = _RoIArgs(args, "RoIAlignGradient")
    x, rois, dy = inputs[0], inputs[1], inputs[2]
    n, c, h, w, r = _dims([TensorType(a.shape, str(a.dtype)) for a in inputs], args, "RoIAlignGradient", p)
    dxn = xp.zeros((n, h, w, c), dtype=xp.float32)
    if r and dy.size:
        dyn = dy.transpose(0, 2, 3, 1) if p.order == "NCHW" else dy      # (R, ph, pw, C)
        image, ys, wys, xs, wxs, inv_count, samples = _samples(xp, rois, p, h, w)
        wxs = wxs * inv_count[:, None, None, None]
        for a, b in _blocks(r, p.ph * p.pw * samples * 4 * c):
            vals = xp.einsum("rpqc,rpia,rqjb->rpiaqjbc", dyn[a:b].astype(xp.float32, copy=False),
                             wys[a:b], wxs[a:b])
            xp.add.at(dxn, (image[a:b, None, None, None, None, None, None],
                            ys[a:b, :, :, :, None, None, None], xs[a:b, None, None, None, :, :, :]), vals)
    dx = xp.ascontiguousarray(dxn.transpose(0, 3, 1, 2)) if p.order == "NCHW" else dxn
    return (dx.astype(x.dtype, copy=False),)


def _grad_cost(inputs, outputs, args):
    """dY read once, the taps written back (scatter-adds), dX zeroed first."""
    p = _RoIArgs(args, "RoIAlignGradient")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlignGradient", p)
    taps = _taps(p, c, r)
    samples = float(r) * p.ph * p.pw * p.grid_guess() ** 2
    item = np.dtype(inputs[0].dtype).itemsize
    return OpFeatures(flops=FLOPS_PER_TAP * taps + WEIGHT_FLOPS * samples,
                      bytes_read=float(inputs[1].nbytes + inputs[2].nbytes) + taps * item,
                      bytes_written=float(outputs[0].nbytes) + taps * item)


# Launches: the samples as RoIAlign's (~70), the zero fill, the einsum, the scatter, the copy.
GRAD_LAUNCHES = 75


def _grad_launches(inputs, args):
    p = _RoIArgs(args, "RoIAlignGradient")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlignGradient", p)
    return GRAD_LAUNCHES + 2 * (len(_blocks(r, p.ph * p.pw * p.grid_guess() ** 2 * 4 * c)) - 1)


register(OpDef("RoIAlign", _align_infer, _align_kernel, _align_cost, min_inputs=2, max_inputs=2,
               devices=frozenset({"cpu", "gpu"}), caffe2_devices=frozenset({"cpu", "gpu"}),
               launches=_align_launches,
               doc="Mask R-CNN RoIAlign: bilinear samples averaged per bin (Caffe2 semantics)"))
register(OpDef("RoIAlignGradient", _grad_infer, _grad_kernel, _grad_cost, min_inputs=3, max_inputs=3,
               devices=frozenset({"cpu", "gpu"}), caffe2_devices=frozenset({"cpu", "gpu"}),
               launches=_grad_launches,
               doc="RoIAlign's gradient: dY scattered back along the bilinear weights (Caffe2 semantics)"))
