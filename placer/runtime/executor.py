"""Run a (placed) net: blobs in a dict, ops in order, each on the device it names.

``Executor(net).run(inputs)`` runs the init net once (its fills make the parameters),
then the predict net: ``# 1. feed inputs and params``, ``# 2. run ops``, ``# 3. carry the
state``, ``# 4. collect outputs``. Everything that can be decided before running is
decided once in ``__init__`` (kernels, decoded arguments, devices, timers, which blobs
die after which op), so the loop per op is a few dict look-ups, a device check and the
kernel call.

State across iterations (as Caffe2's workspace keeps blobs between runs of a net): the
blobs the init net makes are the state (``params``). Those the net writes -- parameters
and optimizer state updated by a train net, its iteration counter, SpatialBN's running
statistics -- are carried from one iteration to the next and from one ``run`` to the
next, so on a train net every iteration is a training step. Warm-up iterations train a
copy of that state, which is then dropped: after ``run(..., iterations=N)`` the
parameters are those after exactly N steps, whatever ``warmup`` is (the copy costs the
written state's memory once more during the warm-up). Step k of a train net draws its
randomness (training-mode Dropout's mask) from the op's seed and k, as a Caffe2 op's
generator moves on from one run to the next; warm-ups draw the first step's.

In place: an op whose registry entry declares an (input, output) pair in place
(``OpDef.inplace``: optimizer updates, iteration counters) and writes that input's blob
as that output gets the input position in ``args.inplace``, so its kernel updates the
array in place (a sparse update then touches only the looked-up rows of its table).
The executor owns every blob's array: fed inputs, copies and state copies are fresh
arrays, and on the first iteration that runs on the state, an in-place input that shares
memory with any other blob (an ``Alias``) or with an array the caller passed is left
out of place for good.

Placement rules (as Caffe2 runs a net):
- an op runs on ``op.device`` (the net-level default already folded in); none -> cpu;
- copy ops move blobs: ``CopyCPUToGPU`` (cpu -> the op's GPU), ``CopyGPUToCPU`` (the
  op's GPU -> cpu), ``EnsureCPUOutput`` (anywhere -> cpu), ``Copy`` (anywhere -> the
  op's device); every other op must find each input on its own device, or a
  ``DeviceError`` names the op, the blob and both devices; except the inputs its
  registry entry reads from host memory (``OpDef.host_inputs``: the iteration counter
  of Adam and LearningRate), which must be on the CPU whatever device the op runs on;
- a fed input goes where its first consumer reads it (Caffe2's ``FeedBlob`` with that
  device option); an init op with no device option makes its blob where the first
  predict op that reads it runs.
"""
from __future__ import annotations

import statistics
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from placer.errors import DeviceError, InputError, KernelMissingError, PlacerError
from placer.ops import registry
from placer.runtime.devices import DeviceSet, EmulatedArray, location
from placer.shapes import infer
from placer.types import Args, Device, Net, Op, OpRun, RunRecord, TensorType

COPY_OPS = {"CopyCPUToGPU", "CopyGPUToCPU", "EnsureCPUOutput", "Copy"}
_ANY = "any"


@dataclass(eq=False)
class Step:
    """One op, resolved once: what to call, on which device, with which blobs."""

    op: Op
    device: Any                    # the device the op runs on (the target for a copy)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: Args
    kernel: Any = None             # None for a copy
    source: Any = None             # a copy's required source device, or _ANY
    timer: Any = None
    frees: tuple[str, ...] = ()    # blobs whose last use is this op
    holders: tuple = ()            # with host inputs: per input, the holds() that must accept it
    inplace_candidates: frozenset = frozenset()  # inputs it may update in place, if owned
    seed: int = 0                  # the op's seed at step 0
    samples_s: list[float] = field(default_factory=list)
    copy_bytes: int = 0
    copy_direction: str = ""


def _copy_ends(op: Op, devices: DeviceSet) -> tuple[Any, Any]:
    """(required source, target) devices of a copy op; source may be _ANY."""
    gpu = devices.get(op.device if op.device is not None and op.device.is_gpu else Device("gpu", 0))
    if op.type == "CopyCPUToGPU":
        return devices.cpu, gpu
    if op.type == "CopyGPUToCPU":
        return gpu, devices.cpu
    if op.type == "EnsureCPUOutput":
        return _ANY, devices.cpu
    return _ANY, devices.get(op.device)


def read_device(op: Op, devices: DeviceSet, position: int | None = None) -> Any:
    """The device an op reads its inputs on (a copy's source; cpu for an 'any' copy), or
    input ``position`` (the CPU for an input it reads from host memory)."""
    if op.type in COPY_OPS:
        source = _copy_ends(op, devices)[0]
        return devices.cpu if source is _ANY else source
    if position is not None and position in host_inputs(op):
        return devices.cpu
    return devices.get(op.device)


def host_inputs(op: Op) -> tuple[int, ...]:
    """Input positions ``op`` reads from host memory on any device (registry entry)."""
    opdef = registry.get(op.type)
    return opdef.host_inputs if opdef is not None else ()


def inplace_candidates(op: Op) -> frozenset:
    """Inputs ``op`` could update in place: a pair its entry declares, whose output is the
    input's own blob, read once by the op (another input must not see it change)."""
    opdef = registry.get(op.type)
    if opdef is None:
        return frozenset()
    return frozenset(i for i, j in opdef.inplace
                     if i < len(op.inputs) and j < len(op.outputs) and op.inputs[i] == op.outputs[j]
                     and op.inputs.count(op.inputs[i]) == 1)


def missing_kernels(ops: list[Op], devices: DeviceSet, where: str) -> list[str]:
    """Labels of ops that cannot run: no registry entry, no kernel, or not on that device."""
    bad = []
    for op in ops:
        if op.type in COPY_OPS:
            continue
        opdef = registry.get(op.type)
        kind = devices.get(op.device).kind if op.device is None or not op.device.is_gpu else "gpu"
        if opdef is None:
            bad.append(f"{where} {op.label}: unknown op type")
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
    are not inserted for it. ``emulate_gpu`` runs GPU ops on tagged numpy arrays.
    ``input_types`` are the expected types of fed blobs (defaults: ``net.input_shapes``).
    """

    def __init__(self, net: Net, device_map: Mapping[int, Device] | None = None,
                 emulate_gpu: bool = False, seed: int = 0,
                 input_types: Mapping[str, TensorType] | None = None):
        self.net, self.seed = net, seed
        self.devices = DeviceSet(emulate_gpu)
        self.ops = [op if not device_map or op.index not in device_map else
                    _with_device(op, device_map[op.index]) for op in net.ops]
        self.init_ops = _init_ops(net)
        self.input_types = {**net.input_shapes, **(input_types or {})}
        bad = (missing_kernels(self.init_ops, self.devices, "init net op")
               + missing_kernels(self.ops, self.devices, "op"))
        if bad:
            raise KernelMissingError(f"{len(bad)} op(s) cannot run: " + "; ".join(bad),
                                     hint="add a kernel in placer/ops/, or run on a device that has one")
        self.steps = [self._step(op) for op in self.ops]
        self.params: dict[str, Any] = {}
        made_by_init = [o for op in self.init_ops for o in op.outputs]
        written = {o for s in self.steps for o in s.outputs}
        self.state_names = tuple(dict.fromkeys(o for o in made_by_init if o in written))
        self.steps_done = 0            # iterations run on the state (training steps on a train net)
        self._owners_checked = False
        self._watched: frozenset = frozenset()
        self.initialized = False
        self._record: RunRecord | None = None
        self._last_run: tuple | None = None
        self._signature: tuple = ()
        self._sizes: dict[tuple, dict] = {}
        self._checked_signatures: set = set()
        self._readers: dict[str, Any] | None = None
        self._plan_frees()

    # -- set-up, once ----------------------------------------------------------------

    def _step(self, op: Op) -> Step:
        try:
            return self._resolve(op)
        except DeviceError as e:
            raise DeviceError(f"op {op.label} is placed on {op.device}: {e.message}", e.hint) from e

    def _resolve(self, op: Op) -> Step:
        args = Args(dict(op.args), op=op.label, seed=self._seed(op), n_outputs=len(op.outputs))
        if op.type in COPY_OPS:
            source, target = _copy_ends(op, self.devices)
            gpu = target if target.kind == "gpu" else (source if source is not _ANY else target)
            return Step(op, target, op.inputs[:1], op.outputs[:1], args, source=source, timer=gpu.timer())
        device = self.devices.get(op.device)
        holders = (tuple(read_device(op, self.devices, k).holds for k in range(len(op.inputs)))
                   if host_inputs(op) and device is not self.devices.cpu else ())
        return Step(op, device, op.inputs, op.outputs, args, kernel=registry.get(op.type).kernel,
                    timer=device.timer(), holders=holders, inplace_candidates=inplace_candidates(op),
                    seed=args.seed)

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
        keep = set(self.net.external_outputs) | set(self.net.params) | set(self._watched) | {
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
        """The device the first op reading ``blob`` reads it on (cpu when none reads it)."""
        if self._readers is None:
            self._readers = {}
            for op in self.ops:
                for k, name in enumerate(op.inputs):
                    if name not in self._readers:
                        self._readers[name] = read_device(op, self.devices, k)
        return self._readers.get(blob, self.devices.cpu)

    # -- the init net ----------------------------------------------------------------

    def run_init(self) -> dict[str, Any]:
        """Run the init net's ops (fills) once; their outputs become the parameters."""
        blobs: dict[str, Any] = {}
        for op in self.init_ops:
            device = (self.devices.get(op.device) if op.device is not None
                      else self._first_reader(op.outputs[0]) if op.outputs else self.devices.cpu)
            args = Args(dict(op.args), op=op.label, seed=self._seed(op), n_outputs=len(op.outputs))
            ins = [_plain(blobs[n]) for n in op.inputs]
            try:
                outs = registry.get(op.type).kernel(device.xp, ins, args)
            except PlacerError:
                raise
            except Exception as e:
                raise PlacerError(f"init net op {op.label} failed on {device.name}: {e!r}") from e
            for name, value in zip(op.outputs, outs):
                blobs[name] = device.adopt(value)
        self.params = blobs
        self.initialized = True
        self._forget_owners()
        return blobs

    def load_state(self, arrays: Mapping[str, Any]) -> None:
        """Replace state blobs (e.g. parameters from a checkpoint) by copies of ``arrays``,
        each on the device its current value lives on; unknown names are an InputError."""
        if not self.initialized:
            self.run_init()
        unknown = sorted(n for n in arrays if n not in self.params)
        if unknown:
            raise InputError(f"net '{self.net.name}': no state blob named {', '.join(map(repr, unknown[:5]))}",
                             hint="the state is what the init net makes: " + ", ".join(sorted(self.params)[:20]))
        for name, value in arrays.items():
            device = self._device_named(location(self.params[name]))
            self.params[name] = device.adopt(device.to_device(np.asarray(value), key=("state", name)))
        self._forget_owners()

    def host_state(self) -> dict[str, np.ndarray]:
        """Host copies of the state (parameters, optimizer state, counters)."""
        return {name: self._collect(self.params, name) for name in self.params}

    def _forget_owners(self) -> None:
        """New state arrays: in-place rights are decided again on the next run."""
        self._owners_checked = False
        for s in self.steps:
            if s.inplace_candidates:
                s.args.inplace = frozenset()

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

    def run(self, inputs: Mapping[str, Any] | Callable[[int], Mapping[str, Any]], iterations: int = 1,
            warmup: int = 1, progress: Any = None, watch: Sequence[str] = (),
            on_step: Callable[[int, dict], Any] | None = None) -> dict[str, np.ndarray]:
        """Run the predict net ``warmup + iterations`` times; outputs of the last run.

        ``inputs`` is one batch, or ``batch(step)`` giving the batch of each step (step
        counts the iterations run on the state so far, from 0; warm-ups get the first
        timed step's). Per-op times are the median of the ``iterations`` timed runs
        (``self.record``). ``progress(done, total)`` is called after each op when given;
        ``on_step(step, values)`` after each timed iteration, with host copies of the
        ``watch`` blobs. The state carries over (see the module docstring): warm-ups train
        a copy of it.
        """
        if not self.initialized and self.net.init_proto is not None:
            self.run_init()
        batches = _Batches(inputs, self.check_inputs)
        first_step = self.steps_done
        batches.get(first_step)  # checked before anything runs; sets the input signature
        self._watch(watch)
        for s in self.steps:
            s.samples_s.clear()
            s.copy_bytes, s.copy_direction = 0, ""
        total = (warmup + iterations) * len(self.steps)
        # blob sizes (for peak memory) are measured once per input signature
        known = self._sizes.get(self._signature)
        sizes: dict[str, tuple[str, int]] = known if known is not None else {}
        real_state = self._set_aside_state() if warmup and self.state_names else None
        try:
            for it in range(warmup + iterations):
                timed = it >= warmup
                if timed and real_state is not None:
                    self.params, real_state = real_state, None   # the warm-up trained a copy: drop it
                step = self.steps_done if timed else first_step
                tick = None if progress is None else (lambda i: progress(it * len(self.steps) + i, total))
                blobs = self._iteration(batches.get(step), step, sizes if it == 0 and known is None else None,
                                        tick, grant=timed and not self._owners_checked)
                if timed:
                    for s in self.steps:
                        s.samples_s.append(s.timer.seconds())
                    self.steps_done += 1
                    if on_step is not None:
                        on_step(self.steps_done, {n: self._collect(blobs, n) for n in watch})
        finally:
            if real_state is not None:  # a warm-up failed: its copy of the state is dropped
                self.params = real_state
        # 4. collect outputs
        outputs = {name: self._collect(blobs, name) for name in self.net.external_outputs}
        self._sizes[self._signature] = sizes
        self._record, self._last_run = None, (sizes, iterations, warmup)
        return outputs

    def _iteration(self, fed: Mapping[str, Any], step: int, sizes: dict | None, tick: Any,
                   grant: bool) -> dict:
        """One run of the net on the state; returns its blobs. ``sizes``: measure blob
        sizes; ``grant``: decide the in-place rights (the first run on the state)."""
        if self.state_names:
            self._reseed(step)
        # 1. feed inputs and params
        blobs = dict(self.params)
        for name in self.expected_inputs():
            blobs[name] = self._first_reader(name).to_device(fed[name], key=("feed", name))
        if sizes is not None:
            sizes.update((n, (location(v), int(v.nbytes))) for n, v in blobs.items())
        # 2. run ops
        self._run_ops(blobs, sizes, tick, fed if grant else None)
        self._owners_checked = self._owners_checked or grant
        for d in self.devices.all():  # staging buffers are reused next iteration
            d.sync()
        # 3. carry the state to the next iteration
        for name in self.state_names:
            self.params[name] = blobs[name]
        return blobs

    def _watch(self, names: Sequence[str]) -> None:
        """Keep ``names`` alive to the end of each iteration (``on_step`` reads them)."""
        if frozenset(names) == self._watched:
            return
        made = {o for s in self.steps for o in s.outputs} | set(self.params) | set(self.expected_inputs())
        unknown = [n for n in names if n not in made]
        if unknown:
            raise InputError(f"net '{self.net.name}': no op writes {', '.join(map(repr, unknown))}",
                             hint="name a blob the net makes, e.g. its loss")
        self._watched = frozenset(names)
        self._plan_frees()

    def _reseed(self, step: int) -> None:
        """Seeds of training step ``step`` (step 0: the ops' own seeds)."""
        for s in self.steps:
            s.args.seed = s.seed if step == 0 else (s.seed * 1_000_003 + step) & 0x7FFFFFFF

    def _set_aside_state(self) -> dict[str, Any]:
        """Give the warm-up its own copy of the state the net writes; returns the real state."""
        real = self.params
        self.params = dict(real)
        for name in self.state_names:
            x = real[name]
            device = self._device_named(location(x))
            self.params[name] = device.adopt(device.to_device(x, key=("warmup", name)))
        return real

    @property
    def record(self) -> RunRecord | None:
        """The RunRecord of the last ``run`` (built when first asked for, not in the loop)."""
        if self._record is None and self._last_run is not None:
            self._record = self._make_record(*self._last_run)
        return self._record

    def _run_ops(self, blobs: dict, sizes: dict | None, tick: Any, fed: Mapping | None = None) -> None:
        """The hot loop: look up, check the device, call, store, free. With ``fed`` (the
        caller's batch), in-place rights are granted first (see ``_grant_inplace``)."""
        i, active, granting = 0, None, fed is not None
        try:
            for i, s in enumerate(self.steps):
                ins = [blobs[n] for n in s.inputs]
                if s.kernel is None:
                    blobs[s.outputs[0]] = self._copy(s, ins[0])
                    active = None  # a copy may switch the current GPU
                else:
                    device = s.device
                    if device is not active:
                        device.activate()
                        active = device
                    if s.holders:  # some inputs are read from host memory
                        for x, holds in zip(ins, s.holders):
                            if not holds(x):
                                raise self._wrong_device(s, blobs)
                    else:
                        holds = device.holds
                        for x in ins:
                            if not holds(x):
                                raise self._wrong_device(s, blobs)
                    if granting and s.inplace_candidates:
                        s.args.inplace = self._grant_inplace(s, blobs, fed)
                    s.timer.start()
                    outs = s.kernel(device.xp, [_plain(x) for x in ins] if device.emulated else ins, s.args)
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
            s = self.steps[i]
            absent = [n for n in s.inputs if n not in blobs]
            if absent:
                raise self._missing_blob(s, absent[0], blobs) from None
            raise PlacerError(f"op {s.op.label} failed on {s.device.name}: {e!r}",
                              hint="inputs: " + ", ".join(f"{n} {_describe(blobs.get(n))}" for n in s.inputs)) from e

    def _grant_inplace(self, s: Step, blobs: dict, fed: Mapping) -> frozenset:
        """The in-place candidates of ``s`` whose array no other blob and no caller's array
        shares memory with (checked once, on the first iteration run on the state)."""
        granted = set()
        for k in s.inplace_candidates:
            name, x = s.inputs[k], blobs[s.inputs[k]]
            where = location(x)
            xp = self._device_named(where).xp
            others = [v for n, v in blobs.items() if n != name] + [v for v in fed.values()]
            if not any(location(v) == where and xp.may_share_memory(x, v) for v in others):
                granted.add(k)
        return frozenset(granted)

    def _copy(self, s: Step, x: Any) -> Any:
        """A copy op as a real transfer; the source is checked as for any op."""
        src_name = location(x)
        if s.source is not _ANY and not s.source.holds(x):
            raise DeviceError(f"op {s.op.label} copies '{s.inputs[0]}' from {s.source.name}, "
                              f"but the blob is on {src_name}",
                              hint="check the copy's direction and the device of the op that makes the blob")
        target = s.device
        source = s.source if s.source is not _ANY else self._device_named(src_name)
        s.timer.start()
        out = source.to_host(x, key=s.op.index) if target.kind == "cpu" else target.to_device(x, key=s.op.index)
        s.timer.stop()
        s.copy_bytes = int(x.nbytes)
        s.copy_direction = ("h" if source.kind == "cpu" else "d") + "2" + ("h" if target.kind == "cpu" else "d")
        return target.adopt(out)

    def _device_named(self, name: str) -> Any:
        for d in self.devices.all():
            if d.name == name:
                return d
        kind, _, index = name.rpartition(":")
        return self.devices.get(Device("gpu", int(index))) if index.isdigit() else self.devices.cpu

    # -- errors and results ------------------------------------------------------------

    def _wrong_device(self, s: Step, blobs: dict) -> DeviceError:
        for k, (name, holds) in enumerate(zip(s.inputs, s.holders)):
            if k in host_inputs(s.op) and not holds(blobs[name]):
                return DeviceError(f"op {s.op.label} reads its input '{name}' from host memory (as Caffe2 "
                                   f"does on any device), but the blob is on {location(blobs[name])}",
                                   hint=f"make '{name}' on the CPU (the iteration counter lives in CPU scope)")
        for name in s.inputs:
            if not s.device.holds(blobs[name]):
                where = location(blobs[name])
                copy = "CopyCPUToGPU" if s.device.kind == "gpu" and where == "cpu" else (
                    "CopyGPUToCPU" if s.device.kind == "cpu" else "Copy")
                return DeviceError(f"op {s.op.label} runs on {s.device.name} but its input '{name}' "
                                   f"is on {where}", hint=f"insert a {copy} op for '{name}' before it")
        return DeviceError(f"op {s.op.label}: an input is on the wrong device")

    def _missing_blob(self, s: Step, name: str, blobs: dict) -> PlacerError:
        known = ", ".join(sorted(blobs)[:40]) + (" ..." if len(blobs) > 40 else "")
        return PlacerError(f"op {s.op.label}: input blob '{name}' does not exist at this point "
                           f"(no earlier op made it, it is not fed, or it was freed); known blobs: {known}")

    def _collect(self, blobs: dict, name: str) -> np.ndarray:
        if name not in blobs:
            raise PlacerError(f"net '{self.net.name}': external output '{name}' was not produced; "
                              f"known blobs: {', '.join(sorted(blobs)[:40]) or '(none)'}")
        x = blobs[name]
        host = self._device_named(location(x)).to_host(x, key=("out", name))
        return np.array(host, copy=True, subok=False)

    def _make_record(self, sizes: dict, iterations: int, warmup: int) -> RunRecord:
        fed = list(self.params) + self.expected_inputs()
        peak = peak_bytes([(s.inputs, s.outputs) for s in self.steps], sizes, fed,
                          [s.frees for s in self.steps])
        ops = tuple(OpRun(index=s.op.index, name=s.op.name, type=s.op.type, device=s.device.name,
                          time_s=statistics.median(s.samples_s) if s.samples_s else 0.0,
                          samples_s=tuple(s.samples_s), copy_bytes=s.copy_bytes,
                          copy_direction=s.copy_direction) for s in self.steps)
        devices = self.devices.all()
        return RunRecord(net_name=self.net.name, devices=tuple(d.name for d in devices), ops=ops,
                         peak_bytes={d.name: int(peak.get(d.name, 0)) for d in devices},
                         emulated=any(d.emulated for d in devices), iterations=iterations,
                         warmup=warmup, timing_labels={d.name: d.timing_label for d in devices})


class _Batches:
    """The batch of each step: one mapping for every step, or ``source(step)``; the last
    one is kept (warm-ups and the first step share it) and each new object is checked."""

    def __init__(self, source: Any, check: Callable[[Mapping[str, Any]], None]):
        self.source, self.check = source, check
        self.step: int | None = None
        self.batch: Mapping[str, Any] | None = None

    def get(self, step: int) -> Mapping[str, Any]:
        if not callable(self.source):
            if self.batch is None:
                self.check(self.source)
                self.batch = self.source
            return self.batch
        if step != self.step:
            batch = self.source(step)
            if batch is not self.batch:
                self.check(batch)
            self.step, self.batch = step, batch
        return self.batch


def _plain(x: Any) -> Any:
    """A kernel's view of an array: emulated tags stripped (zero-copy)."""
    return x.view(np.ndarray) if type(x) is EmulatedArray else x


def _describe(x: Any) -> str:
    if x is None:
        return "(missing)"
    return f"{getattr(x, 'dtype', '?')}{list(getattr(x, 'shape', ()))} on {location(x)}"


def _with_device(op: Op, device: Device) -> Op:
    from dataclasses import replace
    return replace(op, device=device)


def _init_ops(net: Net) -> list[Op]:
    """The init net's ops as placer Ops (decoded by the Caffe2 reader)."""
    if net.init_proto is None:
        return []
    from placer.formats.caffe2 import net_from_netdef
    return net_from_netdef(net.init_proto).ops
