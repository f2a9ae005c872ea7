"""The operator registry: one ``OpDef`` per Caffe2 op type.

An entry holds
- ``infer(inputs, args) -> list[TensorType]``: output types from input types (a
  ``ShapeError`` naming the op, the blobs and the shapes when they do not fit);
- ``cost(inputs, outputs, args) -> OpFeatures``: flops, MACs, bytes read/written
  (``param_bytes`` is filled in by ``shapes.infer``, which knows which inputs are
  parameters); ``default_cost`` when omitted;
- ``kernel(xp, inputs, args) -> tuple``: one array-module-generic kernel that runs on
  numpy and cupy unchanged (``xp`` is the module); None until a kernel exists;
- ``devices``: the device kinds placer has kernels for ("cpu", "gpu");
- ``caffe2_devices``: the device kinds real Caffe2 (torch 1.8.1) has kernels for, where
  that differs from ``devices`` (None: the same). A placed net must run in the Caffe2 the
  user deploys, so the planner keeps an op to these by default; ``placer plan
  --allow-gpu-only-in-placer`` lifts it for placer's own runtime (``caffe2_kinds``);
- ``host_kernel``: its kernel computes on the host with numpy wherever it is placed (NMS and
  proposal selection are sequential); on a GPU it reads its inputs back and copies its
  outputs over. The cost model then prices it on a GPU at the host's time (the read back and
  the copy of its outputs, small beside it, are not added);
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
  device arrays (tests/cupy_standin.py) and hold the figure to that count;
- ``scratch``: the temporaries its kernel allocates beyond its inputs and outputs, for the
  memory pre-check of ``placer run`` / ``profile`` (``runtime.footprint``): a number,
  bytes per byte of its largest output, or a function ``(inputs, outputs, args) -> bytes``;
  None takes ``DEFAULT_SCRATCH_FACTOR`` (an op that moves data between devices: 0).

Adding an op is one ``register(OpDef(...))`` call in the module of its family
(``placer/ops/<family>.py``); ``placer/ops/__init__.py`` imports the families.

An op that moves data between devices (the copies; later the collectives) also has a
``transfer``: where it reads and writes relative to the device it is placed on, and the
kernel that moves the bytes (``Transfer``); None for every op that computes on one device.
The copies among them (one blob in, the same blob out on another device: CopyCPUToGPU,
CopyGPUToCPU, Copy, EnsureCPUOutput, CopyFromCPUInput) are also marked ``is_copy``, and
``copy_types()`` is the one list of them every other module reads.
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
ScratchFn = Callable[[Sequence[TensorType], Sequence[TensorType], Args], float]

# Kernel temporaries per byte of the largest output, for an entry that does not declare
# its own: above the most measured (tracemalloc's peak during the numpy kernel less its
# outputs, float32): Conv 3x3 2.2, MaxPool 3x3/2 2.1, Logit 2.0, Elu/Softplus/Rsqrt 1.0,
# FC 0.07, Relu/Sigmoid/Add/Sum 0. The output, not the largest input, is the unit: a
# kernel's temporaries are shaped like what it computes (an FC from a 4 TB input to a
# 160 GB output builds none of the input's size; a 7x7/2 Conv of 3 channels builds 7x its
# input, 1.3x its output).
DEFAULT_SCRATCH_FACTOR = 3.0


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


MoveFn = Callable[[Any, Sequence[Any], Args], tuple]

# Where a transfer op reads its inputs / writes its outputs (``Transfer.reads`` / ``.writes``).
HOST = "host"              # the host CPU, wherever the op is placed
PLACED = "placed"          # the device the op is placed on (its device_option)
ANYWHERE = "anywhere"      # reads only: wherever the input already is
LIKE_INPUT = "like-input"  # writes only: output i on the device input i was read on


@dataclass(frozen=True)
class Transfer:
    """How an op that moves data between devices runs: the rule and the kernel.

    ``reads`` says on which device every input must be, ``writes`` on which device every
    output is made, both relative to the device the op is placed on (``HOST``, ``PLACED``,
    ``ANYWHERE`` for reads, ``LIKE_INPUT`` for writes). The executor resolves the rule per
    run, checks each input against it (a blob elsewhere is an error naming the op, the
    blob and both devices) and hands the kernel the device objects themselves:

        move(transfers, inputs, args) -> outputs

    ``transfers.sources[i]`` is the device input i is read on, ``transfers.targets[j]``
    the device output j must end up on, ``transfers.host`` the host CPU, and
    ``transfers.copy(array, source, target)`` the one way a kernel moves an array: a host
    copy, host->GPU or GPU->host through pinned memory, or GPU->GPU as a peer copy where
    the GPUs reach each other, else staged through the host (runtime/devices.py). The
    executor times the op on the device it is placed on and records the bytes of every
    ``copy`` per link (source -> target), so a kernel never counts or times anything.

    Caffe2's copies (ops/copy.py):

        op                 reads      writes     placed on (as Caffe2 writes it)
        CopyCPUToGPU       HOST       PLACED     the destination GPU
        CopyGPUToCPU       PLACED     HOST       the source GPU
        Copy               ANYWHERE   PLACED     the destination device (GPU -> GPU too)
        EnsureCPUOutput    ANYWHERE   HOST       any
        CopyFromCPUInput   HOST       PLACED     any

    A collective over several devices is registered the same way: NCCLAllreduce over
    ``gpu_0/g .. gpu_3/g`` (input i on GPU i, output i in place on the same GPU) is
    ``Transfer(reads=ANYWHERE, writes=LIKE_INPUT, move=allreduce)``: its inputs are checked
    to exist and its ``move`` sees four source devices and four targets. The collectives
    (ops/collective.py) move bytes along a ring through ``transfers.copy``, so each link's
    bytes are counted; on real GPUs they call NCCL on the devices' streams instead and note
    the bytes NCCL moves (``transfers.note``). ``like_input_from`` shifts LIKE_INPUT for ops
    whose first inputs are not data: Gloo's ``Allreduce([cw] + blobs) -> blobs`` writes
    output j where input j + 1 is (``like_input_from=1``).
    """

    reads: str
    writes: str
    move: MoveFn
    like_input_from: int = 0


@dataclass(frozen=True)
class OpDef:
    type: str
    infer: InferFn
    kernel: KernelFn | None = None
    cost: CostFn = default_cost
    transfer: Transfer | None = None
    devices: frozenset = field(default_factory=lambda: frozenset({"cpu", "gpu"}))
    caffe2_devices: frozenset | None = None  # where real Caffe2 has a kernel; None: as devices
    host_kernel: bool = False   # its kernel computes on the host even when placed on a GPU
    min_inputs: int = 0
    max_inputs: int | None = None
    doc: str = ""
    host_inputs: tuple[int, ...] = ()
    inplace: tuple[tuple[int, int], ...] = ()
    launches: int | LaunchFn = 1
    is_copy: bool = False       # moves its one input, unchanged, to another device (copy_types)
    scratch: float | ScratchFn | None = None

    def caffe2_kinds(self) -> frozenset:
        """The device kinds real Caffe2 has kernels for (``caffe2_devices``, else ``devices``)."""
        return self.caffe2_devices if self.caffe2_devices is not None else self.devices

    def scratch_bytes(self, inputs: Sequence[TensorType | None], outputs: Sequence[TensorType | None],
                      args: Mapping[str, Any]) -> int:
        """Bytes of temporaries one run of the kernel allocates (see ``scratch``)."""
        if callable(self.scratch):
            return int(self.scratch(inputs, outputs, args if isinstance(args, Args) else Args(args)))
        factor = self.scratch if self.scratch is not None else (
            0.0 if self.transfer is not None else DEFAULT_SCRATCH_FACTOR)
        return int(factor * max((t.nbytes for t in outputs if t is not None), default=0))

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


# Filled by the family modules. This module sits in the package ``placer.ops``, whose
# ``__init__`` imports every family, so any import of it (``from placer.ops import registry``,
# ``import placer.ops.registry``) returns with the registry full.
_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an entry; registering the same type twice is a programming error."""
    if opdef.type in _REGISTRY:
        raise ValueError(f"op type {opdef.type!r} registered twice")
    _REGISTRY[opdef.type] = opdef
    return opdef


def override(opdef: OpDef) -> OpDef | None:
    """Put ``opdef`` in place of its type's entry (or add it), in this process only, and
    return the entry it replaces. Only for a process that runs one worker of a net split
    over processes: the ops spanning processes get their cross-process kernels this way
    (``ops/p2p.py``)."""
    previous = _REGISTRY.get(opdef.type)
    _REGISTRY[opdef.type] = opdef
    return previous


def get(op_type: str) -> OpDef | None:
    """The entry for an op type, or None for an unknown type."""
    return _REGISTRY.get(op_type)


def copy_types() -> frozenset[str]:
    """The op types that copy one blob between devices (``OpDef.is_copy``)."""
    return frozenset(t for t, d in _REGISTRY.items() if d.is_copy)


def all_types() -> list[str]:
    return sorted(_REGISTRY)
