"""The op registry: the op types placer promises, each with inference, costs and a kernel."""
from __future__ import annotations

import pytest

from placer.ops import registry
from placer.ops.registry import OpDef, register

PROMISED = """Conv ConvTranspose FC Relu LeakyRelu PRelu Sigmoid Tanh Softmax MaxPool AveragePool
SpatialBN LRN Dropout Concat Split Sum Add Sub Mul Div Reshape Flatten FlattenToVec Transpose
Squeeze ExpandDims Slice MatMul BatchMatMul BatchGather Gather SparseLengthsSum SparseLengthsMean
SparseLengthsWeightedSum LengthsSum LengthsMean LengthsToSegmentIds Copy Alias StopGradient Cast
Scale Clip ChannelShuffle Accuracy LabelCrossEntropy SoftmaxWithLoss SigmoidCrossEntropyWithLogits
AveragedLoss CopyCPUToGPU CopyGPUToCPU EnsureCPUOutput ConstantFill GivenTensorFill
GivenTensorIntFill GivenTensorInt64Fill XavierFill MSRAFill GaussianFill UniformFill""".split()


@pytest.mark.parametrize("op_type", PROMISED)
def test_promised_op_is_registered_with_a_kernel(op_type):
    opdef = registry.get(op_type)
    assert opdef is not None, f"{op_type} is not registered"
    assert opdef.type == op_type and callable(opdef.infer) and callable(opdef.cost)
    assert opdef.kernel is not None, f"{op_type} has no kernel"
    assert opdef.devices <= {"cpu", "gpu"} and "cpu" in opdef.devices


def test_unknown_type_is_none_and_double_registration_is_refused():
    assert registry.get("NoSuchOp") is None
    with pytest.raises(ValueError, match="registered twice"):
        register(OpDef("Conv", infer=lambda i, a: i))
    assert registry.all_types() == sorted(registry.all_types()) and len(registry.all_types()) >= len(PROMISED)
