"""Placement over a cluster: hosts first, then the devices within each host, then a joint
refinement (DESIGN.md "Partitioning": non-uniform links weaken alpha-expansion's bound).

A network link costs several to a hundred times an intra-host link of the same bytes
(``ClusterMachine.network_to_local_ratio``). Alpha-expansion's 2x bound holds for one
uniform copy cost and degrades with the spread of link costs, and its moves only ever
send ops *to* one device, so a first move that scatters ops over a remote host is hard
to undo. So:

1. **hosts**: each host becomes one device of a collapsed problem (``host_arrays``): op i
   on host h costs its fastest feasible device there, a tensor crossing hosts costs the
   CPU-to-CPU network link between them, copies within a host cost nothing, and a host's
   memory is the sum of its devices'. This is the problem the network decides; it is
   solved like any other (exact min-cut or the memory-limited search for two hosts,
   alpha-expansion or the memory-limited search for more).
2. **devices**: every op is restricted to its host's devices and the k-device problem is
   solved with the real links (an op may still change device within its host; a tensor
   that crosses hosts now pays its GPU's PCIe hops too).
3. **joint**: alpha-expansion over all k devices from that placement and from the usual
   starts (without memory limits; the cheapest wins, so the result is never worse than the
   flat search), or local moves that keep every device within its memory (with limits).

Nothing here knows what a host is beyond ``host_of`` (device -> host index) and each
host's CPU (``host_cpus``), so it is tested on hand-built cost arrays.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from placer.errors import InfeasiblePlanError
from placer.partition.base import Chooser
from placer.partition.expansion import expansion_placement
from placer.partition.explain import make_plan
from placer.partition.memory import improve
from placer.partition.problem import CostArrays, serial_cost
from placer.types import Plan


def host_arrays(arr: CostArrays, host_of: np.ndarray, host_cpus: list[int], hosts: tuple[str, ...]) -> CostArrays:
    """The collapsed problem of step 1 (module docstring): one device per host."""
    H = len(hosts)
    n = arr.n_ops
    feasible = arr.feasible
    op_s = np.full((n, H), 0.0)
    allowed = np.zeros((n, H), bool)
    capacity = np.zeros(H)
    for h in range(H):
        mine = host_of == h
        times = np.where(feasible[:, mine], arr.op_s[:, mine], np.inf)
        best = times.min(axis=1) if n else np.zeros(0)
        allowed[:, h] = np.isfinite(best)
        op_s[:, h] = np.where(allowed[:, h], best, 0.0)
        capacity[h] = arr.capacity[mine].sum()
    # a host an op may not use keeps a finite time (never chosen: ``allowed`` rules it out)
    worst = op_s.max() if op_s.size else 0.0
    op_s[~allowed] = worst
    link_class = np.full((H, H), -1, np.int64)
    for a in range(H):
        for b in range(H):
            if a != b:
                link_class[a, b] = arr.link_class[host_cpus[a], host_cpus[b]]
    return CostArrays(
        op_s=op_s, allowed=allowed, param_bytes=arr.param_bytes, output_bytes=arr.output_bytes,
        t_producer=arr.t_producer, t_ptr=arr.t_ptr, t_cons=arr.t_cons, t_bytes=arr.t_bytes,
        t_ext_out=arr.t_ext_out, link_class=link_class, class_s=arr.class_s, devices=tuple(hosts),
        device_kinds=("cpu",) * H, capacity=capacity, host=int(host_of[arr.host]),
        colocate=arr.colocate, outputs_on_host=arr.outputs_on_host, names=arr.names, types=arr.types,
        t_names=arr.t_names, pin_reason=arr.pin_reason)


def within_hosts(arr: CostArrays, host_of: np.ndarray, on_host: np.ndarray) -> CostArrays:
    """``arr`` with every op restricted to the devices of its host (``on_host[i]``)."""
    allowed = arr.allowed & (host_of[None, :] == np.asarray(on_host)[:, None])
    return replace(arr, allowed=allowed)


class HostsFirstPartitioner:
    """The serial objective over a cluster's devices (module docstring). Steps 1 and 2 are
    solved by ``choose`` (``placer.partition.partition``) with method "expansion"."""

    method = "hosts-first"

    def __init__(self, choose: Chooser, host_of, host_cpus: list[int], hosts: tuple[str, ...],
                 time_limit: float = 10.0, improve_time_s: float = 2.0):
        self.choose = choose
        self.host_of = np.asarray(host_of, np.int64)
        self.host_cpus, self.hosts = list(host_cpus), tuple(hosts)
        self.time_limit, self.improve_time_s = time_limit, improve_time_s

    @classmethod
    def from_device_names(cls, arr: CostArrays, choose: Chooser, time_limit: float = 10.0) -> HostsFirstPartitioner:
        """The hosts read from ``arr``'s device names (``HOST/DEVICE``; a name without a
        host is one host of its own kind, ""), each host's CPU its first "cpu" device."""
        hosts = tuple(dict.fromkeys(d.rpartition("/")[0] for d in arr.devices))
        host_of = np.array([hosts.index(d.rpartition("/")[0]) for d in arr.devices], np.int64)
        cpus = []
        for h in range(len(hosts)):
            mine = np.flatnonzero(host_of == h)
            cpu = [d for d in mine if arr.device_kinds[d] == "cpu"]
            cpus.append(int(cpu[0] if cpu else mine[0]))
        return cls(choose, host_of, cpus, hosts, time_limit)

    def partition(self, arr: CostArrays) -> Plan:
        limited = bool(np.isfinite(arr.capacity).any())
        collapsed = host_arrays(arr, self.host_of, self.host_cpus, self.hosts)
        # 1. hosts
        by_host = self.choose(collapsed, "expansion", self.time_limit).placement
        # 2. devices within each host (a host-level plan may not fit device by device)
        notes = [f"hosts first: {_count_text(by_host, self.hosts)}"]
        try:
            dev = self.choose(within_hosts(arr, self.host_of, by_host), "expansion", self.time_limit).placement
        except InfeasiblePlanError as e:
            notes.append(f"the host-level plan does not fit device by device ({e.message}); planned flat")
            dev = self.choose(arr, "expansion", self.time_limit).placement
        # 3. joint refinement over every device
        staged = serial_cost(arr, dev).total_s
        dev = self._refine(arr, dev, limited)
        total = serial_cost(arr, dev).total_s
        notes.append(f"hosts then devices: {staged:.6g} s; joint refinement over all devices: {total:.6g} s")
        return make_plan(arr, dev, self.method, notes=notes)

    def _refine(self, arr: CostArrays, dev: np.ndarray, limited: bool) -> np.ndarray:
        if limited:
            return improve(arr, dev, self.improve_time_s)
        best, _ = expansion_placement(arr, initial=[dev])
        return best if serial_cost(arr, best).total_s <= serial_cost(arr, dev).total_s else dev


def _count_text(by_host: np.ndarray, hosts: tuple[str, ...]) -> str:
    counts = np.bincount(by_host, minlength=len(hosts))
    return ", ".join(f"{n} ops on {h or 'the one host'}" for h, n in zip(hosts, counts))


__all__ = ["host_arrays", "within_hosts", "HostsFirstPartitioner"]
