"""Caffe prototxt loading: three generations, phases and states, inputs, weights, errors."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from placer.errors import NetParseError
from placer.formats import caffe_pb as pb
from placer.formats.caffe import blob_array, layer_included, load_caffe, read_caffemodel
from placer.formats.convert import load_caffe_net
from conftest import corpus_dir, corpus_files

PROTOTXTS = corpus_files("caffe", ".prototxt")
TRAIN_VAL = [p for p in PROTOTXTS if "train" in p.name]


def _types(net) -> Counter:
    return Counter(op.type for op in net.ops)


def _write(tmp_path, text: str, name: str = "net.prototxt"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the corpus

@pytest.mark.corpus
@pytest.mark.parametrize("path", PROTOTXTS, ids=lambda p: p.name)
@pytest.mark.parametrize("phase", ["test", "train"])
def test_every_corpus_prototxt_loads(path, phase):
    net = load_caffe_net(path, phase=phase)
    assert net.source_format == "caffe-prototxt"
    assert net.path == str(path)
    assert net.ops and net.external_outputs
    assert net.proto is not None and net.init_proto is not None
    # every op input is made by an earlier op, the init net, or fed from outside
    available = set(net.external_inputs)
    for op in net.ops:
        assert set(op.inputs) <= available, (op.label, set(op.inputs) - available)
        available.update(op.outputs)


@pytest.mark.corpus
@pytest.mark.parametrize("path", TRAIN_VAL, ids=lambda p: p.name)
def test_train_val_phases_keep_their_layers(path):
    test, train = load_caffe_net(path, phase="test"), load_caffe_net(path, phase="train")
    assert _types(test)["Accuracy"] >= 1
    assert _types(train)["Accuracy"] == 0
    assert _types(test)["SoftmaxWithLoss"] == _types(train)["SoftmaxWithLoss"] >= 1


@pytest.mark.corpus
def test_googlenet_phases_counts_and_batches(corpus):
    path = corpus / "caffe" / "bvlc_googlenet_train_val.prototxt"
    test, train = load_caffe_net(path, "test"), load_caffe_net(path, "train")
    assert _types(test)["Accuracy"] == 6  # top-1 and top-5 on each of the three heads
    # the TEST Data layer has batch 50, the TRAIN one 32; 3 channels from the 3 mean values
    assert test.input_shapes["data"].shape == (50, 3, 224, 224)
    assert train.input_shapes["data"].shape == (32, 3, 224, 224)
    assert test.input_shapes["label"].shape == (50,)
    assert test.input_shapes["label"].dtype == "int32"


@pytest.mark.corpus
def test_v1_files_give_the_same_ops_as_their_v2_twins(corpus):
    caffe = corpus / "caffe"
    for v1, v2 in (("v1_caffenet_deploy", "caffenet_deploy"),
                   ("v1_mnist_lenet_train_test", "mnist_lenet_train_test")):
        for phase in ("test", "train"):
            a = load_caffe_net(caffe / f"{v1}.prototxt", phase)
            b = load_caffe_net(caffe / f"{v2}.prototxt", phase)
            assert list(a.proto.op) == list(b.proto.op), (v1, phase)
            assert a.params == b.params
            assert a.input_shapes == b.input_shapes


@pytest.mark.corpus
def test_v1_generation_is_recognised(corpus):
    caffe = load_caffe(corpus / "caffe" / "v1_caffenet_deploy.prototxt")
    assert caffe.generation == "V1"
    assert [l.type for l in caffe.layers][:3] == ["Convolution", "ReLU", "Pooling"]
    assert caffe.inputs == {"data": (10, 3, 227, 227)}  # input + 4 x input_dim


@pytest.mark.corpus
@pytest.mark.parametrize("name, blob, shape", [
    ("resnet50_ResNet-50-deploy", "data", (1, 3, 224, 224)),       # input + input_dim
    ("squeezenet_v1.0_deploy", "data", (10, 3, 227, 227)),         # input + input_shape
    ("bvlc_alexnet_deploy", "data", (10, 3, 227, 227)),            # Input layer
    ("ssd300_vgg_voc0712_deploy", "data", (1, 3, 300, 300)),
    ("mnist_lenet", "data", (64, 1, 28, 28)),
])
def test_input_shapes_from_the_file(name, blob, shape):
    net = load_caffe_net(corpus_dir() / "caffe" / f"{name}.prototxt")
    assert net.input_shapes[blob].shape == shape
    assert net.input_shapes[blob].dtype == "float32"


@pytest.mark.corpus
def test_data_layer_without_channels_gives_a_hint(corpus):
    caffe = load_caffe(corpus / "caffe" / "bvlc_alexnet_train_val.prototxt", phase="test")
    assert caffe.inputs["data"] == (50, None, 227, 227)  # crop 227, mean from a file
    assert "--input data=50,C,227,227" in caffe.hints["data"]
    net = load_caffe_net(corpus / "caffe" / "bvlc_alexnet_train_val.prototxt")
    assert "data" not in net.input_shapes and "conv1_w" not in net.params
    assert "conv1_w" in net.external_inputs
    assert any("--input data=50,C,227,227" in n for n in net.notes)
    assert any("conv1_w" in n for n in net.notes)


@pytest.mark.corpus
def test_user_input_shape_completes_the_parameters(corpus):
    from placer.types import TensorType
    path = corpus / "caffe" / "bvlc_alexnet_train_val.prototxt"
    net = load_caffe_net(path, input_shapes={"data": TensorType((50, 3, 227, 227))})
    assert net.params["conv1_w"].shape == (96, 3, 11, 11)
    assert net.input_shapes["data"].shape == (50, 3, 227, 227)


# ---------------------------------------------------------------- V0 files

V0_NET = """
name: "TinyV0"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 32 input_dim: 32
layers { layer { name: "conv1" type: "conv" num_output: 8 kernelsize: 3 stride: 1
                 weight_filler { type: "gaussian" std: 0.01 } }
         bottom: "data" top: "conv1" }
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: MAX kernelsize: 3 stride: 2 }
         bottom: "conv1" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.0001 beta: 0.75 }
         bottom: "pool1" top: "norm1" }
layers { layer { name: "pad2" type: "padding" pad: 2 } bottom: "norm1" top: "pad2" }
layers { layer { name: "conv2" type: "conv" num_output: 16 kernelsize: 5 group: 2 biasterm: false }
         bottom: "pad2" top: "conv2" }
layers { layer { name: "fc" type: "innerproduct" num_output: 10 } bottom: "conv2" top: "fc" }
layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.4 } bottom: "fc" top: "fc" }
layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
"""

V2_TWIN = """
name: "TinyV0"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 32 input_dim: 32
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 stride: 1
                            weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1"
        lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "conv2" type: "Convolution" bottom: "norm1" top: "conv2"
        convolution_param { num_output: 16 kernel_size: 5 group: 2 pad: 2 bias_term: false } }
layer { name: "fc" type: "InnerProduct" bottom: "conv2" top: "fc" inner_product_param { num_output: 10 } }
layer { name: "drop" type: "Dropout" bottom: "fc" top: "fc" dropout_param { dropout_ratio: 0.4 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_v0_net_matches_its_v2_twin_with_padding_folded(tmp_path):
    v0 = load_caffe_net(_write(tmp_path, V0_NET, "v0.prototxt"))
    v2 = load_caffe_net(_write(tmp_path, V2_TWIN, "v2.prototxt"))
    assert load_caffe(tmp_path / "v0.prototxt").generation == "V0"
    assert list(v0.proto.op) == list(v2.proto.op)
    assert list(v0.init_proto.op) == list(v2.init_proto.op)
    conv2 = next(op for op in v0.ops if op.name == "conv2")
    assert conv2.inputs == ("norm1", "conv2_w")  # the padding layer is gone, no bias
    assert conv2.args.int("pad") == 2 and conv2.args.int("group") == 2
    # 32 -conv3-> 30 -pool3/2 (ceil)-> 15 -pad2 conv5-> 15; fc K = 16*15*15
    assert v0.params["conv2_w"].shape == (16, 4, 5, 5)
    assert v0.params["fc_w"].shape == (10, 16 * 15 * 15)


# ---------------------------------------------------------------- phases and states

STATE_NET = """
name: "states"
state { stage: "deploy" level: 2 }
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 4 } } }
layer { name: "a" type: "ReLU" bottom: "x" top: "a" include { stage: "deploy" } }
layer { name: "b" type: "ReLU" bottom: "x" top: "b" include { not_stage: "deploy" } }
layer { name: "c" type: "ReLU" bottom: "x" top: "c" exclude { min_level: 3 } }
layer { name: "d" type: "ReLU" bottom: "x" top: "d" include { min_level: 3 } }
layer { name: "e" type: "ReLU" bottom: "x" top: "e" include { phase: TRAIN } include { stage: "deploy" } }
layer { name: "f" type: "ReLU" bottom: "x" top: "f" exclude { phase: TEST max_level: 2 } }
"""


def test_net_state_rules_stage_level_and_phase(tmp_path):
    path = _write(tmp_path, STATE_NET)
    names = [l.name for l in load_caffe(path, phase="test").layers]
    assert names == ["in", "a", "c", "e"]
    names = [l.name for l in load_caffe(path, phase="train", stages=["other"], level=4).layers]
    assert names == ["in", "b", "d", "e", "f"]


def test_rule_without_fields_matches_every_state():
    layer = pb.LayerParameter(name="x")
    layer.include.add()
    assert layer_included(layer, pb.TEST, 0, [])
    layer = pb.LayerParameter(name="x")
    layer.exclude.add(phase=pb.TRAIN)
    assert layer_included(layer, pb.TEST, 0, []) and not layer_included(layer, pb.TRAIN, 0, [])


# ---------------------------------------------------------------- data layers

def test_dummy_and_memory_data_shapes(tmp_path):
    path = _write(tmp_path, """
name: "d"
layer { name: "dd" type: "DummyData" top: "a" top: "b"
        dummy_data_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } } }
layer { name: "old" type: "DummyData" top: "c"
        dummy_data_param { num: 2 channels: 1 height: 5 width: 6 } }
layer { name: "mem" type: "MemoryData" top: "m" top: "ml"
        memory_data_param { batch_size: 7 channels: 3 height: 10 width: 12 } }
layer { name: "img" type: "ImageData" top: "i" top: "il"
        image_data_param { batch_size: 5 new_height: 20 new_width: 30 is_color: false } }
layer { name: "s" type: "Silence" bottom: "a" bottom: "b" bottom: "c" bottom: "m" bottom: "ml"
        bottom: "i" bottom: "il" }
""")
    caffe = load_caffe(path)
    assert caffe.inputs == {"a": (4, 3, 8, 8), "b": (4,), "c": (2, 1, 5, 6), "m": (7, 3, 10, 12),
                            "ml": (7,), "i": (5, 1, 20, 30), "il": (5,)}
    net = load_caffe_net(path)
    assert net.ops == []  # Silence only marks blobs as consumed
    assert set(net.input_shapes) == {"a", "b", "c", "m", "ml", "i", "il"}
    dtypes = {name: t.dtype for name, t in net.input_shapes.items()}
    assert dtypes == {"a": "float32", "b": "float32", "c": "float32", "m": "float32",
                      "ml": "int32", "i": "float32", "il": "int32"}  # labels are integers


# ---------------------------------------------------------------- text errors and forks

def test_syntax_error_names_file_line_and_column(tmp_path):
    path = _write(tmp_path, 'name: "x"\nlayer {\n  name: "a"\n  type: \n}\n')
    with pytest.raises(NetParseError) as e:
        load_caffe_net(path)
    assert e.value.line == 5 and e.value.column == 1
    assert str(e.value).startswith(f"{path}:5:1:")


def test_missing_file_and_binary_file(tmp_path):
    with pytest.raises(NetParseError, match="cannot read"):
        load_caffe_net(tmp_path / "absent.prototxt")
    binary = tmp_path / "w.prototxt"
    binary.write_bytes(b"\xff\xfe\x00\x01binary")
    with pytest.raises(NetParseError, match="not text"):
        load_caffe_net(binary)


def test_fields_of_other_forks_are_skipped_with_a_note(tmp_path):
    path = _write(tmp_path, """
name: "fork"
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 4 kernel_size: 3 fork_only_field: 7 } }
layer { name: "i" type: "Interp" bottom: "c" top: "i" interp_param { zoom_factor: 2 } }
layer { name: "u" type: "Upsample" bottom: "i" top: "u" upsample_param { scale: 2 } }
""")
    caffe = load_caffe(path)
    assert "fork_only_field" in caffe.notes[0] and "line 6:" in caffe.notes[0]
    net = load_caffe_net(path)
    # a fork layer kept as an op of its own type; one whose name is also a Caffe2 op type
    # (with other semantics) gets the "Caffe" prefix, so the registry's kernel is not used
    assert [op.type for op in net.ops] == ["Conv", "Interp", "CaffeUpsample"]
    assert net.params["c_w"].shape == (4, 3, 3, 3)


def test_unknown_phase_is_an_error(tmp_path):
    path = _write(tmp_path, V2_TWIN)
    with pytest.raises(NetParseError, match="phase"):
        load_caffe(path, phase="deploy")


# ---------------------------------------------------------------- caffemodel files

def test_caffemodel_blobs_of_every_generation(tmp_path):
    model = pb.NetParameter(name="m")
    layer = model.layer.add(name="conv", type="Convolution")
    blob = layer.blobs.add()
    blob.shape.dim.extend([2, 1, 2, 2])
    blob.data.extend(np.arange(8, dtype=np.float32))
    legacy = model.layers.add(name="ip")
    legacy.blobs.add(num=1, channels=1, height=3, width=2).data.extend([1, 2, 3, 4, 5, 6])
    path = tmp_path / "m.caffemodel"
    path.write_bytes(model.SerializeToString())
    weights = read_caffemodel(path)
    assert weights["conv"][0].shape == (2, 1, 2, 2)
    np.testing.assert_array_equal(weights["conv"][0].ravel(), np.arange(8))
    assert weights["ip"][0].shape == (1, 1, 3, 2)
    assert weights["ip"][0][0, 0, 2, 1] == 6


def test_blob_with_double_data():
    blob = pb.BlobProto()
    blob.shape.dim.extend([3])
    blob.double_data.extend([0.5, 1.5, 2.5])
    arr = blob_array(blob)
    assert arr.dtype == np.float32 and arr.tolist() == [0.5, 1.5, 2.5]


def test_garbage_caffemodel_is_a_parse_error(tmp_path):
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(b"\x0a\xff\xff\xff\xff\xff\xff")
    with pytest.raises(NetParseError):
        read_caffemodel(path)


def test_proto_defaults_match_caffe():
    layer = pb.LayerParameter()
    assert layer.convolution_param.bias_term is True
    assert layer.convolution_param.group == 1
    assert layer.pooling_param.stride == 1 and layer.pooling_param.pool == 0
    lrn = layer.lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta, lrn.k) == (5, 1.0, 0.75, 1.0)
    assert abs(layer.batch_norm_param.eps - 1e-5) < 1e-12
    assert layer.inner_product_param.bias_term is True
    assert layer.scale_param.bias_term is False and layer.scale_param.axis == 1
    assert layer.eltwise_param.operation == 1  # SUM
    assert layer.prior_box_param.offset == 0.5 and layer.prior_box_param.flip is True
    assert layer.norm_param.across_spatial is True
    assert layer.dropout_param.dropout_ratio == 0.5
    assert layer.flatten_param.end_axis == -1 and layer.reshape_param.num_axes == -1


def test_unknown_bottom_names_the_layer_and_the_phase(tmp_path):
    path = _write(tmp_path, """
name: "b"
layer { name: "d" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "t" type: "ReLU" bottom: "x" top: "y" include { phase: TRAIN } }
layer { name: "u" type: "ReLU" bottom: "y" top: "z" }
""")
    assert [op.type for op in load_caffe_net(path, phase="train").ops] == ["Relu", "Relu"]
    with pytest.raises(NetParseError, match="layer 'u' \\(ReLU\\) reads bottom 'y'.*phase 'test'"):
        load_caffe_net(path, phase="test")


# Field numbers from BVLC caffe.proto (and the SSD fork for 200-206): the wire format.
V2_PARAM_NUMBERS = {
    "transform_param": 100, "loss_param": 101, "accuracy_param": 102, "concat_param": 104,
    "convolution_param": 106, "data_param": 107, "dropout_param": 108, "eltwise_param": 110,
    "inner_product_param": 117, "lrn_param": 118, "pooling_param": 121, "relu_param": 123,
    "softmax_param": 125, "python_param": 130, "reshape_param": 133, "flatten_param": 135,
    "batch_norm_param": 139, "scale_param": 142, "input_param": 143, "clip_param": 148,
    "permute_param": 202, "prior_box_param": 203, "detection_output_param": 204, "norm_param": 206,
}
V1_PARAM_NUMBERS = {"concat_param": 9, "convolution_param": 10, "data_param": 11, "pooling_param": 19,
                    "relu_param": 30, "transform_param": 36, "loss_param": 42, "layer": 1}


def test_field_numbers_match_caffe_proto():
    v2 = pb.LayerParameter.DESCRIPTOR.fields_by_name
    assert {n: v2[n].number for n in V2_PARAM_NUMBERS} == V2_PARAM_NUMBERS
    v1 = pb.V1LayerParameter.DESCRIPTOR.fields_by_name
    assert {n: v1[n].number for n in V1_PARAM_NUMBERS} == V1_PARAM_NUMBERS
    net = pb.NetParameter.DESCRIPTOR.fields_by_name
    assert (net["layer"].number, net["layers"].number, net["input_dim"].number) == (100, 2, 4)
    layer_type = pb.V1LayerParameter.LayerType
    assert (layer_type.Value("CONVOLUTION"), layer_type.Value("SOFTMAX_LOSS"),
            layer_type.Value("DECONVOLUTION")) == (4, 21, 39)
    assert pb.V1_TYPE_NAMES["SOFTMAX_LOSS"] == "SoftmaxWithLoss" and pb.V1_TYPE_NAMES["TANH"] == "TanH"


def test_binary_round_trip_of_a_v1_net(corpus):
    text = (corpus / "caffe" / "v1_caffenet_deploy.prototxt").read_text()
    net, _ = pb.parse_text(text)
    again = pb.NetParameter()
    again.ParseFromString(net.SerializeToString())
    assert again == net and again.layers[0].convolution_param.num_output == 96
