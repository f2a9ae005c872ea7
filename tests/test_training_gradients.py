"""The gradient registry against real Caffe2: for each case, the gradient ops and input
gradients Caffe2's ``GradientRegistry.GetGradientForOp`` writes, compared as protobuf text.

Every op type with a maker here has at least one case (checked), so a maker cannot drift
from Caffe2 unnoticed.
"""
from __future__ import annotations

import json

import pytest
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from placer.formats import caffe2_pb as pb
from placer.training import GradientError, GradientSlice, gradient_for_op
from placer.training.gradient_registry import MAKERS, make_op
from placer.training.gradients import NO_GRADIENT, SHOULD_NOT_DO_GRADIENT, has_gradient_maker

pytestmark = pytest.mark.caffe2

# (op type, inputs, outputs, arguments, output gradients); a gradient "i|v" is a GradientSlice.
# Special keys in the arguments: "engine", "device" ([type, id]).
CASES = [
    ("FC", "X W b", "Y", {"axis": 2}, None),
    ("FC", "X W b", "Y", {"engine": "E", "device": [1, 1]}, None),
    ("FCTransposed", "X W b", "Y", {}, None),
    ("Conv", "X W b", "Y", {"kernel": 3, "order": "NCHW"}, None),
    ("Conv", "X W", "Y", {"kernel": 3, "engine": "CUDNN"}, None),
    ("Conv", "X W b", "Y", {"kernel": 3, "no_gradient_to_input": 1}, None),
    ("Conv", "X W", "Y", {"kernel": 3, "no_gradient_to_input": 1}, None),
    ("Conv1D", "X W b", "Y", {"kernel": 3}, None),
    ("Conv2D", "X W b", "Y", {"kernel": 3}, None),
    ("Conv3D", "X W b", "Y", {"kernels": [3, 3, 3]}, None),
    ("ConvTranspose", "X W b", "Y", {"kernel": 2, "stride": 2}, None),
    ("ConvTranspose", "X W", "Y", {"kernel": 2}, None),
    ("Relu", "X", "Y", {}, None),
    ("Relu", "X", "X", {}, None),
    ("LeakyRelu", "X", "Y", {"alpha": 0.2}, None),
    ("Sigmoid", "X", "Y", {}, None),
    ("Tanh", "X", "Y", {}, None),
    ("Softmax", "X", "Y", {"axis": 2}, None),
    ("FloatToHalf", "X", "Y", {}, None),
    ("HalfToFloat", "X", "Y", {}, None),
    ("Softmax", "X", "Y", {"axis": 3}, None),
    ("Elu", "X", "Y", {"alpha": 2.0}, None),
    ("Softplus", "X", "Y", {}, None),
    ("ThresholdedRelu", "X", "Y", {"alpha": 0.5}, None),
    ("Reciprocal", "X", "Y", {}, None),
    ("Clip", "X", "Y", {"min": 0.0, "max": 6.0}, None),
    ("Swish", "X", "Y", {}, None),
    ("Gelu", "X", "Y", {}, None),
    ("Gelu", "X", "Y", {"fast_gelu": 1}, None),
    ("LayerNorm", "X", "Y mean std", {}, None),
    ("LayerNorm", "X", "Y mean std", {"axis": 2, "epsilon": 1e-6}, None),
    ("LayerNorm", "X g b", "Y mean std", {"axis": -1, "elementwise_affine": 1}, None),
    ("Rsqrt", "X", "Y", {}, None),
    ("Abs", "X", "Y", {}, None),
    ("Cos", "X", "Y", {}, None),
    ("Sin", "X", "Y", {}, None),
    ("Softsign", "X", "Y", {}, None),
    ("Logit", "X", "Y", {"eps": 1e-6}, None),
    ("Normalize", "X", "Y", {"axis": 1}, None),
    ("Negative", "X", "Y", {}, None),
    ("Exp", "X", "Y", {}, None),
    ("Log", "X", "Y", {}, None),
    ("Sqr", "X", "Y", {}, None),
    ("Sqrt", "X", "Y", {}, None),
    ("Pow", "X", "Y", {"exponent": 3.0}, None),
    ("MaxPool", "X", "Y", {"kernel": 2, "stride": 2, "order": "NCHW", "legacy_pad": 3}, None),
    ("AveragePool", "X", "Y", {"kernel": 3, "pad": 1, "engine": "CUDNN"}, None),
    ("LRN", "X", "Y scale", {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, None),
    ("Dropout", "X", "Y mask", {"ratio": 0.5, "is_test": 0}, None),
    ("Dropout", "X", "Y", {"ratio": 0.5, "is_test": 1}, None),
    ("SpatialBN", "X s b rm riv", "Y rm riv sm siv", {"is_test": 0, "epsilon": 1e-5, "momentum": 0.9}, None),
    ("SpatialBN", "X s b rm riv", "Y", {"is_test": 1}, None),
    ("SoftmaxWithLoss", "X L", "P loss", {}, [None, "loss_grad"]),
    ("SoftmaxWithLoss", "X L w", "P loss", {"scale": 0.3}, [None, "loss_grad"]),
    ("SpatialSoftmaxWithLoss", "X L", "P loss", {}, [None, "loss_grad"]),
    ("AveragedLoss", "X", "L", {}, None),
    ("LabelCrossEntropy", "X L", "Y", {}, None),
    ("SigmoidCrossEntropyWithLogits", "X T", "Y", {"log_D_trick": 0}, None),
    ("SquaredL2Distance", "A B", "Y", {}, None),
    ("DotProduct", "A B", "Y", {}, None),
    ("PRelu", "X s", "Y", {"order": "NCHW"}, None),
    ("Add", "A B", "Y", {"broadcast": 1, "axis": 1}, None),
    ("Add", "A B", "A", {}, None),
    ("Sub", "A B", "Y", {}, None),
    ("Mul", "A B", "Y", {"broadcast": 1}, None),
    ("Mul", "A A", "Y", {}, None),
    ("Div", "A B", "Y", {}, None),
    ("Scale", "X", "X", {"scale": 0.5}, None),
    ("Copy", "X", "Y", {"device": [1, 0]}, None),
    ("CopyCPUToGPU", "X", "Y", {}, None),
    ("CopyGPUToCPU", "X", "Y", {}, None),
    ("Squeeze", "X", "Y", {"dims": [1, 2]}, None),
    ("ExpandDims", "X", "Y", {"dims": [0]}, None),
    ("FlattenToVec", "X", "Y", {}, None),
    ("Flatten", "X", "Y", {"axis": 1}, None),
    ("Reshape", "X", "Y old", {"shape": [2, -1]}, None),
    ("Reshape", "X shp", "Y old", {}, None),
    ("Transpose", "X", "Y", {}, None),
    ("Transpose", "X", "Y", {"axes": [1, 2, 0], "order": "NCHW"}, None),
    ("Transpose", "X", "Y", {"axes": [0, 2, 1, 3]}, None),
    ("Concat", "A B", "Y split", {"axis": 1}, None),
    ("Concat", "A B C", "Y split", {"axis": 0, "add_axis": 1}, None),
    ("DepthConcat", "A B", "Y split", {}, None),
    ("Split", "X", "A B", {"axis": 1, "split": [2, 3]}, ["A_grad", "B_grad"]),
    ("Split", "X", "A B", {"axis": 1}, [None, "B_grad"]),
    ("Split", "X sp", "A B", {}, ["A_grad", "B_grad"]),
    ("DepthSplit", "X", "A B", {}, ["A_grad", "B_grad"]),
    ("Slice", "X", "Y", {"starts": [0, 1], "ends": [-1, 3]}, None),
    ("Slice", "X s e", "Y", {}, None),
    ("Tile", "X", "Y", {"tiles": 2, "axis": 1}, None),
    ("ResizeNearest", "X", "Y", {"width_scale": 2.0, "height_scale": 2.0}, None),
    ("Cast", "X", "Y", {"to": 1, "from_type": 10}, None),
    ("Cast", "X", "Y", {"to": "FLOAT", "from_type": "INT32"}, None),
    ("Sum", "A B C", "Y", {}, None),
    ("Sum", "A B", "A", {}, None),
    ("Alias", "X", "Y", {}, None),
    ("Max", "A B C", "Y", {}, None),
    ("Min", "A B", "Y", {}, None),
    ("Mean", "A B", "Y", {}, None),
    ("WeightedSum", "A w B v", "Y", {}, None),
    ("WeightedSum", "A w B v", "Y", {"grad_on_w": 1}, None),
    ("BatchMatMul", "A B", "Y", {}, None),
    ("BatchMatMul", "A B", "Y", {"trans_a": 1}, None),
    ("BatchMatMul", "A B", "Y", {"trans_b": 1}, None),
    ("BatchMatMul", "A B", "Y", {"trans_a": 1, "trans_b": 1}, None),
    ("BatchMatMul", "A B", "Y", {"trans_b": 1, "broadcast": 0}, None),
    ("MatMul", "A B", "Y", {}, None),
    ("MatMul", "A B", "Y", {"trans_a": 1, "axis_a": 2}, None),
    ("MatMul", "A B", "Y", {"trans_b": 1}, None),
    ("MatMul", "A B", "Y", {"trans_a": 1, "trans_b": 1}, None),
    ("ChannelShuffle", "X", "Y", {"group": 2}, None),
    ("BatchGather", "D I", "Y", {}, None),
    ("PadImage", "X", "Y", {"pads": [1, 1, 1, 1]}, None),
    ("MakeTwoClass", "X", "Y", {}, None),
    ("ReduceMean", "X", "Y", {"axes": [1], "keepdims": 0}, None),
    ("ReduceSum", "X", "Y", {"axes": [1]}, None),
    ("ReduceFrontSum", "X", "Y", {}, None),
    ("ReduceBackSum", "X", "Y", {}, None),
    ("ReduceFrontMean", "X", "Y", {}, None),
    ("ReduceBackMean", "X", "Y", {}, None),
    ("SumElements", "X", "Y", {"average": 1}, None),
    ("LengthsSum", "D L", "Y", {}, None),
    ("LengthsMean", "D L", "Y", {}, None),
    ("LengthsMax", "D L", "Y", {}, None),
    ("SortedSegmentSum", "D S", "Y", {}, None),
    ("SortedSegmentMean", "D S", "Y", {}, None),
    ("SparseLengthsSum", "D I L", "Y", {}, None),
    ("SparseLengthsSum", "D I L", "Y", {"engine": "fp16"}, None),
    ("SparseLengthsMean", "D I L", "Y", {}, None),
    ("SparseLengthsWeightedSum", "D W I L", "Y", {}, None),
    ("SparseLengthsWeightedSum", "D W I L", "Y", {"grad_on_weights": 1}, None),
    ("Gather", "D I", "Y", {}, None),
    ("Gather", "D I", "Y", {"dense_gradient": 1}, None),
    ("Gather", "D I", "Y", {"axis": 1}, None),
    ("StopGradient", "X", "X", {}, None),
    ("ConstantFill", "X", "Y", {"value": 1.0}, None),
    ("EnsureCPUOutput", "X", "Y", {}, None),
    ("SparseLengthsSumFused8BitRowwise", "D I L", "Y", {}, None),
    # Caffe2 refuses these: the test expects a GradientError where it raises.
    ("Accuracy", "X L", "acc", {}, None),
    ("ResizeLike", "X Z", "Y", {}, None),
    ("Relu", "X", "Y", {}, ["Yi|Yv"]),
    ("SoftmaxWithLoss", "X L", "P loss", {}, ["P_grad", None]),
    ("Cast", "X", "Y", {"to": 1}, None),
    ("BatchMatMul", "A B", "Y", {"broadcast": 1}, None),
]

ORACLE = """
cases = json.loads(inputs_json)
def grad(g):
    if g is None: return None
    return core.GradientSlice(*g.split("|")) if "|" in g else g
out = []
for op_type, ins, outs, args, g_out in cases:
    args = dict(args)
    engine = args.pop("engine", None)
    dev = args.pop("device", None)
    op = core.CreateOperator(op_type, ins.split(), outs.split(), engine=engine,
                             device_option=core.DeviceOption(*dev) if dev else None, **args)
    if g_out is None:
        g_out = [o + "_grad" for o in outs.split()[:1]] + [None] * (len(outs.split()) - 1)
    try:
        ops, g_in = core.GradientRegistry.GetGradientForOp(op, [grad(g) for g in g_out])
    except Exception as e:
        out.append({"error": str(e).splitlines()[0]})
        continue
    out.append({"ops": [net_text(o) for o in ops],
                 "g_in": [None if g is None else [g.indices, g.values] if isinstance(g, core.GradientSlice)
                          else str(g) for g in g_in]})
save_json(out)
"""


@pytest.fixture(scope="module")
def oracle_results():
    script = f"inputs_json = {json.dumps(json.dumps(CASES))}\n" + ORACLE
    return run_caffe2(script)[1]


def _forward_op(op_type, ins, outs, args):
    args = dict(args)
    engine = args.pop("engine", None)
    dev = args.pop("device", None)
    op = make_op(op_type, ins.split(), outs.split(), args=list(args.items()))
    if engine is not None:
        op.engine = engine
    if dev:
        op.device_option.device_type, op.device_option.device_id = dev
    return op


def _output_grads(outs, g_out):
    if g_out is None:
        names = outs.split()
        return [names[0] + "_grad"] + [None] * (len(names) - 1)
    return [None if g is None else GradientSlice(*g.split("|")) if "|" in g else g for g in g_out]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradient_ops_equal_caffe2s(index, oracle_results):
    op_type, ins, outs, args, g_out = CASES[index]
    expected = oracle_results[index]
    op = _forward_op(op_type, ins, outs, args)
    if "error" in expected:
        with pytest.raises(GradientError):
            gradient_for_op(op, _output_grads(outs, g_out))
        return
    ops, g_in = gradient_for_op(op, _output_grads(outs, g_out))
    theirs = []
    for text in expected["ops"]:
        proto = pb.OperatorDef()
        text_format.Parse(text, proto)
        theirs.append(text_format.MessageToString(proto))
    assert [text_format.MessageToString(o) for o in ops] == theirs
    assert [list(g) if isinstance(g, GradientSlice) else g for g in g_in] == expected["g_in"]


# Makers of placer's own ops, which Caffe2 lacks: checked elsewhere (AllToAll's by its
# kernel's adjoint and a sharded training step, tests/test_sharding_run.py; the bfloat16
# casts', each the other cast as FloatToHalf's is HalfToFloat, by
# tests/test_training_precision.py::test_bf16_casts_differentiate_into_each_other).
PLACER_OPS = {"AllToAll", "FloatToBFloat16", "BFloat16ToFloat"}


def test_every_maker_is_checked_against_caffe2():
    covered = {c[0] for c in CASES} | PLACER_OPS
    missing = sorted(t for t in MAKERS if t not in covered)
    assert not missing, f"gradient makers without an oracle case: {missing}"


def test_no_gradient_types_are_known_and_refusing_types_are_not():
    assert has_gradient_maker("StopGradient") and has_gradient_maker("FC")
    assert not has_gradient_maker("Accuracy") and "Accuracy" in SHOULD_NOT_DO_GRADIENT
    assert not NO_GRADIENT & SHOULD_NOT_DO_GRADIENT
