"""The ONNX corpus (tests/data/onnx: torchvision CNNs, a BERT- and a GPT-2-style encoder and a
DLRM, exported here by bench/onnx_corpus/export.py) through placer.

- FLOPs and parameters: placer's multiply-adds and parameter count of each torchvision
  model equal the figures torchvision documents (its weights' ``_ops``, which count
  multiply-adds, and ``num_params``) within 2%. The exporter folds each BatchNorm into the
  convolution before it (a bias of C values in place of 2C learned and 2C running values),
  so the counts differ from torchvision's by those few thousand values, well under 2%.
- ``placer plan --gpu-profile t4-pcie3`` plans every model, and the placed net run on an
  emulated GPU gives ONNX Runtime's outputs on seeded inputs (rtol 1e-4, atol 1e-4 of the
  output's largest magnitude: float32 products of up to 4,608 terms through up to 50
  layers, summed in another order by another BLAS, drift by ~1e-5 of the output scale).

VGG-16 and AlexNet (61-138M parameters, 0.25-0.55 GB of weights) are counted, not run:
materializing and running them here takes a minute of the suite; bench/onnx_corpus_plans.py
plans and runs them.
"""
from __future__ import annotations

import numpy as np
import pytest

from onnx_corpus import load_manifest, materialize, seeded_inputs
from placer import cli
from placer.commands.inspect import net_totals
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.formats.onnx import load_onnx_net
from placer.runtime.executor import Executor
from placer.shapes import infer

ort = pytest.importorskip("onnxruntime")
from google.protobuf import text_format  # noqa: E402

MANIFEST = load_manifest()
MODELS = MANIFEST["models"]
PUBLISHED = [m for m in MODELS if m.get("published") and m["opset"] == 17]
TOO_BIG_TO_RUN = {"vgg16", "alexnet"}
RUN = [m for m in MODELS if m["name"] not in TOO_BIG_TO_RUN and m["exporter"] == "torchscript" and m["opset"] == 17]
CONVERT = [m for m in MODELS if m["name"] not in TOO_BIG_TO_RUN]
UNMAPPED = {"dlrm_small": "Loop"}  # nn.EmbeddingBag exports as a Loop over the bags


@pytest.fixture(scope="module")
def data_dir():
    from onnx_corpus import MANIFEST as path
    return path.parent


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda e: e["file"])
def test_flops_and_parameters_equal_torchvisions(entry, data_dir):
    model = materialize(data_dir / entry["file"])
    net = load_onnx_net(data_dir / entry["file"], data=model.SerializeToString())
    typed = infer(net, {})
    gmac = net_totals(typed)["gmac"]
    params = sum(t.size for t in net.params.values() if t.dtype == "float32")
    published = entry["published"]
    assert gmac == pytest.approx(published["gflops"], rel=0.02), (gmac, published)
    assert params == pytest.approx(published["num_params"], rel=0.02), (params, published)


@pytest.mark.parametrize("entry", CONVERT, ids=lambda e: e["file"])
def test_every_model_converts_or_names_what_it_cannot(entry, data_dir):
    model = materialize(data_dir / entry["file"])
    if entry["name"] in UNMAPPED:
        with pytest.raises(Exception, match=f"op type {UNMAPPED[entry['name']]} has no Caffe2 mapping"):
            load_onnx_net(data_dir / entry["file"], data=model.SerializeToString())
        return
    net = load_onnx_net(data_dir / entry["file"], data=model.SerializeToString())
    assert not [op.type for op in net.ops if op.type.startswith("Onnx")]
    assert list(net.input_shapes) == [i["name"] for i in entry["inputs"]]


@pytest.mark.slow
@pytest.mark.parametrize("entry", [e for e in RUN if e["name"] not in UNMAPPED], ids=lambda e: e["file"])
def test_the_placed_net_gives_onnx_runtimes_outputs(entry, data_dir, tmp_path, capsys):
    path = tmp_path / entry["file"]
    path.write_bytes(materialize(data_dir / entry["file"]).SerializeToString())
    feeds = seeded_inputs(entry["inputs"])
    sess = ort.InferenceSession(str(path))
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    placed, placed_init = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pb"
    assert cli.main(["plan", str(path), "--gpu-profile", "t4-pcie3", "-o", str(placed),
                     "--init-out", str(placed_init)]) == 0
    printed = capsys.readouterr().out
    assert "plan (" in printed
    p, i = pb.NetDef(), pb.NetDef()
    text_format.Parse(placed.read_text(), p)
    i.ParseFromString(placed_init.read_bytes())
    ex = Executor(net_from_netdef(p, i), emulate_gpu=True)
    ex.run_init()
    got = ex.run(feeds, warmup=0)
    for name, w in want.items():
        scale = float(np.max(np.abs(w)))
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{entry['file']} {name}")
