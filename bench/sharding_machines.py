"""Machines the sharding benchmarks plan for (bench/sharding_plans.py, bench/torchrec_compare.py).

- ``8x-a100``: the shipped ``8x-a100-40gb-nvswitch`` profile (DGX A100-like).
- ``8x-v100``: eight ``v100-16gb-sxm2`` with one NVLink 2 link (20 GB/s) between every pair,
  composed as ``--gpu-profile v100-16gb-sxm2 --gpus 8 --gpu-link nvlink2`` (a DGX-1's hybrid
  cube-mesh gives some pairs two links and some none; this is the simpler all-pairs form).
- ``2x8-a100``: the shipped cluster profile ``2x-dgx-a100-200g``: two ``8x-a100-40gb-nvswitch``
  hosts (2 x EPYC 7742, 1 TB) over one 200 Gb/s HDR InfiniBand NIC each (23.5 GB/s, 9.6 us
  per message, GPUDirect RDMA).
"""
from __future__ import annotations

from placer.hardware.machine import Machine, compose_machine, load_machine
from placer.hardware.profiles import load_device_profile


def machine(name: str) -> tuple[Machine, str]:
    """(machine, how it was made)."""
    if name == "8x-a100":
        return load_machine("8x-a100-40gb-nvswitch"), "shipped profile 8x-a100-40gb-nvswitch"
    if name == "8x-v100":
        host = load_device_profile("host-ci-2core", "cpu")
        return (compose_machine(host, load_device_profile("v100-16gb-sxm2", "gpu"), 8, "nvlink2"),
                "--gpu-profile v100-16gb-sxm2 --gpus 8 --gpu-link nvlink2")
    if name == "2x8-a100":
        from placer.hardware.cluster import load_cluster
        return load_cluster("2x-dgx-a100-200g"), "cluster profile 2x-dgx-a100-200g"
    raise ValueError(name)
