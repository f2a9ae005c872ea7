"""A cluster: hosts, each a machine (``placer.hardware.machine``), and the network between them, as
one ``Machine`` whose devices are named ``HOST/DEVICE`` (``h0/cpu``, ``h1/cuda:0``).

Device indices follow the machine convention: index 0 is the first host's CPU
(``h0/cpu``), the host that feeds inputs and reads outputs; the other hosts' CPUs are
ordinary CPU devices. Each device keeps its host's CUDA ordinal (``h1/cuda:0`` is GPU 0 of
host h1) and carries its host name (``MachineDevice.host``), which the placed net writes
as Caffe2's ``DeviceOption.node_name``.

Links:
- within a host: that host's machine links (PCIe, NVLink, NVSwitch, staged), their lanes
  prefixed with the host name, so two hosts' PCIe copies never queue on one lane;
- between hosts, from device a on host A to device b on host B: the network hop (the
  cluster's NIC figures, ``latency + bytes / bandwidth``, on the lane of A's NIC: copies
  leaving one host share its NIC), plus, for a GPU end without GPUDirect RDMA, the GPU's
  own PCIe hop to or from host memory on that host (a D2H before, an H2D after: staged
  through host memory, as MPI without CUDA support does). With GPUDirect RDMA the NIC
  reads and writes GPU memory itself: one hop at the slower of the network and that
  GPU's PCIe rate.

Cluster profiles (``profiles/clusters/*.json``, schema in profiles/README.md) name each
host's machine profile (and optionally its CPU profile and memory) and the network, every
figure with its source. On the command line: ``--cluster NAME|FILE``.

Planning over a cluster is ``placer.planning.cluster_plan``: each host's CPU memory is a limit
(parameters kept in several hosts' memory are what a cluster plan is for) and the default
search goes hosts first (``partition/hosts.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from placer.hardware import constants as K
from placer.documents import read_kind
from placer.documents.profiles import ClusterDocument, ClusterNetwork, Host, Hosts
from placer.errors import ProfileError
from placer.hardware.machine import HOST, Hop, Link, Machine, MachineDevice, load_machine
from placer.hardware.device_profile import LinkCurve
from placer.hardware.profiles import ShippedFolder, load_device_profile

@dataclass(frozen=True)
class Network:
    """The network between any two hosts (a non-blocking switch: every pair at the NIC rate)."""

    kind: str                   # "10gbe", "infiniband-hdr", "ethernet-100g", ...
    bytes_per_s: float          # achieved per direction per host NIC
    latency_s: float            # one message, NIC to NIC
    gpudirect_rdma: bool        # the NIC reads/writes GPU memory directly
    source: str = ""


@dataclass
class ClusterMachine(Machine):
    """A ``Machine`` over several hosts (module docstring); ``host_of[d]`` is the host index
    of device d, ``hosts`` the host names, ``host_machines`` each host's own machine."""

    hosts: tuple[str, ...] = ()
    host_machines: tuple[Machine, ...] = ()
    network: Network | None = None
    host_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def devices_of(self, host: int | str) -> list[int]:
        """Device indices of one host (by index or name), its CPU first."""
        h = self.hosts.index(host) if isinstance(host, str) else int(host)
        return [int(d) for d in np.flatnonzero(self.host_of == h)]

    def local_name(self, d: int) -> str:
        """The device's name on its own host: ``cuda:0`` for ``h1/cuda:0``."""
        return self.devices[d].name.partition("/")[2]

    def network_to_local_ratio(self) -> float:
        """How many times longer a 1 MiB copy takes between hosts (the cheapest such link)
        than within a host (the cheapest such link): the spread of link costs that weakens
        alpha-expansion's bound, and why planning goes hosts first."""
        nb = float(2 ** 20)
        local = [link.time_s(nb) for (a, b), link in self.links.items() if self.host_of[a] == self.host_of[b]]
        across = [link.time_s(nb) for (a, b), link in self.links.items() if self.host_of[a] != self.host_of[b]]
        if not across or not local:
            return 1.0
        return min(across) / max(min(local), 1e-12)

    def describe(self) -> str:
        net = self.network
        per_host = "; ".join(f"{h}: {m.describe()}" for h, m in zip(self.hosts, self.host_machines))
        rdma = "GPUDirect RDMA" if net.gpudirect_rdma else "GPU copies staged through host memory"
        return (f"{len(self.hosts)} hosts over {net.kind} ({net.bytes_per_s / 1e9:.3g} GB/s, "
                f"{net.latency_s * 1e6:.3g} us, {rdma}); {per_host}")


# ------------------------------------------------------------------------ building

def build_cluster(name: str, hosts: list[tuple[str, Machine]], network: Network, description: str = "",
                  sources: Mapping[str, str] | None = None, path: str = "") -> ClusterMachine:
    """One machine over ``hosts`` ((name, machine) pairs, the first one feeding the inputs)
    joined by ``network`` (module docstring)."""
    where = path or name
    names = [h for h, _ in hosts]
    if not hosts:
        raise ProfileError(f"{where}: a cluster needs at least one host")
    total = sum(len(m.devices) for _, m in hosts)
    if total > K.MAX_CLUSTER_DEVICES:
        raise ProfileError(f"{where}: {total} devices over {len(hosts)} hosts; placer plans at most "
                           f"{K.MAX_CLUSTER_DEVICES} devices in one cluster")
    for h in names:
        if not h or "/" in h or names.count(h) > 1:
            raise ProfileError(f"{where}: host name {h!r} must be unique, non-empty and without '/'")
    devices: list[MachineDevice] = []
    host_of: list[int] = []
    first: list[int] = []           # index of each host's CPU in the cluster
    for h, (host, m) in enumerate(hosts):
        first.append(len(devices))
        for dev in m.devices:
            devices.append(MachineDevice(f"{host}/{dev.name}", dev.profile, dev.ordinal, host))
            host_of.append(h)
    links: dict[tuple[int, int], Link] = {}
    for h, (host, m) in enumerate(hosts):
        for (a, b), link in m.links.items():
            links[(first[h] + a, first[h] + b)] = _on_host(link, host)
    for ha, (host_a, ma) in enumerate(hosts):
        for hb, (host_b, mb) in enumerate(hosts):
            if ha == hb:
                continue
            for a in range(ma.k):
                for b in range(mb.k):
                    links[(first[ha] + a, first[hb] + b)] = _across(network, host_a, ma, a, host_b, mb, b)
    return ClusterMachine(name, tuple(devices), links, description, dict(sources or {}), path,
                          hosts=tuple(names), host_machines=tuple(m for _, m in hosts), network=network,
                          host_of=np.array(host_of, np.int64))


def _on_host(link: Link, host: str) -> Link:
    """A host's own link with its lanes named after the host."""
    return Link(link.kind, tuple(Hop(h.curve, f"{host}/{h.lane}") for h in link.hops), link.source)


def _across(net: Network, host_a: str, ma: Machine, a: int, host_b: str, mb: Machine, b: int) -> Link:
    """Device a of host A to device b of host B (module docstring)."""
    gpu_a, gpu_b = ma.devices[a].is_gpu, mb.devices[b].is_gpu
    rate, latency = net.bytes_per_s, net.latency_s
    before: tuple[Hop, ...] = ()
    after: tuple[Hop, ...] = ()
    if net.gpudirect_rdma:
        if gpu_a:
            rate = min(rate, ma.links[(a, HOST)].hops[0].curve.bytes_per_s)
        if gpu_b:
            rate = min(rate, mb.links[(HOST, b)].hops[0].curve.bytes_per_s)
    else:
        if gpu_a:
            before = _on_host(ma.links[(a, HOST)], host_a).hops
        if gpu_b:
            after = _on_host(mb.links[(HOST, b)], host_b).hops
    wire = Hop(LinkCurve(latency, rate, []), f"{host_a}/nic:send")
    kind = "network" + ("-rdma" if net.gpudirect_rdma and (gpu_a or gpu_b) else
                        "-staged" if before or after else "")
    how = ("GPUDirect RDMA at the slower of the network and the GPU's PCIe" if kind == "network-rdma" else
           "staged through host memory: the GPU's PCIe hop, then the network" if before or after else "")
    return Link(kind, before + (wire,) + after, "; ".join(s for s in (net.source, how) if s))


# ------------------------------------------------------------------------- loading

# The shipped cluster profiles: profiles/clusters/*.json.
CLUSTERS = ShippedFolder("clusters", "cluster profile")
shipped_clusters_dir = CLUSTERS.path
shipped_cluster_names = CLUSTERS.names
find_cluster = CLUSTERS.find


def load_cluster(name_or_path: str | Path) -> ClusterMachine:
    """A cluster profile file (or a shipped name) as a ``ClusterMachine``."""
    path = find_cluster(name_or_path)
    doc = read_kind(path, ClusterDocument, "cluster", "cluster profile", ProfileError, hint="a machine profile goes to --machine")
    hosts = [(name, _host_machine(h, path)) for name, h in _host_entries(doc.hosts, path)]
    return build_cluster(doc.name, hosts, _network(doc.network), description=doc.description,
                         sources=doc.sources, path=str(path))


def _host_entries(hosts: list[Host] | Hosts, path: Path) -> list[tuple[str, Host | Hosts]]:
    """(name, entry) of each host: a list of named entries, or ``{"count": N, ...}`` for N
    alike hosts h0..hN-1."""
    if isinstance(hosts, list):
        return [(h.name, h) for h in hosts]
    if hosts.count > K.MAX_CLUSTER_DEVICES:
        raise ProfileError(f"{path}: hosts.count {hosts.count}: placer plans at most {K.MAX_CLUSTER_DEVICES} "
                           "devices in one cluster")
    return [(f"{hosts.prefix}{i}", hosts) for i in range(hosts.count)]


def _host_machine(entry: Host | Hosts, path: Path) -> Machine:
    """A host's machine: its machine profile, with the CPU profile and memory the entry gives."""
    base = path.parent.parent if path.parent.name == "clusters" else path.parent
    ref = entry.machine
    local = base / "machines" / f"{ref}.json"
    cpu_profile = None
    if entry.cpu is not None:
        cpu_file = base / f"{entry.cpu}.json"
        cpu_profile = load_device_profile(cpu_file if cpu_file.exists() else entry.cpu, "cpu")
    machine = load_machine(local if local.exists() else ref, cpu_profile)
    if entry.memory_bytes is not None:
        cpu_dev = machine.devices[HOST]
        profile = replace(cpu_dev.profile, memory_capacity_bytes=entry.memory_bytes)
        machine.devices = (replace(cpu_dev, profile=profile),) + machine.devices[1:]
    return machine


def _network(spec: ClusterNetwork) -> Network:
    return Network(spec.kind, spec.bytes_per_s, spec.latency_s, spec.gpudirect_rdma, spec.source)


def add_cluster_argument(parser) -> None:
    """--cluster NAME|FILE for plan (and the commands that take a machine)."""
    parser.add_argument("--cluster", metavar="NAME|FILE",
                        help="plan over several hosts: a cluster profile (hosts, their machines, the "
                             "network; devices named HOST/DEVICE). Shipped: "
                             + ", ".join(shipped_cluster_names()))


__all__ = ["Network", "ClusterMachine", "build_cluster", "load_cluster", "find_cluster",
           "shipped_cluster_names", "add_cluster_argument"]
