"""Run a (placed) net: blobs in a dict, ops in order, each on the device it names.

``Executor(net).run(inputs)`` runs the init net once (its fills make the parameters),
then the predict net: ``# 1. feed inputs and params``, ``# 2. run ops``, ``# 3. collect
outputs``. Everything that can be decided before running is decided once in
``__init__`` (kernels, decoded arguments, devices, timers, which blobs die after which
op), so the loop per op is a few dict look-ups, a device check and the kernel call.

Placement rules (as Caffe2 runs a net):
- an op runs on ``op.device`` (the net-level default already folded in); none -> cpu;
  a GPU the run does not have (``emulate_gpus``) is refused before anything runs;
- an input the registry lists in ``host_inputs`` (an iteration counter) is read from
  host memory, as Caffe2's kernels read it;
- an op with a transfer rule in the registry (the copies: ``ops/registry.py``
  ``Transfer``) reads and writes where its rule says, relative to its device, and moves
  bytes only through ``Transfers.copy`` (runtime/transfers.py), which the record counts
  per link; every other op must find each input on its own device; either way a blob
  elsewhere is a ``DeviceError`` naming the op, the blob and both devices;
- a fed input goes where its first consumer reads it (Caffe2's ``FeedBlob`` with that
  device option); an init op with no device option makes its blob where the first
  predict op that reads it runs. Init ops run through the same loop, untimed.
"""
from __future__ import annotations

import statistics
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from placer.errors import DeviceError, InputError, KernelMissingError, PlacerError
from placer.ops import registry
from placer.ops.copy import inserted_copy
from placer.runtime.devices import DeviceSet, EmulatedArray, device_name, location
from placer.runtime.transfers import Transfers, direction, transfer_ends
from placer.shapes import infer
from placer.types import Args, Device, Net, Op, OpRun, RunRecord, TensorType


@dataclass(eq=False)
class Step:
    """One op, resolved once: what to call, on which device, with which blobs."""

    op: Op
    label: str                     # "op #3 Relu -> 'r'", "init net op #0 ...": for messages
    device: Any                    # the device the op is placed on (and timed on)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: Args
    reads: tuple                   # per input: the device it must be on (None: anywhere)
    kernel: Any = None             # (xp, inputs, args) -> outputs; None for a transfer
    move: Any = None               # a transfer's (transfers, inputs, args) -> outputs
    writes: tuple = ()             # a transfer's, per output: a device, or an input's index
    transfers: Transfers | None = None
    timer: Any = None
    frees: tuple[str, ...] = ()    # blobs whose last use is this op
    samples_s: list[float] = field(default_factory=list)
    links: tuple[tuple[str, str, int], ...] = ()   # a transfer's copies: (source, target, bytes)


def missing_kernels(ops: list[Op], where: str) -> list[str]:
    """Labels of ops that cannot run: no registry entry, no kernel, or not on that device."""
    bad = []
    for op in ops:
        opdef = registry.get(op.type)
        kind = "gpu" if op.device is not None and op.device.is_gpu else "cpu"
        if opdef is None:
            bad.append(f"{where} {op.label}: unknown op type")
        elif opdef.transfer is not None:
            continue
        elif opdef.kernel is None:
            bad.append(f"{where} {op.label}: no kernel yet")
        elif kind not in opdef.devices:
            bad.append(f"{where} {op.label}: no {kind} kernel (has {', '.join(sorted(opdef.devices))})")
    return bad


def peak_bytes(steps_io: list[tuple[tuple[str, ...], tuple[str, ...]]],
               sizes: Mapping[str, tuple[str, int]], initial: list[str],
               frees: list[tuple[str, ...]]) -> dict[str, int]:
    """Peak live blob bytes per device over the op sequence.

    ``initial`` blobs (params, fed inputs) are live from the start; op i's outputs are
    added while its inputs are still live (the peak is taken there), then ``frees[i]``
    die. A blob rewritten in place is counted once. ``sizes[name] = (device, nbytes)``.
    """
    live: dict[str, tuple[str, int]] = {}
    current: dict[str, int] = {}
    peak: dict[str, int] = {}

    def add(name: str) -> None:
        if name in live:
            dev, n = live.pop(name)
            current[dev] -= n
        if name in sizes:
            dev, n = live[name] = sizes[name]
            current[dev] = current.get(dev, 0) + n

    for name in initial:
        add(name)
    peak.update(current)
    for (_, outs), dead in zip(steps_io, frees):
        for name in outs:
            add(name)
        for dev, n in current.items():
            peak[dev] = max(peak.get(dev, 0), n)
        for name in dead:
            if name in live:
                dev, n = live.pop(name)
                current[dev] -= n
    return peak


class Executor:
    """Runs ``net`` (a placer ``Net`` with ``init_proto`` for its parameters).

    ``device_map`` (op index -> Device) overrides the placement the file carries; copies
    are not inserted for it. ``emulate_gpu`` runs GPU ops on tagged numpy arrays, on as
    many emulated GPUs as the net names; ``emulate_gpus`` N on exactly N of them (an op on
    GPU N or above is refused). ``input_types`` are the expected types of fed blobs
    (defaults: ``net.input_shapes``).
    """

    def __init__(self, net: Net, device_map: Mapping[int, Device] | None = None,
                 emulate_gpu: bool = False, seed: int = 0,
                 input_types: Mapping[str, TensorType] | None = None,
                 emulate_gpus: int | None = None):
        self.net, self.seed = net, seed
        self.devices = DeviceSet(emulate_gpu, emulate_gpus)
        self.ops = [op if not device_map or op.index not in device_map else
                    replace(op, device=device_map[op.index]) for op in net.ops]
        self.init_ops = _init_ops(net)
        self.input_types = {**net.input_shapes, **(input_types or {})}
        bad = missing_kernels(self.init_ops, "init net op") + missing_kernels(self.ops, "op")
        if bad:
            raise KernelMissingError(f"{len(bad)} op(s) cannot run: " + "; ".join(bad),
                                     hint="add a kernel in placer/ops/, or run on a device that has one")
        self.steps = [self._step(op, "op") for op in self.ops]
        self._readers: dict[str, Any] | None = None
        self.init_steps = [self._step(op, "init net op", self._init_device(op)) for op in self.init_ops]
        self.params: dict[str, Any] = {}
        self.initialized = False
        self._record: RunRecord | None = None
        self._last_run: tuple | None = None
        self._signature: tuple = ()
        self._sizes: dict[tuple, dict] = {}
        self._checked_signatures: set = set()
        self._plan_frees()

    # -- set-up, once ----------------------------------------------------------------

    def _step(self, op: Op, where: str, device: Any = None) -> Step:
        """``op`` resolved on its device (``device`` when given: an init op without one)."""
        label = f"{where} {op.label}"
        try:
            device = device if device is not None else self.devices.get(op.device)
        except DeviceError as e:
            raise DeviceError(f"{label} is placed on {device_name(op.device)}: {e.message}", e.hint) from e
        args = Args(dict(op.args), op=op.label, seed=self._seed(op), n_outputs=len(op.outputs))
        opdef = registry.get(op.type)
        if opdef.transfer is None:
            reads = tuple(self.devices.cpu if i in opdef.host_inputs else device for i in range(len(op.inputs)))
            return Step(op, label, device, op.inputs, op.outputs, args, reads=reads,
                        kernel=opdef.kernel, timer=device.timer())
        reads, writes = transfer_ends(opdef.transfer, device, self.devices, len(op.inputs),
                                      len(op.outputs), label)
        return Step(op, label, device, op.inputs, op.outputs, args, reads=reads, move=opdef.transfer.move,
                    writes=writes, transfers=Transfers(self.devices, (where, op.index)), timer=device.timer())

    def _seed(self, op: Op) -> int:
        """The seed of an op with randomness (fills, training-mode Dropout).

        The file's ``random_seed`` wins (Caffe2 honours it), then a ``seed`` argument (the
        converter's, unless the run asks for its own seed); else a seed drawn from the
        run's seed and the op's first output name, so that a fill the rewrite copied onto
        another device, or moved in the init net, makes the same values."""
        if op.args.seed:
            return op.args.seed
        if isinstance(op.args.get("seed"), int) and self.seed == 0:
            return op.args["seed"]
        name = op.outputs[0] if op.outputs else op.type
        return (self.seed * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFFFFFF

    def _plan_frees(self) -> None:
        keep = set(self.net.external_outputs) | set(self.net.params) | {
            o for op in self.init_ops for o in op.outputs}
        last: dict[str, int] = {}
        for i, s in enumerate(self.steps):
            for name in s.inputs + s.outputs:
                last[name] = i
        dying: list[list[str]] = [[] for _ in self.steps]
        for name, i in last.items():
            if name not in keep:
                dying[i].append(name)
        for s, names in zip(self.steps, dying):
            s.frees = tuple(names)

    def _first_reader(self, blob: str) -> Any:
        """The device the first op reading ``blob`` reads it on (cpu when none reads it, or
        when it reads it wherever it is)."""
        if self._readers is None:
            self._readers = {}
            for s in self.steps:
                for name, device in zip(s.inputs, s.reads):
                    self._readers.setdefault(name, device or self.devices.cpu)
        return self._readers.get(blob, self.devices.cpu)

    def _init_device(self, op: Op) -> Any:
        """Where an init op without a device option runs: where its blob is first read."""
        if op.device is not None:
            return None
        return self._first_reader(op.outputs[0]) if op.outputs else self.devices.cpu

    # -- the init net ----------------------------------------------------------------

    def run_init(self) -> dict[str, Any]:
        """Run the init net's ops (fills, parameter copies) once; their outputs become the
        parameters."""
        blobs: dict[str, Any] = {}
        self._run_ops(blobs, None, None, self.init_steps, timed=False)
        self.params = blobs
        self.initialized = True
        return blobs

    # -- a run -----------------------------------------------------------------------

    def expected_inputs(self) -> list[str]:
        """Blobs a run must be fed: external inputs the init net does not make."""
        return [b for b in self.net.external_inputs if b not in self.params]

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        """InputError for a missing input or a wrong dtype or shape, listing what is expected."""
        problems = []
        for name in self.expected_inputs():
            if name not in inputs:
                problems.append(f"'{name}' is missing")
                continue
            want, have = self.input_types.get(name), np.asarray(inputs[name])
            if want is not None and str(have.dtype) != want.dtype:
                problems.append(f"'{name}' has dtype {have.dtype}, expected {want.dtype}")
            if want is not None and tuple(have.shape) != want.shape:
                problems.append(f"'{name}' has shape {tuple(have.shape)}, expected {want.shape}")
        if problems:
            expected = ", ".join(f"{n} {self.input_types.get(n, '(shape not in the file)')}"
                                 for n in self.expected_inputs()) or "(none)"
            raise InputError(f"net '{self.net.name}': " + "; ".join(problems) + f"; the net expects: {expected}",
                             hint="feed an .npz keyed by blob name, or use --random-inputs")
        self._check_shapes(inputs)

    def _check_shapes(self, inputs: Mapping[str, Any]) -> None:
        """Shape inference at the fed shapes, once per signature: a ShapeError names the op
        before any kernel runs, instead of a numpy error halfway through."""
        fed = {n: TensorType(np.shape(inputs[n]), str(np.asarray(inputs[n]).dtype))
               for n in self.expected_inputs()}
        signature = tuple(sorted((n, t.shape, t.dtype) for n, t in fed.items()))
        self._signature = signature
        if signature in self._checked_signatures:
            return
        infer(self.net, fed)
        self._checked_signatures.add(signature)

    def run(self, inputs: Mapping[str, Any], iterations: int = 1, warmup: int = 1,
            progress: Any = None) -> dict[str, np.ndarray]:
        """Run the predict net ``warmup + iterations`` times; outputs of the last run.

        Per-op times are the median of the ``iterations`` timed runs (``self.record``).
        ``progress(done, total)`` is called after each op when given.
        """
        if not self.initialized and self.net.init_proto is not None:
            self.run_init()
        self.check_inputs(inputs)
        for s in self.steps:
            s.samples_s.clear()
        total = (warmup + iterations) * len(self.steps)
        # blob sizes (for peak memory) are measured once per input signature
        known = self._sizes.get(self._signature)
        sizes: dict[str, tuple[str, int]] = known if known is not None else {}
        for it in range(warmup + iterations):
            # 1. feed inputs and params
            blobs = dict(self.params)
            for name in self.expected_inputs():
                blobs[name] = self._first_reader(name).to_device(inputs[name], key=("feed", name))
            measure = it == 0 and known is None
            if measure:
                sizes.update((n, (location(v), int(v.nbytes))) for n, v in blobs.items())
            # 2. run ops
            self._run_ops(blobs, sizes if measure else None,
                          None if progress is None else (lambda i: progress(it * len(self.steps) + i, total)),
                          self.steps)
            for d in self.devices.all():  # staging buffers are reused next iteration
                d.sync()
            if it >= warmup:
                for s in self.steps:
                    s.samples_s.append(s.timer.seconds())
        # 3. collect outputs
        outputs = {name: self._collect(blobs, name) for name in self.net.external_outputs}
        self._sizes[self._signature] = sizes
        self._record, self._last_run = None, (sizes, iterations, warmup)
        return outputs

    @property
    def record(self) -> RunRecord | None:
        """The RunRecord of the last ``run`` (built when first asked for, not in the loop)."""
        if self._record is None and self._last_run is not None:
            self._record = self._make_record(*self._last_run)
        return self._record

    def _run_ops(self, blobs: dict, sizes: dict | None, tick: Any, steps: list[Step],
                 timed: bool = True) -> None:
        """The hot loop: look up, check the device, call, store, free."""
        i, active = 0, None
        try:
            for i, s in enumerate(steps):
                ins = [blobs[n] for n in s.inputs]
                device = s.device
                if device is not active:
                    device.activate()
                    active = device
                if s.move is not None:
                    self._transfer(s, ins, blobs, timed)
                else:
                    holds = device.holds
                    for x, where in zip(ins, s.reads):
                        if not (holds(x) if where is device else where.holds(x)):
                            raise self._wrong_device(s, blobs)
                    if timed:
                        s.timer.start()
                    outs = s.kernel(device.xp, [_plain(x) for x in ins] if device.emulated else ins, s.args)
                    if timed:
                        s.timer.stop()
                    adopt = device.adopt
                    for name, value in zip(s.outputs, outs):
                        blobs[name] = adopt(value)
                if sizes is not None:
                    sizes.update((n, (location(blobs[n]), int(blobs[n].nbytes)))
                                 for n in s.outputs if n in blobs)
                for name in s.frees:
                    blobs.pop(name, None)
                if tick is not None:
                    tick(i + 1)
        except PlacerError:
            raise
        except Exception as e:
            s = steps[i]
            absent = [n for n in s.inputs if n not in blobs]
            if absent:
                raise self._missing_blob(s, absent[0], blobs) from None
            raise PlacerError(f"{s.label} failed on {s.device.name}: {e!r}",
                              hint="inputs: " + ", ".join(f"{n} {_describe(blobs.get(n))}" for n in s.inputs)) from e

    def _transfer(self, s: Step, ins: list, blobs: dict, timed: bool) -> None:
        """An op with a transfer rule: sources checked (or found), targets resolved, the
        kernel's copies timed on the op's device and noted per link."""
        t = s.transfers
        sources = []
        for want, x in zip(s.reads, ins):
            if want is None:
                want = self.devices.named(location(x))
            elif not want.holds(x):
                raise self._wrong_device(s, blobs)
            sources.append(want)
        t.sources = sources
        t.targets = [sources[w] if type(w) is int else w for w in s.writes]
        t.moved = []
        if timed:
            s.timer.start()
        outs = s.move(t, ins, s.args)
        if timed:
            s.timer.stop()
        for name, value, target in zip(s.outputs, outs, t.targets):
            if not target.holds(value):
                raise DeviceError(f"{s.label} made '{name}' on {location(value)}, but its transfer rule "
                                  f"puts it on {target.name}", hint="a move kernel copies with transfers.copy")
            blobs[name] = value
        s.links = tuple(t.moved)

    # -- errors and results ------------------------------------------------------------

    def _wrong_device(self, s: Step, blobs: dict) -> DeviceError:
        """The first input of ``s`` that is not where the op reads it, named with both devices."""
        for name, want in zip(s.inputs, s.reads):
            x = blobs[name]
            if want is None or want.holds(x):
                continue
            where = location(x)
            if s.move is not None:
                return DeviceError(f"{s.label} reads '{name}' on {want.name}, but the blob is on {where}",
                                   hint="check the copy's direction and the device of the op that makes the blob")
            copy = inserted_copy(self.devices.named(where).kind, want.kind)
            return DeviceError(f"{s.label} runs on {want.name} but its input '{name}' is on {where}",
                               hint=f"insert a {copy} op for '{name}' before it")
        return DeviceError(f"{s.label}: an input is on the wrong device")

    def _missing_blob(self, s: Step, name: str, blobs: dict) -> PlacerError:
        known = ", ".join(sorted(blobs)[:40]) + (" ..." if len(blobs) > 40 else "")
        return PlacerError(f"{s.label}: input blob '{name}' does not exist at this point "
                           f"(no earlier op made it, it is not fed, or it was freed); known blobs: {known}")

    def _collect(self, blobs: dict, name: str) -> np.ndarray:
        if name not in blobs:
            raise PlacerError(f"net '{self.net.name}': external output '{name}' was not produced; "
                              f"known blobs: {', '.join(sorted(blobs)[:40]) or '(none)'}")
        x = blobs[name]
        host = self.devices.named(location(x)).to_host(x, key=("out", name))
        return np.array(host, copy=True, subok=False)

    def _make_record(self, sizes: dict, iterations: int, warmup: int) -> RunRecord:
        fed = list(self.params) + self.expected_inputs()
        peak = peak_bytes([(s.inputs, s.outputs) for s in self.steps], sizes, fed,
                          [s.frees for s in self.steps])
        ops = tuple(OpRun(index=s.op.index, name=s.op.name, type=s.op.type, device=s.device.name,
                          time_s=statistics.median(s.samples_s) if s.samples_s else 0.0,
                          samples_s=tuple(s.samples_s), copy_bytes=sum(n for *_, n in s.links),
                          copy_direction=direction(s.links), links=s.links) for s in self.steps)
        devices = self.devices.all()
        return RunRecord(net_name=self.net.name, devices=tuple(d.name for d in devices), ops=ops,
                         peak_bytes={d.name: int(peak.get(d.name, 0)) for d in devices},
                         emulated=any(d.emulated for d in devices), iterations=iterations,
                         warmup=warmup, timing_labels={d.name: d.timing_label for d in devices})


def _plain(x: Any) -> Any:
    """A kernel's view of an array: emulated tags stripped (zero-copy)."""
    return x.view(np.ndarray) if type(x) is EmulatedArray else x


def _describe(x: Any) -> str:
    if x is None:
        return "(missing)"
    return f"{getattr(x, 'dtype', '?')}{list(getattr(x, 'shape', ()))} on {location(x)}"


def _init_ops(net: Net) -> list[Op]:
    """The init net's ops as placer Ops (decoded by the Caffe2 reader)."""
    if net.init_proto is None:
        return []
    from placer.formats.caffe2 import net_from_netdef
    return net_from_netdef(net.init_proto).ops
