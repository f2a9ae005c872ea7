"""The collective cost model (placer/hardware/collectives.py) against hand-computed formulas, brute
force over ring orders, and the bus bandwidths NCCL users measure (MULTIDEVICE_FACTS.md)."""
from __future__ import annotations

import itertools
import math

import pytest

from placer.hardware.collectives import (HOP_LATENCY_S, NCCL_BASE_LATENCY_S, CollectiveModel, bus_bytes,
                                         ring_edge_bytes)
from placer.ops.collective import op_time
from placer.errors import PlacerError
from placer.hardware.machine import HOST, Hop, Link, Machine, MachineDevice, build_machine, compose_machine, load_machine
from placer.hardware.profiles import load_device_profile
from placer.hardware.device_profile import LinkCurve
from placer.types import TensorType

NVL, PCI, NET = HOP_LATENCY_S["nvlink"], HOP_LATENCY_S["pcie"], HOP_LATENCY_S["network"]
GIB = 2 ** 30


def four_gpus_nvlink(count: int = 2) -> Machine:
    host, v100 = load_device_profile("host-ci-2core", "cpu"), load_device_profile("v100-16gb-sxm2", "gpu")
    return compose_machine(host, v100, 4, "nvlink2", count)       # every pair: count x 20 GB/s


def test_every_collective_follows_its_formula_on_a_uniform_machine():
    model, s, b = CollectiveModel(four_gpus_nvlink()), 1e8, 40e9
    gpus = [1, 2, 3, 4]
    want = {"allreduce": 6 * NVL + 1.5 * s / b, "reducescatter": 3 * NVL + 0.75 * s / b,
            "allgather": 3 * NVL + 0.75 * s / b, "broadcast": 3 * NVL + s / b, "reduce": 3 * NVL + s / b,
            "alltoall": 3 * NVL + 3 * (s / 4) / b}
    for kind, t in want.items():
        c = model.time(kind, s, gpus)
        assert c.time_s == pytest.approx(NCCL_BASE_LATENCY_S + t, rel=1e-12), kind
        assert c.bandwidth_bytes_per_s == pytest.approx(b)
        assert c.bus_bytes_per_s == pytest.approx(bus_bytes(kind, s, 4) / c.time_s)
    assert model.time("allreduce", s, gpus).algorithm == "ring"       # one host: the ring wins
    assert ring_edge_bytes("allreduce", 1000, 4) == 1500 and ring_edge_bytes("alltoall", 1000, 4) == 250


def test_gpus_behind_one_pcie_switch_share_its_lanes():
    """Staged copies (no P2P): each ring edge is the sender's D2H then the receiver's H2D.
    Four T4s, two per switch: every switch lane carries two edges of the ring at once,
    so B = 1 / (2/12 + 2/12) GB/s = 3 GB/s; each GPU on its own switch: 6 GB/s."""
    host, t4 = load_device_profile("host-ci-2core", "cpu"), load_device_profile("t4-pcie3", "gpu")
    shared = build_machine("shared", host, [t4] * 4, pcie_switches=[[0, 1], [2, 3]])
    alone = build_machine("alone", host, [t4] * 4)
    assert CollectiveModel(shared).best_ring([1, 2, 3, 4])[1] == pytest.approx(3e9)
    assert CollectiveModel(alone).best_ring([1, 2, 3, 4])[1] == pytest.approx(6e9)
    c = CollectiveModel(shared).time("allreduce", GIB, [1, 2, 3, 4])
    assert c.latency_s == pytest.approx(NCCL_BASE_LATENCY_S + 6 * PCI)


def independent_ring_bandwidth(machine: Machine, order) -> float:
    """B of a ring by brute force: per edge, seconds per byte over its hops, each hop's
    bandwidth divided among the edges of the ring that use its lane."""
    edges = list(zip(order, order[1:] + order[:1]))
    users: dict[str, int] = {}
    for a, b in edges:
        for hop in machine.links[(a, b)].hops:
            users[hop.lane] = users.get(hop.lane, 0) + 1
    worst = max(sum(users[h.lane] / h.curve.bytes_per_s for h in machine.links[(a, b)].hops) for a, b in edges)
    return 1 / worst


@pytest.mark.parametrize("name", ["4x-v100-sxm2-nvlink", "2x-t4-pcie3", "8x-a100-40gb-nvswitch"])
def test_the_chosen_ring_is_the_best_order(name):
    machine = load_machine(name)
    gpus = machine.gpus
    order, b = CollectiveModel(machine).best_ring(gpus)
    best = max(independent_ring_bandwidth(machine, [gpus[0], *p]) for p in itertools.permutations(gpus[1:]))
    assert b == pytest.approx(best) and sorted(order) == gpus


def test_the_dgx1_mesh_rings_over_nvlink_and_a_bad_order_stages():
    machine = load_machine("4x-v100-sxm2-nvlink")
    model = CollectiveModel(machine)
    order, b = model.best_ring(machine.gpus)
    assert b == pytest.approx(20e9)                     # its single-NVLink pairs
    edges = list(zip(order, order[1:] + order[:1]))
    assert all(machine.links[e].kind == "nvlink2" for e in edges)
    assert model.ring_bandwidth([1, 2, 3, 4]) == pytest.approx(6e9)   # cuda 1->2 and 3->0 staged


# nccl-tests all-reduce bus bandwidth measured by users (MULTIDEVICE_FACTS.md), GB/s
MEASURED_BUSBW = {
    "8x-a100-40gb-nvswitch": (200, 230),      # 8x A100 (NVSwitch, ring)
    "8x-h100-80gb-nvswitch": (480, 480),      # 8x H100 with NVLS (ring alone: ~370)
    "8x-h200-141gb-nvswitch": (475, 475),     # 8x H200, NVLS (NVSwitch reductions)
    "2x-t4-pcie3": (5.7, 5.7),                # 2 GPUs over PCIe without P2P
}
# how far the model may be from the measurement (model / measured)
ALLOWED = {"8x-a100-40gb-nvswitch": (0.9, 1.25), "8x-h100-80gb-nvswitch": (0.95, 1.05),
           "8x-h200-141gb-nvswitch": (0.95, 1.05), "2x-t4-pcie3": (0.95, 1.15)}


def test_nvls_only_where_the_switch_reduces_and_the_ring_alone_matches_its_measurement():
    """NVLS is chosen on the H100/H200 NVSwitch boards (not on A100's, nor across hosts);
    their ring alone gives nccl-tests' ~370 GB/s ring figure; NVLS loses to the ring
    nowhere it is chosen, and a tiny all-reduce pays NVLS's latency, not a ring's 14 hops."""
    h100, a100 = load_machine("8x-h100-80gb-nvswitch"), load_machine("8x-a100-40gb-nvswitch")
    model = CollectiveModel(h100)
    big = model.time("allreduce", GIB, h100.gpus)
    assert big.algorithm == "nvls"
    ring = model._ring("allreduce", GIB, tuple(h100.gpus))
    assert 0.95 <= ring.bus_bytes_per_s / 370e9 <= 1.05
    assert big.time_s < ring.time_s
    small = model.time("allreduce", 1024, h100.gpus)
    assert small.algorithm == "nvls" and small.latency_s < model._ring("allreduce", 1024, tuple(h100.gpus)).latency_s
    assert CollectiveModel(a100).time("allreduce", GIB, a100.gpus).algorithm == "ring"
    assert model.time("allgather", GIB, h100.gpus).algorithm == "ring"   # NVLS here is all-reduce only


@pytest.mark.parametrize("name", list(MEASURED_BUSBW))
def test_predicted_bus_bandwidth_against_measured(name):
    machine = load_machine(name)
    c = CollectiveModel(machine).time("allreduce", GIB, machine.gpus)
    low, high = MEASURED_BUSBW[name]
    predicted = c.bus_bytes_per_s / 1e9
    lo, hi = ALLOWED[name]
    assert lo <= predicted / high and predicted / low <= hi, (name, predicted)


def multi_host(hosts: int, per_host: int, net_bytes_per_s: float = 25e9) -> Machine:
    """``hosts`` hosts of ``per_host`` GPUs: NVLink (240 GB/s) inside a host, a network link
    of ``net_bytes_per_s`` between hosts, each GPU its own NIC lanes."""
    host_profile = load_device_profile("host-ci-2core", "cpu")
    gpu = load_device_profile("a100-40gb-sxm4", "gpu")
    devices = [MachineDevice("cpu", host_profile, 0, "h0")]
    for h in range(hosts):
        for g in range(per_host):
            devices.append(MachineDevice(f"h{h}/cuda:{g}", gpu, g, f"h{h}"))
    links = {}
    for a in range(1, len(devices)):
        for b in range(1, len(devices)):
            if a == b:
                continue
            if devices[a].host == devices[b].host:
                links[(a, b)] = Link("nvswitch-a100", (Hop(LinkCurve(10e-6, 240e9), f"{a}->{b}"),))
            else:
                links[(a, b)] = Link("network", (Hop(LinkCurve(5e-6, net_bytes_per_s), f"nic{a}:out"),
                                                 Hop(LinkCurve(5e-6, net_bytes_per_s), f"nic{b}:in")))
    return Machine("cluster", tuple(devices), links)


def test_across_hosts_network_steps_pay_network_latency():
    """2 hosts x 2 GPUs: the ring crosses hosts twice, so 2 of its 6 all-reduce steps
    are network steps (NCCL's 2(h-1)) and 4 are NVLink steps."""
    machine = multi_host(2, 2)
    model = CollectiveModel(machine)
    c = model.time("allreduce", GIB, [1, 2, 3, 4])
    assert c.algorithm == "ring"
    assert c.latency_s == pytest.approx(NCCL_BASE_LATENCY_S + 4 * NVL + 2 * NET)
    small = model.time("allreduce", 4096, [1, 2, 3, 4])          # a chain in each host, a tree across
    assert small.algorithm == "tree"
    assert small.latency_s == pytest.approx(NCCL_BASE_LATENCY_S + 2 * (NVL + NET))


def test_a_tree_wins_small_all_reduces_over_many_hosts_and_the_ring_large_ones():
    """16 hosts x 1 GPU at 25 GB/s (a NIC's in and out lanes, so an edge is 1/(2/25e9)):
    ring = base + 30 net hops + 1.875 S/B, tree = base + 2 log2(16) net hops + 2 S/B."""
    machine = multi_host(16, 1)
    model = CollectiveModel(machine)
    ranks = list(range(1, 17))
    b = 12.5e9
    ring = lambda s: NCCL_BASE_LATENCY_S + 30 * NET + 2 * 15 / 16 * s / b
    tree = lambda s: NCCL_BASE_LATENCY_S + 8 * NET + 2 * s / b
    small, large = model.time("allreduce", 1024, ranks), model.time("allreduce", GIB, ranks)
    assert small.algorithm == "tree" and small.time_s == pytest.approx(tree(1024))
    assert large.algorithm == "ring" and large.time_s == pytest.approx(ring(GIB))
    crossover = (30 - 8) * NET / (2 / b - 1.875 / b)     # where the two lines meet
    assert model.time("allreduce", crossover * 0.9, ranks).algorithm == "tree"
    assert model.time("allreduce", crossover * 1.1, ranks).algorithm == "ring"


def test_ops_are_priced_by_their_collective():
    model = CollectiveModel(four_gpus_nvlink())
    grads = [TensorType((1000, 250), "float32")] * 4              # 1 MB per GPU
    c = op_time(model, "NCCLAllreduce", grads, [1, 2, 3, 4])
    assert c.kind == "allreduce" and c.nbytes == 1e6
    gathered = op_time(model, "NCCLAllGather", [TensorType((250,), "float32")] * 4, [1, 2, 3, 4])
    assert gathered.kind == "allgather" and gathered.nbytes == 4000
    cw = TensorType((1,), "int64")
    assert op_time(model, "Allreduce", [cw] + grads[:2], [1, 2]).nbytes == 1e6
    with pytest.raises(PlacerError, match="not a collective"):
        op_time(model, "Relu", grads, [1, 2])


def test_one_rank_costs_nothing_and_bad_requests_are_refused():
    model = CollectiveModel(four_gpus_nvlink())
    assert model.time("allreduce", GIB, [1]).time_s == 0.0
    with pytest.raises(PlacerError, match="appears twice"):
        model.time("allreduce", 10, [1, 1])
    with pytest.raises(PlacerError, match="unknown"):
        model.time("allsum", 10, [1, 2])
    assert math.isinf(model.time("broadcast", 1, [HOST]).bandwidth_bytes_per_s)
