"""Mixed precision for ``placer train-net --precision``: the forward net at a half dtype,
its parameters as half copies of float32 masters, the loss in float32.

Caffe2 trained in float16 the way its ImageNet trainer does
(caffe2/python/examples/imagenet_trainer.py, torch 1.8.1):

- the weights and biases come from ``PseudoFP16Initializer``
  (caffe2/python/modeling/initializers.py): the init net fills a float32 master
  ``<p>_fp32`` and casts it, ``FloatToHalf(<p>_fp32) -> <p>``; the parameter's
  ``blob_copy`` names the master;
- the data arrives in float16 and the convolutions, FCs, pools and activations run on it;
- the prediction is cast back before the loss: ``HalfToFloat(pred) -> pred_fp32``, and
  ``SoftmaxWithLoss`` runs in float32;
- ``--float16_compute`` then trains with ``optimizer.build_fp16_sgd`` (float16 momentum,
  ``FP16MomentumSGDUpdate`` on the half weights), otherwise with ``add_weight_decay`` and
  ``optimizer.build_multi_precision_sgd`` (the gradient cast up, ``MomentumSGDUpdate`` on the
  float32 master, the master cast down).

``rewrite_forward`` does the same to any forward net: a parameter every reader of which is
an op in ``HALF_OPS`` (and whose gradient is dense: Caffe2's fp16 optimizers refuse sparse
gradients) becomes a pseudo-fp16 parameter; the convolutions and matrix products
(``HALF_COMPUTE``) and the other ``HALF_OPS`` that read a half blob read their float
inputs at the half dtype (a ``FloatToHalf(x) -> x_fp16`` before the first such reader of a
float32 blob) and write half outputs; every other op reads float32 (``HalfToFloat(x) ->
x_fp32`` before the first one that reads a half blob), and so does an op of ``HALF_OPS``
that reads a parameter kept in float32 (a ``Gather`` of a table with sparse gradients:
its gradient is sparse, and a cast cannot pass one on). A cast is made once per value of its
source blob and reused until the blob is written again. The data input is cast inside the
train net (a user's reader delivers float32), the one change from the trainer's layout,
where the reader wrote float16.

``HALF_OPS`` are the op types Caffe2 1.8.1 runs on float16 tensors on CUDA (the cuDNN conv
and pool ops, ``fully_connected_op_gpu.cc`` and ``matmul``/``batch_matmul`` with
``at::Half``, the elementwise ops of ``elementwise_ops_gpu``/``relu_op.cu`` and friends, the
tensor-layout ops, which move bytes of any type), each with the positions of its float
inputs and outputs (Reshape's shape input and old-shape output, Dropout's mask and Concat's
split info stay as they are). Losses, normalisation, embedding lookups and every op not
listed run in float32: SpatialBN too (cuDNN takes float16 X with float32 scale and bias,
which this pass does not write; a cast before and after each SpatialBN is what it writes).

bfloat16 (``amp-bf16``) writes the same nets with the placer-only casts
``FloatToBFloat16`` / ``BFloat16ToFloat`` (placer/ops/half.py): Caffe2 has no bfloat16, so
it cannot load such nets; placer plans and runs them.

Loss scaling, static or dynamic, is ``training/loss_scaling.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.training.gradient_registry import make_op

PRECISIONS = ("fp32", "fp16", "amp-fp16", "amp-bf16")

ALL = None  # every input (or output) position

# op type -> (its float input positions, its float output positions) at the half dtype
HALF_OPS: dict[str, tuple] = {
    "FC": (ALL, ALL), "FCTransposed": (ALL, ALL), "MatMul": (ALL, ALL), "BatchMatMul": (ALL, ALL),
    "Conv": (ALL, ALL), "ConvTranspose": (ALL, ALL),
    "MaxPool": (ALL, ALL), "AveragePool": (ALL, ALL),
    "Relu": (ALL, ALL), "LeakyRelu": (ALL, ALL), "Sigmoid": (ALL, ALL), "Tanh": (ALL, ALL),
    "Gelu": (ALL, ALL), "Add": (ALL, ALL), "Sub": (ALL, ALL), "Mul": (ALL, ALL), "Sum": (ALL, ALL),
    "Scale": (ALL, ALL), "Dropout": ((0,), (0,)), "LRN": ((0,), (0,)),
    "Concat": (ALL, (0,)), "DepthConcat": (ALL, (0,)), "Split": ((0,), ALL),
    "Reshape": ((0,), (0,)), "Flatten": (ALL, ALL), "FlattenToVec": (ALL, ALL),
    "Transpose": (ALL, ALL), "Squeeze": (ALL, ALL), "ExpandDims": (ALL, ALL),
    "Copy": (ALL, ALL), "Alias": (ALL, ALL), "Gather": ((0,), ALL), "BatchGather": ((0,), ALL),
}


# The ops that run at the half dtype whatever their inputs (float32 inputs are cast down):
# the GEMM- and convolution-shaped work tensor cores do. The other HALF_OPS follow their
# inputs: half when one of them is half, float32 otherwise (autocast's "promote" rule).
HALF_COMPUTE = frozenset({"FC", "FCTransposed", "MatMul", "BatchMatMul", "Conv", "ConvTranspose"})


class PrecisionError(PlacerError):
    """A net that cannot be trained at the asked precision."""


@dataclass(frozen=True)
class Casts:
    """The cast op types and blob suffixes of one half dtype."""

    down: str
    up: str
    suffix: str
    dtype: str

    @staticmethod
    def of(precision: str) -> "Casts":
        if precision == "amp-bf16":
            return Casts("FloatToBFloat16", "BFloat16ToFloat", "_bf16", "bfloat16")
        return Casts("FloatToHalf", "HalfToFloat", "_fp16", "float16")


@dataclass
class HalfForward:
    """What ``rewrite_forward`` did: the half parameters and their masters, the casts."""

    masters: dict[str, str] = field(default_factory=dict)   # half parameter -> float32 master
    casts_down: int = 0
    casts_up: int = 0
    float_ops: dict[str, int] = field(default_factory=dict)  # op type -> count kept in float32


def _positions(spec, n: int) -> range | tuple:
    return range(n) if spec is ALL else tuple(i for i in spec if i < n)


def rewrite_forward(train: pb.NetDef, init: pb.NetDef, params: Iterable[str], dense: set[str],
                    casts: Casts, float_blobs: set[str]) -> HalfForward:
    """Put the forward ops of ``train`` (all its ops) at the half dtype, in place.

    ``params``: the parameters, ``dense`` those with dense gradients; ``float_blobs``: the
    blobs that hold float32 values in the fp32 net (only they are ever cast)."""
    done = HalfForward()
    params = list(params)
    readers: dict[str, list[tuple[str, int]]] = {}
    for op in train.op:
        for pos, blob in enumerate(op.input):
            readers.setdefault(blob, []).append((op.type, pos))

    def read_at_half(op_type: str, pos: int) -> bool:
        spec = HALF_OPS.get(op_type)
        return spec is not None and (spec[0] is ALL or pos in spec[0])

    half_params = [p for p in params if p in dense and p in float_blobs and readers.get(p)
                   and all(read_at_half(t, i) for t, i in readers[p])]
    _pseudo_fp16(init, half_params, casts, done)

    half = set(half_params)        # blobs now holding half values
    copies: dict[str, str] = {}    # blob -> its cast (the other dtype), while the blob is unchanged
    ops = list(train.op)
    del train.op[:]
    kept = set(params) - set(half_params)   # parameters that stay float32
    for op in ops:
        spec = HALF_OPS.get(op.type)
        if spec is not None and any(op.input[i] in kept and op.input[i] in float_blobs
                                    for i in _positions(spec[0], len(op.input))):
            spec = None     # it reads a float32 parameter (a table with sparse gradients): float32
        if spec is not None and op.type not in HALF_COMPUTE and not any(
                op.input[i] in half for i in _positions(spec[0], len(op.input))):
            spec = None     # an elementwise or layout op on float32 values only stays float32
        if spec is not None:
            for pos in _positions(spec[0], len(op.input)):
                blob = op.input[pos]
                if blob in float_blobs and blob not in half:
                    op.input[pos] = _cast(train, copies, blob, blob + casts.suffix, casts.down, done)
            outs = set(_positions(spec[1], len(op.output)))
            for pos, blob in enumerate(op.output):
                copies.pop(blob, None)
                if pos in outs and blob in float_blobs:
                    half.add(blob)
                else:
                    half.discard(blob)
        else:
            if any(b in half for b in op.input):
                done.float_ops[op.type] = done.float_ops.get(op.type, 0) + 1
            for pos, blob in enumerate(op.input):
                if blob in half:
                    op.input[pos] = _cast(train, copies, blob, blob + "_fp32", casts.up, done)
            for blob in op.output:
                copies.pop(blob, None)
                half.discard(blob)
        train.op.append(op)
    return done


def _cast(train, copies: dict, blob: str, name: str, op_type: str, done: HalfForward) -> str:
    if blob not in copies:
        train.op.append(make_op(op_type, [blob], [name]))
        copies[blob] = name
        if op_type in ("FloatToHalf", "FloatToBFloat16"):
            done.casts_down += 1
        else:
            done.casts_up += 1
    return copies[blob]


def _pseudo_fp16(init: pb.NetDef, half_params: list[str], casts: Casts, done: HalfForward) -> None:
    """``PseudoFP16Initializer``: fill the float32 master ``<p>_fp32``, cast it to ``<p>``."""
    wanted = set(half_params)
    ops = list(init.op)
    del init.op[:]
    for op in ops:
        outs = [b for b in op.output if b in wanted]
        if outs:
            if len(op.output) != 1:
                raise PrecisionError(f"init net: op {op.type} fills {len(op.output)} blobs at once; "
                                     f"a pseudo-fp16 parameter ({outs[0]}) needs a fill of its own")
            param = op.output[0]
            master = param + "_fp32"
            op.output[0] = master
            init.op.append(op)
            init.op.append(make_op(casts.down, [master], [param]))
            done.masters[param] = master
            wanted.discard(param)
        else:
            init.op.append(op)
    if wanted:
        raise PrecisionError(f"init net: no op fills parameter {sorted(wanted)[0]}")

