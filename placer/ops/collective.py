"""Op family 'collective': blobs combined across devices, as Caffe2's NCCL and Gloo ops did,
plus placer's own all-to-all. Each is a registry op with a transfer rule
(``registry.Transfer``): the executor hands its ``move`` the devices its inputs are on and
the devices its outputs go to, and counts every byte ``transfers.copy`` moves per link.

    op                  inputs -> outputs                 result                              writes
    NCCLAllreduce       X_0..X_n-1 -> Y_0..Y_n-1          Y_i = sum_j X_j                     like X_i
    NCCLBroadcast       X_i -> X_i (in place), root=0     X_i = X_root                        like X_i
    NCCLReduce          X_0..X_n-1 -> Y, root=0           Y = sum_j X_j                       like X_0
    NCCLAllGather       X_i -> Y_i                        Y_i = stack(X_0..X_n-1): [n] + X    like X_i
    NCCLReduceScatter   X_i [n, ...] -> Y_i [...]         Y_i = sum_j X_j[i]                  like X_i
    CreateCommonWorld   [kv_handler] -> cw, size, rank    the process's place in a world      host
    CloneCommonWorld    cw -> cw'                         the same world                      host
    Allreduce           cw, X_1..X_k -> X_1..X_k          every buffer of every process summed like X_i
    Broadcast           cw, X_1..X_k -> X_1..X_k, root    root process's first buffer         like X_i
    Allgather           cw, X_1..X_k -> Y                 flattened buffers, rank order:      placed
                                                          [k * numel * size]
    AllToAll            X_i [n*m, ...] -> Y_i             Y_j = concat_i X_i[j*m:(j+1)*m]     like X_i

The NCCL semantics are Caffe2's (caffe2/contrib/nccl/cuda_nccl_op_gpu.cc and
cuda_nccl_gpu.cc: one input per GPU; Reduce writes on element ``root`` and Caffe2 keeps
root at 0; AllGather's output is [n] + the input's shape; ReduceScatter drops the first
dimension; none may run in place but AllReduce and Broadcast). The Gloo ones are
caffe2/contrib/gloo's (allreduce_ops, broadcast_ops, allgather_ops: the op's buffers of
this process and those of the other processes of the common world, summed or gathered
together; Broadcast sends the root process's first buffer). Their schemas are in torch
1.8.1's Caffe2 (``OpSchema.get`` answers for all of them); real Caffe2 runs Allreduce and
Broadcast here on a common world of size 1 (tests/test_collectives_ops.py compares).
Caffe2 had no all-to-all op: ``AllToAll`` is placer's, MPI_Alltoall's semantics (each
input split in n equal row blocks along axis 0, block j to rank j, received blocks stacked
in rank order), for the outputs of embedding tables sharded over devices.

A common world (``cw``) is a small host blob: int64 [size], 1 at this process's rank (its
shape gives the world's size to shape inference). placer runs a net in one process, so
a world of size 1 is the one it forms; a larger one is refused when it is created.

Kernels (placer/ops/collective_kernels.py): on real GPUs with ``cupy.cuda.nccl``
available, one NCCL call per rank grouped (ncclGroupStart/End) on each GPU's own stream,
the bytes NCCL's ring moves noted per link (``placer.hardware.collectives.ring_edge_bytes``);
otherwise (emulated GPUs, the host, no NCCL, two ranks on one device) the same ring
algorithms written with ``transfers.copy`` (peer-to-peer or staged copies), so the run
record counts the bytes a ring moves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from placer.errors import PlacerError, ShapeError
from placer.hardware.collectives import CollectiveModel, CollectiveTime
from placer.ops.collective_kernels import (_compute, _nccl_allgather, _nccl_allreduce, _nccl_alltoall,
                                           _nccl_broadcast, _nccl_reduce, _nccl_reducescatter, _plain, _send,
                                           chain_broadcast, chain_reduce, nccl_module, pairwise_alltoall,
                                           ring_allgather, ring_allreduce, ring_reducescatter)
from placer.ops.registry import ANYWHERE, HOST, LIKE_INPUT, PLACED, OpDef, Transfer, io_bytes, register
from placer.types import Args, OpFeatures, TensorType, shape_str


@dataclass(frozen=True)
class Collective:
    """How an op maps onto a collective of the cost model: its kind, where its data inputs
    start, and S (nccl-tests' size) from its data input types."""

    kind: str
    first: int
    nbytes: Callable[[Sequence[TensorType]], float]


def _one(types):
    return float(types[0].nbytes)


def _all(types):
    return float(sum(t.nbytes for t in types))


COLLECTIVE_OPS: dict[str, Collective] = {
    "NCCLAllreduce": Collective("allreduce", 0, _one), "NCCLBroadcast": Collective("broadcast", 0, _one),
    "NCCLReduce": Collective("reduce", 0, _one), "NCCLAllGather": Collective("allgather", 0, _all),
    "NCCLReduceScatter": Collective("reducescatter", 0, _one), "AllToAll": Collective("alltoall", 0, _one),
    "Allreduce": Collective("allreduce", 1, _one), "Broadcast": Collective("broadcast", 1, _one),
    "Allgather": Collective("allgather", 1, _all),
}


def collective_of(op_type: str, input_types: Sequence[TensorType]) -> tuple[str, float]:
    """(kind, S) of a collective op whose inputs are ``input_types``."""
    c = COLLECTIVE_OPS.get(op_type)
    if c is None:
        raise PlacerError(f"op type {op_type} is not a collective",
                          hint=f"collectives: {', '.join(sorted(COLLECTIVE_OPS))}")
    return c.kind, c.nbytes(list(input_types)[c.first:])


# ------------------------------------------------------------------ shapes and costs

def _fail(args: Args, inputs, what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: inputs ({shape_str(inputs)}): {what}")


def _alike(args: Args, data: Sequence[TensorType], inputs) -> TensorType:
    """The common type of the data inputs (one per rank), or a ShapeError."""
    if not data:
        raise _fail(args, inputs, "no data input")
    if any(t != data[0] for t in data[1:]):
        raise _fail(args, inputs, "every rank's input must have the same shape and dtype")
    return data[0]


def _outputs_per_input(args: Args, n: int, inputs) -> None:
    if args.n_outputs is not None and args.n_outputs != n:
        raise _fail(args, inputs, f"{n} inputs need {n} outputs (one per rank), found {args.n_outputs}")


def _root(args: Args, n: int, inputs, fixed: bool = False) -> int:
    root = args.int("root", 0)
    if fixed and root != 0:
        raise _fail(args, inputs, f"root={root}: Caffe2 keeps the root of NCCLReduce at 0")
    if not 0 <= root < n:
        raise _fail(args, inputs, f"root={root} is not a rank of {n}")
    return root


def infer_nccl_allreduce(inputs, args):
    t = _alike(args, inputs, inputs)
    _outputs_per_input(args, len(inputs), inputs)
    return [t] * len(inputs)


def infer_nccl_broadcast(inputs, args):
    _root(args, len(inputs), inputs)
    return infer_nccl_allreduce(inputs, args)


def infer_nccl_reduce(inputs, args):
    t = _alike(args, inputs, inputs)
    _root(args, len(inputs), inputs, fixed=True)
    return [t]


def infer_nccl_allgather(inputs, args):
    t = _alike(args, inputs, inputs)
    _outputs_per_input(args, len(inputs), inputs)
    return [TensorType((len(inputs),) + t.shape, t.dtype)] * len(inputs)


def infer_nccl_reducescatter(inputs, args):
    t = _alike(args, inputs, inputs)
    _outputs_per_input(args, len(inputs), inputs)
    if not t.shape or t.shape[0] != len(inputs):
        raise _fail(args, inputs, f"each input's first dimension must be the rank count {len(inputs)}")
    return [TensorType(t.shape[1:], t.dtype)] * len(inputs)


def infer_alltoall(inputs, args):
    t = _alike(args, inputs, inputs)
    _outputs_per_input(args, len(inputs), inputs)
    if not t.shape or t.shape[0] % len(inputs):
        raise _fail(args, inputs, f"the first dimension must split into {len(inputs)} equal blocks")
    return [t] * len(inputs)


def _world_size(args: Args, inputs) -> int:
    cw = inputs[0]
    if cw.dtype != "int64" or cw.ndim != 1:
        raise _fail(args, inputs, "input 0 must be a common world (CreateCommonWorld's output)")
    return cw.shape[0]


def infer_create_common_world(inputs, args):
    size, rank = args.int("size", 0), args.int("rank", 0)
    if size < 1 or not 0 <= rank < size:
        raise ShapeError(f"op {args.op}: CreateCommonWorld needs 0 <= rank < size, found size={size}, rank={rank}")
    return [TensorType((size,), "int64")]


def infer_clone_common_world(inputs, args):
    _world_size(args, inputs)
    return [inputs[0]]


def infer_gloo_inplace(inputs, args):
    _world_size(args, inputs)
    data = list(inputs[1:])
    t = _alike(args, data, inputs)
    _outputs_per_input(args, len(data), inputs)
    return [t] * len(data)


def infer_gloo_allgather(inputs, args):
    size = _world_size(args, inputs)
    t = _alike(args, list(inputs[1:]), inputs)
    return [TensorType(((len(inputs) - 1) * t.size * size,), t.dtype)]


def reduction_cost(first: int):
    """One add per element per extra rank; every buffer read and written once."""
    def cost(inputs, outputs, args) -> OpFeatures:
        data = list(inputs)[first:]
        read, written = io_bytes(data, outputs)
        flops = float(max(len(data) - 1, 0) * (data[0].size if data else 0))
        return OpFeatures(flops=flops, bytes_read=read, bytes_written=written)
    return cost


def data_cost(first: int):
    def cost(inputs, outputs, args) -> OpFeatures:
        read, written = io_bytes(list(inputs)[first:], outputs)
        return OpFeatures(bytes_read=read, bytes_written=written)
    return cost


# ------------------------------------------------------------------ the moves

def _world(inputs: list, args: Args) -> None:
    """A Gloo op over a common world: only this process's world of size 1 runs here."""
    size = int(np.asarray(_plain(inputs[0])).shape[0])
    if size != 1:
        raise PlacerError(f"op {args.op}: a common world of {size} processes; placer runs the net in one",
                          hint="give CreateCommonWorld size=1 to run it here")


def move_allreduce(first: int):
    def move(t, inputs, args):
        data, devices = list(inputs[first:]), list(t.sources[first:])
        if first:
            _world(inputs, args)
        nccl = None if first else nccl_module(devices, data)
        if nccl is not None:
            return tuple(_nccl_allreduce(t, nccl, devices, data))
        return tuple(ring_allreduce(t, data, devices))
    return move


def move_broadcast(first: int):
    def move(t, inputs, args):
        data, devices = list(inputs[first:]), list(t.sources[first:])
        if first:
            _world(inputs, args)
            root = 0        # the root process's first buffer: with one process, buffer 0
        else:
            root = args.int("root", 0)
        nccl = None if first else nccl_module(devices, data)
        if nccl is not None:
            return tuple(_nccl_broadcast(t, nccl, devices, data, root))
        return tuple(chain_broadcast(t, data, devices, root))
    return move


def move_nccl_reduce(t, inputs, args):
    data, devices = list(inputs), list(t.sources)
    nccl = nccl_module(devices, data)
    if nccl is not None:
        return (_nccl_reduce(t, nccl, devices, data, 0),)
    return (chain_reduce(t, data, devices, 0),)


def move_nccl_allgather(t, inputs, args):
    data, devices = list(inputs), list(t.sources)
    nccl = nccl_module(devices, data)
    if nccl is not None:
        return tuple(_nccl_allgather(t, nccl, devices, data))
    gathered = ring_allgather(t, data, devices)
    return tuple(_compute(d, lambda xp, *ps: xp.stack(ps), *parts) for d, parts in zip(devices, gathered))


def move_nccl_reducescatter(t, inputs, args):
    data, devices = list(inputs), list(t.sources)
    nccl = nccl_module(devices, data)
    if nccl is not None:
        return tuple(_nccl_reducescatter(t, nccl, devices, data))
    return tuple(ring_reducescatter(t, data, devices))


def move_alltoall(t, inputs, args):
    data, devices = list(inputs), list(t.sources)
    nccl = nccl_module(devices, data)
    if nccl is not None:
        return tuple(_nccl_alltoall(t, nccl, devices, data))
    return tuple(pairwise_alltoall(t, data, devices))


def move_gloo_allgather(t, inputs, args):
    """This process's buffers, flattened and concatenated, on the op's device."""
    _world(inputs, args)
    data, devices, target = list(inputs[1:]), list(t.sources[1:]), t.targets[0]
    parts = [_send(t, _compute(d, lambda xp, a: a.reshape(-1), x), d, target) for d, x in zip(devices, data)]
    return (_compute(target, lambda xp, *ps: xp.concatenate(ps), *parts),)


def move_create_common_world(t, inputs, args):
    size, rank = args.int("size", 0), args.int("rank", 0)
    if size != 1:
        raise PlacerError(f"op {args.op}: CreateCommonWorld of size {size}: placer runs the net in one "
                          "process, so only a world of size 1 forms here",
                          hint="run it with size=1, or plan it without running")
    world = np.zeros(size, np.int64)
    world[rank] = 1
    return (t.host.adopt(world),)


def move_clone_common_world(t, inputs, args):
    return (_send(t, inputs[0], t.sources[0], t.host),)


# ------------------------------------------------------------------ one-device kernels

# Each op's result when every rank's blob is on one device (the registry's ``kernel``,
# for timing an op on one device): what the moves above give, without moving anything.

def _total(data: list) -> Any:
    total = data[0].copy()
    for x in data[1:]:
        total = total + x
    return total


def kernel_allreduce(first: int):
    def kernel(xp, inputs, args):
        total = _total(list(inputs[first:]))
        return tuple(total.copy() for _ in inputs[first:])
    return kernel


def kernel_broadcast(first: int):
    def kernel(xp, inputs, args):
        root = inputs[first + (0 if first else args.int("root", 0))]
        return tuple(root.copy() for _ in inputs[first:])
    return kernel


def kernel_nccl_reduce(xp, inputs, args):
    return (_total(list(inputs)),)


def kernel_nccl_allgather(xp, inputs, args):
    return tuple(xp.stack(list(inputs)) for _ in inputs)


def kernel_nccl_reducescatter(xp, inputs, args):
    total = _total(list(inputs))
    return tuple(total[i].copy() for i in range(len(inputs)))


def kernel_alltoall(xp, inputs, args):
    n, rows = len(inputs), inputs[0].shape[0] // len(inputs)
    return tuple(xp.concatenate([x[j * rows:(j + 1) * rows] for x in inputs]) for j in range(n))


def kernel_gloo_allgather(xp, inputs, args):
    return (xp.concatenate([x.reshape(-1) for x in inputs[1:]]),)


def kernel_create_common_world(xp, inputs, args):
    world = np.zeros(args.int("size", 0), np.int64)
    world[args.int("rank", 0)] = 1
    return (xp.asarray(world),)


def kernel_clone_common_world(xp, inputs, args):
    return (inputs[0].copy(),)


# ------------------------------------------------------------------ registration

def _register(op_type, infer, kernel, move, writes, cost, min_inputs, max_inputs=None, first=0, doc=""):
    register(OpDef(op_type, infer, kernel, cost,
                   transfer=Transfer(ANYWHERE, writes, move, like_input_from=first),
                   min_inputs=min_inputs, max_inputs=max_inputs, doc=doc))


MAX_GPUS = 16   # CAFFE2_COMPILE_TIME_MAX_GPUS: the NCCL ops' input count limit in the schemas
_register("NCCLAllreduce", infer_nccl_allreduce, kernel_allreduce(0), move_allreduce(0),
          LIKE_INPUT, reduction_cost(0), 1, MAX_GPUS, doc="Sum of one blob per GPU, on every GPU (Caffe2's NCCL op)")
_register("NCCLBroadcast", infer_nccl_broadcast, kernel_broadcast(0), move_broadcast(0),
          LIKE_INPUT, data_cost(0), 1, MAX_GPUS, doc="Rank root's blob onto every GPU, in place")
_register("NCCLReduce", infer_nccl_reduce, kernel_nccl_reduce, move_nccl_reduce,
          LIKE_INPUT, reduction_cost(0), 1, MAX_GPUS, doc="Sum of one blob per GPU, on the first (root 0)")
_register("NCCLAllGather", infer_nccl_allgather, kernel_nccl_allgather, move_nccl_allgather,
          LIKE_INPUT, data_cost(0), 1, MAX_GPUS, doc="Every GPU's blob stacked ([n] + shape) on every GPU")
_register("NCCLReduceScatter", infer_nccl_reducescatter, kernel_nccl_reducescatter, move_nccl_reducescatter,
          LIKE_INPUT, reduction_cost(0), 1, MAX_GPUS, doc="Row i of the sum of every GPU's [n, ...] blob, on GPU i")
_register("AllToAll", infer_alltoall, kernel_alltoall, move_alltoall, LIKE_INPUT, data_cost(0), 1,
          doc="placer's all-to-all: block j of every rank's blob to rank j, stacked in rank order")
_register("CreateCommonWorld", infer_create_common_world, kernel_create_common_world, move_create_common_world,
          HOST, data_cost(0), 0, 1, doc="A common world for Gloo collectives (kv_handler optional); size 1 runs here")
_register("CloneCommonWorld", infer_clone_common_world, kernel_clone_common_world, move_clone_common_world,
          HOST, data_cost(0), 1, 1, doc="A copy of a common world")
_register("Allreduce", infer_gloo_inplace, kernel_allreduce(1), move_allreduce(1), LIKE_INPUT, reduction_cost(1),
          2, first=1, doc="Gloo: every buffer of every process of the common world summed, in place")
_register("Broadcast", infer_gloo_inplace, kernel_broadcast(1), move_broadcast(1), LIKE_INPUT, data_cost(1),
          2, first=1, doc="Gloo: the root process's first buffer onto every buffer, in place")
_register("Allgather", infer_gloo_allgather, kernel_gloo_allgather, move_gloo_allgather, PLACED, data_cost(1),
          2, doc="Gloo: every process's buffers flattened, concatenated in rank order")


def op_time(model: CollectiveModel, op_type: str, input_types: Sequence, ranks: Sequence[int]) -> CollectiveTime:
    """The cost of one registered collective op (``COLLECTIVE_OPS``) over ``ranks``, its
    data inputs typed ``input_types`` (the op's own inputs)."""
    kind, nbytes = collective_of(op_type, input_types)
    return model.time(kind, nbytes, ranks)
