"""The profile documents a person writes and shares (profiles/README.md): device profiles
(``placer.hardware.device_profile``), machine profiles (``placer.hardware.machine``) and
cluster profiles (``placer.hardware.cluster``). All three are closed: a key placer does not
read is refused, naming the ones it knows."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, Tag

from placer.documents import (BY_JSON_TYPE, BYTES_PER_S, CAPACITY_BYTES, COUNT, FLAG, FLOPS, LATENCY_S, NON_NEGATIVE,
                              OVERHEAD_S, POSITIVE, TEXT, VERSION_1, Boolean, Closed, NonNegativeInt, Open, Real,
                              given, number, within)

PROFILE_SCHEMA_VERSION = 1     # of device, machine and cluster profiles
# The most GPUs one machine may have (--gpus, a machine profile): a link is kept for every
# ordered pair, and every plan prices ops per device, so size is refused before building.
MAX_GPUS_PER_MACHINE = 256
DIRECTIONS = ("h2d", "d2h")
MEMORY_KINDS = ("pinned", "pageable")
# How an op entry was timed: "in-network" (the whole net run by the executor, each op
# after its producer, on the inputs the previous op left, allocating its outputs: what a
# run sees) or "isolated" (the op alone, called again and again on the same inputs:
# warm caches, no producer). Entries written before the field existed were isolated.
TIMING_METHODS = ("in-network", "isolated")
# How a tensor gets between two GPUs: through host memory, PCIe peer to peer, or one of
# the NVLink / NVSwitch kinds of ``placer.hardware.machine.LINK_KINDS``.
PEER_KINDS = ("staged", "pcie-p2p", "nvlink2", "nvlink3", "nvlink4", "nvswitch-a100", "nvswitch-h100")

SchemaVersion = Annotated[VERSION_1, Field(description=f"version {PROFILE_SCHEMA_VERSION} "
                                                        "(the version this placer reads)")]
# [bytes, seconds] of a measured copy
CurvePoint = Annotated[tuple[Annotated[Real, number("[bytes > 0, seconds >= 0]", positive=True)],
                             Annotated[Real, number("[bytes > 0, seconds >= 0]")]],
                       Field(description="[bytes > 0, seconds >= 0]")]


# ------------------------------------------------------------------ device profile

class Curve(Open):
    """A link's latency + bandwidth curve, with the points it was fitted to."""

    latency_s: LATENCY_S
    bytes_per_s: BYTES_PER_S
    points: list[CurvePoint] = []


class Direction(Open):
    """One direction of the host link, per kind of host memory."""

    pinned: Curve
    pageable: Curve


class Link(Open):
    """The host link: host to device and back."""

    h2d: Direction
    d2h: Direction


class Tensor(Open):
    """An input of a timed op."""

    shape: Annotated[list[NonNegativeInt], Field(description="a list of non-negative integers")]
    dtype: Annotated[TEXT, Field(description="a numpy dtype name (float32, int64, ...)")]


class OpEntry(Open):
    """A timed op: its key (type, inputs, arguments) and its sample statistics."""

    type: TEXT
    inputs: list[Tensor]
    args: dict[str, Any] = {}
    samples: Annotated[Real, number("a positive number of samples", positive=True)]
    median_s: NON_NEGATIVE
    iqr_s: NON_NEGATIVE
    flops: NON_NEGATIVE = 0.0
    bytes: NON_NEGATIVE = 0.0
    method: Annotated[Literal["in-network", "isolated"],
                      Field(description="one of " + ", ".join(TIMING_METHODS))] = "isolated"


class Fit(Open):
    """A family's fitted cost model."""

    overhead_s: NON_NEGATIVE
    compute_efficiency: POSITIVE
    memory_efficiency: POSITIVE
    points: NON_NEGATIVE
    median_abs_pct_error: NON_NEGATIVE
    half_efficiency_rows: Annotated[POSITIVE | None, given(POSITIVE)] = None
    p90_abs_pct_error: Annotated[NON_NEGATIVE | None, given(NON_NEGATIVE)] = None
    spread_pct: Annotated[NON_NEGATIVE | None, given(NON_NEGATIVE)] = None
    covered: FLAG = True


class KernelClass(Open):
    """One math class's fitted constants of the GPU kernel model (placer/costs/gpu_kernels.py)."""

    efficiency: POSITIVE
    k_overhead: NON_NEGATIVE
    knee: NON_NEGATIVE
    fixed_s: Annotated[Real, within("seconds", 0.0, 1.0)]
    conv: dict[str, POSITIVE] = {}


class KernelModel(Open):
    """A GPU's kernel-model figures: SMs and achieved bandwidth (each with its source) and
    the fitted constants of each math class (``simt``, ``tensor``, ``int8``)."""

    sm_count: Annotated[COUNT, Field(le=4096)]
    achieved_bandwidth_bytes_per_s: BYTES_PER_S
    source: TEXT = ""
    classes: dict[Literal["simt", "tensor", "int8"], KernelClass] = {}
    classes_source: TEXT = ""


SourceKind = Field(description="'measured' or 'datasheet'")


class Measured(Open):
    """Figures measured on a host, on a date."""

    kind: Annotated[Literal["measured"], SourceKind]
    host: TEXT
    date: TEXT


class Datasheet(Open):
    """Figures from datasheets, each with its origin (``figures``: figure -> origin)."""

    kind: Annotated[Literal["datasheet"], SourceKind]
    figures: dict[str, Any]


class PeakFlops(Open):
    """FLOP/s per dtype: float32's, and any other's."""

    DESCRIPTION = "an object of FLOP/s per dtype"
    __pydantic_extra__: dict[str, FLOPS] = Field(init=False)   # type: ignore[assignment]
    float32: FLOPS


class Device(Open):
    """One device of a profile: its figures, their source, its host link, its timed ops and fits."""

    DESCRIPTION = "a device object"
    kind: Annotated[Literal["cpu", "gpu"], Field(description="'cpu' or 'gpu'")]
    name: TEXT
    source: Annotated[Measured | Datasheet, Field(discriminator="kind")]
    peak_flops: PeakFlops
    memory_bandwidth_bytes_per_s: BYTES_PER_S
    memory_capacity_bytes: CAPACITY_BYTES
    launch_overhead_s: OVERHEAD_S
    link: Annotated[Link | None, given(Link)] = None
    ops: list[OpEntry] = []
    fits: dict[str, Fit] = {}
    fits_digest: TEXT = ""
    kernel_model: Annotated[KernelModel | None, given(KernelModel)] = None


class DeviceProfileDocument(Closed):
    """A device profile file: one device, or a (host, GPU) pair."""

    model_config = ConfigDict(title="placer device profile")
    DESCRIPTION = "a JSON object"
    schema_version: SchemaVersion
    name: TEXT
    description: TEXT = ""
    devices: Annotated[list[Device], Field(min_length=1, description="a list of at least one device")]


# ------------------------------------------------------------------ machine profile

GpuNumber = Annotated[NonNegativeInt, Field(description="a GPU number (0, 1, ...)")]
PeerKind = Annotated[Literal["staged", "pcie-p2p", "nvlink2", "nvlink3", "nvlink4", "nvswitch-a100",
                             "nvswitch-h100"],
                     Field(description="a peer link kind: " + ", ".join(PEER_KINDS))]


class GpuEntry(Open):
    """``count`` GPUs of one profile."""

    profile: TEXT
    count: Annotated[COUNT, Field(le=MAX_GPUS_PER_MACHINE, description="a positive integer (at most "
                                  f"{MAX_GPUS_PER_MACHINE} GPUs in one machine)")] = 1


class PeerLink(Closed):
    """The link between one pair of GPUs."""

    gpus: Annotated[tuple[GpuNumber, GpuNumber], Field(description="a pair of GPU numbers [a, b]")]
    kind: PeerKind
    count: COUNT = 1


class PeerCurve(Open):
    """A measured GPU-to-GPU copy curve."""

    src: GpuNumber
    dst: GpuNumber
    p2p: Boolean = True
    latency_s: LATENCY_S
    bytes_per_s: BYTES_PER_S
    points: list[CurvePoint] = []


class MachineDocument(Closed):
    """A machine profile file: a host profile, GPU profiles, the links between the GPUs."""

    model_config = ConfigDict(title="placer machine profile")
    DESCRIPTION = "a JSON object"
    schema_version: SchemaVersion
    kind: Literal["machine"]
    name: TEXT
    description: TEXT = ""
    host: Annotated[TEXT, Field(description="a CPU profile name or file")]
    gpus: Annotated[list[Annotated[Union[Annotated[TEXT, Tag("string")], Annotated[GpuEntry, Tag("object")]],
                                   BY_JSON_TYPE]],
                    Field(description="a list of GPU profile names or {\"profile\", \"count\"}")]
    peer_default: PeerKind = "staged"
    peer_links: list[PeerLink] = []
    pcie_switches: list[Annotated[list[GpuNumber], Field(description="a list of GPU numbers")]] = []
    peer_curves: list[PeerCurve] = []
    sources: dict[str, TEXT] = {}


# ------------------------------------------------------------------ cluster profile

CpuRef = Annotated[TEXT, Field(description="a CPU profile name or file")]
MachineRef = Annotated[TEXT, Field(description="a machine profile name or file")]


class Host(Open):
    """One named host: its machine profile, and the CPU profile and memory it has there."""

    name: TEXT
    machine: MachineRef
    cpu: Annotated[CpuRef | None, given(CpuRef)] = None
    memory_bytes: Annotated[POSITIVE | None, given(POSITIVE)] = None


class Hosts(Open):
    """``count`` alike hosts, named ``prefix`` + 0, 1, ..."""

    count: COUNT
    machine: MachineRef
    cpu: Annotated[CpuRef | None, given(CpuRef)] = None
    memory_bytes: Annotated[POSITIVE | None, given(POSITIVE)] = None
    prefix: TEXT = "h"


class ClusterNetwork(Open):
    """The network between any two hosts."""

    DESCRIPTION = "an object: kind, bytes_per_s, latency_s, gpudirect_rdma"
    kind: TEXT = "network"
    source: TEXT = ""
    bytes_per_s: BYTES_PER_S
    latency_s: LATENCY_S
    gpudirect_rdma: FLAG = False


class ClusterDocument(Closed):
    """A cluster profile file: its hosts (each a machine profile) and the network."""

    model_config = ConfigDict(title="placer cluster profile")
    DESCRIPTION = "a JSON object"
    schema_version: SchemaVersion
    kind: Literal["cluster"]
    name: TEXT
    description: TEXT = ""
    sources: dict[str, TEXT] = {}
    hosts: Annotated[Union[Annotated[list[Host], Field(min_length=1), Tag("array")], Annotated[Hosts, Tag("object")]],
                     BY_JSON_TYPE,
                     Field(description='a non-empty list of {"name", "machine"} or {"count": N, "machine"}')]
    network: ClusterNetwork


__all__ = ["PROFILE_SCHEMA_VERSION", "MAX_GPUS_PER_MACHINE", "DIRECTIONS", "MEMORY_KINDS", "TIMING_METHODS",
           "PEER_KINDS", "DeviceProfileDocument", "Device", "OpEntry", "Fit", "Curve", "MachineDocument",
           "GpuEntry", "PeerLink", "PeerCurve", "ClusterDocument", "Host", "Hosts", "ClusterNetwork"]
