"""The bundled Faster R-CNN end to end: placer's run equals real Caffe2's on the same
inputs and weights, the planned placement (backbone on a GPU, the detection ops where
Caffe2 has kernels) runs under the emulated GPU to the same outputs, and the placed
NetDef runs in real Caffe2 with every device mapped to the CPU.

The nets are ``faster_rcnn.small()`` and the same with its mask head (ResNet-C4 with one bottleneck per stage, 1x3x224x224,
81 classes; the R-50-C4 800x800 net takes real Caffe2 about 80 s on this CPU and is planned,
not run, here). The weights are drawn once by placer's init net and handed to Caffe2 as
GivenTensorFills, so both run the same numbers.

Tolerances: the trunk is 5 stages of float32 convolutions, whose sums run in a different
order in Caffe2 (its im2col + BLAS) and in placer (numpy's BLAS): relative differences of
a few 1e-6 per layer, 1e-4 at most after the trunk. Proposals and detections are decisions
on those scores: the comparison is exact for the decisions (which boxes, which classes,
their order) when no two candidates' scores lie within that tolerance, and as sets
otherwise; coordinates and scores to rtol 1e-4 and 1e-3 pixels.
"""
from __future__ import annotations

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from test_training_run_placed import on_the_cpu

from placer.examples import faster_rcnn
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import compose_machine
from placer.hardware.profiles import default_profiles
from placer.planning.planner import PlanOptions, plan
from placer.rewrite.netdef import place
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import TensorType

CFG = faster_rcnn.small()
OUTPUTS = ("score_nms", "bbox_nms", "class_nms")
MASKS = "mask_fcn_probs"
WATCH = ("rpn_rois", "rpn_roi_probs", "cls_prob", "pred_bbox")
DETECTION_OPS = {"GenerateProposals", "BBoxTransform", "BoxWithNMSLimit"}


def _given_init(params: dict) -> pb.NetDef:
    init = pb.NetDef(name="weights")
    for name, arr in params.items():
        arr = np.asarray(arr, np.float32)
        op = init.op.add(type="GivenTensorFill", output=[name])
        op.arg.add(name="shape", ints=list(arr.shape))
        op.arg.add(name="values", floats=arr.ravel().tolist())
    return init


@pytest.fixture(scope="module", params=[False, True], ids=["faster", "mask"])
def runs(request):
    cfg = faster_rcnn.small(mask=request.param)
    b = faster_rcnn.build(cfg)
    net = net_from_netdef(b.predict, b.init)
    rng = np.random.default_rng(7)
    feeds = {"data": (50.0 * rng.standard_normal((1, 3, CFG.height, CFG.width))).astype(np.float32),
             "im_info": np.array([[CFG.height, CFG.width, 1.0]], np.float32)}
    cpu = Executor(net)
    ours = cpu.run(feeds, iterations=1, warmup=0, watch=WATCH)
    weights = {k: np.asarray(v) for k, v in cpu.params.items()}
    given = net_from_netdef(b.predict, _given_init(weights))
    typed = infer(given, {k: TensorType(v.shape) for k, v in feeds.items()})
    machine = compose_machine(*default_profiles("host-ci-2core", "t4-pcie3"))
    planned = plan(typed, machine, PlanOptions(method="mincut"))
    placed = place(given, planned.plan.placement, machine)
    emulated = Executor(net_from_netdef(placed.predict, placed.init), emulate_gpu=True).run(
        feeds, iterations=1, warmup=0)
    return dict(net=net, feeds=feeds, ours=ours, weights=weights, planned=planned, placed=placed,
                emulated=emulated, init=_given_init(weights), predict=b.predict, mask=cfg.mask)


def test_the_plan_puts_the_trunk_on_the_gpu_and_the_detection_ops_on_the_cpu(runs):
    net, placement = runs["net"], runs["planned"].plan.placement
    kinds = [runs["planned"].machine.devices[d].kind for d in placement]
    where = {op.type: set() for op in net.ops}
    for op, kind in zip(net.ops, kinds):
        where[op.type].add(kind)
    assert where["Conv"] == {"gpu"}
    for t in ("BBoxTransform", "BoxWithNMSLimit"):          # no GPU kernel in Caffe2
        assert where[t] == {"cpu"}, t
    directions = {(c[1], c[2]) for c in runs["placed"].copies}
    assert ("cuda:0", "cpu") in directions


def test_the_placed_net_under_the_emulated_gpu_equals_the_unplaced_run(runs):
    for name in OUTPUTS + ((MASKS,) if runs["mask"] else ()):
        np.testing.assert_array_equal(runs["emulated"][name], runs["ours"][name], err_msg=name)


def test_detections_are_not_empty(runs):
    scores, boxes, classes = (runs["ours"][n] for n in OUTPUTS)
    assert 0 < len(scores) <= CFG.detections_per_im
    assert boxes.shape == (len(scores), 4) and classes.shape == (len(scores),)
    assert (scores >= CFG.score_thresh).all()
    if runs["mask"]:
        assert runs["ours"][MASKS].shape == (len(scores), CFG.classes, 14, 14)


SCRIPT = """
init, predict, placed = caffe2_pb2.NetDef(), caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
init.ParseFromString(inputs["init"].tobytes())
predict.ParseFromString(inputs["predict"].tobytes())
placed.ParseFromString(inputs["placed"].tobytes())
placed_init = caffe2_pb2.NetDef()
placed_init.ParseFromString(inputs["placed_init"].tobytes())
out = {}
for key, net, weights in (("plain", predict, init), ("placed", placed, placed_init)):
    workspace.ResetWorkspace()
    workspace.RunNetOnce(weights)
    for name in ("data", "im_info"):
        workspace.FeedBlob(name, inputs[name])
    workspace.RunNetOnce(net)
    for b in OUTPUTS:
        out[key + "/" + b] = workspace.FetchBlob(b)
save(**out)
"""


SCORE_RTOL = 1e-4   # the trunk's float32 sums in another order (module docstring)


def _match(ours: dict, theirs: dict, what: str) -> dict[int, int]:
    """Detections equal: the same count; each of ours has its box in theirs with the same
    class (as sets: near-equal scores may swap order), box and score within tolerance.
    When the per-image limit cuts the list, a detection whose score is within the
    tolerance of the cut may be replaced by its neighbour across it (which of two
    near-equal scores is kept depends on the BLAS's rounding), so those may go unmatched.
    Returns {our index: Caffe2's index} of the matched ones."""
    s1, b1, c1 = (ours[n] for n in OUTPUTS)
    s2, b2, c2 = (theirs[n] for n in OUTPUTS)
    assert len(s1) == len(s2), f"{what}: {len(s1)} detections vs Caffe2's {len(s2)}"
    cut = min(s1.min(), s2.min()) * (1 + 2 * SCORE_RTOL) if len(s1) == CFG.detections_per_im else -1.0
    used, order = np.zeros(len(s2), bool), {}
    for i in range(len(s1)):
        close = (~used & (c2 == c1[i]) & np.isclose(s2, s1[i], rtol=SCORE_RTOL, atol=1e-6)
                 & np.all(np.abs(b2 - b1[i]) <= 1e-3 + 1e-4 * np.abs(b1[i]), axis=1))
        if not close.any() and s1[i] <= cut:
            continue
        assert close.any(), f"{what}: detection {i} (class {c1[i]}, score {s1[i]}, box {b1[i]}) not in Caffe2's"
        used[np.flatnonzero(close)[0]] = True
        order[i] = int(np.flatnonzero(close)[0])
    return order


@pytest.mark.caffe2
def test_outputs_equal_real_caffe2_and_the_placed_net_runs_there(runs):
    feeds = {**runs["feeds"],
             "init": np.frombuffer(runs["init"].SerializeToString(), np.uint8),
             "predict": np.frombuffer(runs["predict"].SerializeToString(), np.uint8),
             "placed": np.frombuffer(on_the_cpu(runs["placed"].predict).SerializeToString(), np.uint8),
             "placed_init": np.frombuffer(on_the_cpu(runs["placed"].init).SerializeToString(), np.uint8)}
    names = list(OUTPUTS) + ([MASKS] if runs["mask"] else [])
    arrays, _ = run_caffe2(f"OUTPUTS = {names!r}\n" + SCRIPT, feeds)
    plain = {n: arrays[f"plain/{n}"] for n in names}
    placed = {n: arrays[f"placed/{n}"] for n in names}
    order = _match(runs["ours"], plain, "placer vs Caffe2")
    if runs["mask"]:   # each detection's masks, a Sigmoid of float32 convolutions: atol 1e-4
        mine = list(order)
        np.testing.assert_allclose(runs["ours"][MASKS][mine], plain[MASKS][[order[i] for i in mine]],
                                   rtol=1e-4, atol=1e-4)
    for n in names:   # one Caffe2 process, the same kernels: the copies change no value
        np.testing.assert_array_equal(placed[n], plain[n], err_msg=f"placed net in Caffe2: {n}")
