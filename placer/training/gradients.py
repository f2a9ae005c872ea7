"""For a forward op, the gradient op(s) Caffe2's gradient makers write (the makers and their
helpers: ``gradient_registry``).

One-op makers with fixed blobs are data here (``SINGLE_OP_GRADIENTS``); the others are in
``gradient_makers.py``, which the package (``placer/training/__init__.py``) imports, so that
``MAKERS`` holds every maker whatever module of the package is imported first. Caffe2's
``NO_GRADIENT`` and ``SHOULD_NOT_DO_GRADIENT`` op types are here too.

``gradient_for_op`` then does what ``caffe2::GetGradientForOp`` does around a maker: every
gradient op gets ``is_gradient_op``, and -- unless the maker turns it off -- a copy of the
forward op's ``device_option`` (when it has one), ``engine`` (when set) and arguments
(appended after the maker's own). The makers follow torch 1.8.1's Caffe2, checked op by op
against it (tests/test_training_gradients.py). ``backward.py`` plays them over a whole net.
"""
from __future__ import annotations

from typing import Sequence

from placer.training.gradient_registry import (MAKERS, GradientError, GradientMaker, MakeFn, MakerContext,
                                               make_op, op_label, register)

# Caffe2's NO_GRADIENT: the op passes no gradient to its inputs (and that is no error).
NO_GRADIENT = frozenset({
    "StopGradient", "ConstantFill", "Size", "EnsureCPUOutput", "GivenTensorFill",
    "GivenTensorIntFill", "GivenTensorInt64Fill", "GivenTensorBoolFill", "GivenTensorDoubleFill",
    "XavierFill", "MSRAFill", "GaussianFill", "UniformFill", "UniformIntFill", "RangeFill",
    "SparseLengthsSumFused8BitRowwise", "SparseLengthsWeightedSumFused8BitRowwise",
    "SparseLengthsMeanFused8BitRowwise", "Iter", "AtomicIter", "LearningRate", "CreateMutex",
    "Float16ConstantFill", "Float16UniformFill",
})

# Caffe2's SHOULD_NOT_DO_GRADIENT: asking for the gradient is an error.
SHOULD_NOT_DO_GRADIENT = frozenset({
    "Accuracy", "Shape", "ResizeLike", "LengthsToSegmentIds", "LengthsToRanges", "ReplaceNaN",
    "ArgMax", "ArgMin", "LengthsToShape",
    "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor", "Not", "Where",   # logical_ops (oracle)
})


def _resolve(ctx: MakerContext, token: str) -> str:
    """``"I0"``, ``"O1"``, ``"GO0"``, ``"GI2"``, ``"GI_V0"`` -> the name the helper returns."""
    for prefix in ("GI_V", "GI_I", "GO", "GI", "I", "O"):
        if token.startswith(prefix) and token[len(prefix):].isdigit():
            return getattr(ctx, prefix)(int(token[len(prefix):]))
    raise ValueError(f"bad gradient token {token!r}")


def _single(grad_type: str, inputs: str, outputs: str) -> MakeFn:
    """A maker that writes one op: ``SingleGradientDef(grad_type, "", inputs, outputs)``."""
    def make(ctx: MakerContext) -> list:
        ins = [_resolve(ctx, t) for t in inputs.split()]
        outs = [_resolve(ctx, t) for t in outputs.split()]
        return [make_op(grad_type, ins, outs)]
    return make


# One-op makers as data: forward type -> (gradient op type, inputs, outputs).
SINGLE_OP_GRADIENTS = {
    "FC": ("FCGradient", "I0 I1 GO0", "GI1 GI2 GI0"),
    "FCTransposed": ("FCTransposedGradient", "I0 I1 GO0", "GI1 GI2 GI0"),
    "Relu": ("ReluGradient", "O0 GO0", "GI0"),
    "LeakyRelu": ("LeakyReluGradient", "O0 GO0", "GI0"),
    "Sigmoid": ("SigmoidGradient", "O0 GO0", "GI0"),
    "Tanh": ("TanhGradient", "O0 GO0", "GI0"),
    "Softmax": ("SoftmaxGradient", "O0 GO0", "GI0"),
    "FloatToHalf": ("HalfToFloat", "GO0", "GI0"),            # half_float_ops.cc
    "HalfToFloat": ("FloatToHalf", "GO0", "GI0"),
    "FloatToBFloat16": ("BFloat16ToFloat", "GO0", "GI0"),    # placer-only (ops/half.py)
    "BFloat16ToFloat": ("FloatToBFloat16", "GO0", "GI0"),
    "Elu": ("EluGradient", "O0 GO0", "GI0"),
    "Softplus": ("SoftplusGradient", "O0 GO0", "GI0"),
    "ThresholdedRelu": ("ThresholdedReluGradient", "O0 GO0", "GI0"),
    "Reciprocal": ("ReciprocalGradient", "O0 GO0", "GI0"),
    "Clip": ("ClipGradient", "O0 GO0", "GI0"),
    "Swish": ("SwishGradient", "I0 O0 GO0", "GI0"),
    "Gelu": ("GeluGradient", "GO0 I0", "GI0"),
    "Rsqrt": ("RsqrtGradient", "GO0 O0", "GI0"),
    "Abs": ("AbsGradient", "I0 GO0", "GI0"),
    "Cos": ("CosGradient", "I0 GO0", "GI0"),
    "Sin": ("SinGradient", "I0 GO0", "GI0"),
    "Softsign": ("SoftsignGradient", "I0 GO0", "GI0"),
    "Logit": ("LogitGradient", "I0 GO0", "GI0"),
    "Normalize": ("NormalizeGradient", "I0 GO0", "GI0"),
    "Negative": ("Negative", "GO0", "GI0"),
    "MaxPool": ("MaxPoolGradient", "I0 O0 GO0", "GI0"),
    "AveragePool": ("AveragePoolGradient", "I0 O0 GO0", "GI0"),
    "LRN": ("LRNGradient", "I0 O0 GO0", "GI0"),
    "FlattenToVec": ("ResizeLike", "GO0 I0", "GI0"),
    "Flatten": ("ResizeLike", "GO0 I0", "GI0"),
    "AveragedLoss": ("AveragedLossGradient", "I0 GO0", "GI0"),
    "LabelCrossEntropy": ("LabelCrossEntropyGradient", "I0 I1 GO0", "GI0"),
    "SigmoidCrossEntropyWithLogits": ("SigmoidCrossEntropyWithLogitsGradient", "GO0 I0 I1", "GI0"),
    "SquaredL2Distance": ("SquaredL2DistanceGradient", "I0 I1 GO0", "GI0 GI1"),
    "DotProduct": ("DotProductGradient", "I0 I1 GO0", "GI0 GI1"),
    "PRelu": ("PReluGradient", "O0 GO0 I0 I1", "GI0 GI1"),
    "Add": ("AddGradient", "GO0 I0 I1", "GI0 GI1"),
    "Sub": ("SubGradient", "GO0 I0 I1", "GI0 GI1"),
    "Mul": ("MulGradient", "GO0 I0 I1", "GI0 GI1"),
    "Div": ("DivGradient", "GO0 I0 I1 O0", "GI0 GI1"),
    "Scale": ("Scale", "GO0", "GI0"),
    "Copy": ("CopyOnDeviceLike", "GO0 I0", "GI0"),
    "CopyCPUToGPU": ("CopyGPUToCPU", "GO0", "GI0"),
    "CopyGPUToCPU": ("CopyCPUToGPU", "GO0", "GI0"),
    "Squeeze": ("ExpandDims", "GO0", "GI0"),
    "ExpandDims": ("Squeeze", "GO0", "GI0"),
    "Exp": ("Mul", "O0 GO0", "GI0"),
    "Log": ("Div", "GO0 I0", "GI0"),
    "ChannelShuffle": ("ChannelShuffleGradient", "GO0", "GI0"),
    "BatchGather": ("BatchGatherGradient", "I0 I1 GO0", "GI0"),
    "PadImage": ("PadImageGradient", "GO0", "GI0"),
    "MakeTwoClass": ("MakeTwoClassGradient", "GO0", "GI0"),
    "ReduceMean": ("ReduceMeanGradient", "GO0 I0 O0", "GI0"),
    "ReduceSum": ("ReduceSumGradient", "GO0 I0 O0", "GI0"),
    "ReduceFrontSum": ("ReduceFrontSumGradient", "GO0 I0", "GI0"),
    "ReduceBackSum": ("ReduceBackSumGradient", "GO0 I0", "GI0"),
    "ReduceFrontMean": ("ReduceFrontMeanGradient", "GO0 I0", "GI0"),
    "ReduceBackMean": ("ReduceBackMeanGradient", "GO0 I0", "GI0"),
    "SumElements": ("SumElementsGradient", "I0 GO0", "GI0"),
    "LengthsSum": ("LengthsIndicesInGradientSumGradient", "GO0 I1 I0", "GI0"),
    "LengthsMean": ("LengthsIndicesInGradientMeanGradient", "GO0 I1 I0", "GI0"),
    "LengthsMax": ("LengthsMaxWithMainInputAndForwardOutputGradient", "O0 GO0 I1 I0", "GI0"),
    "SortedSegmentSum": ("SortedSegmentSumGradient", "GO0 I1", "GI0"),
    "SortedSegmentMean": ("SortedSegmentMeanGradient", "GO0 I1", "GI0"),
}

for _fwd, (_grad, _ins, _outs) in SINGLE_OP_GRADIENTS.items():
    register(_fwd)(_single(_grad, _ins, _outs))


# ---------------------------------------------------------------- around a maker

def gradient_for_op(op, g_output: Sequence) -> tuple[list, list]:
    """``(gradient ops, gradient of each input)`` for a forward op, as Caffe2's
    ``GradientRegistry.GetGradientForOp`` answers: every gradient op marked
    ``is_gradient_op``, with the forward op's device option, engine and arguments copied
    where the maker keeps the defaults. A GradientError for an op type without a gradient."""
    maker = _maker(op)
    if maker is None:
        return [], [None] * len(op.input)
    ctx = MakerContext(op, g_output)
    ops = maker.make(ctx)
    for grad_op in ops:
        grad_op.is_gradient_op = True
        if maker.copy_device and op.HasField("device_option"):
            grad_op.device_option.CopyFrom(op.device_option)
        if maker.copy_engine and op.HasField("engine"):
            grad_op.engine = op.engine
        if maker.copy_args:
            grad_op.arg.extend(op.arg)
    return ops, ctx.g_input()


def has_gradient_maker(op_type: str) -> bool:
    """True when the op type has a gradient maker here (or Caffe2 declares it gradient-free)."""
    return op_type in MAKERS or op_type in NO_GRADIENT


def _maker(op) -> GradientMaker | None:
    if op.type in NO_GRADIENT:
        return None
    if op.type in SHOULD_NOT_DO_GRADIENT:
        raise GradientError(f"op {op_label(op)}: Caffe2 does not differentiate {op.type}, and a "
                            "gradient flows into it", hint="the loss should not depend on its output")
    maker = MAKERS.get(op.type)
    if maker is None:
        raise GradientError(f"op {op_label(op)}: no gradient maker is known for op type "
                            f"'{op.type}', and a gradient flows into it",
                            hint="Caffe2 may lack one too; cut the path with StopGradient")
    return maker


__all__ = ["gradient_for_op", "has_gradient_maker", "NO_GRADIENT", "SHOULD_NOT_DO_GRADIENT", "SINGLE_OP_GRADIENTS"]
