"""The gradient registry and what a gradient maker is written with: for a forward op, the
gradient op(s) Caffe2's gradient makers write.

Caffe2 keeps one ``GradientMaker`` per op type (``caffe2/core/operator_gradient.h`` and the
``Get*Gradient`` classes beside each operator). A maker sees the forward ``OperatorDef`` and
the gradient of each of its outputs (a blob name, a ``GradientSlice`` of indices and values,
or None) and answers with gradient ops and the gradient of each input. ``register`` records
a maker in ``MAKERS``; the makers are written with the helpers the C++ makers use
(``MakerContext``):

- ``I(i)`` / ``O(i)``: the forward op's input / output names;
- ``GO(i)``: the (dense) gradient of output i -- an error when it is sparse or missing;
- ``GI(i)``: registers and returns ``<input>_grad``; ``GI_V(i)`` / ``GI_I(i)`` the values /
  indices of a sparse gradient (``<input>_grad_values`` / ``_indices``);
- ``set_dense(i, name)`` / ``set_sparse(i, indices, values)``: an input's gradient is an
  existing blob (``Sum`` passes its output gradient to every input, ``Gather`` passes a
  GradientSlice of its indices and the output gradient).

The makers themselves are in ``gradients.py`` (one-op makers, as data) and
``gradient_makers.py`` (the others); ``gradients.gradient_for_op`` looks them up.
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



def op_label(op) -> str:
    return f"'{op.name}' ({op.type})" if op.name else f"{op.type} -> {', '.join(op.output) or '-'}"


def _arity_hint(op) -> str:
    if op.type == "SpatialBN":
        return "a SpatialBN trains with 5 outputs (is_test 0): convert the net in the train phase"
    if op.type == "Dropout":
        return "a training Dropout writes its mask as a second output (is_test 0)"
    return "check the op's inputs and outputs"


__all__ = ["GradientSlice", "GradientError", "MakerContext", "make_op", "MakeFn", "GradientMaker", "MAKERS",
           "register", "op_label"]
