"""Caffe -> Caffe2 conversion: op mapping, parameter shapes, weights, fills, `placer convert`."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from placer.cli import main
from placer.formats import caffe_pb as pb
from placer.formats.convert import caffe_pool_out, convert_caffe, load_caffe_net
from placer.types import TensorType
from conftest import corpus_dir, corpus_files

DEPLOY = [p for p in corpus_files("caffe", ".prototxt") if "train" not in p.name]


def _net(name: str):
    return corpus_dir() / "caffe" / f"{name}.prototxt"


def _ops(result, type_=None):
    return [op for op in result.predict.op if type_ is None or op.type == type_]


def _args(op) -> dict:
    from placer.formats.caffe2 import decode_value
    return {a.name: decode_value(a) for a in op.arg}


def _fill(result, name):
    return next(op for op in result.init.op if op.output[0] == name)


def _write(tmp_path, text: str, name: str = "net.prototxt"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- corpus nets

@pytest.mark.corpus
def test_alexnet_parameter_shapes():
    r = convert_caffe(_net("bvlc_alexnet_deploy"))
    shapes = r.param_shapes
    assert shapes["conv1_w"] == (96, 3, 11, 11) and shapes["conv1_b"] == (96,)
    assert shapes["conv2_w"] == (256, 48, 5, 5)  # group 2
    assert shapes["conv3_w"] == (384, 256, 3, 3)
    assert shapes["fc6_w"] == (4096, 9216) and shapes["fc7_w"] == (4096, 4096)
    assert shapes["fc8_w"] == (1000, 4096) and shapes["fc8_b"] == (1000,)
    assert Counter(op.type for op in _ops(r)) == Counter(
        {"Relu": 7, "Conv": 5, "MaxPool": 3, "FC": 3, "LRN": 2, "Dropout": 2, "Softmax": 1})
    conv1 = _ops(r, "Conv")[0]
    assert list(conv1.input) == ["data", "conv1_w", "conv1_b"]
    assert _args(conv1) == {"kernel": 11, "stride": 4, "pad": 0, "order": "NCHW"}
    lrn = _ops(r, "LRN")[0]
    assert list(lrn.output) == ["norm1", "_norm1_scale"]
    assert _args(lrn) == {"size": 5, "alpha": pytest.approx(1e-4), "beta": 0.75, "bias": 1.0,
                          "order": "NCHW"}
    drop = _ops(r, "Dropout")[0]
    assert list(drop.output) == ["fc6", "_fc6_mask"] and _args(drop)["is_test"] == 1
    assert list(r.predict.external_output) == ["prob"]


@pytest.mark.corpus
def test_every_deploy_file_gets_every_parameter():
    corpus_dir()
    for path in DEPLOY:
        r = convert_caffe(path)
        assert r.missing_params == {}, path.name
        filled = {op.output[0] for op in r.init.op}
        params = set(r.param_shapes)
        assert filled == params, path.name
        assert params <= set(r.predict.external_input), path.name


@pytest.mark.corpus
def test_resnet50_batchnorm_and_scale_fold_into_spatialbn():
    r = convert_caffe(_net("resnet50_ResNet-50-deploy"))
    types = Counter(op.type for op in _ops(r))
    assert types["SpatialBN"] == 53 and types["Mul"] == 0 and types["Add"] == 0
    assert types["Sum"] == 16 and types["Conv"] == 53
    bn = _ops(r, "SpatialBN")[0]
    assert list(bn.input) == ["conv1", "scale_conv1_w", "scale_conv1_b", "bn_conv1_rm", "bn_conv1_riv"]
    assert list(bn.output) == ["conv1"]
    assert _args(bn)["is_test"] == 1 and _args(bn)["epsilon"] == pytest.approx(1e-5)
    for name in bn.input[1:]:
        assert r.param_shapes[name] == (64,)
    conv1 = _ops(r, "Conv")[0]
    assert list(conv1.input) == ["data", "conv1_w", "conv1_b"]  # conv1 has a bias
    branch = next(op for op in _ops(r, "Conv") if op.name == "res2a_branch1")
    assert list(branch.input) == ["pool1", "res2a_branch1_w"]  # bias_term: false
    assert r.param_shapes["fc1000_w"] == (1000, 2048)


@pytest.mark.corpus
def test_mobilenet_depthwise_convolution():
    r = convert_caffe(_net("mobilenet_deploy"))
    dw = next(op for op in _ops(r, "Conv") if op.name == "conv2_1/dw")
    assert _args(dw)["group"] == 32
    assert r.param_shapes["conv2_1/dw_w"] == (32, 1, 3, 3)


@pytest.mark.corpus
def test_googlenet_pooling_keeps_caffe_ceil_rounding():
    r = convert_caffe(_net("bvlc_googlenet_train_val"))
    pools = _ops(r, "MaxPool")
    assert pools and all(_args(p)["legacy_pad"] == 3 for p in pools)
    # GoogLeNet's published sizes: 224 -> 112 (conv 7/2) -> 56 -> 28 -> 14 -> 7 (ceil pools 3/2)
    assert r.shapes["conv1/7x7_s2"] == (50, 64, 112, 112)
    assert r.shapes["pool1/3x3_s2"] == (50, 64, 56, 56)
    assert r.shapes["pool2/3x3_s2"] == (50, 192, 28, 28)
    assert r.shapes["pool3/3x3_s2"] == (50, 480, 14, 14)
    assert r.shapes["pool4/3x3_s2"] == (50, 832, 7, 7)
    concat = _ops(r, "Concat")[0]
    assert list(concat.output) == ["inception_3a/output", "_inception_3a/output_dims"]
    assert _args(concat) == {"axis": 1}
    assert r.shapes["inception_3a/output"] == (50, 256, 28, 28)
    loss = next(op for op in _ops(r, "SoftmaxWithLoss") if op.name == "loss1/loss")
    assert _args(loss)["scale"] == pytest.approx(0.3)  # loss_weight of the auxiliary head
    top5 = next(op for op in _ops(r, "Accuracy") if op.name == "loss1/top-5")
    assert _args(top5)["top_k"] == 5


def test_caffe_ceil_rule():
    assert caffe_pool_out(112, 3, 2, 0) == 56  # floor would give 55
    assert caffe_pool_out(112, 3, 2, 0, ceil=False) == 55
    assert caffe_pool_out(13, 3, 2, 0) == 6
    assert caffe_pool_out(4, 2, 2, 1) == 3  # last window would start in the padding: clipped
    assert caffe_pool_out(5, 2, 2, 1) == 3


@pytest.mark.corpus
def test_ssd_fork_layers_become_ops_of_their_caffe_type():
    from placer.ops import registry
    r = convert_caffe(_net("ssd300_vgg_voc0712_deploy"))
    types = Counter(op.type for op in _ops(r))
    assert types["Permute"] == 12 and types["PriorBox"] == 6
    assert types["Normalize"] == 1 and types["DetectionOutput"] == 1
    for t in ("Permute", "PriorBox", "Normalize", "DetectionOutput"):
        assert registry.get(t) is not None and f"Caffe{t}" not in types
    assert r.unknown_layers == []
    perm = _ops(r, "Permute")[0]
    assert _args(perm) == {"order": [0, 2, 3, 1]}
    norm = _ops(r, "Normalize")[0]
    assert list(norm.input) == ["conv4_3", "conv4_3_norm_scale"]
    fill = _fill(r, "conv4_3_norm_scale")
    assert fill.type == "ConstantFill" and _args(fill)["value"] == 20.0
    assert _args(fill)["shape"] == [512]
    det = _ops(r, "DetectionOutput")[0]
    assert _args(det)["nms_param.top_k"] == 400 and _args(det)["code_type"] == "CENTER_SIZE"
    assert r.shapes["mbox_priorbox"] == (1, 2, 8732 * 4)  # SSD300's 8732 default boxes
    assert r.shapes["mbox_conf_reshape"] == (1, 8732, 21)
    reshape = _ops(r, "Reshape")[0]
    assert _args(reshape)["shape"] == [0, -1, 21]


def test_normalize_scale_parameter(tmp_path):
    from placer.shapes import infer
    path = _write(tmp_path, """
input: "x"
input_shape { dim: 1 dim: 8 dim: 3 dim: 3 }
layer { name: "shared" type: "Normalize" bottom: "x" top: "a" }
layer { name: "per_channel" type: "Normalize" bottom: "x" top: "b"
        norm_param { channel_shared: false scale_filler { type: "constant" value: 20 } } }
""")
    r = convert_caffe(path)
    shared, per_channel = _ops(r, "Normalize")
    assert list(shared.input) == ["x", "shared_scale"] and list(per_channel.input) == ["x", "per_channel_scale"]
    assert r.param_shapes == {"shared_scale": (1,), "per_channel_scale": (8,)}
    assert _args(_fill(r, "shared_scale"))["value"] == 1.0            # the fork's default filler
    assert _args(_fill(r, "per_channel_scale"))["value"] == 20.0
    assert _args(per_channel) == {"channel_shared": 0, "scale_filler.type": "constant", "scale_filler.value": 20.0}
    typed = infer(load_caffe_net(path))
    assert typed.unknown_ops == [] and typed.blobs["b"].shape == (1, 8, 3, 3)


@pytest.mark.corpus
def test_random_fills_follow_fillers_and_are_seeded():
    a = convert_caffe(_net("bvlc_alexnet_train_val"), input_shapes={"data": TensorType((50, 3, 227, 227))})
    b = convert_caffe(_net("bvlc_alexnet_train_val"), input_shapes={"data": TensorType((50, 3, 227, 227))})
    assert a.init == b.init
    w = _fill(a, "conv1_w")
    assert w.type == "GaussianFill" and _args(w)["std"] == pytest.approx(0.01)
    assert _args(w)["shape"] == [96, 3, 11, 11] and "seed" in _args(w)
    assert _fill(a, "conv2_b").type == "ConstantFill" and _args(_fill(a, "conv2_b"))["value"] == pytest.approx(0.1)
    assert _args(_fill(a, "conv1_w"))["seed"] != _args(_fill(a, "conv2_w"))["seed"]
    deploy = convert_caffe(_net("bvlc_alexnet_deploy"))  # no fillers in a deploy file
    assert _fill(deploy, "conv1_w").type == "XavierFill"
    assert _fill(deploy, "conv1_b").type == "ConstantFill"


@pytest.mark.corpus
def test_train_phase_ops():
    r = convert_caffe(_net("cifar10_full_sigmoid_train_test_bn"), phase="train",
                      input_shapes={"data": TensorType((100, 3, 32, 32))})
    bn = _ops(r, "SpatialBN")[0]
    assert _args(bn)["is_test"] == 0 and len(bn.output) == 5
    assert list(bn.output[1:3]) == list(bn.input[3:5])  # running stats updated in place
    assert r.param_shapes["ip1_w"] == (10, 64 * 4 * 4)
    drop = convert_caffe(_net("bvlc_alexnet_deploy"), phase="train")
    assert _args(_ops(drop, "Dropout")[0])["is_test"] == 0


@pytest.mark.corpus
def test_converted_shapes_agree_with_the_registry():
    from placer.shapes import infer
    for name in ("bvlc_alexnet_deploy", "bvlc_googlenet_train_val", "resnet50_ResNet-50-deploy",
                 "squeezenet_v1.0_deploy", "mobilenet_deploy", "ssd300_vgg_voc0712_deploy"):
        r = convert_caffe(_net(name))
        typed = infer(load_caffe_net(_net(name)))
        compared = 0
        for blob, shape in r.shapes.items():
            t = typed.blobs.get(blob)
            if shape is not None and None not in shape and (t is not None or "ssd" not in name):
                assert t is not None and t.shape == shape, (name, blob, t, shape)
                compared += 1
        assert compared >= 15, (name, compared)


@pytest.mark.corpus
def test_alexnet_macs_match_the_published_figure():
    from placer.shapes import infer
    typed = infer(load_caffe_net(_net("bvlc_alexnet_deploy")))  # batch 10
    macs = sum(f.macs for f in typed.features) / 10
    assert macs == pytest.approx(0.72e9, rel=0.05)


# ---------------------------------------------------------------- layer mapping, in small nets

SMALL = """
name: "small"
input: "x"
input_shape { dim: 2 dim: 4 dim: 6 dim: 6 }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
        convolution_param { num_output: 3 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "lone_bn" type: "BatchNorm" bottom: "c" top: "d" batch_norm_param { eps: 0.001 } }
layer { name: "lone_sc" type: "Scale" bottom: "d" top: "e" scale_param { bias_term: true } }
layer { name: "leaky" type: "ReLU" bottom: "e" top: "e" relu_param { negative_slope: 0.1 } }
layer { name: "pr" type: "PReLU" bottom: "d" top: "p" }  # keeps lone_bn from folding
layer { name: "sum" type: "Eltwise" bottom: "e" bottom: "p" top: "s"
        eltwise_param { operation: SUM coeff: 1 coeff: -1 } }
layer { name: "prod" type: "Eltwise" bottom: "e" bottom: "p" bottom: "s" top: "m"
        eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "e" bottom: "m" top: "mx" eltwise_param { operation: MAX } }
layer { name: "sl" type: "Slice" bottom: "mx" top: "s1" top: "s2" slice_param { axis: 1 slice_point: 1 } }
layer { name: "cat" type: "Concat" bottom: "s2" bottom: "s1" top: "cat" }
layer { name: "flat" type: "Flatten" bottom: "cat" top: "flat" }
layer { name: "flat2" type: "Flatten" bottom: "cat" top: "flat2" flatten_param { axis: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip"
        inner_product_param { num_output: 5 transpose: true bias_term: false } }
layer { name: "pool" type: "Pooling" bottom: "cat" top: "gp" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fpool" type: "Pooling" bottom: "cat" top: "fp"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR } }
layer { name: "pw" type: "Power" bottom: "ip" top: "pw" power_param { power: 2 } }
layer { name: "sm" type: "Softmax" bottom: "pw" top: "prob" }
"""


def test_small_net_layer_mapping(tmp_path):
    r = convert_caffe(_write(tmp_path, SMALL))
    by_name = {}
    for op in _ops(r):
        by_name.setdefault(op.name, []).append(op)
    conv = by_name["conv"][0]
    assert _args(conv) == {"kernel_h": 3, "kernel_w": 1, "stride": 1, "pad_t": 1, "pad_b": 1,
                           "pad_l": 0, "pad_r": 0, "order": "NCHW"}
    assert r.param_shapes["conv_w"] == (3, 4, 3, 1)
    assert [op.type for op in by_name["bn"]] == ["SpatialBN"] and "sc" not in by_name
    assert [op.type for op in by_name["lone_bn"]] == ["SpatialBN"]
    assert _args(by_name["lone_bn"][0])["epsilon"] == pytest.approx(0.001)
    assert _args(_fill(r, "lone_bn_s")) == {"shape": [3], "value": 1.0, "seed": _args(_fill(r, "lone_bn_s"))["seed"]}
    mul, add = by_name["lone_sc"]
    assert (mul.type, add.type) == ("Mul", "Add")
    assert list(mul.input) == ["d", "lone_sc_w"] and _args(mul) == {"broadcast": 1, "axis": 1}
    assert list(add.input) == ["e", "lone_sc_b"] and list(add.output) == ["e"]
    assert by_name["leaky"][0].type == "LeakyRelu" and _args(by_name["leaky"][0])["alpha"] == pytest.approx(0.1)
    assert by_name["pr"][0].type == "PRelu" and r.param_shapes["pr_slope"] == (3,)
    assert _args(_fill(r, "pr_slope"))["value"] == 0.25
    scale, total = by_name["sum"]
    assert scale.type == "Scale" and _args(scale)["scale"] == -1.0 and list(scale.input) == ["p"]
    assert total.type == "Sum" and list(total.input) == ["e", scale.output[0]]
    assert [op.type for op in by_name["prod"]] == ["Mul", "Mul"]
    assert by_name["max"][0].type == "Max"
    split = by_name["sl"][0]
    assert split.type == "Split" and _args(split) == {"axis": 1, "split": [1, 2]}
    assert r.shapes["s1"] == (2, 1, 6, 6) and r.shapes["s2"] == (2, 2, 6, 6)
    assert r.shapes["cat"] == (2, 3, 6, 6)
    assert by_name["flat"][0].type == "Flatten" and r.shapes["flat"] == (2, 108)
    flat2 = by_name["flat2"][0]
    assert flat2.type == "Reshape" and _args(flat2)["shape"] == [0, 0, -1]
    assert r.shapes["flat2"] == (2, 3, 36)
    ip = by_name["ip"][0]
    assert ip.type == "FC" and list(ip.input) == ["cat", "ip_w", "ip_b"]
    assert r.param_shapes["ip_w"] == (5, 108) and _args(_fill(r, "ip_b"))["value"] == 0.0
    gp = by_name["pool"][0]
    assert gp.type == "AveragePool" and _args(gp) == {"global_pooling": 1, "order": "NCHW"}
    assert r.shapes["gp"] == (2, 3, 1, 1)
    fp = by_name["fpool"][0]
    assert "legacy_pad" not in _args(fp) and r.shapes["fp"] == (2, 3, 3, 3)
    assert by_name["pw"][0].type == "Power" and ("pw", "Power") in r.unknown_layers
    assert list(r.predict.external_output) == ["flat", "flat2", "gp", "fp", "prob"]


def test_caffemodel_values_land_in_given_tensor_fills(tmp_path):
    proto = _write(tmp_path, """
name: "w"
input: "x"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3
layer { name: "conv" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "y" inner_product_param { num_output: 3 } }
layer { name: "ipt" type: "InnerProduct" bottom: "c" top: "z"
        inner_product_param { num_output: 3 transpose: true } }
""")
    rng = np.random.default_rng(0)
    conv_w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    ip_w = rng.standard_normal((3, 2)).astype(np.float32)
    model = pb.NetParameter(name="w")

    def add(layer_name, *arrays, legacy=False):
        layer = model.layer.add(name=layer_name)
        for a in arrays:
            blob = layer.blobs.add()
            if legacy:  # old 4-D blob: (num, channels, height, width) padded with 1s
                dims = (1,) * (4 - a.ndim) + a.shape
                blob.num, blob.channels, blob.height, blob.width = dims
            else:
                blob.shape.dim.extend(a.shape)
            blob.data.extend(a.ravel().tolist())

    add("conv", conv_w, np.array([0.5, -0.5], np.float32))
    add("bn", np.array([2.0, 4.0], np.float32), np.array([6.0, 8.0], np.float32), np.array([2.0], np.float32))
    add("sc", np.array([1.5, 2.5], np.float32), np.array([0.1, 0.2], np.float32))
    add("ip", ip_w, np.array([1, 2, 3], np.float32), legacy=True)
    add("ipt", ip_w.T.copy(), np.array([4, 5, 6], np.float32))
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(model.SerializeToString())

    r = convert_caffe(proto, weights=weights)
    fills = {op.output[0]: op for op in r.init.op}
    assert all(op.type == "GivenTensorFill" for op in fills.values())

    def values(name):
        a = _args(fills[name])
        return np.array(a["values"], np.float32).reshape(a["shape"])

    np.testing.assert_array_equal(values("conv_w"), conv_w)
    np.testing.assert_array_equal(values("conv_b"), [0.5, -0.5])
    np.testing.assert_allclose(values("bn_rm"), [1.0, 2.0])  # divided by the factor 2
    np.testing.assert_allclose(values("bn_riv"), [3.0, 4.0])
    np.testing.assert_allclose(values("sc_w"), [1.5, 2.5])
    np.testing.assert_allclose(values("sc_b"), [0.1, 0.2])
    np.testing.assert_array_equal(values("ip_w"), ip_w)  # legacy (1, 1, 3, 2) blob
    np.testing.assert_array_equal(values("ipt_w"), ip_w)  # stored transposed in Caffe
    np.testing.assert_array_equal(values("ip_b"), [1, 2, 3])
    assert r.weights_used == 10

    net = load_caffe_net(proto, weights=str(weights))
    assert net.params["conv_w"] == TensorType((2, 2, 3, 3))
    assert net.params["ipt_w"].shape == (3, 2)


def test_weights_that_do_not_fit_are_an_error(tmp_path):
    from placer.errors import NetParseError
    proto = _write(tmp_path, """
name: "w"
input: "x"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3
layer { name: "conv" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 3 } }
""")
    model = pb.NetParameter()
    blob = model.layer.add(name="conv").blobs.add()
    blob.shape.dim.extend([2, 3, 3, 3])
    blob.data.extend([0.0] * 54)
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(model.SerializeToString())
    with pytest.raises(NetParseError, match="conv_w.*2x3x3x3.*2x2x3x3") as e:
        convert_caffe(proto, weights=weights)
    assert e.value.path == str(weights)


def test_parameters_missing_from_the_weights_are_named(tmp_path):
    proto = _write(tmp_path, V_TWO_CONVS)
    model = pb.NetParameter()
    layer = model.layer.add(name="a")
    for shape in ((2, 2, 1, 1), (2,)):
        blob = layer.blobs.add()
        blob.shape.dim.extend(shape)
        blob.data.extend([1.0] * int(np.prod(shape)))
    weights = tmp_path / "w.caffemodel"
    weights.write_bytes(model.SerializeToString())
    r = convert_caffe(proto, weights=weights)
    assert _fill(r, "a_w").type == "GivenTensorFill" and _fill(r, "b_w").type == "XavierFill"
    assert any(f"2 parameter(s) have no blob in {weights}" in n and "b_w, b_b" in n for n in r.notes)
    assert r.weights_used == 2


V_TWO_CONVS = """
name: "two"
input: "x"
input_dim: 1 input_dim: 2 input_dim: 4 input_dim: 4
layer { name: "a" type: "Convolution" bottom: "x" top: "a" convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "b" type: "Convolution" bottom: "a" top: "b" convolution_param { num_output: 2 kernel_size: 1 } }
"""


def test_shared_parameters_through_paramspec_names(tmp_path):
    r = convert_caffe(_write(tmp_path, """
name: "siamese"
input: "a" input_shape { dim: 1 dim: 8 }
input: "b" input_shape { dim: 1 dim: 8 }
layer { name: "ip_a" type: "InnerProduct" bottom: "a" top: "ya" param { name: "shared_w" }
        param { name: "shared_b" } inner_product_param { num_output: 4 } }
layer { name: "ip_b" type: "InnerProduct" bottom: "b" top: "yb" param { name: "shared_w" }
        param { name: "shared_b" } inner_product_param { num_output: 4 } }
"""))
    assert [list(op.input) for op in _ops(r)] == [["a", "shared_w", "shared_b"], ["b", "shared_w", "shared_b"]]
    assert [op.output[0] for op in r.init.op] == ["shared_w", "shared_b"]


# ---------------------------------------------------------------- the command

@pytest.mark.corpus
def test_convert_command_writes_both_nets(tmp_path, capsys):
    from placer.formats.caffe2 import load_netdef
    out = tmp_path / "out"
    rc = main(["convert", str(_net("ssd300_vgg_voc0712_deploy")), "-o", str(out), "--binary"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "101 ops" in text and "Permute 12" in text and "PriorBox 6" in text
    for name in ("predict_net.pbtxt", "init_net.pbtxt", "predict_net.pb", "init_net.pb"):
        assert (out / name).is_file() and f"wrote {out / name}" in text
    r = convert_caffe(_net("ssd300_vgg_voc0712_deploy"))
    assert load_netdef(out / "predict_net.pbtxt") == r.predict == load_netdef(out / "predict_net.pb")
    assert load_netdef(out / "init_net.pbtxt") == r.init


def test_convert_command_refuses_to_overwrite_its_input(tmp_path, capsys):
    proto = _write(tmp_path, SMALL, "predict_net.pbtxt")
    assert main(["convert", str(proto), "-o", str(tmp_path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert proto.read_text() == SMALL


def test_convert_command_with_input_shape(tmp_path, capsys):
    proto = _write(tmp_path, """
name: "data"
layer { name: "d" type: "Data" top: "data" top: "label" data_param { batch_size: 4 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
""")
    assert main(["convert", str(proto), "-o", str(tmp_path / "a")]) == 0
    assert "--input data=4,C,H,W" in capsys.readouterr().out
    assert main(["convert", str(proto), "-o", str(tmp_path / "b"), "--input", "data=4,3,5,5"]) == 0
    from placer.formats.caffe2 import load_netdef, params_from_init
    params = params_from_init(load_netdef(tmp_path / "b" / "init_net.pbtxt"))
    assert params["ip_w"].shape == (2, 75)


# ---------------------------------------------------------------- numbers, against Caffe's semantics

E2E = """
name: "e2e"
input: "x"
input_dim: 2 input_dim: 3 input_dim: 14 input_dim: 14
layer { name: "conv" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" }
layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "c" }
layer { name: "avg" type: "Pooling" bottom: "c" top: "a" pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "pool" type: "Pooling" bottom: "a" top: "p" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm" type: "LRN" bottom: "p" top: "n" lrn_param { local_size: 3 alpha: 0.01 beta: 0.75 } }
layer { name: "conv2" type: "Convolution" bottom: "n" top: "c2" convolution_param { num_output: 4 kernel_size: 1 group: 2 } }
layer { name: "sum" type: "Eltwise" bottom: "n" bottom: "c2" top: "s" eltwise_param { coeff: 0.5 coeff: 2 } }
layer { name: "sl" type: "Slice" bottom: "s" top: "s1" top: "s2" slice_param { slice_point: 1 } }
layer { name: "cat" type: "Concat" bottom: "s2" bottom: "s1" top: "cat" }
layer { name: "ip" type: "InnerProduct" bottom: "cat" top: "ip" inner_product_param { num_output: 5 } }
"""


def test_converted_net_computes_what_caffe_computes(tmp_path):
    """Run the converted net (weights from a caffemodel) and compare with a torch
    transcription of Caffe's layers: BN factor, folded Scale, ceil pooling, padded average,
    grouped conv, Eltwise coefficients, Slice/Concat order, InnerProduct layout."""
    from conftest import require_torch
    torch = require_torch()
    import torch.nn.functional as F
    from placer.runtime.executor import Executor

    rng = np.random.default_rng(1)
    blobs = {
        "conv": [rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)],
        "bn": [rng.standard_normal(4) * 3, rng.random(4) * 3 + 1, np.array([3.0])],
        "sc": [rng.standard_normal(4), rng.standard_normal(4)],
        "conv2": [rng.standard_normal((4, 2, 1, 1)), rng.standard_normal(4)],
        "ip": [rng.standard_normal((5, 4 * 7 * 7)), rng.standard_normal(5)],
    }
    blobs = {k: [np.asarray(a, np.float32) for a in v] for k, v in blobs.items()}
    model = pb.NetParameter()
    for name, arrays in blobs.items():
        layer = model.layer.add(name=name)
        for a in arrays:
            blob = layer.blobs.add()
            blob.shape.dim.extend(a.shape)
            blob.data.extend(a.ravel().tolist())
    (tmp_path / "w.caffemodel").write_bytes(model.SerializeToString())
    net = load_caffe_net(_write(tmp_path, E2E), weights=str(tmp_path / "w.caffemodel"))
    executor = Executor(net)
    executor.run_init()
    x = rng.standard_normal((2, 3, 14, 14)).astype(np.float32)
    got = executor.run({"x": x})["ip"]

    t = torch.from_numpy
    per_channel = lambda a: t(a)[None, :, None, None]  # noqa: E731
    y = F.conv2d(t(x), t(blobs["conv"][0]), t(blobs["conv"][1]), padding=1)
    mean, var, factor = blobs["bn"][0], blobs["bn"][1], blobs["bn"][2][0]
    y = (y - per_channel(mean / factor)) / torch.sqrt(per_channel(var / factor) + 1e-5)
    y = F.relu(y * per_channel(blobs["sc"][0]) + per_channel(blobs["sc"][1]))
    y = F.avg_pool2d(y, 3, 1, padding=1, count_include_pad=True)
    y = F.max_pool2d(y, 3, 2, ceil_mode=True)  # 14 -> 7 in Caffe's ceil mode (floor: 6)
    n = F.local_response_norm(y, 3, alpha=0.01, beta=0.75, k=1.0)
    s = 0.5 * n + 2 * F.conv2d(n, t(blobs["conv2"][0]), t(blobs["conv2"][1]), groups=2)
    cat = torch.cat([s[:, 1:], s[:, :1]], 1)
    want = (cat.reshape(2, -1) @ t(blobs["ip"][0]).T + t(blobs["ip"][1])).numpy()
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_reshape_axis_and_num_axes_follow_caffe(tmp_path):
    from placer.shapes import infer
    path = _write(tmp_path, """
name: "r"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 8 } } }
layer { name: "a" type: "Reshape" bottom: "x" top: "a" reshape_param { shape { dim: 2 dim: 4 } axis: 1 } }
layer { name: "b" type: "Reshape" bottom: "x" top: "b" reshape_param { shape { dim: 1 } axis: 1 num_axes: 0 } }
layer { name: "c" type: "Reshape" bottom: "x" top: "c" reshape_param { shape { dim: 0 dim: -1 dim: 2 } } }
layer { name: "d" type: "Reshape" bottom: "x" top: "d" reshape_param { shape { dim: 1 dim: 2 } num_axes: 1 } }
""")
    r = convert_caffe(path)
    # the examples of caffe.proto's ReshapeParameter comment, on a 2 x 8 input
    assert r.shapes["a"] == (2, 2, 4) and r.shapes["b"] == (2, 1, 8)
    assert r.shapes["c"] == (2, 4, 2) and r.shapes["d"] == (1, 2, 8)
    assert [_args(op)["shape"] for op in _ops(r)] == [[0, 2, 4], [0, 1, 8], [0, -1, 2], [1, 2, 8]]
    typed = infer(load_caffe_net(path))
    for blob in "abcd":
        assert typed.blobs[blob].shape == r.shapes[blob]


def test_big_init_nets_are_written_binary_only(tmp_path, capsys, monkeypatch):
    import placer.commands.convert as command
    from placer.formats.caffe2 import load_netdef
    proto = _write(tmp_path, E2E)
    model = pb.NetParameter()
    blob = model.layer.add(name="ip").blobs.add()
    blob.shape.dim.extend([5, 196])
    blob.data.extend(np.linspace(-1, 1, 980, dtype=np.float32).tolist())
    (tmp_path / "w.caffemodel").write_bytes(model.SerializeToString())
    monkeypatch.setattr(command, "TEXT_INIT_MAX_VALUES", 500)
    out = tmp_path / "out"
    assert main(["convert", str(proto), "--weights", str(tmp_path / "w.caffemodel"), "-o", str(out)]) == 0
    assert "980 weight values: written binary only" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["init_net.pb", "manifest.json", "predict_net.pbtxt",
                                                     "value_info.json"]
    fill = next(op for op in load_netdef(out / "init_net.pb").op if op.output[0] == "ip_w")
    np.testing.assert_allclose(_args(fill)["values"], np.linspace(-1, 1, 980), atol=1e-6)


def test_deconvolution_dilation_axis_and_tile(tmp_path):
    from placer.shapes import infer
    path = _write(tmp_path, """
name: "dc"
input: "x" input_shape { dim: 2 dim: 4 dim: 6 dim: 6 }
layer { name: "up" type: "Deconvolution" bottom: "x" top: "u"
        convolution_param { num_output: 6 kernel_size: 4 stride: 2 pad: 1 group: 2 } }
layer { name: "dil" type: "Convolution" bottom: "u" top: "d"
        convolution_param { num_output: 3 kernel_size: 3 dilation: 2 pad: 2 } }
layer { name: "ipax" type: "InnerProduct" bottom: "d" top: "ip" inner_product_param { num_output: 7 axis: 2 } }
layer { name: "tile" type: "Tile" bottom: "ip" top: "t" tile_param { axis: 1 tiles: 2 } }
""")
    r = convert_caffe(path)
    up, dil, ipax, tile = _ops(r)
    assert (up.type, _args(up)["group"]) == ("ConvTranspose", 2)
    assert r.param_shapes["up_w"] == (4, 3, 4, 4)  # (C_in, M / group, kh, kw)
    assert r.shapes["u"] == (2, 6, 12, 12)  # stride * (6 - 1) + 4 - 2 * pad
    assert _args(dil)["dilation"] == 2 and r.shapes["d"] == (2, 3, 12, 12)
    assert _args(ipax)["axis"] == 2 and r.param_shapes["ipax_w"] == (7, 144)
    assert r.shapes["ip"] == (2, 3, 7)
    assert _args(tile) == {"tiles": 2, "axis": 1} and r.shapes["t"] == (2, 6, 7)
    typed = infer(load_caffe_net(path))
    for blob in ("u", "d", "ip", "t"):
        assert typed.blobs[blob].shape == r.shapes[blob]


def test_unknown_layers_keep_their_parameters_as_arguments(tmp_path):
    proto = _write(tmp_path, """
name: "u"
input: "x"
input_shape { dim: 1 dim: 3 dim: 4 dim: 4 }
layer { name: "py" type: "Python" bottom: "x" top: "y"
        python_param { module: "my.layers" layer: "Crop" param_str: "{'k': 2}" } }
layer { name: "pw" type: "Power" bottom: "y" top: "z" power_param { power: 2 shift: 1 } }
layer { name: "th" type: "Threshold" bottom: "x" top: "t" threshold_param { threshold: 0.5 } }
""")
    model = pb.NetParameter()
    blob = model.layer.add(name="py").blobs.add()
    blob.shape.dim.extend([3])
    blob.data.extend([1.0, 2.0, 3.0])
    (tmp_path / "w.caffemodel").write_bytes(model.SerializeToString())
    r = convert_caffe(proto, weights=tmp_path / "w.caffemodel")
    py, pw, th = _ops(r)
    assert py.type == "Python" and list(py.input) == ["x", "py_blob0"]
    assert _args(py) == {"module": "my.layers", "layer": "Crop", "param_str": "{'k': 2}"}
    assert _args(_fill(r, "py_blob0"))["values"] == [1.0, 2.0, 3.0]
    assert _args(pw) == {"power": 2.0, "shift": 1.0}
    assert r.shapes["z"] is None  # the Python layer's output is unknown, and so what follows
    assert r.shapes["t"] == (1, 3, 4, 4)  # Threshold keeps its input's shape
    assert [t for _, t in r.unknown_layers] == ["Python", "Power", "Threshold"]


def test_layers_whose_variant_has_no_caffe2_op_stay_unknown_with_a_note(tmp_path):
    r = convert_caffe(_write(tmp_path, """
name: "v"
input: "x"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer { name: "lrn" type: "LRN" bottom: "x" top: "l" lrn_param { norm_region: WITHIN_CHANNEL } }
layer { name: "sp" type: "Pooling" bottom: "l" top: "p" pooling_param { pool: STOCHASTIC kernel_size: 2 stride: 2 } }
layer { name: "e2" type: "Exp" bottom: "x" top: "e2" exp_param { base: 2 } }
layer { name: "e" type: "Exp" bottom: "x" top: "e" }
"""))
    # LRN and Exp are Caffe2 ops with other semantics: the kept layers must not run as them
    assert [op.type for op in _ops(r)] == ["CaffeLRN", "Pooling", "CaffeExp", "Exp"]
    assert [name for name, _ in r.unknown_layers] == ["lrn", "sp", "e2"]
    assert _args(_ops(r)[0]) == {"norm_region": "WITHIN_CHANNEL"}
    notes = "\n".join(r.notes)
    assert "LRN WITHIN_CHANNEL has no Caffe2 op" in notes and "stochastic pooling" in notes
    assert r.shapes["l"] == (1, 3, 8, 8) and r.shapes["e"] == (1, 3, 8, 8)


def test_softmax_over_channels_of_an_image_matches_caffe(tmp_path):
    from placer.runtime.executor import Executor
    path = _write(tmp_path, """
name: "seg"
input: "x"
input_shape { dim: 2 dim: 3 dim: 4 dim: 5 }
layer { name: "prob" type: "Softmax" bottom: "x" top: "prob" }
layer { name: "flat" type: "Flatten" bottom: "x" top: "f" }
layer { name: "fprob" type: "Softmax" bottom: "f" top: "fprob" }
""")
    r = convert_caffe(path)
    assert [op.type for op in _ops(r)] == ["Transpose", "Softmax", "Transpose", "Flatten", "Softmax"]
    assert _args(_ops(r)[0])["axes"] == [0, 2, 3, 1] and _args(_ops(r)[2])["axes"] == [0, 3, 1, 2]
    executor = Executor(load_caffe_net(path))
    executor.run_init()
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    out = executor.run({"x": x})
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["prob"], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(out["prob"].sum(axis=1), 1.0, rtol=1e-5)  # per pixel, as Caffe
    assert out["fprob"].shape == (2, 60)


def test_softmax_loss_on_images_is_spatial(tmp_path):
    r = convert_caffe(_write(tmp_path, """
name: "fcn"
layer { name: "d" type: "Input" top: "score" top: "label"
        input_param { shape { dim: 2 dim: 21 dim: 8 dim: 8 } shape { dim: 2 dim: 1 dim: 8 dim: 8 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""))
    squeeze, loss = _ops(r)
    assert (squeeze.type, _args(squeeze)) == ("Squeeze", {"dims": [1]})
    assert loss.type == "SpatialSoftmaxWithLoss" and list(loss.input) == ["score", "_loss_label"]
    assert r.shapes["_loss_label"] == (2, 8, 8)


# ---------------------------------------------------------------- input shapes travel with the net

def _convert_and_read_value_info(tmp_path, proto, *extra):
    import json
    out = tmp_path / "out"
    assert main(["convert", str(proto), "-o", str(out), *extra]) == 0
    return out, json.loads((out / "value_info.json").read_text())


def _plans_and_runs(capsys, out, run=True):
    """`placer plan` and `placer run` on the converted net, with no --input."""
    capsys.readouterr()
    assert main(["plan", str(out / "predict_net.pbtxt")]) == 0, capsys.readouterr().err
    if run:
        assert main(["run", str(out / "predict_net.pbtxt"), "--quiet"]) == 0, capsys.readouterr().err


@pytest.mark.corpus
def test_input_layer_shape_goes_to_value_info(tmp_path, capsys):
    """mnist_lenet.prototxt: `Input` layer with input_param { shape { dim: 64 1 28 28 } }."""
    out, info = _convert_and_read_value_info(tmp_path, _net("mnist_lenet"))
    assert info == {"data": [1, [64, 1, 28, 28]]}  # [TensorProto.FLOAT, shape], as in the model zoo
    assert "input shapes: data float32[64,1,28,28]" in capsys.readouterr().out
    _plans_and_runs(capsys, out)


@pytest.mark.corpus
@pytest.mark.parametrize("name, shape", [
    ("v1_caffenet_deploy", [10, 3, 227, 227]),       # V1 `layers`, input + 4 x input_dim
    ("squeezenet_v1.0_deploy", [10, 3, 227, 227]),   # input + input_shape { dim ... }
])
def test_input_dim_and_input_shape_go_to_value_info(tmp_path, capsys, name, shape):
    out, info = _convert_and_read_value_info(tmp_path, _net(name))
    assert info == {"data": [1, shape]}
    _plans_and_runs(capsys, out, run=False)


def test_v0_net_input_dims_go_to_value_info(tmp_path, capsys):
    from test_formats_caffe import V0_NET
    out, info = _convert_and_read_value_info(tmp_path, _write(tmp_path, V0_NET, "v0.prototxt"))
    assert info == {"data": [1, [2, 3, 32, 32]]}
    _plans_and_runs(capsys, out)


@pytest.mark.corpus
def test_data_layer_completed_by_input_goes_to_value_info(tmp_path, capsys):
    """V1 train_test with a DATA layer: the batch (100) and the int32 label come from the
    file, the channels and size from --input."""
    out, info = _convert_and_read_value_info(tmp_path, _net("v1_mnist_lenet_train_test"),
                                             "--input", "data=100,1,28,28")
    assert info == {"data": [1, [100, 1, 28, 28]], "label": [2, [100]]}  # 2 = TensorProto.INT32
    _plans_and_runs(capsys, out)


@pytest.mark.corpus
def test_input_given_to_convert_replaces_the_files_shape(tmp_path, capsys):
    out, info = _convert_and_read_value_info(tmp_path, _net("mnist_lenet"), "--input", "data=3,1,28,28")
    assert info == {"data": [1, [3, 1, 28, 28]]}
    capsys.readouterr()
    assert main(["run", str(out / "predict_net.pbtxt"), "--quiet", "--outputs", str(tmp_path / "o.npz")]) == 0
    assert np.load(tmp_path / "o.npz")["prob"].shape == (3, 10)


def test_a_later_conversion_without_shapes_leaves_no_stale_value_info(tmp_path, capsys):
    from test_formats_caffe import V0_NET
    out, info = _convert_and_read_value_info(tmp_path, _write(tmp_path, V0_NET, "v0.prototxt"))
    assert info
    open_input = 'name: "open"\ninput: "data"\nlayer { name: "r" type: "ReLU" bottom: "data" top: "r" }\n'
    out, info = _convert_and_read_value_info(tmp_path, _write(tmp_path, open_input, "open.prototxt"))
    assert info == {}
    capsys.readouterr()
    assert main(["plan", str(out / "predict_net.pbtxt")]) == 2
    assert "'data'" in capsys.readouterr().err


def test_convert_refuses_an_input_the_net_does_not_have(tmp_path, capsys):
    from test_formats_caffe import V0_NET
    proto = _write(tmp_path, V0_NET, "v0.prototxt")
    assert main(["convert", str(proto), "-o", str(tmp_path / "out"), "--input", "dta=2,3,32,32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no input blob 'dta'" in err and "(its inputs: data)" in err


# ---------------------------------------------------------------- broken layers end in one line

def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("placer: error: ") and "Traceback" not in err
    return err


@pytest.mark.corpus
@pytest.mark.parametrize("name, layer, field_, words", [
    ("resnet50_ResNet-50-deploy", "bn_conv1", "top", "layer 'bn_conv1' (BatchNorm) has 0 top(s); a BatchNorm layer takes exactly 1"),
    ("resnet50_ResNet-50-deploy", "scale_conv1", "bottom", "layer 'scale_conv1' (Scale) has 0 bottom(s); a Scale layer takes 1 to 2"),
    ("v1_mnist_lenet_train_test", "ip1", "bottom", "layer 'ip1' (InnerProduct) has 0 bottom(s)"),
    ("bvlc_alexnet_train_val", "accuracy", "bottom", "layer 'accuracy' (Accuracy) has 1 bottom(s)"),
])
def test_a_layer_that_lost_a_top_or_bottom_is_named_at_its_line(tmp_path, capsys, name, layer, field_, words):
    from fuzz_cases import drop_wiring_line
    text = drop_wiring_line(_net(name).read_text(), layer, field_)
    proto = _write(tmp_path, text, "net.prototxt")
    err = _refused(capsys, ["convert", str(proto), "-o", str(tmp_path / "out")])
    line = _line_of(text, 'name: "%s"' % layer)
    assert f"{proto}:{line}: " in err
    assert words in err and f"`{field_}:` line" in err


@pytest.mark.parametrize("param, words", [
    ("convolution_param { num_output: 4 kernel_size: 3 stride: 0 }", "stride [0, 0]"),
    ("convolution_param { num_output: 4 kernel_size: 0 }", "kernel [0, 0]"),
    ("convolution_param { num_output: 4 kernel_size: 3 group: 3 }", "group 3"),
    ("convolution_param { num_output: 4 kernel_size: 9 }", "output 'c': shape 1x4x-1x-1 has a negative dimension"),
])
def test_convolution_parameters_caffe_refuses_are_refused_at_the_layer(tmp_path, capsys, param, words):
    text = ('name: "n"\ninput: "x"\ninput_dim: 1 input_dim: 2 input_dim: 7 input_dim: 7\n'
            f'layer {{\n  name: "conv"\n  type: "Convolution" bottom: "x" top: "c"\n  {param}\n}}\n')
    proto = _write(tmp_path, text)
    err = _refused(capsys, ["convert", str(proto), "-o", str(tmp_path / "out")])
    assert f"{proto}:5: layer 'conv' (Convolution)" in err and words in err


def test_pooling_with_zero_stride_or_pad_past_the_kernel_is_refused(tmp_path, capsys):
    for param in ("kernel_size: 2 stride: 0", "kernel_size: 2 pad: 2"):
        text = ('input: "x"\ninput_dim: 1 input_dim: 2 input_dim: 7 input_dim: 7\n'
                f'layer {{ name: "pool" type: "Pooling" bottom: "x" top: "p" pooling_param {{ {param} }} }}\n')
        err = _refused(capsys, ["inspect", str(_write(tmp_path, text))])
        assert "layer 'pool' (Pooling)" in err and "kernel and stride must be at least 1" in err


@pytest.mark.parametrize("header", [
    'input: "x"\ninput_dim: 1 input_dim: -3 input_dim: 7 input_dim: 7\n',
    'layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 dim: -7 dim: 7 } } }\n',
    'input: "x"\ninput_shape { dim: 1099511627776 dim: 1099511627776 }\n',
])
def test_input_shapes_that_cannot_exist_are_refused(tmp_path, capsys, header):
    text = header + 'layer { name: "r" type: "ReLU" bottom: "x" top: "r" }\n'
    err = _refused(capsys, ["convert", str(_write(tmp_path, text)), "-o", str(tmp_path / "out")])
    assert "negative dimension" in err or "more than int64 can count" in err
