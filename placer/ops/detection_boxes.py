"""Op family 'detection_boxes': Caffe2's Detectron box ops, as torch 1.8.1's Caffe2 has them.

- ``BBoxTransform`` (rois, deltas, im_info) -> box_out [, roi_batch_splits]: applies the
  regression deltas (R, box_dim * K) to the proposals (R, box_dim) or (R, 1 + box_dim)
  (batch index first), per image of im_info (N, 3) = [height, width, scale]; boxes are
  divided by the image's scale, transformed (``bbox_transform`` of
  caffe2/operators/generate_proposals_op_util_boxes.h: deltas over ``weights``, dw and dh
  capped at log(1000 / 16), the "+1" of ``legacy_plus_one``), clipped to the image
  (rotated boxes only when |angle| <= ``clip_angle_thresh``), and multiplied by the scale
  again with ``apply_scale`` (the default). ``rotated`` boxes are [ctr_x, ctr_y, w, h,
  angle in degrees]; their angle is wrapped into [angle_bound_lo, angle_bound_hi] with
  ``angle_bound_on``. As in Caffe2, the rows go to the images by the *count* of each
  batch index, in order (the rois must be grouped by image, increasing), and
  roi_batch_splits is those counts as floats. Caffe2 1.8.1 has no
  ``correct_transform_coords`` any more (it became ``legacy_plus_one``): like Caffe2, this
  ignores it. Output shape is static: box_out is shaped like deltas.
- ``BoxWithNMSLimit`` (scores (R, K), boxes (R, 4 * K'), [batch_splits (N,)]) -> scores
  (D,), boxes (D, 4), classes (D,) [, batch_splits (N,), keeps (D,), keeps_size (N, K)]:
  per image and per class j >= 1 (column 0 is the background), the scores above
  ``score_thresh`` go through greedy NMS at ``nms`` (at most ``detections_per_im`` kept per
  class), or through soft-NMS (``soft_nms_enabled``: ``soft_nms_method`` linear or
  gaussian, ``soft_nms_sigma``, boxes whose decayed score falls below
  ``soft_nms_min_score_thres`` dropped; no per-class limit); then, when more than
  ``detections_per_im`` (> 0) survive in an image, the best of them over all classes.
  Output rows go by image, then class, then score high to low; ``keeps`` holds the kept
  row indices within the image and ``keeps_size`` their count per (image, class).
  ``cls_agnostic_bbox_reg``, ``input_boxes_include_bg_cls``,
  ``output_classes_include_bg_cls`` and ``legacy_plus_one`` as in Caffe2
  (caffe2/operators/box_with_nms_limit_op.h). ``rotated`` boxes (R, 5 * K') are
  [ctr_x, ctr_y, w, h, angle]; their overlap is Caffe2's polygon intersection
  (``rotated_rect_intersection``: edge crossings, contained corners, Graham hull, area),
  ported in float32 and computed pair by pair in Python (slow: fine for hundreds of
  boxes, not for a benchmark); the output boxes are then (D, 5).

Data-dependent size: D is bounded by ``detections_per_im`` per image (and by every
candidate, R * (K - 1), which is also the bound when ``detections_per_im`` <= 0);
``infer`` returns that bound and marks those outputs ``bound``; the kernel returns the
actual rows. The NMS cost is its worst case, every candidate above the threshold.

Ties: Caffe2 orders the candidates of a class, and the survivors of an image, with
``std::sort`` on the score, which is not stable: tied scores come out in an unspecified
order. These kernels break ties by row (a stable sort), so with tied scores only the *set*
of detections is comparable to Caffe2's; with distinct scores the order is exact.
Soft-NMS picks the first maximum of the pending list after Caffe2's swaps, which is
deterministic and followed exactly.

Devices: Caffe2 has CPU kernels only (REGISTER_CPU_OPERATOR in
caffe2/operators/bbox_transform_op.cc and box_with_nms_limit_op.cc; no
bbox_transform_op.cu or box_with_nms_limit_op.cu in caffe2/operators). Placer's kernels
run on the host with numpy (NMS is sequential) and return ``xp`` arrays; on a GPU they read
their inputs back in one copy. So they are registered for both (``devices``) with
``caffe2_devices`` the CPU: the planner keeps them on the CPU unless ``placer plan
--allow-gpu-only-in-placer``.
"""
from __future__ import annotations

import math
from functools import cmp_to_key
from typing import Sequence

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops.detection_proposals import _greedy_nms, _to_host
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType, shape_str

BBOX_XFORM_CLIP = np.float32(math.log(1000.0 / 16.0))  # utils::BBOX_XFORM_CLIP_DEFAULT
PI = np.float32(3.14159265358979323846)                 # utils::PI, a float
TRANSFORM_FLOPS_PER_BOX = 30   # widths, centres, 4 deltas over weights, 2 caps, 2 exp, corners, clip, scale
IOU_FLOPS = 14                 # 4 min/max, 2 widths (+1), 2 clamps, intersection, union, divide, compare
SOFT_NMS_FLOPS = 4             # the weight (with exp for gaussian), the product, the min-score compare
CPU_ONLY = frozenset({"cpu"})
BOTH = frozenset({"cpu", "gpu"})  # placer: the host kernel, its inputs read back from a GPU in one copy


def _fail(args: Args, op_type: str, inputs: Sequence, what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


# -- BBoxTransform ----------------------------------------------------------------------

class _TransformArgs:
    def __init__(self, args: Args):
        self.weights = [np.float32(w) for w in args.floats("weights", [1.0, 1.0, 1.0, 1.0])]
        if len(self.weights) != 4:
            raise ArgumentError(f"op {args.op}: BBoxTransform weights must have 4 values, "
                                f"found {len(self.weights)}")
        self.apply_scale = args.bool("apply_scale", True)
        self.rotated = args.bool("rotated", False)
        self.angle_bound_on = args.bool("angle_bound_on", True)
        self.angle_lo = args.int("angle_bound_lo", -90)
        self.angle_hi = args.int("angle_bound_hi", 90)
        self.clip_angle_thresh = np.float32(args.float("clip_angle_thresh", 1.0))
        self.plus_one = args.bool("legacy_plus_one", True)
        period = self.angle_hi - self.angle_lo
        if self.rotated and self.angle_bound_on and not (period > 0 and period % 180 == 0):
            raise ArgumentError(f"op {args.op}: BBoxTransform angle_bound_hi - angle_bound_lo must be a "
                                f"positive multiple of 180, found {period}")
        self.box_dim = 5 if self.rotated else 4


def _transform_dims(inputs, args, p: _TransformArgs) -> tuple[int, int, int]:
    """(R, K, N), or a ShapeError naming the op."""
    rois, deltas, im_info = inputs[0], inputs[1], inputs[2]
    d = p.box_dim
    if rois.ndim != 2 or rois.shape[1] not in (d, d + 1):
        raise _fail(args, "BBoxTransform", inputs, f"rois must be (R, {d}) or (R, {d + 1})"
                    + (" (rotated)" if p.rotated else ""))
    if deltas.ndim != 2 or deltas.shape[0] != rois.shape[0] or deltas.shape[1] % d:
        raise _fail(args, "BBoxTransform", inputs, f"deltas must be (R, {d} * K) with R = {rois.shape[0]}")
    if im_info.ndim != 2 or im_info.shape[1] != 3:
        raise _fail(args, "BBoxTransform", inputs, "im_info must be (N, 3)")
    if rois.shape[1] == d and im_info.shape[0] != 1:
        raise _fail(args, "BBoxTransform", inputs, "rois without a batch index need im_info (1, 3)")
    return rois.shape[0], deltas.shape[1] // d, im_info.shape[0]


def _transform_infer(inputs, args):
    p = _TransformArgs(args)
    r, k, n = _transform_dims(inputs, args, p)
    outs = [TensorType((r, k * p.box_dim), "float32")]
    if (args.n_outputs or 1) > 1:
        outs.append(TensorType((n,), "float32"))
    return outs


def _upright(boxes, deltas, p: _TransformArgs):
    """utils::bbox_transform_upright in float32, Caffe2's order of operations."""
    f32 = np.float32
    one = f32(int(p.plus_one))
    widths = boxes[:, 2] - boxes[:, 0] + one
    heights = boxes[:, 3] - boxes[:, 1] + one
    ctr_x = boxes[:, 0] + f32(0.5) * widths
    ctr_y = boxes[:, 1] + f32(0.5) * heights
    dx = deltas[:, 0] / p.weights[0]
    dy = deltas[:, 1] / p.weights[1]
    dw = np.minimum(deltas[:, 2] / p.weights[2], BBOX_XFORM_CLIP)
    dh = np.minimum(deltas[:, 3] / p.weights[3], BBOX_XFORM_CLIP)
    pcx, pcy = dx * widths + ctr_x, dy * heights + ctr_y
    pw, ph = np.exp(dw) * widths, np.exp(dh) * heights
    return np.stack([pcx - f32(0.5) * pw, pcy - f32(0.5) * ph,
                     pcx + f32(0.5) * pw - one, pcy + f32(0.5) * ph - one], axis=1)


def _clip_upright(boxes, h, w, plus_one):
    one = int(plus_one)
    hi = np.array([w - one, h - one, w - one, h - one], np.float32)
    return np.maximum(np.minimum(boxes, hi), np.float32(0))


def _rotated(boxes, deltas, p: _TransformArgs):
    """utils::bbox_transform_rotated in float32."""
    dx = deltas[:, 0] / p.weights[0]
    dy = deltas[:, 1] / p.weights[1]
    dw = np.minimum(deltas[:, 2] / p.weights[2], BBOX_XFORM_CLIP)
    dh = np.minimum(deltas[:, 3] / p.weights[3], BBOX_XFORM_CLIP)
    da = deltas[:, 4] * np.float32(180.0) / PI
    out = np.stack([dx * boxes[:, 2] + boxes[:, 0], dy * boxes[:, 3] + boxes[:, 1],
                    np.exp(dw) * boxes[:, 2], np.exp(dh) * boxes[:, 3], da + boxes[:, 4]], axis=1)
    if p.angle_bound_on:
        period = np.float32(p.angle_hi - p.angle_lo)
        a = out[:, 4]
        out[:, 4] = np.where(a < p.angle_lo, a + period, np.where(a > p.angle_hi, a - period, a))
    return out


def _clip_rotated(boxes, h, w, p: _TransformArgs):
    """utils::clip_boxes_rotated: only nearly upright boxes, through corners and back."""
    f32 = np.float32
    one = f32(int(p.plus_one))
    up = np.abs(boxes[:, 4]) <= p.clip_angle_thresh
    out = boxes.copy()
    b = boxes[up]
    cx, cy, bw, bh = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    xyxy = np.stack([cx - (bw - one) / f32(2.0), cy - (bh - one) / f32(2.0),
                     cx + (bw - one) / f32(2.0), cy + (bh - one) / f32(2.0)], axis=1)
    c = _clip_upright(xyxy, h, w, p.plus_one)
    out[up, 0] = (c[:, 0] + c[:, 2]) / f32(2.0)
    out[up, 1] = (c[:, 1] + c[:, 3]) / f32(2.0)
    out[up, 2] = c[:, 2] - c[:, 0] + one
    out[up, 3] = c[:, 3] - c[:, 1] + one
    return out


def _transform_kernel(xp, inputs, args):
    """On the host (numpy), float32 throughout as Caffe2's Eigen code; the result moves to
    ``xp``."""
    p = _TransformArgs(args)
    r, k, n = _transform_dims([TensorType(tuple(a.shape)) for a in inputs[:3]], args, p)
    rois, deltas, im_info = _to_host(xp, inputs[:3])
    d = p.box_dim
    if rois.shape[1] == d:
        counts = np.array([r], dtype=np.int64)
    else:
        ids = rois[:, 0].astype(np.int64)      # int(): truncation, as Caffe2
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            raise ArgumentError(f"op {args.op}: BBoxTransform roi batch index out of range "
                                f"[0, {n}): found {int(ids.min())}..{int(ids.max())}")
        counts = np.bincount(ids, minlength=n)
    out = np.zeros((r, k * d), dtype=np.float32)
    offset = 0
    with np.errstate(all="ignore"):
        for i in range(n):
            num = int(counts[i])
            scale_before = im_info[i, 2]
            scale_after = im_info[i, 2] if p.apply_scale else np.float32(1.0)
            img_h = int(float(im_info[i, 0] / scale_before) + 0.5)
            img_w = int(float(im_info[i, 1] / scale_before) + 0.5)
            cur = rois[offset:offset + num, -d:].copy()
            cur[:, :4] /= scale_before
            for c in range(k):
                dl = deltas[offset:offset + num, c * d:(c + 1) * d]
                if p.rotated:
                    boxes = _clip_rotated(_rotated(cur, dl, p), img_h, img_w, p)
                else:
                    boxes = _clip_upright(_upright(cur, dl, p), img_h, img_w, p.plus_one)
                boxes[:, :4] *= scale_after
                out[offset:offset + num, c * d:(c + 1) * d] = boxes
            offset += num
    outs = [xp.asarray(out)]
    if (args.n_outputs or 1) > 1:
        outs.append(xp.asarray(counts.astype(np.float32)))
    return tuple(outs)


def _transform_cost(inputs, outputs, args):
    """Each (roi, class) box is a fixed count of flops (the transform, clip and scale)."""
    d = 5 if args.bool("rotated", False) else 4
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(TRANSFORM_FLOPS_PER_BOX * (outputs[0].size // d)),
                      bytes_read=read, bytes_written=written)


# -- rotated overlaps (utils::rotated_rect_intersection of generate_proposals_op_util_nms.h)

_F = np.float32


def _vertices(box):
    """RotatedRect(center, size, -angle).get_vertices, float32 as Eigen::Vector2f."""
    cx, cy, w, h = _F(box[0]), _F(box[1]), _F(box[2]), _F(box[3])
    angle = -_F(box[4])
    rad = float(angle) * 0.01745329251
    b = _F(math.cos(rad)) * _F(0.5)
    a = _F(math.sin(rad)) * _F(0.5)
    p0 = (cx - a * h - b * w, cy + b * h - a * w)
    p1 = (cx + a * h - b * w, cy - b * h - a * w)
    two = _F(2)
    return [p0, p1, (two * cx - p0[0], two * cy - p0[1]), (two * cx - p1[0], two * cy - p1[1])]


def _cross(ax, ay, bx, by):
    return ax * by - bx * ay


def _inside(points, rect, out):
    """Vertices of ``points`` inside the rectangle ``rect`` (projections on two sides)."""
    abx, aby = rect[1][0] - rect[0][0], rect[1][1] - rect[0][1]
    dax, day = rect[0][0] - rect[3][0], rect[0][1] - rect[3][1]
    ab2, ad2 = abx * abx + aby * aby, dax * dax + day * day
    zero = _F(0)
    for px, py in points:
        apx, apy = px - rect[0][0], py - rect[0][1]
        pab = apx * abx + apy * aby
        pad = -(apx * dax + apy * day)
        if pab >= zero and pad >= zero and pab <= ab2 and pad <= ad2:
            out.append((px, py))


def _rotated_intersection(box1, box2) -> float:
    pts1, pts2 = _vertices(box1), _vertices(box2)
    eps_same = 0.00001
    if all(abs(float(pts1[i][0] - pts2[i][0])) <= eps_same and abs(float(pts1[i][1] - pts2[i][1])) <= eps_same
           for i in range(4)):
        return float(min(_F(box1[2]) * _F(box1[3]), _F(box2[2]) * _F(box2[3])))   # INTERSECT_FULL
    vec1 = [(pts1[(i + 1) % 4][0] - pts1[i][0], pts1[(i + 1) % 4][1] - pts1[i][1]) for i in range(4)]
    vec2 = [(pts2[(i + 1) % 4][0] - pts2[i][0], pts2[(i + 1) % 4][1] - pts2[i][1]) for i in range(4)]
    found = []
    zero, one = _F(0), _F(1)
    for i in range(4):
        for j in range(4):
            det = _cross(vec2[j][0], vec2[j][1], vec1[i][0], vec1[i][1])
            if abs(float(det)) <= 1e-14:
                continue
            v12x, v12y = pts2[j][0] - pts1[i][0], pts2[j][1] - pts1[i][1]
            t1 = _cross(vec2[j][0], vec2[j][1], v12x, v12y) / det
            t2 = _cross(vec1[i][0], vec1[i][1], v12x, v12y) / det
            if t1 >= zero and t1 <= one and t2 >= zero and t2 <= one:
                found.append((pts1[i][0] + t1 * vec1[i][0], pts1[i][1] + t1 * vec1[i][1]))
    _inside(pts1, pts2, found)
    _inside(pts2, pts1, found)
    if len(found) <= 2:
        return 0.0
    return _hull_area(found)


def _hull_area(p) -> float:
    """convex_hull_graham (shifted to the lowest point) then polygon_area."""
    t = 0
    for i in range(1, len(p)):
        if p[i][1] < p[t][1] or (p[i][1] == p[t][1] and p[i][0] < p[t][0]):
            t = i
    sx, sy = p[t]
    q = [(x - sx, y - sy) for x, y in p]
    q[0], q[t] = q[t], q[0]

    def before(a, b):
        c = _cross(a[0], a[1], b[0], b[1])
        if abs(float(c)) < 1e-6:
            return a[0] * a[0] + a[1] * a[1] < b[0] * b[0] + b[1] * b[1]
        return c > 0

    rest = sorted(q[1:], key=cmp_to_key(lambda a, b: -1 if before(a, b) else (1 if before(b, a) else 0)))
    q = [q[0]] + rest
    k = 1
    while k < len(q) and not float(q[k][0] * q[k][0] + q[k][1] * q[k][1]) > 1e-8:
        k += 1
    if k == len(q):
        return 0.0
    stack = [q[0], q[k]]
    zero = _F(0)
    for i in range(k + 1, len(q)):
        while len(stack) > 1 and _cross(q[i][0] - stack[-2][0], q[i][1] - stack[-2][1],
                                        stack[-1][0] - stack[-2][0], stack[-1][1] - stack[-2][1]) >= zero:
            stack.pop()
        stack.append(q[i])
    if len(stack) <= 2:
        return 0.0
    area = 0.0
    for i in range(1, len(stack) - 1):
        area += abs(float(_cross(stack[i][0] - stack[0][0], stack[i][1] - stack[0][1],
                                 stack[i + 1][0] - stack[0][0], stack[i + 1][1] - stack[0][1])))
    return area / 2.0


def _iou_rotated(i, rest, boxes, areas):
    """nms_cpu_rotated's overlaps of box i with boxes ``rest``, in float32."""
    inter = np.array([_rotated_intersection(boxes[i], boxes[j]) for j in rest], dtype=np.float32)
    return inter / (areas[i] + areas[rest] - inter)


# -- BoxWithNMSLimit --------------------------------------------------------------------

class _NMSArgs:
    def __init__(self, args: Args):
        self.score_thresh = np.float32(args.float("score_thresh", 0.05))
        self.nms = np.float32(args.float("nms", 0.3))
        self.detections_per_im = args.int("detections_per_im", 100)
        self.soft = args.bool("soft_nms_enabled", False)
        method = args.str("soft_nms_method", "linear")
        if method not in ("linear", "gaussian"):
            raise ArgumentError(f"op {args.op}: BoxWithNMSLimit soft_nms_method must be linear or gaussian, "
                                f"found {method!r}")
        self.method = method
        self.sigma = np.float32(args.float("soft_nms_sigma", 0.5))
        self.min_score = np.float32(args.float("soft_nms_min_score_thres", 0.001))
        self.rotated = args.bool("rotated", False)
        self.box_dim = 5 if self.rotated else 4
        self.agnostic = args.bool("cls_agnostic_bbox_reg", False)
        self.boxes_bg = args.bool("input_boxes_include_bg_cls", True)
        self.classes_bg = args.bool("output_classes_include_bg_cls", True)
        self.plus_one = args.bool("legacy_plus_one", True)
        self.n_outputs = args.n_outputs or 3

    def box_cls(self, j: int) -> int:
        return 0 if self.agnostic else (j - 1 if not self.boxes_bg else j)

    def score_cls(self, j: int) -> int:
        return j - 1 + int(self.boxes_bg)


def _nms_dims(inputs, args, p: _NMSArgs) -> tuple[int, int, int]:
    """(R, K, N), or a ShapeError naming the op."""
    scores, boxes = inputs[0], inputs[1]
    for name, t in (("scores", scores), ("boxes", boxes)):
        if not (t.ndim == 2 or (t.ndim == 4 and t.shape[2] == t.shape[3] == 1)):
            raise _fail(args, "BoxWithNMSLimit", inputs, f"{name} must be 2-D (or 4-D with 1 x 1 trailing dims)")
    r, k = scores.shape[0], scores.shape[1]
    if k < 1:
        raise _fail(args, "BoxWithNMSLimit", inputs, "scores need at least 1 class column")
    nbc, d = p.box_cls(k - 1) + 1, p.box_dim
    if boxes.shape[0] != r or boxes.shape[1] != nbc * d:
        raise _fail(args, "BoxWithNMSLimit", inputs, f"boxes must be ({r}, {nbc * d}) for {k} score classes"
                    + (" (rotated)" if p.rotated else ""))
    n = 1
    if len(inputs) > 2:
        if inputs[2].ndim != 1 or inputs[2].dtype not in ("int32", "float32"):
            raise _fail(args, "BoxWithNMSLimit", inputs, "batch_splits must be 1-D (N,), int32 or float32")
        n = inputs[2].shape[0]
    if p.n_outputs not in (3, 4, 6):
        raise _fail(args, "BoxWithNMSLimit", inputs, f"takes 3, 4 or 6 outputs, found {p.n_outputs}")
    return r, k, n


def _bound(r: int, k: int, n: int, p: _NMSArgs) -> int:
    every = r * max(k - 1, 0)
    return min(p.detections_per_im * n, every) if p.detections_per_im > 0 else every


def _nms_infer(inputs, args):
    p = _NMSArgs(args)
    r, k, n = _nms_dims(inputs, args, p)
    d = _bound(r, k, n, p)
    bound = f"BoxWithNMSLimit detections_per_im={p.detections_per_im}"
    outs = [TensorType((d,), "float32", bound=bound), TensorType((d, p.box_dim), "float32", bound=bound),
            TensorType((d,), "float32", bound=bound)]
    if p.n_outputs > 3:
        outs.append(TensorType((n,), "float32"))
    if p.n_outputs > 4:
        outs += [TensorType((d,), "int32", bound=bound), TensorType((n, k), "int32")]
    return outs


def _iou_one(i, rest, x1, y1, x2, y2, areas, one):
    """utils::nms_cpu_upright's overlaps of box i with boxes ``rest``, in float32."""
    xx1 = np.maximum(x1[rest], x1[i])
    yy1 = np.maximum(y1[rest], y1[i])
    xx2 = np.minimum(x2[rest], x2[i])
    yy2 = np.minimum(y2[rest], y2[i])
    w = np.maximum(xx2 - xx1 + one, np.float32(0))
    h = np.maximum(yy2 - yy1 + one, np.float32(0))
    inter = w * h
    return inter / (areas[i] + areas[rest] - inter)


def _overlaps(boxes, one, rotated):
    """overlap(i, rest): the IoU of box i with boxes ``rest`` as Caffe2's NMS computes it."""
    if rotated:
        areas = boxes[:, 2] * boxes[:, 3]
        return lambda i, rest: _iou_rotated(i, rest, boxes, areas)
    x1, y1, x2, y2 = (np.ascontiguousarray(boxes[:, c]) for c in range(4))
    areas = (x2 - x1 + one) * (y2 - y1 + one)
    return lambda i, rest: _iou_one(i, rest, x1, y1, x2, y2, areas, one)


def _soft_nms(scores, overlap, pending, p: _NMSArgs):
    """utils::soft_nms_cpu_upright / _rotated: returns (keep, decayed scores)."""
    out = scores.copy()
    keep = []
    while pending.size:
        pos = int(np.argmax(out[pending]))        # Eigen maxCoeff: the first maximum
        i = int(pending[pos])
        keep.append(i)
        pending = pending.copy()
        pending[0], pending[pos] = pending[pos], pending[0]
        rest = pending[1:]
        ovr = overlap(i, rest)
        if p.method == "linear":
            weight = np.where(ovr > p.nms, (1.0 - ovr.astype(np.float64)).astype(np.float32), np.float32(1))
        else:
            o = ovr.astype(np.float64)
            weight = np.exp(-o * o / np.float64(p.sigma)).astype(np.float32)
        out[rest] = out[rest] * weight
        pending = rest[out[rest] >= p.min_score]
    return keep, out


def _nms_kernel(xp, inputs, args):
    """On the host (numpy): NMS is sequential. Ties in score are broken by row (see the
    module docstring); the outputs move to ``xp``."""
    p = _NMSArgs(args)
    r, k, n = _nms_dims([TensorType(tuple(a.shape)) for a in inputs], args, p)
    host = _to_host(xp, inputs)        # from a GPU: one device-to-host read
    scores_all = host[0].reshape(r, k)
    boxes_all = host[1].reshape(r, inputs[1].shape[1])
    splits = (host[2].astype(np.int64) if len(inputs) > 2 else np.array([r], np.int64))
    if splits.sum() != r or (splits < 0).any():
        raise ArgumentError(f"op {args.op}: BoxWithNMSLimit batch_splits {splits.tolist()} must be "
                            f"non-negative and add up to {r} boxes")
    one = np.float32(int(p.plus_one))
    d = p.box_dim
    top_n = p.detections_per_im if p.detections_per_im > 0 else -1
    o_scores, o_boxes, o_classes, o_keeps, per_image = [], [], [], [], []
    keeps_size = np.zeros((n, k), dtype=np.int32)
    offset = 0
    with np.errstate(all="ignore"):
        for b in range(n):
            m = int(splits[b])
            scores = scores_all[offset:offset + m]
            boxes = boxes_all[offset:offset + m]
            final_scores = scores.copy()
            keeps: list[list[int]] = [[] for _ in range(k)]
            for j in range(1, k):
                col = np.ascontiguousarray(scores[:, p.score_cls(j)])
                cb = boxes[:, p.box_cls(j) * d:p.box_cls(j) * d + d]
                inds = np.nonzero(col > p.score_thresh)[0]
                overlap = _overlaps(cb, one, p.rotated)
                if p.soft:
                    keeps[j], final_scores[:, p.score_cls(j)] = _soft_nms(col, overlap, inds, p)
                else:
                    order = inds[np.argsort(-col[inds], kind="stable")]
                    keeps[j] = _greedy_nms(order, p.nms, top_n, overlap)
            total = sum(len(kp) for kp in keeps)
            if p.detections_per_im > 0 and total > p.detections_per_im:
                flat = [(j, i) for j in range(1, k) for i in keeps[j]]
                vals = np.array([final_scores[i, p.score_cls(j)] for j, i in flat], dtype=np.float32)
                best = np.argsort(-vals, kind="stable")[:p.detections_per_im]
                keeps = [[] for _ in range(k)]
                for t in best:
                    j, i = flat[int(t)]
                    keeps[j].append(i)
                total = p.detections_per_im
            per_image.append(total)
            for j in range(1, k):
                kp = np.asarray(keeps[j], dtype=np.int64)
                o_scores.append(final_scores[kp, p.score_cls(j)])
                o_boxes.append(boxes[kp, p.box_cls(j) * d:p.box_cls(j) * d + d])
                o_classes.append(np.full(kp.size, j - (not p.classes_bg), dtype=np.float32))
            for j in range(k):
                o_keeps.append(np.asarray(keeps[j], dtype=np.int32))
                keeps_size[b, j] = len(keeps[j])
            offset += m
    cat = (lambda parts, shape, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(shape, dt))
    outs = [cat(o_scores, (0,), np.float32), cat(o_boxes, (0, d), np.float32).reshape(-1, d),
            cat(o_classes, (0,), np.float32)]
    if p.n_outputs > 3:
        outs.append(np.asarray(per_image, dtype=np.float32))
    if p.n_outputs > 4:
        outs += [cat(o_keeps, (0,), np.int32), keeps_size]
    return tuple(xp.asarray(o) for o in outs)


def _nms_cost(inputs, outputs, args):
    """Worst case: every score above the threshold, so each class of each image runs NMS
    over all its R_b boxes (a sort, then each kept box against the rest: R_b (R_b - 1) / 2
    overlaps when none is suppressed), then the sort over all survivors. With the batch
    split unknown, the worst case puts all R boxes in one image."""
    p = _NMSArgs(args)
    r, k, n = _nms_dims(inputs, args, p)
    classes = max(k - 1, 0)
    select = r * classes                                     # the threshold compare
    sort = classes * r * math.log2(max(r, 2))
    overlaps = IOU_FLOPS * classes * r * (r - 1) / 2
    soft = SOFT_NMS_FLOPS * classes * r * (r - 1) / 2 if p.soft else 0
    survivors = outputs[0].shape[0] if outputs else 0
    final = r * classes * math.log2(max(r * classes, 2)) if p.detections_per_im > 0 else 0
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(select + sort + overlaps + soft + final + survivors),
                      bytes_read=read, bytes_written=written)


register(OpDef("BBoxTransform", _transform_infer, _transform_kernel, _transform_cost,
               devices=BOTH, host_kernel=True, caffe2_devices=CPU_ONLY, min_inputs=3, max_inputs=3,
               launches=2,          # on a GPU: the inputs joined for one read back, the boxes made
               doc="Detectron box regression: deltas applied to rois per image, clipped; (R, 4K) "
                   "[+ roi_batch_splits] (CPU only in Caffe2: bbox_transform_op.cc)"))
register(OpDef("BoxWithNMSLimit", _nms_infer, _nms_kernel, _nms_cost,
               devices=BOTH, host_kernel=True, caffe2_devices=CPU_ONLY, min_inputs=2, max_inputs=3,
               launches=4,          # on a GPU: one join for the read back, scores, boxes, classes made
               doc="per-class NMS or soft-NMS (upright or rotated) and a per-image detection limit; D rows bounded by "
                   "detections_per_im (CPU only in Caffe2: box_with_nms_limit_op.cc)"))
