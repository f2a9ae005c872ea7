"""A placed cluster net -> one Caffe2 NetDef and init net per worker, joined by Caffe2's own
cross-process ops.

**One worker per host** (rank = the host's position in the cluster profile; rank 0 is the
host that feeds the inputs and reads the outputs). A worker runs every device of its host
in one process, as Caffe2 did (one process per machine, ``device_option`` per op, copies
between its GPUs inside the process), so the only messages between workers are the
tensors that cross the network, which is what the plan priced.

Input: the placed net of ``placer.rewrite.netdef.place`` over a ``ClusterMachine``: every op's
``device_option`` names its host in ``node_name``, and a tensor read on another host goes
through one ``Copy`` placed on the destination device. The split walks the placed net
(init net first, then the predict net) in order:

- an op goes to the worker of its ``node_name``, in the placed net's order;
- a ``Copy`` whose input another worker holds becomes a **matching pair** with one tag,
  both at the copy's place in the placed net (so both workers meet them in the same global
  order, and even blocking sends cannot deadlock):

      sender:   SendTensor(comm_world, X)                      dst=R tag=T raw_buffer=1 engine=MPI
                name "send T: X h0/cuda:0 -> h1/cuda:1"        (on the device X is on)
      receiver: ReceiveTensor(comm_world, Y) -> Y, Y__src_T, Y__tag_T   src=S tag=T raw_buffer=1
                name "recv T: X h0/cuda:0 -> h1/cuda:1"        (on the copy's device)

  Caffe2's MPI receive writes into a buffer of the sent tensor's shape and type
  (``raw_buffer``: its non-raw mode was never implemented), so the receiver's init net
  fills Y with zeros of that type first (``ConstantFill``);
- a collective whose buffers several workers hold (``Allreduce`` / ``Broadcast`` over a
  common world; ``NCCLAllreduce`` / ``NCCLBroadcast`` in place) becomes, on every worker,
  the same op over that worker's own buffers and its common world (Caffe2's cross-process
  ``Allreduce`` sums every buffer of every process; ``Broadcast`` sends the root
  process's first buffer to all); a collective within one host stays as it is;
- every worker's init net starts with ``CreateCommonWorld(size=N, rank=r, engine=MPI)``
  -> ``comm_world``; a ``CreateCommonWorld`` of the placed init net (a world of one
  process) becomes the same world of N;
- the worker nets carry no ``node_name``: it describes the whole placed net, and Caffe2
  refuses to run an op that has one ("node_name must be empty for all operators at
  execution time", caffe2/core/net.cc); the manifest says which host runs which net.

Schemas (torch 1.8.1's Caffe2, ``OpSchema.get``): SendTensor (comm_world, X[, dst, tag]),
args dst, tag, raw_buffer; ReceiveTensor (comm_world, Y[, src, tag]) -> (Y, src, tag),
exactly three outputs; CreateCommonWorld ([kv_handler]) -> comm_world, args size, rank.
The MPI engine registers all three (caffe2/mpi/mpi_ops.cc).

``one_process`` gives the same placed net for a single process: each GPU numbered across
the cluster (h1/cuda:0 of a cluster with two GPUs per host is cuda:2), hosts dropped, so
``placer run`` can check a cluster plan's outputs on one machine. ``on_hosts`` goes the
other way: a net placed over the cluster's GPUs numbered that way (a data-parallel layout
over all of them, say) gets its hosts, CPU ops go to the first host, and every blob read
on another host than the one holding it gets a ``Copy`` there (once per host and device).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from placer.errors import PlacerError
from placer.formats import caffe2_pb as pb
from placer.ops import registry
from placer.types import DTYPE_TO_DATA_TYPE, TensorType

WORLD = "comm_world"
SELF = "comm_self"          # a world of one process, for a collective within one worker
ENGINE = "MPI"
WORLD_COLLECTIVES = ("Allreduce", "Broadcast")          # (comm_world, X_1..X_k) -> X_1..X_k
NCCL_COLLECTIVES = {"NCCLAllreduce": "Allreduce", "NCCLBroadcast": "Broadcast"}


@dataclass
class Message:
    """One tensor sent from one worker to another (a SendTensor/ReceiveTensor pair)."""

    tag: int
    phase: str              # "init" or "predict"
    blob: str               # what the sender sends
    received_as: str        # the receiver's blob
    src: str                # device names, HOST/DEVICE
    dst: str
    nbytes: int


@dataclass
class WorkerNet:
    rank: int
    host: str
    devices: tuple[str, ...]
    gpus: int
    predict: pb.NetDef
    init: pb.NetDef
    inputs: list[str] = field(default_factory=list)     # fed by the driver
    outputs: list[str] = field(default_factory=list)    # external outputs it returns


@dataclass
class WorkerSplit:
    workers: list[WorkerNet]
    messages: list[Message]
    collectives: int = 0


class _Split:
    """State of one walk over the placed nets (module docstring)."""

    def __init__(self, cluster, types: dict[str, TensorType]):
        self.cluster, self.types = cluster, types
        self.hosts = list(cluster.hosts)
        self.n = len(self.hosts)
        self.ops: dict[str, list[list]] = {"init": [[] for _ in self.hosts], "predict": [[] for _ in self.hosts]}
        self.buffers: list[list] = [[] for _ in self.hosts]        # receive buffers, filled in init
        self.where: dict[str, str] = {}                            # blob -> device name holding it
        self.messages: list[Message] = []
        self.collectives = 0
        self.self_world: set[int] = set()                          # workers that need comm_self

    # -- devices ---------------------------------------------------------------------
    def device_of(self, op, label: str) -> str:
        option = op.device_option
        host = option.node_name
        if host not in self.hosts:
            raise PlacerError(f"{label}: device_option names host {host!r}, not a host of cluster "
                              f"{self.cluster.name} ({', '.join(self.hosts)})",
                              hint="write the placed net with placer plan --cluster")
        return f"{host}/cuda:{option.device_id}" if option.device_type == pb.PROTO_CUDA else f"{host}/cpu"

    def worker(self, device: str) -> int:
        return self.hosts.index(device.partition("/")[0])

    @staticmethod
    def option(op, device: str) -> None:
        """The device option of a worker's op: the device on its own host, no node_name."""
        local = device.partition("/")[2]
        op.device_option.ClearField("node_name")
        if local == "cpu":
            op.device_option.device_type, op.device_option.device_id = pb.PROTO_CPU, 0
        else:
            op.device_option.device_type = pb.PROTO_CUDA
            op.device_option.device_id = int(local.partition(":")[2])

    def written_on(self, op, device: str, j: int) -> str:
        """Where output j of an op placed on ``device`` lands (transfer rules, in place)."""
        opdef = registry.get(op.type)
        out = op.output[j]
        if out in op.input:
            return self.where.get(out, device)
        rule = opdef.transfer.writes if opdef is not None and opdef.transfer is not None else registry.PLACED
        if rule == registry.HOST:
            return device.partition("/")[0] + "/cpu"
        if rule == registry.LIKE_INPUT and j < len(op.input):
            return self.where.get(op.input[j], device)
        return device

    # -- the walk ----------------------------------------------------------------------
    def walk(self, netdef, phase: str) -> None:
        copies = registry.copy_types()
        for i, op in enumerate(netdef.op):
            label = f"{phase} net op #{i} {op.type}" + (f" '{op.name}'" if op.name else "")
            if op.type == "CreateCommonWorld":
                self.world_op(op, phase)
                continue
            device = self.device_of(op, label)
            w = self.worker(device)
            holders = {self.where[b] for b in op.input if b in self.where}
            remote = [b for b in op.input if b in self.where and self.worker(self.where[b]) != w]
            if op.type in copies and remote:
                self.message(op, device, phase)
            elif op.type in WORLD_COLLECTIVES + tuple(NCCL_COLLECTIVES) and \
                    len({self.worker(d) for d in holders}) > 1:
                self.collective(op, phase, label)
            elif op.type in WORLD_COLLECTIVES:
                self.ops[phase][w].append(self.within(op, w))
                for out in op.output:
                    self.where.setdefault(out, device)
            elif remote:
                b = remote[0]
                raise PlacerError(f"{label} on {device} reads '{b}', which {self.where[b]} holds, without a copy",
                                  hint="a tensor crossing hosts must go through a Copy (write the placed "
                                       "net with placer plan --cluster)")
            else:
                self.ops[phase][w].append(_local(op))
                for j, out in enumerate(op.output):
                    self.where[out] = self.written_on(op, device, j)

    def within(self, op, w: int):
        """A world collective whose buffers one worker holds: over a world of that worker
        alone (``comm_self``), as it ran in one process."""
        local = _local(op)
        local.input[0] = SELF
        self.self_world.add(w)
        return local

    def world_op(self, op, phase: str) -> None:
        """CreateCommonWorld -> the same blob, a world of every worker, on each worker."""
        for r, host in enumerate(self.hosts):
            self.ops[phase][r].append(self.create_world(op.output[0], r, host))

    def create_world(self, blob: str, rank: int, host: str):
        op = pb.OperatorDef(type="CreateCommonWorld", output=[blob], engine=ENGINE,
                            name=f"common world of {self.n} workers: rank {rank} ({host})")
        op.arg.add(name="size", i=self.n)
        op.arg.add(name="rank", i=rank)
        self.option(op, f"{host}/cpu")
        return op

    def message(self, copy, device: str, phase: str) -> None:
        """A copy between workers -> SendTensor on the sender, ReceiveTensor on the receiver."""
        blob, out = copy.input[0], copy.output[0]
        src = self.where[blob]
        s, r = self.worker(src), self.worker(device)
        tag = len(self.messages)
        what = f"{tag}: {blob} {src} -> {device}"
        send = pb.OperatorDef(type="SendTensor", input=[WORLD, blob], name=f"send {what}", engine=ENGINE)
        for key, value in (("dst", r), ("tag", tag), ("raw_buffer", 1)):
            send.arg.add(name=key, i=value)
        self.option(send, src)
        recv = pb.OperatorDef(type="ReceiveTensor", input=[WORLD, out],
                              output=[out, f"{out}__src_{tag}", f"{out}__tag_{tag}"], name=f"recv {what}",
                              engine=ENGINE)
        for key, value in (("src", s), ("tag", tag), ("raw_buffer", 1)):
            recv.arg.add(name=key, i=value)
        self.option(recv, device)
        t = self.types.get(blob)
        if t is None:
            raise PlacerError(f"{phase} net: the type of '{blob}' sent from {src} to {device} is unknown; "
                              "a receive needs its buffer's shape", hint="give the input shapes (--input)")
        self.buffers[r].append(self.zeros(out, t, device))
        self.ops[phase][s].append(send)
        self.ops[phase][r].append(recv)
        self.where[out] = device
        self.messages.append(Message(tag, phase, blob, out, src, device, int(t.nbytes)))

    def zeros(self, blob: str, t: TensorType, device: str):
        fill = pb.OperatorDef(type="ConstantFill", output=[blob], name=f"receive buffer {blob}")
        fill.arg.add(name="shape", ints=list(t.shape))
        fill.arg.add(name="dtype", i=DTYPE_TO_DATA_TYPE.get(t.dtype, 1))
        self.option(fill, device)
        return fill

    def collective(self, op, phase: str, label: str) -> None:
        """A collective over several workers' buffers -> one op per worker (module docstring)."""
        nccl = op.type in NCCL_COLLECTIVES
        data = list(op.input if nccl else op.input[1:])
        if list(op.output) != data:
            raise PlacerError(f"{label}: spans hosts but does not work in place (outputs {list(op.output)})",
                              hint="a collective across hosts must write its inputs (Caffe2's layout does)")
        kind = NCCL_COLLECTIVES.get(op.type, op.type)
        root_blob = data[_arg(op, "root", 0)] if nccl and kind == "Broadcast" else data[0]
        mine: list[list[str]] = [[] for _ in self.hosts]
        for b in data:
            mine[self.worker(self.where[b])].append(b)
        idle = [h for h, bs in zip(self.hosts, mine) if not bs]
        if idle:
            raise PlacerError(f"{label}: its buffers span several hosts but none is on {', '.join(idle)}; "
                              "a collective over the common world needs every worker",
                              hint="place a replica on every host, or keep the collective within one host")
        root = self.worker(self.where[root_blob])
        for r, blobs in enumerate(mine):
            if r == root:
                blobs.sort(key=lambda b: b != root_blob)   # the root process sends its first buffer
            part = pb.OperatorDef(type=kind, input=[WORLD, *blobs], output=blobs, engine=ENGINE,
                                  name=f"{kind.lower()} {self.collectives}: {op.name or op.type} on {self.hosts[r]}")
            if kind == "Broadcast":
                part.arg.add(name="root", i=root)
            self.option(part, self.where[blobs[0]])
            self.ops[phase][r].append(part)
        self.collectives += 1


def _local(op):
    """A copy of a placed op for its worker's net (no node_name)."""
    out = pb.OperatorDef()
    out.CopyFrom(op)
    out.device_option.ClearField("node_name")
    return out


def _arg(op, name: str, default: int) -> int:
    for a in op.arg:
        if a.name == name:
            return int(a.i)
    return default


def split_workers(predict: pb.NetDef, init: pb.NetDef | None, cluster, types: dict[str, TensorType],
                  inputs: list[str]) -> WorkerSplit:
    """The per-worker nets of a placed cluster net (module docstring). ``types``: the type
    of every blob of the placed nets; ``inputs``: the blobs the driver feeds (on rank 0)."""
    split = _Split(cluster, types)
    feed = cluster.names[0]
    for b in inputs:
        split.where[b] = feed
    if init is not None:
        split.walk(init, "init")
    split.walk(predict, "predict")
    workers = []
    for r, host in enumerate(split.hosts):
        workers.append(_worker_net(split, r, host, predict, init, inputs))
    return WorkerSplit(workers, split.messages, split.collectives)


def _worker_net(split: _Split, r: int, host: str, predict, init, inputs) -> WorkerNet:
    devices = tuple(split.cluster.names[d] for d in split.cluster.devices_of(r))
    init_net = pb.NetDef(name=f"{init.name if init is not None else predict.name + '_init'}_{host}")
    init_net.op.append(split.create_world(WORLD, r, host))
    if r in split.self_world:
        alone = init_net.op.add(type="CreateCommonWorld", output=[SELF], name=f"a world of {host} alone")
        alone.arg.add(name="size", i=1)
        alone.arg.add(name="rank", i=0)
    init_net.op.extend(split.buffers[r])
    init_net.op.extend(split.ops["init"][r])
    made = {o for op in init_net.op for o in op.output}
    net = pb.NetDef()
    net.CopyFrom(predict)
    net.name = f"{predict.name}_{host}"
    del net.op[:]
    net.op.extend(split.ops["predict"][r])
    read = {b for op in net.op for b in op.input}
    fed = [b for b in inputs if b in read]
    del net.external_input[:]
    net.external_input.extend(list(dict.fromkeys(fed + [b for b in _in_order(net) if b in made])))
    outs = [b for b in predict.external_output if b in split.where and split.worker(split.where[b]) == r]
    del net.external_output[:]
    net.external_output.extend(outs)
    del init_net.external_output[:]
    init_net.external_output.extend(b for b in dict.fromkeys(o for op in init_net.op for o in op.output)
                                    if b in read)
    return WorkerNet(r, host, devices, sum(1 for d in devices if not d.endswith("/cpu")), net, init_net, fed, outs)


def _in_order(net) -> list[str]:
    return list(dict.fromkeys(b for op in net.op for b in op.input))


def one_process(netdef: pb.NetDef, cluster) -> pb.NetDef:
    """The placed net for one process: GPUs numbered across the cluster, hosts dropped."""
    offset, gpus = {}, 0
    for h, host in enumerate(cluster.hosts):
        offset[host] = gpus
        gpus += sum(1 for d in cluster.devices_of(h) if cluster.devices[d].is_gpu)
    out = pb.NetDef()
    out.CopyFrom(netdef)
    for op in out.op:
        option = op.device_option
        host = option.node_name
        if host in offset and option.device_type == pb.PROTO_CUDA:
            option.device_id = offset[host] + option.device_id
        option.ClearField("node_name")
    return out


def on_hosts(netdef: pb.NetDef, init: pb.NetDef | None, cluster, inputs: list[str]) -> tuple:
    """(predict, init) placed over ``cluster`` from nets whose GPU ordinals number the
    cluster's GPUs (module docstring); ``inputs`` are fed on the first host's CPU."""
    gpus = [cluster.names[d] for d in cluster.gpus]
    where: dict[str, str] = {b: cluster.names[0] for b in inputs}
    copies: dict[tuple[str, str], str] = {}
    passing = registry.copy_types().union(WORLD_COLLECTIVES, NCCL_COLLECTIVES)  # ops that move blobs themselves
    taken = {b for net in (netdef, init) if net is not None for op in net.op for b in (*op.input, *op.output)}
    out = []
    for net in (init, netdef):
        if net is None:
            out.append(None)
            continue
        placed = pb.NetDef()
        placed.CopyFrom(net)
        del placed.op[:]
        for op in net.op:
            option = op.device_option
            device = gpus[option.device_id] if option.device_type == pb.PROTO_CUDA else cluster.names[0]
            host = device.partition("/")[0]
            new = pb.OperatorDef()
            new.CopyFrom(op)
            _Split.option(new, device)
            new.device_option.node_name = host
            if op.type not in passing:  # the split's
                opdef = registry.get(op.type)
                from_host = set(getattr(opdef, "host_inputs", ()) or ())   # read from host memory
                for k, b in enumerate(op.input):
                    held = where.get(b)
                    if held is not None and held.partition("/")[0] != host:
                        target = f"{host}/cpu" if k in from_host else device
                        new.input[k] = _copy_to(placed, b, target, copies, taken)
            placed.op.append(new)
            for j, b in enumerate(new.output):
                where[b] = device if b not in new.input else where.get(b, device)
            for b, target in ((b, d) for (b, d) in list(copies) if b in new.output):
                del copies[(b, target)]                  # a new version: copy it again when read
        out.append(placed)
    return out[1], out[0]


def _copy_to(placed: pb.NetDef, blob: str, target: str, copies: dict, taken: set) -> str:
    """The name of ``blob`` on device ``target`` of another host: a Copy placed there."""
    key = (blob, target)
    if key not in copies:
        name, k = f"{blob}_{target.replace('/', '_').replace(':', '')}", 1
        while name in taken:
            name, k = f"{blob}_{target.replace('/', '_').replace(':', '')}_{k}", k + 1
        taken.add(name)
        copy = placed.op.add(type="Copy", input=[blob], output=[name])
        _Split.option(copy, target)
        copy.device_option.node_name = target.partition("/")[0]
        copies[key] = name
    return copies[key]


__all__ = ["split_workers", "one_process", "on_hosts", "WorkerSplit", "WorkerNet", "Message", "WORLD", "ENGINE"]
