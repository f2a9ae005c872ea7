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

Between workers, tensors go through Ray's object store and collectives are written on it
(``placer/runtime/ray/worker.py``: the worker actor, its mailbox and its world).

Faults: a worker whose step raises returns the error (the op's label, the device as the
cluster names it); a worker that dies is found by Ray (``RayActorError``) and named with
the op it last reported to the other workers (the driver asks a surviving one). Either
way the other workers are killed, nothing is written, and one ``ClusterRunError`` names
the worker, its host and devices, and the op. ``max_restarts`` starts every worker again from its init net
after a worker died (a raised error would only repeat), up to that many times.

Train nets: ``want_state`` brings back each worker's state (parameters, optimizer state)
after the timed steps; warm-up steps train a copy of it that is dropped, as ``placer run``
does, so N timed steps give the parameters of N steps.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from placer.errors import PlacerError
from placer.fileio import note_read
from placer.rewrite.manifest import read_manifest
from placer.runtime.ray.worker import RECV_TIMEOUT_S, ClusterWorker

RESOURCE = "placer_host_{}"
START_TIMEOUT_S = 300.0  # workers that have not started by then could not be placed


class ClusterRunError(PlacerError):
    """A worker failed or died; the message names it, its host and devices, and the op."""


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
    manifest = read_manifest(outdir)
    hosts = [w["host"] for w in manifest["workers"]]
    for w in manifest["workers"]:
        note_read(Path(outdir) / w["net"])
        note_read(Path(outdir) / w["init_net"])
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
                print(f"placer: {e.message}; restarting every worker ({attempt + 1} of {max_restarts})",
                      file=sys.stderr)
    finally:
        if started:
            import ray
            ray.shutdown()


class _WorkerDied(PlacerError):
    pass


def _check_gpus(manifest, emulate: bool) -> None:
    """Workers that ask for more GPUs than the cluster has would wait forever: say so."""
    import ray
    need = 0 if emulate else sum(w["gpus"] for w in manifest["workers"])
    have = ray.cluster_resources().get("GPU", 0)
    if need > have:
        asks = ", ".join(f"{w['host']} {w['gpus']}" for w in manifest["workers"] if w["gpus"])
        raise PlacerError(f"the workers need {need} GPUs ({asks}); the Ray cluster has {have:g}",
                          hint="add --emulate-gpu to emulate them on the CPUs, or start Ray on hosts with GPUs")


def _attempt(manifest, texts, hosts, inputs, iterations, warmup, options, want_state) -> ClusterRun:
    import ray
    _check_gpus(manifest, options["emulate"])
    remote = ray.remote(ClusterWorker)
    actors = []
    for w in manifest["workers"]:
        gpus = 0 if options["emulate"] else w["gpus"]
        actors.append(remote.options(num_cpus=0, num_gpus=gpus, max_concurrency=8, max_restarts=0,
                                     resources={RESOURCE.format(w["host"]): 1}).remote(
            w, *texts[w["host"]], hosts, options))
    driver = _Driver(manifest, actors)
    try:
        driver.call("connect", [(actors,)] * len(actors), timeout_s=START_TIMEOUT_S)
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

    def call(self, method: str, args: list, timed: bool = False, timeout_s: float | None = None) -> list:
        import ray
        t0 = time.perf_counter()
        refs = [getattr(a, method).remote(*x) for a, x in zip(self.actors, args)]
        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: list = [None] * len(refs)
        back: list = [0.0] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not ready:
                late = ", ".join(self.workers[rank_of[ref]]["host"] for ref in pending)
                raise PlacerError(f"worker(s) {late} did not start within {timeout_s:.0f} s: Ray could not "
                                  f"place them", hint="check `ray status`: each host's placer_host_HOST "
                                                      "resource and its GPUs")
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


__all__ = ["run_on_ray", "ClusterRun", "ClusterRunError", "RESOURCE"]
