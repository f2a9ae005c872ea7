"""The collective ops (placer/ops/collective.py) as nets run them.

- Semantics on emulated GPUs (and the host) against numpy, for 4 and 3 ranks (chunks of
  unequal size), every root; shape inference against the arrays made; the bytes each
  link carries against the ring's law (``ring_edge_bytes``).
- Gloo Allreduce and Broadcast against real Caffe2 on a common world of size 1 (its
  Allgather cannot run on one process: the Gloo ring needs a peer; numpy checks ours).
- Placer's op ranges against real Caffe2's schemas.
- The ring code on the strict cupy stand-in (cupy's rules, no host round trips).
- The NCCL path on a stand-in for cupy with several GPUs and an NCCL that does the
  arithmetic: one grouped call per rank, on that GPU's own stream, bytes noted per link.
- The executor knows no collective by name.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from placer.hardware.collectives import ring_edge_bytes
from placer.errors import PlacerError, ShapeError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import collective, collective_kernels, registry
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import Args, TensorType

NCCL_OPS = ("NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLAllGather", "NCCLReduceScatter", "AllToAll")


def rank_inputs(n: int, shape=(6, 5), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def expected(op_type: str, xs: list[np.ndarray], root: int = 0) -> list[np.ndarray]:
    """What each rank holds afterwards, from Caffe2's NCCL semantics (module docstring of
    placer/ops/collective.py), in numpy."""
    n = len(xs)
    total = np.sum(xs, axis=0, dtype=np.float64).astype(np.float32)
    if op_type == "NCCLAllreduce":
        return [total] * n
    if op_type == "NCCLBroadcast":
        return [xs[root]] * n
    if op_type == "NCCLReduce":
        return [total]
    if op_type == "NCCLAllGather":
        return [np.stack(xs)] * n
    if op_type == "NCCLReduceScatter":
        return [total[i] for i in range(n)]
    rows = xs[0].shape[0] // n                                     # AllToAll
    return [np.concatenate([x[j * rows:(j + 1) * rows] for x in xs]) for j in range(n)]


def collective_net(op_type: str, n: int, args: dict | None = None, gpu: bool = True) -> pb.NetDef:
    """x_i copied onto GPU i (or kept on the host), then the collective over them."""
    net = pb.NetDef(name=op_type, external_input=[f"x{i}" for i in range(n)])
    data = []
    for i in range(n):
        if gpu:
            op = net.op.add(type="CopyCPUToGPU", input=[f"x{i}"], output=[f"g{i}"])
            op.device_option.device_type, op.device_option.device_id = 1, i
        data.append(f"g{i}" if gpu else f"x{i}")
    outputs = [f"y{i}" for i in range(1 if op_type == "NCCLReduce" else n)]
    op = net.op.add(type=op_type, input=data, output=outputs)
    if gpu:
        op.device_option.device_type = 1
    for k, v in (args or {}).items():
        op.arg.add(name=k, i=v)
    net.external_output.extend(outputs)
    return net


def run(net: pb.NetDef, xs: list[np.ndarray], **kw):
    ex = Executor(net_from_netdef(net), **kw)
    out = ex.run({f"x{i}": x for i, x in enumerate(xs)}, warmup=0)
    return [out[o] for o in net.external_output], ex


CASES = [(t, n, {}) for t in NCCL_OPS for n in (4, 3)] + [("NCCLBroadcast", 4, {"root": 2}),
                                                           ("NCCLBroadcast", 3, {"root": 1})]


@pytest.mark.parametrize("op_type,n,args", CASES, ids=[f"{t}-{n}-{a}" for t, n, a in CASES])
def test_collectives_on_emulated_gpus_give_caffe2s_results(op_type, n, args):
    shape = (n * 2, 5) if op_type in ("AllToAll",) else (n, 7) if op_type == "NCCLReduceScatter" else (6, 5)
    xs = rank_inputs(n, shape)
    net = collective_net(op_type, n, args)
    got, ex = run(net, xs, emulate_gpus=n)
    want = expected(op_type, xs, args.get("root", 0))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    typed = infer(net_from_netdef(net), {f"x{i}": TensorType(x.shape) for i, x in enumerate(xs)})
    assert [typed.blobs[o].shape for o in net.external_output] == [w.shape for w in want]
    rec = ex.record.ops[-1]
    assert rec.type == op_type and rec.device == "emulated-cuda:0"


@pytest.mark.parametrize("op_type,kind", [("NCCLAllreduce", "allreduce"), ("NCCLAllGather", "allgather"),
                                          ("NCCLReduceScatter", "reducescatter"), ("NCCLBroadcast", "broadcast"),
                                          ("NCCLReduce", "reduce"), ("AllToAll", "alltoall")])
def test_each_link_carries_what_the_ring_moves(op_type, kind):
    """Sizes divisible by 4: every ring edge (chain edge, pair) carries exactly
    ``ring_edge_bytes`` of S; no other link is used."""
    n = 4
    shape = (n * 4, 8) if op_type != "NCCLReduceScatter" else (n, 16)
    xs = rank_inputs(n, shape)
    _, ex = run(collective_net(op_type, n), xs, emulate_gpus=n)
    s = collective.COLLECTIVE_OPS[op_type].nbytes([TensorType(x.shape) for x in xs])
    per_link: dict = {}
    for src, dst, b in ex.record.ops[-1].links:
        per_link[(src, dst)] = per_link.get((src, dst), 0) + b
    edges = collective_kernels.ring_edges(kind, n)
    assert set(per_link) == {(f"emulated-cuda:{a}", f"emulated-cuda:{b}") for a, b in edges}
    assert set(per_link.values()) == {ring_edge_bytes(kind, s, n)}


def test_gloo_collectives_over_host_buffers_and_gpus():
    """CreateCommonWorld(size=1) then Allreduce / Broadcast / Allgather over three buffers:
    on the host (Gloo's CPU ops) and on three emulated GPUs (GPU buffers, one op)."""
    xs = rank_inputs(3, (4, 3), seed=5)
    for gpu in (False, True):
        net = pb.NetDef(name="gloo", external_input=[f"x{i}" for i in range(3)])
        data = [f"x{i}" for i in range(3)]
        if gpu:
            for i in range(3):
                op = net.op.add(type="CopyCPUToGPU", input=[f"x{i}"], output=[f"g{i}"])
                op.device_option.device_type, op.device_option.device_id = 1, i
            data = [f"g{i}" for i in range(3)]
        op = net.op.add(type="CreateCommonWorld", output=["cw"], name="cw_op")
        op.arg.add(name="size", i=1)
        op.arg.add(name="rank", i=0)
        net.op.add(type="Allgather", input=["cw"] + data[:2], output=["gathered"])
        net.op.add(type="Allreduce", input=["cw"] + data, output=data, engine="GLOO")
        net.op.add(type="Broadcast", input=["cw", data[0], data[2]], output=[data[0], data[2]], engine="GLOO")
        net.external_output.extend(data + ["gathered", "cw"])
        ex = Executor(net_from_netdef(net), emulate_gpus=3 if gpu else None)
        out = ex.run({f"x{i}": x for i, x in enumerate(xs)}, warmup=0)
        total = xs[0] + xs[1] + xs[2]
        for b in data:
            np.testing.assert_allclose(out[b], total, rtol=1e-6)
        np.testing.assert_array_equal(out["gathered"], np.concatenate([xs[0].ravel(), xs[1].ravel()]))
        np.testing.assert_array_equal(out["cw"], [1])
        devices = {o.type: o.device for o in ex.record.ops}
        assert devices["CreateCommonWorld"] == "cpu"
        if gpu:
            assert {(s, d) for s, d, _ in ex.record.ops[-2].links} == {
                ("emulated-cuda:0", "emulated-cuda:1"), ("emulated-cuda:1", "emulated-cuda:2"),
                ("emulated-cuda:2", "emulated-cuda:0")}


GLOO_ORACLE = """
import tempfile
d = tempfile.mkdtemp()
net = core.Net("world")
net.FileStoreHandlerCreate([], ["kv"], path=d, prefix="x")
net.CreateCommonWorld(["kv"], ["cw"], size=1, rank=0, engine="GLOO", name="cw_op")
workspace.RunNetOnce(net)
for name in ["x0", "x1", "x2"]:
    workspace.FeedBlob(name, inputs[name])
step = core.Net("collectives")
step.Allreduce(["cw", "x0", "x1", "x2"], ["x0", "x1", "x2"], engine="GLOO")
step.Scale(["x1"], ["x1"], scale=0.5)
step.Broadcast(["cw", "x1", "x2"], ["x1", "x2"], engine="GLOO")
workspace.RunNetOnce(step)
save(**{b: workspace.FetchBlob(b) for b in ["x0", "x1", "x2"]})
schemas = {}
for t in %s:
    s = workspace.C.OpSchema.get(t)
    schemas[t] = [s.min_input, s.max_input, s.min_output, s.max_output,
                  [[i, o] for i in range(4) for o in range(4) if s.inplace_enforced(i, o)]]
save_json(schemas)
"""
SCHEMA_OPS = list(NCCL_OPS[:-1]) + ["CreateCommonWorld", "CloneCommonWorld", "Allreduce", "Broadcast", "Allgather"]


@pytest.mark.caffe2
def test_gloo_ops_and_schemas_against_real_caffe2():
    from caffe2_oracle import run_caffe2
    xs = rank_inputs(3, (4, 3), seed=9)
    theirs, schemas = run_caffe2(GLOO_ORACLE % json.dumps(SCHEMA_OPS), {f"x{i}": x for i, x in enumerate(xs)})
    net = pb.NetDef(name="gloo", external_input=["x0", "x1", "x2"], external_output=["x0", "x1", "x2"])
    op = net.op.add(type="CreateCommonWorld", output=["cw"])
    op.arg.add(name="size", i=1)
    net.op.add(type="Allreduce", input=["cw", "x0", "x1", "x2"], output=["x0", "x1", "x2"], engine="GLOO")
    net.op.add(type="Scale", input=["x1"], output=["x1"]).arg.add(name="scale", f=0.5)
    net.op.add(type="Broadcast", input=["cw", "x1", "x2"], output=["x1", "x2"], engine="GLOO")
    ours, _ = run(net, xs)
    for i, b in enumerate(["x0", "x1", "x2"]):
        np.testing.assert_allclose(ours[i], theirs[b], rtol=1e-6)
    for t, (lo, hi, out_lo, out_hi, inplace) in schemas.items():
        ours = registry.get(t)
        top = ours.max_inputs if ours.max_inputs is not None else 2 ** 31 - 1
        assert lo <= ours.min_inputs and top <= hi, t          # placer's range within Caffe2's
        if t.startswith("NCCL"):
            assert (ours.min_inputs, top) == (lo, hi) == (1, 16)
    assert schemas["NCCLBroadcast"][4] == [[0, 0], [1, 1], [2, 2], [3, 3]]   # in place, as ours writes it
    assert schemas["Allreduce"][4][:2] == [[1, 0], [2, 1]]          # output j is input j + 1


def test_bad_collectives_are_refused_naming_the_op():
    xs = [np.ones((2, 3), np.float32), np.ones((3, 3), np.float32)]
    with pytest.raises(ShapeError) as e:
        run(collective_net("NCCLAllreduce", 2), xs, emulate_gpus=2)
    assert "\n" not in str(e.value) and "NCCLAllreduce" in str(e.value) and "same shape" in str(e.value)
    with pytest.raises(ShapeError, match="root=1: Caffe2 keeps the root of NCCLReduce at 0"):
        run(collective_net("NCCLReduce", 2, {"root": 1}), rank_inputs(2), emulate_gpus=2)
    with pytest.raises(ShapeError, match="first dimension must be the rank count 2"):
        run(collective_net("NCCLReduceScatter", 2), rank_inputs(2, (3, 4)), emulate_gpus=2)
    net = collective_net("NCCLAllreduce", 2)
    net.op[-1].output.append("y2")
    with pytest.raises(ShapeError, match="NCCLAllreduce -> 'y0': 3 outputs, but each output is written where an"):
        run(net, rank_inputs(2), emulate_gpus=2)
    net = pb.NetDef(name="world", external_output=["cw"])
    op = net.op.add(type="CreateCommonWorld", output=["cw"])
    op.arg.add(name="size", i=2)
    with pytest.raises(PlacerError, match="CreateCommonWorld of size 2: placer runs the net in one process"):
        Executor(net_from_netdef(net)).run({}, warmup=0)


def test_the_executor_names_no_collective():
    runtime = Path(collective.__file__).parent.parent / "runtime"
    text = "".join(p.read_text() for p in runtime.glob("*.py"))
    for op_type in list(collective.COLLECTIVE_OPS) + ["CreateCommonWorld", "CloneCommonWorld"]:
        assert f'"{op_type}"' not in text and f"'{op_type}'" not in text


# -- the ring code on the strict cupy stand-in -------------------------------------------

class StandInGpu:
    """A GPU whose array module is the strict cupy stand-in (no context to switch)."""

    kind, emulated = "gpu", False

    def __init__(self, xp, index):
        self.xp, self.index, self.name = xp, index, f"standin:{index}"

    def adopt(self, a):
        from cupy_standin import DeviceArray
        assert isinstance(a, DeviceArray), f"{type(a).__name__} is not a device array"
        return a


class StandInTransfers:
    def __init__(self, xp, devices):
        self.xp, self.sources, self.targets, self.host, self.moved = xp, devices, devices, None, []

    def copy(self, array, source, target):
        self.moved.append((source.name, target.name, int(array.nbytes)))
        return self.xp.wrap(np.array(array._a, copy=True))


class StandInHost:
    kind, emulated, name = "cpu", False, "cpu"

    def adopt(self, a):
        assert type(a) is np.ndarray
        return a


STRICT_CHECKED = ("NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLAllGather", "NCCLReduceScatter", "AllToAll")
GLOO_CHECKED = ("Allreduce", "Broadcast", "Allgather")


@pytest.mark.parametrize("op_type", STRICT_CHECKED + GLOO_CHECKED)
def test_the_ring_code_keeps_to_cupys_rules(op_type):
    """Each collective's move on three GPUs whose array module is the strict stand-in
    (Gloo's: their buffers on the GPUs, the common world on the host)."""
    from conftest import require_cupy
    require_cupy()
    from cupy_standin import StrictCupy
    xp = StrictCupy()
    n = 3
    shape = (n * 2, 5) if op_type == "AllToAll" else (n, 7) if op_type == "NCCLReduceScatter" else (5, 4)
    xs = rank_inputs(n, shape, seed=3)
    devices = [StandInGpu(xp, i) for i in range(n)]
    t = StandInTransfers(xp, devices)
    inputs = [xp.wrap(x) for x in xs]
    if op_type in GLOO_CHECKED:
        t.sources, t.host = [StandInHost()] + devices, StandInHost()
        t.targets = devices[:1] if op_type == "Allgather" else devices
        inputs = [np.ones(1, np.int64)] + inputs
    outs = registry.get(op_type).transfer.move(t, inputs, Args({}, op=f"#0 {op_type}"))
    assert not xp.ledger.syncs, xp.ledger.syncs
    if op_type in GLOO_CHECKED:
        want = {"Allreduce": expected("NCCLAllreduce", xs), "Broadcast": expected("NCCLBroadcast", xs),
                "Allgather": [np.concatenate([x.ravel() for x in xs])]}[op_type]
    else:
        want = expected(op_type, xs)
    for g, w in zip(outs, want):
        np.testing.assert_allclose(g._a, w, rtol=1e-6, atol=1e-6)
    assert t.moved


@pytest.mark.parametrize("op_type", STRICT_CHECKED + GLOO_CHECKED)
def test_one_device_kernels_give_the_collectives_result(op_type):
    """The registry's ``kernel`` (every rank's blob on one device): the moves' result, on
    numpy and on the strict cupy stand-in."""
    from conftest import require_cupy
    from cupy_standin import run_strict
    n = 3
    shape = (n * 2, 5) if op_type == "AllToAll" else (n, 7) if op_type == "NCCLReduceScatter" else (5, 4)
    xs = rank_inputs(n, shape, seed=8)
    gloo = op_type in GLOO_CHECKED
    inputs = ([np.ones(1, np.int64)] if gloo else []) + xs
    want = ({"Allreduce": expected("NCCLAllreduce", xs), "Broadcast": expected("NCCLBroadcast", xs),
             "Allgather": [np.concatenate([x.ravel() for x in xs])]}[op_type] if gloo else expected(op_type, xs))
    args = Args({}, op=f"#0 {op_type}")
    kernel = registry.get(op_type).kernel
    for g, w in zip(kernel(np, inputs, args), want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    require_cupy()
    strict = run_strict(kernel, inputs, args)
    assert not strict.syncs
    for g, w in zip(strict.outputs, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_common_worlds_live_on_the_host_wherever_placed():
    net = pb.NetDef(name="world", external_output=["cw", "cw2"])
    op = net.op.add(type="CreateCommonWorld", output=["cw"])
    op.arg.add(name="size", i=1)
    op.device_option.device_type, op.device_option.device_id = 1, 1
    op = net.op.add(type="CloneCommonWorld", input=["cw"], output=["cw2"])
    op.device_option.device_type = 1
    ex = Executor(net_from_netdef(net), emulate_gpus=2)
    out = ex.run({}, warmup=0)
    assert out["cw"].tolist() == out["cw2"].tolist() == [1]
    assert [o.device for o in ex.record.ops] == ["emulated-cuda:1", "emulated-cuda:0"]
    assert ex.record.link_bytes() == {}


# -- NCCL on a stand-in for cupy with several GPUs ----------------------------------------

class FakeNccl:
    """cupy.cuda.nccl doing the arithmetic on the stand-in's arrays at groupEnd, checking
    what NCCL requires of a single-process group (module docstring)."""

    available = True

    def __init__(self, fake):
        self.fake, self.group, self.inits, self.groups = fake, None, [], []
        self.NcclCommunicator = types.SimpleNamespace(initAll=self.init_all)

    def init_all(self, devices):
        self.inits.append(list(devices))
        return [FakeComm(self, rank, d) for rank, d in enumerate(devices)]

    def groupStart(self):
        assert self.group is None
        self.group = []

    def groupEnd(self):
        calls, self.group = self.group, None
        self.groups.append([c[0] for c in calls])
        kind = calls[0][0]
        n = len({c[1] for c in calls})
        view = self.fake.view
        if kind == "allReduce":
            total = sum(view(c[2], c[4]) for c in calls)
            for c in calls:
                view(c[3], c[4])[:] = total
        elif kind == "broadcast":
            root = next(c for c in calls if c[1] == c[5])
            for c in calls:
                view(c[3], c[4])[:] = view(root[2], root[4])
        elif kind == "reduce":
            total = sum(view(c[2], c[4]) for c in calls)
            root = next(c for c in calls if c[1] == c[5])
            view(root[3], root[4])[:] = total
        elif kind == "allGather":
            gathered = np.concatenate([view(c[2], c[4]) for c in sorted(calls, key=lambda c: c[1])])
            for c in calls:
                view(c[3], c[4] * n)[:] = gathered
        elif kind == "reduceScatter":
            total = sum(view(c[2], c[4] * n) for c in calls)
            for c in calls:
                view(c[3], c[4])[:] = total[c[1] * c[4]:(c[1] + 1) * c[4]]
        else:                                   # send / recv pairs
            sends = {(c[1], c[5]): view(c[2], c[4]).copy() for c in calls if c[0] == "send"}
            for c in calls:
                if c[0] == "recv":
                    view(c[3], c[4])[:] = sends[(c[5], c[1])]


class FakeComm:
    def __init__(self, nccl, rank, device):
        self.nccl, self.rank, self.device = nccl, rank, device

    def _call(self, kind, send, recv, count, stream, extra=None):
        fake = self.nccl.fake
        assert self.nccl.group is not None, "outside a group"
        assert fake.current == self.device, "the rank's GPU is not current"
        assert stream == fake.stream_ptrs[self.device], "not the rank's own stream"
        self.nccl.group.append((kind, self.rank, send, recv, count, extra))

    def allReduce(self, x, y, count, dtype, op, stream):
        self._call("allReduce", x, y, count, stream)

    def broadcast(self, x, y, count, dtype, root, stream):
        self._call("broadcast", x, y, count, stream, root)

    def reduce(self, x, y, count, dtype, op, root, stream):
        self._call("reduce", x, y, count, stream, root)

    def allGather(self, x, y, count, dtype, stream):
        self._call("allGather", x, y, count, stream)

    def reduceScatter(self, x, y, count, dtype, op, stream):
        self._call("reduceScatter", x, y, count, stream)

    def send(self, x, count, dtype, peer, stream):
        self._call("send", x, None, count, stream, peer)

    def recv(self, y, count, dtype, peer, stream):
        self._call("recv", None, y, count, stream, peer)


@pytest.fixture
def fake_gpus(monkeypatch):
    from test_runtime_multigpu import FakeCupy
    fake = FakeCupy(count=3)
    arrays: dict[int, np.ndarray] = {}

    def data(self):
        flat = self.view(np.ndarray).reshape(-1)
        arrays[flat.__array_interface__["data"][0]] = flat
        return types.SimpleNamespace(ptr=flat.__array_interface__["data"][0])

    def view(ptr, count):
        base = max(p for p in arrays if p <= ptr)
        flat = arrays[base]
        start = (ptr - base) // flat.itemsize
        return flat[start:start + count]

    fake.ndarray.data = property(data)
    fake.view = view
    fake.stream_ptrs = {}

    def stream_ptr(stream):
        fake.stream_ptrs.setdefault(stream.device_id, id(stream))
        return id(stream)
    fake.cuda.Stream.ptr = property(stream_ptr)
    nccl = FakeNccl(fake)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    monkeypatch.setattr(collective_kernels, "_COMMS", {})
    return fake, nccl


@pytest.mark.parametrize("op_type", NCCL_OPS)
def test_nccl_runs_each_collective_in_one_group_on_each_gpus_stream(op_type, fake_gpus):
    fake, nccl = fake_gpus
    n = 3
    shape = (n * 2, 5) if op_type == "AllToAll" else (n, 7) if op_type == "NCCLReduceScatter" else (5, 4)
    xs = rank_inputs(n, shape, seed=4)
    net = collective_net(op_type, n)
    ex = Executor(net_from_netdef(net))
    for d in ex.devices.all()[1:]:
        fake.stream_ptrs[d.index] = d.stream.ptr
    out = ex.run({f"x{i}": x for i, x in enumerate(xs)}, iterations=2, warmup=0)
    for g, w in zip([out[o] for o in net.external_output], expected(op_type, xs)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert nccl.inits == [[0, 1, 2]]                          # communicators made once
    assert len(nccl.groups) == 2                              # one group per run
    kind = collective.COLLECTIVE_OPS[op_type].kind
    s = collective.COLLECTIVE_OPS[op_type].nbytes([TensorType(x.shape) for x in xs])
    links = ex.record.ops[-1].links
    edges = collective_kernels.ring_edges(kind, n)
    assert {(a, b) for a, b, _ in links} == {(f"cuda:{a}", f"cuda:{b}") for a, b in edges}
    assert {b for *_, b in links} == {int(ring_edge_bytes(kind, s, n))}


def test_without_nccl_the_same_gpus_use_the_ring_of_copies(fake_gpus, monkeypatch):
    fake, nccl = fake_gpus
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", types.SimpleNamespace(available=False))
    xs = rank_inputs(3, seed=6)
    got, ex = run(collective_net("NCCLAllreduce", 3), xs)
    for g in got:
        np.testing.assert_allclose(g, expected("NCCLAllreduce", xs)[0], rtol=1e-6)
    assert not nccl.groups and any(e[0] == "peer_copy" for e in fake.log)


# -- real GPUs ---------------------------------------------------------------------------

@pytest.mark.gpu
def test_nccl_allreduce_over_every_visible_gpu():
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    xs = rank_inputs(n, (64, 32), seed=7)
    got, ex = run(collective_net("NCCLAllreduce", n), xs)
    for g in got:
        np.testing.assert_allclose(g, expected("NCCLAllreduce", xs)[0], rtol=1e-5, atol=1e-5)
    assert not ex.record.emulated
