"""Op family 'copy': identity ops, and the ops that move a blob between devices.

The copies Caffe2 writes between devices (CopyCPUToGPU, CopyGPUToCPU, Copy,
EnsureCPUOutput, CopyFromCPUInput) are marked ``is_copy`` (``registry.copy_types()``
lists them) and carry a transfer rule (``registry.Transfer``): where
they read and write relative to the device they are placed on, and ``move_one``, which
moves the one input through ``transfers.copy`` (the executor counts its bytes per link and
times it). Their ``kernel`` stays a plain identity copy on one device (an array's own
``.copy()``, so a host array stays on the host and a device array on its device whatever
``xp`` is), for callers that time an op on one device. Alias returns its input itself: in
Caffe2 the output shares the input's memory, so it moves no bytes.

Where outputs live (as in Caffe2): CopyGPUToCPU and EnsureCPUOutput write a CPU blob
even when the op is placed on a GPU; CopyCPUToGPU reads a CPU blob and writes a GPU one;
Copy under a GPU's device option reads the blob wherever it is (another GPU: the GPU ->
GPU copy Caffe2's InjectCrossDeviceCopies writes, there being no CopyGPUToGPU op).
"""
from __future__ import annotations

from typing import Any, Sequence

from placer.ops.registry import ANYWHERE, HOST, PLACED, OpDef, Transfer, movement_cost, register
from placer.types import Args, OpFeatures, TensorType


def infer_identity(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    return [inputs[0]]


def kernel_copy(xp, inputs, args: Args) -> tuple:
    return (inputs[0].copy(),)


def kernel_alias(xp, inputs, args: Args) -> tuple:
    return (inputs[0],)


def move_one(transfers: Any, inputs, args: Args) -> tuple:
    """The one input, from the device it is read on to the device its output lives on."""
    return (transfers.copy(inputs[0], transfers.sources[0], transfers.targets[0]),)


def alias_cost(inputs, outputs, args) -> OpFeatures:
    """An alias shares memory: no bytes move."""
    return OpFeatures()


_DOCS = {
    "Copy": "Copy a blob onto the op's device, from wherever it is.",
    "StopGradient": "Identity in the forward pass (blocks gradients in training nets).",
    "EnsureCPUOutput": "Identity whose output lives on the CPU (a device copy when the input "
                       "is on a GPU).",
    "CopyCPUToGPU": "Host-to-device copy: CPU input, output on the op's GPU.",
    "CopyGPUToCPU": "Device-to-host copy: input on the op's GPU, output on the CPU.",
    "CopyFromCPUInput": "Copy a CPU input onto the op's device.",
}
# where the ops that move a blob between devices read and write (registry.Transfer)
_MOVES = {"Copy": Transfer(ANYWHERE, PLACED, move_one), "EnsureCPUOutput": Transfer(ANYWHERE, HOST, move_one),
          "CopyCPUToGPU": Transfer(HOST, PLACED, move_one), "CopyGPUToCPU": Transfer(PLACED, HOST, move_one),
          "CopyFromCPUInput": Transfer(HOST, PLACED, move_one)}

for _type, _doc in _DOCS.items():
    register(OpDef(_type, infer_identity, kernel_copy, movement_cost, transfer=_MOVES.get(_type),
                   min_inputs=1, max_inputs=1, doc=_doc, is_copy=_type in _MOVES))
register(OpDef("Alias", infer_identity, kernel_alias, alias_cost, min_inputs=1, max_inputs=1, launches=0,
               doc="Output shares the input's memory."))


def inserted_copy(source_kind: str, target_kind: str) -> str:
    """The copy op Caffe2's InjectCrossDeviceCopies writes from one device kind to another."""
    if source_kind == "cpu" and target_kind == "gpu":
        return "CopyCPUToGPU"
    if source_kind == "gpu" and target_kind == "cpu":
        return "CopyGPUToCPU"
    return "Copy"
