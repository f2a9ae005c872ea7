"""Op family 'roi': Caffe2's region-of-interest pooling, as Mask / Faster R-CNN heads use it.

Semantics are torch 1.8.1's Caffe2 CPU operators (caffe2/operators/roi_align_op.cc,
roi_align_gradient_op.cc, roi_pool_op.cc):

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
  weights times dY / count, added back into dX. Caffe2's CPU gradient reads X as NCHW
  whatever ``order`` says; here NHWC is honoured (X, dY and dX all NHWC).
- ``RoIPool`` (X (N, C, H, W), rois (R, 5); NCHW only, as Caffe2's) -> Y (R, C, pooled_h,
  pooled_w) and, with ``is_test`` 0 (the default), argmaxes (int32, h * W + w within the
  channel; -1 for an empty bin, whose Y is 0). The RoI's corners are rounded (halves away
  from zero) after ``spatial_scale``; bin [floor(p * b), ceil((p + 1) * b)) of the RoI's
  (extent + 1) / pooled cells b, clipped to the map; the first of equal maxima wins.

The kernels are vectorised over RoIs: the sample grid is the largest grid over the RoIs
(one device-to-host read of that size when ``sampling_ratio`` <= 0), the samples past a
RoI's own grid masked out; the four taps of every sample are gathered at once (the
gradient scatters them back with ``add.at``, cupy's atomic scatter-add). Blocks of RoIs
keep the gathered taps under ``TAP_BLOCK`` elements; a block is a handful of launches.
The output's ``bound`` is the rois' (RoIs from a proposal op are an upper bound).

RoIPool's bins get the same treatment: the largest bin over the RoIs (one device read),
cells past a bin masked to -inf.

Devices: Caffe2 1.8.1 registers CUDA kernels for all three (caffe2/operators/
roi_align_op.cu, REGISTER_CUDA_OPERATOR(RoIAlign, ...); roi_align_gradient_op.cu,
REGISTER_CUDA_OPERATOR(RoIAlignGradient, ...); roi_pool_op.cu, REGISTER_CUDA_OPERATOR(
RoIPool, ...) and RoIPoolGradient, which placer does not register).
"""
from __future__ import annotations

import numpy as np

from placer.errors import ArgumentError, InputError, ShapeError
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


def _samples(xp, rois, p: _RoIArgs, h: int, w: int, args_op: str, op_type: str):
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
    checks = []       # read from the device together, in one transfer
    if p.sampling > 0:
        grid_h = grid_w = xp.full((r,), p.sampling, dtype=xp.int32)
        gh = gw = p.sampling
    else:
        grid_h, grid_w = xp.ceil(bin_h).astype(xp.int32), xp.ceil(bin_w).astype(xp.int32)
        grid_h, grid_w = xp.maximum(grid_h, 0), xp.maximum(grid_w, 0)
        checks += [grid_h.max().astype(xp.float32), grid_w.max().astype(xp.float32)]
    if p.aligned:     # Caffe2 refuses RoIs of negative size when aligned (it keeps no minimum)
        checks.append(xp.minimum(rw.min(), rh.min()))
    if checks:
        host = xp.stack(checks)
        host = host.get() if hasattr(host, "get") else host     # the one device read
        if p.sampling <= 0:
            gh, gw = max(int(host[0]), 1), max(int(host[1]), 1)
        if p.aligned and host[-1] < 0:
            raise InputError(f"op {args_op}: {op_type} with aligned=1 takes RoIs of non-negative "
                             f"size only (x2 >= x1, y2 >= y1 after spatial_scale), as Caffe2 does")
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
    image, ys, wys, xs, wxs, inv_count, samples = _samples(xp, rois, p, h, w, args.op, "RoIAlign")
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
    """Four taps per sample, two flops a tap. Memory: the cells a RoI's taps touch, read
    once per RoI and channel (neighbouring samples share cells, which caches serve): its
    samples form a (pooled_h * grid) x (pooled_w * grid) lattice, whose taps touch at most
    one more cell than samples along each axis, and never more than the map's H x W."""
    p = _RoIArgs(args, "RoIAlign")
    _n, c, h, w, r = _dims(inputs, args, "RoIAlign", p)
    taps = _taps(p, c, r)
    g = p.grid_guess()
    samples = float(r) * p.ph * p.pw * g ** 2
    cells = float(r) * c * min((p.ph * g + 1) * (p.pw * g + 1), h * w)
    item = np.dtype(inputs[0].dtype).itemsize
    return OpFeatures(flops=FLOPS_PER_TAP * taps + WEIGHT_FLOPS * samples,
                      bytes_read=min(taps, cells) * item + inputs[1].nbytes,
                      bytes_written=float(outputs[0].nbytes))


# Launches (counted on the cupy stand-in): the RoI coordinates and grids, the two axes'
# taps and weights, one gather, the einsum, the scale and the transpose copy; an adaptive
# grid adds its ceil and the largest grid's reduction, aligned=1 the negative-size check.
ALIGN_LAUNCHES = 86
ADAPTIVE_LAUNCHES = 10


def _check_launches(p: _RoIArgs) -> int:
    """The launches of the adaptive grid and of the aligned RoIs' size check."""
    adaptive = p.sampling <= 0
    return (ADAPTIVE_LAUNCHES if adaptive else 0) + ((1 if adaptive else 2) if p.aligned else 0)


def _align_launches(inputs, args):
    p = _RoIArgs(args, "RoIAlign")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlign", p)
    blocks = len(_blocks(r, p.ph * p.pw * p.grid_guess() ** 2 * 4 * c))
    return ALIGN_LAUNCHES + _check_launches(p) + 3 * (blocks - 1)


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
        image, ys, wys, xs, wxs, inv_count, samples = _samples(xp, rois, p, h, w, args.op,
                                                               "RoIAlignGradient")
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


# Launches (counted on the cupy stand-in): the samples as RoIAlign's, the zero fill, the
# einsum, the scatter-add, the transpose copy.
GRAD_LAUNCHES = 87


def _grad_launches(inputs, args):
    p = _RoIArgs(args, "RoIAlignGradient")
    _n, c, _h, _w, r = _dims(inputs, args, "RoIAlignGradient", p)
    blocks = len(_blocks(r, p.ph * p.pw * p.grid_guess() ** 2 * 4 * c))
    return GRAD_LAUNCHES + _check_launches(p) + 2 * (blocks - 1)


register(OpDef("RoIAlign", _align_infer, _align_kernel, _align_cost, min_inputs=2, max_inputs=2,
               devices=frozenset({"cpu", "gpu"}), caffe2_devices=frozenset({"cpu", "gpu"}),
               launches=_align_launches,
               doc="Mask R-CNN RoIAlign: bilinear samples averaged per bin (Caffe2 semantics)"))
register(OpDef("RoIAlignGradient", _grad_infer, _grad_kernel, _grad_cost, min_inputs=3, max_inputs=3,
               devices=frozenset({"cpu", "gpu"}), caffe2_devices=frozenset({"cpu", "gpu"}),
               launches=_grad_launches,
               doc="RoIAlign's gradient: dY scattered back along the bilinear weights (Caffe2 semantics)"))


# -- RoIPool ------------------------------------------------------------------------------

def _pool_outputs(args) -> int:
    """Y, and the argmaxes when training (is_test=0) or when a second output is asked for."""
    return 2 if not args.bool("is_test", False) or getattr(args, "n_outputs", None) == 2 else 1


def _pool_dims(inputs, args, p: _RoIArgs):
    fail = f"op {args.op}: RoIPool on inputs ({shape_str(inputs)}): "
    x, rois = inputs[0], inputs[1]
    if p.order != "NCHW":
        raise ArgumentError(fail + "Caffe2's RoIPool takes only order NCHW")
    if x.ndim != 4:
        raise ShapeError(fail + "X must be 4-D (N, C, H, W)")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ShapeError(fail + "rois must be (R, 5) = (image, x1, y1, x2, y2)")
    if not args.bool("is_test", False) and getattr(args, "n_outputs", None) == 1:
        raise ShapeError(fail + "is_test=0 writes the argmaxes too: two outputs (Y, argmaxes)")
    return x.shape[0], x.shape[1], x.shape[2], x.shape[3], rois.shape[0]


def _pool_infer(inputs, args):
    p = _RoIArgs(args, "RoIPool")
    _n, c, _h, _w, r = _pool_dims(inputs, args, p)
    shape = (r, c, p.ph, p.pw)
    outs = [TensorType(shape, inputs[0].dtype, bound=inputs[1].bound)]
    if _pool_outputs(args) == 2:
        outs.append(TensorType(shape, "int32", bound=inputs[1].bound))
    return outs


def _round(xp, v):
    """C's round: halves away from zero."""
    return xp.where(v < 0, -xp.floor(-v + 0.5), xp.floor(v + 0.5))


def _bins(xp, start, end, pooled: int, size: int):
    """[lo, hi) of each bin (R, pooled) int32, clipped to the map, as Caffe2's RoIPool."""
    extent = xp.maximum(end - start + 1, 1).astype(xp.float32)
    bin_size = extent / np.float32(pooled)
    k = xp.arange(pooled, dtype=xp.float32)[None, :]
    lo = xp.floor(k * bin_size[:, None]).astype(xp.int32) + start[:, None]
    hi = xp.ceil((k + 1.0) * bin_size[:, None]).astype(xp.int32) + start[:, None]
    return xp.clip(lo, 0, size), xp.clip(hi, 0, size)


def _pool_kernel(xp, inputs, args):
    p = _RoIArgs(args, "RoIPool")
    x, rois = inputs[0], inputs[1]
    _n, c, h, w, r = _pool_dims([TensorType(a.shape, str(a.dtype)) for a in inputs], args, p)
    two = _pool_outputs(args) == 2
    if r == 0:
        y = xp.zeros((0, c, p.ph, p.pw), dtype=x.dtype)
        return (y, xp.zeros(y.shape, dtype=xp.int32)) if two else (y,)
    rois = rois.astype(xp.float32, copy=False)
    image = rois[:, 0].astype(xp.int64)
    corners = _round(xp, rois[:, 1:5] * np.float32(p.scale)).astype(xp.int32)
    hlo, hhi = _bins(xp, corners[:, 1], corners[:, 3], p.ph, h)
    wlo, whi = _bins(xp, corners[:, 0], corners[:, 2], p.pw, w)
    largest = xp.stack([(hhi - hlo).max(), (whi - wlo).max()])
    largest = largest.get() if hasattr(largest, "get") else largest      # one device read
    kh, kw = max(int(largest[0]), 1), max(int(largest[1]), 1)
    rows = hlo[:, :, None] + xp.arange(kh, dtype=xp.int32)[None, None, :]     # (R, ph, kh)
    cols = wlo[:, :, None] + xp.arange(kw, dtype=xp.int32)[None, None, :]     # (R, pw, kw)
    row_in, col_in = rows < hhi[:, :, None], cols < whi[:, :, None]
    rows, cols = xp.minimum(rows, h - 1), xp.minimum(cols, w - 1)
    xn = x.transpose(0, 2, 3, 1)                                             # (N, H, W, C)
    ys, picks = [], []
    for a, b in _blocks(r, p.ph * p.pw * kh * kw * c):
        # (R, ph, pw, kh, kw, C): each bin's rows, then its columns, as Caffe2 scans them
        taps = xn[image[a:b, None, None, None, None], rows[a:b, :, None, :, None],
                  cols[a:b, None, :, None, :]]
        inside = row_in[a:b, :, None, :, None] & col_in[a:b, None, :, None, :]
        taps = xp.where(inside[..., None], taps, -xp.inf).reshape(b - a, p.ph, p.pw, kh * kw, c)
        best = xp.argmax(taps, axis=3)                      # the first of equal maxima, as Caffe2's >
        empty = ~inside.reshape(b - a, p.ph, p.pw, kh * kw).any(axis=3)[..., None]
        ys.append(xp.where(empty, 0.0, taps.max(axis=3)))
        if two:
            at = ((hlo[a:b, :, None, None] + best // kw) * w + wlo[a:b, None, :, None] + best % kw)
            picks.append(xp.where(empty, -1, at).astype(xp.int32))
    y = ys[0] if len(ys) == 1 else xp.concatenate(ys, axis=0)
    y = xp.ascontiguousarray(y.transpose(0, 3, 1, 2)).astype(x.dtype, copy=False)
    if not two:
        return (y,)
    arg = picks[0] if len(picks) == 1 else xp.concatenate(picks, axis=0)
    return y, xp.ascontiguousarray(arg.transpose(0, 3, 1, 2))


def _pool_cost(inputs, outputs, args):
    """Each bin's cells read once (about the RoIs' area, taken as 2 x 2 cells a bin: the
    RoIs are not known), one compare each."""
    p = _RoIArgs(args, "RoIPool")
    _n, c, _h, _w, r = _pool_dims(inputs, args, p)
    cells = float(r) * p.ph * p.pw * 4 * c
    item = np.dtype(inputs[0].dtype).itemsize
    return OpFeatures(flops=cells, bytes_read=cells * item + inputs[1].nbytes,
                      bytes_written=float(sum(t.nbytes for t in outputs)))


# Launches (counted on the cupy stand-in): rounding, the bins, the largest bin, the gather,
# the mask, max and argmax, the transpose copy; the argmaxes' indices add 9.
POOL_LAUNCHES = 67
ARGMAX_LAUNCHES = 9


def _pool_launches(inputs, args):
    return POOL_LAUNCHES + (ARGMAX_LAUNCHES if _pool_outputs(args) == 2 else 0)


register(OpDef("RoIPool", _pool_infer, _pool_kernel, _pool_cost, min_inputs=2, max_inputs=2,
               devices=frozenset({"cpu", "gpu"}), caffe2_devices=frozenset({"cpu", "gpu"}),
               launches=_pool_launches,
               doc="Fast R-CNN RoIPool: the max of each bin of the rounded RoI, and its argmax (Caffe2)"))
