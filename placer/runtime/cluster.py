"""Run a cluster plan (``placer plan --cluster C -o OUTDIR``) on Ray: one actor per worker.

``run_on_ray(outdir, address)`` connects to Ray (``address`` None: a local instance that
stands in for the cluster; ``"auto"``: the running cluster), starts one actor per worker of
the manifest, hands it its net and init net (the text travels with the call: no shared
file system needed), runs the init nets, then each iteration as **one actor call per
worker** (``ClusterWorker.step``), and returns the outputs, a RunRecord per worker and
the time of every iteration.

Placement on hosts: worker ``h1`` asks for the custom resource ``placer_host_h1``; start
Ray on each host with ``--resources '{"placer_host_h1": 1}'`` (the local instance gives
every simulated host's resource to this machine). A worker with GPUs asks for that many
(``num_gpus``; Ray sets CUDA_VISIBLE_DEVICES, so the worker's cuda:0 is its first GPU);
with ``emulate`` it asks for none and emulates its host's GPUs.

Between workers (``RayWorld``, the world of ``ops/p2p.py``): a SendTensor calls the
receiver's ``deliver`` with the array (Ray moves it through its object store; on one node
the receiver reads it zero-copy) and returns at once; a ReceiveTensor waits in the
receiver's mailbox for (sender, tag, n-th message of that pair and tag), MPI's
non-overtaking order, so a worker may run ahead of its peers without mixing up messages.
Allreduce sends the worker's partial sum to every other worker and adds all ranks' sums
in rank order (every worker gets the same bits); Broadcast sends the root's buffer. The
actors are threaded (``max_concurrency``) so that deliveries arrive while a step runs.

Faults: a worker whose step raises returns the error (the op's label, the device as the
cluster names it); a worker that dies is found by Ray (``RayActorError``) and named with
the op it last reported (a reporter thread in each worker tells the other workers the op
it is running whenever it changed, at most every ``REPORT_S``; the driver asks a
surviving worker). Either way the other
workers are killed, nothing is written, and one ``ClusterRunError`` names the worker, its
host and devices, and the op. ``max_restarts`` starts every worker again from its init net
after a worker died (a raised error would only repeat), up to that many times.

Train nets: the executor carries the state across steps where it can (``host_state``);
until then the worker carries the blobs the init net makes and the net writes itself,
step to step (``_StateCarry``). Warm-up steps train a copy of the state that is dropped,
as ``placer run`` does, so N timed steps give the parameters of N steps.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from placer.errors import PlacerError

REPORT_S = 0.02          # how often a worker reports the op it is running, at most
RECV_TIMEOUT_S = 600.0   # a receive that waits longer names the sender and the tag
RESOURCE = "placer_host_{}"


class ClusterRunError(PlacerError):
    """A worker failed or died; the message names it, its host and devices, and the op."""


# ---------------------------------------------------------------------- in each worker

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
        from placer.runtime.devices import location
        for name in self.names:
            if name in outputs:
                old = executor.params[name]
                executor.params[name] = executor.devices.named(location(old)).to_device(outputs[name])
        for name in self.extra:
            outputs.pop(name, None)

    def host_state(self, executor) -> dict:
        from placer.runtime.devices import location
        return {n: executor.devices.named(location(executor.params[n])).to_host(executor.params[n])
                for n in self.names}


class ClusterWorker:
    """One worker (one host): its nets on placer's executor, its mailbox, its world."""

    def __init__(self, spec: dict, predict_text: str, init_text: str, hosts: list, options: dict):
        self.spec, self.host, self.rank = spec, spec["host"], spec["rank"]
        self.options = options
        self.reported: dict[int, str] = {}          # rank -> the op that worker last reported
        self.current, self.samples, self.saved_state, self.warmups = "loading its nets", [], None, 0
        self.names = {"cpu": f"{self.host}/cpu"}
        for g in range(spec["gpus"]):
            for local in (f"cuda:{g}", f"emulated-cuda:{g}"):
                self.names[local] = f"{self.host}/cuda:{g}"
        self.mailbox = Mailbox()
        self.world = RayWorld(self.rank, len(hosts), hosts, self.names, self.mailbox,
                              timeout_s=options.get("recv_timeout_s", RECV_TIMEOUT_S))
        self.broken = self._guard(lambda: self._load(predict_text, init_text))
        threading.Thread(target=self._report, daemon=True).start()

    def _load(self, predict_text: str, init_text: str) -> None:
        from placer.formats.caffe2 import net_from_netdef, parse_text
        from placer.ops.p2p import install_world
        from placer.runtime.executor import Executor
        from placer.runtime.threads import set_blas_threads
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

    def at(self, rank: int, label: str) -> None:
        """Worker ``rank`` is running ``label`` (module docstring)."""
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
            self.samples.append([o.time_s for o in ex.record.ops])
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
        from placer.runtime import record as run_record
        rec = self.executor.record
        ops = []
        for j, o in enumerate(rec.ops):
            samples = tuple(s[j] for s in self.samples)
            ops.append(replace(o, device=self._name(o.device), samples_s=samples,
                               time_s=statistics.median(samples) if samples else 0.0,
                               links=tuple((self._name(a), self._name(b), n) for a, b, n in o.links)))
        rec = replace(rec, ops=tuple(ops),
                      devices=tuple(self._name(d) for d in rec.devices),
                      peak_bytes={self._name(d): v for d, v in rec.peak_bytes.items()},
                      timing_labels={self._name(d): (f"{self._name(d)} (CPU timing)" if "emulated" in d else
                                                     self._name(d)) for d in rec.timing_labels},
                      iterations=len(self.samples), warmup=self.warmups)
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
            now = self.current
            if now != sent and self.world.peers:
                self._tell(now)
                sent = now
            time.sleep(REPORT_S)

    def _tell(self, label: str) -> list:
        return [p.at.remote(self.rank, label) for r, p in enumerate(self.world.peers) if r != self.rank]

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
                ray.get(self._tell(step.label))
                os._exit(17)
            raise RuntimeError("injected fault")

        if step.move is not None:
            step.move = fail
        else:
            step.kernel = fail


# ---------------------------------------------------------------------- the driver

@dataclass
class ClusterRun:
    outputs: dict
    records: dict                    # host -> RunRecord dict
    starts: dict                     # host -> wall-clock start of its last timed step
    iteration_s: list                # driver wall time per timed iteration
    call_overhead_s: dict            # host -> median (round trip - time inside the step)
    busy_s: dict                     # host -> median seconds inside the executor per step
    state: dict = field(default_factory=dict)   # host -> state blobs (train nets)
    restarts: int = 0
    init_s: float = 0.0


def _connect(address: str | None, hosts: list) -> bool:
    """Ray connected; True when this call started a local instance (to shut down after)."""
    try:
        import ray
    except ImportError as e:
        raise PlacerError(f"ray is not installed ({e})", hint="pip install 'placer[cluster]'") from None
    started = False
    if not ray.is_initialized():
        if address in (None, "", "local"):
            ray.init(resources={RESOURCE.format(h): 1000 for h in hosts}, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            started = True
        else:
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise PlacerError(f"--ray {address}: cannot connect to a Ray cluster ({e})",
                                  hint="start one with `ray start --head` on one host and "
                                       "`ray start --address=HEAD:6379` on the others") from None
    have = ray.cluster_resources()
    missing = [h for h in hosts if have.get(RESOURCE.format(h), 0) < 1]
    if missing:
        res = ", ".join(f'\'{{"{RESOURCE.format(h)}": 1}}\'' for h in missing)
        raise PlacerError(f"the Ray cluster has no node for host(s) {', '.join(missing)}",
                          hint=f"start Ray on each host with --resources, e.g. {res}")
    return started


def run_on_ray(outdir: str | os.PathLike, address: str | None = None, inputs: dict | None = None,
               iterations: int = 1, warmup: int = 1, emulate: bool = False, seed: int = 0,
               threads: int | None = None, max_restarts: int = 0, fault: dict | None = None,
               recv_timeout_s: float = RECV_TIMEOUT_S, want_state: bool = False) -> ClusterRun:
    """Run OUTDIR's workers on Ray (module docstring); ``inputs`` as a single run takes them."""
    from placer.manifest import read_manifest
    manifest = read_manifest(outdir)
    hosts = [w["host"] for w in manifest["workers"]]
    texts = {w["host"]: ((Path(outdir) / w["net"]).read_text(), (Path(outdir) / w["init_net"]).read_text())
             for w in manifest["workers"]}
    started = _connect(address, hosts)
    try:
        for attempt in range(max_restarts + 1):
            try:
                run = _attempt(manifest, texts, hosts, inputs or {}, iterations, warmup,
                               {"emulate": emulate, "seed": seed, "threads": threads, "fault": fault,
                                "recv_timeout_s": recv_timeout_s, "attempt": attempt}, want_state)
                run.restarts = attempt
                return run
            except _WorkerDied as e:
                if attempt == max_restarts:
                    raise ClusterRunError(e.message, hint=e.hint) from None
                import sys
                print(f"placer: {e.message}; restarting every worker ({attempt + 1} of {max_restarts})",
                      file=sys.stderr)
    finally:
        if started:
            import ray
            ray.shutdown()


class _WorkerDied(PlacerError):
    pass


def _attempt(manifest, texts, hosts, inputs, iterations, warmup, options, want_state) -> ClusterRun:
    import ray
    remote = ray.remote(ClusterWorker)
    actors = []
    for w in manifest["workers"]:
        gpus = 0 if options["emulate"] else w["gpus"]
        actors.append(remote.options(num_cpus=0, num_gpus=gpus, max_concurrency=8, max_restarts=0,
                                     resources={RESOURCE.format(w["host"]): 1}).remote(
            w, *texts[w["host"]], hosts, options))
    driver = _Driver(manifest, actors)
    try:
        driver.call("connect", [(actors,)] * len(actors))
        t0 = time.perf_counter()
        driver.call("init", [()] * len(actors))
        init_s = time.perf_counter() - t0
        fed = [ray.put({b: inputs[b] for b in w["inputs"]}) if w["inputs"] else None for w in manifest["workers"]]
        outputs: dict = {}
        for it in range(warmup + iterations):
            timed, last = it >= warmup, it == warmup + iterations - 1
            results = driver.call("step", [(fed[r], timed, last) for r in range(len(actors))], timed=timed)
            if last:
                for res in results:
                    outputs.update(res["outputs"])
        done = driver.call("finish", [(want_state,)] * len(actors))
        return ClusterRun(outputs=outputs, records={h: d["record"] for h, d in zip(hosts, done)},
                          starts=driver.starts, iteration_s=driver.iteration_s,
                          call_overhead_s={h: _median(v) for h, v in zip(hosts, driver.overhead)},
                          busy_s={h: _median(v) for h, v in zip(hosts, driver.busy)},
                          state={h: d["state"] for h, d in zip(hosts, done)}, init_s=init_s)
    finally:
        for a in actors:
            ray.kill(a)


def _median(values: list) -> float:
    return statistics.median(values) if values else 0.0


class _Driver:
    """Calls one method on every worker at once and waits, stopping at the first failure."""

    def __init__(self, manifest, actors):
        self.workers, self.actors = manifest["workers"], actors
        self.iteration_s: list[float] = []
        self.overhead: list[list[float]] = [[] for _ in actors]
        self.busy: list[list[float]] = [[] for _ in actors]
        self.starts: dict = {}

    def call(self, method: str, args: list, timed: bool = False) -> list:
        import ray
        t0 = time.perf_counter()
        refs = [getattr(a, method).remote(*x) for a, x in zip(self.actors, args)]
        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        back: list = [0.0] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            r = rank_of[ref]
            back[r] = time.perf_counter() - t0
            try:
                res = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                raise self._died(r, method, e) from None
            if isinstance(res, dict) and not res.get("ok", True):
                raise self._failed(r, res)
            results[r] = res
        if timed:
            self.iteration_s.append(time.perf_counter() - t0)
            for r, res in enumerate(results):
                self.overhead[r].append(max(back[r] - res["busy_s"], 0.0))
                self.busy[r].append(res["busy_s"])
                self.starts[self.workers[r]["host"]] = res["start"]
        return results

    def _who(self, r: int) -> str:
        w = self.workers[r]
        return f"worker {w['host']} (rank {r} on host {w['host']}: {', '.join(w['devices'])})"

    def _last_reported(self, r: int) -> str:
        """The op worker r last reported, from any worker still alive."""
        import ray
        for other, actor in enumerate(self.actors):
            if other == r:
                continue
            try:
                label = ray.get(actor.last_reported.remote(), timeout=10).get(r)
            except Exception:  # that worker is gone too (or busy for 10 s): ask the next one
                continue
            if label:
                return label
        return "(no op reported)"

    def _failed(self, r: int, res: dict) -> ClusterRunError:
        return ClusterRunError(f"{self._who(r)} failed: {res['error']}", hint=res.get("hint") or "")

    def _died(self, r: int, method: str, e) -> _WorkerDied:
        where = self._last_reported(r)
        cause = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return _WorkerDied(f"{self._who(r)} died while running {where} (during its {method} call): {cause}",
                           hint="see the worker's log in Ray's session directory (/tmp/ray/session_latest/logs)")


__all__ = ["run_on_ray", "ClusterRun", "ClusterRunError", "ClusterWorker", "RayWorld", "Mailbox"]
