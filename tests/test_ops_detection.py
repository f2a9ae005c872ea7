"""SSD fork ops: Permute and Normalize against torch, PriorBox and DetectionOutput against
boxes worked out by hand, and SSD300 end to end on the runtime."""
from __future__ import annotations

import contextlib
import io
import json
import math
import time

import numpy as np
import pytest
from conftest import corpus_dir, require_cupy, require_torch
from cupy_standin import check_gpu_kernel

from placer.errors import ArgumentError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType


def run(op_type, arrays, args, xp=np):
    a = Args(args, op=f"#0 {op_type}")
    opdef = registry.get(op_type)
    outs = opdef.kernel(xp, arrays, a)
    (t,) = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in arrays], a)
    assert tuple(outs[0].shape) == t.shape and str(outs[0].dtype) == t.dtype  # infer and kernel agree
    return outs[0]


# ---------------------------------------------------------------- Permute

PERMUTES = [([0, 2, 3, 1], (2, 3, 4, 5), [0, 2, 3, 1]),
            ([0, 3], (2, 3, 4, 5), [0, 3, 1, 2]),       # missing axes follow in order
            ([], (2, 3, 4), [0, 1, 2]),
            ([2, 0], (2, 3, 4), [2, 0, 1])]


@pytest.mark.torch
@pytest.mark.parametrize("order,shape,full", PERMUTES, ids=str)
def test_permute_matches_torch(order, shape, full):
    torch = require_torch()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = run("Permute", [x], {"order": order})
    np.testing.assert_array_equal(y, torch.from_numpy(x).permute(*full).numpy())
    assert y.flags.c_contiguous and not np.shares_memory(x, y)
    cost = registry.get("Permute").cost([TensorType(shape)], [TensorType(y.shape)], Args({"order": order}))
    assert cost.flops == 0 and cost.bytes_read == cost.bytes_written == x.nbytes


def test_permute_refuses_a_bad_order():
    with pytest.raises(ShapeError, match="#2 Permute.*order"):
        registry.get("Permute").infer([TensorType((1, 2, 3))], Args({"order": [0, 0, 1]}, op="#2 Permute"))
    with pytest.raises(ShapeError, match="order"):
        registry.get("Permute").infer([TensorType((1, 2, 3))], Args({"order": [3]}, op="#2 Permute"))


# ---------------------------------------------------------------- Normalize

@pytest.mark.torch
@pytest.mark.parametrize("across", [0, 1])
@pytest.mark.parametrize("shared", [0, 1])
def test_normalize_matches_torch(across, shared):
    torch = require_torch()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    scale = (rng.random(1 if shared else 6) * 20 + 1).astype(np.float32)
    y = run("Normalize", [x, scale], {"across_spatial": across, "channel_shared": shared})
    t = torch.from_numpy(x)
    if across:
        ref = torch.nn.functional.normalize(t.reshape(2, -1), dim=1).reshape(t.shape)
    else:
        ref = torch.nn.functional.normalize(t, dim=1)
    ref = ref * torch.from_numpy(scale).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_normalize_defaults_eps_and_scale_checks():
    x = np.zeros((1, 3, 2, 2), np.float32)
    x[0, :, 0, 0] = [3.0, 4.0, 0.0]
    y = run("Normalize", [x, np.array([2.0], np.float32)], {})  # defaults: across_spatial, channel_shared
    np.testing.assert_allclose(y[0, :, 0, 0], [1.2, 1.6, 0.0], rtol=1e-6)  # 2 * (3, 4) / 5
    assert np.all(np.isfinite(y)) and np.all(y[0, :, 1:, :] == 0)            # eps: zeros stay 0
    big = run("Normalize", [x, np.array([1.0], np.float32)], {"eps": 11.0})
    np.testing.assert_allclose(big[0, :2, 0, 0], [0.5, 2 / 3], rtol=1e-6)   # sqrt(25 + 11) = 6
    with pytest.raises(ShapeError, match="scale has 1 values, expected 3"):
        registry.get("Normalize").infer([TensorType((1, 3, 2, 2)), TensorType((1,))],
                                        Args({"channel_shared": 0}, op="#1 Normalize"))
    with pytest.raises(ShapeError, match="takes 2 inputs"):  # Caffe2's own one-input Normalize
        registry.get("Normalize").check_arity(1, "#1 Normalize")
    cost = registry.get("Normalize").cost([TensorType((1, 3, 2, 2)), TensorType((3,))],
                                          [TensorType((1, 3, 2, 2))], Args({"across_spatial": 0}))
    assert cost.flops == 4 * 12 + 4 and cost.bytes_read == (12 + 3) * 4 and cost.bytes_written == 48


# ---------------------------------------------------------------- PriorBox

R2 = math.sqrt(2.0)
# 2x2 map on an 8x8 image: step 4, centres at 2 and 6. min_size 2, max_size 4, aspect
# ratio 2 flipped: half extents (1, 1), (sqrt(8)/2 = sqrt 2), (sqrt 2, 1/sqrt 2), (1/sqrt 2, sqrt 2).
HALF = [(1.0, 1.0), (R2, R2), (R2, R2 / 2), (R2 / 2, R2)]
CENTRES = [(2.0, 2.0), (6.0, 2.0), (2.0, 6.0), (6.0, 6.0)]  # (cx, cy), rows then columns


def _hand_boxes(half=HALF, centres=CENTRES, img=8.0):
    return np.array([[(cx - hw) / img, (cy - hh) / img, (cx + hw) / img, (cy + hh) / img]
                     for cx, cy in centres for hw, hh in half])


PRIOR_ARGS = {"min_size": [2.0], "max_size": [4.0], "aspect_ratio": [2.0], "flip": 1,
              "variance": [0.1, 0.1, 0.2, 0.2]}


def test_priorbox_every_coordinate():
    fmap, image = np.zeros((1, 5, 2, 2), np.float32), np.zeros((1, 3, 8, 8), np.float32)
    y = run("PriorBox", [fmap, image], PRIOR_ARGS)
    assert y.shape == (1, 2, 4 * 4 * 4)
    boxes = y[0, 0].reshape(-1, 4)
    np.testing.assert_allclose(boxes, _hand_boxes(), atol=1e-7)
    np.testing.assert_allclose(boxes[0], [0.125, 0.125, 0.375, 0.375], atol=1e-7)
    np.testing.assert_allclose(boxes[1], [0.0732233, 0.0732233, 0.4267767, 0.4267767], atol=1e-6)
    np.testing.assert_allclose(boxes[6], [0.5732233, 0.1616117, 0.9267767, 0.3383883], atol=1e-6)
    np.testing.assert_allclose(y[0, 1].reshape(-1, 4), np.tile([0.1, 0.1, 0.2, 0.2], (16, 1)), atol=1e-7)
    same = run("PriorBox", [fmap, image], {"min_sizes": [2.0], "max_sizes": [4.0], "aspect_ratios": [2.0],
                                           "flip": 1, "variance": [0.1, 0.1, 0.2, 0.2]})
    np.testing.assert_array_equal(same, y)  # the Caffe2 SSD port's argument names
    cost = registry.get("PriorBox").cost([TensorType(fmap.shape), TensorType(image.shape)],
                                         [TensorType(y.shape)], Args(PRIOR_ARGS))
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (2 * 64, 0, 2 * 64 * 4)  # shapes only


def test_priorbox_clip_step_image_size_and_duplicate_ratios():
    fmap, image = np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 3, 1, 1), np.float32)
    args = {"min_size": [6.0], "aspect_ratio": [1.0, 1.0], "img_size": 8, "step": 4.0, "clip": 1,
            "variance": [0.5]}
    y = run("PriorBox", [fmap, image], args)          # ratio 1 only once; no max box
    expected = np.clip(_hand_boxes(half=[(3.0, 3.0)]), 0, 1)
    np.testing.assert_allclose(y[0, 0].reshape(-1, 4), expected, atol=1e-7)
    assert expected.min() == 0 and expected.max() == 1 and np.all(y[0, 1] == 0.5)
    wide = run("PriorBox", [fmap, image], {"min_size": [2.0], "img_h": 8, "img_w": 16, "step_h": 4.0,
                                           "step_w": 8.0, "offset": 0.0, "flip": 0, "aspect_ratio": [4.0]})
    b = wide[0, 0].reshape(-1, 4)
    np.testing.assert_allclose(b[0], [-1 / 16, -1 / 8, 1 / 16, 1 / 8], atol=1e-7)  # centre (0, 0)
    np.testing.assert_allclose(b[3], [(8 - 2) / 16, -0.5 / 8, (8 + 2) / 16, 0.5 / 8], atol=1e-7)  # 4 x 1
    with pytest.raises(ArgumentError, match="max_size"):
        registry.get("PriorBox").infer([TensorType((1, 1, 2, 2)), TensorType((1, 3, 8, 8))],
                                       Args({"min_size": [4.0], "max_size": [2.0]}, op="#5 PriorBox"))


# ---------------------------------------------------------------- DetectionOutput

PRIORS = np.array([[0.10, 0.10, 0.40, 0.40],
                   [0.12, 0.12, 0.42, 0.42],    # IoU with prior 0: 0.0784 / 0.1016 = 0.77
                   [0.60, 0.60, 0.90, 0.90],
                   [0.50, 0.10, 0.80, 0.30]])   # no overlap with 0 or 1
SCORES = np.array([[0.95, 0.90, 0.10],          # (prior, class); class 0 is background
                   [0.95, 0.80, 0.05],
                   [0.95, 0.05, 0.70],
                   [0.95, 0.30, 0.02]])
DET_ARGS = {"num_classes": 3, "share_location": 1, "background_label_id": 0, "code_type": "CENTER_SIZE",
            "nms_param.nms_threshold": 0.45, "confidence_threshold": 0.2}


def _det_inputs(loc=None, scores=(SCORES,), priors=PRIORS, variance=(0.1, 0.1, 0.2, 0.2)):
    n, p = len(scores), len(priors)
    loc = np.zeros((n, p * 4), np.float32) if loc is None else loc
    conf = np.stack([s.reshape(-1) for s in scores]).astype(np.float32)
    prior = np.stack([priors.reshape(-1), np.tile(variance, p)])[None].astype(np.float32)
    return [loc, conf, prior]


def test_detection_nms_keeps_the_right_boxes():
    y = run("DetectionOutput", _det_inputs(), DET_ARGS)
    assert y.shape == (1, 1, 2 * 4, 7)      # no keep_top_k: 2 classes x 4 candidates
    rows = y[0, 0]
    np.testing.assert_allclose(rows[:3], [[0, 1, 0.90, *PRIORS[0]],     # prior 1 suppressed by 0
                                          [0, 1, 0.30, *PRIORS[3]],     # by label, then score
                                          [0, 2, 0.70, *PRIORS[2]]], atol=1e-6)
    assert np.all(rows[3:] == -1)            # padding; background (0.95 everywhere) skipped


def test_detection_keep_top_k_top_k_and_batch():
    quiet = np.full_like(SCORES, 0.1)        # nothing above the threshold in image 1
    y = run("DetectionOutput", _det_inputs(scores=(SCORES, quiet)), {**DET_ARGS, "keep_top_k": 2})
    assert y.shape == (1, 1, 4, 7)
    np.testing.assert_allclose(y[0, 0, :2], [[0, 1, 0.90, *PRIORS[0]], [0, 2, 0.70, *PRIORS[2]]], atol=1e-6)
    assert np.all(y[0, 0, 2:] == -1)
    both = run("DetectionOutput", _det_inputs(scores=(quiet, SCORES)), {**DET_ARGS, "keep_top_k": 5})
    assert both.shape == (1, 1, 10, 7) and list(both[0, 0, :3, 0]) == [1, 1, 1]  # image id 1
    top1 = run("DetectionOutput", _det_inputs(), {**DET_ARGS, "nms_param.top_k": 1})
    np.testing.assert_allclose(top1[0, 0, :2, :3], [[0, 1, 0.90], [0, 2, 0.70]], atol=1e-6)
    assert top1.shape == (1, 1, 2, 7)        # 2 classes x 1 candidate
    loose = run("DetectionOutput", _det_inputs(), {**DET_ARGS, "nms_param.nms_threshold": 0.8})
    np.testing.assert_allclose(loose[0, 0, :4, 2], [0.90, 0.80, 0.30, 0.70], atol=1e-6)  # 0.77 <= 0.8


def test_detection_decodes_center_size():
    rng = np.random.default_rng(3)
    p = 6
    centre, size = rng.random((p, 2)) * 0.6 + 0.2, rng.random((p, 2)) * 0.2 + 0.05
    priors = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
    loc = rng.standard_normal((1, p * 4)).astype(np.float32)
    var = (0.1, 0.2, 0.3, 0.4)
    scores = np.stack([np.zeros(p), rng.permutation(p) / 10 + 0.3], axis=1)  # distinct, one class
    y = run("DetectionOutput", _det_inputs(loc=loc, scores=(scores,), priors=priors, variance=var),
            {"num_classes": 2, "code_type": "CENTER_SIZE", "nms_param.nms_threshold": 1.0})
    l = loc.reshape(p, 4).astype(np.float64)
    pw, ph = priors[:, 2] - priors[:, 0], priors[:, 3] - priors[:, 1]
    cx = priors[:, 0] + pw / 2 + var[0] * l[:, 0] * pw
    cy = priors[:, 1] + ph / 2 + var[1] * l[:, 1] * ph
    w, h = pw * np.exp(var[2] * l[:, 2]), ph * np.exp(var[3] * l[:, 3])
    expected = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    order = np.argsort(-scores[:, 1])
    np.testing.assert_allclose(y[0, 0, :, 2], scores[order, 1], rtol=1e-6)
    np.testing.assert_allclose(y[0, 0, :, 3:], expected[order], rtol=1e-5, atol=1e-6)
    corner = run("DetectionOutput", _det_inputs(loc=loc, scores=(scores,), priors=priors, variance=var),
                 {"num_classes": 2, "nms_param.nms_threshold": 1.0})  # proto default: CORNER
    np.testing.assert_allclose(corner[0, 0, :, 3:], (priors + l * var)[order], rtol=1e-5, atol=1e-6)


def test_detection_location_per_class():
    loc = np.zeros((1, 4, 3, 4), np.float32)
    loc[0, :, 2, :] = [1.0, 0.0, 0.0, 0.0]   # class 2's boxes move right by 0.1 * width
    y = run("DetectionOutput", _det_inputs(loc=loc.reshape(1, -1)), {**DET_ARGS, "share_location": 0})
    np.testing.assert_allclose(y[0, 0, 0, 3:], PRIORS[0], atol=1e-6)
    np.testing.assert_allclose(y[0, 0, 2, 3:], PRIORS[2] + [0.03, 0, 0.03, 0], atol=1e-6)


def test_detection_shape_errors_cost_and_devices():
    opdef = registry.get("DetectionOutput")
    args = Args({**DET_ARGS, "keep_top_k": 200}, op="#9 DetectionOutput")
    with pytest.raises(ShapeError, match="#9 DetectionOutput.*priors"):
        opdef.infer([TensorType((1, 16)), TensorType((1, 12)), TensorType((1, 2, 15))], args)
    with pytest.raises(ShapeError, match="num_classes 3"):
        opdef.infer([TensorType((1, 16)), TensorType((1, 8)), TensorType((1, 2, 16))], args)
    inputs = [TensorType((1, 8732 * 4)), TensorType((1, 8732 * 21)), TensorType((1, 2, 8732 * 4))]
    ssd = Args({**DET_ARGS, "num_classes": 21, "keep_top_k": 200, "nms_param.top_k": 400})
    (out,) = opdef.infer(inputs, ssd)
    assert out.shape == (1, 1, 200, 7)
    cost = opdef.cost(inputs, [out], ssd)
    assert cost.flops > 12 * 20 * 400 * 399 / 2 and cost.bytes_written == 200 * 7 * 4
    assert cost.bytes_read == sum(t.nbytes for t in inputs)
    assert opdef.devices == frozenset({"cpu"})
    assert registry.get("PriorBox").devices == frozenset({"cpu", "gpu"})


KERNEL_CASES = [
    ("Permute", lambda: [np.ones((1, 2, 3, 4), np.float32)], {"order": [0, 2, 3, 1]}),
    ("Normalize", lambda: [np.ones((1, 2, 3, 4), np.float32), np.ones(2, np.float32)],
     {"across_spatial": 0, "channel_shared": 0}),
    ("PriorBox", lambda: [np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 3, 8, 8), np.float32)],
     {**PRIOR_ARGS, "clip": 1}),
    ("DetectionOutput", _det_inputs, {**DET_ARGS, "keep_top_k": 3, "nms_param.eta": 0.9}),
]


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    opdef = registry.get(op_type)
    if "gpu" not in opdef.devices:
        pytest.skip("CPU-only op: the planner never places it on a GPU")
    check_gpu_kernel(opdef, make(), Args(args, op=f"#0 {op_type}"))


# ---------------------------------------------------------------- SSD300 end to end

SSD = "caffe/ssd300_vgg_voc0712_deploy.prototxt"


@pytest.mark.corpus
def test_ssd300_runs_end_to_end_and_plans_detection_on_the_cpu():
    from placer import cli
    from placer.formats import load_net
    from placer.runtime.executor import Executor
    from placer.shapes import infer
    path = corpus_dir() / SSD
    net = load_net(path)
    typed = infer(net)
    assert typed.unknown_ops == [] and all(t is not None for t in typed.blobs.values())
    assert typed.blobs["detection_out"].shape == (1, 1, 200, 7)
    assert all(typed.features[op.index].known for op in net.ops)
    x = np.random.default_rng(0).standard_normal((1, 3, 300, 300)).astype(np.float32)
    start = time.perf_counter()
    out = Executor(net).run({"data": x}, iterations=1, warmup=0)
    assert time.perf_counter() - start < 60
    rows = out["detection_out"][0, 0]
    assert rows.shape == (200, 7)
    real = rows[rows[:, 1] != -1]
    assert len(real) > 0 and np.all(rows[rows[:, 1] == -1] == -1)
    assert np.all(real[:, 0] == 0) and np.all((real[:, 1] >= 1) & (real[:, 1] <= 20))
    assert np.all((real[:, 2] > 0.01) & (real[:, 2] <= 1)) and np.all(real[:, 3] < real[:, 5])
    assert np.all(np.diff(real[:, 1]) >= 0)  # grouped by label
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert cli.main(["plan", str(path), "--json"]) == 0, stderr.getvalue()
    ops = {o["type"]: o for o in json.loads(stdout.getvalue())["ops"]}
    assert ops["DetectionOutput"]["device"] == "cpu"
