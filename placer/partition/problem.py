"""The partitioners' view of a cost graph: flat numpy arrays, and the serial cost of a placement.

Every partitioner turns the networkx cost graph (``placer.graph``) into ``CostArrays``
once, because a million-op net is too big to walk node by node in Python while solving.
A placement is a boolean array ``on_gpu`` indexed by op.

Serial cost (Caffe2 ``simple`` nets run ops one after another):
  total = sum of op times on their devices
        + h2d_s of every blob made on the CPU (or fed from the host) and read on the GPU
        + d2h_s of every blob made on the GPU and read on the CPU (or an external
          output when ``outputs_on_host``),
each copy paid once per blob and direction. Parameters (producer -2) are never copied:
the init net makes them on every device that reads them, which costs memory only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from placer.errors import InfeasiblePlanError
from placer.types import CPU, GPU0, PlanCopy, PlanCost

PIN_NONE, PIN_CPU, PIN_GPU = -1, 0, 1
HOST, PARAM = -1, -2


@dataclass
class CostArrays:
    """A cost graph as arrays (units as in ``placer.graph``). Tensors are in CSR form:
    the consumers of tensor t are ``t_cons[t_ptr[t]:t_ptr[t+1]]``."""

    cpu_s: np.ndarray
    gpu_s: np.ndarray
    pin: np.ndarray                 # int8: PIN_NONE, PIN_CPU, PIN_GPU
    param_bytes: np.ndarray
    output_bytes: np.ndarray
    t_producer: np.ndarray          # int64: op, HOST (-1) or PARAM (-2)
    t_ptr: np.ndarray
    t_cons: np.ndarray
    t_bytes: np.ndarray
    t_h2d: np.ndarray
    t_d2h: np.ndarray
    t_ext_out: np.ndarray           # bool
    colocate: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    outputs_on_host: bool = True
    names: list | None = None
    types: list | None = None
    t_names: list | None = None
    pin_reason: list | None = None

    @property
    def n_ops(self) -> int:
        return len(self.cpu_s)

    @property
    def n_tensors(self) -> int:
        return len(self.t_producer)

    def op_label(self, i: int) -> str:
        name = self.names[i] if self.names else ""
        kind = self.types[i] if self.types else "op"
        return f"#{i} {kind}" + (f" '{name}'" if name else "")

    def tensor_name(self, t: int) -> str:
        return self.t_names[t] if self.t_names else f"t{t}"

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
    def component(self) -> np.ndarray:
        """Colocation component of every op (ops that must share a device)."""
        n = self.n_ops
        if len(self.colocate) == 0:
            return np.arange(n)
        a, b = self.colocate[:, 0], self.colocate[:, 1]
        m = coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n))
        return connected_components(m, directed=False)[1]

    @cached_property
    def forced(self) -> np.ndarray:
        """Pins spread over colocation components (PIN_NONE/CPU/GPU per op);
        InfeasiblePlanError when one component holds both pins."""
        comp = self.component
        k = comp.max() + 1 if len(comp) else 0
        has_cpu = np.bincount(comp, weights=self.pin == PIN_CPU, minlength=k) > 0
        has_gpu = np.bincount(comp, weights=self.pin == PIN_GPU, minlength=k) > 0
        bad = np.flatnonzero(has_cpu & has_gpu)
        if len(bad):
            ops = np.flatnonzero(comp == bad[0])[:6]
            raise InfeasiblePlanError(
                "ops that must share a device are pinned to different devices: "
                + ", ".join(f"{self.op_label(i)} ({['cpu', 'gpu'][self.pin[i]] if self.pin[i] >= 0 else 'free'})"
                            for i in ops), hint="drop one of the --pin options")
        out = np.full(self.n_ops, PIN_NONE, np.int8)
        out[has_cpu[comp]] = PIN_CPU
        out[has_gpu[comp]] = PIN_GPU
        return out


def from_graph(graph) -> CostArrays:
    """CostArrays of a networkx cost graph (or the arrays themselves)."""
    if isinstance(graph, CostArrays):
        return graph
    n = graph.number_of_nodes()
    nodes = [graph.nodes[i] for i in range(n)]
    col = lambda key: np.array([d[key] for d in nodes], dtype=np.float64)  # noqa: E731
    pin = np.array([{None: PIN_NONE, "cpu": PIN_CPU, "gpu": PIN_GPU}[d["pin"]] for d in nodes],
                   dtype=np.int8)
    t = graph.graph["tensors"]
    # an op reading the blob it writes (in place) needs no copy of it: not a reader here
    consumers = [sorted(set(int(c) for c in cs) - {int(p)})
                 for cs, p in zip(t["consumers"], t["producer"])]
    ptr = np.zeros(len(consumers) + 1, np.int64)
    ptr[1:] = np.cumsum([len(c) for c in consumers])
    cons = np.fromiter((c for cs in consumers for c in cs), np.int64, count=ptr[-1])
    pairs = [(g[0], other) for g in graph.graph.get("colocate", []) for other in g[1:]]
    return CostArrays(
        cpu_s=col("cpu_s"), gpu_s=col("gpu_s"), pin=pin, param_bytes=col("param_bytes"),
        output_bytes=col("output_bytes"), t_producer=t["producer"].to_numpy(np.int64),
        t_ptr=ptr, t_cons=cons, t_bytes=t["bytes"].to_numpy(np.float64),
        t_h2d=t["h2d_s"].to_numpy(np.float64), t_d2h=t["d2h_s"].to_numpy(np.float64),
        t_ext_out=t["external_output"].to_numpy(bool),
        colocate=np.array(pairs, np.int64).reshape(-1, 2),
        outputs_on_host=bool(graph.graph.get("outputs_on_host", True)),
        names=[d["name"] for d in nodes], types=[d["type"] for d in nodes],
        t_names=list(t["name"]), pin_reason=[d.get("pin_reason", "") for d in nodes])


def copy_masks(arr: CostArrays, on_gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks over tensors: needs an H2D copy, needs a D2H copy."""
    on_gpu = np.asarray(on_gpu, bool)
    cons_gpu = on_gpu[arr.t_cons]
    gpu_reads = np.bincount(arr.entry_tensor, weights=cons_gpu, minlength=arr.n_tensors) > 0
    cpu_reads = np.bincount(arr.entry_tensor, weights=~cons_gpu, minlength=arr.n_tensors) > 0
    if arr.outputs_on_host:
        cpu_reads |= arr.t_ext_out
    made_on_gpu = np.zeros(arr.n_tensors, bool)
    made = arr.t_producer >= 0
    made_on_gpu[made] = on_gpu[arr.t_producer[made]]
    copied = arr.t_producer != PARAM
    return copied & ~made_on_gpu & gpu_reads, copied & made_on_gpu & cpu_reads


def serial_cost(arr: CostArrays, on_gpu: np.ndarray) -> PlanCost:
    """The serial objective of a placement (module docstring)."""
    on_gpu = np.asarray(on_gpu, bool)
    h2d, d2h = copy_masks(arr, on_gpu)
    compute = float(np.where(on_gpu, arr.gpu_s, arr.cpu_s).sum())
    return PlanCost(compute, float(arr.t_h2d[h2d].sum() + arr.t_d2h[d2h].sum()))


def plan_copies(arr: CostArrays, on_gpu: np.ndarray) -> list[PlanCopy]:
    """The copies a placement needs, one per tensor and direction."""
    on_gpu = np.asarray(on_gpu, bool)
    h2d, d2h = copy_masks(arr, on_gpu)
    out = []
    for t in np.flatnonzero(h2d | d2h):
        cons = arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]
        if h2d[t]:
            out.append(PlanCopy(arr.tensor_name(t), "h2d", float(arr.t_bytes[t]),
                                float(arr.t_h2d[t]), int(arr.t_producer[t]),
                                tuple(int(c) for c in cons[on_gpu[cons]])))
        else:
            readers = tuple(int(c) for c in cons[~on_gpu[cons]])
            if arr.outputs_on_host and arr.t_ext_out[t]:
                readers += (-1,)
            out.append(PlanCopy(arr.tensor_name(t), "d2h", float(arr.t_bytes[t]),
                                float(arr.t_d2h[t]), int(arr.t_producer[t]), readers))
    return out


def placement_dict(on_gpu: np.ndarray) -> dict:
    return dict(enumerate(GPU0 if g else CPU for g in np.asarray(on_gpu, bool).tolist()))


def placement_array(placement: dict, n: int) -> np.ndarray:
    """Inverse of ``placement_dict``; accepts Device or "cpu"/"gpu" values."""
    out = np.zeros(n, bool)
    for i, d in placement.items():
        out[i] = (d.kind if hasattr(d, "kind") else str(d)) == "gpu"
    return out


def flip_delta(arr: CostArrays, on_gpu: np.ndarray, ops) -> tuple[float, int]:
    """Change of the serial cost if ``ops`` all move to the other device, and the tensor
    whose copy cost grows the most (-1 if none). ``on_gpu`` is left unchanged."""
    ops = np.atleast_1d(ops)
    cptr, cten = arr.consumed_by
    pptr, pten = arr.produced_by
    touched = np.unique(np.concatenate([cten[cptr[i]:cptr[i + 1]] for i in ops]
                                       + [pten[pptr[i]:pptr[i + 1]] for i in ops]))
    before = _tensor_costs(arr, on_gpu, touched)
    on_gpu[ops] = ~on_gpu[ops]
    after = _tensor_costs(arr, on_gpu, touched)
    on_gpu[ops] = ~on_gpu[ops]
    sign = np.where(on_gpu[ops], -1.0, 1.0)
    compute = float((sign * (arr.gpu_s[ops] - arr.cpu_s[ops])).sum())
    grow = after - before
    worst = int(touched[np.argmax(grow)]) if len(touched) and grow.max() > 0 else -1
    return compute + float(grow.sum()), worst


def _tensor_costs(arr: CostArrays, on_gpu: np.ndarray, ts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ts))
    for k, t in enumerate(ts):
        p = arr.t_producer[t]
        if p == PARAM:
            continue
        cons_gpu = on_gpu[arr.t_cons[arr.t_ptr[t]:arr.t_ptr[t + 1]]]
        if p >= 0 and on_gpu[p]:
            if (~cons_gpu).any() or (arr.outputs_on_host and arr.t_ext_out[t]):
                out[k] = arr.t_d2h[t]
        elif cons_gpu.any():
            out[k] = arr.t_h2d[t]
    return out


def scratch_bytes(arr: CostArrays) -> np.ndarray:
    """Bytes each op writes that no one reads (live only while it runs)."""
    made = arr.t_producer >= 0
    produced = np.bincount(arr.t_producer[made], weights=arr.t_bytes[made], minlength=arr.n_ops)
    return np.maximum(arr.output_bytes - produced, 0)


def gpu_memory(arr: CostArrays, on_gpu: np.ndarray, curve_only: bool = False):
    """GPU bytes of a placement: (parameters, peak live activations, step of the peak);
    with ``curve_only``, (parameters, live activation bytes at every step, 0).

    Parameters live on the GPU when any GPU op reads them, for the whole run.
    Activation lifetimes follow the op order (step i = while op i runs):
    - a blob made on the GPU by op p lives from step p to its last GPU reader (its copy
      to the host is made right after p); an external output kept on the GPU
      (``outputs_on_host`` False) lives to the end;
    - a blob copied to the GPU lives from its first to its last GPU reader;
    - the bytes an op writes that nobody reads (``output_bytes`` minus its table blobs)
      live during that op's step only.
    """
    on_gpu = np.asarray(on_gpu, bool)
    n, T = arr.n_ops, arr.n_tensors
    et, cons = arr.entry_tensor, arr.t_cons
    g = on_gpu[cons]
    params = arr.t_producer == PARAM
    gpu_reads = np.bincount(et, weights=g, minlength=T) > 0
    param_bytes = float(arr.t_bytes[params & gpu_reads].sum())
    big = np.int64(n + 1)
    first = np.full(T, big)
    last = np.full(T, -1, np.int64)
    if len(cons):
        np.minimum.at(first, et[g], cons[g])
        np.maximum.at(last, et[g], cons[g])
    made = arr.t_producer >= 0
    prod = np.where(made, arr.t_producer, 0)
    made_gpu = made & on_gpu[prod]
    start = np.where(made_gpu, prod, first)
    end = np.where(made_gpu, np.maximum(prod, last), last)
    if not arr.outputs_on_host:
        end = np.where(made_gpu & arr.t_ext_out, n - 1, end)
    live = ~params & (made_gpu | gpu_reads)
    diff = np.bincount(start[live], weights=arr.t_bytes[live], minlength=n + 1)
    diff -= np.bincount(end[live] + 1, weights=arr.t_bytes[live], minlength=n + 1)
    curve = np.cumsum(diff)[:n] + scratch_bytes(arr) * on_gpu
    if curve_only:
        return param_bytes, curve, 0
    if n == 0:
        return param_bytes, 0.0, 0
    step = int(np.argmax(curve))
    return param_bytes, float(curve[step]), step


def flip_deltas(arr: CostArrays, on_gpu: np.ndarray) -> np.ndarray:
    """Change of the serial cost if each op alone moved to the other device (vectorised
    ``flip_delta`` for all ops at once, colocation ignored)."""
    x = np.asarray(on_gpu, bool)
    n, T, et = arr.n_ops, arr.n_tensors, arr.entry_tensor
    sign = np.where(x, -1.0, 1.0)
    delta = sign * (arr.gpu_s - arr.cpu_s)
    g_read = np.bincount(et, weights=x[arr.t_cons], minlength=T)
    c_read = np.bincount(et, weights=~x[arr.t_cons], minlength=T)
    if arr.outputs_on_host:
        c_read = c_read + arr.t_ext_out
    made = arr.t_producer >= 0
    p_gpu = np.zeros(T, bool)
    p_gpu[made] = x[arr.t_producer[made]]
    live = arr.t_producer != PARAM

    def cost(pg, g, c, t=slice(None)):
        return np.where(pg, np.where(c > 0, arr.t_d2h[t], 0.0), np.where(g > 0, arr.t_h2d[t], 0.0))

    now = np.where(live, cost(p_gpu, g_read, c_read), 0.0)
    # producers flip
    prod_after = np.where(live & made, cost(~p_gpu, g_read, c_read), 0.0)
    delta += np.bincount(arr.t_producer[made], weights=(prod_after - now)[made], minlength=n)
    # each reader flips
    rg = x[arr.t_cons]
    g2 = g_read[et] + np.where(rg, -1, 1)
    c2 = c_read[et] + np.where(rg, 1, -1)
    after = np.where(live[et], cost(p_gpu[et], g2, c2, et), 0.0)
    delta += np.bincount(arr.t_cons, weights=after - now[et], minlength=n)
    return delta
