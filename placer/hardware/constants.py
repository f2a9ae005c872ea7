"""Numbers the cost model falls back on, each with its unit and where it comes from.

Vendor figures are peak (theoretical) rates; link figures are *achieved* rates (what a
bandwidth test reaches), because a plan priced at the theoretical PCIe rate copies
too eagerly. The shipped profiles in ``profiles/`` repeat these figures with their
sources; this module is what code imports when a profile lacks a figure.
"""
from __future__ import annotations

GiB = 2 ** 30
KiB = 2 ** 10

# --- host CPU: the 2-core CI-like machine of DESIGN.md ("Measured facts") ----------
# numpy 2.4 / OpenBLAS SkylakeX, float32 GEMM 1024^3.
CI_HOST_GEMM_FLOPS_1_THREAD = 95e9     # FLOP/s, DESIGN.md measured facts table
CI_HOST_GEMM_FLOPS_2_THREADS = 188e9   # FLOP/s, same table; the CPU roofline peak
# Streaming bandwidth of a small cloud VM; an assumption (DDR4 server VM, numpy copy of
# 256 MiB arrays reaches 8-12 GB/s per socket share). Replace with `placer profile --host`.
CI_HOST_MEMORY_BYTES_PER_S = 10e9
CI_HOST_MEMORY_CAPACITY_BYTES = 8 * GiB  # assumption: a small CI VM
# A numpy call on a small array costs a few microseconds of Python + dispatch.
CPU_CALL_OVERHEAD_S = 5e-6             # s per op, assumption; measured by --host

# --- GPU launch overhead -----------------------------------------------------------
# Empty-kernel launches cost about 3 us asynchronous and ~10 us when synchronised
# (cs.virginia.edu/~mwb7w/cuda_support/kernel_overhead.html); NVIDIA's Nsight Systems
# guide shows ~20 us for a PyTorch elementwise op on V100 including framework dispatch.
# A cupy call adds its own host work: ~25 us per elementwise add on CUDA 9 / an i7-4820K
# (github.com/numba/numba/issues/3003), ~20 us per op returning (github.com/cupy/cupy/
# issues/1294); recent cupy trims it (github.com/cupy/cupy/pull/9672). The cost model
# charges this figure once per kernel a GPU op launches (``OpDef.launches``: cupy's
# Sigmoid is 5 launches, a 3x3 convolution ~20), not once per op: the shipped profiles
# carry it as ``launch_overhead_s``; `placer profile` on a GPU replaces it.
GPU_LAUNCH_OVERHEAD_S = 5e-6           # s per kernel launch, between the CUDA-level figures

# --- PCIe achieved bandwidths (pinned host memory, bandwidthTest-style large copies) -
PCIE3_X16_PINNED_BYTES_PER_S = 12e9    # theoretical 15.75 GB/s; ~12 GB/s achieved
PCIE4_X16_PINNED_BYTES_PER_S = 25e9    # theoretical 31.5 GB/s; ~25 GB/s achieved
PCIE5_X16_PINNED_BYTES_PER_S = 50e9    # theoretical 63 GB/s; ~50 GB/s achieved
# Pageable copies stage through a pinned bounce buffer in the driver (NVIDIA developer
# blog "How to Optimize Data Transfers in CUDA C/C++"), so they reach about half the
# pinned rate; an estimate, replace with `placer profile --link`.
PAGEABLE_FRACTION = 0.5
PCIE_LATENCY_S = 10e-6                 # s per cudaMemcpy, estimate (small-copy floor)

# --- default efficiencies of the datasheet roofline (fraction of peak reached) ------
# Used only when a device has no measured entry of the op's family. Guesses in the
# usual ranges: dense GEMM-like work reaches most of peak, the rest is memory-bound.
# "view" ops (Alias) move no data: their efficiencies make the fixed cost the whole cost
# (a call on the host, nothing on a GPU, where an Alias launches no kernel).
DEFAULT_COMPUTE_EFFICIENCY = {
    "conv": 0.5, "fc": 0.6, "elementwise": 0.2, "pool": 0.2, "norm": 0.2,
    "embedding": 0.1, "movement": 0.1, "loss": 0.2, "other": 0.2, "view": 100.0,
}
DEFAULT_MEMORY_EFFICIENCY = {
    "conv": 0.5, "fc": 0.6, "elementwise": 0.6, "pool": 0.5, "norm": 0.5,
    "embedding": 0.3, "movement": 0.6, "loss": 0.5, "other": 0.5, "view": 100.0,
}
# On the host, the heavy families run numpy/OpenBLAS GEMMs and reach most of the measured
# GEMM peak (the peak *is* a GEMM), while pooling and LRN run one strided numpy pass per
# window tap: their time follows taps x outputs (the flops feature) at a few percent of
# peak, not the bytes of their inputs; a matrix-vector FC (batch 1) streams its weights
# once, like the bandwidth probe. (compute, memory) pairs; measured on the 2-core
# CI-like machine with bench/cost_accuracy.py, where they are the fits' starting points.
CPU_EFFICIENCY_OVERRIDES = {
    "conv": (0.8, 0.5), "fc": (0.9, 0.9), "pool": (0.05, 1.0), "norm": (0.05, 1.0),
}


def default_efficiency(family: str, device_kind: str) -> tuple[float, float]:
    """(compute, memory) efficiency of the datasheet roofline for a family on a device kind."""
    if device_kind == "cpu" and family in CPU_EFFICIENCY_OVERRIDES:
        return CPU_EFFICIENCY_OVERRIDES[family]
    return DEFAULT_COMPUTE_EFFICIENCY.get(family, 0.2), DEFAULT_MEMORY_EFFICIENCY.get(family, 0.5)

# --- matrix products: compute efficiency over the row count M ----------------------
# A GEMM packs the weight matrix once and reuses it for every row of the input, so the
# packing and weight traffic (per weight element) weigh as M0 / M of the multiply-adds:
# efficiency = eff_max * M / (M + M0). The host profile's peak is itself a GEMM with
# PEAK_GEMM_ROWS rows (placer/profiling/host.py), so there the efficiency is 1 by
# definition; a datasheet peak anchors on the family's default efficiency instead.
PEAK_GEMM_ROWS = 1024
# M0 the fit starts from and is weakly pulled toward when its points cannot tell (all
# memory- or overhead-bound). CPU: ~8 rows fitted to OpenBLAS FCs on the 2-core host
# (bench/cost_accuracy.py); GPU: an assumption (a GPU needs far more rows to fill its SMs).
DEFAULT_HALF_EFFICIENCY_ROWS = {"cpu": 8.0, "gpu": 64.0}

# --- GPU <-> GPU links -------------------------------------------------------------
# Per-link, per-direction bandwidths NCCL's own topology model assumes
# (nccl src/graph/tuning.cc and topo.h, MULTIDEVICE_FACTS.md): 20 GB/s per NVLink on
# V100 (NVLink 2, theoretical 25 GB/s per direction per link) and A100 (NVLink 3, same
# per-link rate, 12 links per GPU), 20.6 GB/s on H100/H200 (NVLink 4, 18 links per GPU).
NVLINK2_LINK_BYTES_PER_S = 20e9
NVLINK3_LINK_BYTES_PER_S = 20e9
NVLINK4_LINK_BYTES_PER_S = 20.6e9
NVLINK3_LINKS_PER_GPU = 12             # A100 SXM4: 12 NVLink 3 links (NVSwitch: all to one switch fabric)
NVLINK4_LINKS_PER_GPU = 18             # H100/H200 SXM5: 18 NVLink 4 links
# NVLink SHARP (NVLS): on a third-generation NVSwitch (H100/H200 SXM5 boards) NCCL can
# reduce in the switch, so an all-reduce moves each byte once up to the switch and once
# back (algbw = port rate x efficiency) instead of a ring's 2(n-1)/n. The efficiency is
# fitted to nccl-tests' measured busbw on 8 GPUs (MULTIDEVICE_FACTS.md: 8x H100 ~480 GB/s
# with NVLS against ~370 by ring, 8x H200 ~475): 480 / (2 x 7/8 x 18 x 20.6) = 0.74.
NVLS_EFFICIENCY = 0.74
NVLS_LINK_KINDS = ("nvswitch-h100",)  # link kinds whose switch reduces (NVSwitch gen 3)
# A cudaMemcpyPeerAsync of a few bytes costs about what a host copy does: an estimate
# (the same small-copy floor as PCIE_LATENCY_S); replace with `placer profile --link`.
PEER_LATENCY_S = 10e-6
# The most devices a cluster profile may have: a link is kept for every ordered pair, and
# every plan prices ops per device, so size is refused before building (one machine's
# cap, MAX_GPUS_PER_MACHINE, is in placer.documents.profiles: its documents say it).
MAX_CLUSTER_DEVICES = 2048

# --- fit quality -----------------------------------------------------------------
# A fit whose median |error| on its own points is above this does not describe its group
# with one roofline (two kernels behind one op type, or a feature that misses what the
# time follows): the profile marks it not covered, and estimates from it carry the
# source "poor-fit". Run-to-run noise on a busy 2-core host puts good fits at 3-15%;
# 25% is well past that and still below the 2x misses a wrong model gives.
FIT_MAX_MEDIAN_ERROR_PCT = 25.0
