"""Memory a run or a profile needs, against what this machine has, decided before allocating.

numpy asks the kernel for an array's pages lazily: an allocation far beyond the machine's
memory either fails at once (numpy's ``MemoryError``: a traceback) or succeeds and gets the
process killed once the pages are written. So the commands that allocate (``placer run``,
``placer profile``) price the work from the inferred shapes first and refuse, naming both
figures, what does not fit.

What a run needs, in host memory (every blob when the GPU is emulated; with a real GPU
only the blobs of CPU ops, the fed inputs and the parameters the host keeps): the
parameters (the init net's fills) and the fed inputs, live throughout, plus the larger of

- the peak of the other blobs alive at once, each freed after its last reader (the
  executor's own rule, ``executor.peak_bytes``), and
- when inputs are random, the largest one's float64 draw before its cast.

What the profiler needs is the worst single op: its inputs plus the larger of its outputs
and the temporaries of drawing its largest input.

What the machine has is the smallest of the limits that apply: ``MemAvailable`` in
/proc/meminfo, the cgroup's memory limit less its usage (v2, then v1), the address-space
limit (``RLIMIT_AS``) less the process's size; elsewhere the free physical pages
(``sysconf``); unknown (no check) when none can be read.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from placer.errors import InputError
from placer.types import Net, TensorType, TypedNet

# float64 draw (8 bytes) for every element of a random input, before the cast.
DRAW_BYTES_PER_ELEMENT = 8
_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as 2^63 rounded to a page


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
            return f"{held} + the larger of {' and '.join(phases)}"
        return " + ".join([held, *phases])


def format_bytes(n: float) -> str:
    """Binary units, as numpy's MemoryError writes them (``7.28 TiB``)."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                       ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------- what a command needs

def run_footprint(typed: TypedNet, fed: list[str], random_inputs: bool,
                  host_only: set[int] | None = None) -> Footprint:
    """Peak host bytes of ``placer run`` over ``typed``; ``fed`` are the blobs fed from
    outside (held by the caller for the whole run). ``host_only`` (op indices) limits the
    activations counted to those ops' blobs (a real GPU holds the others); None counts
    every op (CPU or emulated GPU)."""
    from placer.runtime.executor import peak_bytes
    net, blobs = typed.net, typed.blobs
    params = sum(_nbytes(blobs.get(b)) for b in net.params)
    inputs = sum(_nbytes(blobs.get(b)) for b in fed)
    steps = [(op.inputs, op.outputs) for op in net.ops if host_only is None or op.index in host_only]
    sizes = {name: ("host", _nbytes(t)) for name, t in blobs.items() if t is not None}
    held = [*net.params, *fed]
    peak = peak_bytes(steps, sizes, held, _last_uses(net, steps, keep=set(held))).get("host", 0)
    draw = max((blobs[b].size * DRAW_BYTES_PER_ELEMENT for b in fed if blobs.get(b) is not None),
               default=0) if random_inputs else 0
    return Footprint((("parameters", params), ("inputs", inputs)),
                     (("peak activations", max(0, peak - params - inputs)), ("random draw", draw)))


def profile_footprint(typed: TypedNet) -> tuple[Footprint, str]:
    """Bytes of the op that needs the most to be timed alone, and what that is (for
    ``require_memory``): its inputs, then the larger of its outputs and the float
    temporaries of drawing its largest input (a draw and its shift, before the cast)."""
    best, label = Footprint(()), ""
    for op, ins, outs in zip(typed.net.ops, typed.op_inputs, typed.op_outputs):
        need = Footprint((("inputs", sum(_nbytes(t) for t in ins)),),
                         (("outputs", sum(_nbytes(t) for t in outs)),
                          ("random draw", 2 * max((_nbytes(t) for t in ins), default=0))))
        if need.total_bytes > best.total_bytes:
            best, label = need, f"timing op {op.label}"
    return best, label


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


# ---------------------------------------------------------------- what the machine has

def available_bytes() -> tuple[int | None, str]:
    """(bytes this process can still allocate, where that figure comes from); (None, "")
    when no figure can be read."""
    found = [(n, where) for n, where in (_meminfo(), _cgroup(), _address_space()) if n is not None]
    if not found:
        found = [_sysconf()]
    found = [(n, where) for n, where in found if n is not None]
    return min(found) if found else (None, "")


def require_memory(need: Footprint, what: str, hint: str) -> None:
    """InputError when ``need`` exceeds what this machine has available."""
    have, where = available_bytes()
    if have is None or need.total_bytes <= have:
        return
    raise InputError(f"{what} needs {format_bytes(need.total_bytes)} of memory ({need.describe()}); "
                     f"this machine has {format_bytes(have)} available ({where})", hint=hint)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo() -> tuple[int | None, str]:
    m = re.search(r"^MemAvailable:\s+(\d+) kB", _read("/proc/meminfo") or "", re.M)
    return (int(m.group(1)) * 1024, "MemAvailable in /proc/meminfo") if m else (None, "")


def _cgroup() -> tuple[int | None, str]:
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = (_read(limit_file) or "").strip(), (_read(usage_file) or "").strip()
        if limit.isdigit() and usage.isdigit() and int(limit) < _UNLIMITED:
            return max(0, int(limit) - int(usage)), f"cgroup limit {limit_file} less usage"
    return None, ""


def _address_space() -> tuple[int | None, str]:
    try:
        import resource
    except ImportError:
        return None, ""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None, ""
    m = re.search(r"^VmSize:\s+(\d+) kB", _read("/proc/self/status") or "", re.M)
    used = int(m.group(1)) * 1024 if m else 0
    return max(0, soft - used), "address-space limit (ulimit -v) less this process's size"


def _sysconf() -> tuple[int | None, str]:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory"
    except (ValueError, OSError, AttributeError):
        return None, ""
