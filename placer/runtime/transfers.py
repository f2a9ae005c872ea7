"""Ops that move data between devices, run by their registry rule (``ops.registry.Transfer``).

The executor asks ``transfer_ends`` once per op for what the rule means where the op is
placed: per input, the device it must be read on (None: wherever it already is); per
output, the device it is written on, or the index of the input whose device it takes
(``Transfer.like_input_from`` shifts that index past leading inputs such as a common world).
Per run it resolves the None and index entries from where the inputs really are and hands
the op's ``move`` kernel a ``Transfers``: the source and target device objects, the host,
and ``copy``, which moves one array through ``DeviceSet.copy`` and notes (source, target,
bytes) for the run record. Nothing here knows an op type.
"""
from __future__ import annotations

from typing import Any, Sequence

from placer.errors import ShapeError
from placer.ops.registry import ANYWHERE, HOST, LIKE_INPUT, PLACED, Transfer
from placer.runtime.devices import DeviceSet


class Transfers:
    """What a transfer kernel sees: ``sources[i]`` / ``targets[j]`` (device objects),
    ``host``, and ``copy(array, source, target)``. ``moved`` lists the copies of the last
    run as (source name, target name, bytes). ``key`` tells apart the pinned buffers of
    this op's copies from every other op's (they are reused run after run)."""

    __slots__ = ("devices", "host", "key", "sources", "targets", "moved")

    def __init__(self, devices: DeviceSet, key: Any):
        self.devices, self.host, self.key = devices, devices.cpu, key
        self.sources: list = []
        self.targets: list = []
        self.moved: list[tuple[str, str, int]] = []

    def copy(self, array: Any, source: Any, target: Any) -> Any:
        out = self.devices.copy(array, source, target, key=(self.key, len(self.moved)))
        self.moved.append((source.name, target.name, int(array.nbytes)))
        return out

    def note(self, source: Any, target: Any, nbytes: int) -> None:
        """Bytes a library moved from ``source`` to ``target`` without ``copy`` (NCCL)."""
        self.moved.append((source.name, target.name, int(nbytes)))


def transfer_ends(transfer: Transfer, placed: Any, devices: DeviceSet, n_inputs: int,
                  n_outputs: int, label: str) -> tuple[tuple, tuple]:
    """(reads, writes) of an op placed on ``placed``: ``reads[i]`` a device or None (anywhere),
    ``writes[j]`` a device or the index of the input whose device output j takes."""
    read = {HOST: devices.cpu, PLACED: placed, ANYWHERE: None}
    if transfer.reads not in read or transfer.writes not in (HOST, PLACED, LIKE_INPUT):
        raise ValueError(f"{label}: unknown transfer rule {transfer}")
    reads = (read[transfer.reads],) * n_inputs
    if transfer.writes != LIKE_INPUT:
        return reads, ({HOST: devices.cpu, PLACED: placed}[transfer.writes],) * n_outputs
    first = transfer.like_input_from
    if first + n_outputs > n_inputs:
        raise ShapeError(f"{label}: {n_outputs} outputs, but each output is written where an input "
                         f"is, and it has {n_inputs - first} such inputs",
                         hint="give the op one output per input (in place, as Caffe2 writes it)")
    return reads, tuple(range(first, first + n_outputs))


def direction(links: Sequence[tuple[str, str, int]]) -> str:
    """"h2d", "d2h", "d2d" or "h2h" when every copy went one way; "mixed" or "" otherwise."""
    kinds = {("h" if src == "cpu" else "d") + "2" + ("h" if dst == "cpu" else "d") for src, dst, _ in links}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "")
