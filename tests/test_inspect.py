"""`placer inspect`: the table, the totals, JSON, missing shapes, and every corpus file."""
from __future__ import annotations

import json

import pytest

from conftest import corpus_files
from placer.cli import main

MLP = '''name: "mlp"
op { input: "data" input: "fc_w" input: "fc_b" output: "fc" type: "FC" }
op { input: "fc" output: "fc" type: "Relu" }
external_input: "data" external_input: "fc_w" external_input: "fc_b"
external_output: "fc"
'''
MLP_INIT = '''op { output: "fc_w" type: "GivenTensorFill" arg { name: "shape" ints: 10 ints: 99 } }
op { output: "fc_b" type: "ConstantFill" arg { name: "shape" ints: 10 } }
'''
# Predict nets of the corpus whose init nets are in the corpus too.
PAIRS = {
    "crayon_predict.pb": "crayon_init.pb",
    "glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt":
        "glow_fused_rowwise_quantized_sparse_lengths_sum_init_net.pbtxt",
    "glow_gather_const_fold.pbtxt": "glow_gather_const_fold_init.pbtxt",
    "yolov3_net.pbtxt": "yolov3_param_init_net.pbtxt",
}


@pytest.fixture
def mlp(tmp_path):
    (tmp_path / "mlp.pbtxt").write_text(MLP)
    (tmp_path / "init.pbtxt").write_text(MLP_INIT)
    return str(tmp_path / "mlp.pbtxt"), str(tmp_path / "init.pbtxt")


def test_help_states_the_missing_shape_policy(capsys):
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    out = capsys.readouterr().out
    assert "exits with code 2" in out and "--init-net" in out and "1 MAC" in out


def test_table_and_totals(capsys, mlp):
    net, init = mlp
    assert main(["inspect", net, "--init-net", init, "--input", "data=4,99"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["op", "type", "outputs", "GFLOP"] and "known" in header
    row0 = lines[2].split()
    assert row0[:4] == ["0", "fc", "FC", "4x10"]
    assert "ops: 2   unknown op types: none" in out
    # (10*99 + 10) float32 = 4000 B = 3.906 KiB; the activation 'fc' is 4x10 float32 = 160 B
    assert "parameters: 3.91 KiB   activations: 160 B" in out
    assert "1 MAC = one multiply-add = 2 FLOPs" in out


def test_json_has_the_same_figures(capsys, mlp):
    net, init = mlp
    assert main(["inspect", net, "--init-net", init, "--input", "data=4,99", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    fc, relu = doc["ops"]
    assert fc["type"] == "FC" and fc["outputs"] == "4x10" and fc["known"]
    assert fc["output_types"] == [{"shape": [4, 10], "dtype": "float32"}]
    assert fc["gmac"] == pytest.approx(4 * 99 * 10 / 1e9)
    assert fc["gflop"] >= 2 * fc["gmac"]
    assert fc["param_mb"] == pytest.approx((990 + 10) * 4 / 1e6)
    assert relu["param_mb"] == 0
    totals = doc["totals"]
    assert totals["ops"] == 2 and totals["unknown_op_types"] == {}
    assert totals["param_mb"] == pytest.approx(4e-3)
    assert totals["activation_mb"] == pytest.approx(4 * 10 * 4 / 1e6)  # 'fc', written in place
    assert doc["complete"] and doc["missing"] == []


def test_missing_init_net_prints_table_and_says_what_is_missing(capsys, mlp):
    net, _ = mlp
    assert main(["inspect", net, "--input", "data=4,99"]) == 2
    out, err = capsys.readouterr()
    assert "0      fc    FC       ?" in out
    assert "missing shapes:" in out
    assert "blob 'fc_w' has no shape: give --init-net INIT" in out
    assert "--input fc_b=" in out
    assert err.count("\n") == 1
    assert "2 blob(s) have no shape: 'fc_w', 'fc_b'; give --init-net INIT or --input" in err


def test_unknown_op_types_are_counted(capsys, tmp_path):
    p = tmp_path / "u.pbtxt"
    p.write_text('op { input: "x" output: "y" type: "Mystery" }\n'
                 'op { input: "y" output: "z" type: "Mystery" } external_input: "x"')
    assert main(["inspect", str(p), "--input", "x=2,2", "--json"]) == 0  # nothing needs y, z
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["unknown_op_types"] == {"Mystery": 2}
    assert [r["known"] for r in doc["ops"]] == [False, False]
    assert doc["ops"][0]["outputs"] == "?" and doc["ops"][0]["gflop"] is None


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_files("caffe2") + corpus_files("caffe"), ids=lambda p: p.name)
def test_every_corpus_file_inspects_cleanly(capsys, path):
    """A full table (exit 0) or the table and one line naming what is missing (exit 2);
    never a traceback."""
    argv = ["inspect", str(path)]
    if path.name in PAIRS:
        argv += ["--init-net", str(path.parent / PAIRS[path.name])]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 2)
    assert "Traceback" not in out + err
    if rc == 0:
        assert err == "" and "ops: " in out
    else:
        assert err.count("\n") == 1 and err.startswith("placer: error: ")


@pytest.mark.corpus
def test_glow_pair_is_complete(capsys, corpus):
    d = corpus / "caffe2"
    rc = main(["inspect", str(d / "glow_gather_const_fold.pbtxt"), "--init-net",
               str(d / "glow_gather_const_fold_init.pbtxt"), "--input", "data=1,2,3,4", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2  # Reshape's output shape comes from the values of 'gather_x'
    assert doc["missing"] == ["blob 'result' has no shape: op #2 Reshape 'result' makes it but its "
                              "shape depends on input values, not shapes: give --input result=d0,d1,..."]
    rc = main(["inspect", str(d / "glow_gather_const_fold.pbtxt"), "--init-net",
               str(d / "glow_gather_const_fold_init.pbtxt"), "--input", "data=1,2,3,4",
               "--input", "result=1,3,4,2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["missing"]
    assert [r["outputs"] for r in doc["ops"]] == ["4", "4", "1x3x4x2"]
    assert [r["type"] for r in doc["ops"]] == ["Shape", "Gather", "Reshape"]
    assert doc["totals"]["param_mb"] == pytest.approx(4 * 4 / 1e6)  # 'index': int32[4]


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["bvlc_alexnet_deploy.prototxt", "resnet50_ResNet-50-deploy.prototxt",
                                  "squeezenet_v1.0_deploy.prototxt", "mnist_lenet.prototxt"])
def test_caffe_deploy_files_get_complete_shapes(capsys, corpus, name):
    rc = main(["inspect", str(corpus / "caffe" / name), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc["missing"]
    assert doc["totals"]["gmac"] > 0


@pytest.mark.corpus
def test_caffe_train_file_needs_only_its_data_shape(capsys, corpus):
    path = str(corpus / "caffe" / "mnist_lenet_train_test.prototxt")
    assert main(["inspect", path]) == 2
    out, err = capsys.readouterr()
    assert "blob 'data' has no shape: give --input data=" in out
    assert main(["inspect", path, "--input", "data=100,1,28,28", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    conv1 = doc["ops"][0]
    assert conv1["type"] == "Conv" and conv1["outputs"] == "100x20x24x24"
    assert conv1["gmac"] == pytest.approx(100 * 20 * 24 * 24 * 25 / 1e9)  # LeNet conv1: 5x5, 1 -> 20


@pytest.mark.parametrize("spec, name, shape, dtype", [
    ("data=1,3,224,224", "data", (1, 3, 224, 224), "float32"),
    ("gpu_0/data = 2, 3 :float16", "gpu_0/data", (2, 3), "float16"),
    ("ids=4096:int64", "ids", (4096,), "int64"),
    ("step=", "step", (), "float32"),
])
def test_input_specs(spec, name, shape, dtype):
    from placer.commands.common import parse_input_spec
    got_name, t = parse_input_spec(spec)
    assert (got_name, t.shape, t.dtype) == (name, shape, dtype)
