"""Op family 'copy': identity ops, and the ops that move a blob between devices.

The executor moves data between devices for CopyCPUToGPU, CopyGPUToCPU, EnsureCPUOutput
and Copy (see runtime/executor.py); the registry kernels here are plain identity copies
(an array's own ``.copy()``, so a host array stays on the host and a device array on
its device whatever ``xp`` is). Alias returns its input itself: in Caffe2 the output
shares the input's memory, so it moves no bytes.

Where outputs live (as in Caffe2): CopyGPUToCPU and EnsureCPUOutput write a CPU blob
even when the op is placed on a GPU; CopyCPUToGPU reads a CPU blob and writes a GPU one.
"""
from __future__ import annotations

from typing import Sequence

from placer.ops.registry import OpDef, movement_cost, register
from placer.types import Args, OpFeatures, TensorType


def infer_identity(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    return [inputs[0]]


def kernel_copy(xp, inputs, args: Args) -> tuple:
    return (inputs[0].copy(),)


def kernel_alias(xp, inputs, args: Args) -> tuple:
    return (inputs[0],)


def alias_cost(inputs, outputs, args) -> OpFeatures:
    """An alias shares memory: no bytes move."""
    return OpFeatures()


_DOCS = {
    "Copy": "Copy a blob on the op's device.",
    "StopGradient": "Identity in the forward pass (blocks gradients in training nets).",
    "EnsureCPUOutput": "Identity whose output lives on the CPU (a device copy when the input "
                       "is on a GPU).",
    "CopyCPUToGPU": "Host-to-device copy: CPU input, GPU output.",
    "CopyGPUToCPU": "Device-to-host copy: GPU input, output lives on the CPU.",
    "CopyFromCPUInput": "Copy a CPU input onto the op's device.",
}

for _type, _doc in _DOCS.items():
    register(OpDef(_type, infer_identity, kernel_copy, movement_cost,
                   min_inputs=1, max_inputs=1, doc=_doc))
register(OpDef("Alias", infer_identity, kernel_alias, alias_cost, min_inputs=1, max_inputs=1, launches=0,
               doc="Output shares the input's memory."))
