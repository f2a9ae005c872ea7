"""The op registry: the op types placer promises, each with inference, costs and a kernel."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placer.errors import ShapeError
from placer.ops import registry
from placer.ops.registry import OpDef, register
from placer.types import Args, TensorType

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


@pytest.mark.parametrize("statement", ["import placer.ops.registry as registry",
                                       "from placer.ops import registry",
                                       "from placer.ops.registry import get, all_types, copy_types"])
def test_importing_only_the_registry_fills_it(statement):
    """The registry does not import the families: the package ``placer.ops`` does, and any
    import of the registry runs it first, so a fresh interpreter that imports nothing else
    sees every op (the same types and copies as this process)."""
    root = Path(__file__).resolve().parent.parent
    script = (f"{statement}\nimport placer.ops.registry as r\n"
              "print(len(r.all_types()), len(r.copy_types()), r.get('Conv') is not None)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         cwd=root, check=True).stdout.split()
    assert out == [str(len(registry.all_types())), str(len(registry.copy_types())), "True"]


def test_every_op_that_moves_one_blob_between_devices_is_a_copy_type():
    """``copy_types()`` is read from the registry's ``is_copy`` marks: an op registered with
    a transfer rule that takes one data blob and makes the same blob (a copy) but left
    unmarked fails here, as does a marked op that is no such copy. (CloneCommonWorld also
    moves one input to the host, but its input is a common world, not data.)"""
    x = TensorType((2, 3), "float32")
    moves_one = set()
    for op_type in registry.all_types():
        opdef = registry.get(op_type)
        if opdef.transfer is None or not opdef.min_inputs == opdef.max_inputs == 1:
            continue
        try:
            same = list(opdef.infer([x], Args({}))) == [x]
        except ShapeError:
            same = False
        if same:
            moves_one.add(op_type)
    copies = registry.copy_types()
    assert copies == moves_one
    # Caffe2's copies between devices (InjectCrossDeviceCopies writes the first three)
    assert {"CopyCPUToGPU", "CopyGPUToCPU", "Copy", "EnsureCPUOutput", "CopyFromCPUInput"} <= copies
    assert not copies & {"Alias", "StopGradient", "CloneCommonWorld", "NCCLAllreduce", "SendTensor"}
