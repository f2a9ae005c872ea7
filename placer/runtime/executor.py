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

import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from placer.errors import DeviceError, InputError, KernelMissingError, PlacerError
from placer.formats import nested
from placer.formats.caffe2 import net_from_netdef
from placer.ops import control, cudnn_conv, registry
from placer.ops.copy import inserted_copy
from placer.ops.int8_base import Int8Tensor
from placer.runtime.devices import DeviceSet, EmulatedArray, device_name, location
from placer.runtime.timing import RunningTimes
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
    inplace_candidates: frozenset = frozenset()  # inputs it may update in place, if owned
    seed: int = 0                  # the op's seed at step 0
    times: RunningTimes = field(default_factory=RunningTimes)   # this run's samples, bounded
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


# placer's bfloat16 casts (ops/half.py) hold bfloat16 values as uint16 bits: numpy and cupy
# have no bfloat16 arithmetic, so only the casts back may read them
BF16_READERS = frozenset({"BFloat16ToFloat"})


def bfloat16_compute(ops: list[Op]) -> list[str]:
    """Labels of ops that would compute on bfloat16 bits (an amp-bf16 net): placer plans
    such nets but cannot run them."""
    bits = {o for op in ops if op.type == "FloatToBFloat16" for o in op.outputs}
    bad = []
    for op in ops:
        read = [b for b in op.inputs if b in bits] if op.type not in BF16_READERS else []
        if read:
            bad.append(f"op {op.label}: reads bfloat16 '{read[0]}' (placer's runtime has no bfloat16 "
                       "arithmetic: numpy and cupy lack the dtype; plan the net, or write it with "
                       "--precision amp-fp16 to run it)")
    return bad[:3]


def inplace_candidates(op: Op) -> frozenset:
    """Inputs ``op`` could update in place: a pair its entry declares, whose output is the
    input's own blob, read once by the op (another input must not see it change)."""
    opdef = registry.get(op.type)
    if opdef is None:
        return frozenset()
    return frozenset(i for i, j in opdef.inplace
                     if i < len(op.inputs) and j < len(op.outputs) and op.inputs[i] == op.outputs[j]
                     and op.inputs.count(op.inputs[i]) == 1)


def peak_bytes(steps_io: list[tuple[tuple[str, ...], tuple[str, ...]]],
               sizes: Mapping[str, tuple[str, int]], initial: list[str],
               frees: list[tuple[str, ...]],
               scratch: Sequence[tuple[str, int]] | None = None) -> dict[str, int]:
    """Peak live blob bytes per device over the op sequence.

    ``initial`` blobs (params, fed inputs) are live from the start; op i's outputs are
    added while its inputs are still live (the peak is taken there), then ``frees[i]``
    die. A blob rewritten in place is counted once. ``sizes[name] = (device, nbytes)``.
    ``scratch[i]`` (device, bytes), when given, is op i's kernel temporaries, alive at
    that peak only.
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
    for i, ((_, outs), dead) in enumerate(zip(steps_io, frees)):
        for name in outs:
            add(name)
        for dev, n in current.items():
            peak[dev] = max(peak.get(dev, 0), n)
        if scratch is not None and scratch[i][1]:
            dev, n = scratch[i]
            peak[dev] = max(peak.get(dev, 0), current.get(dev, 0) + n)
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
        bad += bfloat16_compute(self.init_ops + self.ops)
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
        made_by_init = [o for op in self.init_ops for o in op.outputs]
        written = {o for s in self.steps for o in s.outputs}
        self.state_names = tuple(dict.fromkeys(o for o in made_by_init if o in written))
        self.steps_done = 0            # iterations run on the state (training steps on a train net)
        self._owners_checked = False
        self._watched: frozenset = frozenset()
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
                        kernel=opdef.kernel, timer=device.timer(), inplace_candidates=inplace_candidates(op),
                        seed=args.seed)
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
        keep = set(self.net.external_outputs) | set(self.net.params) | set(self._watched) | {
            o for op in self.init_ops for o in op.outputs}
        last: dict[str, int] = {}
        for i, s in enumerate(self.steps):
            for name in s.inputs + s.outputs + control.branch_blobs(s.op):  # an If's branches too
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
            device = self.devices.named(location(self.params[name]))
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
        (``self.record``; bounded memory for any number, ``runtime.timing``). ``progress(done, total)`` is called after each op when given;
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
            s.times.clear()
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
                        s.times.add(s.timer.seconds())
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
        self._run_ops(blobs, sizes, tick, self.steps, fed=fed if grant else None)
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
            device = self.devices.named(location(x))
            self.params[name] = device.adopt(device.to_device(x, key=("warmup", name)))
        return real

    @property
    def record(self) -> RunRecord | None:
        """The RunRecord of the last ``run`` (built when first asked for, not in the loop)."""
        if self._record is None and self._last_run is not None:
            self._record = self._make_record(*self._last_run)
        return self._record

    def _run_ops(self, blobs: dict, sizes: dict | None, tick: Any, steps: list[Step],
                 timed: bool = True, fed: Mapping | None = None) -> None:
        """The hot loop: look up, check the device, call, store, free. With ``fed`` (the
        caller's batch), in-place rights are granted first (see ``_grant_inplace``)."""
        i, active, granting = 0, None, fed is not None
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
                    if granting and s.inplace_candidates:
                        s.args.inplace = self._grant_inplace(s, blobs, fed)
                    if timed:
                        s.timer.start()
                    outs = (self._run_branch(s, ins[0], blobs, sizes, timed) if s.op.type in control.NESTED
                            else s.kernel(device.xp, [_plain(x) for x in ins] if device.emulated else ins, s.args))
                    if timed:
                        s.timer.stop()
                    adopt = device.adopt
                    for name, value in zip(s.outputs, outs):
                        blobs[name] = value if type(value) is Int8Tensor else adopt(value)
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

    def _run_branch(self, s: Step, condition: Any, blobs: dict, sizes: dict | None, timed: bool) -> tuple:
        """An If: the branch its condition selects, its ops on the If's device with the
        registry kernels, reading and writing the outer blobs (as Caffe2 runs it in the same
        workspace). Its ops are resolved on first use; the If's timer covers them."""
        branch = control.branch_taken(_plain(condition), s.op)
        if branch is None:
            return ()
        branches = self.__dict__.setdefault("_branches", {})
        steps = branches.get((id(s), branch))
        if steps is None:
            ops = nested.branch_ops(s.op, branch)
            bad = missing_kernels(ops, f"{s.label} {branch} op")
            if bad:
                raise KernelMissingError(f"{len(bad)} op(s) cannot run: " + "; ".join(bad))
            steps = branches[(id(s), branch)] = [
                self._step(op, f"{s.label} {branch} op", s.device) for op in ops]
        self._run_ops(blobs, sizes, None, steps, timed=False)
        return ()

    def _grant_inplace(self, s: Step, blobs: dict, fed: Mapping) -> frozenset:
        """The in-place candidates of ``s`` whose array no other blob and no caller's array
        shares memory with (checked once, on the first iteration run on the state)."""
        granted = set()
        for k in s.inplace_candidates:
            name, x = s.inputs[k], blobs[s.inputs[k]]
            where = location(x)
            xp = self.devices.named(where).xp
            others = [v for n, v in blobs.items() if n != name] + [v for v in fed.values()]
            if not any(location(v) == where and xp.may_share_memory(x, v) for v in others):
                granted.add(k)
        return frozenset(granted)

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
            if want is not s.device:   # an input the op reads from host memory
                return DeviceError(f"{s.label} reads its input '{name}' from host memory (as Caffe2 "
                                   f"does on any device), but the blob is on {where}",
                                   hint=f"make '{name}' on the CPU (the iteration counter lives in CPU scope)")
            copy = inserted_copy(self.devices.named(where).kind, want.kind)
            return DeviceError(f"{s.label} runs on {want.name} but its input '{name}' is on {where}",
                               hint=f"insert a {copy} op for '{name}' before it, or run with "
                                    f"--inject-copies, which inserts the copies Caffe2's "
                                    f"InjectCrossDeviceCopies would")
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
        if type(x) is Int8Tensor:   # Caffe2's Int8 ops compute on the host: data, scale, zero point
            return Int8Tensor(np.array(x.data, copy=True), x.scale, x.zero_point)
        host = self.devices.named(location(x)).to_host(x, key=("out", name))
        return np.array(host, copy=True, subok=False)

    def _make_record(self, sizes: dict, iterations: int, warmup: int) -> RunRecord:
        fed = list(self.params) + self.expected_inputs()
        peak = peak_bytes([(s.inputs, s.outputs) for s in self.steps], sizes, fed,
                          [s.frees for s in self.steps])
        ops = tuple(OpRun(index=s.op.index, name=s.op.name, type=s.op.type, device=s.device.name,
                          time_s=s.times.median, samples_s=s.times.samples,
                          copy_bytes=sum(n for *_, n in s.links), copy_direction=direction(s.links),
                          links=s.links, **s.times.summary()) for s in self.steps)
        devices = self.devices.all()
        return RunRecord(net_name=self.net.name, devices=tuple(d.name for d in devices), ops=ops,
                         peak_bytes={d.name: int(peak.get(d.name, 0)) for d in devices},
                         emulated=any(d.emulated for d in devices), iterations=iterations,
                         warmup=warmup, timing_labels={d.name: d.timing_label for d in devices},
                         conv_engines=dict(cudnn_conv.engine_counts(s.op.label for s in self.steps)[0]))


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
    return net_from_netdef(net.init_proto).ops


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
