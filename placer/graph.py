"""The cost graph: one networkx DiGraph that every partitioner and report reads.

``build_cost_graph(net_costs, ...)`` turns the cost tables written by ``placer.costs``
(``NetCosts.ops`` and ``NetCosts.tensors``, see that module) into the graph below.
``cost_arrays(net_costs, ...)`` makes the same graph directly in the partitioners' flat
form (``placer.partition.problem.CostArrays``, equal to ``from_graph`` of the networkx
graph), in bulk from the table columns: the planner works on that form alone, since a
networkx graph of a million-op net takes about 4 GB and 20 s to build and convert.

Graph conventions (every attribute, its unit, who writes it)
------------------------------------------------------------
Nodes are op indices ``0 .. n-1`` in net order (a topological order).

Node attributes (written by ``build_cost_graph`` from ``NetCosts.ops``, costs by ``placer.costs``):
  ``index`` (int)          op index in the net, equal to the node key
  ``name``, ``type`` (str) op name (may be "") and Caffe2 op type
  ``cpu_s``, ``gpu_s`` (s)  predicted time of one run of the op on each device
  ``param_bytes`` (bytes)  parameter bytes the op reads (memory only, no per-run copy)
  ``output_bytes`` (bytes) bytes of every blob the op writes, consumed or not
  ``gpu_kernel``, ``known`` (bool) the op type has a GPU kernel / a registry entry
  ``pin`` ("cpu" | "gpu" | None) a hard placement; ``pin_reason`` (str) why, for reports.
      Written here: ops with no GPU kernel or an unknown type -> "cpu"; then the
      caller's ``pins`` (user ``--pin``, ``--keep-existing``) override nothing pinned
      for lack of a kernel (a GPU pin on such an op is an error).

Edge attributes, one edge ``u -> v`` per producer/consumer pair of ops:
  ``tensors`` (tuple of str) blobs made by u and read by v
  ``bytes`` (bytes), ``h2d_s``, ``d2h_s`` (s) their sums; the copy of a blob is paid
      once per direction however many consumers it has, so partitioners price copies
      from the ``tensors`` table below, never by adding edges up.

Graph attributes (``G.graph``):
  ``tensors``: pandas DataFrame, the authoritative blob table, one row per blob that is
      consumed or is an external output: ``name``, ``producer`` (op index; -1 fed from
      the host; -2 a parameter made by the init net), ``consumers`` (list of op indices),
      ``bytes`` (bytes), ``h2d_s``, ``d2h_s`` (s), ``external_output`` (bool).
  ``external_inputs``, ``params``, ``external_outputs``: lists of blob names.
  ``colocate``: list of sorted tuples of op indices that must share a device (an
      in-place op and the producer of its blob; a parameter's update ops and its
      consumers), from the caller's ``colocate`` and ``inplace`` arguments.
  ``outputs_on_host`` (bool): external outputs must come back to the host (pay D2H).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np
import pandas as pd

from placer.errors import InfeasiblePlanError
from placer.partition.problem import PIN_CPU, PIN_GPU, PIN_NONE, CostArrays

if TYPE_CHECKING:
    import networkx as nx

OP_COLUMNS = ("index", "name", "type", "cpu_s", "gpu_s", "param_bytes", "output_bytes",
              "gpu_kernel", "known")
TENSOR_COLUMNS = ("name", "producer", "consumers", "bytes", "h2d_s", "d2h_s", "external_output")


def build_cost_graph(net_costs, pins: dict[int, str] | None = None,
                     colocate: Iterable[Iterable[int]] | None = None,
                     outputs_on_host: bool = True,
                     inplace: Iterable[tuple[int, int]] | None = None) -> nx.DiGraph:
    """The cost graph of a net (see the module docstring for every attribute).

    ``pins`` maps op index -> "cpu"/"gpu"; ``colocate`` lists sets of op indices that
    must share a device; ``inplace`` lists (op, producer of the blob it overwrites) pairs,
    which are colocated too.
    """
    import networkx as nx  # here: the planner itself never needs it, and it takes 0.2 s to import
    ops, tensors = net_costs.ops, net_costs.tensors
    _check_tables(ops, tensors)
    g = nx.DiGraph()
    g.add_nodes_from(_node_records(ops, pins or {}))
    g.add_edges_from(_edge_records(tensors))
    producer = tensors["producer"].to_numpy()
    g.graph.update(
        tensors=tensors.reset_index(drop=True),
        external_inputs=list(tensors["name"][producer == -1]),
        params=list(tensors["name"][producer == -2]),
        external_outputs=list(tensors["name"][tensors["external_output"].to_numpy(bool)]),
        colocate=_colocation_groups(colocate, inplace),
        outputs_on_host=bool(outputs_on_host),
    )
    return g


def cost_arrays(net_costs, pins: dict[int, str] | None = None,
                colocate: Iterable[Iterable[int]] | None = None,
                outputs_on_host: bool = True,
                inplace: Iterable[tuple[int, int]] | None = None) -> CostArrays:
    """``from_graph(build_cost_graph(...))`` with the same arguments, without the graph:
    every array is made from a whole table column at once."""
    ops, tensors = net_costs.ops, net_costs.tensors
    _check_tables(ops, tensors)
    pin, why = _pins(ops, pins or {})
    col = lambda key: ops[key].to_numpy(np.float64)  # noqa: E731
    ptr, cons = _readers_csr(tensors)
    groups = _colocation_groups(colocate, inplace)
    pairs = [(grp[0], other) for grp in groups for other in grp[1:]]
    return CostArrays(
        cpu_s=col("cpu_s"), gpu_s=col("gpu_s"),
        pin=np.array([{None: PIN_NONE, "cpu": PIN_CPU, "gpu": PIN_GPU}[p] for p in pin], np.int8),
        param_bytes=col("param_bytes"), output_bytes=col("output_bytes"),
        t_producer=tensors["producer"].to_numpy(np.int64), t_ptr=ptr, t_cons=cons,
        t_bytes=tensors["bytes"].to_numpy(np.float64), t_h2d=tensors["h2d_s"].to_numpy(np.float64),
        t_d2h=tensors["d2h_s"].to_numpy(np.float64), t_ext_out=tensors["external_output"].to_numpy(bool),
        colocate=np.array(pairs, np.int64).reshape(-1, 2), outputs_on_host=bool(outputs_on_host),
        names=ops["name"].tolist(), types=ops["type"].tolist(), t_names=tensors["name"].tolist(),
        pin_reason=why)


def _readers_csr(tensors: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Consumers of each tensor in CSR form, sorted, each once, less its producer (an op
    reading the blob it writes in place needs no copy of it)."""
    consumers = tensors["consumers"].tolist()
    counts = np.fromiter(map(len, consumers), np.int64, count=len(consumers))
    flat = np.fromiter((int(c) for cs in consumers for c in cs), np.int64, count=int(counts.sum()))
    owner = np.repeat(np.arange(len(consumers)), counts)
    keep = flat != tensors["producer"].to_numpy(np.int64)[owner]
    owner, flat = owner[keep], flat[keep]
    order = np.lexsort((flat, owner))
    owner, flat = owner[order], flat[order]
    first = np.ones(len(flat), bool)
    first[1:] = (owner[1:] != owner[:-1]) | (flat[1:] != flat[:-1])
    owner, flat = owner[first], flat[first]
    ptr = np.zeros(len(consumers) + 1, np.int64)
    ptr[1:] = np.cumsum(np.bincount(owner, minlength=len(consumers)))
    return ptr, flat


def _colocation_groups(colocate, inplace) -> list[tuple[int, ...]]:
    groups = [tuple(sorted({int(i) for i in s})) for s in (colocate or [])]
    groups += [tuple(sorted((int(a), int(b)))) for a, b in (inplace or [])]
    return [grp for grp in groups if len(grp) > 1]


def _check_tables(ops: pd.DataFrame, tensors: pd.DataFrame) -> None:
    _require(ops, OP_COLUMNS, "NetCosts.ops")
    _require(tensors, TENSOR_COLUMNS, "NetCosts.tensors")
    if not np.array_equal(ops["index"].to_numpy(), np.arange(len(ops))):
        raise ValueError("NetCosts.ops must have one row per op in net order (index 0..n-1)")


def _require(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}")


def _node_records(ops: pd.DataFrame, pins: dict[int, str]):
    cols = {c: ops[c].tolist() for c in OP_COLUMNS}
    pin, why = _pins(ops, pins)
    for i in range(len(ops)):
        yield i, {"index": i, "name": cols["name"][i], "type": cols["type"][i],
                  "cpu_s": float(cols["cpu_s"][i]), "gpu_s": float(cols["gpu_s"][i]),
                  "param_bytes": float(cols["param_bytes"][i]),
                  "output_bytes": float(cols["output_bytes"][i]),
                  "gpu_kernel": bool(cols["gpu_kernel"][i]), "known": bool(cols["known"][i]),
                  "pin": pin[i], "pin_reason": why[i]}


def _pins(ops: pd.DataFrame, pins: dict[int, str]) -> tuple[list, list[str]]:
    """Each op's pin ("cpu", "gpu" or None) and the reason for it (module docstring)."""
    known, kernel = ops["known"].tolist(), ops["gpu_kernel"].tolist()
    pin: list = [None] * len(ops)
    why = [""] * len(ops)
    for i, (k, g) in enumerate(zip(known, kernel)):
        if not k:
            pin[i], why[i] = "cpu", "pinned: unknown op type"
        elif not g:
            pin[i], why[i] = "cpu", "pinned: no GPU kernel"
    for i in sorted(i for i in pins if 0 <= i < len(ops)):  # in op order: the first conflict is named
        user = pins[i]
        if user not in ("cpu", "gpu"):
            raise ValueError(f"pin for op {i} must be 'cpu' or 'gpu', not {user!r}")
        if pin[i] == "cpu" and user == "gpu":
            raise InfeasiblePlanError(
                f"op #{i} {ops['type'].iat[i]} '{ops['name'].iat[i]}' is pinned to the GPU but "
                f"{why[i].removeprefix('pinned: ')}", hint="remove its --pin or pin it to cpu")
        if pin[i] is None:
            pin[i], why[i] = user, f"pinned: --pin {user}"
    return pin, why


def _edge_records(tensors: pd.DataFrame):
    edges: dict[tuple[int, int], dict] = {}
    rows = zip(tensors["name"], tensors["producer"], tensors["consumers"], tensors["bytes"],
               tensors["h2d_s"], tensors["d2h_s"])
    for name, producer, consumers, nbytes, h2d, d2h in rows:
        if producer < 0:
            continue
        for c in set(int(c) for c in consumers):
            e = edges.setdefault((int(producer), c),
                                 {"tensors": (), "bytes": 0.0, "h2d_s": 0.0, "d2h_s": 0.0})
            e["tensors"] += (name,)
            e["bytes"] += float(nbytes)
            e["h2d_s"] += float(h2d)
            e["d2h_s"] += float(d2h)
    return ((u, v, attrs) for (u, v), attrs in edges.items())
