"""Placed nets over several GPUs: emulated (``--emulate-gpus N``), on a stand-in for cupy
with several devices, on real GPUs (marked ``gpu``), and mapped to the CPU in real Caffe2.

Outputs are compared with the all-CPU run of the unplaced net (same inputs, same seeded
fills); bytes per link with the copies the placed net holds, sized by shape inference;
the Caffe2 runs with placer's own run of the same placed net.
"""
from __future__ import annotations

import json
import sys
import time
import types

import numpy as np
import pytest

from placer.errors import DeviceError
from placer.examples.builder import NetBuilder
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import load_machine
from placer.ops import registry
from placer.rewrite.netdef import place
from placer.runtime import record as run_record
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import TensorType

from test_placed_corpus import CASES as CORPUS_CASES, reference   # the corpus nets that run today

MACHINE = load_machine("4x-v100-sxm2-nvlink")          # cpu, cuda:0..cuda:3
COPY_TYPES = ("CopyCPUToGPU", "CopyGPUToCPU", "Copy")


# -- random nets and placements ---------------------------------------------------------

def random_net(rng, n_ops: int, params: str = "given"):
    """A random DAG of FC / Relu / Sigmoid / Add over x[4,8]. ``params``: "given"
    (GivenTensorFill values, the same in any runtime), "random" (XavierFill and
    ConstantFill, seeded per blob name by placer) or "fed" (external inputs)."""
    b = NetBuilder("r")
    blobs = [b.input("x", (4, 8))]
    weights = []
    for k in range(2):
        if params == "fed":
            weights.append((b.input(f"w{k}", (8, 8)), b.input(f"b{k}", (8,))))
        elif params == "random":
            weights.append((b.param(f"w{k}", (8, 8), "XavierFill"), b.param(f"b{k}", (8,), "ConstantFill", value=0.1)))
        else:
            w = rng.standard_normal(64).astype(np.float32) / 3
            weights.append((b.param(f"w{k}", (8, 8), "GivenTensorFill", values=[float(v) for v in w]),
                            b.param(f"b{k}", (8,), "GivenTensorFill",
                                    values=[float(v) for v in rng.standard_normal(8).astype(np.float32)])))
    for i in range(n_ops):
        kind = str(rng.choice(["Relu", "Sigmoid", "Add", "FC"]))
        a = blobs[int(rng.integers(len(blobs)))]
        if kind == "Add":
            blobs.append(b.op("Add", [a, blobs[int(rng.integers(len(blobs)))]], f"y{i}"))
        elif kind == "FC":
            w, bias = weights[int(rng.integers(2))]
            blobs.append(b.op("FC", [a, w, bias], f"y{i}"))
        else:
            blobs.append(b.op(kind, [a], f"y{i}"))
    b.output(blobs[-1])
    if len(blobs) > 3:
        b.output(blobs[len(blobs) // 2])
    return net_from_netdef(b.predict, None if params == "fed" else b.init)


def feeds(net, rng) -> dict[str, np.ndarray]:
    out = {"x": rng.standard_normal((4, 8)).astype(np.float32)}
    for name in net.external_inputs:
        if name.startswith("w") and name not in net.params:
            out[name] = rng.standard_normal((8, 8)).astype(np.float32) / 3
        elif name.startswith("b") and name not in net.params:
            out[name] = rng.standard_normal(8).astype(np.float32)
    return out


def random_placement(net, rng, k: int = MACHINE.k) -> np.ndarray:
    """A device index per op over ``k`` devices; ops without a GPU kernel stay on the CPU."""
    dev = rng.integers(0, k, len(net.ops))
    for op in net.ops:
        if "gpu" not in registry.get(op.type).devices:
            dev[op.index] = 0
    return dev


def covering_placement(net, rng, k: int = MACHINE.k) -> np.ndarray:
    """``random_placement`` with every GPU given at least one op, when there are enough
    ops with a GPU kernel."""
    dev = random_placement(net, rng, k)
    movable = [op.index for op in net.ops if "gpu" in registry.get(op.type).devices]
    for gpu, i in zip(range(1, k), rng.permutation(movable)):
        dev[i] = gpu
    return dev


def placed_net(net, dev, machine=MACHINE, outputs_on_host=True):
    p = place(net, dev, machine, outputs_on_host=outputs_on_host)
    return net_from_netdef(p.predict, p.init), p


def expected_link_bytes(placed, feed) -> dict[str, int]:
    """Bytes per link from the placed net's copy ops: each copy's source is where its input
    was made (init or predict op's device option; fed inputs on the host), its size from
    shape inference on the placed net; devices named as emulated."""
    init = placed.init_proto.op if placed.init_proto is not None else []
    # parameters the init net copies onto a GPU: typed like the parameter they copy
    fed = {op.output[0]: placed.params[op.input[0]] for op in init if op.type in COPY_TYPES}
    fed.update((n, TensorType(a.shape, str(a.dtype))) for n, a in feed.items())
    blobs = infer(placed, fed).blobs

    def name(option) -> str:
        return "cpu" if option.device_type == 0 else f"emulated-cuda:{option.device_id}"

    made = {o: name(op.device_option) for op in init for o in op.output}
    out: dict[str, int] = {}
    for op in placed.proto.op:
        here = name(op.device_option)
        if op.type in COPY_TYPES:
            src, dst = made.get(op.input[0], "cpu"), ("cpu" if op.type == "CopyGPUToCPU" else here)
            out[f"{src}->{dst}"] = out.get(f"{src}->{dst}", 0) + blobs[op.input[0]].nbytes
            here = dst
        made.update((o, here) for o in op.output)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert type(got[k]) is np.ndarray
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


# -- emulated: random nets over four GPUs ---------------------------------------------

@pytest.mark.parametrize("params", ["given", "random", "fed"])
def test_random_nets_placed_over_four_gpus_run_like_the_cpu(params):
    rng = np.random.default_rng({"given": 1, "random": 2, "fed": 3}[params])
    gpus_used, d2d = set(), 0
    for trial in range(25):
        net = random_net(rng, int(rng.integers(3, 14)), params)
        feed = feeds(net, rng)
        want = Executor(net).run(feed)
        dev = random_placement(net, rng)
        placed, p = placed_net(net, dev)
        ex = Executor(placed, emulate_gpus=4)
        assert_same(ex.run(feed), want)
        rec = ex.record
        assert rec.devices == ("cpu",) + tuple(f"emulated-cuda:{i}" for i in range(4))
        ran_on = [o.device for o in rec.ops if o.type not in COPY_TYPES]
        assert ran_on == [MACHINE.names[d].replace("cuda", "emulated-cuda") for d in dev]
        assert rec.link_bytes() == expected_link_bytes(placed, feed)
        gpus_used |= {o.device for o in rec.ops if o.device != "cpu"}
        d2d += rec.copy_bytes("d2d")
    assert len(gpus_used) == 4 and d2d > 0    # the trials did exercise every GPU and peer copies


def test_copies_between_gpus_are_counted_per_link_and_device_by_hand():
    """x[4,8] f32 (128 B) on the host -> Relu on cuda:0 -> Sigmoid on cuda:1 -> back.
    Copies: cpu->cuda:0 128 B (x), cuda:0->cuda:1 128 B (r), cuda:1->cpu 128 B (s).
    Peak per device: cpu 128 (x until its copy, later s); cuda:0 128 + 128 while Relu runs
    (x_gpu_0 and r); cuda:1 the same while Sigmoid runs; cuda:2, cuda:3 idle, 0."""
    b = NetBuilder("chain")
    x = b.input("x", (4, 8))
    b.output(b.op("Sigmoid", [b.op("Relu", [x], "r")], "s"))
    net = net_from_netdef(b.predict)
    placed, _ = placed_net(net, [1, 2])
    ex = Executor(placed, emulate_gpus=4)
    feed = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
    np.testing.assert_allclose(ex.run(feed, iterations=2)["s"], 1 / (1 + np.exp(-np.maximum(feed["x"], 0))),
                               rtol=1e-6)
    rec = ex.record
    assert rec.link_bytes() == {"cpu->emulated-cuda:0": 128, "emulated-cuda:0->emulated-cuda:1": 128,
                                "emulated-cuda:1->cpu": 128}
    assert [(o.type, o.device, o.copy_direction) for o in rec.ops if o.links] == [
        ("CopyCPUToGPU", "emulated-cuda:0", "h2d"), ("Copy", "emulated-cuda:1", "d2d"),
        ("CopyGPUToCPU", "emulated-cuda:1", "d2h")]
    assert rec.peak_bytes == {"cpu": 128, "emulated-cuda:0": 256, "emulated-cuda:1": 256,
                              "emulated-cuda:2": 0, "emulated-cuda:3": 0}
    times = rec.time_by_device_s()
    assert set(times) == {"emulated-cuda:0", "emulated-cuda:1"} and all(t > 0 for t in times.values())
    back = run_record.from_dict(json.loads(json.dumps(run_record.to_dict(rec))))
    assert back == rec
    data = run_record.to_dict(rec)
    assert data["link_bytes"]["emulated-cuda:0->emulated-cuda:1"] == 128 and data["copy_bytes"]["d2d"] == 128
    assert set(data["time_by_device_s"]) == set(times)


def test_a_run_record_without_links_still_reads():
    b = NetBuilder("one")
    b.output(b.op("Relu", [b.input("x", (2, 2))], "r"))
    ex = Executor(net_from_netdef(b.predict))
    ex.run({"x": np.ones((2, 2), np.float32)})
    data = run_record.to_dict(ex.record)
    for o in data["ops"]:
        del o["links"]
    assert run_record.from_dict(data) == ex.record


def test_an_op_placed_beyond_the_emulated_gpus_fails_naming_the_op_and_the_device():
    machine = load_machine("8x-a100-40gb-nvswitch")     # cuda:0..cuda:7
    b = NetBuilder("far")
    b.output(b.op("Sigmoid", [b.op("Relu", [b.input("x", (4, 8))], "r")], "s"))
    placed, _ = placed_net(net_from_netdef(b.predict), [1, machine.index("cuda:5")], machine)
    with pytest.raises(DeviceError) as e:
        Executor(placed, emulate_gpus=4)
    msg = str(e.value)
    # the first op there is the copy of r onto cuda:5
    assert "\n" not in msg and "op #2 Copy -> 'r_gpu_5' is placed on cuda:5" in msg
    assert "only 4 GPU(s) are emulated (cuda:0..cuda:3)" in msg
    assert "--emulate-gpus 6" in msg
    assert Executor(placed, emulate_gpus=6).run({"x": np.ones((4, 8), np.float32)})["s"].shape == (4, 8)
    assert Executor(placed, emulate_gpu=True).devices.all()[-1].name == "emulated-cuda:5"


def test_a_blob_on_the_wrong_gpu_names_the_op_the_blob_and_both_devices():
    b = NetBuilder("wrong")
    b.output(b.op("Sigmoid", [b.op("Relu", [b.input("x", (4, 8))], "r")], "s"))
    placed, p = placed_net(net_from_netdef(b.predict), [1, 3])
    proto = pb.NetDef()
    proto.CopyFrom(p.predict)
    peer = [op for op in proto.op if op.type == "Copy"]
    assert len(peer) == 1 and peer[0].device_option.device_id == 2
    # the Sigmoid now reads r on cuda:0 directly: no copy
    sig = [op for op in proto.op if op.type == "Sigmoid"][0]
    sig.input[0] = peer[0].input[0]
    proto.op.remove(peer[0])
    with pytest.raises(DeviceError) as e:
        Executor(net_from_netdef(proto), emulate_gpus=4).run({"x": np.ones((4, 8), np.float32)})
    msg = str(e.value)
    assert "Sigmoid" in msg and "'r'" in msg and "runs on emulated-cuda:2" in msg and "is on emulated-cuda:0" in msg
    assert "insert a Copy op" in msg
    # a copy whose rule says it reads on its own GPU, handed a blob of another GPU
    proto.CopyFrom(p.predict)
    d2h = [op for op in proto.op if op.type == "CopyGPUToCPU"][0]
    d2h.device_option.device_id = 1
    with pytest.raises(DeviceError, match=r"CopyGPUToCPU .* reads 's_gpu_2' on emulated-cuda:1, "
                                          r"but the blob is on emulated-cuda:2"):
        Executor(net_from_netdef(proto), emulate_gpus=4).run({"x": np.ones((4, 8), np.float32)})


def test_a_collective_registers_like_a_copy_and_runs_over_four_gpus(monkeypatch):
    """The registry's transfer rule carries a several-device op unchanged: an all-reduce
    over g_0..g_3 (one per GPU, in place, as NCCLAllreduce is written) registered as
    Transfer(ANYWHERE, LIKE_INPUT, move) whose emulated move sums on the host. Each GPU
    ends with the sum; each link carries its 128 bytes once each way."""
    from placer.ops.registry import movement_cost
    from placer.ops.registry import ANYWHERE, LIKE_INPUT, OpDef, Transfer

    def allreduce(transfers, inputs, args):
        host = transfers.host
        total = sum(transfers.copy(x, src, host) for x, src in zip(inputs, transfers.sources))
        return tuple(transfers.copy(total, host, dst) for dst in transfers.targets)

    def infer_all(inputs, args):
        return list(inputs)

    monkeypatch.setitem(registry._REGISTRY, "TestAllreduce",
                        OpDef("TestAllreduce", infer_all, None, movement_cost,
                              transfer=Transfer(ANYWHERE, LIKE_INPUT, allreduce)))
    net = pb.NetDef(name="ar", external_input=["x"], external_output=[f"g_{i}" for i in range(4)])
    for i in range(4):
        op = net.op.add(type="CopyCPUToGPU", input=["x"], output=[f"x_{i}"])
        op.device_option.device_type, op.device_option.device_id = 1, i
        op = net.op.add(type="Scale", input=[f"x_{i}"], output=[f"g_{i}"])
        op.arg.add(name="scale", f=float(i + 1))
        op.device_option.device_type, op.device_option.device_id = 1, i
    op = net.op.add(type="TestAllreduce", input=[f"g_{i}" for i in range(4)], output=[f"g_{i}" for i in range(4)])
    op.device_option.device_type = 1
    ex = Executor(net_from_netdef(net), emulate_gpus=4)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = ex.run({"x": x})
    for i in range(4):
        np.testing.assert_array_equal(out[f"g_{i}"], x * (1 + 2 + 3 + 4))
    reduce = ex.record.ops[-1]
    assert reduce.device == "emulated-cuda:0" and reduce.copy_direction == "mixed" and reduce.copy_bytes == 8 * 128
    assert ex.record.link_bytes() == {**{f"cpu->emulated-cuda:{i}": 256 for i in range(4)},
                                      **{f"emulated-cuda:{i}->cpu": 128 for i in range(4)}}


# -- the corpus: nets that run today, placed at random over the four GPUs ------------------

@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORPUS_CASES))
def test_corpus_nets_placed_over_four_gpus_run_like_the_cpu(case, corpus):
    """Every net tests/test_placed_corpus.py runs, its ops spread at random over the CPU and
    the four GPUs (each GPU given an op), against the unplaced net on the CPU."""
    net, feed, want = reference(case)
    rng = np.random.default_rng(sum(map(ord, case)))
    dev = covering_placement(net, rng)
    placed, _ = placed_net(net, dev)
    ex = Executor(placed, emulate_gpus=4)
    got = ex.run(feed, warmup=0)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    movable = sum("gpu" in registry.get(op.type).devices for op in net.ops)
    gpus = {o.device for o in ex.record.ops} - {"cpu"}
    assert len(gpus) == min(4, movable) and (ex.record.copy_bytes("d2d") > 0 or movable < 2)


# -- real Caffe2, the same placed nets with every device mapped to the CPU ---------------

CAFFE2_RUN = """
results = []
for case in json.loads(cases_json):
    workspace.ResetWorkspace()
    init, predict = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    text_format.Merge(case["init"], init)
    text_format.Merge(case["predict"], predict)
    workspace.RunNetOnce(init)
    for name in case["feeds"]:
        workspace.FeedBlob(name, inputs[case["id"] + "/" + name])
    workspace.RunNetOnce(predict)
    for name in predict.external_output:
        save(**{case["id"] + "/" + name: workspace.FetchBlob(name)})
    results.append([op.type for op in predict.op])
save_json(results)
"""


def on_the_cpu(proto: pb.NetDef) -> pb.NetDef:
    """Every op on the CPU; every copy a CPU ``Copy`` (Caffe2 has no CUDA here)."""
    out = pb.NetDef()
    out.CopyFrom(proto)
    for op in out.op:
        op.ClearField("device_option")
        if op.type in COPY_TYPES:
            op.type = "Copy"
    return out


@pytest.mark.caffe2
def test_placed_random_nets_mapped_to_the_cpu_give_placers_outputs_in_real_caffe2():
    from google.protobuf import text_format

    from caffe2_oracle import run_caffe2
    rng = np.random.default_rng(8)
    cases, arrays, ours = [], {}, {}
    for trial in range(20):
        net = random_net(rng, int(rng.integers(4, 14)), "given")
        feed = feeds(net, rng)
        placed, p = placed_net(net, random_placement(net, rng))
        assert any(op.type == "Copy" for op in p.predict.op) or trial % 5
        got = Executor(placed, emulate_gpus=4).run(feed)
        case = f"n{trial}"
        cases.append({"id": case, "feeds": sorted(feed),
                      "init": text_format.MessageToString(on_the_cpu(p.init)),
                      "predict": text_format.MessageToString(on_the_cpu(p.predict))})
        arrays.update({f"{case}/{k}": v for k, v in feed.items()})
        ours.update({f"{case}/{k}": v for k, v in got.items()})
    theirs, op_types = run_caffe2(f"cases_json = {json.dumps(json.dumps(cases))}\n" + CAFFE2_RUN, arrays)
    assert set(theirs) == set(ours)
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert sum(types.count("Copy") for types in op_types) > 20


# -- a stand-in for cupy with several GPUs ------------------------------------------------

class FakeCupy:
    """Just enough of cupy for CudaDevice and DeviceSet on ``count`` GPUs, as strict as
    cupy where it matters here: arrays carry ``.device.id``; a ufunc (every elementwise op
    and matmul) on an array of another device than the current one raises, as cupy's
    kernels do; streams belong to the device current when they were made, and ``use()``
    on another device raises (cupy's check_stream_device_match); an event records on a
    stream of its own device only (cudaEventRecord). ``peer[(a, b)]`` answers
    deviceCanAccessPeer; ``log`` lists the calls a test checks the order of."""

    def __init__(self, count: int = 2, peer: bool = True):
        fake = self
        self.count, self.current, self.log, self.pinned_sources = count, 0, [], []
        self.peer = {(a, b): peer for a in range(count) for b in range(count) if a != b}

        class ndarray(np.ndarray):
            device = None  # shadows numpy 2's read-only ndarray.device

            def __array_finalize__(self, obj):
                dev = getattr(obj, "device", None)
                self.device = dev if hasattr(dev, "id") else types.SimpleNamespace(id=fake.current)

            def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kw):
                for x in inputs + (out or ()):
                    if isinstance(x, ndarray) and x.device.id != fake.current:
                        raise ValueError(f"array on device {x.device.id} used while device "
                                         f"{fake.current} is current")
                plain = [x.view(np.ndarray) if isinstance(x, ndarray) else x for x in inputs]
                if out is not None:
                    kw["out"] = tuple(o.view(np.ndarray) for o in out)
                result = getattr(ufunc, method)(*plain, **kw)
                if out is not None:
                    return out[0] if len(out) == 1 else out
                return fake.wrap(result) if isinstance(result, np.ndarray) else result

            def copy(self, order="C"):
                """Onto the current device; from another one only under the rules cupy's
                copy follows (contiguous source), logged with the stream it queues on."""
                if self.device.id != fake.current:
                    assert self.flags.c_contiguous
                    fake.log.append(("peer_copy", self.device.id, fake.current, fake.stream_now()))
                return fake.wrap(np.array(self.view(np.ndarray), copy=True))

            def set(self, arr, stream=None):
                assert isinstance(arr, np.ndarray) and arr.shape == self.shape and arr.dtype == self.dtype
                fake.pinned_sources.append(arr)
                fake.log.append(("h2d", self.device.id, fake.stream_now()))
                np.copyto(self.view(np.ndarray), arr)

            def get(self, stream=None, out=None):
                fake.log.append(("d2h", self.device.id, fake.stream_now()))
                np.copyto(out, self.view(np.ndarray))
                return out

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.device, self.t = fake.current, 0.0

            def record(self, stream=None):
                stream = stream or fake.current_stream[fake.current]
                if stream.device_id not in (-1, self.device):
                    raise RuntimeError("cudaErrorInvalidResourceHandle: event and stream of other devices")
                self.t = time.perf_counter()

            def synchronize(self):
                pass

        class Stream:
            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                self.device_id = -1 if null else fake.current
                fake.log.append(("stream", self.device_id, non_blocking))

            def use(self):
                if self.device_id != fake.current:
                    raise RuntimeError(f"The device that the stream is created on ({self.device_id}) "
                                       f"does not match with the current device ({fake.current})")
                fake.current_stream[self.device_id] = self
                return self

            def record(self, event=None):
                event = event or Event()
                event.record(self)
                fake.log.append(("record", self.device_id, event))
                return event

            def wait_event(self, event):
                fake.log.append(("wait", self.device_id, event))

            def synchronize(self):
                pass

        class Device:
            def __init__(self, index):
                self.index = index

            def use(self):
                fake.current = self.index

            def __enter__(self):
                self.saved, fake.current = fake.current, self.index

            def __exit__(self, *exc):
                fake.current = self.saved

        def can_access_peer(a, b):
            fake.log.append(("can_access_peer", a, b))
            return int(fake.peer[(a, b)])

        def enable_peer_access(peer):
            raise AssertionError("placer must leave deviceEnablePeerAccess to cupy's own copy")

        null = Stream(null=True)
        self.log.clear()
        self.current_stream = {i: null for i in range(count)}
        self.ndarray = ndarray
        self.cuda = types.SimpleNamespace(
            Event=Event, Stream=Stream, Device=Device,
            get_current_stream=lambda: fake.current_stream[fake.current],
            alloc_pinned_memory=lambda n: bytearray(n),
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: count, deviceCanAccessPeer=can_access_peer,
                                          deviceEnablePeerAccess=enable_peer_access))

    def stream_now(self):
        return self.current_stream[self.current]

    def wrap(self, a):
        out = np.asarray(a).view(self.ndarray)
        out.device = types.SimpleNamespace(id=self.current)
        return out

    def is_available(self):
        return True

    def asarray(self, a):
        return self.wrap(np.array(a))

    def empty(self, shape, dtype):
        return self.wrap(np.empty(shape, dtype))

    def ascontiguousarray(self, a):
        if a.device.id != self.current:
            raise ValueError("ascontiguousarray of an array of another device")
        return a if a.flags.c_contiguous else self.wrap(np.ascontiguousarray(a.view(np.ndarray)))

    def __getattr__(self, name):  # every other function is numpy's
        return getattr(np, name)


def two_gpu_chain():
    """x -> Relu on cuda:0 -> FC on cuda:1 (w, b fed) -> Sigmoid on the host."""
    b = NetBuilder("two")
    x, w, bias = b.input("x", (4, 8)), b.input("w", (3, 8)), b.input("b", (3,))
    b.output(b.op("Sigmoid", [b.op("FC", [b.op("Relu", [x], "r"), w, bias], "y")], "s"))
    return net_from_netdef(b.predict)


def run_on_fake(monkeypatch, peer: bool):
    fake = FakeCupy(count=2, peer=peer)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((4, 8)).astype(np.float32), "w": rng.standard_normal((3, 8)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}
    net = two_gpu_chain()
    placed, _ = placed_net(net, [1, 2, 0])
    ex = Executor(placed)
    got = ex.run(feed, iterations=2)
    want = 1 / (1 + np.exp(-(np.maximum(feed["x"], 0) @ feed["w"].T + feed["b"])))
    np.testing.assert_allclose(got["s"], want, rtol=1e-5)
    assert type(got["s"]) is np.ndarray
    return fake, ex


def test_each_gpu_gets_its_own_stream_made_and_used_on_that_gpu(monkeypatch):
    fake, ex = run_on_fake(monkeypatch, peer=True)
    streams = [entry for entry in fake.log if entry[0] == "stream"]
    assert streams == [("stream", 0, True), ("stream", 1, True)]
    assert ex.record.devices == ("cpu", "cuda:0", "cuda:1") and not ex.record.emulated
    assert ex.record.link_bytes() == {"cpu->cuda:0": 128, "cpu->cuda:1": 96 + 12,
                                      "cuda:0->cuda:1": 128, "cuda:1->cpu": 48}


def test_peer_copy_waits_for_the_source_and_the_source_waits_for_it(monkeypatch):
    fake, _ = run_on_fake(monkeypatch, peer=True)
    assert ("can_access_peer", 0, 1) in fake.log
    assert sum(e[0] == "can_access_peer" for e in fake.log) == 1        # asked once per pair
    copies = [i for i, e in enumerate(fake.log) if e[0] == "peer_copy"]
    assert len(copies) == 3                                             # warm-up + 2 runs
    for i in copies:
        written, waited = fake.log[i - 2], fake.log[i - 1]        # cuda:1 waits for cuda:0's writes
        assert written[:2] == ("record", 0) and waited[:2] == ("wait", 1) and waited[2] is written[2]
        _, src, dst, stream = fake.log[i]
        assert (src, dst) == (0, 1) and stream.device_id == 1      # queued on cuda:1's own stream
        read, waited = fake.log[i + 1], fake.log[i + 2]            # cuda:0 waits for the read
        assert read[:2] == ("record", 1) and waited[:2] == ("wait", 0) and waited[2] is read[2]
    assert not [e for e in fake.log if e[0] in ("d2h",) and e[1] == 0]  # nothing staged through the host


def test_without_peer_access_a_gpu_to_gpu_copy_is_staged_through_pinned_host_memory(monkeypatch):
    fake, ex = run_on_fake(monkeypatch, peer=False)
    assert not [e for e in fake.log if e[0] == "peer_copy"]
    staged_out = [e for e in fake.log if e[0] == "d2h" and e[1] == 0]
    assert len(staged_out) == 3 and all(e[2].device_id == 0 for e in staged_out)
    def root(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a.obj if isinstance(a, memoryview) else a
    assert all(isinstance(root(a), bytearray) for a in fake.pinned_sources)   # every H2D from pinned memory
    assert ex.record.link_bytes()["cuda:0->cuda:1"] == 128
    assert [o.copy_direction for o in ex.record.ops if o.type == "Copy"] == ["d2d"]


def test_a_kernel_on_an_array_of_another_gpu_is_refused_by_the_stand_in(monkeypatch):
    """The stand-in's check is real: a net that skips the GPU -> GPU copy never reaches
    the kernel with the wrong device current (the executor refuses it first)."""
    fake = FakeCupy(count=2)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with fake.cuda.Device(0):
        a = fake.asarray(np.ones(3, np.float32))
    with fake.cuda.Device(1), pytest.raises(ValueError, match="device 0 used while device 1"):
        np.maximum(a, 0)
    b = NetBuilder("skip")
    b.output(b.op("Sigmoid", [b.op("Relu", [b.input("x", (4, 8))], "r")], "s"))
    proto = b.predict
    for op, gpu in zip(proto.op, (0, 1)):
        op.device_option.device_type, op.device_option.device_id = 1, gpu
    with pytest.raises(DeviceError, match=r"'s' runs on cuda:1 but its input 'r' is on cuda:0"):
        Executor(net_from_netdef(proto)).run({"x": np.ones((4, 8), np.float32)})


# -- real GPUs ---------------------------------------------------------------------------

def _gpu_count() -> int:
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
def test_random_nets_over_every_visible_gpu_match_the_cpu():
    count = min(_gpu_count(), 4)
    rng = np.random.default_rng(11)
    for _ in range(10):
        net = random_net(rng, int(rng.integers(4, 14)), "given")
        feed = feeds(net, rng)
        want = Executor(net).run(feed)
        placed, _ = placed_net(net, random_placement(net, rng, k=1 + count))
        ex = Executor(placed)
        got = ex.run(feed, iterations=2)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
        assert not ex.record.emulated and all(o.time_s >= 0 for o in ex.record.ops)


@pytest.mark.gpu
def test_two_real_gpus_copy_peer_to_peer_or_staged():
    if _gpu_count() < 2:
        pytest.skip("one GPU visible: the GPU -> GPU path needs two")
    rng = np.random.default_rng(0)
    net = two_gpu_chain()
    feed = {"x": rng.standard_normal((4, 8)).astype(np.float32), "w": rng.standard_normal((3, 8)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32)}
    placed, _ = placed_net(net, [1, 2, 0])
    ex = Executor(placed)
    got = ex.run(feed, iterations=3)
    want = 1 / (1 + np.exp(-(np.maximum(feed["x"], 0) @ feed["w"].T + feed["b"])))
    np.testing.assert_allclose(got["s"], want, rtol=1e-4)
    assert ex.record.link_bytes()["cuda:0->cuda:1"] == 128
    assert {d.stream.device_id for d in ex.devices.all()[1:]} == {0, 1}
