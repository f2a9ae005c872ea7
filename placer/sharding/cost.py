"""What each layout of each table costs, per rank of a data-parallel group (the estimator).

A **layout** is a table's sharding type, kernel and shard count; its shards still to be
placed (table-wise: one, column-wise: c) or its placement fixed (data-parallel and
row-wise span their group, host tables sit with the host CPU). What a layout adds to a
step is a ``Load``: per rank r (a position in the group) the GPU seconds of lookups
forward (``ef``) and backward with the sparse update (``eb``), the bytes r sends in the
pooled-output all-to-all (``send``) and receives in the index all-to-all (``idx``), its
GPU memory (``hbm``); and for the whole step the host CPU's seconds (``cpu_f``,
``cpu_b``), the bytes per sample the host sends every rank (``host_w``), host memory
(``ddr``) and the seconds of the layout's own collectives (``of_s`` forward, ``ob_s``
backward). Loads add; the step model (``sharding.step``) turns their sum into a step.

With G the global batch, b = G / k, p the table's pooling, D its width, c column
shards, n the ranks of a row-wise group:

    layout                compute (placer's cost model, ops re-typed)       comms / memory
    table_wise            G samples, G p lookups of rows x D               send G D 4, idx G p 8
    column_wise (c)       each shard: G samples, G p lookups of rows x D/c  send G D/c 4, idx G p 8
    row_wise (group n)    each: G samples, G p / n lookups of rows/n x D    reduce-scatter [G, D]
                                                                            forward, all-gather back;
                                                                            idx G p 8 / n
    data_parallel         each rank: b samples, b p lookups; the update     all-gather of the
                          visits the G p gathered rows                      gradient rows (values
                                                                            and indices)
    host                  the host CPU: G samples, G p lookups             every rank gets b D 4
                                                                            from the host and sends
                                                                            its gradient back

Kernels: ``hbm`` keeps rows, state and transient tensors in GPU memory. ``uvm`` keeps
rows and state in host memory: each looked-up row crosses the rank's PCIe link,
``UVM_ROW_EFFICIENCY`` of its bandwidth for rows read at random (TorchRec prices fused_uvm
at a tenth of the HBM-to-DDR bandwidth: ``kernel_bw_lookup``); the update reads and writes
them back. ``uvm_caching`` holds ``cache_ratio`` of the rows in GPU memory and sends only
the misses (1 - hit rate) over PCIe; TorchRec's estimator takes the hit rate equal to the
cache ratio (0.2), the default here, and ``--uvm-cache-hit-rate`` sets a measured one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from placer.hardware.collectives import CollectiveModel
from placer.hardware.machine import Machine
from placer.sharding.net import TableOps, TrainView
from placer.sharding.types import (COLUMN_WISE, DATA_PARALLEL, HBM, HOST, ROW_WISE, TABLE_WISE, UVM,
                                             UVM_CACHING, Perf, Shard, ShardingOption, Storage, Table)

UVM_ROW_EFFICIENCY = 0.1    # TorchRec constants.kernel_bw_lookup: fused_uvm at hbm_to_ddr_mem_bw / 10
UVM_CACHE_RATIO = 0.2       # TorchRec constants.UVM_CACHING_RATIO: the share of rows the HBM cache holds
MIN_COLUMN_SHARD = 32       # narrowest column shard: one 32-float FBGEMM warp row (TorchRec's MIN_CW_DIM is 128)
COLUMN_SHARDS = (2, 4, 8)   # column-wise shard counts tried (those that give >= MIN_COLUMN_SHARD columns)


@dataclass(frozen=True)
class ShardSettings:
    """What the user sets: GPU memory kept free, the UVM cache, host memory, kernels."""

    reserve: float = 0.1
    gpu_mem_bytes: float | None = None          # per GPU; None: each profile's capacity
    host_mem_bytes: float | None = None         # None: host memory is not limited
    uvm_cache_ratio: float = UVM_CACHE_RATIO
    uvm_cache_hit_rate: float = UVM_CACHE_RATIO
    kernels: tuple[str, ...] = (HBM, UVM, UVM_CACHING, HOST)
    sharding_types: tuple[str, ...] = (DATA_PARALLEL, TABLE_WISE, ROW_WISE, COLUMN_WISE)


@dataclass
class Load:
    """What a step asks of each rank and of the host (module docstring)."""

    ef: np.ndarray
    eb: np.ndarray
    send: np.ndarray
    idx: np.ndarray
    hbm: np.ndarray
    cpu_f: float = 0.0
    cpu_b: float = 0.0
    host_w: float = 0.0
    ddr: float = 0.0
    of_s: float = 0.0
    ob_s: float = 0.0
    a2a_in: float = 0.0                 # 1: some layout needs the index all-to-all
    a2a_out: float = 0.0                # 1: some layout needs the pooled-output all-to-all

    @classmethod
    def zeros(cls, k: int) -> "Load":
        return cls(*(np.zeros(k) for _ in range(5)))

    def __add__(self, other: "Load") -> "Load":
        # written out: the search adds loads hundreds of thousands of times
        return Load(self.ef + other.ef, self.eb + other.eb, self.send + other.send, self.idx + other.idx,
                    self.hbm + other.hbm, self.cpu_f + other.cpu_f, self.cpu_b + other.cpu_b,
                    self.host_w + other.host_w, self.ddr + other.ddr, self.of_s + other.of_s,
                    self.ob_s + other.ob_s, max(self.a2a_in, other.a2a_in), max(self.a2a_out, other.a2a_out))


@dataclass
class Layout:
    """A table's sharding type + kernel + shard count, priced per rank position.

    ``shards`` > 0: that many shards still to be placed, one per rank position; a shard on
    position r adds ``per_shard`` at r (its arrays) and ``fixed`` once. ``shards`` == 0:
    the placement is fixed (``group``) and ``fixed`` is the whole load."""

    table: int
    sharding_type: str
    kernel: str
    shards: int
    rows: int
    cols: int
    fixed: Load
    per_shard: Load | None = None
    group: tuple[int, ...] = ()
    perf: list[Perf] = field(default_factory=list)         # per rank position (a shard there)
    storage: list[Storage] = field(default_factory=list)

    @property
    def name(self) -> str:
        n = f"x{self.shards}" if self.sharding_type == COLUMN_WISE else ""
        return f"{self.sharding_type}{n}/{self.kernel}"


class ShardEstimator:
    """Prices every layout of every table for one data-parallel group ``ranks`` (machine
    device indices of GPUs) at ``global_batch``; ``view`` is the train net at the
    per-replica batch."""

    def __init__(self, view: TrainView, machine: Machine, ranks: tuple[int, ...], global_batch: int,
                 settings: ShardSettings = ShardSettings(), host: int = 0):
        self.view, self.machine, self.ranks = view, machine, tuple(ranks)
        self.k, self.G, self.settings, self.host = len(ranks), int(global_batch), settings, host
        self.b = self.G // self.k
        self.collectives = CollectiveModel(machine)
        self.tables: list[Table] = [t.table for t in view.tables]
        self._a2a = self._affine("alltoall", self.ranks)
        self._uvm_bw = np.array([_pcie_rate(machine, host, r) for r in self.ranks])
        self.capacity = self._capacity()
        self._priced: dict = {}

    # -- collectives ----------------------------------------------------------------------

    def _affine(self, kind: str, ranks) -> tuple[float, float]:
        """(latency s, s per byte) of a collective over ``ranks``: NCCL's model is affine in S."""
        if len(ranks) < 2:
            return 0.0, 0.0
        small = self.collectives.time(kind, 1.0, ranks)
        big = self.collectives.time(kind, 2.0 ** 30, ranks)
        return small.latency_s, (big.time_s - big.latency_s) / 2.0 ** 30

    @property
    def a2a(self) -> tuple[float, float]:
        return self._a2a

    def collective_s(self, kind: str, nbytes: float, positions) -> float:
        ranks = [self.ranks[p] for p in positions]
        return self.collectives.time(kind, nbytes, ranks).time_s if len(ranks) > 1 and nbytes > 0 else 0.0

    # -- memory ------------------------------------------------------------------------------

    def _capacity(self) -> np.ndarray:
        """Usable GPU bytes per rank after the dense part and the reserve."""
        cap = np.array([float(self.settings.gpu_mem_bytes or self.machine.devices[r].profile.memory_capacity_bytes)
                        for r in self.ranks])
        return cap * (1 - self.settings.reserve)

    @property
    def dense_bytes(self) -> float:
        return self.view.dense.memory_bytes

    @property
    def host_capacity(self) -> float:
        return math.inf if self.settings.host_mem_bytes is None else float(self.settings.host_mem_bytes)

    # -- layouts --------------------------------------------------------------------------------

    def layouts(self, t: int) -> list[Layout]:
        """Every layout of table ``t`` the settings allow, priced."""
        s, out = self.settings, []
        ops, table = self.view.tables[t], self.tables[t]
        gpu_kernels = [kn for kn in (HBM, UVM, UVM_CACHING) if kn in s.kernels]
        if TABLE_WISE in s.sharding_types:
            out += [self._placed(t, TABLE_WISE, kn, 1) for kn in gpu_kernels]
        if COLUMN_WISE in s.sharding_types:
            for c in COLUMN_SHARDS:
                if c <= self.k and table.dim % c == 0 and table.dim // c >= MIN_COLUMN_SHARD:
                    out += [self._placed(t, COLUMN_WISE, kn, c) for kn in gpu_kernels]
        if ROW_WISE in s.sharding_types and self.k > 1:
            for group in self._row_groups():
                out += [self._row_wise(t, kn, group) for kn in gpu_kernels]
        if DATA_PARALLEL in s.sharding_types and self.k > 1:
            out.append(self._data_parallel(t))
        if HOST in s.kernels:
            out.append(self._host(t, ops, table))
        return out

    def _row_groups(self) -> list[tuple[int, ...]]:
        """All ranks, and (on several hosts) each host's ranks: TorchRec's table_row_wise."""
        hosts: dict[str, list[int]] = {}
        for p, r in enumerate(self.ranks):
            hosts.setdefault(self.machine.devices[r].host, []).append(p)
        groups = [tuple(range(self.k))]
        if len(hosts) > 1:
            groups += [tuple(g) for g in hosts.values() if len(g) > 1]
        return groups

    def _price(self, t: int, position: int, rows: int, cols: int, lookups: float, samples: int,
               update_lookups: float | None = None, device: int | None = None):
        dev = self.ranks[position] if device is None else device
        key = (t, id(self.machine.devices[dev].profile), rows, cols, round(lookups), samples,
               None if update_lookups is None else round(update_lookups))
        if key not in self._priced:  # identical GPUs price a shard once
            self._priced[key] = self.view.tables[t].price(self.view.typed, self.view.model, dev, rows, cols,
                                                          lookups, samples, update_lookups)
        return self._priced[key]

    def _kernel_terms(self, t: int, kernel: str, position: int, rows: int, cols: int, lookups: float,
                      update_rows: float, transient: float) -> tuple[float, float, float, float]:
        """(extra forward s, extra backward s, GPU bytes, host bytes) of a kernel for a shard."""
        table = self.tables[t]
        row = cols * table.dtype_bytes
        state = rows * table.state_bytes_per_row
        if kernel == HBM:
            return 0.0, 0.0, rows * row + state + transient, 0.0
        miss = 1.0 if kernel == UVM else 1.0 - self.settings.uvm_cache_hit_rate
        rate = self._uvm_bw[position] * UVM_ROW_EFFICIENCY
        fwd = miss * lookups * row / rate
        bwd = miss * update_rows * (row + table.state_bytes_per_row) * 2 / rate
        cache = self.settings.uvm_cache_ratio * rows * row if kernel == UVM_CACHING else 0.0
        return fwd, bwd, cache + transient, rows * row + state

    def _shard_load(self, t: int, kernel: str, position: int, rows: int, cols: int, lookups: float,
                    samples: int, send: float, idx: float, update_lookups: float | None = None
                    ) -> tuple[Load, Perf, Storage]:
        """The load of one shard on rank ``position`` (its arrays hold it at that position)."""
        cost = self._price(t, position, rows, cols, lookups, samples, update_lookups)
        upd = lookups if update_lookups is None else update_lookups
        xf, xb, hbm, ddr = self._kernel_terms(t, kernel, position, rows, cols, lookups, upd, cost.transient_bytes)
        load = Load.zeros(self.k)
        load.ef[position] = cost.forward_s + xf
        load.eb[position] = cost.backward_s + cost.update_s + xb
        load.send[position] = send
        load.idx[position] = idx
        load.hbm[position] = hbm
        load.ddr = ddr
        alpha, beta = self._a2a
        perf = Perf(load.ef[position], beta * (send + idx), load.eb[position], beta * send)
        return load, perf, Storage(hbm, ddr)

    def _placed(self, t: int, sharding: str, kernel: str, shards: int) -> Layout:
        """Table-wise (one shard) or column-wise (``shards`` shards): each shard looks up
        every sample's rows for its columns."""
        table = self.tables[t]
        cols = table.dim // shards
        G, p = self.G, table.pooling
        send = G * cols * table.dtype_bytes
        idx = G * p * table.index_bytes
        per, perfs, stores = Load.zeros(self.k), [], []
        for pos in range(self.k):
            load, perf, store = self._shard_load(t, kernel, pos, table.rows, cols, G * p, G, send, idx)
            per = per + replace(load, ddr=0.0)
            perfs.append(perf)
            stores.append(store)
        fixed = Load.zeros(self.k)
        fixed.ddr = stores[0].ddr_bytes * shards
        fixed.a2a_in = fixed.a2a_out = 1.0 if self.k > 1 else 0.0
        return Layout(t, sharding, kernel, shards, table.rows, cols, fixed, per, (), perfs, stores)

    def _row_wise(self, t: int, kernel: str, group: tuple[int, ...]) -> Layout:
        """Rows split over ``group``: partial sums of every sample reduce-scattered over the
        group (then sent on to the ranks outside it), gradients all-gathered back."""
        table = self.tables[t]
        n, G, p = len(group), self.G, table.pooling
        rows = math.ceil(table.rows / n)
        total = Load.zeros(self.k)
        perfs, stores = [Perf()] * self.k, [Storage()] * self.k
        whole = G * table.dim * table.dtype_bytes
        rs = self.collective_s("reducescatter", whole, group)
        ag = self.collective_s("allgather", whole, group)
        outside = (self.k - n) / self.k            # share of a member's samples owned by other ranks
        for pos in group:
            load, perf, store = self._shard_load(t, kernel, pos, rows, table.dim, G * p / n, G,
                                                 send=whole / n * outside, idx=G * p * table.index_bytes / n)
            total = total + load
            perfs[pos] = Perf(perf.fwd_compute_s, perf.fwd_comms_s + rs, perf.bwd_compute_s, perf.bwd_comms_s + ag)
            stores[pos] = store
        total.of_s, total.ob_s = rs, ag
        total.a2a_in = 1.0
        total.a2a_out = 1.0 if n < self.k else 0.0
        return Layout(t, ROW_WISE, kernel, 0, rows, table.dim, total, None, tuple(group), perfs, stores)

    def _data_parallel(self, t: int) -> Layout:
        """The table on every rank: lookups of its b samples, gradient rows all-gathered
        (values and indices, as data_parallel_model's Concat of slices) and applied by each."""
        table = self.tables[t]
        G, b, p = self.G, self.b, table.pooling
        total = Load.zeros(self.k)
        perfs, stores = [], []
        gathered = G * p * (table.dim * table.dtype_bytes + table.index_bytes)
        ag = self.collective_s("allgather", gathered, range(self.k))
        for pos in range(self.k):
            load, perf, store = self._shard_load(t, HBM, pos, table.rows, table.dim, b * p, b, 0.0, 0.0,
                                                 update_lookups=G * p)
            load.hbm[pos] += gathered - b * p * (table.dim * table.dtype_bytes + table.index_bytes)
            total = total + load
            perfs.append(Perf(perf.fwd_compute_s, 0.0, perf.bwd_compute_s, ag))
            stores.append(Storage(load.hbm[pos], 0.0))
        total.ob_s = ag
        return Layout(t, DATA_PARALLEL, HBM, 0, table.rows, table.dim, total, None, tuple(range(self.k)),
                      perfs, stores)

    def _host(self, t: int, ops: TableOps, table: Table) -> Layout:
        """Rows, lookups and the sparse update on the host CPU for every sample."""
        G, p = self.G, table.pooling
        cost = self._price(t, 0, table.rows, table.dim, G * p, G, device=self.host)
        load = Load.zeros(self.k)
        load.cpu_f, load.cpu_b = cost.forward_s, cost.backward_s + cost.update_s
        load.host_w = table.dim * table.dtype_bytes
        load.ddr = table.rows * (table.row_bytes + table.state_bytes_per_row) + cost.transient_bytes
        perf = Perf(cost.forward_s, 0.0, cost.backward_s + cost.update_s, 0.0)
        return Layout(t, TABLE_WISE, HOST, 0, table.rows, table.dim, load, None, (), [perf],
                      [Storage(0.0, load.ddr)])

    # -- placing --------------------------------------------------------------------------------

    def load_of(self, layout: Layout, positions: tuple[int, ...] = ()) -> Load:
        """The load of a layout with its shards on rank ``positions`` (one per shard)."""
        if layout.shards == 0:
            return layout.fixed
        if len(positions) != layout.shards:
            raise ValueError(f"{layout.name} needs {layout.shards} positions, got {positions}")
        load = replace(layout.fixed, ef=layout.fixed.ef.copy(), eb=layout.fixed.eb.copy(),
                       send=layout.fixed.send.copy(), idx=layout.fixed.idx.copy(), hbm=layout.fixed.hbm.copy())
        per = layout.per_shard
        for pos in positions:
            for name in ("ef", "eb", "send", "idx", "hbm"):
                getattr(load, name)[pos] += getattr(per, name)[pos]
        return load

    def option(self, layout: Layout, positions: tuple[int, ...] = ()) -> ShardingOption:
        """The layout as TorchRec's record: shards with their ranks, perf and storage."""
        table = self.tables[layout.table]
        if layout.kernel == HOST:
            shard = Shard(self.host, table.rows, table.dim, perf=layout.perf[0], storage=layout.storage[0])
            return ShardingOption(table.name, TABLE_WISE, HOST, (shard,), (), self.host)
        host = self.host if layout.kernel in (UVM, UVM_CACHING) else -1
        if layout.shards == 0:
            shards = tuple(Shard(self.ranks[p], layout.rows, layout.cols, i * layout.rows if layout.sharding_type == ROW_WISE
                                 else 0, 0, layout.perf[p], layout.storage[p]) for i, p in enumerate(layout.group))
            return ShardingOption(table.name, layout.sharding_type, layout.kernel, shards,
                                  tuple(self.ranks[p] for p in layout.group), host)
        shards = tuple(Shard(self.ranks[p], layout.rows, layout.cols, 0, j * layout.cols, layout.perf[p],
                             layout.storage[p]) for j, p in enumerate(positions))
        return ShardingOption(table.name, layout.sharding_type, layout.kernel, shards, (), host)


def _pcie_rate(machine: Machine, host: int, rank: int) -> float:
    """Bytes/s a GPU reads host memory at: its host link's slowest hop."""
    src = host if machine.devices[rank].host == machine.devices[host].host else _own_cpu(machine, rank)
    return min(h.curve.bytes_per_s for h in machine.link(src, rank).hops)


def _own_cpu(machine: Machine, rank: int) -> int:
    host = machine.devices[rank].host
    return next(i for i, d in enumerate(machine.devices) if d.kind == "cpu" and d.host == host)
