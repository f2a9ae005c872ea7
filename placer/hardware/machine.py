"""A machine: its devices (the host CPU, GPUs ``cuda:0..N-1``) and a link for every ordered pair.

Devices are indexed ``0..k-1`` with the host CPU at index 0 (``HOST``): placements,
op-cost matrices and memory figures all use these indices; names (``cpu``, ``cuda:1``)
appear only where a person reads them. GPUs may differ (a V100 and a T4 in one box).

A **link** says how a tensor gets from one device to another, as one or more hops whose
times add, each a latency + bandwidth curve (``LinkCurve``) on a **lane**: copies that
share a lane run one after another (the makespan simulator's resources).
- host -> GPU and GPU -> host: that GPU's PCIe curves (its device profile's ``link``);
  GPUs behind one PCIe switch share its lanes (``pcie_switches``), so their copies queue;
- GPU -> GPU: ``nvlink2/3/4`` (per-link rate x link count of that pair), ``nvswitch``
  (every pair at the GPU's full NVLink rate), ``pcie-p2p`` (peer copies over PCIe, at the
  slower of the two GPUs' host-link rates), or ``staged`` through host memory when P2P is
  off (the source's D2H hop, then the destination's H2D hop).
Every figure carries its source: the device profiles' own, and ``LINK_KINDS`` here.

Machine profile files (``profiles/machines/*.json``, schema in profiles/README.md) name a
host profile, the GPUs' profiles, the peer links per pair and the PCIe switches. On the
command line: ``--machine NAME|FILE``, or composed from ``--cpu-profile``,
``--gpu-profile``, ``--gpus N`` and ``--gpu-link KIND`` (every pair the same); the
single-GPU options alone give the CPU + one GPU machine they always meant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from placer import arguments
from placer.hardware import constants as K
from placer.documents import read_kind
from placer.documents.profiles import MAX_GPUS_PER_MACHINE, PEER_KINDS, MachineDocument
from placer.errors import ProfileError
from placer.hardware.device_profile import DeviceProfile, LinkCurve
from placer.hardware.profiles import ShippedFolder, load_device_profile, profiles_from_args
from placer.types import Net

HOST = 0  # index of the host CPU in every machine

# GPU <-> GPU link kinds: (per-link bytes/s, links a GPU has when every pair gets the whole
# fabric, source). ``count`` in a machine profile multiplies the per-link rate.
LINK_KINDS: dict[str, dict[str, Any]] = {
    "nvlink2": {"link_bytes_per_s": K.NVLINK2_LINK_BYTES_PER_S,
                "source": "NVLink 2 (V100): 20 GB/s per link per direction, NCCL's per-link figure "
                          "(src/graph/tuning.cc); theoretical 25 GB/s"},
    "nvlink3": {"link_bytes_per_s": K.NVLINK3_LINK_BYTES_PER_S,
                "source": "NVLink 3 (A100): 20 GB/s per link per direction, NCCL's per-link figure"},
    "nvlink4": {"link_bytes_per_s": K.NVLINK4_LINK_BYTES_PER_S,
                "source": "NVLink 4 (H100/H200): 20.6 GB/s per link per direction, NCCL's per-link figure"},
    "nvswitch-a100": {"link_bytes_per_s": K.NVLINK3_LINK_BYTES_PER_S * K.NVLINK3_LINKS_PER_GPU,
                      "source": "NVSwitch, A100 SXM4: 12 NVLink 3 links x 20 GB/s per direction (NCCL's "
                                "per-link figure) between any two GPUs"},
    "nvswitch-h100": {"link_bytes_per_s": K.NVLINK4_LINK_BYTES_PER_S * K.NVLINK4_LINKS_PER_GPU,
                      "source": "NVSwitch, H100/H200 SXM5: 18 NVLink 4 links x 20.6 GB/s per direction "
                                "(NCCL's per-link figure) between any two GPUs"},
}


@dataclass(frozen=True)
class MachineDevice:
    """One device of a machine: its name, profile and CUDA ordinal (``device_id``)."""

    name: str                   # "cpu", "cuda:0", ...; "h1/cuda:0" on a cluster
    profile: DeviceProfile
    ordinal: int = 0            # device_id in a NetDef device_option (0 for the CPU)
    host: str = ""              # cluster host name; "" on one machine

    @property
    def kind(self) -> str:
        return self.profile.kind

    @property
    def is_gpu(self) -> bool:
        return self.profile.kind == "gpu"


@dataclass(frozen=True)
class Hop:
    curve: LinkCurve
    lane: str                   # copies on one lane run one at a time


@dataclass(frozen=True)
class Link:
    """How bytes get from one device to another: hops whose times add."""

    kind: str                   # "pcie", "staged", "pcie-p2p", "nvlink2", ..., "local"
    hops: tuple[Hop, ...]
    source: str = ""

    def time_s(self, nbytes):
        """Seconds to copy ``nbytes`` (a number or an array): the hops' times added."""
        scalar = np.ndim(nbytes) == 0
        nb = np.atleast_1d(np.asarray(nbytes, np.float64))
        out = np.zeros(nb.shape)
        for hop in self.hops:
            out += curve_times(hop.curve, nb)
        out[nb <= 0] = 0.0
        return float(out[0]) if scalar else out

    @property
    def key(self) -> tuple:
        """Links with equal keys cost the same for every size (they share a cost row)."""
        return tuple((h.curve.latency_s, h.curve.bytes_per_s, tuple(h.curve.points)) for h in self.hops)


def curve_times(curve: LinkCurve, nbytes: np.ndarray) -> np.ndarray:
    """Copy times over a curve: measured points interpolated log-log inside their range,
    the fitted line ``latency + bytes / bandwidth`` outside it (vectorised ``curve_time``)."""
    nb = np.asarray(nbytes, np.float64)
    line = curve.latency_s + nb / curve.bytes_per_s
    pts = curve.points
    if len(pts) < 2:
        return line
    sizes = np.log([p[0] for p in pts])
    times = np.log([max(p[1], 1e-12) for p in pts])
    inside = (nb >= pts[0][0]) & (nb <= pts[-1][0])
    out = line.copy()
    if inside.any():
        out[inside] = np.exp(np.interp(np.log(nb[inside]), sizes, times))
    return out


@dataclass(frozen=True)
class LinkTables:
    """``Machine.link_classes``: ``link_class[a, b]`` indexes ``classes`` (-1 on the
    diagonal); ``routes[(a, b)]`` lists each hop as (lane index into ``lanes``, class)."""

    link_class: np.ndarray
    classes: list
    lanes: tuple[str, ...]
    routes: dict

    def class_seconds(self, nbytes: np.ndarray) -> np.ndarray:
        """float [C, T]: the copy time of every tensor over every class."""
        nb = np.asarray(nbytes, np.float64)
        if not self.classes:
            return np.zeros((0, len(nb)))
        return np.stack([link.time_s(nb) for link in self.classes])


@dataclass
class Machine:
    """Devices (index 0 the host CPU) and a ``Link`` for every ordered pair of devices."""

    name: str
    devices: tuple[MachineDevice, ...]
    links: dict[tuple[int, int], Link]
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""

    @property
    def k(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    @property
    def gpus(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if d.is_gpu]

    def link(self, src: int, dst: int) -> Link:
        return self.links[(src, dst)]

    def copy_time(self, nbytes, src: int, dst: int):
        if src == dst:
            return 0.0 if np.ndim(nbytes) == 0 else np.zeros(np.shape(nbytes))
        return self.links[(src, dst)].time_s(nbytes)

    def index(self, name: str) -> int:
        """The index of a device named ``cpu``, ``cuda:N`` (``gpu`` = the only GPU)."""
        names = self.names
        if name in names:
            return names.index(name)
        if name == "gpu" and len(self.gpus) == 1:
            return self.gpus[0]
        hint = ", ".join(names)
        if name == "gpu":
            raise ProfileError(f"'gpu' is ambiguous on machine {self.name} with {len(self.gpus)} GPUs",
                               hint=f"name one of: {hint}")
        raise ProfileError(f"machine {self.name} has no device '{name}'", hint=f"devices: {hint}")

    def link_classes(self) -> "LinkTables":
        """The links as cost classes: pairs whose links cost the same for every size share
        a class (so per-tensor copy times are computed once per class), and each hop of a
        link is a class too, with the lane it runs on (the makespan simulator's resources)."""
        keys: dict[tuple, int] = {}
        classes: list[Link] = []

        def class_of(link: Link) -> int:
            c = keys.setdefault(link.key, len(classes))
            if c == len(classes):
                classes.append(link)
            return c

        cls = np.full((self.k, self.k), -1, np.int64)
        lanes: dict[str, int] = {}
        routes: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        for (a, b), link in sorted(self.links.items()):
            cls[a, b] = class_of(link)
            routes[(a, b)] = tuple((lanes.setdefault(h.lane, len(lanes)), class_of(Link(link.kind, (h,))))
                                   for h in link.hops)
        return LinkTables(cls, classes, tuple(lanes), routes)

    def memory_capacity(self) -> np.ndarray:
        """Memory capacity of each device in bytes (the profiles' figures)."""
        return np.array([d.profile.memory_capacity_bytes for d in self.devices], np.float64)

    def describe(self) -> str:
        gpus = [self.devices[i].profile.name for i in self.gpus]
        kinds = sorted({l.kind for (a, b), l in self.links.items()
                        if self.devices[a].is_gpu and self.devices[b].is_gpu})
        parts = [self.devices[HOST].profile.name]
        if gpus:
            counts: dict[str, int] = {}
            for g in gpus:
                counts[g] = counts.get(g, 0) + 1
            parts.append(" + ".join(f"{n} x {g}" if n > 1 else g for g, n in counts.items()))
        if kinds:
            parts.append("GPU links: " + ", ".join(kinds))
        return "; ".join(parts)


# ------------------------------------------------------------------------ building

def _host_link(gpu: MachineDevice, direction: str, lane: str) -> Hop:
    link = gpu.profile.link
    if not link:
        raise ProfileError(f"GPU profile '{gpu.profile.name}' has no host link figures",
                           hint="use a shipped GPU profile or run `placer profile --link`")
    return Hop(link[direction]["pinned"], lane)


def build_machine(name: str, host: DeviceProfile, gpus: Sequence[DeviceProfile],
                  peer_default: str = "staged", peer_links: Sequence[Mapping] = (),
                  pcie_switches: Sequence[Sequence[int]] = (), description: str = "",
                  sources: Mapping[str, str] | None = None, path: str = "",
                  peer_curves: Sequence[Mapping] = ()) -> Machine:
    """A machine from its profiles and topology (module docstring for the link kinds).

    ``peer_links``: ``{"gpus": [a, b], "kind": "nvlink2", "count": 2}`` per connected pair
    (both directions); other pairs get ``peer_default``. ``pcie_switches``: groups of GPU
    numbers that share one PCIe switch. ``peer_curves``: measured ``{"src", "dst",
    "latency_s", "bytes_per_s", "points"}`` GPU -> GPU curves, which replace the kind's figures.
    """
    where = path or name
    if host.kind != "cpu":
        raise ProfileError(f"{where}: the host profile '{host.name}' is a {host.kind} profile")
    if len(gpus) > MAX_GPUS_PER_MACHINE:
        raise ProfileError(f"{where}: {len(gpus)} GPUs in one machine; placer models at most "
                           f"{MAX_GPUS_PER_MACHINE} per host",
                           hint="describe several hosts with a cluster profile (--cluster)")
    devices = [MachineDevice("cpu", host, 0)]
    for g, prof in enumerate(gpus):
        if prof.kind != "gpu":
            raise ProfileError(f"{where}: GPU {g} profile '{prof.name}' is a {prof.kind} profile")
        devices.append(MachineDevice(f"cuda:{g}", prof, g))
    n = len(gpus)
    switch_of = {g: f"cuda:{g}" for g in range(n)}      # the PCIe path a GPU's copies take
    for s, group in enumerate(pcie_switches):
        for g in group:
            _check_gpu(g, n, where, "pcie_switches")
            switch_of[g] = f"switch{s}"
    links: dict[tuple[int, int], Link] = {}
    for g in range(n):
        dev, lane = devices[g + 1], f"pcie[{switch_of[g]}]"
        src = dev.profile.source.get("figures", {}).get("link", dev.profile.source.get("kind", ""))
        links[(HOST, g + 1)] = Link("pcie", (_host_link(dev, "h2d", f"{lane}:h2d"),), src)
        links[(g + 1, HOST)] = Link("pcie", (_host_link(dev, "d2h", f"{lane}:d2h"),), src)
    pairs: dict[tuple[int, int], tuple[str, int]] = {}
    for spec in peer_links:
        a, b = (int(x) for x in spec["gpus"])
        for g in (a, b):
            _check_gpu(g, n, where, "peer_links")
        if a == b:
            raise ProfileError(f"{where}: peer_links pairs GPU {a} with itself")
        kind, count = str(spec.get("kind", "")), int(spec.get("count", 1))
        if kind not in PEER_KINDS:
            raise ProfileError(f"{where}: peer link kind '{kind}' is unknown",
                               hint=f"one of: {', '.join(PEER_KINDS)}")
        if count < 1:
            raise ProfileError(f"{where}: peer link {a}-{b} has count {count}; it must be >= 1")
        pairs[(a, b)] = pairs[(b, a)] = (kind, count)
    if peer_default not in PEER_KINDS:
        raise ProfileError(f"{where}: peer_default '{peer_default}' is unknown",
                           hint=f"one of: {', '.join(PEER_KINDS)}")
    measured = {(int(c["src"]), int(c["dst"])): c for c in peer_curves}
    for a in range(n):
        for b in range(n):
            if a != b:
                kind, count = pairs.get((a, b), (peer_default, 1))
                links[(a + 1, b + 1)] = _peer_link(links, a + 1, b + 1, kind, count, measured.get((a, b)))
    return Machine(name, tuple(devices), links, description, dict(sources or {}), path)


def _check_gpu(g: int, n: int, where: str, what: str) -> None:
    if not 0 <= g < n:
        raise ProfileError(f"{where}: {what} names GPU {g}, but the machine has GPUs 0..{n - 1}")


def _peer_link(links, a: int, b: int, kind: str, count: int, measured: Mapping | None) -> Link:
    if measured is not None:
        curve = LinkCurve(float(measured["latency_s"]), float(measured["bytes_per_s"]),
                          [tuple(p) for p in measured.get("points", [])])
        return Link(kind, (Hop(curve, _peer_lane(a, b)),), "measured by placer profile --link")
    if kind == "staged":  # through pinned host memory: the source's D2H, then the destination's H2D
        return Link("staged", links[(a, HOST)].hops + links[(HOST, b)].hops,
                    "staged through host memory: D2H then H2D, each at its PCIe figure")
    if kind == "pcie-p2p":
        up, down = links[(a, HOST)].hops[0].curve, links[(HOST, b)].hops[0].curve
        curve = LinkCurve(max(up.latency_s, down.latency_s), min(up.bytes_per_s, down.bytes_per_s))
        return Link(kind, (Hop(curve, _peer_lane(a, b)),),
                    "peer-to-peer over PCIe: the slower of the two GPUs' PCIe figures")
    spec = LINK_KINDS[kind]
    curve = LinkCurve(K.PEER_LATENCY_S, spec["link_bytes_per_s"] * count)
    return Link(kind, (Hop(curve, _peer_lane(a, b)),),
                f"{spec['source']}" + (f"; {count} links" if count > 1 else ""))


def _peer_lane(a: int, b: int) -> str:
    """Lane of direct copies from device a to device b (device indices; GPU g is g + 1)."""
    return f"cuda:{a - 1}->cuda:{b - 1}"


# ------------------------------------------------------------------------- loading

# The shipped machine profiles: profiles/machines/*.json.
MACHINES = ShippedFolder("machines", "machine profile")
shipped_machines_dir = MACHINES.path
shipped_machine_names = MACHINES.names
find_machine = MACHINES.find


def load_machine(name_or_path: str | Path, host: DeviceProfile | None = None) -> Machine:
    """A machine profile file (or a shipped name); ``host`` replaces its host profile
    (a measured one, from ``--cpu-profile``)."""
    path = find_machine(name_or_path)
    doc = read_kind(path, MachineDocument, "machine", "machine profile", ProfileError, hint="a device profile goes to --cpu-profile / --gpu-profile")
    base = path.parent.parent if path.parent.name == "machines" else path.parent

    def device(ref: str, kind: str) -> DeviceProfile:
        local = base / f"{ref}.json"
        return load_device_profile(local if local.exists() else ref, kind)

    gpus: list[DeviceProfile] = []
    for g in doc.gpus:
        if isinstance(g, str):
            gpus.append(device(g, "gpu"))
        else:
            gpus += [device(g.profile, "gpu")] * g.count
    return build_machine(doc.name, host or device(doc.host, "cpu"), gpus, peer_default=doc.peer_default,
                         peer_links=[link.model_dump() for link in doc.peer_links],
                         pcie_switches=doc.pcie_switches, description=doc.description, sources=doc.sources,
                         path=str(path), peer_curves=[curve.model_dump() for curve in doc.peer_curves])


def compose_machine(host: DeviceProfile, gpu: DeviceProfile, gpus: int = 1,
                    gpu_link: str = "staged", link_count: int = 1) -> Machine:
    """The machine of ``--gpu-profile P --gpus N --gpu-link KIND``: N copies of P, every
    pair of GPUs joined by ``link_count`` links of KIND."""
    if gpus < 0:
        raise ProfileError(f"--gpus {gpus}: must be 0 or more")
    if gpus > MAX_GPUS_PER_MACHINE:
        raise ProfileError(f"--gpus {gpus}: placer models at most {MAX_GPUS_PER_MACHINE} GPUs in one machine",
                           hint="describe several hosts with a cluster profile (--cluster)")
    pairs = [{"gpus": [a, b], "kind": gpu_link, "count": link_count}
             for a in range(gpus) for b in range(a + 1, gpus)]
    name = gpu.name if gpus == 1 else f"{gpus} x {gpu.name}"
    return build_machine(name, host, [gpu] * gpus, peer_default=gpu_link, peer_links=pairs,
                         description=f"{host.name} + {name}" + (f", {gpu_link} between GPUs" if gpus > 1 else ""))


def machine_from_args(args) -> Machine:
    """The machine the command line describes (module docstring)."""
    given_cpu = getattr(args, "cpu_profile", None)
    if getattr(args, "machine", None):
        if getattr(args, "gpu_profile", None) or getattr(args, "gpus", None) is not None:
            raise ProfileError("--machine already names the GPUs; drop --gpu-profile / --gpus")
        return load_machine(args.machine, load_device_profile(given_cpu, "cpu") if given_cpu else None)
    cpu, gpu = profiles_from_args(args)
    gpus = getattr(args, "gpus", None)
    link = getattr(args, "gpu_link", None) or "staged"
    if link not in PEER_KINDS:
        raise ProfileError(f"--gpu-link {link}: unknown link kind", hint=f"one of: {', '.join(PEER_KINDS)}")
    count = getattr(args, "gpu_link_count", None)
    if count is not None and count < 1:
        raise ProfileError(f"--gpu-link-count {count}: a GPU pair has 1 or more links",
                           hint="give the NVLink count per pair, e.g. 2, or leave it out for 1")
    count = count or 1
    return compose_machine(cpu, gpu, 1 if gpus is None else gpus, link, count)


def add_machine_arguments(parser) -> None:
    """--machine / --gpus / --gpu-link / --gpu-link-count (besides the profile options)."""
    g = parser.add_argument_group("machine (several GPUs)")
    g.add_argument("--machine", metavar="NAME|FILE",
                   help="a machine profile: host, GPUs and the links between them (shipped: "
                        + ", ".join(shipped_machine_names()) + ")")
    g.add_argument("--gpus", type=arguments.count(0), metavar="N",
                   help="this many GPUs of --gpu-profile (default 1)")
    g.add_argument("--gpu-link", metavar="KIND", choices=PEER_KINDS,
                   help="link between every pair of GPUs with --gpus: " + ", ".join(PEER_KINDS)
                        + " (default: staged through host memory)")
    g.add_argument("--gpu-link-count", type=arguments.count(1), metavar="N",
                   help="links per GPU pair for the nvlink kinds (default 1)")


def existing_placement(net: Net, machine: Machine) -> np.ndarray | None:
    """The placement the file carries (device index per op; ops without a device option
    on the host), when any op has one and every device it names exists on the machine."""
    if all(op.device is None for op in net.ops):
        return None
    names = machine.names
    dev = np.zeros(len(net.ops), np.int64)
    for op in net.ops:
        if op.device is not None and op.device.kind != "cpu":
            name = f"cuda:{op.device.index}"
            if name not in names:
                return None
            dev[op.index] = names.index(name)
    return dev
