"""One worker of a cluster run (``placer.runtime.ray.driver``): a Ray actor that runs its host's net.

``ClusterWorker`` loads its net and init net on placer's executor and installs its world
(``RayWorld``, the world of ``ops/p2p.py``): a SendTensor calls the receiver's ``deliver``
with the array (Ray moves it through its object store; on one node the receiver reads it
zero-copy) and returns at once; a ReceiveTensor waits in this worker's ``Mailbox`` for
(sender, tag, n-th message of that pair and tag), MPI's non-overtaking order, so a worker
may run ahead of its peers without mixing up messages. Allreduce sends the worker's
partial sum to every other worker and adds all ranks' sums in rank order (every worker
gets the same bits); Broadcast sends the root's buffer. The actor is threaded
(``max_concurrency``) so that deliveries arrive while a step runs.

A step that raises comes back as {"ok": False, "error": ...} naming the op and the device
as the cluster names it. A reporter thread tells the other workers the op this one is
running whenever it changed (at most every ``REPORT_S``), so that the driver can name the
op of a worker that died. Train nets: the executor carries the state across steps where
it can (``host_state``); until then ``_StateCarry`` carries the blobs the init net makes
and the net writes, step to step. Warm-up steps train a copy of the state that is dropped,
as ``placer run`` does.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from placer.errors import PlacerError
from placer.formats.caffe2 import net_from_netdef, parse_text
from placer.ops.p2p import install_world
from placer.runtime import record as run_record
from placer.runtime.devices import location
from placer.runtime.executor import Executor
from placer.runtime.threads import set_blas_threads
from placer.runtime.timing import RunningTimes

REPORT_S = 0.02          # how often a worker reports the op it is running, at most
RECV_TIMEOUT_S = 600.0   # a receive that waits longer names the sender and the tag


class Mailbox:
    """Messages that arrived, by key; ``take`` waits for one."""

    def __init__(self):
        self.items: dict = {}
        self.ready = threading.Condition()

    def put(self, key, value) -> None:
        with self.ready:
            self.items[key] = value
            self.ready.notify_all()

    def take(self, key, timeout_s: float, what: str):
        with self.ready:
            if not self.ready.wait_for(lambda: key in self.items, timeout=timeout_s):
                raise PlacerError(f"no {what} after {timeout_s:.0f} s", hint="is the sending worker still running?")
            return self.items.pop(key)


@dataclass
class RayWorld:
    """This worker's world (``ops/p2p.World``) over the other workers' actors."""

    rank: int
    size: int
    hosts: list
    device_names: dict
    mailbox: Mailbox
    peers: list = field(default_factory=list)
    timeout_s: float = RECV_TIMEOUT_S
    counts: dict = field(default_factory=dict)

    def _next(self, key) -> int:
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return n

    def send(self, array, dst: int, tag: int, source: str) -> None:
        n = self._next(("send", dst, tag))
        self.peers[dst].deliver.remote(("p2p", self.rank, tag, n), (array, source))

    def recv(self, src: int, tag: int):
        n = self._next(("recv", src, tag))
        return self.mailbox.take(("p2p", src, tag, n), self.timeout_s, f"tensor with tag {tag} from {self.hosts[src]}")

    def allreduce(self, local: np.ndarray) -> np.ndarray:
        n = self._next("collective")
        for r in range(self.size):
            if r != self.rank:
                self.peers[r].deliver.remote(("collective", self.rank, n), local)
        total = None
        for r in range(self.size):
            part = local if r == self.rank else self.mailbox.take(
                ("collective", r, n), self.timeout_s, f"partial sum {n} from {self.hosts[r]}")
            total = np.array(part, copy=True) if total is None else total + part
        return total

    def broadcast(self, array, root: int) -> np.ndarray:
        n = self._next("collective")
        if self.rank == root:
            for r in range(self.size):
                if r != self.rank:
                    self.peers[r].deliver.remote(("collective", self.rank, n), array)
            return array
        return self.mailbox.take(("collective", root, n), self.timeout_s, f"broadcast {n} from {self.hosts[root]}")


class _StateCarry:
    """State across steps for an executor that does not keep it (module docstring): the
    blobs the init net makes and the predict net writes become outputs of each run and go
    back into the executor's parameters after it."""

    def __init__(self, net, init_outputs: set):
        written = {o for op in net.ops for o in op.outputs}
        self.names = [b for b in dict.fromkeys(init_outputs) if b in written]
        self.extra = [b for b in self.names if b not in net.external_outputs]
        net.external_outputs = list(net.external_outputs) + self.extra

    def keep(self, executor, outputs: dict) -> None:
        for name in self.names:
            if name in outputs:
                old = executor.params[name]
                executor.params[name] = executor.devices.named(location(old)).to_device(outputs[name])
        for name in self.extra:
            outputs.pop(name, None)

    def host_state(self, executor) -> dict:
        return {n: executor.devices.named(location(executor.params[n])).to_host(executor.params[n])
                for n in self.names}


class ClusterWorker:
    """One worker (one host): its nets on placer's executor, its mailbox, its world."""

    def __init__(self, spec: dict, predict_text: str, init_text: str, hosts: list, options: dict):
        self.spec, self.host, self.rank = spec, spec["host"], spec["rank"]
        self.options = options
        self.reported: dict[int, str] = {}          # rank -> the op that worker last reported
        self._heard: dict[int, int] = {}             # rank -> the number of its last report taken
        self.current, self.saved_state, self.warmups = "loading its nets", None, 0
        self.times: list[RunningTimes] = []     # per op, over the timed steps (bounded memory)
        self.timed_steps = 0
        self.names = {"cpu": f"{self.host}/cpu"}
        for g in range(spec["gpus"]):
            for local in (f"cuda:{g}", f"emulated-cuda:{g}"):
                self.names[local] = f"{self.host}/cuda:{g}"
        self.mailbox = Mailbox()
        self.world = RayWorld(self.rank, len(hosts), hosts, self.names, self.mailbox,
                              timeout_s=options.get("recv_timeout_s", RECV_TIMEOUT_S))
        self.broken = self._guard(lambda: self._load(predict_text, init_text))
        self._telling = threading.Lock()      # one report at a time, numbered in order
        self._told = 0
        threading.Thread(target=self._report, daemon=True).start()

    def _load(self, predict_text: str, init_text: str) -> None:
        spec, options = self.spec, self.options
        if options.get("threads"):
            set_blas_threads(options["threads"])
        install_world(self.world)
        predict = parse_text(predict_text, spec["net"])
        init = parse_text(init_text, spec["init_net"])
        net = net_from_netdef(predict, init, path=spec["net"], init_path=spec["init_net"])
        emulate = spec["gpus"] if options.get("emulate") and spec["gpus"] else None
        self.executor = Executor(net, emulate_gpus=emulate, seed=options.get("seed", 0))
        stateful = hasattr(self.executor, "host_state")
        self.carry = None if stateful else _StateCarry(net, {o for op in init.op for o in op.output})
        self.has_state = bool(self.carry.names if self.carry else getattr(self.executor, "state_names", ()))
        self._arm_fault(options.get("fault"))

    # -- set-up ------------------------------------------------------------------------
    def connect(self, peers: list) -> dict:
        """The other workers' actors (and this one's), once every worker exists; a worker
        that could not load its nets says why here."""
        self.world.peers = peers
        return self.broken if not self.broken["ok"] else {"ok": True, "pid": os.getpid()}

    def deliver(self, key, value) -> None:
        self.mailbox.put(key, value)

    def at(self, rank: int, label: str, seq: int = 0) -> None:
        """Worker ``rank`` is running ``label`` (module docstring). Reports may run out of
        order on this (threaded) actor: the one a worker numbered last wins."""
        if seq >= self._heard.get(rank, -1):
            self._heard[rank] = seq
            self.reported[rank] = label

    def last_reported(self) -> dict:
        return dict(self.reported)

    def init(self) -> dict:
        self.current = "the init net"
        return self._guard(self._init)

    def _init(self) -> None:
        self.executor.run_init()

    # -- a step ------------------------------------------------------------------------
    def step(self, inputs: dict | None, timed: bool, want_outputs: bool) -> dict:
        """One iteration of the predict net (a warm-up when not ``timed``)."""
        return self._guard(lambda: self._step(inputs or {}, timed, want_outputs))

    def _step(self, inputs: dict, timed: bool, want_outputs: bool) -> dict:
        ex = self.executor
        if not timed and self.saved_state is None and self.has_state:
            self.saved_state = self._state()            # warm-ups train a copy (module docstring)
        if timed and self.saved_state is not None:
            self._load_state(self.saved_state)
            self.saved_state = None
        steps = ex.steps
        self.current = steps[0].label if steps else "the predict net"

        def progress(done: int, _total: int) -> None:
            self.current = steps[done].label if done < len(steps) else "the end of the net"

        start = time.time()
        t0 = time.perf_counter()
        outputs = ex.run(inputs, iterations=1, warmup=0, progress=progress)
        busy = time.perf_counter() - t0
        if self.carry is not None:
            self.carry.keep(ex, outputs)
        self.current = "between steps"
        if timed:
            if not self.times:
                self.times = [RunningTimes() for _ in ex.record.ops]
            for times, o in zip(self.times, ex.record.ops):
                times.add(o.time_s)
            self.timed_steps += 1
        else:
            self.warmups += 1
        return {"outputs": outputs if want_outputs else {}, "start": start, "busy_s": busy}

    def _state(self) -> dict:
        ex = self.executor
        return ex.host_state() if self.carry is None else self.carry.host_state(ex)

    def _load_state(self, state: dict) -> None:
        ex = self.executor
        if self.carry is None:
            ex.load_state(state)
        else:
            self.carry.keep(ex, dict(state))

    def finish(self, want_state: bool) -> dict:
        """The RunRecord of the timed steps (device names as the cluster names them) and,
        for train nets, the state."""
        return self._guard(lambda: {"record": self._record(), "state": self._trained() if want_state else {}})

    def _trained(self) -> dict:
        """The state without the receive buffers (rewritten by every step, not trained)."""
        buffers = {op.outputs[0] for op in self.executor.net.ops if op.type == "ReceiveTensor"}
        return {k: v for k, v in self._state().items() if k not in buffers}

    def _record(self) -> dict:
        rec = self.executor.record
        ops = []
        for j, o in enumerate(rec.ops):
            times = self.times[j] if j < len(self.times) else RunningTimes()
            ops.append(replace(o, device=self._name(o.device), samples_s=times.samples,
                               time_s=times.median, **times.summary(),
                               links=tuple((self._name(a), self._name(b), n) for a, b, n in o.links)))
        rec = replace(rec, ops=tuple(ops),
                      devices=tuple(self._name(d) for d in rec.devices),
                      peak_bytes={self._name(d): v for d, v in rec.peak_bytes.items()},
                      timing_labels={self._name(d): (f"{self._name(d)} (CPU timing)" if "emulated" in d else
                                                     self._name(d)) for d in rec.timing_labels},
                      iterations=self.timed_steps, warmup=self.warmups)
        return run_record.to_dict(rec)

    def _name(self, local: str) -> str:
        return self.names.get(local, local)

    # -- faults --------------------------------------------------------------------------
    def _guard(self, work) -> dict:
        """Run ``work``; an error comes back as {"error": ...} naming the op and devices."""
        try:
            out = work()
            return {"ok": True, **(out or {})}
        except PlacerError as e:
            return {"ok": False, "error": self._cluster_text(e.message), "hint": self._cluster_text(e.hint or ""),
                    "op": self.current}
        except Exception as e:  # a bug or a kernel's own error: still one line naming the op
            return {"ok": False, "error": f"{self.current}: {e!r}", "hint": "", "op": self.current}

    def _cluster_text(self, text: str) -> str:
        for local, name in sorted(self.names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(f"on {local}", f"on {name}" + (" (emulated)" if "emulated" in local else ""))
        return text

    def _report(self) -> None:
        """Tell the other workers which op runs, when it changed (module docstring)."""
        sent = None
        while True:
            with self._telling:
                now = self.current
                if now != sent and self.world.peers:
                    self._tell(now)
                    sent = now
            time.sleep(REPORT_S)

    def _tell(self, label: str) -> list:
        """Send ``label`` to every peer, numbered after every earlier report (callers hold
        ``_telling``, so that a report read before a later one cannot be numbered after it)."""
        self._told += 1
        return [p.at.remote(self.rank, label, self._told) for r, p in enumerate(self.world.peers) if r != self.rank]

    def _arm_fault(self, fault: dict | None) -> None:
        """Testing the fault path: ``{"host", "op" (index), "mode": "exit"|"raise", "attempt"}``
        makes this worker die (``os._exit``, as a crash would) or raise when it reaches that
        predict-net op on the given attempt."""
        if not fault or fault["host"] != self.host or fault.get("attempt", 0) != self.options.get("attempt", 0):
            return
        step = self.executor.steps[fault["op"]]

        def fail(*args):
            if fault["mode"] == "exit":
                import ray
                with self._telling:      # the last report: none may follow it
                    ray.get(self._tell(step.label))
                    os._exit(17)
            raise RuntimeError("injected fault")

        if step.move is not None:
            step.move = fail
        else:
            step.kernel = fail


__all__ = ["ClusterWorker", "RayWorld", "Mailbox", "REPORT_S", "RECV_TIMEOUT_S"]
