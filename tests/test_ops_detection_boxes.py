"""BBoxTransform and BoxWithNMSLimit (Caffe2's Detectron box ops) against real Caffe2's CPU
operators on the same inputs (hard and soft NMS, upright and rotated boxes, batches,
tied scores compared as sets), plus shapes (bounds), costs and errors."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from caffe2_oracle import run_caffe2
from conftest import require_cupy
from cupy_standin import check_gpu_kernel
from placer.errors import ArgumentError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType


def _boxes(rng, r, k, size=800.0):
    """(r, 4k) upright boxes: a base box per row, jittered per class, so classes overlap
    and NMS has work to do."""
    base_xy = rng.random((r, 1, 2)) * size * 0.8
    base_wh = rng.random((r, 1, 2)) * size * 0.2 + 4.0
    xy = base_xy + rng.standard_normal((r, k, 2)) * 6.0
    wh = base_wh * np.exp(rng.standard_normal((r, k, 2)) * 0.1)
    return np.concatenate([xy, xy + wh], axis=2).reshape(r, 4 * k).astype(np.float32)


def _distinct_scores(rng, r, k, low=0.0):
    """Scores without ties (a permutation of a grid), so Caffe2's unstable std::sort has a
    single answer and the order can be compared exactly."""
    grid = (rng.permutation(r * k) + 1) / (r * k + 1)
    return (low + (1 - low) * grid).reshape(r, k).astype(np.float32)


def _nms_case(name, seed, r, k, splits=None, ties=False, n_outputs=6, **args):
    rng = np.random.default_rng(seed)
    scores = _distinct_scores(rng, r, k)
    if ties:
        # Quantised scores (20 levels: many ties) on boxes that never overlap: a tie then
        # changes only the order of the survivors, not which survive. (Ties among
        # overlapping boxes make even the set depend on the unspecified order.)
        scores = (np.round(scores * 20) / 20).astype(np.float32)
    agnostic, bg = args.get("cls_agnostic_bbox_reg", 0), args.get("input_boxes_include_bg_cls", 1)
    nbc = 1 if agnostic else (k if bg else k - 1)
    boxes = _boxes(rng, r, nbc)
    if args.get("rotated"):    # [ctr_x, ctr_y, w, h, angle]: jittered per class around a base box
        base = np.concatenate([rng.random((r, 1, 2)) * 300, rng.random((r, 1, 2)) * 60 + 10,
                               rng.random((r, 1, 1)) * 180 - 90], axis=2)
        jitter = np.concatenate([rng.standard_normal((r, nbc, 2)) * 5, np.ones((r, nbc, 2)),
                                 rng.standard_normal((r, nbc, 1)) * 15], axis=2)
        boxes = base + jitter
        boxes[..., 2:4] = base[..., 2:4] * np.exp(rng.standard_normal((r, nbc, 2)) * 0.1)
        boxes = boxes.reshape(r, 5 * nbc).astype(np.float32)
    if ties:
        corner = np.stack([np.arange(r) % 20 * 40.0, np.arange(r) // 20 * 40.0], axis=1)
        boxes = np.tile(np.concatenate([corner, corner + 30.0], axis=1), (1, nbc)).astype(np.float32)
    inputs = [scores, boxes]
    if splits is not None:
        inputs.append(np.asarray(splits, dtype=np.float32 if seed % 2 else np.int32))
    return {"id": name, "op": "BoxWithNMSLimit", "inputs": inputs, "args": args, "n_outputs": n_outputs,
            "ties": ties}


def _transform_case(name, seed, r, k, n=1, batch_index=True, **args):
    rng = np.random.default_rng(seed)
    if args.get("rotated"):
        ctr = rng.random((r, 2)) * 600
        wh = rng.random((r, 2)) * 150 + 5
        ang = np.where(rng.random(r) < 0.3, rng.random(r) * 1.6 - 0.8, rng.random(r) * 360 - 180)
        box = np.concatenate([ctr, wh, ang[:, None]], axis=1)
        deltas = rng.standard_normal((r, 5 * k)) * 0.4
    else:
        box = _boxes(rng, r, 1, 900.0).astype(np.float64)
        deltas = rng.standard_normal((r, 4 * k)) * 0.5
        deltas[::7, 2::4] = 6.0    # beyond the log(1000/16) cap
    ids = np.sort(rng.integers(0, n, r))
    rois = np.concatenate([ids[:, None], box], axis=1) if batch_index else box
    im_info = np.array([[600, 800, 1.5], [480, 640, 1.0], [700, 900, 2.0]][:n], dtype=np.float32)
    return {"id": name, "op": "BBoxTransform", "inputs": [rois.astype(np.float32), deltas.astype(np.float32),
                                                        im_info], "args": args, "n_outputs": 2}


NMS_CASES = [
    _nms_case("nms_b1_r300_k21", 1, 300, 21, score_thresh=0.05, nms=0.5, detections_per_im=100),
    _nms_case("nms_b2_r600_k81", 2, 600, 81, splits=[250, 350], score_thresh=0.3, nms=0.5,
              detections_per_im=100),
    _nms_case("nms_b2_r1000_k5_nolimit", 3, 1000, 5, splits=[600, 400], score_thresh=0.5, nms=0.3,
              detections_per_im=-1),
    _nms_case("nms_b1_r200_k11_plus0_agnostic", 4, 200, 11, score_thresh=0.1, nms=0.4, detections_per_im=50,
              legacy_plus_one=0, cls_agnostic_bbox_reg=1),
    _nms_case("nms_b2_r400_k9_nobg", 5, 400, 9, splits=[100, 300], score_thresh=0.2, nms=0.45,
              detections_per_im=30, input_boxes_include_bg_cls=0, output_classes_include_bg_cls=0),
    _nms_case("soft_linear_b1_r300_k6", 6, 300, 6, score_thresh=0.3, nms=0.3, detections_per_im=80,
              soft_nms_enabled=1, soft_nms_method="linear", soft_nms_min_score_thres=0.05),
    _nms_case("soft_gaussian_b2_r400_k5", 7, 400, 5, splits=[150, 250], score_thresh=0.4, nms=0.3,
              detections_per_im=60, soft_nms_enabled=1, soft_nms_method="gaussian", soft_nms_sigma=0.5,
              soft_nms_min_score_thres=0.1),
    _nms_case("rotated_b2_r150_k3", 10, 150, 3, splits=[60, 90], rotated=1, score_thresh=0.1, nms=0.3,
              detections_per_im=50),
    _nms_case("rotated_nolimit_b1_r120_k4", 18, 120, 4, rotated=1, score_thresh=0.05, nms=0.2,
              detections_per_im=-1, legacy_plus_one=0),
    _nms_case("rotated_soft_b1_r100_k3", 17, 100, 3, rotated=1, score_thresh=0.2, nms=0.3,
              detections_per_im=40, soft_nms_enabled=1, soft_nms_method="linear"),
    _nms_case("ties_b1_r300_k6", 8, 300, 6, ties=True, score_thresh=0.2, nms=0.5, detections_per_im=2000),
    _nms_case("nms_b1_r200_k5_three_outputs", 9, 200, 5, n_outputs=3, score_thresh=0.05, nms=0.5,
              detections_per_im=20),
]
TRANSFORM_CASES = [
    _transform_case("bbox_b1_r500_k21", 11, 500, 21, n=1),
    _transform_case("bbox_b2_r300_k81_weights", 12, 300, 81, n=2, weights=[10.0, 10.0, 5.0, 5.0]),
    _transform_case("bbox_b3_r200_k5_noscale_plus0", 13, 200, 5, n=3, apply_scale=0, legacy_plus_one=0),
    _transform_case("bbox_b1_r100_k3_noindex", 14, 100, 3, n=1, batch_index=False,
                    correct_transform_coords=1),
    _transform_case("bbox_rotated_b2_r300_k4", 15, 300, 4, n=2, rotated=1),
    _transform_case("bbox_rotated_b1_r200_k2_unbounded", 16, 200, 2, n=1, rotated=1, angle_bound_on=0,
                    clip_angle_thresh=-1.0),
]
CASES = {c["id"]: c for c in NMS_CASES + TRANSFORM_CASES}

ORACLE = '''
import json
cases = json.loads(str(inputs.pop("__cases__")))
results = {}
for case in cases:
    workspace.ResetWorkspace()
    names = []
    for i in range(case["n_inputs"]):
        name = "in%d" % i
        workspace.FeedBlob(name, inputs["%s__%d" % (case["id"], i)])
        names.append(name)
    outs = ["out%d" % i for i in range(case["n_outputs"])]
    op = core.CreateOperator(case["op"], names, outs, **case["args"])
    workspace.RunOperatorOnce(op)
    for i, o in enumerate(outs):
        results["%s__%d" % (case["id"], i)] = workspace.FetchBlob(o)
save(**results)
'''


@lru_cache(maxsize=1)
def oracle():
    import json
    arrays = {f"{c['id']}__{i}": x for c in CASES.values() for i, x in enumerate(c["inputs"])}
    meta = [{"id": c["id"], "op": c["op"], "args": c["args"], "n_inputs": len(c["inputs"]),
             "n_outputs": c["n_outputs"]} for c in CASES.values()]
    arrays["__cases__"] = np.array(json.dumps(meta))
    results, _ = run_caffe2(ORACLE, arrays)
    return {cid: [results[f"{cid}__{i}"] for i in range(c["n_outputs"])] for cid, c in CASES.items()}


def run(case):
    opdef = registry.get(case["op"])
    a = Args(case["args"], op=f"#0 {case['op']}", n_outputs=case["n_outputs"])
    outs = [np.asarray(o) for o in opdef.kernel(np, case["inputs"], a)]
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in case["inputs"]], a)
    assert len(types) == len(outs) == case["n_outputs"]
    for t, o in zip(types, outs):   # each output within its inferred (bounded) type
        assert str(o.dtype) == t.dtype and o.ndim == len(t.shape)
        if t.bound is None:
            assert o.shape == t.shape
        else:
            assert o.shape[0] <= t.shape[0] and o.shape[1:] == t.shape[1:]
    return outs


def _rows(outs):
    """(image, class, score, box) rows of BoxWithNMSLimit outputs, as a sorted array (sets)."""
    scores, boxes, classes = outs[0], outs[1], outs[2]
    return np.concatenate([classes[:, None], scores[:, None], boxes], axis=1)


@pytest.mark.caffe2
@pytest.mark.parametrize("case", NMS_CASES, ids=[c["id"] for c in NMS_CASES])
def test_box_with_nms_limit_matches_caffe2(case):
    want = oracle()[case["id"]]
    got = run(case)
    assert [o.shape for o in got] == [w.shape for w in want]
    assert [str(o.dtype) for o in got] == [str(w.dtype) for w in want]
    assert got[0].size > 0
    if len(got) > 3:
        np.testing.assert_array_equal(got[3], want[3])       # per-image counts: exact
    if len(got) > 4:
        np.testing.assert_array_equal(got[5], want[5])       # per-(image, class) counts: exact
    if case["ties"]:
        # Tied scores: Caffe2's std::sort leaves their order unspecified, so compare sets
        # (rows sorted); detections_per_im is above the count, so no cut falls on a tie.
        g, w = _rows(got), _rows(want)
        np.testing.assert_array_equal(g[np.lexsort(g.T[::-1])], w[np.lexsort(w.T[::-1])])
        return
    # Distinct scores: the order is Caffe2's exactly; boxes are copies of the inputs, and
    # hard-NMS scores too (exact). Soft-NMS scores are products of float32 weights, one
    # per suppression step, the gaussian one through exp: a few float32 ulps each,
    # rtol 1e-5 covers tens of steps.
    np.testing.assert_array_equal(got[2], want[2])
    np.testing.assert_array_equal(got[1], want[1])
    if case["args"].get("soft_nms_enabled"):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
    else:
        np.testing.assert_array_equal(got[0], want[0])
    if len(got) > 4:
        np.testing.assert_array_equal(got[4], want[4])       # kept row indices, in order


@pytest.mark.caffe2
@pytest.mark.parametrize("case", TRANSFORM_CASES, ids=[c["id"] for c in TRANSFORM_CASES])
def test_bbox_transform_matches_caffe2(case):
    want = oracle()[case["id"]]
    got = run(case)
    assert [o.shape for o in got] == [w.shape for w in want]
    np.testing.assert_array_equal(got[1], want[1])           # roi counts per image: exact
    # float32 throughout in the same order of operations, except exp (Eigen's vectorised
    # exp vs numpy's: <= 2 ulp); coordinates up to ~2000 px (scale 2 images), so the
    # error is a few ulps of 2048 (1.2e-4 each): atol 1e-3, and 1e-5 relative.
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-3)


def test_nms_bound_and_shapes():
    opdef = registry.get("BoxWithNMSLimit")
    a = Args({"detections_per_im": 100}, op="#3 BoxWithNMSLimit", n_outputs=6)
    types = opdef.infer([TensorType((1000, 81)), TensorType((1000, 324)), TensorType((2,), "int32")], a)
    assert [t.shape for t in types] == [(200,), (200, 4), (200,), (2,), (200,), (2, 81)]
    assert [t.dtype for t in types] == ["float32"] * 4 + ["int32"] * 2
    assert [t.bound for t in types] == ["BoxWithNMSLimit detections_per_im=100"] * 3 + [None] + [
        "BoxWithNMSLimit detections_per_im=100", None]
    # no limit: every candidate, R * (K - 1); a small input caps the bound the same way
    (s, b, c) = opdef.infer([TensorType((50, 5)), TensorType((50, 20))],
                            Args({"detections_per_im": 0}, op="#3 BoxWithNMSLimit"))
    assert s.shape == (200,) and b.shape == (200, 4) and s.bound == "BoxWithNMSLimit detections_per_im=0"
    (s, _, _) = opdef.infer([TensorType((10, 5)), TensorType((10, 20))], Args({}, op="#3 BoxWithNMSLimit"))
    assert s.shape == (40,)   # default detections_per_im 100 > 10 * 4 candidates
    # 4-D scores and boxes (N, C, 1, 1) are accepted
    (s, _, _) = opdef.infer([TensorType((10, 5, 1, 1)), TensorType((10, 20, 1, 1))], Args({}, op="#3 X"))
    assert s.shape == (40,)


def test_nms_cost_is_the_worst_case():
    opdef = registry.get("BoxWithNMSLimit")
    a = Args({"detections_per_im": 100}, op="#3 BoxWithNMSLimit")
    ins = [TensorType((1000, 81)), TensorType((1000, 324))]
    outs = opdef.infer(ins, a)
    cost = opdef.cost(ins, outs, a)
    assert cost.flops >= 14 * 80 * 1000 * 999 / 2                 # every pair of every class
    assert cost.bytes_read == (1000 * 81 + 1000 * 324) * 4
    assert cost.bytes_written == (100 + 400 + 100) * 4             # at the bound
    soft = opdef.cost(ins, outs, Args({"detections_per_im": 100, "soft_nms_enabled": 1}))
    assert soft.flops > cost.flops
    t = registry.get("BBoxTransform")
    tin = [TensorType((300, 5)), TensorType((300, 84)), TensorType((1, 3))]
    tout = t.infer(tin, Args({}, n_outputs=2))
    assert [o.shape for o in tout] == [(300, 84), (1,)] and all(o.bound is None for o in tout)
    tc = t.cost(tin, tout, Args({}))
    assert tc.flops == 30 * 300 * 21 and tc.bytes_written == (300 * 84 + 1) * 4


def test_shape_errors_name_the_op():
    nms = registry.get("BoxWithNMSLimit")
    with pytest.raises(ShapeError, match="#7 BoxWithNMSLimit.*boxes must be \\(10, 20\\)"):
        nms.infer([TensorType((10, 5)), TensorType((10, 16))], Args({}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ShapeError, match="#7 BoxWithNMSLimit.*boxes must be \\(10, 16\\)"):
        nms.infer([TensorType((10, 5)), TensorType((10, 20))],
                  Args({"input_boxes_include_bg_cls": 0}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ShapeError, match="#7 BoxWithNMSLimit.*2-D"):
        nms.infer([TensorType((10, 5, 2)), TensorType((10, 20))], Args({}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ShapeError, match="batch_splits must be 1-D"):
        nms.infer([TensorType((10, 5)), TensorType((10, 20)), TensorType((2,), "int64")],
                  Args({}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ShapeError, match="3, 4 or 6 outputs"):
        nms.infer([TensorType((10, 5)), TensorType((10, 20))], Args({}, op="#7 BoxWithNMSLimit", n_outputs=5))
    bt = registry.get("BBoxTransform")
    with pytest.raises(ShapeError, match="#8 BBoxTransform.*deltas"):
        bt.infer([TensorType((10, 5)), TensorType((10, 18)), TensorType((1, 3))], Args({}, op="#8 BBoxTransform"))
    with pytest.raises(ShapeError, match="#8 BBoxTransform.*rois"):
        bt.infer([TensorType((10, 6)), TensorType((10, 8)), TensorType((1, 3))], Args({}, op="#8 BBoxTransform"))
    with pytest.raises(ShapeError, match="#8 BBoxTransform.*im_info"):
        bt.infer([TensorType((10, 5)), TensorType((10, 8)), TensorType((1, 2))], Args({}, op="#8 BBoxTransform"))
    with pytest.raises(ShapeError, match="batch index"):
        bt.infer([TensorType((10, 4)), TensorType((10, 8)), TensorType((2, 3))], Args({}, op="#8 BBoxTransform"))


def test_argument_errors():
    nms = registry.get("BoxWithNMSLimit")
    ins = [TensorType((10, 5)), TensorType((10, 20))]
    with pytest.raises(ShapeError, match="#7 BoxWithNMSLimit.*\\(10, 25\\).*rotated"):
        nms.infer(ins, Args({"rotated": 1}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ArgumentError, match="soft_nms_method"):
        nms.infer(ins, Args({"soft_nms_method": "hard"}, op="#7 BoxWithNMSLimit"))
    with pytest.raises(ArgumentError, match="batch_splits"):
        nms.kernel(np, [np.zeros((10, 5), np.float32), np.zeros((10, 20), np.float32),
                        np.array([3, 4], np.int32)], Args({}, op="#7 BoxWithNMSLimit"))
    bt = registry.get("BBoxTransform")
    with pytest.raises(ArgumentError, match="weights must have 4"):
        bt.infer([TensorType((10, 5)), TensorType((10, 8)), TensorType((1, 3))],
                 Args({"weights": [1.0, 2.0]}, op="#8 BBoxTransform"))
    with pytest.raises(ArgumentError, match="batch index out of range"):
        rois = np.zeros((4, 5), np.float32)
        rois[:, 0] = [0, 0, 1, 2]
        bt.kernel(np, [rois, np.zeros((4, 4), np.float32), np.ones((2, 3), np.float32)],
                  Args({}, op="#8 BBoxTransform"))


def test_empty_and_nothing_above_threshold():
    nms = registry.get("BoxWithNMSLimit")
    scores = np.full((20, 4), 0.01, np.float32)
    outs = nms.kernel(np, [scores, np.zeros((20, 16), np.float32)], Args({}, op="#1 B", n_outputs=6))
    assert [o.shape for o in outs] == [(0,), (0, 4), (0,), (1,), (0,), (1, 4)]
    assert outs[3][0] == 0 and outs[5].sum() == 0
    outs = nms.kernel(np, [np.zeros((0, 4), np.float32), np.zeros((0, 16), np.float32)], Args({}, op="#1 B"))
    assert [o.shape for o in outs] == [(0,), (0, 4), (0,)]


def test_hand_nms_and_limit():
    """Two overlapping boxes (IoU 0.81 with +1) and one apart; class 1 only above threshold."""
    boxes = np.array([[0, 0, 9, 9], [1, 1, 9, 9], [20, 20, 29, 29]], np.float32)
    scores = np.array([[0.0, 0.9], [0.0, 0.8], [0.0, 0.7]], np.float32)
    b = np.concatenate([boxes, boxes], axis=1)
    nms = registry.get("BoxWithNMSLimit")
    s, bx, c, splits, keeps, size = nms.kernel(np, [scores, b], Args({"nms": 0.5}, op="#1 B", n_outputs=6))
    np.testing.assert_array_equal(s, np.float32([0.9, 0.7]))
    np.testing.assert_array_equal(bx, boxes[[0, 2]])
    np.testing.assert_array_equal(c, [1, 1])
    np.testing.assert_array_equal(keeps, [0, 2])
    np.testing.assert_array_equal(size, [[0, 2]])
    s, *_ = nms.kernel(np, [scores, b], Args({"nms": 0.9}, op="#1 B"))
    np.testing.assert_array_equal(s, np.float32([0.9, 0.8, 0.7]))                       # 0.81 <= 0.9
    s, *_ = nms.kernel(np, [scores, b], Args({"nms": 0.9, "detections_per_im": 1}, op="#1 B"))
    np.testing.assert_array_equal(s, np.float32([0.9]))


def test_devices_caffe2_cpu_only_placer_both():
    """Caffe2 runs them on the CPU only; placer's host kernels also take a GPU's inputs
    (one read back) for --allow-gpu-only-in-placer."""
    for t in ("BBoxTransform", "BoxWithNMSLimit"):
        opdef = registry.get(t)
        assert opdef.devices == frozenset({"cpu", "gpu"}) and opdef.caffe2_devices == frozenset({"cpu"})


KERNEL_CASES = [
    ("BBoxTransform", _transform_case("gpu-t", 3, 40, 5, n=2)),
    ("BoxWithNMSLimit", _nms_case("gpu-n", 4, 60, 6, splits=[25, 35], score_thresh=0.3, nms=0.5,
                                  detections_per_im=20)),
]


@pytest.mark.parametrize("op_type,case", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_gpu_kernels_keep_to_cupy_rules(op_type, case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(op_type), case["inputs"], Args(case["args"], op=f"#0 {op_type}"))