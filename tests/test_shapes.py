"""Shape inference over nets (placer.shapes): toy registry entries for the mechanics, the
real Conv/FC entries and Caffe loader for published FLOP counts."""
from __future__ import annotations

import pytest
from conftest import corpus_files

from placer.errors import ShapeError
from placer.formats import load_net
from placer.formats.caffe2 import net_from_netdef, parse_text
from placer.ops import registry
from placer.ops.registry import OpDef
from placer.shapes import infer, missing_summary
from placer.types import OpFeatures, TensorType


def _toy_fc_infer(inputs, args):
    x, w = inputs[0], inputs[1]
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"op {args.op}: input has K={x.shape[1]} but weight has K={w.shape[1]}")
    return [TensorType((x.shape[0], w.shape[0]), x.dtype)]


def _toy_fc_cost(inputs, outputs, args):
    (n, k), m = inputs[0].shape, inputs[1].shape[0]
    return OpFeatures(flops=2.0 * n * k * m, macs=float(n * k * m),
                      bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(outputs[0].nbytes))


@pytest.fixture
def toy_ops(monkeypatch):
    registry.all_types()  # fill the registry first, so the toys are added to a full one
    toys = [OpDef("ToyFC", _toy_fc_infer, cost=_toy_fc_cost, min_inputs=2, max_inputs=3),
            OpDef("ToyRelu", lambda inputs, args: [inputs[0]], min_inputs=1, max_inputs=1),
            OpDef("ToyBroken", lambda inputs, args: [inputs[5]], min_inputs=1, max_inputs=1),
            OpDef("ToyBrokenCost", lambda inputs, args: [inputs[0]], cost=lambda i, o, a: 1 / 0,
                  min_inputs=1, max_inputs=1),
            OpDef("ToyValueShaped", lambda inputs, args: [None], min_inputs=1, max_inputs=1)]
    for t in toys:
        monkeypatch.setitem(registry._REGISTRY, t.type, t)


def _net(text, init_text=None):
    init = parse_text(init_text) if init_text else None
    return net_from_netdef(parse_text(text), init, path="toy.pbtxt", source_format="caffe2-text")


MLP = '''op { input: "x" input: "w" input: "b" output: "h" type: "ToyFC" }
  op { input: "h" output: "h" type: "ToyRelu" }
  op { input: "h" input: "w2" output: "y" type: "ToyFC" }
  external_input: "x" external_input: "w" external_input: "b" external_input: "w2"
  external_output: "y"'''
MLP_INIT = '''op { output: "w" type: "GivenTensorFill" arg { name: "shape" ints: 32 ints: 16 } }
  op { output: "b" type: "ConstantFill" arg { name: "shape" ints: 32 } }
  op { output: "w2" type: "XavierFill" arg { name: "shape" ints: 10 ints: 32 } }'''


def test_types_features_and_param_bytes(toy_ops):
    typed = infer(_net(MLP, MLP_INIT), {"x": TensorType((4, 16))})
    assert typed.blobs["h"] == TensorType((4, 32))
    assert typed.blobs["y"] == TensorType((4, 10))
    assert not typed.missing and not typed.unknown_ops
    fc1, relu, fc2 = typed.features
    assert fc1.macs == 4 * 16 * 32 and fc1.flops == 2 * 4 * 16 * 32
    assert fc1.param_bytes == (32 * 16 + 32) * 4
    assert fc2.param_bytes == 10 * 32 * 4
    assert relu.param_bytes == 0 and relu.known


def test_missing_params_without_init_net_name_the_options(toy_ops):
    typed = infer(_net(MLP), {"x": TensorType((4, 16))})
    assert list(typed.missing) == ["w", "b", "w2"]  # every root cause, not the blobs after them
    assert "--init-net" in typed.missing["w"] and "--input w=" in typed.missing["w"]
    assert typed.blobs["y"] is None
    assert [f.known for f in typed.features] == [False, False, False]
    assert "3 blob(s) have no shape: 'w', 'b', 'w2'; give --init-net" in missing_summary(typed)


def test_missing_data_input_with_init_net(toy_ops):
    typed = infer(_net(MLP, MLP_INIT))
    assert list(typed.missing) == ["x"]
    assert "--init-net" not in typed.missing["x"] and "--input x=" in typed.missing["x"]


def test_unknown_op_is_kept_and_user_shape_fills_its_output(toy_ops):
    text = '''op { input: "x" output: "z" type: "NoSuchOp" }
      op { input: "z" input: "w" output: "y" type: "ToyFC" }
      external_input: "x" external_input: "w"'''
    init = 'op { output: "w" type: "GivenTensorFill" arg { name: "shape" ints: 3 ints: 8 } }'
    typed = infer(_net(text, init), {"x": TensorType((2, 8))})
    assert typed.unknown_ops == [0]
    assert typed.blobs["z"] is None and typed.blobs["y"] is None
    assert "NoSuchOp" in typed.missing["z"] and "--input z=" in typed.missing["z"]
    assert typed.features[0] == OpFeatures(known=False)
    typed = infer(_net(text, init), {"x": TensorType((2, 8)), "z": TensorType((2, 8))})
    assert typed.unknown_ops == [0] and not typed.missing
    assert typed.blobs["y"] == TensorType((2, 3))


def test_value_dependent_output_and_unknown_external_output_are_reported(toy_ops):
    text = '''op { input: "x" output: "r" type: "ToyValueShaped" }
      op { input: "r" output: "r2" type: "ToyRelu" }
      op { input: "x" output: "u" type: "NoSuchOp" }
      external_input: "x" external_output: "r2" external_output: "u"'''
    typed = infer(_net(text), {"x": TensorType((2, 8))})
    assert list(typed.missing) == ["r", "u"]
    assert "#0 ToyValueShaped -> 'r' makes it but its shape depends on input values" in typed.missing["r"]
    assert "--input r=" in typed.missing["r"]
    assert "does not know op type NoSuchOp" in typed.missing["u"]
    typed = infer(_net(text), {"x": TensorType((2, 8)), "r": TensorType((16,)), "u": TensorType((1,))})
    assert not typed.missing and typed.blobs["r2"] == TensorType((16,))


def test_in_place_chain_reports_the_op_that_last_wrote_the_blob(toy_ops):
    text = '''op { input: "x" output: "h" type: "ToyRelu" }
      op { input: "h" output: "h" type: "NoSuchOp" }
      op { input: "h" output: "y" type: "ToyRelu" } external_input: "x"'''
    typed = infer(_net(text), {"x": TensorType((2, 8))})
    assert "op #1 NoSuchOp -> 'h' makes it" in typed.missing["h"]


def test_in_place_rewrite_keeps_each_ops_own_types(toy_ops, monkeypatch):
    flat = OpDef("ToyFlatten", lambda inputs, args: [TensorType((inputs[0].shape[0], inputs[0].size // inputs[0].shape[0]))],
                 min_inputs=1, max_inputs=1)
    monkeypatch.setitem(registry._REGISTRY, flat.type, flat)
    text = '''op { input: "x" output: "h" type: "ToyRelu" }
      op { input: "h" output: "h" type: "ToyFlatten" }
      op { input: "h" output: "y" type: "ToyRelu" } external_input: "x"'''
    typed = infer(_net(text), {"x": TensorType((2, 3, 4))})
    assert typed.op_outputs == [(TensorType((2, 3, 4)),), (TensorType((2, 12)),), (TensorType((2, 12)),)]
    assert typed.op_inputs[1] == (TensorType((2, 3, 4)),)
    assert typed.blobs["h"] == TensorType((2, 12))


def test_shape_error_names_both_blobs_and_shapes(toy_ops):
    with pytest.raises(ShapeError) as e:
        infer(_net(MLP, MLP_INIT), {"x": TensorType((4, 15))})
    msg = str(e.value)
    assert "#0 ToyFC -> 'h'" in msg
    assert "'x' float32[4,15]" in msg and "'w' float32[32,16]" in msg


def test_arity_is_checked(toy_ops):
    net = _net('op { input: "x" output: "y" type: "ToyFC" } external_input: "x"')
    with pytest.raises(ShapeError, match="takes 2..3 inputs, found 1"):
        infer(net, {"x": TensorType((1, 2))})


def test_a_bug_in_an_op_becomes_a_shape_error(toy_ops):
    net = _net('op { input: "x" output: "y" type: "ToyBroken" } external_input: "x"')
    with pytest.raises(ShapeError, match="shape inference failed.*IndexError"):
        infer(net, {"x": TensorType((1, 2))})


def test_a_bug_in_a_cost_becomes_a_shape_error(toy_ops):
    net = _net('op { input: "x" output: "y" type: "ToyBrokenCost" } external_input: "x"')
    with pytest.raises(ShapeError, match="cost features failed.*'x' float32\\[1,2\\].*ZeroDivisionError"):
        infer(net, {"x": TensorType((1, 2))})


def test_empty_net():
    typed = infer(_net('external_output: "unused_output"'))
    assert typed.features == [] and not typed.missing


# ---------------------------------------------------------------- published FLOP counts

def _conv_fc_macs(typed):
    assert not typed.missing, missing_summary(typed)
    return sum(f.macs for op, f in zip(typed.net.ops, typed.features) if op.type in ("Conv", "FC"))


@pytest.mark.corpus
def test_resnet50_macs_match_published(corpus):
    """ResNet-50 at 224x224, batch 1: about 3.9 G multiply-adds (He et al. 2016, Table 1:
    3.8e9 FLOPs counted as multiply-adds; conv + FC)."""
    typed = infer(load_net(corpus / "caffe" / "resnet50_ResNet-50-deploy.prototxt"))
    assert _conv_fc_macs(typed) == pytest.approx(3.9e9, rel=0.05)


@pytest.mark.corpus
def test_alexnet_macs_match_published(corpus):
    """AlexNet (BVLC, grouped convs) at 227x227, batch 1: about 0.72 G multiply-adds."""
    typed = infer(load_net(corpus / "caffe" / "bvlc_alexnet_deploy.prototxt"))
    assert typed.blobs["prob"] == TensorType((10, 1000))  # the deploy file's batch is 10
    assert _conv_fc_macs(typed) / 10 == pytest.approx(0.72e9, rel=0.05)


# AlexNet's parameter shapes (Krizhevsky et al. 2012, the two-group BVLC layout).
ALEXNET_PARAMS = {
    "conv1_w": (96, 3, 11, 11), "conv1_b": (96,), "conv2_w": (256, 48, 5, 5), "conv2_b": (256,),
    "conv3_w": (384, 256, 3, 3), "conv3_b": (384,), "conv4_w": (384, 192, 3, 3), "conv4_b": (384,),
    "conv5_w": (256, 192, 3, 3), "conv5_b": (256,), "fc6_w": (4096, 9216), "fc6_b": (4096,),
    "fc7_w": (4096, 4096), "fc7_b": (4096,), "fc8_w": (1000, 4096), "fc8_b": (1000,),
}


@pytest.mark.corpus
def test_caffe2_alexnet_macs_with_parameter_shapes_given(corpus):
    """The Caffe2 model-zoo AlexNet, parameter shapes given as --input would: 0.72 G MACs."""
    net = load_net(corpus / "caffe2" / "alexnet_predict_net.pbtxt")
    shapes = {k: TensorType(v) for k, v in ALEXNET_PARAMS.items()}
    typed = infer(net, {**shapes, "data": TensorType((1, 3, 227, 227))})
    assert typed.blobs["prob"] == TensorType((1, 1000))
    assert typed.blobs["pool5"] == TensorType((1, 256, 6, 6))
    assert _conv_fc_macs(typed) == pytest.approx(0.72e9, rel=0.05)


@pytest.mark.corpus
@pytest.mark.parametrize("path", corpus_files("caffe", ".prototxt"), ids=lambda p: p.name)
def test_every_caffe_file_with_input_shapes_gets_complete_shapes(path):
    from placer.formats import load_net
    net = load_net(path)
    if not all(b in net.input_shapes for b in net.data_inputs):
        pytest.skip(f"{path.name} carries no shape for {[b for b in net.data_inputs if b not in net.input_shapes]}")
    typed = infer(net)
    assert typed.missing == {}
    every_blob = {b for op in net.ops for b in (*op.inputs, *op.outputs)}
    assert all(typed.blobs.get(b) is not None for b in every_blob), \
        [b for b in every_blob if typed.blobs.get(b) is None][:5]
