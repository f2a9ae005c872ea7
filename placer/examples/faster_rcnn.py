"""A Detectron-style Faster R-CNN (ResNet-C4) test net built in code, with an optional mask head.

The op sequence, argument names and blob names follow Detectron's exported R-50-C4 Faster
R-CNN predict net (``e2e_faster_rcnn_R-50-C4_1x``):

- a ResNet trunk to ``res4`` (stride 16): ``conv1`` 7x7/2 + Relu, MaxPool 3x3/2, then
  bottleneck blocks ``resS_K_branch2{a,b,c}`` (1x1, 3x3, 1x1; the stride sits in the first
  1x1, Detectron's ``STRIDE_1X1``), a ``resS_0_branch1`` projection, ``Sum`` and Relu.
  Batch norm is folded away as Detectron's AffineChannel is at export: every Conv carries
  a bias blob ``*_bn_b`` (``res_conv1_bn_b`` for the stem);
- the RPN: ``conv_rpn`` 3x3 + Relu, ``rpn_cls_logits`` 1x1 -> Sigmoid ``rpn_cls_probs``,
  ``rpn_bbox_pred`` 1x1, then ``GenerateProposals`` with the ``anchor`` blob (A, 4): A = 15
  anchors made as Detectron's ``generate_anchors`` makes them (stride 16, sizes 32..512,
  aspect ratios 0.5, 1, 2; ratio-major order), pre/post NMS topN 6000/1000 (Detectron's
  TEST values), NMS 0.7, ``min_size`` 0;
- the box head: ``RoIAlign`` 14x14 (spatial_scale 1/16, sampling_ratio 0) -> ``pool5``, the
  ``res5`` stage on the RoIs (first block stride 2: 7x7), ``AveragePool`` 7 -> ``res5_pool``,
  FC ``cls_score`` -> Softmax ``cls_prob``, FC ``bbox_pred``, ``BBoxTransform`` (weights
  10, 10, 5, 5; apply_scale 0) -> ``pred_bbox`` and ``BoxWithNMSLimit`` (score_thresh 0.05,
  nms 0.5, detections_per_im 100) -> ``score_nms``, ``bbox_nms``, ``class_nms``;
- with ``mask=True`` (batch 1), Detectron's C4 mask head ``mask_rcnn_fcn_head_v0upshare``
  as it runs at test time: ``RoIAlign`` on ``bbox_nms`` -> ``_[mask]_pool5``, a second
  ``res5`` stage ``_[mask]_res5_*`` (its own parameters, as Detectron names them), a 2x2/2
  ``ConvTranspose`` ``conv5_mask`` + Relu, a 1x1 Conv ``mask_fcn_logits`` (one map per
  class) -> Sigmoid ``mask_fcn_probs`` (14x14 masks, Detectron's C4 mask resolution).

One difference from the corpus file (``frcnn_r50c4_predict_net.pbtxt``): that file spells
GenerateProposals' NMS threshold ``nms_thres``, a name Caffe2 1.8.1 does not read
(``generate_proposals_op.h`` reads ``nms_thresh``, default 0.7); this net writes
``nms_thresh``. With a batch above 1, BBoxTransform also writes ``roi_batch_splits`` and
BoxWithNMSLimit reads it and writes ``batch_splits_nms`` (the corpus net is for one image).

Inputs: ``data`` (N, 3, H, W) and ``im_info`` (N, 3) = [height, width, scale]. The weights
are random fills in the init net (so the init net is small: one fill op per parameter);
they are chosen so that the net, on random input, gives a non-trivial set of detections:
Xavier-filled trunk convs keep the activations of a BN-free ResNet from growing
block by block (their RMS stays about 20..80 for an input of std 50), the Gaussian head fills
are scaled by fan-in so that, at that input scale, the RPN logits have RMS about 1 (the
RPN scores differ), the RPN deltas about 0.1, the class logits about 0.5 and the box
deltas about 0.05, and ``cls_score_b`` is a given tensor that lifts ``lifted_classes``
foreground classes above the 0.05 score threshold (uniform over 81 classes would be
0.012; with bias 3 on 10 classes each scores about 0.07).

``r50_c4_800()`` is the planning configuration: R-50-C4 at 1x3x800x800 (Detectron's test
scale), 81 classes. Measured on ``build(r50_c4_800())``: 132 ops, the corpus file's count
(56 Conv, 50 Relu, 16 Sum, 2 FC, and one each of MaxPool, Sigmoid, GenerateProposals,
RoIAlign, AveragePool, Softmax, BBoxTransform, BoxWithNMSLimit); 117 parameter blobs
holding 33,826,460 values (the anchor table's 60 included). With ``mask=True``: 159 ops
(67 Conv, 60 Relu, 19 Sum, 2 RoIAlign, 2 Sigmoid, 1 ConvTranspose, ...) and 141
parameter blobs holding 50,898,157 values. ``write_planning_net(folder)`` writes it; the
bundled example ``faster_rcnn_r50_c4`` is this net (about 40 KB of predict net and 24 KB
of init net: the weights are fill ops).
Real Caffe2 1.8.1 (CPU build, one machine) runs it on a random input of std 50 in about
80 s and gives 100 detections (the RPN scores span 0.005..0.97); with ``mask=True`` about
97 s and 100 masks of 81x14x14. The tests run ``small()`` (seconds).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from placer.examples.builder import NetBuilder

CONV_ARGS = {"exhaustive_search": 0, "order": "NCHW"}
RELU_ARGS = {"cudnn_exhaustive_search": 0, "order": "NCHW"}
# The RMS of the Xavier-filled trunk's features for an input of pixel scale (std 50, as
# Detectron's BGR-minus-mean input): measured 17..85 at every stage of R-50-C4 and of
# small(). The head fills are scaled by it (see _head_std); the nets are positively
# homogeneous (zero biases, ReLU), so a 10x larger input gives 10x larger head outputs.
FEATURE_RMS = 50.0


@dataclass(frozen=True)
class FasterRCNNConfig:
    """A ResNet-C4 Faster R-CNN; the defaults are Detectron's R-50-C4 test settings."""
    name: str = "faster_rcnn_r50_c4"
    batch: int = 1
    height: int = 800
    width: int = 800
    blocks: tuple[int, int, int, int] = (3, 4, 6, 3)   # res2..res5 (R-101: (3, 4, 23, 3))
    stem_width: int = 64          # conv1 channels
    res2_inner: int = 64          # bottleneck width of res2; doubled each stage, outputs 4x
    classes: int = 81             # COCO: 80 classes and the background
    anchor_sizes: tuple[float, ...] = (32.0, 64.0, 128.0, 256.0, 512.0)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    rpn_pre_nms_top_n: int = 6000
    rpn_post_nms_top_n: int = 1000
    rpn_nms_thresh: float = 0.7
    rpn_min_size: float = 0.0
    roi_resolution: int = 14
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    score_thresh: float = 0.05
    nms: float = 0.5
    detections_per_im: int = 100
    mask: bool = False            # add the Mask R-CNN C4 mask head (batch 1 only)
    mask_dim_reduced: int = 256
    foreground_bias: float = 3.0  # cls_score_b for classes 1..lifted_classes
    lifted_classes: int = 10

    @property
    def stride(self) -> int:
        return 16                 # the C4 feature map: conv1 /2, pool1 /2, res3 /2, res4 /2


def r50_c4_800(**changes) -> FasterRCNNConfig:
    """Detectron's R-50-C4 at 1x3x800x800 (the planning size)."""
    return replace(FasterRCNNConfig(), **changes)


def small(**changes) -> FasterRCNNConfig:
    """One block per stage, narrow, 1x3x224x224: runs in real Caffe2 in seconds."""
    base = FasterRCNNConfig(name="faster_rcnn_small", height=224, width=224, blocks=(1, 1, 1, 1),
                            stem_width=16, res2_inner=8, mask_dim_reduced=32)
    return replace(base, **changes)


def generate_anchors(stride: int = 16, sizes=(32, 64, 128, 256, 512), aspect_ratios=(0.5, 1, 2)) -> np.ndarray:
    """Detectron's ``generate_anchors``: (len(ratios) * len(sizes), 4) boxes (x1, y1, x2, y2)
    centred on the first cell of a ``stride`` grid, ratio-major; a fresh implementation of
    Faster R-CNN's enumeration (whole-pixel widths, inclusive coordinates)."""
    scales = np.array(sizes, dtype=np.float64) / stride
    ratios = np.array(aspect_ratios, dtype=np.float64)
    base = np.array([1, 1, stride, stride], dtype=np.float64) - 1
    w, h, x_ctr, y_ctr = _whctrs(base)
    size = w * h
    ws = np.round(np.sqrt(size / ratios))
    hs = np.round(ws * ratios)
    out = []
    for rw, rh in zip(ws, hs):
        out.append(_mkanchors(rw * scales, rh * scales, x_ctr, y_ctr))
    return np.vstack(out).astype(np.float32)


def _whctrs(anchor: np.ndarray):
    w = anchor[2] - anchor[0] + 1
    h = anchor[3] - anchor[1] + 1
    return w, h, anchor[0] + 0.5 * (w - 1), anchor[1] + 0.5 * (h - 1)


def _mkanchors(ws: np.ndarray, hs: np.ndarray, x_ctr: float, y_ctr: float) -> np.ndarray:
    ws, hs = ws[:, None], hs[:, None]
    return np.hstack((x_ctr - 0.5 * (ws - 1), y_ctr - 0.5 * (hs - 1), x_ctr + 0.5 * (ws - 1), y_ctr + 0.5 * (hs - 1)))


def build(cfg: FasterRCNNConfig = FasterRCNNConfig()) -> NetBuilder:
    if cfg.mask and cfg.batch != 1:
        raise ValueError("the mask head reads bbox_nms as (R, 4) RoIs: batch 1 only")
    if cfg.classes < 2:
        raise ValueError("classes counts the background: at least 2")
    b = NetBuilder(cfg.name)
    b.predict.type = "simple"
    x = b.input("data", (cfg.batch, 3, cfg.height, cfg.width))
    w = b.param("conv1_w", (cfg.stem_width, 3, 7, 7), "XavierFill")
    bias = b.param("res_conv1_bn_b", (cfg.stem_width,), "ConstantFill", value=0.0)
    x = b.op("Conv", [x, w, bias], "conv1", kernel=7, pad=3, stride=2, **CONV_ARGS)
    x = b.op("Relu", [x], x, **RELU_ARGS)
    x = b.op("MaxPool", [x], "pool1", kernel=3, pad=1, stride=2, **RELU_ARGS)
    cin = cfg.stem_width
    for s in range(3):                                    # res2, res3, res4
        x, cin = _stage(b, f"res{s + 2}", "", x, cin, cfg.res2_inner << s, cfg.blocks[s], 1 if s == 0 else 2)
    trunk, c4 = x, cin
    im_info = b.input("im_info", (cfg.batch, 3))

    anchors = generate_anchors(cfg.stride, cfg.anchor_sizes, cfg.aspect_ratios)
    a = len(anchors)
    w = b.param("conv_rpn_w", (c4, c4, 3, 3), "XavierFill")
    bias = b.param("conv_rpn_b", (c4,), "ConstantFill", value=0.0)
    rpn = b.op("Conv", [trunk, w, bias], "conv_rpn", kernel=3, pad=1, stride=1, **CONV_ARGS)
    rpn = b.op("Relu", [rpn], rpn, **RELU_ARGS)
    w = b.param("rpn_cls_logits_w", (a, c4, 1, 1), "GaussianFill", std=_head_std(1.0, c4))
    bias = b.param("rpn_cls_logits_b", (a,), "ConstantFill", value=0.0)
    logits = b.op("Conv", [rpn, w, bias], "rpn_cls_logits", kernel=1, pad=0, stride=1, **CONV_ARGS)
    w = b.param("rpn_bbox_pred_w", (4 * a, c4, 1, 1), "GaussianFill", std=_head_std(0.1, c4))
    bias = b.param("rpn_bbox_pred_b", (4 * a,), "ConstantFill", value=0.0)
    deltas = b.op("Conv", [rpn, w, bias], "rpn_bbox_pred", kernel=1, pad=0, stride=1, **CONV_ARGS)
    probs = b.op("Sigmoid", [logits], "rpn_cls_probs")
    anchor = b.param("anchor", anchors.shape, "GivenTensorFill", values=[float(v) for v in anchors.ravel()])
    rois = b.op("GenerateProposals", [probs, deltas, im_info, anchor], ["rpn_rois", "rpn_roi_probs"],
                nms_thresh=cfg.rpn_nms_thresh, min_size=cfg.rpn_min_size, spatial_scale=1.0 / cfg.stride,
                correct_transform_coords=1, post_nms_topN=cfg.rpn_post_nms_top_n,
                pre_nms_topN=cfg.rpn_pre_nms_top_n)

    head, c5 = _roi_head(b, cfg, "", trunk, rois, c4)
    pool = b.op("AveragePool", [head], "res5_pool", kernel=cfg.roi_resolution // 2, **RELU_ARGS)
    fc_args = {"use_cudnn": 1, **RELU_ARGS}
    w = b.param("cls_score_w", (cfg.classes, c5), "GaussianFill", std=_head_std(0.5, c5))
    lifted = min(cfg.lifted_classes, cfg.classes - 1)
    bias = b.param("cls_score_b", (cfg.classes,), "GivenTensorFill",
                   values=[0.0] + [cfg.foreground_bias] * lifted + [0.0] * (cfg.classes - 1 - lifted))
    score = b.op("FC", [pool, w, bias], "cls_score", **fc_args)
    b.op("Softmax", [score], "cls_prob", order="NCHW", cudnn_exhaustive_search=0)
    w = b.param("bbox_pred_w", (4 * cfg.classes, c5), "GaussianFill", std=_head_std(0.05, c5))
    bias = b.param("bbox_pred_b", (4 * cfg.classes,), "ConstantFill", value=0.0)
    bbox = b.op("FC", [pool, w, bias], "bbox_pred", **fc_args)
    batched = cfg.batch > 1
    b.op("BBoxTransform", [rois, bbox, im_info], ["pred_bbox"] + (["roi_batch_splits"] if batched else []),
         correct_transform_coords=1, apply_scale=0, weights=list(cfg.bbox_reg_weights))
    nms_out = ["score_nms", "bbox_nms", "class_nms"] + (["batch_splits_nms"] if batched else [])
    b.op("BoxWithNMSLimit", ["cls_prob", "pred_bbox"] + (["roi_batch_splits"] if batched else []), nms_out,
         score_thresh=cfg.score_thresh, nms=cfg.nms, detections_per_im=cfg.detections_per_im,
         soft_nms_enabled=0, soft_nms_method="linear", soft_nms_sigma=0.5)
    for name in nms_out:
        b.output(name)

    if cfg.mask:
        head, c5 = _roi_head(b, cfg, "_[mask]_", trunk, "bbox_nms", c4)
        w = b.param("conv5_mask_w", (c5, cfg.mask_dim_reduced, 2, 2), "XavierFill")
        bias = b.param("conv5_mask_b", (cfg.mask_dim_reduced,), "ConstantFill", value=0.0)
        m = b.op("ConvTranspose", [head, w, bias], "conv5_mask", kernel=2, pad=0, stride=2, **CONV_ARGS)
        m = b.op("Relu", [m], m, **RELU_ARGS)
        w = b.param("mask_fcn_logits_w", (cfg.classes, cfg.mask_dim_reduced, 1, 1), "GaussianFill",
                    std=_head_std(1.0, cfg.mask_dim_reduced))
        bias = b.param("mask_fcn_logits_b", (cfg.classes,), "ConstantFill", value=0.0)
        m = b.op("Conv", [m, w, bias], "mask_fcn_logits", kernel=1, pad=0, stride=1, **CONV_ARGS)
        b.output(b.op("Sigmoid", [m], "mask_fcn_probs"))
    return b


def _head_std(out_rms: float, fan_in: int) -> float:
    """The std of a Gaussian head weight that turns features of RMS ``FEATURE_RMS`` into
    outputs of RMS ``out_rms`` (rounded to 3 significant digits, so the text stays short)."""
    return float(f"{out_rms / (FEATURE_RMS * fan_in ** 0.5):.3g}")


def _roi_head(b: NetBuilder, cfg: FasterRCNNConfig, prefix: str, trunk: str, rois: str, c4: int) -> tuple[str, int]:
    """RoIAlign on ``rois`` and the res5 stage (stride 2 in its first block)."""
    r = cfg.roi_resolution
    pool = b.op("RoIAlign", [trunk, rois], f"{prefix}pool5", pooled_h=r, sampling_ratio=0,
                spatial_scale=1.0 / cfg.stride, pooled_w=r)
    return _stage(b, f"{prefix}res5", prefix, pool, c4, cfg.res2_inner << 3, cfg.blocks[3], r // 7)


def _stage(b: NetBuilder, name: str, prefix: str, x: str, cin: int, inner: int, blocks: int,
           stride: int) -> tuple[str, int]:
    """Detectron's ``add_stage``: blocks ``name_K``; the last one's sum is ``name_K_sum``."""
    cout = 4 * inner
    for k in range(blocks):
        x = _bottleneck(b, f"{name}_{k}", x, cin, inner, cout, stride if k == 0 else 1, last=k == blocks - 1)
        cin = cout
    return x, cout


def _conv(b: NetBuilder, x: str, name: str, out: str, cin: int, cout: int, kernel: int, stride: int,
          pad: int | None, fill: str = "XavierFill", **fill_args) -> str:
    w = b.param(f"{name}_w", (cout, cin, kernel, kernel), fill, **fill_args)
    bias = b.param(f"{name}_bn_b", (cout,), "ConstantFill", value=0.0)
    if pad is None:                                       # the shortcut, written without pad/dilation
        return b.op("Conv", [x, w, bias], out, stride=stride, exhaustive_search=0, order="NCHW", kernel=kernel)
    return b.op("Conv", [x, w, bias], out, kernel=kernel, exhaustive_search=0, stride=stride, pad=pad,
                order="NCHW", dilation=1)


def _bottleneck(b: NetBuilder, name: str, x: str, cin: int, inner: int, cout: int, stride: int, last: bool) -> str:
    y = _conv(b, x, f"{name}_branch2a", f"{name}_branch2a", cin, inner, 1, stride, 0)
    y = b.op("Relu", [y], y, **RELU_ARGS)
    y = _conv(b, y, f"{name}_branch2b", f"{name}_branch2b", inner, inner, 3, 1, 1)
    y = b.op("Relu", [y], y, **RELU_ARGS)
    y = _conv(b, y, f"{name}_branch2c", f"{name}_branch2c_bn", inner, cout, 1, 1, 0)
    if cin != cout or stride != 1:
        shortcut = _conv(b, x, f"{name}_branch1", f"{name}_branch1_bn", cin, cout, 1, stride, None)
    else:
        shortcut = x
    s = b.op("Sum", [y, shortcut], f"{name}_sum" if last else y)
    return b.op("Relu", [s], s, **RELU_ARGS)


def parameter_count(b: NetBuilder) -> int:
    """Values held by the init net's fills."""
    total = 0
    for op in b.init.op:
        shape = next(list(a.ints) for a in op.arg if a.name == "shape")
        total += int(np.prod(shape))
    return total


def write_planning_net(folder: str | Path, cfg: FasterRCNNConfig | None = None) -> dict[str, Path]:
    """Write the R-50-C4 1x3x800x800 net (or ``cfg``): predict net, init net, value_info."""
    cfg = cfg or r50_c4_800()
    return build(cfg).save(folder, cfg.name)
