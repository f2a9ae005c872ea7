"""The cost graph as flat arrays over k devices (``CostArrays``), what every partitioner solves.

A million-op net is too big to walk node by node in Python while solving, so the cost graph
(``placer.costs.graph``) is turned into these arrays once; what a placement of them costs
is ``placer.partition.problem``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from placer.errors import InfeasiblePlanError

HOST, PARAM = -1, -2     # producers of a blob fed from the host / made by the init net
FREE = -1                # ``forced`` value of an op not forced to one device


@dataclass
class CostArrays:
    """A cost graph as arrays (units as in ``placer.costs.graph``). Tensors are in CSR form:
    the consumers of tensor t are ``t_cons[t_ptr[t]:t_ptr[t+1]]`` (no op twice)."""

    op_s: np.ndarray                # float [n, k]: seconds of op i on device d
    allowed: np.ndarray             # bool [n, k]: op i may run on device d (kernels, pins)
    param_bytes: np.ndarray         # float [n]
    output_bytes: np.ndarray        # float [n]
    t_producer: np.ndarray          # int [T]: op, HOST (-1) or PARAM (-2)
    t_ptr: np.ndarray               # int [T + 1]
    t_cons: np.ndarray              # int [E]
    t_bytes: np.ndarray             # float [T]
    t_ext_out: np.ndarray           # bool [T]
    link_class: np.ndarray          # int [k, k]: class of the link a -> b, -1 on the diagonal
    class_s: np.ndarray             # float [C, T]: copy seconds of tensor t over link class c
    devices: tuple = ("cpu", "gpu")
    device_kinds: tuple = ("cpu", "gpu")
    capacity: np.ndarray | None = None   # float [k]: usable bytes per device (inf: no limit)
    host: int = 0                   # device that feeds host inputs and reads external outputs
    lanes: tuple = ()               # copy lanes (names): copies on one lane run one at a time
    routes: dict = field(default_factory=dict)  # (a, b) -> ((lane, class), ...) hops of a -> b
    colocate: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    outputs_on_host: bool = True
    names: list | None = None
    types: list | None = None
    t_names: list | None = None
    pin_reason: list | None = None  # why an op is restricted ("" where it is free)

    def __post_init__(self):
        if self.capacity is None:
            self.capacity = np.full(self.k, np.inf)

    # ------------------------------------------------------------------ sizes, labels
    @property
    def n_ops(self) -> int:
        return self.op_s.shape[0]

    @property
    def k(self) -> int:
        return self.op_s.shape[1]

    @property
    def n_tensors(self) -> int:
        return len(self.t_producer)

    def op_label(self, i: int) -> str:
        name = self.names[i] if self.names else ""
        kind = self.types[i] if self.types else "op"
        return f"#{i} {kind}" + (f" '{name}'" if name else "")

    def tensor_name(self, t: int) -> str:
        return self.t_names[t] if self.t_names else f"t{t}"

    def copy_s(self, t, src, dst) -> np.ndarray:
        """Copy seconds of tensors ``t`` from devices ``src`` to ``dst`` (arrays; src != dst)."""
        return self.class_s[self.link_class[src, dst], t]

    # ------------------------------------------------------------------ CSR helpers
    @cached_property
    def entry_tensor(self) -> np.ndarray:
        """For each consumer entry, the tensor it belongs to."""
        return np.repeat(np.arange(self.n_tensors), np.diff(self.t_ptr))

    @cached_property
    def consumed_by(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR op -> tensors it reads: (ptr, tensor ids)."""
        order = np.argsort(self.t_cons, kind="stable")
        ptr = np.searchsorted(self.t_cons[order], np.arange(self.n_ops + 1))
        return ptr, self.entry_tensor[order]

    @cached_property
    def produced_by(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR op -> tensors it makes: (ptr, tensor ids)."""
        ids = np.flatnonzero(self.t_producer >= 0)
        order = ids[np.argsort(self.t_producer[ids], kind="stable")]
        ptr = np.searchsorted(self.t_producer[order], np.arange(self.n_ops + 1))
        return ptr, order

    @cached_property
    def read_param_bytes(self) -> np.ndarray:
        """Bytes of the parameters each op reads (from the blob table)."""
        par = (self.t_producer == PARAM)[self.entry_tensor]
        return np.bincount(self.t_cons[par], weights=self.t_bytes[self.entry_tensor[par]],
                           minlength=self.n_ops)

    @cached_property
    def written_bytes(self) -> np.ndarray:
        """Bytes each op writes: its blobs in the table, or ``output_bytes`` if larger."""
        made = self.t_producer >= 0
        own = np.bincount(self.t_producer[made], weights=self.t_bytes[made], minlength=self.n_ops)
        return np.maximum(own, self.output_bytes)

    @cached_property
    def scratch_bytes(self) -> np.ndarray:
        """Bytes each op writes that no one reads (live only while it runs)."""
        made = self.t_producer >= 0
        produced = np.bincount(self.t_producer[made], weights=self.t_bytes[made], minlength=self.n_ops)
        return np.maximum(self.output_bytes - produced, 0)

    # ------------------------------------------------------------------ restrictions
    @cached_property
    def component(self) -> np.ndarray:
        """Colocation component of every op (ops that must share a device)."""
        n = self.n_ops
        if len(self.colocate) == 0:
            return np.arange(n)
        a, b = self.colocate[:, 0], self.colocate[:, 1]
        m = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
        return connected_components(m, directed=False)[1]

    @cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR colocation component -> its ops: (ptr, op indices in net order)."""
        comp = self.component
        order = np.argsort(comp, kind="stable")
        ptr = np.searchsorted(comp[order], np.arange(comp.max() + 2 if len(comp) else 1))
        return ptr, order

    def group_of(self, i: int) -> np.ndarray:
        """The ops that must share op i's device (op i among them), in net order."""
        ptr, order = self.groups
        c = self.component[i]
        return order[ptr[c]:ptr[c + 1]]

    @cached_property
    def feasible(self) -> np.ndarray:
        """bool [n, k]: devices an op may take once its colocation group is accounted for
        (the intersection of the group's ``allowed`` rows); InfeasiblePlanError when a
        group or an op has no device left."""
        comp = self.component
        m = comp.max() + 1 if len(comp) else 0
        bad_rows = np.zeros((m, self.k), np.int64)
        np.add.at(bad_rows, comp, (~self.allowed).astype(np.int64))
        ok = (bad_rows == 0)[comp]
        empty = np.flatnonzero(~ok.any(axis=1))
        if len(empty):
            i = int(empty[0])
            group = np.flatnonzero(comp == comp[i])[:6]
            why = "; ".join(f"{self.op_label(j)}: {self._allowed_text(j)}" for j in group)
            raise InfeasiblePlanError(
                ("ops that must share a device have no device in common: " if len(group) > 1
                 else f"op {self.op_label(i)} may run on no device: ") + why,
                hint="drop one of the --pin options")
        return ok

    def _allowed_text(self, i: int) -> str:
        devs = [self.devices[d] for d in np.flatnonzero(self.allowed[i])]
        reason = self.pin_reason[i] if self.pin_reason and self.pin_reason[i] else ""
        return (("only " + ", ".join(devs)) if devs else "no device") + (f" ({reason})" if reason else "")

    @cached_property
    def forced(self) -> np.ndarray:
        """int [n]: the one device an op must take, or FREE."""
        ok = self.feasible
        one = ok.sum(axis=1) == 1
        return np.where(one, ok.argmax(axis=1), FREE).astype(np.int64)

    def tensor_source(self, dev: np.ndarray) -> np.ndarray:
        """Device each tensor starts on: its producer's, the host for host-fed blobs, -1
        for parameters (made wherever they are read)."""
        src = np.full(self.n_tensors, -1, np.int64)
        made = self.t_producer >= 0
        src[made] = dev[self.t_producer[made]]
        src[self.t_producer == HOST] = self.host
        return src
