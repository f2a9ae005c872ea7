"""The cost graph: one networkx DiGraph that every partitioner and report reads.

``build_cost_graph(net_costs, ...)`` turns the cost tables written by ``placer.costs``
(``NetCosts.ops`` and ``NetCosts.tensors``, see that module) into the graph below.

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

from typing import Iterable

import networkx as nx
import numpy as np
import pandas as pd

from placer.errors import InfeasiblePlanError

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
    ops, tensors = net_costs.ops, net_costs.tensors
    _require(ops, OP_COLUMNS, "NetCosts.ops")
    _require(tensors, TENSOR_COLUMNS, "NetCosts.tensors")
    n = len(ops)
    if not np.array_equal(ops["index"].to_numpy(), np.arange(n)):
        raise ValueError("NetCosts.ops must have one row per op in net order (index 0..n-1)")
    g = nx.DiGraph()
    g.add_nodes_from(_node_records(ops, pins or {}))
    g.add_edges_from(_edge_records(tensors))
    groups = [tuple(sorted({int(i) for i in s})) for s in (colocate or [])]
    groups += [tuple(sorted((int(a), int(b)))) for a, b in (inplace or [])]
    producer = tensors["producer"].to_numpy()
    g.graph.update(
        tensors=tensors.reset_index(drop=True),
        external_inputs=list(tensors["name"][producer == -1]),
        params=list(tensors["name"][producer == -2]),
        external_outputs=list(tensors["name"][tensors["external_output"].to_numpy(bool)]),
        colocate=[grp for grp in groups if len(grp) > 1],
        outputs_on_host=bool(outputs_on_host),
    )
    return g


def _require(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}")


def _node_records(ops: pd.DataFrame, pins: dict[int, str]):
    cols = {c: ops[c].tolist() for c in OP_COLUMNS}
    for i in range(len(ops)):
        pin, why = None, ""
        if not cols["known"][i]:
            pin, why = "cpu", "pinned: unknown op type"
        elif not cols["gpu_kernel"][i]:
            pin, why = "cpu", "pinned: no GPU kernel"
        user = pins.get(i)
        if user is not None:
            if user not in ("cpu", "gpu"):
                raise ValueError(f"pin for op {i} must be 'cpu' or 'gpu', not {user!r}")
            if pin == "cpu" and user == "gpu":
                raise InfeasiblePlanError(
                    f"op #{i} {cols['type'][i]} '{cols['name'][i]}' is pinned to the GPU but "
                    f"{why.removeprefix('pinned: ')}", hint="remove its --pin or pin it to cpu")
            if pin is None:
                pin, why = user, f"pinned: --pin {user}"
        yield i, {"index": i, "name": cols["name"][i], "type": cols["type"][i],
                  "cpu_s": float(cols["cpu_s"][i]), "gpu_s": float(cols["gpu_s"][i]),
                  "param_bytes": float(cols["param_bytes"][i]),
                  "output_bytes": float(cols["output_bytes"][i]),
                  "gpu_kernel": bool(cols["gpu_kernel"][i]), "known": bool(cols["known"][i]),
                  "pin": pin, "pin_reason": why}


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
