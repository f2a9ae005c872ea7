"""What a collective costs on a machine: ring, tree and pairwise-exchange models from its links.

The unit of a collective is S, the bytes nccl-tests sizes it by: one rank's buffer for
all-reduce, broadcast and reduce; the whole gathered (or not yet scattered) tensor for
all-gather and reduce-scatter; one rank's send buffer for all-to-all. n ranks, each a
device of a ``placer.hardware.machine.Machine``.

**Ring** (NCCL's default; NCCL src/graph/tuning.cc). Ranks in a ring r0 -> r1 -> ... ->
r0; every step each rank sends one chunk to the next, all edges at once, so a step lasts
as long as the slowest edge takes for its chunk. With chunks of S/n:

    reduce-scatter, all-gather:  n-1 steps         -> (n-1)/n * S / B  + (n-1)  * l
    all-reduce = reduce-scatter then all-gather     -> 2(n-1)/n * S / B + 2(n-1) * l
    broadcast, reduce: a pipelined chain of n-1 edges, every byte crosses each once
                                                    -> S / B           + (n-1)  * l

plus NCCL's base latency (8.4 us, Simple protocol). B is the ring's bandwidth: the
slowest edge, where an edge costs the sum over the hops of its link (a staged pair is
D2H then H2D) of ``share / hop bandwidth``, ``share`` being how many edges of the ring use
that hop's lane at once (two GPUs behind one PCIe switch share its uplink). l is the
per-hop latency of the slowest class of link in the ring (NCCL's Simple-protocol ring
figures: NVLink 3.4 us, PCIe 5.7 us, network 9.6 us); across hosts NCCL charges network
latency on the 2(h-1) steps that cross hosts (h hosts) and intra-host latency on the
others, and so does this model. The ring order is chosen to maximise B: every order for
n <= 8 (NCCL searches its rings the same way, over the topology), greedy beyond.

nccl-tests reports the bus bandwidth busbw = (S / t) * 2(n-1)/n for all-reduce and
(n-1)/n for reduce-scatter, all-gather and all-to-all (1 for broadcast, reduce): for
large S the ring's busbw tends to B itself, which is how measured figures check a
machine profile (``bus_bytes_per_s``).

**Tree** (all-reduce only): NCCL's trees are chains inside a host and a binary tree
across hosts; a byte goes up and comes down, and NCCL converts bus to algorithm
bandwidth with ratio 1/2 for trees (versus n / 2(n-1) for rings):

    2 * S / B + 2 * ((n/h - 1) * l_intra + ceil(log2 h) * l_net)

On one host a tree never beats the ring (same hop count, half the bandwidth); across
hosts it wins for small S. ``allreduce`` takes whichever is faster.

**NVLS** (all-reduce on one host whose every pair of ranks is joined by a third-generation
NVSwitch, ``constants.NVLS_LINK_KINDS``): the switch reduces, so each rank sends its
buffer up once and receives the result once: S / (B * e) + latency, e =
``NVLS_EFFICIENCY`` (fitted to the measured 8x H100 / H200 busbw), latency NCCL's base
latency plus two NVLink hops (to the switch and back; an estimate). Taken when faster
than the ring.

**Pairwise exchange** (all-to-all): n-1 rounds; in round k rank i sends its chunk for
rank i+k (S/n bytes). A round is a permutation, priced like a ring step (slowest pair
with lane sharing), so on a switch whose every pair runs at the port rate B it gives
(n-1)/n * S / B, and on a partial mesh the slow pairs show.

Figures from links are the machine profile's (``placer/hardware/machine.py``, every one with its
source); ``MULTIDEVICE_FACTS.md`` lists the measured busbw these are checked against
(tests/test_collectives_cost.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from placer.hardware.constants import NVLS_EFFICIENCY, NVLS_LINK_KINDS
from placer.errors import PlacerError

# NCCL src/graph/tuning.cc: baseLat (Ring, Simple) and hwLat (Ring, Simple) per hop, in us.
NCCL_BASE_LATENCY_S = 8.4e-6
HOP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 9.6e-6}
EXHAUSTIVE_RING_RANKS = 8          # every ring order up to this many ranks (7! = 5040 orders)

KINDS = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")
# nccl-tests' bus-bandwidth factor per collective (its doc/PERFORMANCE.md)
_BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
               "allgather": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def link_class(kind: str) -> str:
    """NCCL's hardware class of a placer link kind: nvlink, pcie or network."""
    if kind.startswith(("nvlink", "nvswitch")):
        return "nvlink"
    if kind in ("pcie", "pcie-p2p", "staged", "local"):
        return "pcie"
    return "network"


def bus_bytes(kind: str, nbytes: float, n: int) -> float:
    """nccl-tests' bus bytes of a collective of S = ``nbytes``: S times its bus factor, the
    bytes whose passage through the bottleneck B the transfer time is (ring, chain and
    pairwise alike): busbw = bus bytes / time."""
    return nbytes * _BUS_FACTOR[kind](n) if n > 1 else 0.0


def ring_edge_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes each edge of a ring (each pair of a pairwise exchange) carries for one
    collective of S = ``nbytes`` over ``n`` ranks (the sum that a run record's bytes per
    link shows for NCCL's ring)."""
    if n <= 1:
        return 0.0
    return {"allreduce": 2 * (n - 1) / n * nbytes, "reducescatter": (n - 1) / n * nbytes,
            "allgather": (n - 1) / n * nbytes, "broadcast": float(nbytes), "reduce": float(nbytes),
            "alltoall": nbytes / n}[kind]


@dataclass(frozen=True)
class CollectiveTime:
    """One collective priced: which algorithm, over which ranks (ring order), the
    bottleneck bandwidth B and latency, and the total seconds."""

    kind: str
    algorithm: str                  # "ring", "tree", "nvls", "chain", "pairwise" or "local"
    ranks: tuple[int, ...]          # machine device indices, in ring order
    nbytes: float                   # S, as nccl-tests sizes it
    bandwidth_bytes_per_s: float    # B
    latency_s: float
    time_s: float

    @property
    def bus_bytes_per_s(self) -> float:
        """nccl-tests' busbw for this size: algbw (S / t) times the collective's factor."""
        n = len(self.ranks)
        if self.time_s <= 0 or n <= 1:
            return 0.0
        return bus_bytes(self.kind, self.nbytes, n) / self.time_s


class CollectiveModel:
    """Collective times on one machine; ring orders and their bandwidths are cached per
    set of ranks (a planner asks for every gradient of a net)."""

    def __init__(self, machine):
        self.machine = machine
        self._rings: dict[tuple[int, ...], tuple[tuple[int, ...], float]] = {}

    # -- bandwidth of a set of simultaneous transfers ----------------------------------

    def step_seconds_per_byte(self, edges: Sequence[tuple[int, int]]) -> float:
        """Seconds per byte of the slowest of ``edges`` when all run at once: per edge, the
        sum over its link's hops of (edges sharing that hop's lane) / (hop bandwidth)."""
        routes = [self.machine.link(a, b).hops for a, b in edges]
        load: dict[str, int] = {}
        for hops in routes:
            for hop in hops:
                load[hop.lane] = load.get(hop.lane, 0) + 1
        return max(sum(load[h.lane] / h.curve.bytes_per_s for h in hops) for hops in routes)

    def ring_bandwidth(self, order: Sequence[int]) -> float:
        """B of the ring r0 -> r1 -> ... -> r0 (bytes per second)."""
        edges = [(a, b) for a, b in zip(order, tuple(order[1:]) + (order[0],))]
        return 1.0 / self.step_seconds_per_byte(edges)

    def best_ring(self, ranks: Sequence[int]) -> tuple[tuple[int, ...], float]:
        """(ring order, B) with the highest B: every order (first rank fixed) for up to
        ``EXHAUSTIVE_RING_RANKS`` ranks; beyond, greedily the fastest next link."""
        key = tuple(ranks)
        if key not in self._rings:
            self._rings[key] = self._search_ring(key)
        return self._rings[key]

    def _search_ring(self, ranks: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
        first, rest = ranks[0], ranks[1:]
        if len(ranks) <= EXHAUSTIVE_RING_RANKS:
            orders = ((first,) + p for p in itertools.permutations(rest))
            return max(((o, self.ring_bandwidth(o)) for o in orders), key=lambda ob: ob[1])
        order, left = [first], list(rest)
        while left:
            nxt = max(left, key=lambda b: self.machine.link(order[-1], b).hops[0].curve.bytes_per_s)
            order.append(nxt)
            left.remove(nxt)
        return tuple(order), self.ring_bandwidth(order)

    # -- latency ------------------------------------------------------------------------

    def hop_latency_s(self, order: Sequence[int]) -> tuple[float, float]:
        """(intra-host, network) per-hop latency of a ring: the slowest link class among its
        edges inside a host, and the network figure."""
        classes = [link_class(self.machine.link(a, b).kind)
                   for a, b in zip(order, tuple(order[1:]) + (order[0],))
                   if self._host(a) == self._host(b)]
        intra = max((HOP_LATENCY_S[c] for c in classes if c != "network"), default=HOP_LATENCY_S["pcie"])
        return intra, HOP_LATENCY_S["network"]

    def _host(self, index: int) -> str:
        return self.machine.devices[index].host

    def _hosts(self, ranks: Sequence[int]) -> int:
        return len({self._host(r) for r in ranks})

    # -- the collectives ------------------------------------------------------------------

    def time(self, kind: str, nbytes: float, ranks: Sequence[int]) -> CollectiveTime:
        """The cost of collective ``kind`` of S = ``nbytes`` over ``ranks`` (device indices)."""
        if kind not in KINDS:
            raise PlacerError(f"collective '{kind}' is unknown", hint=f"one of {', '.join(KINDS)}")
        ranks = tuple(ranks)
        if len(set(ranks)) != len(ranks):
            raise PlacerError(f"{kind} over devices {ranks}: a device appears twice",
                              hint="a collective has one rank per device")
        if len(ranks) <= 1:
            return CollectiveTime(kind, "local", ranks, float(nbytes), math.inf, 0.0, 0.0)
        if kind == "alltoall":
            return self._pairwise(nbytes, ranks)
        ring = self._ring(kind, nbytes, ranks)
        if kind == "allreduce" and self._hosts(ranks) > 1:
            tree = self._tree(nbytes, ranks, ring)
            return min(ring, tree, key=lambda c: c.time_s)
        if kind == "allreduce" and self._switch_reduces(ranks):
            return min(ring, self._nvls(nbytes, ranks, ring), key=lambda c: c.time_s)
        return ring

    def _switch_reduces(self, ranks: tuple[int, ...]) -> bool:
        """Whether every pair of ``ranks`` is joined by an NVSwitch that reduces (NVLS)."""
        return all(self.machine.link(a, b).kind in NVLS_LINK_KINDS
                   for a in ranks for b in ranks if a != b)

    def _nvls(self, nbytes: float, ranks: tuple[int, ...], ring: CollectiveTime) -> CollectiveTime:
        bandwidth = ring.bandwidth_bytes_per_s * NVLS_EFFICIENCY
        latency = NCCL_BASE_LATENCY_S + 2 * HOP_LATENCY_S["nvlink"]
        return CollectiveTime("allreduce", "nvls", ring.ranks, float(nbytes), bandwidth, latency,
                              latency + nbytes / bandwidth)

    def _ring(self, kind: str, nbytes: float, ranks: tuple[int, ...]) -> CollectiveTime:
        order, bandwidth = self.best_ring(ranks)
        n, hosts = len(ranks), self._hosts(ranks)
        steps, inter = {"allreduce": (2 * (n - 1), 2 * (hosts - 1)),
                        "reducescatter": (n - 1, hosts - 1), "allgather": (n - 1, hosts - 1),
                        "broadcast": (n - 1, hosts - 1), "reduce": (n - 1, hosts - 1)}[kind]
        intra_s, net_s = self.hop_latency_s(order)
        latency = NCCL_BASE_LATENCY_S + (steps - inter) * intra_s + inter * net_s
        per_edge = ring_edge_bytes(kind, nbytes, n)
        algorithm = "chain" if kind in ("broadcast", "reduce") else "ring"
        return CollectiveTime(kind, algorithm, order, float(nbytes), bandwidth, latency,
                              latency + per_edge / bandwidth)

    def _tree(self, nbytes: float, ranks: tuple[int, ...], ring: CollectiveTime) -> CollectiveTime:
        n, hosts = len(ranks), self._hosts(ranks)
        intra_s, net_s = self.hop_latency_s(ring.ranks)
        latency = NCCL_BASE_LATENCY_S + 2 * ((n / hosts - 1) * intra_s + math.ceil(math.log2(hosts)) * net_s)
        return CollectiveTime("allreduce", "tree", ring.ranks, float(nbytes), ring.bandwidth_bytes_per_s,
                              latency, latency + 2 * nbytes / ring.bandwidth_bytes_per_s)

    def _pairwise(self, nbytes: float, ranks: tuple[int, ...]) -> CollectiveTime:
        n = len(ranks)
        chunk = nbytes / n
        rounds = [[(ranks[i], ranks[(i + k) % n]) for i in range(n)] for k in range(1, n)]
        seconds_per_byte = [self.step_seconds_per_byte(r) for r in rounds]
        intra_s, net_s = self.hop_latency_s(ranks)
        hop = net_s if self._hosts(ranks) > 1 else intra_s
        latency = NCCL_BASE_LATENCY_S + (n - 1) * hop
        transfer = sum(chunk * s for s in seconds_per_byte)
        bandwidth = (n - 1) * chunk / transfer if transfer > 0 else math.inf
        return CollectiveTime("alltoall", "pairwise", ranks, float(nbytes), bandwidth, latency,
                              latency + transfer)
