"""What a training run keeps: the loss of a train net, and the trained state as an init net.

- ``loss_blobs(net)``: the blobs a Caffe2 train net seeds its backward pass from. Caffe2's
  ``AddGradientOperators`` writes ``ConstantFill([loss]) -> <loss>_autogen_grad`` (value
  1.0, shaped like the loss) for each loss, so the seeds name the losses;
  ``data_parallel_model`` (and placer's data-parallel and sharded nets,
  ``placer.training.data_parallel``) seeds each device's loss as ``<p>/loss -> <p>/loss_grad``.
- ``trained_init_net(init, state)``: the init net with each blob it makes filled with its
  current value (the parameters after training, the optimizer state, the iteration
  counter), so that running it restores the state. One fill per blob, in the init net's
  order, with the device option of the op that made the blob (a placed init net stays
  placed), of the GivenTensor*Fill type for the blob's dtype (``FILL_OF_DTYPE``).
  ``CreateMutex`` is kept as it is: a mutex has no value. A float64 blob goes through the
  Argument's 32-bit ``floats``, as in any Caffe2 init net (GivenTensorDoubleFill reads
  them); other dtypes without a GivenTensor fill are an error naming the blob.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import save_netdef
from placer.formats.convert import set_float_values
from placer.types import Net

# numpy dtype name -> the Caffe2 fill that makes it from a ``values`` argument
FILL_OF_DTYPE = {
    "float32": "GivenTensorFill", "float64": "GivenTensorDoubleFill", "int32": "GivenTensorIntFill",
    "int64": "GivenTensorInt64Fill", "int16": "GivenTensorInt16Fill", "bool": "GivenTensorBoolFill",
    "uint8": "GivenTensorByteStringToUInt8Fill",
}
# Caffe2's Int8 fills make quantized weights, which no run changes (placer trains no Int8
# net), and an Int8 tensor has no float GivenTensor fill: written back as they were.
KEPT_AS_IS = {"CreateMutex", "Int8GivenTensorFill", "Int8GivenIntTensorFill"}
# the names of a loss seed: AddGradientOperators', then data_parallel_model's per device
SEED_SUFFIXES = ("_autogen_grad", "_grad")


def loss_blobs(net: Net) -> list[str]:
    """The losses a train net's backward pass starts from (its ConstantFill seeds)."""
    return [op.inputs[0] for op in net.ops
            if op.type == "ConstantFill" and len(op.inputs) == 1 and len(op.outputs) == 1
            and any(op.outputs[0] == op.inputs[0] + suffix for suffix in SEED_SUFFIXES)
            and op.args.get("value", 0.0) == 1.0]


def trained_init_net(init: pb.NetDef, state: Mapping[str, np.ndarray]) -> pb.NetDef:
    """``init`` with every blob it makes filled with ``state[blob]`` (host arrays)."""
    out = pb.NetDef()
    out.CopyFrom(init)
    del out.op[:]
    for op in init.op:
        if op.type in KEPT_AS_IS or _cast_still_holds(op, state):
            out.op.add().CopyFrom(op)
            continue
        for name in op.output:
            if name not in state:
                raise PlacerError(f"init net op {op.type} -> '{name}': the run holds no value for it",
                                  hint="run the init net before saving the state")
            for made in _fills(name, np.asarray(state[name])):
                fill = out.op.add()
                fill.CopyFrom(made)
                if op.HasField("device_option"):
                    fill.device_option.CopyFrom(op.device_option)
    return out


def _cast_still_holds(op, state: Mapping[str, Any]) -> bool:
    """A ``FloatToHalf(master) -> p`` of a mixed-precision init net whose trained ``p`` is
    still its trained master rounded (the update casts it so every step): kept, so the saved
    net makes ``p`` from the saved master as it did before."""
    if op.type != "FloatToHalf" or len(op.input) != 1 or len(op.output) != 1:
        return False
    src, dst = state.get(op.input[0]), state.get(op.output[0])
    if src is None or dst is None:
        return False
    src, dst = np.asarray(src), np.asarray(dst)
    return (src.dtype == np.float32 and dst.dtype == np.float16 and src.shape == dst.shape
            and np.array_equal(src.astype(np.float16).view(np.uint16), dst.view(np.uint16)))


def _fills(name: str, value: np.ndarray) -> list[pb.OperatorDef]:
    """The ops that make ``value`` as ``name``. Caffe2 1.8.1 has no float16 GivenTensor
    fill: a float16 blob (the half weights and momentum of a mixed-precision net) is its
    values as float32 (exact) cast back by FloatToHalf."""
    if value.dtype == np.float16:
        staged = f"{name}__float32_values"
        return [_fill(staged, value.astype(np.float32)),
                pb.OperatorDef(type="FloatToHalf", input=[staged], output=[name])]
    return [_fill(name, value)]


def _fill(name: str, value: np.ndarray) -> pb.OperatorDef:
    dtype = str(value.dtype)
    if dtype not in FILL_OF_DTYPE:
        raise PlacerError(f"state blob '{name}' has dtype {dtype}: no Caffe2 GivenTensor fill makes it",
                          hint="supported: " + ", ".join(FILL_OF_DTYPE))
    op = pb.OperatorDef(type=FILL_OF_DTYPE[dtype], output=[name])
    op.arg.add(name="shape").ints.extend(int(d) for d in value.shape)
    values = op.arg.add(name="values")
    flat = value.reshape(-1)
    if dtype == "uint8":
        values.strings.append(flat.tobytes())
    elif dtype.startswith("float"):
        set_float_values(values, flat)
    else:
        values.ints.extend(flat.astype(np.int64).tolist())
    return op


def save_trained_init(path: str | os.PathLike, init: pb.NetDef, state: Mapping[str, Any]) -> None:
    """Write ``trained_init_net`` atomically: binary for .pb, text otherwise."""
    save_netdef(trained_init_net(init, state), path)
