"""Op family 'detection_proposals': Caffe2's Faster R-CNN / FPN region proposal ops.

The semantics are torch 1.8.1's Caffe2 CPU operators (caffe2/operators/
generate_proposals_op.cc, generate_proposals_op_util_boxes.h,
generate_proposals_op_util_nms.h, collect_and_distribute_fpn_rpn_proposals_op.cc):

- ``GenerateProposals`` (scores (N, A, H, W), bbox_deltas (N, 4A, H, W), im_info (N, 3),
  anchors (A, 4)) -> rois (R, 5) = (image, x1, y1, x2, y2), rois_probs (R,). Per image:
  the scores in (A, H, W) order, the ``pre_nms_topN`` best (all when it is <= 0 or covers
  them; Caffe2 uses std::partial_sort / std::sort, so tied scores come in no defined order:
  here ties keep their (A, H, W) position); each anchor shifted to its cell
  (``1 / spatial_scale`` pixels a step) and moved by its deltas (dw, dh capped at
  log(1000 / 16)); the boxes clipped to [0, int(height) - 1] x [0, int(width) - 1]; boxes
  narrower or lower than ``min_size * im_scale`` or centred outside the image dropped;
  greedy NMS at ``nms_thresh`` (a box is kept while its overlap with every kept box is
  <= the threshold), stopping after ``post_nms_topN`` when that is > 0. ``legacy_plus_one``
  (default 1) adds the +1 of the old pixel convention to widths and heights. Arguments
  Caffe2 1.8.1 does not read are ignored as it ignores them: the old spelling
  ``nms_thres`` (the default 0.7 applies) and ``correct_transform_coords``. Anchors
  (H, W, A, 4) are refused as Caffe2 1.8.1 refuses them.
  Rotated boxes (RRPN): anchors (A, 5) = (cx, cy, w, h, angle in degrees), deltas
  (N, 5A, H, W), rois (R, 6). The angle delta is in radians; with ``angle_bound_on``
  (default 1) angles are wrapped into [``angle_bound_lo``, ``angle_bound_hi``] (-90, 90);
  boxes within ``clip_angle_thresh`` (1.0) degrees of upright are clipped as upright ones,
  the others not; no +1 in their widths; NMS on the rotated intersection areas (vectorised
  over the candidates of each NMS step, but still about 9 s for 6,000 candidates and 1,000
  kept of large anchors on one core, against 0.05 s upright).
- ``CollectRpnProposals`` (rpn_rois_fpn<min..max>, rpn_roi_probs_fpn<min..max>) -> rois:
  every level's proposals, the ``rpn_post_nms_topN`` best by score (ties by position: the
  comparator Caffe2 sorts with).
- ``DistributeFpnProposals`` (rois (R, 5) or (R, 4)) -> rois_fpn<roi_min..roi_max_level>,
  rois_idx_restore_int32: each RoI to level floor(roi_canonical_level + log2(sqrt(area) /
  roi_canonical_scale + 1e-6)) clipped to the levels, the RoIs of each level in their
  order, and the permutation that restores the input order from the levels' concatenation.
- ``CollectAndDistributeFpnRpnProposals``: the two above in one op; outputs rois, then the
  levels, then rois_idx_restore_int32.

Output sizes depend on the data. ``infer`` gives the upper bound and marks each such
output with ``TensorType.bound`` (e.g. "GenerateProposals post_nms_topN=300"); costs use
the bound; the kernels return the actual sizes.

Devices: Caffe2 1.8.1 registers a CUDA GenerateProposals (caffe2/operators/
generate_proposals_op.cu, REGISTER_CUDA_OPERATOR(GenerateProposals, ...)); the FPN ops
are registered for CPU only (collect_and_distribute_fpn_rpn_proposals_op.cc, no .cu).
All kernels here are sequential (sorts, greedy NMS) and compute on the host with numpy:
the GPU GenerateProposals reads its inputs back in one transfer and returns device arrays.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType, shape_str

BBOX_XFORM_CLIP = np.float32(math.log(1000.0 / 16.0))
DECODE_FLOPS_PER_BOX = 24   # shift, width/height/centre, 2 exp, 4 corners, 8 clip, 6 filter
IOU_FLOPS = 12              # 4 min/max, 2 widths, intersection, union, divide, compare
ROTATED_IOU_FLOPS = 600     # 8 corners, 16 edge crossings (~20 each), 8 inside tests, 24-point hull
LEVEL_FLOPS_PER_ROI = 8     # area, sqrt, divide, log, floor, clip


def _fail(args: Args, op_type: str, inputs: Sequence[TensorType], what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


def _to_host(xp, arrays) -> list[np.ndarray]:
    """The inputs as float32 numpy arrays; from a GPU in one device-to-host read."""
    if xp is np:
        return [np.asarray(a, dtype=np.float32) for a in arrays]
    flat = xp.concatenate([a.reshape(-1).astype(xp.float32, copy=False) for a in arrays])
    host = flat.get()
    out, start = [], 0
    for a in arrays:
        n = int(np.prod(a.shape, dtype=np.int64))
        out.append(host[start:start + n].reshape(a.shape))
        start += n
    return out


# -- GenerateProposals ------------------------------------------------------------------

class _ProposalArgs:
    def __init__(self, args: Args):
        self.spatial_scale = args.float("spatial_scale", 1.0 / 16)
        self.pre = args.int("pre_nms_topN", 6000)
        self.post = args.int("post_nms_topN", 300)
        self.nms_thresh = args.float("nms_thresh", 0.7)   # not nms_thres: Caffe2 reads only this
        self.min_size = args.float("min_size", 16.0)
        self.plus_one = args.bool("legacy_plus_one", True)
        if self.spatial_scale <= 0:
            raise ArgumentError(f"op {args.op}: GenerateProposals spatial_scale {self.spatial_scale} "
                                f"must be positive")

    def candidates(self, cells: int) -> int:
        """Boxes per image that enter NMS."""
        return cells if self.pre <= 0 or self.pre >= cells else self.pre

    def per_image(self, cells: int) -> tuple[int, str]:
        """The most proposals of one image, and the argument that limits it."""
        k = self.candidates(cells)
        if 0 < self.post < k:
            return self.post, f"post_nms_topN={self.post}"
        if k < cells:
            return k, f"pre_nms_topN={self.pre}"
        return k, "A*H*W"


def _proposal_dims(inputs, args) -> tuple[int, int, int, int, int]:
    """(N, A, H, W, box_dim): box_dim 4 for upright boxes, 5 for rotated ones (RRPN)."""
    scores, deltas, im_info, anchors = inputs[:4]
    if scores.ndim != 4:
        raise _fail(args, "GenerateProposals", inputs, "scores must be 4-D (N, A, H, W)")
    n, a, h, w = scores.shape
    box = anchors.shape[1] if anchors.ndim == 2 and anchors.shape[1] in (4, 5) else 4
    if anchors.shape != (a, box):
        raise _fail(args, "GenerateProposals", inputs, f"anchors must be (A, 4) or (A, 5) = ({a}, 4)")
    if deltas.shape != (n, box * a, h, w):
        raise _fail(args, "GenerateProposals", inputs, f"bbox_deltas must be (N, {box}A, H, W) = "
                    f"({n}, {box * a}, {h}, {w})")
    if im_info.shape != (n, 3):
        raise _fail(args, "GenerateProposals", inputs, f"im_info must be (N, 3) = ({n}, 3)")
    if box == 5 and args.bool("angle_bound_on", True):
        lo, hi = args.int("angle_bound_lo", -90), args.int("angle_bound_hi", 90)
        if hi - lo <= 0 or (hi - lo) % 180:
            raise ArgumentError(f"op {args.op}: GenerateProposals angle_bound_hi - angle_bound_lo "
                                f"({hi} - {lo}) must be a positive multiple of 180")
    return n, a, h, w, box


def _proposals_infer(inputs, args):
    p = _ProposalArgs(args)
    n, a, h, w, box = _proposal_dims(inputs, args)
    rows, why = p.per_image(a * h * w)
    bound = f"GenerateProposals {why}"
    return [TensorType((n * rows, box + 1), "float32", bound=bound),
            TensorType((n * rows,), "float32", bound=bound)]


def _greedy_nms(order: np.ndarray, thresh: float, top_n: int, overlaps) -> list[int]:
    """Caffe2's greedy NMS loop: the best remaining box is kept, the others whose overlap
    with it (``overlaps(i, rest)``, IoU) is above ``thresh`` dropped; at most ``top_n``
    kept when >= 0."""
    thresh = np.float32(thresh)
    keep: list[int] = []
    while order.size:
        if 0 <= top_n <= len(keep):
            break
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        order = rest[overlaps(i, rest) <= thresh]
    return keep


def _iou(inter: np.ndarray, area_i, areas_rest: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (area_i + areas_rest - inter)


def _nms(boxes: np.ndarray, order: np.ndarray, thresh: float, top_n: int, plus_one: float) -> list[int]:
    """Caffe2's nms_cpu_upright, float32 (``_greedy_nms`` on upright overlaps)."""
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    one = np.float32(plus_one)
    areas = (x2 - x1 + one) * (y2 - y1 + one)

    def overlaps(i, rest):
        w = np.maximum(np.minimum(x2[rest], x2[i]) - np.maximum(x1[rest], x1[i]) + one, np.float32(0))
        h = np.maximum(np.minimum(y2[rest], y2[i]) - np.maximum(y1[rest], y1[i]) + one, np.float32(0))
        return _iou(w * h, areas[i], areas[rest])
    return _greedy_nms(order, thresh, top_n, overlaps)


def _rect_vertices(r: np.ndarray) -> np.ndarray:
    """(M, 4, 2) corners of rotated boxes (M, 5) = (cx, cy, w, h, angle in degrees), in
    Caffe2's RotatedRect order (its angle is the box's, negated)."""
    theta = -r[:, 4].astype(np.float64) * 0.01745329251
    b, a = np.cos(theta) * 0.5, np.sin(theta) * 0.5
    cx, cy, w, h = (r[:, k].astype(np.float64) for k in range(4))
    p0 = np.stack([cx - a * h - b * w, cy + b * h - a * w], axis=-1)
    p1 = np.stack([cx + a * h - b * w, cy - b * h - a * w], axis=-1)
    c = np.stack([cx, cy], axis=-1)
    return np.stack([p0, p1, 2 * c - p0, 2 * c - p1], axis=1)


def _cross(u, v):
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]


def _inside(points, corners):
    """(M, 4) whether each of 4 points lies in the rectangle of its row's corners."""
    ab, da = corners[:, 1] - corners[:, 0], corners[:, 0] - corners[:, 3]
    ap = points - corners[:, None, 0]
    u, v = np.einsum("mkd,md->mk", ap, ab), -np.einsum("mkd,md->mk", ap, da)
    return (u >= 0) & (v >= 0) & (u <= (ab * ab).sum(-1)[:, None]) & (v <= (da * da).sum(-1)[:, None])


def _rotated_intersections(one: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Areas of the intersections of rotated box ``one`` (5,) with each of ``rest`` (M, 5):
    Caffe2's rotated_rect_intersection (edge crossings, corners inside the other box, the
    convex hull's area; none with 2 points or fewer). The hull is the points' polygon in
    angle order about their centroid (the intersection of two rectangles is convex)."""
    m = rest.shape[0]
    p1 = np.broadcast_to(_rect_vertices(one[None]), (m, 4, 2))
    p2 = _rect_vertices(rest)
    v1, v2 = np.roll(p1, -1, axis=1) - p1, np.roll(p2, -1, axis=1) - p2
    det = _cross(v2[:, None, :, :], v1[:, :, None, :])                 # (M, i, j)
    d12 = p2[:, None, :, :] - p1[:, :, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = _cross(v2[:, None, :, :], d12) / det
        t2 = _cross(v1[:, :, None, :], d12) / det
        crossings = p1[:, :, None, :] + t1[..., None] * v1[:, :, None, :]
    cross_ok = (np.abs(det) > 1e-14) & (t1 >= 0) & (t1 <= 1) & (t2 >= 0) & (t2 <= 1)
    pts = np.concatenate([crossings.reshape(m, 16, 2), p1, p2], axis=1)     # (M, 24, 2)
    ok = np.concatenate([cross_ok.reshape(m, 16), _inside(p1, p2), _inside(p2, p1)], axis=1)
    count = ok.sum(axis=1)
    centre = np.where(ok[..., None], pts, 0).sum(axis=1) / np.maximum(count, 1)[:, None]
    rel = pts - centre[:, None, :]
    angle = np.where(ok, np.arctan2(rel[..., 1], rel[..., 0]), np.inf)
    order = np.argsort(angle, axis=1)
    rel = np.take_along_axis(rel, order[..., None], axis=1)
    valid = np.take_along_axis(ok, order, axis=1)
    rel = np.where(valid[..., None], rel, rel[:, :1])                 # pad with the first point
    area = np.abs(_cross(rel, np.roll(rel, -1, axis=1)).sum(axis=1)) / 2.0
    return np.where(count > 2, area, 0.0)


def _nms_rotated(boxes: np.ndarray, order: np.ndarray, thresh: float, top_n: int) -> list[int]:
    """Caffe2's nms_cpu_rotated: as ``_nms`` with rotated intersections, areas w * h. Only
    the boxes whose circumscribed circles meet box i's get their intersection computed."""
    areas = boxes[:, 2] * boxes[:, 3]
    centres = boxes[:, :2].astype(np.float64)
    radii = 0.5 * np.hypot(boxes[:, 2].astype(np.float64), boxes[:, 3].astype(np.float64))

    def overlaps(i, rest):
        inter = np.zeros(rest.size, np.float32)
        near = np.nonzero(np.hypot(centres[rest, 0] - centres[i, 0], centres[rest, 1] - centres[i, 1])
                          <= radii[rest] + radii[i] + 1e-3)[0]    # circumscribed circles apart: 0
        inter[near] = _rotated_intersections(boxes[i], boxes[rest[near]])
        return _iou(inter, areas[i], areas[rest])
    return _greedy_nms(order, thresh, top_n, overlaps)


def _decode_rotated(p: _ProposalArgs, anc, d, im_info, args: Args) -> np.ndarray:
    """bbox_transform_rotated, then clip_boxes_rotated (boxes within ``clip_angle_thresh``
    degrees of upright are clipped as upright ones)."""
    dw, dh = np.minimum(d[:, 2], BBOX_XFORM_CLIP), np.minimum(d[:, 3], BBOX_XFORM_CLIP)
    boxes = np.stack([d[:, 0] * anc[:, 2] + anc[:, 0], d[:, 1] * anc[:, 3] + anc[:, 1],
                      np.exp(dw) * anc[:, 2], np.exp(dh) * anc[:, 3],
                      (d[:, 4].astype(np.float64) * 180.0 / math.pi).astype(np.float32) + anc[:, 4]], axis=1)
    if args.bool("angle_bound_on", True):
        lo, hi = args.int("angle_bound_lo", -90), args.int("angle_bound_hi", 90)
        ang = boxes[:, 4]
        boxes[:, 4] = np.where(ang < lo, ang + np.float32(hi - lo), np.where(ang > hi, ang - np.float32(hi - lo), ang))
    upright = np.abs(boxes[:, 4]) <= np.float32(args.float("clip_angle_thresh", 1.0))
    one, two = np.float32(p.plus_one), np.float32(2.0)
    u = boxes[upright]
    xyxy = np.stack([u[:, 0] - (u[:, 2] - one) / two, u[:, 1] - (u[:, 3] - one) / two,
                     u[:, 0] + (u[:, 2] - one) / two, u[:, 1] + (u[:, 3] - one) / two], axis=1)
    im_h, im_w = int(im_info[0]), int(im_info[1])
    xyxy[:, 0::2] = np.maximum(np.minimum(xyxy[:, 0::2], np.float32(im_w - p.plus_one)), np.float32(0))
    xyxy[:, 1::2] = np.maximum(np.minimum(xyxy[:, 1::2], np.float32(im_h - p.plus_one)), np.float32(0))
    u[:, 0], u[:, 1] = (xyxy[:, 0] + xyxy[:, 2]) / two, (xyxy[:, 1] + xyxy[:, 3]) / two
    u[:, 2], u[:, 3] = xyxy[:, 2] - xyxy[:, 0] + one, xyxy[:, 3] - xyxy[:, 1] + one
    boxes[upright] = u
    return boxes


def _one_image(p: _ProposalArgs, scores, deltas, im_info, anchors, args: Args) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (k, 4 or 5) and scores (k,) of one image (scores (A, H, W), deltas (box A, H, W))."""
    a, h, w = scores.shape
    box = anchors.shape[1]
    flat = scores.reshape(-1)
    order = np.argsort(-flat, kind="stable")[:p.candidates(flat.size)]   # (A, H, W) order
    best = flat[order]
    d = deltas.reshape(a, box, h * w).transpose(1, 0, 2).reshape(box, -1)[:, order].T   # (k, box)
    cell_a, cell = order // (h * w), order % (h * w)
    stride = np.float32(1.0) / np.float32(p.spatial_scale)
    sx = (cell % w).astype(np.float32) * stride
    sy = (cell // w).astype(np.float32) * stride
    zero = np.zeros_like(sx)
    shift = [sx, sy, sx, sy] if box == 4 else [sx, sy, zero, zero, zero]
    anc = anchors[cell_a] + np.stack(shift, axis=1)
    if box == 5:
        boxes = _decode_rotated(p, anc, d, im_info, args)
        ws, hs, xc, yc = boxes[:, 2], boxes[:, 3], boxes[:, 0], boxes[:, 1]
    else:
        one, half = np.float32(p.plus_one), np.float32(0.5)
        widths, heights = anc[:, 2] - anc[:, 0] + one, anc[:, 3] - anc[:, 1] + one
        ctr_x, ctr_y = anc[:, 0] + half * widths, anc[:, 1] + half * heights
        dw, dh = np.minimum(d[:, 2], BBOX_XFORM_CLIP), np.minimum(d[:, 3], BBOX_XFORM_CLIP)
        px, py = d[:, 0] * widths + ctr_x, d[:, 1] * heights + ctr_y
        pw, ph = np.exp(dw) * widths, np.exp(dh) * heights
        boxes = np.stack([px - half * pw, py - half * ph, px + half * pw - one, py + half * ph - one], axis=1)
        im_h, im_w = int(im_info[0]), int(im_info[1])          # Caffe2 passes them as int
        boxes[:, 0::2] = np.maximum(np.minimum(boxes[:, 0::2], np.float32(im_w - p.plus_one)), np.float32(0))
        boxes[:, 1::2] = np.maximum(np.minimum(boxes[:, 1::2], np.float32(im_h - p.plus_one)), np.float32(0))
        ws, hs = boxes[:, 2] - boxes[:, 0] + one, boxes[:, 3] - boxes[:, 1] + one
        xc, yc = boxes[:, 0] + ws / np.float32(2), boxes[:, 1] + hs / np.float32(2)
    min_size = np.float32(float(p.min_size) * float(im_info[2]))
    keep = np.nonzero((ws >= min_size) & (hs >= min_size) & (xc < im_info[1]) & (yc < im_info[0]))[0]
    top_n = p.post if 0 < p.post < keep.size else -1
    if box == 5:
        kept = _nms_rotated(boxes, keep, p.nms_thresh, top_n)
    else:
        kept = _nms(boxes, keep, p.nms_thresh, top_n, p.plus_one)
    kept = np.asarray(kept, dtype=np.int64)
    return boxes[kept], best[kept]


def _proposals_kernel(xp, inputs, args):
    """On the host (numpy): sorting and greedy NMS are sequential. On a GPU the inputs are
    read back in one transfer and the outputs copied to the device."""
    p = _ProposalArgs(args)
    _proposal_dims([TensorType(tuple(x.shape)) for x in inputs], args)
    scores, deltas, im_info, anchors = _to_host(xp, inputs[:4])
    rois, probs = [], []
    for i in range(scores.shape[0]):
        boxes, best = _one_image(p, scores[i], deltas[i], im_info[i], anchors, args)
        rois.append(np.concatenate([np.full((len(boxes), 1), i, np.float32), boxes], axis=1))
        probs.append(best)
    out_rois = np.concatenate(rois).astype(np.float32) if rois else np.zeros((0, anchors.shape[1] + 1), np.float32)
    out_probs = np.concatenate(probs).astype(np.float32) if probs else np.zeros((0,), np.float32)
    return xp.asarray(out_rois), xp.asarray(out_probs)


def _proposals_cost(inputs, outputs, args):
    """Sorting A*H*W scores per image, decoding, clipping and filtering the candidates, and
    the NMS overlaps: at most every kept box against every candidate (the bound)."""
    p = _ProposalArgs(args)
    n, a, h, w, box = _proposal_dims(inputs, args)
    cells = a * h * w
    k = p.candidates(cells)
    kept, _ = p.per_image(cells)
    select = cells * (1 + math.log2(max(k, 2)))
    nms = (IOU_FLOPS if box == 4 else ROTATED_IOU_FLOPS) * kept * k
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(n * (select + DECODE_FLOPS_PER_BOX * k + nms)),
                      bytes_read=read, bytes_written=written)


# -- FPN: collect and distribute ------------------------------------------------------------

def _levels(args: Args, op_type: str, lo: str, hi: str, lo_default: int, hi_default: int) -> tuple[int, int]:
    a, b = args.int(lo, lo_default), args.int(hi, hi_default)
    if b < a:
        raise ArgumentError(f"op {args.op}: {op_type} {hi} {b} must be greater than or equal to {lo} {a}")
    return a, b


def _check_outputs(args: Args, op_type: str, want: int) -> None:
    n = getattr(args, "n_outputs", None)
    if n is not None and n != want:
        raise ArgumentError(f"op {args.op}: {op_type} with its levels has {want} outputs, found {n}")


def _collect_rows(inputs, args, op_type: str) -> tuple[int, str | None]:
    """(rows of the collected rois, bound or None) after checking the 2L inputs."""
    lo, hi = _levels(args, op_type, "rpn_min_level", "rpn_max_level", 2, 6)
    levels = hi - lo + 1
    if len(inputs) != 2 * levels:
        raise _fail(args, op_type, inputs, f"rpn levels {lo}..{hi} need {2 * levels} inputs "
                    f"(rois then probs per level), found {len(inputs)}")
    total, bounded = 0, False
    for rois, probs in zip(inputs[:levels], inputs[levels:]):
        if rois.ndim != 2 or rois.shape[1] != 5 or probs.ndim < 1 or probs.shape[0] != rois.shape[0] \
                or probs.size != rois.shape[0]:
            raise _fail(args, op_type, inputs, "each level needs rois (n, 5) and probs (n,)")
        total += rois.shape[0]
        bounded = bounded or rois.bound is not None or probs.bound is not None
    post = args.int("rpn_post_nms_topN", 2000)
    if 0 < post < total:
        return post, f"{op_type} rpn_post_nms_topN={post}"
    return total, (f"{op_type} inputs" if bounded else None)


def _distribute_types(op_type: str, rows: int, bound: str | None, args: Args) -> list[TensorType]:
    lo, hi = _levels(args, op_type, "roi_min_level", "roi_max_level", 2, 5)
    level = TensorType((rows, 5), "float32", bound=f"{op_type} roi levels {lo}..{hi}")
    return [level] * (hi - lo + 1) + [TensorType((rows,), "int32", bound=bound)]


def _collect_infer(inputs, args):
    _check_outputs(args, "CollectRpnProposals", 1)
    rows, bound = _collect_rows(inputs, args, "CollectRpnProposals")
    return [TensorType((rows, 5), "float32", bound=bound)]


def _distribute_infer(inputs, args):
    lo, hi = _levels(args, "DistributeFpnProposals", "roi_min_level", "roi_max_level", 2, 5)
    _check_outputs(args, "DistributeFpnProposals", hi - lo + 2)
    rois = inputs[0]
    if rois.ndim != 2 or rois.shape[1] not in (4, 5):
        raise _fail(args, "DistributeFpnProposals", inputs, "rois must be (R, 5) or (R, 4)")
    return _distribute_types("DistributeFpnProposals", rois.shape[0], rois.bound, args)


def _collect_distribute_infer(inputs, args):
    op_type = "CollectAndDistributeFpnRpnProposals"
    lo, hi = _levels(args, op_type, "roi_min_level", "roi_max_level", 2, 5)
    _check_outputs(args, op_type, hi - lo + 3)
    rows, bound = _collect_rows(inputs, args, op_type)
    return [TensorType((rows, 5), "float32", bound=bound)] + _distribute_types(op_type, rows, bound, args)


def _collect(arrays: list[np.ndarray], args: Args) -> np.ndarray:
    levels = len(arrays) // 2
    rois = np.concatenate([r.reshape(-1, 5) for r in arrays[:levels]]).astype(np.float32)
    scores = np.concatenate([s.reshape(-1) for s in arrays[levels:]]).astype(np.float32)
    order = np.argsort(-scores, kind="stable")           # Caffe2's comparator: ties by index
    post = args.int("rpn_post_nms_topN", 2000)
    if 0 < post < order.size:
        order = order[:post]
    return rois[order]


def _distribute(rois: np.ndarray, args: Args) -> list[np.ndarray]:
    lo, hi = args.int("roi_min_level", 2), args.int("roi_max_level", 5)
    scale, canon = args.int("roi_canonical_scale", 224), args.int("roi_canonical_level", 4)
    one = np.float32(args.bool("legacy_plus_one", True))
    full = np.zeros((rois.shape[0], 5), np.float32)
    full[:, 5 - rois.shape[1]:] = rois
    areas = (full[:, 3] - full[:, 1] + one) * (full[:, 4] - full[:, 2] + one)
    if np.any(areas < 0):
        raise ArgumentError(f"op {args.op}: negative RoI areas (x2 < x1 or y2 < y1)")
    s = np.sqrt(areas)
    lvls = np.floor(np.float32(canon) + np.log(s / np.float32(scale) + np.float32(1e-6)) / np.float32(math.log(2)))
    lvls = np.clip(lvls, lo, hi)
    outs, order = [], []
    for lvl in range(lo, hi + 1):
        idx = np.nonzero(lvls == lvl)[0]
        outs.append(full[idx])
        order.append(idx)
    restore = np.argsort(np.concatenate(order), kind="stable").astype(np.int32)
    return outs + [restore]


def _collect_kernel(xp, inputs, args):
    """On the host (numpy): a sort."""
    return (_collect(_to_host(np, [np.asarray(x) for x in inputs]), args),)


def _distribute_kernel(xp, inputs, args):
    """On the host (numpy)."""
    return tuple(_distribute(np.asarray(inputs[0], dtype=np.float32), args))


def _collect_distribute_kernel(xp, inputs, args):
    """On the host (numpy)."""
    rois = _collect(_to_host(np, [np.asarray(x) for x in inputs]), args)
    return (rois,) + tuple(_distribute(rois, args))


def _collect_cost(inputs, outputs, args):
    total = sum(t.shape[0] for t in inputs[:len(inputs) // 2])
    read, written = io_bytes(inputs, outputs[:1])
    return OpFeatures(flops=float(total * (1 + math.log2(max(total, 2)))), bytes_read=read,
                      bytes_written=written)


def _distribute_cost(inputs, outputs, args):
    """Each RoI's level, then one pass per level; the RoIs are written once (the levels'
    bound rows are not all filled: together they hold each RoI once) and the restore sort."""
    rows = inputs[0].shape[0]
    levels = len(outputs) - 1
    read = float(inputs[0].nbytes)
    written = float(rows * 5 * 4 + outputs[-1].nbytes)
    flops = rows * (LEVEL_FLOPS_PER_ROI + levels + math.log2(max(rows, 2)))
    return OpFeatures(flops=float(flops), bytes_read=read, bytes_written=written)


def _collect_distribute_cost(inputs, outputs, args):
    c = _collect_cost(inputs, outputs, args)
    d = _distribute_cost(outputs[:1], outputs[1:], args)
    return OpFeatures(flops=c.flops + d.flops, bytes_read=c.bytes_read,
                      bytes_written=c.bytes_written + d.bytes_written)


def _proposals_scratch(inputs, outputs, args):
    """Measured with tracemalloc (peak less outputs; A=15, H x W 20x20 .. 100x150, topN
    -1 .. 12000): at most 25 bytes per anchor cell (the argsort, the transposed deltas) plus
    190 per NMS candidate (the gathered deltas, anchors, boxes, NMS temporaries); charged 28
    and 192, plus one copy of the inputs (a GPU kernel's one read-back). Rotated boxes:
    2,700-3,100 bytes per candidate (the 24 intersection points of every pair of one NMS
    step, float64), charged 3,300."""
    p = _ProposalArgs(args)
    _, a, h, w, box = _proposal_dims(inputs, args)
    cells = a * h * w
    per = 192 if box == 4 else 3300
    return 28 * cells + per * p.candidates(cells) + sum(t.nbytes for t in inputs)


def _collect_scratch(inputs, outputs, args):
    """The concatenated RoIs and scores and the sort order, or the 5-column copy, areas and
    levels (tracemalloc: 34-54 bytes per input row with 7,700 or 5,000 rows): charged 40
    bytes per input row plus 3 per byte of the largest output (a level's bound)."""
    rows = sum(t.shape[0] for t in inputs[:len(inputs) // 2]) if len(inputs) > 1 else inputs[0].shape[0]
    return 40 * rows + 3 * max((t.nbytes for t in outputs if t is not None), default=0)


CPU = frozenset({"cpu"})
BOTH = frozenset({"cpu", "gpu"})

register(OpDef("GenerateProposals", _proposals_infer, _proposals_kernel, _proposals_cost,
               devices=BOTH, caffe2_devices=BOTH, min_inputs=4, max_inputs=4, launches=3, scratch=_proposals_scratch,
               doc="Faster R-CNN RPN proposals: top scores, anchor decoding, clip, min_size, greedy NMS "
                   "(rois (R, 5), probs (R,), R bounded by post_nms_topN per image)"))
register(OpDef("CollectRpnProposals", _collect_infer, _collect_kernel, _collect_cost,
               devices=CPU, caffe2_devices=CPU, min_inputs=2, scratch=_collect_scratch,
               doc="FPN: every level's RPN proposals, the rpn_post_nms_topN best by score"))
register(OpDef("DistributeFpnProposals", _distribute_infer, _distribute_kernel, _distribute_cost,
               devices=CPU, caffe2_devices=CPU, min_inputs=1, max_inputs=1, scratch=_collect_scratch,
               doc="FPN: RoIs to their levels by scale, and the permutation restoring their order"))
register(OpDef("CollectAndDistributeFpnRpnProposals", _collect_distribute_infer, _collect_distribute_kernel,
               _collect_distribute_cost, devices=CPU, caffe2_devices=CPU, min_inputs=2, scratch=_collect_scratch,
               doc="FPN: CollectRpnProposals then DistributeFpnProposals in one op"))
