"""The gradient registry: for a forward op, the gradient op(s) Caffe2's gradient makers write.

Caffe2 keeps one ``GradientMaker`` per op type (``caffe2/core/operator_gradient.h`` and the
``Get*Gradient`` classes beside each operator). A maker sees the forward ``OperatorDef`` and
the gradient of each of its outputs (a blob name, a ``GradientSlice`` of indices and values,
or None) and answers with gradient ops and the gradient of each input. This module holds
the same makers as data, written with the helpers the C++ makers use:

- ``I(i)`` / ``O(i)``: the forward op's input / output names;
- ``GO(i)``: the (dense) gradient of output i -- an error when it is sparse or missing;
- ``GI(i)``: registers and returns ``<input>_grad``; ``GI_V(i)`` / ``GI_I(i)`` the values /
  indices of a sparse gradient (``<input>_grad_values`` / ``_indices``);
- ``set_dense(i, name)`` / ``set_sparse(i, indices, values)``: an input's gradient is an
  existing blob (``Sum`` passes its output gradient to every input, ``Gather`` passes a
  GradientSlice of its indices and the output gradient).

``gradient_for_op`` then does what ``caffe2::GetGradientForOp`` does around a maker: every
gradient op gets ``is_gradient_op``, and -- unless the maker turns it off -- a copy of the
forward op's ``device_option`` (when it has one), ``engine`` (when set) and arguments
(appended after the maker's own). The makers follow torch 1.8.1's Caffe2, checked op by op
against it (tests/test_training_gradients.py). ``backward.py`` plays them over a whole net.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Callable, Sequence

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.formats.convert import set_arg

# A sparse gradient: rows ``indices`` of the blob get ``values`` (Python Caffe2's GradientSlice).
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])


class GradientError(PlacerError):
    """A forward op whose gradient cannot be generated (as in Caffe2, or not known here)."""


# ---------------------------------------------------------------- the maker's view of an op

class MakerContext:
    """One forward op and its output gradients, with the helpers a gradient maker uses."""

    def __init__(self, op, g_output: Sequence):
        self.op = op
        self.g_output = list(g_output)
        # Per input: [dense, indices, values] names ("" when unset), as GradientWrapper.
        self._g_input = [["", "", ""] for _ in op.input]

    # names of the forward op
    def I(self, i: int) -> str:  # noqa: E743 (the C++ makers' name)
        self._check(i, len(self.op.input), "input")
        return self.op.input[i]

    def O(self, i: int) -> str:  # noqa: E743
        self._check(i, len(self.op.output), "output")
        return self.op.output[i]

    def _check(self, i: int, n: int, what: str) -> None:
        if not 0 <= i < n:
            raise GradientError(f"op {op_label(self.op)}: Caffe2's gradient of {self.op.type} "
                                f"needs {what} {i}, and the op has {n} {what}s",
                                hint=_arity_hint(self.op))

    # output gradients
    def grad_out(self, i: int):
        return self.g_output[i] if i < len(self.g_output) else None

    def GO(self, i: int) -> str:
        g = self.grad_out(i)
        if not isinstance(g, str) or not g:
            state = "sparse" if isinstance(g, GradientSlice) else "not provided"
            raise GradientError(f"op {op_label(self.op)}: the gradient of its output "
                                f"'{self.op.output[i]}' is {state}; Caffe2's {self.op.type} "
                                f"gradient needs it dense")
        return g

    # input gradients
    def GI(self, i: int) -> str:
        self._set(i, dense=f"{self.I(i)}_grad")
        return f"{self.I(i)}_grad"

    def GI_V(self, i: int) -> str:
        self._set(i, values=f"{self.I(i)}_grad_values")
        return f"{self.I(i)}_grad_values"

    def GI_I(self, i: int) -> str:
        self._set(i, indices=f"{self.I(i)}_grad_indices")
        return f"{self.I(i)}_grad_indices"

    def set_dense(self, i: int, name: str) -> None:
        self._set(i, dense=name)

    def set_sparse(self, i: int, indices: str, values: str) -> None:
        self._set(i, indices=indices, values=values)

    def _set(self, i: int, dense: str = "", indices: str = "", values: str = "") -> None:
        slot = self._g_input[i]
        if dense and (slot[1] or slot[2]) or (indices or values) and slot[0]:
            raise GradientError(f"op {op_label(self.op)}: input '{self.op.input[i]}' gets both a "
                                "dense and a sparse gradient")
        slot[0] = dense or slot[0]
        slot[1] = indices or slot[1]
        slot[2] = values or slot[2]

    def g_input(self) -> list:
        out = []
        for dense, indices, values in self._g_input:
            out.append(dense if dense else GradientSlice(indices, values)
                       if indices or values else None)
        return out

    # forward arguments
    def arg(self, name: str, default=None):
        for a in self.op.arg:
            if a.name == name:
                if a.HasField("i"):
                    return int(a.i)
                if a.HasField("f"):
                    return float(a.f)
                if a.HasField("s"):
                    return a.s.decode()
                return list(a.ints) or list(a.floats)
        return default

    def has_arg(self, name: str) -> bool:
        return any(a.name == name for a in self.op.arg)


def make_op(op_type: str, inputs: Sequence[str], outputs: Sequence[str], args=(), **kwargs):
    """An OperatorDef as ``CreateOperatorDef`` writes it (``name: ""``, arguments in order).

    ``args`` is a list of ``(name, value)`` (for names that are not Python identifiers or an
    order that matters); keyword arguments follow it.
    """
    proto = pb.OperatorDef(type=op_type, name="")
    proto.input.extend(inputs)
    proto.output.extend(outputs)
    for name, value in [*args, *kwargs.items()]:
        if value is not None:
            set_arg(proto.arg.add(name=name), value)
    return proto


# ---------------------------------------------------------------- the registry

MakeFn = Callable[[MakerContext], list]


@dataclass(frozen=True)
class GradientMaker:
    """How Caffe2 differentiates one op type: ``make`` writes the gradient ops; the flags are
    the maker's ``CopyDeviceOption`` / ``CopyEngine`` / ``CopyArguments``."""

    make: MakeFn
    copy_args: bool = True
    copy_engine: bool = True
    copy_device: bool = True


MAKERS: dict[str, GradientMaker] = {}

# Caffe2's NO_GRADIENT: the op passes no gradient to its inputs (and that is no error).
NO_GRADIENT = frozenset({
    "StopGradient", "ConstantFill", "Size", "EnsureCPUOutput", "GivenTensorFill",
    "GivenTensorIntFill", "GivenTensorInt64Fill", "GivenTensorBoolFill", "GivenTensorDoubleFill",
    "XavierFill", "MSRAFill", "GaussianFill", "UniformFill", "UniformIntFill", "RangeFill",
    "SparseLengthsSumFused8BitRowwise", "SparseLengthsWeightedSumFused8BitRowwise",
    "SparseLengthsMeanFused8BitRowwise", "Iter", "AtomicIter", "LearningRate", "CreateMutex",
})

# Caffe2's SHOULD_NOT_DO_GRADIENT: asking for the gradient is an error.
SHOULD_NOT_DO_GRADIENT = frozenset({
    "Accuracy", "Shape", "ResizeLike", "LengthsToSegmentIds", "LengthsToRanges", "ReplaceNaN",
    "ArgMax", "ArgMin", "LengthsToShape",
})


def register(op_types: str | Sequence[str], copy_args: bool = True, copy_engine: bool = True,
             copy_device: bool = True):
    """Decorator: ``fn(ctx) -> [OperatorDef]`` is the gradient maker of ``op_types``."""
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def wrap(fn: MakeFn) -> MakeFn:
        for name in names:
            if name in MAKERS:
                raise ValueError(f"gradient maker for {name!r} registered twice")
            MAKERS[name] = GradientMaker(fn, copy_args, copy_engine, copy_device)
        return fn
    return wrap


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
    "Elu": ("EluGradient", "O0 GO0", "GI0"),
    "Softplus": ("SoftplusGradient", "O0 GO0", "GI0"),
    "ThresholdedRelu": ("ThresholdedReluGradient", "O0 GO0", "GI0"),
    "Reciprocal": ("ReciprocalGradient", "O0 GO0", "GI0"),
    "Clip": ("ClipGradient", "O0 GO0", "GI0"),
    "Swish": ("SwishGradient", "I0 O0 GO0", "GI0"),
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
    import placer.training.gradient_makers  # noqa: F401  (registers the custom makers)
    return op_type in MAKERS or op_type in NO_GRADIENT


def _maker(op) -> GradientMaker | None:
    import placer.training.gradient_makers  # noqa: F401
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


def op_label(op) -> str:
    return f"'{op.name}' ({op.type})" if op.name else f"{op.type} -> {', '.join(op.output) or '-'}"


def _arity_hint(op) -> str:
    if op.type == "SpatialBN":
        return "a SpatialBN trains with 5 outputs (is_test 0): convert the net in the train phase"
    if op.type == "Dropout":
        return "a training Dropout writes its mask as a second output (is_test 0)"
    return "check the op's inputs and outputs"
