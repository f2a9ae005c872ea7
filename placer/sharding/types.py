"""The records of the sharding planner, in the shape of TorchRec's ``planner/types.py``.

A **table** (``Table``) is an embedding parameter read by a SparseLengths* lookup and
updated by a sparse optimizer. A **sharding option** (``ShardingOption``) is one way to
lay a table out: a sharding type, a kernel (where its rows live and who reads them) and
its shards, each a block of rows x columns on one device with its ``Perf`` (seconds) and
``Storage`` (bytes). A **plan** (``ShardingPlan``) is one option per table over a
data-parallel group of GPUs (the *ranks*), priced by the step model
(``placer.sharding.step``) into a ``StepTime`` with its critical path, and
summarised per rank (``RankStats``).

Sharding types (TorchRec's names):
    data_parallel   the whole table on every rank; slices of the gradient all-gathered
    table_wise      the whole table on one rank, which looks up every sample's rows
    row_wise        rows split evenly over a group of ranks (all of them, or those of one
                    host: TorchRec's table_row_wise); partial sums reduce-scattered
    column_wise     columns split into shards of equal width, each on one rank
Kernels:
    hbm             rows in the rank's GPU memory (TorchRec's ``fused``)
    uvm             rows in host memory, read by the rank's GPU over PCIe (``fused_uvm``)
    uvm_caching     the same with the hot rows cached in GPU memory (``fused_uvm_caching``)
    host            rows, lookups and the sparse optimizer on the host CPU (Caffe2's CPU
                    embedding ops; TorchRec has no such kernel on a CUDA topology)
"""
from __future__ import annotations

from dataclasses import dataclass, field

DATA_PARALLEL, TABLE_WISE, ROW_WISE, COLUMN_WISE = "data_parallel", "table_wise", "row_wise", "column_wise"
SHARDING_TYPES = (DATA_PARALLEL, TABLE_WISE, ROW_WISE, COLUMN_WISE)
HBM, UVM, UVM_CACHING, HOST = "hbm", "uvm", "uvm_caching", "host"
KERNELS = (HBM, UVM, UVM_CACHING, HOST)
TORCHREC_KERNEL = {HBM: "fused", UVM: "fused_uvm", UVM_CACHING: "fused_uvm_caching", HOST: "host"}


@dataclass(frozen=True)
class Perf:
    """Seconds a shard costs its device per step, as TorchRec splits them."""

    fwd_compute_s: float = 0.0
    fwd_comms_s: float = 0.0
    bwd_compute_s: float = 0.0
    bwd_comms_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return self.fwd_compute_s + self.bwd_compute_s

    @property
    def comms_s(self) -> float:
        return self.fwd_comms_s + self.bwd_comms_s

    @property
    def total(self) -> float:
        return self.compute_s + self.comms_s

    def __add__(self, other: "Perf") -> "Perf":
        return Perf(self.fwd_compute_s + other.fwd_compute_s, self.fwd_comms_s + other.fwd_comms_s,
                    self.bwd_compute_s + other.bwd_compute_s, self.bwd_comms_s + other.bwd_comms_s)


@dataclass(frozen=True)
class Storage:
    """Bytes a shard holds: in its GPU's memory (hbm) and in host memory (ddr)."""

    hbm_bytes: float = 0.0
    ddr_bytes: float = 0.0

    def __add__(self, other: "Storage") -> "Storage":
        return Storage(self.hbm_bytes + other.hbm_bytes, self.ddr_bytes + other.ddr_bytes)


@dataclass(frozen=True)
class Table:
    """An embedding table as the planner sees it.

    ``pooling``: rows looked up per sample (indices / lengths of its lookup);
    ``state_bytes_per_row``: optimizer state per row (RowWiseSparseAdagrad: one float;
    SparseAdagrad: a row of floats; SGD: none); ``index_bytes``: bytes of one index.
    """

    name: str
    rows: int
    dim: int
    dtype_bytes: int = 4
    pooling: float = 1.0
    state_bytes_per_row: float = 0.0
    index_bytes: int = 8

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype_bytes

    @property
    def nbytes(self) -> float:
        return float(self.rows) * (self.row_bytes + self.state_bytes_per_row)


@dataclass(frozen=True)
class Shard:
    """``rows`` x ``cols`` of a table on device ``rank`` (a machine device index)."""

    rank: int
    rows: int
    cols: int
    row_offset: int = 0
    col_offset: int = 0
    perf: Perf = Perf()
    storage: Storage = Storage()


@dataclass(frozen=True)
class ShardingOption:
    """One layout of one table. ``group``: the ranks a row-wise or data-parallel table
    spans (for the others, the ranks of its shards); ``host``: the device index of the
    CPU whose memory holds the rows (host and uvm kernels), else -1."""

    table: str
    sharding_type: str
    kernel: str
    shards: tuple[Shard, ...]
    group: tuple[int, ...] = ()
    host: int = -1

    @property
    def perf(self) -> Perf:
        total = Perf()
        for s in self.shards:
            total = total + s.perf
        return total

    @property
    def storage(self) -> Storage:
        total = Storage()
        for s in self.shards:
            total = total + s.storage
        return total

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.shards)

    def describe(self, names) -> str:
        """``table_wise/hbm on cuda:3``, ``row_wise/hbm over cuda:0-7``, ``host on cpu``."""
        where = _ranks_text([names[r] for r in (self.group or self.ranks)])
        if self.kernel == HOST:
            return f"host on {names[self.host]}"
        return f"{self.sharding_type}/{self.kernel} {'over' if len(self.shards) > 1 else 'on'} {where}"


def _ranks_text(names: list[str]) -> str:
    """``cuda:0, cuda:1, ..., cuda:7`` shortened to ``cuda:0-7`` when consecutive."""
    if len(names) > 2:
        heads = {n.rpartition(":")[0] for n in names}
        tails = [n.rpartition(":")[2] for n in names]
        if len(heads) == 1 and all(t.isdigit() for t in tails):
            nums = [int(t) for t in tails]
            if nums == list(range(nums[0], nums[0] + len(nums))):
                return f"{heads.pop()}:{nums[0]}-{nums[-1]}"
    return ", ".join(names)


@dataclass(frozen=True)
class PathStep:
    """One stretch of the step's critical path: what ran, where, from when, how long."""

    phase: str
    device: str
    start_s: float
    seconds: float


@dataclass(frozen=True)
class StepTime:
    """A plan's predicted step: its length, the named phases (seconds) and the critical
    path (the stretches whose lengths add up to the step)."""

    total_s: float
    phases: dict
    critical_path: tuple[PathStep, ...]


@dataclass(frozen=True)
class RankStats:
    """One device's share of a step (TorchRec's per-rank stats table)."""

    device: str
    memory_bytes: float         # dense part + shards, in GPU memory (host: host memory)
    capacity_bytes: float       # usable (after the reserve); inf: unlimited
    compute_s: float            # dense forward/backward/optimizer + lookups
    comms_s: float              # its share of the collectives (and host copies)
    lookup_s: float = 0.0       # of which embedding lookups and their optimizer

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comms_s


@dataclass
class ShardingPlan:
    """A plan over a data-parallel group: one option per table, its step and stats."""

    ranks: tuple[int, ...]                  # the GPUs of the data-parallel group
    global_batch: int
    options: list[ShardingOption]
    step: StepTime | None = None
    method: str = ""
    stats: list[RankStats] = field(default_factory=list)
    optimal: bool = False
    bound_s: float | None = None            # a proven lower bound on the step (MILP)
    notes: list[str] = field(default_factory=list)

    @property
    def per_replica_batch(self) -> int:
        return self.global_batch // max(len(self.ranks), 1)

    @property
    def total_s(self) -> float:
        return self.step.total_s if self.step is not None else float("inf")

    @property
    def gap(self) -> float | None:
        """(step - bound) / step, where a bound is known."""
        if self.bound_s is None or not self.total_s or self.total_s == float("inf"):
            return None
        return max(0.0, (self.total_s - self.bound_s) / self.total_s)

    def option_of(self, table: str) -> ShardingOption:
        return next(o for o in self.options if o.table == table)
