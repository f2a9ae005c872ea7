"""The shared types of placer: small dataclasses with units in their names.

Data flows one way (see DESIGN.md):
``Net`` (formats) -> ``TypedNet`` (shapes) -> cost DataFrame (costs) -> ``Plan``
(partition) -> placed NetDef (rewrite) -> ``RunRecord`` (runtime).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from placer.errors import ArgumentError, excerpt

# Caffe2 TensorProto.DataType numbers <-> numpy dtype names (PROTO_FACTS.md).
DATA_TYPE_TO_DTYPE = {
    1: "float32", 2: "int32", 3: "uint8", 4: "object", 5: "bool", 6: "uint8", 7: "int8",
    8: "uint16", 9: "int16", 10: "int64", 12: "float16", 13: "float64",
}
DTYPE_TO_DATA_TYPE = {
    "float32": 1, "int32": 2, "object": 4, "bool": 5, "uint8": 6, "int8": 7, "uint16": 8,
    "int16": 9, "int64": 10, "float16": 12, "float64": 13,
}


# dtypes numpy does not name: a Python object handle; bfloat16 (placer's amp-bf16 nets,
# held at run time as uint16 bits: ops/half.py)
_ITEMSIZE = {"object": 8, "bfloat16": 2}


@dataclass(frozen=True)
class TensorType:
    """Shape and numpy dtype name of a blob. ``shape`` is a tuple of ints (no unknown dims).

    ``values`` holds the flat values of a small integer tensor when inference knows them
    from shapes alone (Concat's split_info, Reshape's old shape), so that an op that
    takes its sizes from such a tensor (Split, Reshape: the gradients of Concat and
    Reshape) still gets a shape. It is not part of the type: two TensorTypes that differ
    only in ``values`` compare equal.

    ``bound`` marks a blob whose size depends on the data (the proposals of
    GenerateProposals, the detections of BoxWithNMSLimit, what is computed from them): the
    shape is then the upper bound its op's arguments allow, and ``bound`` says which
    (``"GenerateProposals post_nms_topN=1000"``). Costs and memory use the bound; the
    runtime allocates what it gets. Not part of the type either.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    values: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    bound: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.values is not None:
            object.__setattr__(self, "values", tuple(int(v) for v in self.values))

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        if self.dtype in _ITEMSIZE:
            return _ITEMSIZE[self.dtype]
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Device:
    """Where an op is placed: ``kind`` is "cpu" or "gpu"; ``index`` is the GPU number."""

    kind: str = "cpu"
    index: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu{self.index}"


CPU = Device("cpu", 0)
GPU0 = Device("gpu", 0)

_MISSING = object()


class Args(Mapping[str, Any]):
    """An op's arguments, decoded once at the edge.

    Values are python values: ``int``, ``float``, ``str`` (or ``bytes`` when not UTF-8),
    lists of those, or a NetDef message for nested nets (``n``/``nets``). Typed getters
    name the op and the argument when one is missing or of the wrong kind.

    ``op`` is the label of the op the arguments belong to (for messages); ``seed`` is the
    random seed a kernel with randomness must use. ``n_outputs`` is the number of outputs
    the op declares (None when unknown): Split without a ``split`` argument divides its
    input equally among them, so its inference and kernel need the count. ``inplace``
    holds the input positions the kernel may overwrite (see ``OpDef.inplace``); empty
    unless a runner that owns those arrays says so.
    """

    def __init__(self, values: Mapping[str, Any] | None = None, op: str = "?", seed: int = 0,
                 n_outputs: int | None = None, inplace: frozenset = frozenset()):
        self._values = dict(values or {})
        self.op = op
        self.seed = seed
        self.n_outputs = n_outputs
        self.inplace = inplace

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Args({self._values!r})"

    def _get(self, name: str, default: Any, kinds: tuple, what: str) -> Any:
        if name not in self._values or self._values[name] is None:
            if default is _MISSING:
                raise ArgumentError(f"op {self.op}: required argument '{name}' is missing",
                                    hint=f"add arg {{ name: \"{name}\" ... }} to the op")
            return default
        value = self._values[name]
        if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
            raise ArgumentError(f"op {self.op}: argument '{name}' should be {what}, found {value!r}")
        return value

    def int(self, name: str, default: Any = _MISSING) -> int:
        v = self._get(name, default, (int, float, np.integer), "an integer")
        return int(v) if v is not None else v

    def float(self, name: str, default: Any = _MISSING) -> float:
        v = self._get(name, default, (int, float, np.floating, np.integer), "a number")
        return float(v) if v is not None else v

    def bool(self, name: str, default: Any = _MISSING) -> bool:
        v = self._get(name, default, (int, bool, np.integer), "0 or 1")
        return bool(v) if v is not None else v

    def str(self, name: str, default: Any = _MISSING) -> str:
        v = self._get(name, default, (str, bytes), "a string")
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v

    def ints(self, name: str, default: Any = _MISSING) -> list[int]:
        v = self._get(name, default, (list, tuple, int), "a list of integers")
        if v is None:
            return v
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]

    def floats(self, name: str, default: Any = _MISSING) -> list[float]:
        v = self._get(name, default, (list, tuple, int, float), "a list of numbers")
        if v is None:
            return v
        return [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]

    def strs(self, name: str, default: Any = _MISSING) -> list[str]:
        v = self._get(name, default, (list, tuple), "a list of strings")
        if v is None:
            return v
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in v]

    def with_values(self, **values: Any) -> "Args":
        """A copy with some values replaced (used by converters and tests)."""
        return Args({**self._values, **values}, op=self.op, seed=self.seed, n_outputs=self.n_outputs)


def display_name(name: str | None, outputs: Sequence[str] | None) -> str:
    """How tables show an op (an ``Op``'s or a plan document's): its name, else its first
    output blob (Caffe2 ops are often unnamed), else ""."""
    return name or next(iter(outputs or ()), "") or ""


@dataclass
class Op:
    """One operator of a net, decoded from an OperatorDef.

    ``device`` is the placement the file carries (None when the op has no device_option
    and the net has no default); ``proto`` is the OperatorDef it came from, kept so that a
    rewrite changes nothing else.
    """

    index: int
    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: Args
    name: str = ""
    engine: str = ""
    device: Device | None = None
    control_inputs: tuple[str, ...] = ()
    proto: Any = None

    @property
    def label(self) -> str:
        """How messages name this op: its name, else its first output, else its index."""
        if self.name:
            return f"#{self.index} {self.type} '{self.name}'"
        if self.outputs:
            return f"#{self.index} {self.type} -> '{self.outputs[0]}'"
        return f"#{self.index} {self.type}"


@dataclass
class Net:
    """A predict net (and its init net) as placer sees it, whatever format it came from.

    - ``params``: blobs the init net creates, with their types (shape from the fill op's
      ``shape`` argument or the number of ``values``).
    - ``input_shapes``: shapes the file itself carries for external inputs (Caffe's
      input_shape / input_dim / Input layer); the user's ``--input`` adds to them.
    - ``proto`` / ``init_proto``: the Caffe2 NetDef messages (for a Caffe file, the ones
      converted from it), kept so that a placed net changes nothing else.
    - ``path``: the file the net was read from (for messages); ``source_format`` is
      "caffe2-text", "caffe2-binary", or "caffe-prototxt".
    - ``notes``: what the loader wants the user to know (Caffe: layers kept as unknown ops,
      fork fields skipped, an input whose shape the file leaves open and the --input for it).
    - ``shape_hints``: shapes the loader knows for outputs of ops placer has no entry for
      (the Caffe converter applies the layer's own rules to fork layers it keeps as ops); shape
      inference uses them for those outputs only, and the user's ``--input`` wins.
    """

    name: str
    ops: list[Op]
    external_inputs: list[str]
    external_outputs: list[str]
    params: dict[str, TensorType] = field(default_factory=dict)
    input_shapes: dict[str, TensorType] = field(default_factory=dict)
    proto: Any = None
    init_proto: Any = None
    path: str = ""
    init_path: str = ""
    source_format: str = ""
    default_device: Device | None = None
    notes: list[str] = field(default_factory=list)
    shape_hints: dict[str, TensorType] = field(default_factory=dict)

    @property
    def data_inputs(self) -> list[str]:
        """External inputs that are not parameters: what a run must be fed."""
        return [b for b in self.external_inputs if b not in self.params]


@dataclass(frozen=True)
class OpFeatures:
    """Cost features of one op at its shapes.

    Convention: ``macs`` counts multiply-accumulates of Conv/FC/MatMul-like ops (one
    multiply-add = 1 MAC); ``flops`` counts floating-point operations with a multiply-add
    as 2, plus elementwise work (the figure a roofline divides by peak FLOP/s).
    ``bytes_read`` is what the op actually reads (a gather reads only the rows it looks
    up, not the whole table); ``param_bytes`` is the part of the inputs that are parameters.
    ``known`` is False for an op type with no registry entry or with unknown shapes.
    """

    flops: float = 0.0
    macs: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    param_bytes: float = 0.0
    known: bool = True

    def __add__(self, other: "OpFeatures") -> "OpFeatures":
        return OpFeatures(self.flops + other.flops, self.macs + other.macs,
                          self.bytes_read + other.bytes_read,
                          self.bytes_written + other.bytes_written,
                          self.param_bytes + other.param_bytes, self.known and other.known)


@dataclass
class TypedNet:
    """A net with every blob's type inferred (``shapes.infer`` writes it).

    ``blobs`` maps every blob name to its type, or None where it cannot be known (an
    unknown op's outputs); ``features[i]`` are the cost features of ``net.ops[i]``;
    ``missing`` explains each unknown blob ("blob 'x': set --input x=..." style hints).
    ``op_inputs[i]`` / ``op_outputs[i]`` are the types ``net.ops[i]`` read and wrote, as
    they were at that op: a later in-place op may rewrite a blob name with another shape,
    so ``blobs`` (the last type of each name) can differ from them.
    """

    net: Net
    blobs: dict[str, TensorType | None]
    features: list[OpFeatures]
    unknown_ops: list[int] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    op_inputs: list[tuple[TensorType | None, ...]] = field(default_factory=list)
    op_outputs: list[tuple[TensorType | None, ...]] = field(default_factory=list)

    def type_of(self, blob: str) -> TensorType | None:
        return self.blobs.get(blob)


def shape_str(types: Sequence[TensorType | None]) -> str:
    """`1x64x56x56, ?` for messages and tables."""
    return ", ".join("?" if t is None else "x".join(map(str, t.shape)) or "scalar" for t in types)


@dataclass(frozen=True)
class OpRun:
    """One op of a run: where it ran and how long it took (median of ``samples_s``).

    ``count`` is how many times it was timed, ``mean_s``, ``std_s``, ``min_s`` and
    ``max_s`` are over all of them; ``samples_s`` is every time up to 256 runs, a uniform
    sample of that many beyond (``runtime.timing``).

    ``copy_bytes`` and ``copy_direction`` ("h2d", "d2h", "d2d", "h2h", or "mixed" for an op
    whose copies went several ways) describe the transfers a copy op made; ``links`` lists
    each of them as (source device, target device, bytes); 0, "" and () for every other op.
    ``device`` is the device the op is placed on and timed on.
    """

    index: int
    name: str
    type: str
    device: str
    time_s: float
    samples_s: tuple[float, ...] = ()
    copy_bytes: int = 0
    copy_direction: str = ""
    links: tuple[tuple[str, str, int], ...] = ()
    count: int = 0
    mean_s: float = 0.0
    std_s: float = 0.0
    min_s: float = 0.0
    max_s: float = 0.0


@dataclass(frozen=True)
class RunRecord:
    """What ``placer run`` measured; the report and the cost model read it.

    ``emulated`` is True when a GPU was emulated on the CPU: its times are CPU times
    (``timing_labels`` maps each device name to how its times must be read).
    ``peak_bytes`` is the peak of live blob bytes per device over the op sequence.
    ``conv_engines`` counts the convolution ops (Conv, ConvTranspose, ConvGradient) by the
    engine that ran them: "cudnn", "matmul" (the decomposition on a GPU), "numpy".
    """

    net_name: str
    devices: tuple[str, ...]
    ops: tuple[OpRun, ...]
    peak_bytes: dict[str, int]
    emulated: bool
    iterations: int
    warmup: int
    timing_labels: dict[str, str] = field(default_factory=dict)
    conv_engines: dict[str, int] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(o.time_s for o in self.ops)

    def copy_bytes(self, direction: str | None = None) -> int:
        return sum(o.copy_bytes for o in self.ops if direction in (None, o.copy_direction))

    def time_by_device_s(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for o in self.ops:
            out[o.device] = out.get(o.device, 0.0) + o.time_s
        return out

    def link_bytes(self) -> dict[str, int]:
        """Bytes copied per link and direction, keyed "source->target" ("cpu->cuda:1")."""
        out: dict[str, int] = {}
        for o in self.ops:
            for src, dst, nbytes in o.links:
                out[f"{src}->{dst}"] = out.get(f"{src}->{dst}", 0) + nbytes
        return out


# --- plans (partition) -------------------------------------------------------------


@dataclass(frozen=True)
class PlanCost:
    """Predicted time of a placement under the serial objective, in seconds.

    ``compute_s`` sums op times on their devices, ``copy_s`` the PCIe copies. Records add
    up (``a + b``), so a plan's total is a sum of parts, never a loop of loose floats.
    """

    compute_s: float = 0.0
    copy_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.copy_s

    def __add__(self, other: "PlanCost") -> "PlanCost":
        return PlanCost(self.compute_s + other.compute_s, self.copy_s + other.copy_s)


@dataclass(frozen=True)
class PlanCopy:
    """One copy a plan needs: ``tensor`` moved from device ``src`` to device ``dst`` once
    (device names, e.g. "cpu", "cuda:1"; ``src_kind``/``dst_kind`` are "cpu" or "gpu").

    ``producer`` is the op index (-1: fed from the host); ``consumers`` are the ops on
    ``dst`` that read the copy (-1 stands for the host reading an external output).
    """

    tensor: str
    src: str
    dst: str
    nbytes: float
    time_s: float
    producer: int
    consumers: tuple[int, ...] = ()
    src_kind: str = "cpu"
    dst_kind: str = "gpu"

    @property
    def direction(self) -> str:
        """"h2d" (host to GPU), "d2h", "d2d" (GPU to GPU) or "h2h" (host to host)."""
        return {("cpu", "gpu"): "h2d", ("gpu", "cpu"): "d2h", ("gpu", "gpu"): "d2d"}.get(
            (self.src_kind, self.dst_kind), "h2h")


@dataclass
class Plan:
    """A placement of every op of a net over a machine's devices and what it costs.

    - ``placement``: int array, the device index of every op (``devices[placement[i]]``
      is its name; index 0 is the host CPU).
    - ``devices`` / ``device_kinds``: the machine's device names and kinds ("cpu"/"gpu").
    - ``copies``: every copy the placement implies (one per tensor per destination device).
    - ``cost``: the serial objective of this placement, recomputable from the cost graph.
    - ``objective``: what the method minimised, "serial" or "makespan";
      ``makespan_s`` and ``timeline`` come from the event simulator when it was run.
    - ``optimal``: proven optimal for ``objective`` (and the memory limits, if any);
      ``gap``: relative distance to the best proven lower bound, None when unknown.
    - ``memory_bytes``: per device, parameters there + peak live activations there;
      ``capacity_bytes``: per device, the usable limit the plan was made for (inf: none).
    - ``reasons``: op index -> short why ("cuda:0 14x faster than cpu", "pinned: no GPU kernel").
    - ``notes``: solver facts worth reporting (rounding resolution, MILP status).
    """

    placement: Any = field(repr=False)
    devices: tuple[str, ...]
    copies: list[PlanCopy] = field(repr=False)
    cost: PlanCost
    method: str
    device_kinds: tuple[str, ...] = ()
    objective: str = "serial"
    optimal: bool = False
    gap: float | None = None
    memory_bytes: Any = None
    capacity_bytes: Any = None
    makespan_s: float | None = None
    timeline: list | None = field(default=None, repr=False)
    reasons: dict[int, str] = field(default_factory=dict, repr=False)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.placement = np.asarray(self.placement, dtype=np.int64)
        k = len(self.devices)
        if not self.device_kinds:
            self.device_kinds = tuple("cpu" if d.endswith("cpu") else "gpu" for d in self.devices)
        self.memory_bytes = np.zeros(k) if self.memory_bytes is None else np.asarray(self.memory_bytes, float)
        self.capacity_bytes = (np.full(k, np.inf) if self.capacity_bytes is None
                               else np.asarray(self.capacity_bytes, float))

    @property
    def total_s(self) -> float:
        return self.cost.total_s

    def device_of(self, op_index: int) -> str:
        """The name of the device an op is placed on ("cpu", "cuda:1", ...)."""
        return self.devices[int(self.placement[op_index])]

    def kind_of(self, op_index: int) -> str:
        """"cpu" or "gpu" for one op."""
        return self.device_kinds[int(self.placement[op_index])]

    def ops_on(self, device: int | str) -> np.ndarray:
        d = self.devices.index(device) if isinstance(device, str) else int(device)
        return np.flatnonzero(self.placement == d)

    def copy_bytes(self, direction: str | None = None) -> float:
        return sum(c.nbytes for c in self.copies if direction in (None, c.direction))

    @property
    def gpu_memory_bytes(self) -> float:
        """The most memory any one GPU uses (one-GPU machines: that GPU's)."""
        gpu = [m for m, kind in zip(self.memory_bytes.tolist(), self.device_kinds) if kind == "gpu"]
        return max(gpu, default=0.0)


# The most elements a blob can have: Caffe2 counts them in int64, numpy in intp.
MAX_ELEMENTS = 2**63 - 1


def shape_problem(dims) -> str | None:
    """Why ``dims`` (unknown ones None) cannot be a blob's shape, or None when it can."""
    known = [int(d) for d in dims if d is not None]
    if any(d < 0 for d in known):
        return f"shape {shape_text(dims)} has a negative dimension"
    count = prod(known)
    if count > MAX_ELEMENTS:
        return (f"shape {shape_text(dims)} has {_count_text(count)} elements, more than int64 "
                "can count (2^63 - 1)")
    return None


def shape_text(dims, limit: int = 60) -> str:
    """``2x3x?``; past ``limit`` characters cut in its middle, with the rank added (a file
    can give a shape of any rank, a message quotes a few of its dimensions)."""
    text = "x".join("?" if d is None else str(d) for d in dims)
    return text if len(text) <= limit else f"{excerpt(text, limit)} (rank {len(dims)})"


def _count_text(n: int) -> str:
    """An element count, in floating point where it fits, else as a power of two."""
    try:
        return f"{float(n):.3g}"
    except OverflowError:  # more than 1.8e308: a shape of thousands of dimensions
        return f"about 2^{n.bit_length() - 1}"
