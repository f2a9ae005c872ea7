"""Machines the sharding benchmarks plan for (bench/sharding_plans.py, bench/torchrec_compare.py).

- ``8x-a100``: the shipped ``8x-a100-40gb-nvswitch`` profile (DGX A100-like).
- ``8x-v100``: eight ``v100-16gb-sxm2`` with one NVLink 2 link (20 GB/s) between every pair,
  composed as ``--gpu-profile v100-16gb-sxm2 --gpus 8 --gpu-link nvlink2`` (a DGX-1's hybrid
  cube-mesh gives some pairs two links and some none; this is the simpler all-pairs form).
- ``2x8-a100``: two ``8x-a100-40gb-nvswitch`` hosts over one 200 Gb/s HDR InfiniBand NIC each
  (23.5 GB/s, 9.6 us per message, GPUDirect RDMA: a GPU on one host reaches a device on the
  other at the slower of the network and its PCIe rate), the figures of the cluster profile
  ``2x-dgx-a100-200g`` of the ``cluster`` branch. While that branch is not merged here, the
  machine is built below in the same form (devices ``h0/...``, ``h1/...``, each device's
  ``host`` set, network hops on each host's NIC lane); with it merged, ``load_cluster`` is used.
"""
from __future__ import annotations

from placer.machine import HOST, Hop, Link, Machine, MachineDevice, compose_machine, load_machine
from placer.profiling import load_device_profile
from placer.profiling.schema import LinkCurve

NETWORK_BYTES_PER_S = 23.5e9    # 200 Gb/s HDR IB: ~23.5 of 25 GB/s measured (MULTIDEVICE_FACTS.md)
NETWORK_LATENCY_S = 9.6e-6      # NCCL's per-hop network latency (src/graph/tuning.cc)


def machine(name: str) -> tuple[Machine, str]:
    """(machine, how it was made)."""
    if name == "8x-a100":
        return load_machine("8x-a100-40gb-nvswitch"), "shipped profile 8x-a100-40gb-nvswitch"
    if name == "8x-v100":
        host = load_device_profile("host-ci-2core", "cpu")
        return (compose_machine(host, load_device_profile("v100-16gb-sxm2", "gpu"), 8, "nvlink2"),
                "--gpu-profile v100-16gb-sxm2 --gpus 8 --gpu-link nvlink2")
    if name == "2x8-a100":
        try:
            from placer.cluster import load_cluster
            return load_cluster("2x-dgx-a100-200g"), "cluster profile 2x-dgx-a100-200g"
        except ImportError:
            return two_hosts(load_machine("8x-a100-40gb-nvswitch")), \
                "two 8x-a100-40gb-nvswitch hosts, 23.5 GB/s GPUDirect network (pending the cluster branch)"
    raise ValueError(name)


def two_hosts(host_machine: Machine) -> Machine:
    """Two copies of ``host_machine`` joined by the network (module docstring)."""
    devices, links, first = [], {}, []
    for h in ("h0", "h1"):
        first.append(len(devices))
        devices += [MachineDevice(f"{h}/{d.name}", d.profile, d.ordinal, h) for d in host_machine.devices]
        for (a, b), link in host_machine.links.items():
            links[(first[-1] + a, first[-1] + b)] = Link(link.kind, tuple(Hop(x.curve, f"{h}/{x.lane}")
                                                                          for x in link.hops), link.source)
    k = host_machine.k
    for ha, hb in ((0, 1), (1, 0)):
        for a in range(k):
            for b in range(k):
                rate = NETWORK_BYTES_PER_S
                for dev, pair in ((a, (a, HOST)), (b, (HOST, b))):
                    if host_machine.devices[dev].is_gpu:
                        rate = min(rate, host_machine.links[pair].hops[0].curve.bytes_per_s)
                hop = Hop(LinkCurve(NETWORK_LATENCY_S, rate, []), f"h{ha}/nic:send")
                links[(first[ha] + a, first[hb] + b)] = Link("network-rdma", (hop,), "200 Gb/s HDR IB, GPUDirect")
    return Machine("2x 8x-a100-40gb-nvswitch", tuple(devices), links,
                   "two DGX A100-like hosts over 200 Gb/s InfiniBand (GPUDirect RDMA)")
