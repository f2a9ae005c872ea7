"""The operator registry: one ``OpDef`` per Caffe2 op type.

An entry holds
- ``infer(inputs, args) -> list[TensorType]``: output types from input types (a
  ``ShapeError`` naming the op, the blobs and the shapes when they do not fit);
- ``cost(inputs, outputs, args) -> OpFeatures``: flops, MACs, bytes read/written
  (``param_bytes`` is filled in by ``shapes.infer``, which knows which inputs are
  parameters); ``default_cost`` when omitted;
- ``kernel(xp, inputs, args) -> tuple``: one array-module-generic kernel that runs on
  numpy and cupy unchanged (``xp`` is the module); None until a kernel exists;
- ``devices``: the device kinds it has kernels for ("cpu", "gpu");
- ``host_inputs``: input positions Caffe2 reads from a CPU tensor whatever device the op
  runs on (the iteration counter of Adam and LearningRate): such an input must be on the
  host, and the kernel gets it as a numpy array even when ``xp`` is cupy;
- ``inplace``: (input, output) position pairs the kernel can update in place. When the op
  writes input i's blob as output j (same name) and the runner owns that array (no other
  blob and no caller's array shares its memory), the runner puts i in ``args.inplace``;
  the kernel may then overwrite input i and return it as output j instead of copying it
  (an optimizer update then touches only the rows it changes, not the whole table).
  Without it in ``args.inplace`` a kernel never writes into its inputs;
- ``launches``: how many kernels its GPU kernel launches, an int or a function
  ``(inputs, args) -> int`` when it depends on them (filter taps, input count, a flag).
  The cost model charges one launch overhead for each. It is counted, not guessed: the
  tests run every conformance case on a stand-in for cupy that counts the calls making
  device arrays (tests/cupy_standin.py) and hold the figure to that count.

Adding an op is one ``register(OpDef(...))`` call in the module of its family
(``placer/ops/<family>.py``); ``placer/ops/__init__.py`` imports the families.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from placer.errors import ShapeError
from placer.types import Args, OpFeatures, TensorType

InferFn = Callable[[Sequence[TensorType], Args], Sequence[TensorType]]
CostFn = Callable[[Sequence[TensorType], Sequence[TensorType], Args], OpFeatures]
KernelFn = Callable[[Any, Sequence[Any], Args], tuple]
LaunchFn = Callable[[Sequence[TensorType], Args], int]


def io_bytes(inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> tuple[float, float]:
    """Bytes read (all inputs) and written (all outputs)."""
    return float(sum(t.nbytes for t in inputs)), float(sum(t.nbytes for t in outputs))


def default_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType], args: Args) -> OpFeatures:
    """Elementwise-like: one flop per output element, every input read once."""
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(sum(t.size for t in outputs)), bytes_read=read, bytes_written=written)


def movement_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType], args: Args) -> OpFeatures:
    """Data movement only (reshape, concat, copy): no flops."""
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(bytes_read=read, bytes_written=written)


@dataclass(frozen=True)
class OpDef:
    type: str
    infer: InferFn
    kernel: KernelFn | None = None
    cost: CostFn = default_cost
    devices: frozenset = field(default_factory=lambda: frozenset({"cpu", "gpu"}))
    min_inputs: int = 0
    max_inputs: int | None = None
    doc: str = ""
    host_inputs: tuple[int, ...] = ()
    inplace: tuple[tuple[int, int], ...] = ()
    launches: int | LaunchFn = 1

    def launch_count(self, inputs: Sequence[TensorType], args: Mapping[str, Any]) -> int:
        """Kernel launches of one run of the GPU kernel on ``inputs`` (see ``launches``)."""
        if not callable(self.launches):
            return self.launches
        return int(self.launches(inputs, args if isinstance(args, Args) else Args(args)))

    def check_arity(self, n_inputs: int, label: str) -> None:
        if n_inputs < self.min_inputs or (self.max_inputs is not None and n_inputs > self.max_inputs):
            want = (f"{self.min_inputs}" if self.max_inputs == self.min_inputs
                    else f"{self.min_inputs}..{self.max_inputs if self.max_inputs is not None else 'n'}")
            raise ShapeError(f"op {label}: {self.type} takes {want} inputs, found {n_inputs}")


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an entry; registering the same type twice is a programming error."""
    if opdef.type in _REGISTRY:
        raise ValueError(f"op type {opdef.type!r} registered twice")
    _REGISTRY[opdef.type] = opdef
    return opdef


def get(op_type: str) -> OpDef | None:
    """The entry for an op type, or None for an unknown type."""
    import placer.ops  # noqa: F401  (imports every family so that the registry is full)
    return _REGISTRY.get(op_type)


def all_types() -> list[str]:
    import placer.ops  # noqa: F401
    return sorted(_REGISTRY)
