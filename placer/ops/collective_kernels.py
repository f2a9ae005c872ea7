"""The arithmetic and data movement of the collectives (placer/ops/collective.py registers
the ops): the ring algorithms written with ``transfers.copy``, and NCCL through cupy.

Ring (all-reduce = reduce-scatter then all-gather; all-gather; reduce-scatter), chain
(broadcast from the root, reduce towards it) and pairwise exchange (all-to-all) move each
chunk between neighbouring ranks with ``transfers.copy`` (a peer or staged copy between
GPUs, counted per link by the executor); the additions run on the receiving rank's device
(``_compute``, in that GPU's context). Between two ranks on one device a copy is local.

NCCL: on real GPUs, one rank each, with ``cupy.cuda.nccl`` available (``nccl_module``),
every rank's call goes inside one ncclGroupStart/End on its GPU's own stream, the
communicators made once per set of GPUs (ncclCommInitAll is slow, and Caffe2 kept them
too), and the bytes NCCL's algorithm moves are noted per link (``ring_edges``).
"""
from __future__ import annotations

import contextlib
import importlib
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from placer.hardware.collectives import ring_edge_bytes

# ------------------------------------------------------------------ moving and adding

def _plain(x: Any) -> Any:
    """A tagged numpy array (an emulated GPU's) as a plain one (zero-copy)."""
    return x.view(np.ndarray) if isinstance(x, np.ndarray) and type(x) is not np.ndarray else x


@contextlib.contextmanager
def _current(device: Any):
    """``device`` current for the arrays made inside (a real GPU's context; no-op else)."""
    cupy = getattr(device, "cupy", None)
    if cupy is None:
        yield
        return
    with cupy.cuda.Device(device.index):
        yield


def _compute(device: Any, fn: Callable, *arrays) -> Any:
    """``fn(xp, *arrays)`` on ``device``, its result an array of that device."""
    with _current(device):
        return device.adopt(fn(device.xp, *[_plain(a) for a in arrays]))


def _send(t: Any, array: Any, source: Any, target: Any) -> Any:
    """``array`` onto ``target``: a counted copy between devices, a local copy on one."""
    if source is target:
        return _compute(target, lambda xp, a: xp.array(a, copy=True), array)
    return t.copy(array, source, target)


def _bounds(size: int, n: int) -> list[int]:
    return [size * c // n for c in range(n + 1)]


def _ring_reduce_scatter(t: Any, chunks: list[list], devices: Sequence) -> list[list]:
    """The ring's reduce-scatter: after n-1 steps rank c holds the sum of every rank's chunk
    c. Step s: rank r sends its partial chunk (r - s - 1) mod n to rank r + 1, which adds
    its own."""
    n = len(devices)
    for s in range(n - 1):
        sent = [(r, (r - s - 1) % n) for r in range(n)]
        moved = [_send(t, chunks[r][c], devices[r], devices[(r + 1) % n]) for r, c in sent]
        for (r, c), part in zip(sent, moved):
            dst = (r + 1) % n
            chunks[dst][c] = _compute(devices[dst], lambda xp, a, b: a + b, chunks[dst][c], part)
    return chunks


def _ring_all_gather(t: Any, chunks: list[list], devices: Sequence) -> list[list]:
    """The ring's all-gather: rank c starts with the final chunk c; step s: rank r sends
    chunk (r - s) mod n to rank r + 1."""
    n = len(devices)
    for s in range(n - 1):
        sent = [(r, (r - s) % n) for r in range(n)]
        moved = [_send(t, chunks[r][c], devices[r], devices[(r + 1) % n]) for r, c in sent]
        for (r, c), part in zip(sent, moved):
            chunks[(r + 1) % n][c] = part
    return chunks


def _split_flat(device: Any, x: Any, n: int) -> list:
    flat = _compute(device, lambda xp, a: a.reshape(-1), x)
    b = _bounds(int(flat.size), n)
    return [flat[b[c]:b[c + 1]] for c in range(n)]


def _join_flat(device: Any, parts: list, shape: tuple) -> Any:
    return _compute(device, lambda xp, *ps: xp.concatenate([p.reshape(-1) for p in ps]).reshape(shape), *parts)


def ring_allreduce(t: Any, data: list, devices: Sequence) -> list:
    """Every rank's sum of all ``data`` (one array per rank, on ``devices``)."""
    n = len(devices)
    chunks = [_split_flat(d, x, n) for d, x in zip(devices, data)]
    chunks = _ring_all_gather(t, _ring_reduce_scatter(t, chunks, devices), devices)
    return [_join_flat(d, parts, tuple(data[0].shape)) for d, parts in zip(devices, chunks)]


def chain_broadcast(t: Any, data: list, devices: Sequence, root: int) -> list:
    """Rank ``root``'s array on every rank, passed along the ring from the root."""
    n = len(devices)
    out = [None] * n
    out[root] = _compute(devices[root], lambda xp, a: xp.array(a, copy=True), data[root])
    for k in range(1, n):
        src, dst = (root + k - 1) % n, (root + k) % n
        out[dst] = _send(t, out[src], devices[src], devices[dst])
    return out


def chain_reduce(t: Any, data: list, devices: Sequence, root: int) -> Any:
    """The sum of all ``data`` on rank ``root``: partial sums passed along the ring from the
    rank after the root, each rank adding its own."""
    n = len(devices)
    first = (root + 1) % n
    acc = _compute(devices[first], lambda xp, a: xp.array(a, copy=True), data[first])
    for k in range(2, n + 1):
        src, dst = (root + k - 1) % n, (root + k) % n
        part = _send(t, acc, devices[src], devices[dst])
        acc = _compute(devices[dst], lambda xp, a, b: a + b, part, data[dst])
    return acc


def ring_allgather(t: Any, data: list, devices: Sequence) -> list:
    """Every rank's list of every rank's array (rank order)."""
    n = len(devices)
    chunks = [[None] * n for _ in range(n)]
    for r in range(n):
        chunks[r][r] = data[r]
    return _ring_all_gather(t, chunks, devices)


def ring_reducescatter(t: Any, data: list, devices: Sequence) -> list:
    """Rank r's sum over ranks of block r (row r of each input)."""
    n = len(devices)
    chunks = [[x[c] for c in range(n)] for x in data]
    chunks = _ring_reduce_scatter(t, chunks, devices)
    return [_compute(devices[r], lambda xp, a: xp.array(a, copy=True), chunks[r][r]) for r in range(n)]


def pairwise_alltoall(t: Any, data: list, devices: Sequence) -> list:
    """Rank j's blocks j of every rank's input, stacked in rank order along axis 0."""
    n = len(devices)
    rows = data[0].shape[0] // n
    received = [[None] * n for _ in range(n)]
    for k in range(n):                      # round k: rank i sends to rank i + k
        for i in range(n):
            j = (i + k) % n
            block = data[i][j * rows:(j + 1) * rows]
            received[j][i] = _send(t, block, devices[i], devices[j])
    return [_compute(devices[j], lambda xp, *ps: xp.concatenate(ps, axis=0), *received[j]) for j in range(n)]


# ------------------------------------------------------------------ NCCL through cupy

_NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
                "float16": 6, "float32": 7, "float64": 8}     # ncclDataType_t (nccl.h)
_COMMS: dict[tuple[int, ...], list] = {}                      # communicators per GPU tuple


def nccl_module(devices: Sequence, data: Sequence) -> Any:
    """``cupy.cuda.nccl`` when NCCL can run this collective: real GPUs, one rank each, a
    dtype NCCL has, the library present; else None (the ring of copies runs instead)."""
    cupy = getattr(devices[0], "cupy", None) if devices else None
    if cupy is None or any(getattr(d, "cupy", None) is None for d in devices):
        return None
    if len({d.index for d in devices}) != len(devices) or str(data[0].dtype) not in _NCCL_DTYPES:
        return None
    with warnings.catch_warnings():             # cupy warns when libnccl is missing
        warnings.simplefilter("ignore")
        try:
            nccl = importlib.import_module("cupy.cuda.nccl")
        except ImportError:
            return None
    return nccl if getattr(nccl, "available", False) else None


def _communicators(nccl: Any, devices: Sequence) -> list:
    key = tuple(d.index for d in devices)
    if key not in _COMMS:      # ncclCommInitAll is slow: once per set of GPUs, as Caffe2 keeps them
        _COMMS[key] = nccl.NcclCommunicator.initAll(list(key))
    return _COMMS[key]


def nccl_call(t: Any, nccl: Any, kind: str, devices: Sequence, data: list, out_shapes: list,
              call: Callable) -> list:
    """Outputs allocated on each GPU, then ``call(comm, rank, x, y, count, dtype, stream)``
    per rank inside one NCCL group on each GPU's own stream; the ring's bytes noted."""
    n, dtype = len(devices), _NCCL_DTYPES[str(data[0].dtype)]
    xs, ys = [], []
    for d, x, shape in zip(devices, data, out_shapes):
        with _current(d):
            xs.append(d.cupy.ascontiguousarray(x))
            ys.append(d.cupy.empty(shape, dtype=x.dtype) if shape is not None else None)
    comms = _communicators(nccl, devices)
    nccl.groupStart()
    try:
        for rank, (d, comm, x, y) in enumerate(zip(devices, comms, xs, ys)):
            with _current(d):
                stream = d.stream if d.stream is not None else d.cupy.cuda.get_current_stream()
                call(comm, rank, x, y, dtype, stream.ptr)
    finally:
        nccl.groupEnd()
    per_edge = int(ring_edge_bytes(kind, COLLECTIVE_BYTES[kind](data), n))
    for a, b in ring_edges(kind, n):
        t.note(devices[a], devices[b], per_edge)
    return ys


def ring_edges(kind: str, n: int, root: int = 0) -> list[tuple[int, int]]:
    """The (sender, receiver) rank pairs NCCL's algorithm for ``kind`` uses: every ring
    edge; the chain from the root (broadcast) or towards it (reduce); every ordered pair
    (all-to-all)."""
    if kind == "alltoall":
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    if kind == "broadcast":
        return [((root + k - 1) % n, (root + k) % n) for k in range(1, n)]
    if kind == "reduce":
        return [((root + k - 1) % n, (root + k) % n) for k in range(2, n + 1)]
    return [(r, (r + 1) % n) for r in range(n)]


COLLECTIVE_BYTES = {"allreduce": lambda d: d[0].nbytes, "broadcast": lambda d: d[0].nbytes,
                    "reduce": lambda d: d[0].nbytes, "allgather": lambda d: sum(x.nbytes for x in d),
                    "reducescatter": lambda d: d[0].nbytes, "alltoall": lambda d: d[0].nbytes}
SUM = 0  # ncclRedOp_t ncclSum


def _nccl_allreduce(t, nccl, devices, data):
    return nccl_call(t, nccl, "allreduce", devices, data, [x.shape for x in data],
                     lambda c, r, x, y, dt, s: c.allReduce(x.data.ptr, y.data.ptr, x.size, dt, SUM, s))


def _nccl_broadcast(t, nccl, devices, data, root):
    return nccl_call(t, nccl, "broadcast", devices, data, [x.shape for x in data],
                     lambda c, r, x, y, dt, s: c.broadcast(x.data.ptr, y.data.ptr, x.size, dt, root, s))


def _nccl_reduce(t, nccl, devices, data, root):
    shapes = [data[0].shape if r == root else None for r in range(len(data))]
    ys = nccl_call(t, nccl, "reduce", devices, data, shapes,
                   lambda c, r, x, y, dt, s: c.reduce(x.data.ptr, y.data.ptr if y is not None else 0,
                                                      x.size, dt, SUM, root, s))
    return ys[root]


def _nccl_allgather(t, nccl, devices, data):
    shape = (len(data),) + tuple(data[0].shape)
    return nccl_call(t, nccl, "allgather", devices, data, [shape] * len(data),
                     lambda c, r, x, y, dt, s: c.allGather(x.data.ptr, y.data.ptr, x.size, dt, s))


def _nccl_reducescatter(t, nccl, devices, data):
    shape = tuple(data[0].shape[1:])
    return nccl_call(t, nccl, "reducescatter", devices, data, [shape] * len(data),
                     lambda c, r, x, y, dt, s: c.reduceScatter(x.data.ptr, y.data.ptr, y.size, dt, SUM, s))


def _nccl_alltoall(t, nccl, devices, data):
    """ncclSend/ncclRecv pairs in one group (NCCL >= 2.7), block j of rank i to rank j."""
    n = len(data)

    def exchange(comm, rank, x, y, dt, stream):
        block = x.size // n
        for peer in range(n):
            comm.send(x.data.ptr + peer * block * x.itemsize, block, dt, peer, stream)
            comm.recv(y.data.ptr + peer * block * y.itemsize, block, dt, peer, stream)
    return nccl_call(t, nccl, "alltoall", devices, data, [x.shape for x in data], exchange)
