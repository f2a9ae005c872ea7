"""Caffe2's region proposal ops (GenerateProposals, the FPN collect/distribute ops) against
real Caffe2 (torch 1.8.1) on the same inputs, and their shapes, bounds, costs and errors."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from caffe2_oracle import run_operator
from conftest import require_cupy
from cupy_standin import check_gpu_kernel
from test_runtime import make_net, op

from placer.errors import ArgumentError, ShapeError
from placer.ops import registry
from placer.runtime.executor import Executor
from placer.types import Args, TensorType

STRIDE = 16


def _anchors(sizes=(32, 64, 128, 256, 512), ratios=(0.5, 1.0, 2.0)) -> np.ndarray:
    """Detectron's anchors: one (x1, y1, x2, y2) per size and aspect ratio, centred on the
    first cell (A = len(sizes) * len(ratios); 15 by default)."""
    rows = []
    ctr = (STRIDE - 1) / 2.0
    for s in sizes:
        for r in ratios:
            w, h = s / np.sqrt(r), s * np.sqrt(r)
            rows.append([ctr - (w - 1) / 2, ctr - (h - 1) / 2, ctr + (w - 1) / 2, ctr + (h - 1) / 2])
    return np.round(np.array(rows, np.float32))


def _proposal_inputs(seed, n, h, w, scale=1.0, anchors=None):
    """Scores without ties (a permutation scaled into (0, 1)), so Caffe2's unstable
    partial_sort has one answer; deltas of a trained RPN's size."""
    rng = np.random.default_rng(seed)
    anchors = _anchors() if anchors is None else anchors
    a = anchors.shape[0]
    scores = ((rng.permutation(n * a * h * w) + 1) / (n * a * h * w + 1)).astype(np.float32).reshape(n, a, h, w)
    deltas = (rng.standard_normal((n, 4 * a, h, w)) * 0.3).astype(np.float32)
    im_info = np.array([[h * STRIDE - 5, w * STRIDE - 3, scale]] * n, np.float32)
    im_info[:, 2] = scale
    return [scores, deltas, im_info, anchors]


def caffe2_run(op_type, arrays, args, n_outputs):
    return run_operator(op_type, arrays, args, n_outputs)


def ours(op_type, arrays, args, n_outputs):
    a = Args(args, op=f"#0 {op_type}", n_outputs=n_outputs)
    opdef = registry.get(op_type)
    outs = opdef.kernel(np, arrays, a)
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in arrays], a)
    assert len(outs) == len(types) == n_outputs
    for x, t in zip(outs, types):   # the kernel's actual sizes stay within infer's bound
        assert x.ndim == len(t.shape) and x.shape[0] <= t.shape[0] and x.shape[1:] == t.shape[1:]
        assert str(x.dtype) == t.dtype
    return list(outs), types


# Coordinates are float32 pixels up to ~800: a handful of float32 operations (the exp of
# a delta, products with widths, the shift) each round at 2^-24 relative, so 1e-3 pixels
# absolute plus 1e-5 relative covers any difference of evaluation order (Eigen's vector
# code, an FMA); the scores are copied, never computed, so they match exactly.
COORD_TOL = dict(rtol=1e-5, atol=1e-3)


GENERATE_CASES = [
    # (seed, N, H, W, im_scale, args)
    (0, 1, 20, 30, 1.0, {"pre_nms_topN": 6000, "post_nms_topN": 300, "nms_thresh": 0.7, "min_size": 16.0}),
    (1, 2, 25, 20, 1.0, {"pre_nms_topN": 2000, "post_nms_topN": 100, "nms_thresh": 0.7, "min_size": 0.0}),
    (2, 1, 40, 50, 1.5, {"pre_nms_topN": 12000, "post_nms_topN": 2000, "nms_thresh": 0.7, "min_size": 16.0}),
    (3, 2, 30, 24, 0.8, {"pre_nms_topN": 500, "post_nms_topN": 1000, "nms_thresh": 0.5, "min_size": 40.0}),
    (4, 1, 22, 22, 1.0, {"pre_nms_topN": -1, "post_nms_topN": -1, "nms_thresh": 0.9, "min_size": 8.0}),
    (5, 2, 20, 26, 1.0, {"spatial_scale": 0.125, "legacy_plus_one": 0, "pre_nms_topN": 3000,
                         "post_nms_topN": 200, "nms_thresh": 0.6, "min_size": 4.0}),
    (6, 1, 20, 20, 1.0, {}),   # every default: pre 6000, post 300, thresh 0.7, min_size 16, scale 1/16
]


@pytest.mark.caffe2
@pytest.mark.parametrize("seed,n,h,w,scale,args", GENERATE_CASES, ids=[f"case{c[0]}" for c in GENERATE_CASES])
def test_generate_proposals_matches_caffe2(seed, n, h, w, scale, args):
    arrays = _proposal_inputs(seed, n, h, w, scale)
    if "spatial_scale" in args:
        arrays[2][:, :2] = [[h * 8 - 1, w * 8 - 2]]
    want = caffe2_run("GenerateProposals", arrays, args, 2)
    (rois, probs), types = ours("GenerateProposals", arrays, args, 2)
    assert rois.shape == want[0].shape and len(rois) > 0      # same count: same NMS decisions
    np.testing.assert_array_equal(rois[:, 0], want[0][:, 0])   # image index, in Caffe2's order
    np.testing.assert_array_equal(probs, want[1])              # scores copied: exact, same order
    np.testing.assert_allclose(rois[:, 1:], want[0][:, 1:], **COORD_TOL)
    assert types[0].bound and types[0].bound.startswith("GenerateProposals ")


@pytest.mark.caffe2
def test_generate_proposals_nms_thres_spelling_is_ignored_as_caffe2_does():
    """frcnn_r50c4 spells the threshold ``nms_thres``; Caffe2 1.8.1 reads only ``nms_thresh``
    (default 0.7), so 0.3 under the old name changes nothing, and the same under the read
    name does."""
    arrays = _proposal_inputs(7, 1, 24, 24)
    base = {"pre_nms_topN": 3000, "post_nms_topN": 400, "min_size": 0.0}
    frcnn = {**base, "nms_thres": 0.3, "correct_transform_coords": 1}   # as frcnn_r50c4 spells them
    old = caffe2_run("GenerateProposals", arrays, frcnn, 2)
    (rois, probs), _ = ours("GenerateProposals", arrays, frcnn, 2)
    (default_rois, _), _ = ours("GenerateProposals", arrays, {**base, "nms_thresh": 0.7}, 2)
    (strict_rois, _), _ = ours("GenerateProposals", arrays, {**base, "nms_thresh": 0.3}, 2)
    np.testing.assert_array_equal(probs, old[1])
    np.testing.assert_allclose(rois, old[0], **COORD_TOL)
    np.testing.assert_array_equal(rois, default_rois)
    read = caffe2_run("GenerateProposals", arrays, {**base, "nms_thresh": 0.3}, 2)
    np.testing.assert_allclose(strict_rois, read[0], **COORD_TOL)   # the read name does change it
    assert strict_rois.shape != rois.shape or not np.allclose(strict_rois, rois)


@pytest.mark.caffe2
def test_generate_proposals_tied_scores_agree_as_sets():
    """Tied scores: Caffe2's std::partial_sort puts ties in no defined order, so which of
    the tied boxes enter and their order may differ; with pre_nms_topN covering every box
    and NMS off (thresh 1.0), the proposals are the same set."""
    arrays = _proposal_inputs(8, 1, 20, 20)
    arrays[0] = np.round(arrays[0] * 20) / 20                  # 21 distinct values only
    args = {"pre_nms_topN": -1, "post_nms_topN": -1, "nms_thresh": 1.0, "min_size": 0.0}
    want = caffe2_run("GenerateProposals", arrays, args, 2)
    (rois, probs), _ = ours("GenerateProposals", arrays, args, 2)
    assert rois.shape == want[0].shape
    np.testing.assert_array_equal(probs, want[1])              # scores still descending, ties equal
    key = lambda r: np.lexsort(np.round(r, 2).T[::-1])         # noqa: E731
    np.testing.assert_allclose(rois[key(rois)], want[0][key(want[0])], **COORD_TOL)


@pytest.mark.caffe2
def test_caffe2_refuses_per_cell_anchors_too():
    """Anchors (H, W, A, 4): Caffe2 1.8.1 takes box_dim from the anchors' second dimension
    and fails its bbox_deltas check; placer refuses them in shape inference."""
    arrays = _proposal_inputs(9, 1, 4, 5, anchors=_anchors(sizes=(32,), ratios=(0.5, 1.0, 2.0)))
    arrays[3] = np.broadcast_to(arrays[3], (4, 5, 3, 4)).copy()
    with pytest.raises(AssertionError, match="bbox_deltas"):
        caffe2_run("GenerateProposals", arrays, {}, 2)
    with pytest.raises(ShapeError, match="anchors must be"):
        ours("GenerateProposals", arrays, {}, 2)


def _rotated_anchors(sizes=(32, 64, 128, 256, 512), angles=(-60.0, 0.0, 60.0)) -> np.ndarray:
    """Rotated anchors (cx, cy, w, h, angle): one per size and angle (A = 15), 2:1 boxes."""
    ctr = (STRIDE - 1) / 2.0
    return np.array([[ctr, ctr, s * 1.4, s * 0.7, t] for s in sizes for t in angles], np.float32)


ROTATED_CASES = [
    (61, 1, 20, 24, {"pre_nms_topN": 2000, "post_nms_topN": 300, "nms_thresh": 0.7, "min_size": 16.0}),
    (62, 2, 20, 20, {"pre_nms_topN": 1000, "post_nms_topN": 100, "nms_thresh": 0.5, "min_size": 0.0,
                     "clip_angle_thresh": 5.0}),
    (63, 1, 22, 20, {"pre_nms_topN": 500, "post_nms_topN": -1, "nms_thresh": 0.6, "min_size": 8.0,
                     "angle_bound_on": 0, "clip_angle_thresh": -1.0}),
]


@pytest.mark.caffe2
@pytest.mark.parametrize("seed,n,h,w,args", ROTATED_CASES, ids=[f"rotated{c[0]}" for c in ROTATED_CASES])
def test_generate_proposals_rotated_matches_caffe2(seed, n, h, w, args):
    """Rotated boxes (anchors (A, 5), deltas (N, 5A, H, W)): rois (R, 6). The rotated
    intersection areas come from a different summation (angle order about the centroid, in
    float64, where Caffe2 runs a Graham scan in float32), so the coordinates are held to
    COORD_TOL and the angles (degrees, up to 180) to 1e-4 relative."""
    arrays = _proposal_inputs(seed, n, h, w, anchors=_rotated_anchors())
    rng = np.random.default_rng(seed)
    arrays[1] = (rng.standard_normal((n, 5 * 15, h, w)) * 0.3).astype(np.float32)
    want = caffe2_run("GenerateProposals", arrays, args, 2)
    (rois, probs), types = ours("GenerateProposals", arrays, args, 2)
    assert rois.shape == want[0].shape and rois.shape[1] == 6 and len(rois) > 0
    np.testing.assert_array_equal(probs, want[1])
    np.testing.assert_array_equal(rois[:, 0], want[0][:, 0])
    np.testing.assert_allclose(rois[:, 1:5], want[0][:, 1:5], **COORD_TOL)
    np.testing.assert_allclose(rois[:, 5], want[0][:, 5], rtol=1e-4, atol=1e-4)
    assert types[0].shape[1] == 6


def test_generate_proposals_bounds_and_cost():
    opdef = registry.get("GenerateProposals")
    ins = [TensorType((2, 15, 50, 40)), TensorType((2, 60, 50, 40)), TensorType((2, 3)), TensorType((15, 4))]
    rois, probs = opdef.infer(ins, Args({"pre_nms_topN": 6000, "post_nms_topN": 1000}))
    assert rois.shape == (2000, 5) and probs.shape == (2000,)
    assert rois.bound == probs.bound == "GenerateProposals post_nms_topN=1000"
    small = [TensorType((1, 15, 4, 4)), TensorType((1, 60, 4, 4)), TensorType((1, 3)), TensorType((15, 4))]
    (r,) = opdef.infer(small, Args({"pre_nms_topN": 6000, "post_nms_topN": 1000}))[:1]
    assert r.shape == (240, 5) and r.bound == "GenerateProposals A*H*W"      # 15 * 4 * 4 boxes at most
    (r,) = opdef.infer(small, Args({"pre_nms_topN": 100, "post_nms_topN": -1}))[:1]
    assert r.shape == (100, 5) and r.bound == "GenerateProposals pre_nms_topN=100"
    (r,) = opdef.infer(small, Args({}))[:1]
    assert r.shape == (240, 5)                                 # default post 300 > 240 boxes
    assert TensorType((5,), bound="x") == TensorType((5,))     # the bound is no part of the type
    cost = opdef.cost(ins, [rois, probs], Args({"pre_nms_topN": 6000, "post_nms_topN": 1000}))
    assert cost.flops >= 2 * 12 * 1000 * 6000                  # NMS bound: kept x candidates x IoU
    assert cost.bytes_read == sum(t.nbytes for t in ins) and cost.bytes_written == 2000 * 6 * 4
    assert opdef.devices == opdef.caffe2_devices == frozenset({"cpu", "gpu"})


def test_generate_proposals_shapes_errors_and_angle_bounds():
    opdef = registry.get("GenerateProposals")
    a = Args({}, op="#3 GenerateProposals")
    good = [TensorType((1, 15, 4, 4)), TensorType((1, 60, 4, 4)), TensorType((1, 3)), TensorType((15, 4))]
    with pytest.raises(ShapeError, match="#3 GenerateProposals.*bbox_deltas"):
        opdef.infer([good[0], TensorType((1, 56, 4, 4)), good[2], good[3]], a)
    with pytest.raises(ShapeError, match="#3 GenerateProposals.*im_info"):
        opdef.infer([good[0], good[1], TensorType((2, 3)), good[3]], a)
    with pytest.raises(ShapeError, match="anchors must be"):
        opdef.infer(good[:3] + [TensorType((4, 4, 15, 4))], a)   # (H, W, A, 4): Caffe2 1.8.1 refuses it too
    with pytest.raises(ShapeError, match="4-D"):
        opdef.infer([TensorType((15, 4, 4))] + good[1:], a)
    rotated = [good[0], TensorType((1, 75, 4, 4)), good[2], TensorType((15, 5))]
    assert [t.shape for t in opdef.infer(rotated, a)] == [(240, 6), (240,)]
    with pytest.raises(ShapeError, match="bbox_deltas must be \\(N, 5A, H, W\\)"):
        opdef.infer([good[0], good[1], good[2], TensorType((15, 5))], a)
    with pytest.raises(ArgumentError, match="#3 GenerateProposals.*angle_bound_hi - angle_bound_lo"):
        opdef.infer(rotated, Args({"angle_bound_lo": -90, "angle_bound_hi": 0}, op="#3 GenerateProposals"))


# ---------------------------------------------------------------- FPN ops

def _fpn_inputs(seed, per_level=(300, 200, 120, 60, 20), n_images=2):
    """RoIs per RPN level 2..6 of sizes spanning every FPN level; scores without ties."""
    rng = np.random.default_rng(seed)
    total = sum(per_level)
    scores = ((rng.permutation(total) + 1) / (total + 1)).astype(np.float32)
    rois, probs, start = [], [], 0
    for n in per_level:
        x1, y1 = rng.uniform(0, 600, n), rng.uniform(0, 600, n)
        side = np.exp(rng.uniform(np.log(4), np.log(900), n))
        ratio = rng.uniform(0.5, 2, n)
        box = np.stack([rng.integers(0, n_images, n), x1, y1, x1 + side * ratio, y1 + side / ratio], axis=1)
        rois.append(box.astype(np.float32))
        probs.append(scores[start:start + n])
        start += n
    return rois + probs


FPN_ARGS = [{"rpn_post_nms_topN": 400},
            {"rpn_post_nms_topN": 2000, "roi_canonical_scale": 200, "roi_canonical_level": 3, "legacy_plus_one": 0},
            {"rpn_post_nms_topN": -1, "roi_min_level": 3, "roi_max_level": 4}]


@pytest.mark.caffe2
@pytest.mark.parametrize("args", FPN_ARGS, ids=["top400", "canonical", "two_levels"])
def test_collect_and_distribute_matches_caffe2(args):
    arrays = _fpn_inputs(11)
    levels = args.get("roi_max_level", 5) - args.get("roi_min_level", 2) + 1
    want = caffe2_run("CollectAndDistributeFpnRpnProposals", arrays, args, levels + 2)
    got, types = ours("CollectAndDistributeFpnRpnProposals", arrays, args, levels + 2)
    for g, w in zip(got, want):    # copies of the input rows and integer indices: exact
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    assert sum(len(x) for x in got[1:-1]) == len(got[0]) and all(len(x) for x in got[1:-1])
    np.testing.assert_array_equal(np.concatenate(got[1:-1])[got[-1]], got[0])   # restore works
    post = args["rpn_post_nms_topN"]
    rows = min(post, 700) if post > 0 else 700
    assert types[0].shape == (rows, 5) and all(t.shape == (rows, 5) for t in types[1:-1])
    assert types[-1].shape == (rows,) and types[-1].dtype == "int32"


@pytest.mark.caffe2
def test_collect_then_distribute_matches_caffe2():
    arrays = _fpn_inputs(12, per_level=(50, 40, 30, 20, 10))
    args = {"rpn_post_nms_topN": 100}
    (want_rois,) = caffe2_run("CollectRpnProposals", arrays, args, 1)
    (rois,), (t,) = ours("CollectRpnProposals", arrays, args, 1)
    np.testing.assert_array_equal(rois, want_rois)
    assert t.shape == (100, 5) and t.bound == "CollectRpnProposals rpn_post_nms_topN=100"
    for given in (rois, rois[:, 1:]):    # (R, 5) and (R, 4): Caffe2 fills the image column with 0
        want = caffe2_run("DistributeFpnProposals", [given], {}, 5)
        got, types = ours("DistributeFpnProposals", [given], {}, 5)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        assert [x.shape for x in types] == [(100, 5)] * 4 + [(100,)]
        assert types[0].bound == "DistributeFpnProposals roi levels 2..5" and types[-1].bound is None


@pytest.mark.caffe2
def test_collect_ties_break_by_position_like_caffe2():
    """SortAndLimitRoIsByScores compares ties by index: deterministic, so exact."""
    arrays = _fpn_inputs(13, per_level=(30, 30, 30, 30, 30))
    for probs in arrays[5:]:
        probs[:] = np.round(probs * 4) / 4
    args = {"rpn_post_nms_topN": 60}
    want = caffe2_run("CollectAndDistributeFpnRpnProposals", arrays, args, 6)
    got, _ = ours("CollectAndDistributeFpnRpnProposals", arrays, args, 6)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_fpn_shape_errors_bounds_and_devices():
    op = registry.get("CollectAndDistributeFpnRpnProposals")
    a = Args({}, op="#7 CollectAndDistributeFpnRpnProposals", n_outputs=6)
    ins = [TensorType((2000, 5), bound="GenerateProposals post_nms_topN=1000")] * 5 + [TensorType((2000,))] * 5
    types = op.infer(ins, a)
    assert [t.shape for t in types] == [(2000, 5)] * 5 + [(2000,)]
    assert types[0].bound == "CollectAndDistributeFpnRpnProposals rpn_post_nms_topN=2000"
    assert types[-1].dtype == "int32" and types[-1].bound == types[0].bound
    with pytest.raises(ShapeError, match="#7 CollectAndDistributeFpnRpnProposals.*10 inputs"):
        op.infer(ins[:8], a)
    with pytest.raises(ShapeError, match="rois \\(n, 5\\) and probs"):
        op.infer(ins[:5] + [TensorType((1999,))] + ins[6:], a)
    with pytest.raises(ArgumentError, match="6 outputs, found 5"):
        op.infer(ins, Args({}, op="#7 C", n_outputs=5))
    with pytest.raises(ArgumentError, match="roi_max_level 1 must be greater"):
        op.infer(ins, Args({"roi_max_level": 1}, op="#7 C"))
    with pytest.raises(ShapeError, match="DistributeFpnProposals.*\\(R, 5\\) or \\(R, 4\\)"):
        registry.get("DistributeFpnProposals").infer([TensorType((10, 6))], Args({}, op="#8 D"))
    cost = op.cost(ins, types, a)
    assert cost.flops > 10000 * np.log2(10000) and cost.bytes_read == sum(t.nbytes for t in ins)
    for name in ("CollectAndDistributeFpnRpnProposals", "CollectRpnProposals", "DistributeFpnProposals"):
        assert registry.get(name).devices == registry.get(name).caffe2_devices == frozenset({"cpu"})


KERNEL_CASES = [
    ("GenerateProposals", lambda: _proposal_inputs(21, 2, 6, 5),
     {"pre_nms_topN": 200, "post_nms_topN": 50, "min_size": 0.0}),
    ("GenerateProposals", lambda: [_proposal_inputs(22, 1, 4, 5, anchors=_rotated_anchors())[k] if k != 1 else
                                   np.random.default_rng(22).standard_normal((1, 75, 4, 5)).astype(np.float32)
                                   for k in range(4)],
     {"pre_nms_topN": 100, "post_nms_topN": 30, "min_size": 0.0}),
]


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=["upright", "rotated"])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(op_type), make(), Args(args, op=f"#0 {op_type}"))


def _rotated_inputs(seed, n, h, w):
    arrays = _proposal_inputs(seed, n, h, w, anchors=_rotated_anchors())
    arrays[1] = (np.random.default_rng(seed).standard_normal((n, 75, h, w)) * 0.3).astype(np.float32)
    return arrays


SCRATCH_CASES = [
    ("GenerateProposals", lambda: _rotated_inputs(36, 1, 12, 14), {"pre_nms_topN": 1000, "post_nms_topN": 200,
                                                                    "min_size": 0.0}),
    ("GenerateProposals", lambda: _proposal_inputs(31, 1, 50, 76), {"pre_nms_topN": 6000, "post_nms_topN": 1000}),
    ("GenerateProposals", lambda: _proposal_inputs(32, 2, 30, 40), {"pre_nms_topN": -1, "post_nms_topN": 300,
                                                                     "min_size": 0.0}),
    ("CollectAndDistributeFpnRpnProposals", lambda: _fpn_inputs(33, per_level=(4000, 2000, 1000, 500, 200)),
     {"rpn_post_nms_topN": 1000}),
    ("CollectRpnProposals", lambda: _fpn_inputs(34, per_level=(4000, 2000, 1000, 500, 200)), {}),
    ("DistributeFpnProposals", lambda: [_fpn_inputs(35, per_level=(5000,))[0]], {}),
]


@pytest.mark.parametrize("op_type,make,args", SCRATCH_CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(SCRATCH_CASES)])
def test_declared_scratch_covers_the_measured_temporaries(op_type, make, args):
    """tracemalloc's peak during the numpy kernel, less its outputs, within ``scratch``."""
    arrays = make()
    opdef = registry.get(op_type)
    n_out = {"GenerateProposals": 2, "CollectRpnProposals": 1, "DistributeFpnProposals": 5}.get(op_type, 6)
    a = Args(args, op=f"#0 {op_type}", n_outputs=n_out)
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in arrays], a)
    tracemalloc.start()
    outs = opdef.kernel(np, arrays, a)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    measured = peak - sum(o.nbytes for o in outs)
    assert measured <= opdef.scratch_bytes([TensorType(x.shape, str(x.dtype)) for x in arrays], types, a)


@pytest.mark.caffe2
def test_empty_results_match_caffe2():
    """Every box below min_size: no proposals, (0, 5) and (0,); FPN levels that get no RoI
    and an input level without proposals come out empty as Caffe2's do."""
    arrays = _proposal_inputs(41, 2, 8, 8)
    args = {"min_size": 10000.0}
    want = caffe2_run("GenerateProposals", arrays, args, 2)
    (rois, probs), _ = ours("GenerateProposals", arrays, args, 2)
    assert rois.shape == want[0].shape == (0, 5) and probs.shape == want[1].shape == (0,)
    fpn = _fpn_inputs(42, per_level=(40, 0, 30, 0, 10))
    for r in fpn[:5]:                  # every RoI small: all to level 2 (others empty)
        r[:, 3:] = r[:, 1:3] + 10
    want = caffe2_run("CollectAndDistributeFpnRpnProposals", fpn, {}, 6)
    got, _ = ours("CollectAndDistributeFpnRpnProposals", fpn, {}, 6)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    assert [len(x) for x in got[1:5]] == [80, 0, 0, 0]


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "emulated_gpu"])
def test_proposals_run_in_a_net(gpu):
    """GenerateProposals (on the CPU or an emulated GPU) feeding DistributeFpnProposals (CPU
    only) through the executor: the blobs have the kernels' actual sizes, not the bounds."""
    arrays = _proposal_inputs(51, 1, 20, 24)
    feed = dict(zip(["scores", "deltas", "im_info", "anchors"], arrays))
    dev = 1 if gpu else None
    ops = [op("GenerateProposals", list(feed), ["rois", "probs"], dev, post_nms_topN=250, min_size=0.0)]
    if gpu:
        ops.append(op("CopyGPUToCPU", ["rois"], ["rois_host"], 1))
    ops.append(op("DistributeFpnProposals", ["rois_host" if gpu else "rois"],
                  ["fpn2", "fpn3", "fpn4", "fpn5", "restore"]))
    out = Executor(make_net(ops, list(feed), ["probs", "fpn2", "fpn3", "fpn4", "fpn5", "restore"]),
                   emulate_gpu=gpu).run(feed)
    (rois, probs), _ = ours("GenerateProposals", arrays, {"post_nms_topN": 250, "min_size": 0.0}, 2)
    np.testing.assert_array_equal(np.asarray(out["probs"]), probs)
    assert len(probs) == 250
    levels = [np.asarray(out[f"fpn{k}"]) for k in range(2, 6)]
    np.testing.assert_array_equal(np.concatenate(levels)[np.asarray(out["restore"])], rois)
