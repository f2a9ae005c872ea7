"""Memory a run or a profile needs, against what this machine has, decided before allocating.

numpy asks the kernel for an array's pages lazily: an allocation far beyond the machine's
memory either fails at once (numpy's ``MemoryError``: a traceback) or succeeds and gets the
process killed once the pages are written. So the commands that allocate (``placer run``,
``placer profile``) price the work from the inferred shapes first and refuse, naming both
figures, what does not fit.

What a run needs, in host memory (every blob when the GPU is emulated; with a real GPU
only the blobs of CPU ops, the fed inputs and the parameters the host keeps): the
parameters (the init net's fills) and the fed inputs, live throughout, plus the larger of

- the peak of the other blobs alive at once (the executor's copies of the fed inputs
  among them: it never works on the caller's arrays), each freed after its last reader (the
  executor's own rule, ``executor.peak_bytes``), with the temporaries of the kernel
  running at that moment (its registry entry's ``scratch``: a Logit of 1.76 GB builds
  3.5 GB of them), and
- when inputs are random, the largest one's float64 draw before its cast.

What the profiler needs is the larger of a whole run (it times ops in the running net)
and the worst single op: its inputs plus the larger of its outputs with its kernel's
temporaries and the temporaries of drawing its largest input.

What the machine has is ``placer.memory.available_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.errors import InputError
from placer.memory import available_bytes, format_bytes
from placer.ops import registry
from placer.runtime.executor import peak_bytes
from placer.types import Net, TensorType, TypedNet

# float64 draw (8 bytes) for every element of a random input, before the cast.
DRAW_BYTES_PER_ELEMENT = 8


@dataclass(frozen=True)
class Footprint:
    """Bytes a command holds at its peak: ``held`` parts live throughout, plus the largest
    of the ``phases`` (parts that are never alive together, e.g. the random draw before a
    run and the activations during it)."""

    held: tuple[tuple[str, int], ...]
    phases: tuple[tuple[str, int], ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self.held) + max((n for _, n in self.phases), default=0)

    def describe(self) -> str:
        held = " + ".join(f"{what} {format_bytes(n)}" for what, n in self.held if n) or "nothing held"
        phases = [f"{what} {format_bytes(n)}" for what, n in self.phases if n]
        if len(phases) > 1:
            return f"{held} + max({', '.join(phases)})"
        return " + ".join([held, *phases])


# ---------------------------------------------------------------- what a command needs

def run_footprint(typed: TypedNet, fed: list[str], random_inputs: bool,
                  host_only: set[int] | None = None) -> Footprint:
    """Peak host bytes of ``placer run`` over ``typed``; ``fed`` are the blobs fed from
    outside (held by the caller for the whole run; the executor works on copies of them,
    counted among the activations until their last reader). ``host_only`` (op indices)
    limits the activations counted to those ops' blobs (a real GPU holds the others); None
    counts every op (CPU or emulated GPU)."""
    net, blobs = typed.net, typed.blobs
    params = sum(_nbytes(blobs.get(b)) for b in net.params)
    inputs = sum(_nbytes(blobs.get(b)) for b in fed)
    counted = [op for op in net.ops if host_only is None or op.index in host_only]
    steps = [(op.inputs, op.outputs) for op in counted]
    sizes = {name: ("host", _nbytes(t)) for name, t in blobs.items() if t is not None}
    read = {b for ins, _ in steps for b in ins}
    copies = [b for b in fed if b in read]      # the executor's copy of each fed input
    scratch = [("host", scratch_bytes(typed, op)) for op in counted]
    frees = _last_uses(net, steps, keep=set(net.params))
    peak = peak_bytes(steps, sizes, [*net.params, *copies], frees, scratch).get("host", 0)
    draw = max((blobs[b].size * DRAW_BYTES_PER_ELEMENT for b in fed if blobs.get(b) is not None),
               default=0) if random_inputs else 0
    return Footprint((("parameters", params), ("inputs", inputs)),
                     (("peak activations", max(0, peak - params)), ("random draw", draw)))


def profile_footprint(typed: TypedNet) -> tuple[Footprint, str]:
    """Bytes ``placer profile`` needs, and what for (for ``require_memory``): the larger of
    the op that needs the most to be timed alone (its inputs, then the larger of its
    outputs with its kernel's temporaries and the float temporaries of drawing its largest
    input: a draw and its shift, before the cast) and a whole run of the net (in-network
    timing, ``run_footprint``)."""
    best, label = Footprint(()), ""
    for op, ins, outs in zip(typed.net.ops, typed.op_inputs, typed.op_outputs):
        need = Footprint((("inputs", sum(_nbytes(t) for t in ins)),),
                         (("outputs and temporaries", sum(_nbytes(t) for t in outs) + scratch_bytes(typed, op)),
                          ("random draw", 2 * max((_nbytes(t) for t in ins), default=0))))
        if need.total_bytes > best.total_bytes:
            best, label = need, f"timing op {op.label}"
    whole = run_footprint(typed, typed.net.data_inputs, random_inputs=True)
    if whole.total_bytes > best.total_bytes:
        best, label = whole, f"timing {typed.net.name or 'the net'} in a whole run"
    return best, label


def scratch_bytes(typed: TypedNet, op) -> int:
    """Bytes of temporaries ``op``'s kernel allocates (its entry's ``scratch``; 0 for an
    op without an entry or with an unknown input or output type)."""
    opdef = registry.get(op.type)
    if opdef is None or op.index >= min(len(typed.op_inputs), len(typed.op_outputs)):
        return 0
    ins, outs = typed.op_inputs[op.index], typed.op_outputs[op.index]
    if any(t is None for t in (*ins, *outs)):
        return 0
    return opdef.scratch_bytes(ins, outs, op.args)


def _nbytes(t: TensorType | None) -> int:
    return 0 if t is None else t.nbytes


def _last_uses(net: Net, steps_io, keep: set[str]) -> list[tuple[str, ...]]:
    """Per step, the blobs whose last use it is (``keep`` and the outputs never die)."""
    keep = keep | set(net.external_outputs)
    last: dict[str, int] = {}
    for i, (ins, outs) in enumerate(steps_io):
        for name in (*ins, *outs):
            last[name] = i
    dying: list[list[str]] = [[] for _ in steps_io]
    for name, i in last.items():
        if name not in keep:
            dying[i].append(name)
    return [tuple(d) for d in dying]


def require_memory(need: Footprint, what: str, hint: str) -> None:
    """InputError when ``need`` exceeds what this machine has available."""
    have, where = available_bytes()
    if have is None or need.total_bytes <= have:
        return
    raise InputError(f"{what} needs {format_bytes(need.total_bytes)} of memory ({need.describe()}), "
                     f"{format_bytes(have)} available ({where})", hint=hint)


