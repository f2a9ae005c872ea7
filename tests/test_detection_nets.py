"""Detection nets as a whole: data-dependent sizes (bounds, their marks downstream,
--proposals / --detections), im_info from the image, the planner keeping ops to the
devices real Caffe2 has kernels for, and the corpus's Detectron and Mask R-CNN2Go files.

The ops themselves are tested against real Caffe2 in tests/test_ops_detection_*.py and
tests/test_ops_roi.py; the bundled Faster R-CNN in tests/test_faster_rcnn_example.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import corpus_dir
from placer.cli import main
from placer.examples import DATA, faster_rcnn
from placer.examples.builder import NetBuilder
from placer.formats import load_net
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.runtime.inputs import random_inputs
from placer.shapes import bounded_notes, infer
from placer.types import TensorType

A, H, W = 15, 20, 25          # anchors per cell and the feature map of a stride-16 RPN


def rpn_net(b: NetBuilder, post_nms: int = 300) -> None:
    """A feature map -> RPN proposals -> RoIAlign -> FC: the part of a Faster R-CNN whose
    sizes follow from the number of proposals."""
    b.input("feat", (1, 8, H, W))
    b.input("im_info", (1, 3))
    b.param("rpn_w", (A, 8, 1, 1), "XavierFill")
    b.param("rpn_b", (A,), "ConstantFill", value=0.0)
    b.param("delta_w", (4 * A, 8, 1, 1), "XavierFill")
    b.param("delta_b", (4 * A,), "ConstantFill", value=0.0)
    b.param("anchors", (A, 4), "UniformFill", min=0.0, max=64.0)
    b.param("fc_w", (32, 8 * 7 * 7), "XavierFill")
    b.param("fc_b", (32,), "ConstantFill", value=0.0)
    b.op("Conv", ["feat", "rpn_w", "rpn_b"], "logits", kernel=1)
    b.op("Sigmoid", ["logits"], "probs")
    b.op("Conv", ["feat", "delta_w", "delta_b"], "deltas", kernel=1)
    b.op("GenerateProposals", ["probs", "deltas", "im_info", "anchors"], ["rois", "rois_probs"],
         spatial_scale=1.0 / 16, pre_nms_topN=1000, post_nms_topN=post_nms, nms_thresh=0.7, min_size=0.0)
    b.op("RoIAlign", ["feat", "rois"], "pooled", pooled_h=7, pooled_w=7, spatial_scale=1.0 / 16,
         sampling_ratio=2)
    b.op("FC", ["pooled", "fc_w", "fc_b"], "head")
    b.output("head")


SHAPES = {"feat": TensorType((1, 8, H, W)), "im_info": TensorType((1, 3))}


def _net():
    b = NetBuilder("rpn")
    rpn_net(b)
    return net_from_netdef(b.predict, b.init)


def _typed(counts=None):
    return infer(_net(), SHAPES, counts)


@pytest.fixture(autouse=True)
def _ops_present():
    missing = [t for t in ("GenerateProposals", "RoIAlign", "BBoxTransform", "BoxWithNMSLimit")
               if registry.get(t) is None]
    if missing:
        pytest.fail(f"detection ops not registered: {missing}")


def test_proposal_counts_are_bounded_and_marked_downstream():
    typed = _typed()
    rois, head = typed.blobs["rois"], typed.blobs["head"]
    assert rois.shape == (300, 5) and rois.bound == "GenerateProposals post_nms_topN=300"
    assert typed.blobs["rois_probs"].shape == (300,)
    # what is computed from the proposals carries their mark; what is not, does not
    assert typed.blobs["pooled"].shape == (300, 8, 7, 7) and typed.blobs["pooled"].bound == rois.bound
    assert head.shape == (300, 32) and head.bound == rois.bound
    assert typed.blobs["probs"].bound is None and typed.blobs["feat"].bound is None
    (note,) = bounded_notes(typed.blobs)
    assert "GenerateProposals post_nms_topN=300" in note and "4 blob(s)" in note


def test_proposals_cap_prices_a_typical_count():
    full = _typed()
    typed = _typed({"GenerateProposals": 40})
    assert typed.blobs["rois"].shape == (40, 5) and typed.blobs["head"].shape == (40, 32)
    assert "priced at 40" in typed.blobs["rois"].bound
    fc = next(i for i, op in enumerate(typed.net.ops) if op.type == "FC")
    # the FC after RoIAlign: 40 rows instead of 300, its MACs in the same ratio
    assert typed.features[fc].macs == pytest.approx(full.features[fc].macs * 40 / 300)
    # a cap above the bound changes nothing
    assert _typed({"GenerateProposals": 5000}).blobs["rois"].shape == (300, 5)


def test_marks_survive_the_inference_cache():
    """Two FCs alike in type, arguments and input shapes, one reading a bounded blob: the
    second must not take the first's unmarked outputs from the cache."""
    b = NetBuilder("cache")
    rpn_net(b)
    b.input("plain", (300, 8, 7, 7))
    b.op("FC", ["plain", "fc_w", "fc_b"], "plain_head")
    net = net_from_netdef(b.predict, b.init)
    net.ops.insert(0, net.ops.pop())   # the unbounded FC first
    net = type(net)(**{**net.__dict__, "ops": [o.__class__(**{**o.__dict__, "index": i})
                                                for i, o in enumerate(net.ops)]})
    typed = infer(net, {**SHAPES, "plain": TensorType((300, 8, 7, 7))})
    assert typed.blobs["plain_head"].bound is None
    assert typed.blobs["head"].bound is not None


def test_random_im_info_is_the_image_size():
    net = _net()
    typed = infer(net, SHAPES)
    (info,) = random_inputs(net, typed.blobs, ["im_info"]).values()
    assert info.tolist() == [[H * 16, W * 16, 1.0]] and info.dtype == np.float32


def test_plan_cli_takes_im_info_from_data_and_names_the_bound(tmp_path, capsys):
    """The bundled Faster R-CNN with only --input data: im_info (N, 3) follows from it."""
    files = faster_rcnn.build(faster_rcnn.small()).save(tmp_path, "frcnn")
    info = json.loads(files["value_info"].read_text())
    del info["im_info"], info["data"]
    files["value_info"].write_text(json.dumps(info))
    common = ["plan", str(files["predict"]), "--init-net", str(files["init"]), "--input", "data=1,3,256,256",
              "--json", "--stability-draws", "0"]
    assert main(common) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bounded_blobs"]["rpn_rois"] == {"shape": [1000, 5], "bound": "GenerateProposals post_nms_topN=1000"}
    assert doc["bounded_blobs"]["bbox_nms"]["shape"] == [100, 4]
    assert any("priced at their bound" in n for n in doc["notes"])
    assert main(common + ["--proposals", "300", "--detections", "20"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bounded_blobs"]["rpn_rois"]["shape"] == [300, 5]
    assert doc["bounded_blobs"]["pool5"]["shape"][0] == 300
    assert doc["bounded_blobs"]["bbox_nms"]["shape"] == [20, 4]


def test_proposals_option_is_checked(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "x.pbtxt", "--proposals", "0"])
    assert e.value.code == 2 and "--proposals" in capsys.readouterr().err


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["frcnn_r50c4_predict_net.pbtxt", "maskrcnn2go_fp32_model.pbtxt"])
def test_corpus_detection_nets_have_no_unknown_op_and_ask_for_their_weights(name, capsys):
    path = corpus_dir() / "caffe2" / name
    assert main(["inspect", str(path), "--input", "data=1,3,800,800", "--json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["totals"]["unknown_op_types"] == {}
    net = load_net(path)
    weights = {b for op in net.ops for b in op.inputs if b.endswith(("_w", "_b"))}
    missing = [m for m in doc["missing"]]
    # every missing shape is a weight (or Mask R-CNN2Go's anchors), asked for with the init net
    assert missing and all("--init-net INIT" in m for m in missing)
    named = {m.split("'")[1] for m in missing}
    assert named <= weights | {"anchor"}, sorted(named - weights)[:5]
    assert "--init-net" in captured.err


def test_ops_without_a_caffe2_gpu_kernel_stay_on_the_cpu_unless_lifted(tmp_path, capsys):
    files = faster_rcnn.build(faster_rcnn.small()).save(tmp_path, "frcnn")
    common = ["plan", str(files["predict"]), "--init-net", str(files["init"]), "--gpu-profile", "t4-pcie3",
              "--json", "--stability-draws", "0"]
    assert main(common) == 0
    doc = json.loads(capsys.readouterr().out)
    by_type = {o["type"]: o for o in doc["ops"]}
    for t in ("BBoxTransform", "BoxWithNMSLimit"):
        assert by_type[t]["device"] == "cpu"
        assert by_type[t]["reason"].startswith("pinned: no GPU kernel in Caffe2"), by_type[t]["reason"]
    assert by_type["RoIAlign"]["reason"] == "" or "pinned" not in by_type["RoIAlign"]["reason"]
    # lifted, with the NMS forced onto the GPU to see the note (pricing alone may keep it on the CPU)
    assert main(common + ["--allow-gpu-only-in-placer", "--pin", "BoxWithNMSLimit=gpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {o["type"]: o["device"] for o in doc["ops"]}["BoxWithNMSLimit"] == "cuda:0"
    assert any("Caffe2 has no GPU kernel" in n and "BoxWithNMSLimit" in n for n in doc["notes"])
    # without the lift, that pin is refused in one line
    assert main(common + ["--pin", "BoxWithNMSLimit=gpu"]) == 2
    assert "no GPU kernel in Caffe2" in capsys.readouterr().err


@pytest.mark.corpus
def test_corpus_faster_rcnn_plans_with_the_bundled_weights(capsys):
    """The corpus R-50-C4 export and the bundled generator share every blob name: its init
    net gives the corpus net its weight shapes, and the net plans whole."""
    path = corpus_dir() / "caffe2" / "frcnn_r50c4_predict_net.pbtxt"
    assert main(["plan", str(path), "--init-net", str(DATA / "faster_rcnn_r50_c4_init.pbtxt"),
                 "--input", "data=1,3,800,800", "--gpu-profile", "v100-16gb-pcie3", "--json",
                 "--stability-draws", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["ops"]) == 132
    where = {o["type"]: o["device"] for o in doc["ops"]}
    assert where["Conv"] == "cuda:0" and where["BoxWithNMSLimit"] == "cpu" and where["BBoxTransform"] == "cpu"
    assert doc["bounded_blobs"]["rpn_rois"]["shape"] == [1000, 5]
    assert doc["total_s"] < doc["baselines"]["all_cpu"]["total_s"]
