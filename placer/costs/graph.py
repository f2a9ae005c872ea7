"""The cost graph: one networkx DiGraph that users can export, and its array form the partitioners solve.

``build_cost_graph(net_costs, allowed, ...)`` turns the cost tables written by
``placer.costs.model`` (``NetCosts``) and the planner's restrictions into the graph below, and
``write_graph`` exports it as GraphML (``placer plan --graph-out``). Partitioners work on
``placer.partition.problem.CostArrays``, the graph's flat form: ``from_graph`` makes it
from a networkx graph, and ``cost_arrays`` (same arguments as ``build_cost_graph``) makes
the very same arrays straight from the tables, every array from a whole column at once.
The planner uses ``cost_arrays``, because a networkx graph of a million-op net takes
about 4 GB and 20 s to build and convert, several times the rest of the plan; its
``PlanResult.graph`` builds the networkx graph only when asked (``--graph-out``).
``tests/test_graph_arrays.py`` holds the two to each other: the arrays the partitioner
is handed equal, field by field, ``from_graph`` of the graph the user sees, so the graph
carries exactly the attributes the partitioners use.

Graph conventions (every attribute, its unit, who writes it)
------------------------------------------------------------
Nodes are op indices ``0 .. n-1`` in net order (a topological order).

Node attributes (written here from ``NetCosts.ops`` and the planner's restrictions):
  ``name``, ``type`` (str)   op name (may be "") and Caffe2 op type
  ``time_s`` (tuple, s)      predicted time of one run of the op on each device, in
                             ``G.graph["devices"]`` order (costs: ``placer.costs.model``)
  ``allowed`` (tuple of int) device indices the op may run on: the devices whose kind
                             has a kernel for it (an unknown op type: the host only),
                             narrowed by the user's pins
  ``pin_reason`` (str)       why ``allowed`` is narrower than every device ("" if not)
  ``param_bytes``, ``output_bytes`` (bytes) parameters the op reads (memory only, no
                             per-run copy); bytes of every blob it writes, read or not
  ``known`` (bool)           the op type and its shapes are known

Edges ``u -> v``, one per producer/consumer pair of ops:
  ``tensors`` (tuple of str) blobs made by u and read by v; ``bytes`` (bytes) their sum.
  A blob's copy is paid once per destination device however many readers it has there,
  so partitioners price copies from the tensor table below, never by adding edges up.

Graph attributes (``G.graph``):
  ``devices``, ``device_kinds`` (tuples of str), ``host`` (int): the machine's devices,
      index 0 the host CPU that feeds inputs and reads outputs;
  ``tensors``: ``placer.costs.model.TensorTable``, the authoritative blob table (producer: op
      index, -1 fed from the host, -2 a parameter made by the init net; readers; bytes;
      external_output);
  ``link_class`` (int [k, k]) and ``class_s`` (s, [classes, tensors]): the copy time of
      tensor t from device a to b is ``class_s[link_class[a, b], t]``; ``lanes`` and
      ``routes`` (hops of each link as (lane, class)) for the makespan simulator;
  ``capacity`` (bytes, [k]): usable memory per device (inf: no limit);
  ``colocate``: sorted tuples of op indices that must share a device (an in-place op and
      the producer of its blob; a parameter's update ops and its readers);
  ``outputs_on_host`` (bool): external outputs come back to the host (pay their copy).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np

from placer.fileio import atomic_write_bytes
from placer.costs.arrays import CostArrays

if TYPE_CHECKING:
    import networkx as nx


def build_cost_graph(net_costs, allowed: np.ndarray, pin_reason: list[str] | None = None,
                     colocate: Iterable[Iterable[int]] | None = None, outputs_on_host: bool = True,
                     inplace: Iterable[tuple[int, int]] | None = None,
                     capacity: np.ndarray | None = None) -> nx.DiGraph:
    """The cost graph of a net (see the module docstring for every attribute).

    ``allowed`` (bool [n, k]) are the devices each op may run on; ``colocate`` lists sets
    of op indices that must share a device; ``inplace`` lists (op, producer of the blob it
    overwrites) pairs, which are colocated too; ``capacity`` the usable bytes per device.
    """
    import networkx as nx  # here: the planner itself never needs it, and it takes 0.2 s to import
    machine, ops, tensors = net_costs.machine, net_costs.ops, net_costs.tensors
    n, k = _check_allowed(net_costs, allowed)
    reasons = pin_reason or [""] * n
    g = nx.DiGraph()
    times = [tuple(row) for row in net_costs.op_s.tolist()]
    where = [tuple(np.flatnonzero(row).tolist()) for row in allowed]
    names, types = ops["name"].tolist(), ops["type"].tolist()
    pbytes, obytes, known = ops["param_bytes"].tolist(), ops["output_bytes"].tolist(), ops["known"].tolist()
    g.add_nodes_from((i, {"name": names[i], "type": types[i], "time_s": times[i], "allowed": where[i],
                          "pin_reason": reasons[i], "param_bytes": pbytes[i], "output_bytes": obytes[i],
                          "known": bool(known[i])}) for i in range(n))
    g.add_edges_from(_edges(tensors))
    tables = machine.link_classes()
    g.graph.update(
        devices=machine.names, device_kinds=tuple(d.kind for d in machine.devices), host=0,
        machine=machine.name, tensors=tensors, link_class=tables.link_class,
        class_s=tables.class_seconds(tensors.nbytes), lanes=tables.lanes, routes=tables.routes,
        capacity=np.full(k, np.inf) if capacity is None else np.asarray(capacity, float),
        colocate=_colocation_groups(colocate, inplace), outputs_on_host=bool(outputs_on_host))
    return g


def cost_arrays(net_costs, allowed: np.ndarray, pin_reason: list[str] | None = None,
                colocate: Iterable[Iterable[int]] | None = None, outputs_on_host: bool = True,
                inplace: Iterable[tuple[int, int]] | None = None,
                capacity: np.ndarray | None = None) -> CostArrays:
    """``from_graph(build_cost_graph(...))`` with the same arguments, without the graph:
    each array made from a whole table column (module docstring)."""
    machine, ops, t = net_costs.machine, net_costs.ops, net_costs.tensors
    n, k = _check_allowed(net_costs, allowed)
    tables = machine.link_classes()
    ptr, cons = _readers_less_producer(t)
    pairs = [(grp[0], other) for grp in _colocation_groups(colocate, inplace) for other in grp[1:]]
    return CostArrays(
        op_s=np.array(net_costs.op_s, np.float64).reshape(n, k), allowed=np.array(allowed, bool),
        param_bytes=ops["param_bytes"].to_numpy(np.float64), output_bytes=ops["output_bytes"].to_numpy(np.float64),
        t_producer=t.producer.astype(np.int64), t_ptr=ptr, t_cons=cons, t_bytes=t.nbytes.astype(np.float64),
        t_ext_out=t.external_output.astype(bool), link_class=tables.link_class,
        class_s=tables.class_seconds(t.nbytes), devices=tuple(machine.names),
        device_kinds=tuple(d.kind for d in machine.devices),
        capacity=np.full(k, np.inf) if capacity is None else np.asarray(capacity, float), host=0,
        lanes=tuple(tables.lanes), routes=dict(tables.routes), colocate=np.array(pairs, np.int64).reshape(-1, 2),
        outputs_on_host=bool(outputs_on_host), names=ops["name"].tolist(), types=ops["type"].tolist(),
        t_names=list(t.names), pin_reason=list(pin_reason) if pin_reason else [""] * n)


def _check_allowed(net_costs, allowed: np.ndarray) -> tuple[int, int]:
    n, k = net_costs.op_s.shape
    if allowed.shape != (n, k):
        raise ValueError(f"allowed has shape {allowed.shape}, expected {(n, k)}")
    return n, k


def _colocation_groups(colocate, inplace) -> list[tuple[int, ...]]:
    """Sorted tuples of op indices that must share a device (groups of one dropped)."""
    groups = [tuple(sorted({int(i) for i in s})) for s in (colocate or [])]
    groups += [tuple(sorted((int(a), int(b)))) for a, b in (inplace or [])]
    return [grp for grp in groups if len(grp) > 1]


def _readers_less_producer(t) -> tuple[np.ndarray, np.ndarray]:
    """The tensor table's readers in CSR form less each tensor's producer: an op reading
    the blob it writes (in place) needs no copy of it (as ``from_graph`` drops it)."""
    owner = np.repeat(np.arange(len(t.producer)), np.diff(t.ptr))
    keep = t.consumers != t.producer[owner]
    ptr = np.zeros(len(t.producer) + 1, np.int64)
    ptr[1:] = np.cumsum(np.bincount(owner[keep], minlength=len(t.producer)))
    return ptr, t.consumers[keep].astype(np.int64)


def _edges(tensors):
    """(u, v, {"tensors", "bytes"}) per pair of ops joined by blobs made by u and read by v."""
    made = np.flatnonzero(tensors.producer >= 0)
    counts = np.diff(tensors.ptr)[made]
    u = np.repeat(tensors.producer[made], counts)
    t = np.repeat(made, counts)
    v = np.concatenate([tensors.readers(x) for x in made.tolist()]) if len(made) else np.zeros(0, np.int64)
    keep = u != v
    u, v, t = u[keep], v[keep], t[keep]
    order = np.lexsort((t, v, u))
    u, v, t = u[order], v[order], t[order]
    first = np.ones(len(u), bool)
    first[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(u))
    names, nbytes = tensors.names, tensors.nbytes
    for a, b in zip(starts.tolist(), ends.tolist()):
        ts = t[a:b].tolist()
        yield int(u[a]), int(v[a]), {"tensors": tuple(names[x] for x in ts), "bytes": float(nbytes[ts].sum())}


def write_graph(graph: nx.DiGraph, path) -> None:
    """The cost graph as GraphML (atomic write): per-device times as ``time_s:<device>``
    node attributes, allowed devices and edge blobs as comma-separated names."""
    import networkx as nx
    devices = graph.graph["devices"]
    out = nx.DiGraph()
    for i, d in graph.nodes(data=True):
        attrs = {key: value for key, value in d.items() if key not in ("time_s", "allowed")}
        attrs.update({f"time_s:{dev}": float(t) for dev, t in zip(devices, d["time_s"])})
        attrs["allowed"] = ",".join(devices[x] for x in d["allowed"])
        out.add_node(i, **attrs)
    for u, v, d in graph.edges(data=True):
        out.add_edge(u, v, tensors=",".join(d["tensors"]), bytes=float(d["bytes"]))
    out.graph.update(devices=",".join(devices), machine=str(graph.graph.get("machine", "")),
                     outputs_on_host=bool(graph.graph["outputs_on_host"]))
    atomic_write_bytes(path, "\n".join(nx.generate_graphml(out)).encode("utf-8"))


__all__ = ["build_cost_graph", "cost_arrays", "write_graph"]
