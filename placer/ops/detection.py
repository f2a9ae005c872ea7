"""Op family 'detection': the SSD layers of weiliu89's Caffe fork.

The Caffe converter keeps these layers as ops of their Caffe type, with the fields of their
``*_param`` message flattened into arguments (``nms_param.top_k``); the semantics below
are the fork's (its CPU code), with its proto defaults where an argument is absent.

- ``Permute`` (X): X transposed by ``order``; axes ``order`` leaves out follow in
  increasing order (order [0, 2, 3, 1] turns NCHW into NHWC).
- ``Normalize`` (X, scale): X (N, C, ...) divided by its L2 norm, sqrt(sum x^2 + eps), the
  sum over the channels at each position (``across_spatial`` 0) or over the whole sample
  (``across_spatial`` 1, the default), then times ``scale``: (C,) per channel
  (``channel_shared`` 0) or (1,) for all (the default). ``eps`` defaults to 1e-10. Caffe2's
  own one-input Normalize (no scale) is refused by the arity check rather than run with
  these semantics.
- ``PriorBox`` (feature map, image): the default boxes of SSD for an H x W map, (1, 2,
  H*W*num_priors*4): row 0 the boxes (xmin, ymin, xmax, ymax, normalised by the image
  size), row 1 their variances. See ``_prior_sizes`` for the order of the priors at a
  position. Also reads the argument spellings of the Caffe2 SSD port (``min_sizes``,
  ``max_sizes``, ``aspect_ratios``).
- ``DetectionOutput`` (loc, conf, priors): decodes the location predictions against the
  priors, keeps per class the boxes that survive greedy NMS, then the ``keep_top_k`` best
  of an image. See ``_detect``. CPU only: the fork's GPU layer also ran the NMS on the host.

Costs are counted from the shapes: DetectionOutput's NMS work depends on the scores, so
its figures are the upper bound of every candidate surviving the threshold.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, io_bytes, movement_cost, register
from placer.types import Args, OpFeatures, TensorType, shape_str

NORMALIZE_FLOPS_PER_ELEMENT = 4   # square, add to the sum, divide by the norm, times the scale
PRIOR_FLOPS_PER_COORD = 2         # centre +- half size, divided by the image size
DECODE_FLOPS_PER_BOX = 20         # CENTER_SIZE: prior centre/size, 4 scaled offsets, 2 exp, corners
IOU_FLOPS = 12                    # 4 min/max, 2 widths, intersection, union, divide, compare
CODE_TYPES = {1: "CORNER", 2: "CENTER_SIZE", 3: "CORNER_SIZE"}


def _fail(args: Args, op_type: str, inputs: Sequence[TensorType], what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


# -- Permute ----------------------------------------------------------------------------

def _permute_order(ndim: int, args: Args, inputs: Sequence) -> list[int]:
    order = args.ints("order", [])
    if len(set(order)) != len(order) or any(not 0 <= o < ndim for o in order):
        raise _fail(args, "Permute", inputs, f"order {order} is not a set of distinct axes below {ndim}")
    return order + [i for i in range(ndim) if i not in order]


def _permute_infer(inputs, args):
    x = inputs[0]
    order = _permute_order(x.ndim, args, inputs)
    return [TensorType(tuple(x.shape[a] for a in order), x.dtype)]


def _permute_kernel(xp, inputs, args):
    x = inputs[0]
    return (x.transpose(_permute_order(x.ndim, args, ())).copy(),)  # C order, never a view


# -- Normalize --------------------------------------------------------------------------

def _normalize_infer(inputs, args):
    x, scale = inputs[0], inputs[1]
    if x.ndim < 2:
        raise _fail(args, "Normalize", inputs, "X needs at least 2 dimensions (N, C, ...)")
    want = 1 if args.bool("channel_shared", True) else x.shape[1]
    if scale.size != want:
        raise _fail(args, "Normalize", inputs,
                    f"scale has {scale.size} values, expected {want} "
                    f"(channel_shared {int(args.bool('channel_shared', True))})")
    return [TensorType(x.shape, x.dtype)]


def _normalize_kernel(xp, inputs, args):
    x, scale = inputs[0], inputs[1]
    eps = args.float("eps", 1e-10)
    squares = x * x
    if args.bool("across_spatial", True):
        sums = squares.reshape(x.shape[0], -1).sum(axis=1).reshape((x.shape[0],) + (1,) * (x.ndim - 1))
    else:
        sums = squares.sum(axis=1, keepdims=True)
    norm = xp.sqrt(sums + eps)
    factor = scale.reshape((1, -1) + (1,) * (x.ndim - 2))  # (1, C, 1, ..) or (1, 1, 1, ..)
    return ((x / norm * factor).astype(x.dtype, copy=False),)


def _normalize_cost(inputs, outputs, args):
    x = inputs[0]
    norms = x.shape[0] if args.bool("across_spatial", True) else x.size // max(x.shape[1], 1)
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(NORMALIZE_FLOPS_PER_ELEMENT * x.size + norms),
                      bytes_read=read, bytes_written=written)


# -- PriorBox ---------------------------------------------------------------------------

def _floats_either(args: Args, *names: str) -> list[float]:
    for name in names:
        if name in args:
            return args.floats(name)
    return []


def _aspect_ratios(args: Args) -> list[float]:
    """1, then each new ratio (and 1/ratio with ``flip``), duplicates within 1e-6 dropped."""
    ratios, flip = [1.0], args.bool("flip", True)
    for r in _floats_either(args, "aspect_ratio", "aspect_ratios"):
        if all(abs(r - q) >= 1e-6 for q in ratios):
            ratios.append(r)
            if flip:
                ratios.append(1.0 / r)
    return ratios


def _prior_sizes(args: Args) -> list[tuple[float, float]]:
    """(width, height) in pixels of the priors at one position, in the fork's order: for each
    min_size, the min_size square, the sqrt(min_size * max_size) square (when max sizes are
    given), then min_size * sqrt(r) by min_size / sqrt(r) for each aspect ratio r != 1. The
    fork reads min_size and max_size into integers; so does this."""
    mins = _floats_either(args, "min_size", "min_sizes")
    maxs = _floats_either(args, "max_size", "max_sizes")
    if not mins or any(m <= 0 for m in mins):
        raise ArgumentError(f"op {args.op}: PriorBox needs positive min_size values, found {mins}")
    if maxs and (len(maxs) != len(mins) or any(M <= m for m, M in zip(mins, maxs))):
        raise ArgumentError(f"op {args.op}: PriorBox max_size {maxs} must pair with min_size {mins}, "
                            f"each larger")
    sizes = []
    for s, m in enumerate(mins):
        m = int(m)
        sizes.append((float(m), float(m)))
        if maxs:
            side = math.sqrt(m * int(maxs[s]))
            sizes.append((side, side))
        sizes.extend((m * math.sqrt(r), m / math.sqrt(r)) for r in _aspect_ratios(args) if abs(r - 1.0) >= 1e-6)
    return sizes


def _variances(args: Args) -> list[float]:
    v = args.floats("variance", [0.1])
    if len(v) not in (1, 4) or any(x <= 0 for x in v):
        raise ArgumentError(f"op {args.op}: PriorBox variance takes 1 or 4 positive values, found {v}")
    return v * 4 if len(v) == 1 else v


def _image_size(args: Args, image_shape: tuple) -> tuple[float, float]:
    """(height, width): img_h/img_w, else img_size, else the image input's own size."""
    h, w = args.int("img_h", 0), args.int("img_w", 0)
    if not (h and w):
        h = w = args.int("img_size", 0)
    return (float(h), float(w)) if h and w else (float(image_shape[2]), float(image_shape[3]))


def _steps(args: Args, layer_hw: tuple, image_hw: tuple) -> tuple[float, float]:
    """(step_h, step_w): step_h/step_w, else step, else image size / map size."""
    sh, sw = args.float("step_h", 0.0), args.float("step_w", 0.0)
    if not (sh and sw):
        sh = sw = args.float("step", 0.0)
    if sh and sw:
        return sh, sw
    return image_hw[0] / layer_hw[0], image_hw[1] / layer_hw[1]


def _priorbox_infer(inputs, args):
    fmap, image = inputs[0], inputs[1]
    if fmap.ndim != 4 or image.ndim != 4:
        raise _fail(args, "PriorBox", inputs, "the feature map and the image must be 4-D (N, C, H, W)")
    n = fmap.shape[2] * fmap.shape[3] * len(_prior_sizes(args)) * 4
    _variances(args)
    return [TensorType((1, 2, n), "float32")]


def _priorbox_kernel(xp, inputs, args):
    """The priors follow from shapes and arguments only: computed on the host (numpy) and
    moved to the op's device in one copy, instead of a score of tiny kernels there."""
    fmap, image = inputs[0], inputs[1]
    H, W = int(fmap.shape[2]), int(fmap.shape[3])
    img_h, img_w = _image_size(args, tuple(image.shape))
    step_h, step_w = _steps(args, (H, W), (img_h, img_w))
    offset = args.float("offset", 0.5)
    sizes = np.asarray(_prior_sizes(args), dtype=np.float64)       # (P, 2)
    half_w, half_h = sizes[:, 0] / 2.0, sizes[:, 1] / 2.0
    cx = ((np.arange(W, dtype=np.float64) + offset) * step_w)[None, :, None]
    cy = ((np.arange(H, dtype=np.float64) + offset) * step_h)[:, None, None]
    grid = (H, W, len(sizes))
    corners = [(cx - half_w) / img_w, (cy - half_h) / img_h, (cx + half_w) / img_w, (cy + half_h) / img_h]
    boxes = np.stack([np.broadcast_to(c, grid) for c in corners], axis=-1).reshape(-1)
    if args.bool("clip", False):
        boxes = np.clip(boxes, 0.0, 1.0)
    variances = np.broadcast_to(np.asarray(_variances(args), dtype=np.float64), (boxes.size // 4, 4))
    return (xp.asarray(np.stack([boxes, variances.reshape(-1)])[None].astype(np.float32)),)


def _priorbox_cost(inputs, outputs, args):
    """Only the inputs' shapes are read; each box coordinate is a few flops (twice with clip)."""
    coords = outputs[0].size // 2
    per = PRIOR_FLOPS_PER_COORD * (2 if args.bool("clip", False) else 1)
    return OpFeatures(flops=float(per * coords), bytes_written=float(outputs[0].nbytes))


# -- DetectionOutput --------------------------------------------------------------------

class _DetectionArgs:
    """DetectionOutput's arguments, with the fork's defaults, read once."""

    def __init__(self, args: Args):
        self.num_classes = args.int("num_classes")
        self.share_location = args.bool("share_location", True)
        self.background = args.int("background_label_id", 0)
        code = args.get("code_type", "CORNER")
        self.code_type = CODE_TYPES.get(code, code) if isinstance(code, int) else args.str("code_type", "CORNER")
        if self.code_type not in CODE_TYPES.values():
            raise ArgumentError(f"op {args.op}: DetectionOutput code_type {code!r} is not one of "
                                f"{', '.join(CODE_TYPES.values())}")
        self.variance_in_target = args.bool("variance_encoded_in_target", False)
        self.keep_top_k = args.int("keep_top_k", -1)
        self.threshold = args.float("confidence_threshold", float("-inf"))
        self.nms_threshold = args.float("nms_param.nms_threshold", 0.3)
        self.top_k = args.int("nms_param.top_k", -1)
        self.eta = args.float("nms_param.eta", 1.0)
        if self.num_classes < 1:
            raise ArgumentError(f"op {args.op}: DetectionOutput num_classes {self.num_classes} must be 1 or more")

    @property
    def classes(self) -> list[int]:
        """The classes that get detections: all but the background (read after the inputs'
        shapes are checked against num_classes, so a huge num_classes never gets a list)."""
        return [c for c in range(self.num_classes) if c != self.background]

    @property
    def n_classes(self) -> int:
        return self.num_classes - (1 if 0 <= self.background < self.num_classes else 0)

    def candidates(self, num_priors: int) -> int:
        """Boxes per (image, class) that enter NMS."""
        return num_priors if self.top_k < 0 else min(self.top_k, num_priors)

    def rows(self, batch: int, num_priors: int) -> int:
        """The output's fixed row count: the most detections the batch can give (at least 1)."""
        if self.keep_top_k > -1:
            return max(batch * self.keep_top_k, 1)
        return max(batch * self.n_classes * self.candidates(num_priors), 1)


def _detection_dims(inputs, args, p: _DetectionArgs) -> tuple[int, int]:
    """(batch, priors), or a ShapeError when loc, conf and priors disagree."""
    loc, conf, prior = inputs[0], inputs[1], inputs[2]
    if prior.ndim != 3 or prior.shape[1] != 2 or prior.shape[2] % 4:
        raise _fail(args, "DetectionOutput", inputs, "priors must be (1, 2, num_priors * 4)")
    n, priors = loc.shape[0], prior.shape[2] // 4
    loc_classes = 1 if p.share_location else p.num_classes
    if loc.size != n * priors * loc_classes * 4 or conf.shape[0] != n or conf.size != n * priors * p.num_classes:
        raise _fail(args, "DetectionOutput", inputs,
                    f"{priors} priors need loc (N, {priors * loc_classes * 4}) and conf "
                    f"(N, {priors * p.num_classes}) with num_classes {p.num_classes}")
    return n, priors


def _detection_infer(inputs, args):
    p = _DetectionArgs(args)
    n, priors = _detection_dims(inputs, args, p)
    return [TensorType((1, 1, p.rows(n, priors), 7), "float32")]


def _decode(xp, loc, prior_boxes, variances, p: _DetectionArgs):
    """Boxes (..., P, 4) from location predictions (..., P, 4) and priors (P, 4)."""
    var = 1.0 if p.variance_in_target else variances
    d = loc * var
    x0, y0, x1, y1 = (prior_boxes[:, i] for i in range(4))
    pw, ph = x1 - x0, y1 - y0
    if p.code_type == "CORNER":
        return prior_boxes + d
    if p.code_type == "CORNER_SIZE":
        return prior_boxes + d * xp.stack([pw, ph, pw, ph], axis=-1)
    cx = d[..., 0] * pw + (x0 + x1) / 2
    cy = d[..., 1] * ph + (y0 + y1) / 2
    w, h = xp.exp(d[..., 2]) * pw, xp.exp(d[..., 3]) * ph
    return xp.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def _iou(xp, b):
    """Pairwise Jaccard overlap (..., K, K) of boxes (..., K, 4), as the fork computes it:
    0 without a positive-area intersection; a box with max < min has area 0."""
    x0, y0, x1, y1 = (xp.ascontiguousarray(b[..., i]) for i in range(4))
    iw = xp.minimum(x1[..., :, None], x1[..., None, :]) - xp.maximum(x0[..., :, None], x0[..., None, :])
    ih = xp.minimum(y1[..., :, None], y1[..., None, :]) - xp.maximum(y0[..., :, None], y0[..., None, :])
    meets = (iw > 0) & (ih > 0)
    inter = iw * ih
    w, h = x1 - x0, y1 - y0
    area = xp.where((w < 0) | (h < 0), 0, w * h)
    union = area[..., :, None] + area[..., None, :] - inter
    return xp.where(meets, inter / xp.where(meets, union, 1), 0)


def _nms(xp, iou, valid, p: _DetectionArgs):
    """Greedy NMS over candidates sorted by score, every (image, class) row at once: a
    candidate is kept when its overlap with every box kept before it is <= the threshold
    (times ``eta`` after each keep while above 0.5, the fork's adaptive NMS). The loop
    over candidates is the algorithm's own order."""
    kept = xp.zeros(valid.shape, dtype=bool)
    threshold = xp.full(valid.shape[:-1], p.nms_threshold)
    for i in range(int(valid.sum(axis=-1).max()) if valid.size else 0):
        worst = xp.max(xp.where(kept, iou[..., i, :], 0), axis=-1)
        keep = valid[..., i] & (worst <= threshold)
        kept[..., i] = keep
        if p.eta < 1.0:
            threshold = xp.where(keep & (threshold > 0.5), threshold * p.eta, threshold)
    return kept


def _descending(xp, scores):
    """Indices sorting each row of (R, M) scores high to low, ties by position (the fork's
    stable sort); lexsort makes the order exact without relying on a sort's stability."""
    r, m = scores.shape
    rows = xp.broadcast_to(xp.arange(r)[:, None], (r, m)).reshape(-1)
    cols = xp.broadcast_to(xp.arange(m)[None, :], (r, m)).reshape(-1)
    flat = xp.lexsort(xp.stack([cols, -scores.reshape(-1).astype(xp.float64), rows]))
    return (flat % m).reshape(r, m) if m else flat.reshape(r, m)


def _detect(xp, inputs, args: Args, p: _DetectionArgs):
    """Rows (image, label, score, xmin, ymin, xmax, ymax) in the fork's order: by image,
    then label, then score high to low.

    Per image and class (background skipped): the scores above ``confidence_threshold``,
    the ``nms_param.top_k`` best of them, greedy NMS at ``nms_param.nms_threshold``; then
    per image, when more than ``keep_top_k`` survive, the ``keep_top_k`` best scores.
    Boxes are decoded by ``code_type`` (CENTER_SIZE: centre += var * loc * prior size,
    size *= exp(var * loc)) and not clipped, as in the fork's CPU layer."""
    loc, conf, prior = inputs[0], inputs[1], inputs[2]
    n, priors = _detection_dims([TensorType(tuple(a.shape)) for a in inputs[:3]], args, p)
    loc_classes = 1 if p.share_location else p.num_classes
    pri = prior.reshape(-1, 2, priors, 4)[0].astype(xp.float32)
    boxes = _decode(xp, loc.reshape(n, priors, loc_classes, 4).astype(xp.float32).transpose(0, 2, 1, 3),
                    pri[0], pri[1], p)                                        # (N, L, P, 4)
    cls = xp.asarray(p.classes, dtype=xp.int64)
    scores = conf.reshape(n, priors, p.num_classes).astype(xp.float32).transpose(0, 2, 1)[:, cls]  # (N, C', P)
    c = len(p.classes)
    k = p.candidates(priors)
    masked = xp.where(scores > p.threshold, scores, -xp.inf)
    order = _descending(xp, masked.reshape(n * c, priors)).reshape(n, c, priors)[..., :k]
    best = xp.take_along_axis(masked, order, axis=-1)                          # (N, C', K)
    loc_rows = cls if not p.share_location else xp.zeros(c, dtype=xp.int64)
    cand = boxes[xp.arange(n)[:, None, None], loc_rows[None, :, None], order]  # (N, C', K, 4)
    kept = _nms(xp, _iou(xp, cand), best > -xp.inf, p)
    picked = kept.reshape(n, c * k)
    if p.keep_top_k > -1:
        flat = xp.where(picked, best.reshape(n, c * k), -xp.inf)
        top = _descending(xp, flat)[:, :p.keep_top_k]
        chosen = xp.zeros(picked.shape, dtype=bool)
        chosen[xp.arange(n)[:, None], top] = xp.take_along_axis(picked, top, axis=1)
        picked = chosen
    image, j = xp.nonzero(picked)
    ci, ri = j // k, j % k
    return xp.concatenate([image[:, None].astype(xp.float32), cls[ci][:, None].astype(xp.float32),
                           best[image, ci, ri][:, None], cand[image, ci, ri]], axis=1)


def _detection_kernel(xp, inputs, args):
    """The detections, then rows of -1 up to ``infer``'s fixed count (a row is padding iff
    its label is -1). The fork's output instead has exactly the detections, or one row per
    image of (image, -1, ...) when there are none."""
    p = _DetectionArgs(args)
    rows = _detect(xp, inputs, args, p)
    n, priors = inputs[0].shape[0], inputs[2].shape[2] // 4
    out = xp.full((p.rows(n, priors), 7), -1.0, dtype=xp.float32)
    out[:rows.shape[0]] = rows
    return (out.reshape(1, 1, -1, 7),)


def _detection_cost(inputs, outputs, args):
    """Decoding every prior, thresholding and sorting every score, the pairwise overlaps of
    the NMS candidates, the keep_top_k sort: an upper bound, as if every score passed."""
    p = _DetectionArgs(args)
    n, priors = _detection_dims(inputs, args, p)
    c, k = len(p.classes), p.candidates(priors)
    loc_classes = 1 if p.share_location else p.num_classes
    decode = DECODE_FLOPS_PER_BOX * n * priors * loc_classes
    select = n * c * priors * (1 + math.log2(max(priors, 2)))
    overlaps = IOU_FLOPS * n * c * k * (k - 1) / 2
    final = n * c * k * math.log2(max(c * k, 2)) if p.keep_top_k > -1 else 0
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(decode + select + overlaps + final), bytes_read=read, bytes_written=written)


register(OpDef("Permute", _permute_infer, _permute_kernel, movement_cost, min_inputs=1, max_inputs=1,
               doc="transpose by `order`, missing axes appended in order (SSD Caffe fork)"))
register(OpDef("Normalize", _normalize_infer, _normalize_kernel, _normalize_cost, min_inputs=2, max_inputs=2,
               launches=6,
               doc="L2 normalisation across channels or the whole sample, times a learned scale (SSD fork)"))
register(OpDef("PriorBox", _priorbox_infer, _priorbox_kernel, _priorbox_cost, min_inputs=2, max_inputs=2,
               doc="SSD default boxes and variances for a feature map and an image (1, 2, H*W*P*4)"))
register(OpDef("DetectionOutput", _detection_infer, _detection_kernel, _detection_cost,
               devices=frozenset({"cpu"}), min_inputs=3, max_inputs=4,
               doc="SSD decoding, per-class NMS and keep_top_k; (1, 1, rows, 7), padded with -1 rows"))
