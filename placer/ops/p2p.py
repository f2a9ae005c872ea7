"""Op family 'p2p': Caffe2's ops between processes, run by the process's **world**.

    op                  inputs -> outputs                    what it does
    SendTensor          comm_world, X -> (none)              X to rank ``dst`` with ``tag``
    ReceiveTensor       comm_world, Y -> Y, src, tag         Y from rank ``src`` with ``tag``
    CreateCommonWorld   [kv_handler] -> comm_world           this process's place in the world
    Allreduce           comm_world, X_1..X_k -> X_1..X_k     every buffer of every process, summed
    Broadcast           comm_world, X_1..X_k -> X_1..X_k     the root process's first buffer, everywhere

Schemas are Caffe2's (torch 1.8.1 ``OpSchema.get``; caffe2/mpi/mpi_ops.h for the MPI
engine the split nets name): SendTensor's ``dst`` / ``tag`` and ReceiveTensor's ``src`` /
``tag`` arguments, ``raw_buffer`` (the receive writes into Y's buffer, so Y must already
have the sent tensor's shape and type: the worker's init net fills it), ReceiveTensor's
three outputs (the sender's rank and the tag, CPU int scalars in Caffe2).

A **world** is the process's connection to the others (like MPI's COMM_WORLD, one per
process): ``install_world(world)`` sets it; ``placer.runtime.ray.driver`` installs a Ray-based
one in each worker. Without one, a SendTensor or ReceiveTensor says that the net is one
worker's part of a split net and how to run it. SendTensor and ReceiveTensor are
registered here; CreateCommonWorld, Allreduce and Broadcast are registered by the
collectives family for one process (a world of one), so ``install_world`` replaces them
in this process only (``registry.override``) with the versions below, which span the
world (over a common world of size 1 they combine this process's own buffers, as the
one-process versions do). The common world blob is the collectives family's: an int64 [size] array, 1 at
this process's rank.

Moves: a send copies X to host memory (``transfers.copy``: a GPU's D2H is counted) and
hands the host array to the world; a receive copies what arrived to its device (an H2D
for a GPU) and notes the bytes that crossed the network on a link from the sender's device.
Their one-device ``kernel`` (for timing an op where it is placed, like the copies' own)
moves nothing over a network: a send writes nothing, a receive gives back its buffer (a
message of the buffer's own contents from rank ``src``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Protocol, Sequence

import numpy as np

from placer.errors import PlacerError, ShapeError
from placer.ops.registry import ANYWHERE, LIKE_INPUT, PLACED, OpDef, Transfer, movement_cost, override, register
from placer.types import Args, TensorType


class World(Protocol):
    """What the ops need from the processes' connection (``runtime.cluster.RayWorld``)."""

    rank: int
    size: int
    device_names: dict     # this process's device name -> the cluster's name

    def send(self, array: np.ndarray, dst: int, tag: int, source: str) -> None: ...
    def recv(self, src: int, tag: int) -> tuple[np.ndarray, str]: ...          # (array, source device)
    def allreduce(self, local: np.ndarray) -> np.ndarray: ...                   # sum over ranks, rank order
    def broadcast(self, array: np.ndarray | None, root: int) -> np.ndarray: ...


_WORLD: list[Any] = [None]


def install_world(world: World | None) -> None:
    """Make ``world`` this process's world and give the world-spanning ops their
    cross-process kernels here (module docstring); None uninstalls the world only."""
    _WORLD[0] = world
    if world is not None:
        for opdef in WORLD_OPS:
            override(opdef)


@contextmanager
def world_for_sends(world: World):
    """``world`` as this process's world for SendTensor / ReceiveTensor only, restored on
    exit (the registry is left alone): for running one worker's ops outside a worker."""
    previous, _WORLD[0] = _WORLD[0], world
    try:
        yield world
    finally:
        _WORLD[0] = previous


def current_world(args: Args) -> World:
    world = _WORLD[0]
    if world is None:
        raise PlacerError(f"op {args.op} talks to other processes, and this run has none: the net is "
                          "one worker's part of a net split over hosts",
                          hint="run the whole plan with: placer run OUTDIR --ray (OUTDIR from placer plan "
                               "--cluster), or the one_process_net.pbtxt beside it with placer run")
    return world


# ------------------------------------------------------------------ shapes

def _world_size(inputs: Sequence[TensorType], args: Args) -> None:
    if not inputs or inputs[0].dtype != "int64" or len(inputs[0].shape) != 1:
        raise ShapeError(f"op {args.op}: input 0 must be a common world (CreateCommonWorld's output)")


def infer_send(inputs, args):
    _world_size(inputs, args)
    for name in ("dst", "tag"):
        if len(inputs) < 4:
            args.int(name)  # a missing argument names the op
    return []


def infer_receive(inputs, args):
    _world_size(inputs, args)
    if len(inputs) < 4:
        args.int("src")
        args.int("tag")
    return [inputs[1], TensorType((), "int32"), TensorType((), "int32")]


def infer_create_world(inputs, args):
    size, rank = args.int("size", 1), args.int("rank", 0)
    if not 0 <= rank < size:
        raise ShapeError(f"op {args.op}: CreateCommonWorld needs 0 <= rank < size, found size={size}, rank={rank}")
    return [TensorType((size,), "int64")]


def infer_inplace(inputs, args):
    _world_size(inputs, args)
    if len(inputs) < 2:
        raise ShapeError(f"op {args.op}: needs a common world and at least one buffer")
    return list(inputs[1:])


# ------------------------------------------------------------------ moves

def _plain(x: Any) -> np.ndarray:
    return np.asarray(x).view(np.ndarray)


def _to_host(t, x, source) -> np.ndarray:
    return _plain(x if source is t.host else t.copy(x, source, t.host))


def move_send(t, inputs, args: Args) -> tuple:
    world = current_world(args)
    source = t.sources[1]
    world.send(_to_host(t, inputs[1], source), args.int("dst"), args.int("tag"),
               world.device_names.get(source.name, source.name))
    return ()


def move_receive(t, inputs, args: Args) -> tuple:
    world = current_world(args)
    src, tag = args.int("src"), args.int("tag")
    array, source = world.recv(src, tag)
    want = inputs[1]
    if tuple(array.shape) != tuple(want.shape) or array.dtype != want.dtype:
        raise PlacerError(f"op {args.op}: tag {tag} from rank {src} brought {array.dtype}{list(array.shape)}, "
                          f"but its buffer is {want.dtype}{list(want.shape)} (raw_buffer receives need the "
                          "shapes the plan was made for)", hint="feed inputs of the planned shapes")
    target = t.targets[0]
    y = np.array(array, copy=True) if target is t.host else t.copy(array, t.host, target)
    t.moved.append((source, target.name, int(array.nbytes)))
    scalar = [target.to_device(np.array(v, np.int32)) for v in (src, tag)]
    return (y, *scalar)


def kernel_send(xp, inputs, args: Args) -> tuple:
    return ()


def kernel_receive(xp, inputs, args: Args) -> tuple:
    return (inputs[1].copy(), xp.full((), args.int("src"), dtype=np.int32), xp.full((), args.int("tag"), dtype=np.int32))


def kernel_create_world(xp, inputs, args: Args) -> tuple:
    size, rank = args.int("size", 1), args.int("rank", 0)
    world = current_world(args) if size > 1 else None    # a world of one: this process alone
    if world is not None and (size, rank) != (world.size, world.rank):
        raise PlacerError(f"op {args.op}: the net was written for rank {rank} of {size} workers; this process "
                          f"is rank {world.rank} of {world.size}")
    cw = np.zeros(size, np.int64)
    cw[rank] = 1
    return (cw,)


def _local_sum(t, inputs) -> np.ndarray:
    total = None
    for x, source in zip(inputs[1:], t.sources[1:]):
        h = _to_host(t, x, source)
        total = h.copy() if total is None else total + h
    return total


def _everywhere(t, value: np.ndarray) -> tuple:
    return tuple(np.array(value, copy=True) if target is t.host else t.copy(value, t.host, target)
                 for target in t.targets)


def _alone(inputs) -> bool:
    """A common world of one process (size 1): the op combines this process's buffers only."""
    return int(np.asarray(inputs[0]).size) == 1


def move_allreduce(t, inputs, args: Args) -> tuple:
    _check_targets(t, args)
    total = _local_sum(t, inputs)
    return _everywhere(t, total if _alone(inputs) else current_world(args).allreduce(total))


def move_broadcast(t, inputs, args: Args) -> tuple:
    _check_targets(t, args)
    first = _to_host(t, inputs[1], t.sources[1])
    if _alone(inputs):
        return _everywhere(t, first)
    world = current_world(args)
    root = args.int("root", 0)
    return _everywhere(t, world.broadcast(first if world.rank == root else None, root))


def _check_targets(t, args: Args) -> None:
    """Without the collectives' ``like_input_from`` rule every buffer is written on the op's
    device (PLACED): buffers elsewhere are refused rather than moved."""
    for source, target in zip(t.sources[1:], t.targets):
        if source is not target:
            raise PlacerError(f"op {args.op}: a buffer on {source.name}, the op on {target.name}: this placer "
                              "runs a cross-process collective over buffers of the op's own device only",
                              hint="place the op on the device of its buffers")


def _inplace_transfer(move) -> Transfer:
    """Output j where input j + 1 is (the collectives' rule)."""
    return Transfer(ANYWHERE, LIKE_INPUT, move, like_input_from=1)


register(OpDef("SendTensor", infer_send, kernel_send, movement_cost, transfer=Transfer(ANYWHERE, PLACED, move_send),
               min_inputs=2, max_inputs=4, launches=0, doc="Send X to another process (Caffe2's MPI SendTensor)."))
register(OpDef("ReceiveTensor", infer_receive, kernel_receive, movement_cost,
               transfer=Transfer(ANYWHERE, PLACED, move_receive), min_inputs=2, max_inputs=4, launches=3,
               doc="Receive into Y from another process (Caffe2's MPI ReceiveTensor, raw buffer)."))

WORLD_OPS = (
    OpDef("CreateCommonWorld", infer_create_world, kernel_create_world, movement_cost, devices=frozenset({"cpu"}),
          min_inputs=0, max_inputs=1, doc="This process's place in a world of several processes."),
    OpDef("Allreduce", infer_inplace, None, movement_cost, transfer=_inplace_transfer(move_allreduce),
          min_inputs=2, doc="Sum every buffer of every process of the world, in place."),
    OpDef("Broadcast", infer_inplace, None, movement_cost, transfer=_inplace_transfer(move_broadcast),
          min_inputs=2, doc="The root process's first buffer into every buffer of every process."),
)
