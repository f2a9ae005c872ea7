"""Clusters without Ray: the cluster model and profiles, hosts-first planning (against brute
force), typical cluster plans (parameter server, pipeline that does not fit one host), the
per-worker split and the plan directory."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cluster_cases import TEN_GBE, chain_net, dp_linear, tiny_cluster
from placement_reference import placements, serial_costs
from placer.cli import main
from placer.hardware.cluster import Network, load_cluster
from placer.planning.cluster_plan import plan_cluster
from placer.errors import PlacerError, ProfileError
from placer.formats import load_net
from placer.partition import partition
from placer.partition.hosts import HostsFirstPartitioner, host_arrays
from placer.partition.problem import serial_cost
from placer.partition.synthetic import random_small
from placer.planning.planner import PlanOptions
from placer.rewrite.netdef import place
from placer.rewrite.workers import one_process, split_workers
from placer.shapes import infer

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "profiles"
EXAMPLES = ROOT / "placer" / "examples" / "data"
MiB = 2 ** 20


def _pinned(name: str, direction: str) -> dict:
    """A shipped GPU profile's pinned curve, read from the file (not through placer)."""
    data = json.loads((PROFILES / f"{name}.json").read_text())
    return data["devices"][0]["link"][direction]["pinned"]


# ------------------------------------------------------------------------ the cluster model

def test_shipped_clusters_name_devices_host_slash_device_with_h0_cpu_first():
    sizes = {"local-2hosts": (2, 3), "2x-dgx-a100-200g": (2, 9), "4x-8gpu-100g": (4, 9)}
    for name, (hosts, per_host) in sizes.items():
        c = load_cluster(name)
        assert c.names[0] == "h0/cpu" and c.k == hosts * per_host
        assert list(c.hosts) == [f"h{i}" for i in range(hosts)]
        for d, dev in enumerate(c.devices):
            assert dev.name.startswith(dev.host + "/") and c.hosts[c.host_of[d]] == dev.host
        assert set(c.links) == {(a, b) for a in range(c.k) for b in range(c.k) if a != b}
    c = load_cluster("local-2hosts")
    assert c.names == ("h0/cpu", "h0/cuda:0", "h0/cuda:1", "h1/cpu", "h1/cuda:0", "h1/cuda:1")
    assert [d.ordinal for d in c.devices] == [0, 0, 1, 0, 0, 1]


def test_network_links_from_the_profile_figures():
    c = load_cluster("local-2hosts")
    nb = float(MiB)
    wire = 5e-5 + nb / 1.17e9                                   # local-2hosts.json network
    d2h, h2d = _pinned("t4-pcie3", "d2h"), _pinned("t4-pcie3", "h2d")
    staged = (d2h["latency_s"] + nb / d2h["bytes_per_s"]) + wire + (h2d["latency_s"] + nb / h2d["bytes_per_s"])
    i = c.index
    assert c.copy_time(nb, i("h0/cpu"), i("h1/cpu")) == pytest.approx(wire, rel=1e-12)
    assert c.copy_time(nb, i("h0/cuda:0"), i("h1/cuda:1")) == pytest.approx(staged, rel=1e-12)
    assert c.copy_time(nb, i("h1/cpu"), i("h0/cuda:1")) == pytest.approx(wire + h2d["latency_s"] + nb / h2d["bytes_per_s"],
                                                                       rel=1e-12)
    # GPUDirect RDMA: one hop at the slower of the network and the GPU's PCIe
    dgx = load_cluster("2x-dgx-a100-200g")
    a100 = _pinned("a100-40gb-sxm4", "d2h")["bytes_per_s"]
    rdma = 9.6e-6 + nb / min(2.35e10, a100)
    assert dgx.copy_time(nb, dgx.index("h0/cuda:3"), dgx.index("h1/cuda:5")) == pytest.approx(rdma, rel=1e-12)
    assert dgx.link(dgx.index("h0/cuda:3"), dgx.index("h1/cuda:5")).kind == "network-rdma"


def test_lanes_a_host_nic_shared_pcie_lanes_per_host_and_local_links_unchanged():
    c = load_cluster("local-2hosts")
    i = c.index
    lanes = lambda a, b: [h.lane for h in c.link(i(a), i(b)).hops]  # noqa: E731
    assert lanes("h0/cpu", "h1/cuda:0")[0] == lanes("h0/cuda:1", "h1/cpu")[1] == "h0/nic:send"
    assert lanes("h1/cpu", "h0/cpu") == ["h1/nic:send"]
    assert lanes("h0/cpu", "h0/cuda:0") != lanes("h1/cpu", "h1/cuda:0")
    host = c.host_machines[1]
    for (a, b), link in host.links.items():
        assert c.link(3 + a, 3 + b).time_s(12345.0) == link.time_s(12345.0)
    assert c.memory_capacity()[[0, 3]].tolist() == [8 * 2 ** 30] * 2     # host-ci-2core
    dgx = load_cluster("2x-dgx-a100-200g")
    assert dgx.memory_capacity()[dgx.index("h1/cpu")] == 2 ** 40        # memory_bytes of the profile


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.pop("network"), "network"),
    (lambda d: d.update(hosts=[{"name": "a", "machine": "2x-t4-pcie3"}, {"name": "a", "machine": "2x-t4-pcie3"}]),
     "unique"),
    (lambda d: d.update(hosts=[{"name": "a/b", "machine": "2x-t4-pcie3"}]), "without '/'"),
    (lambda d: d["network"].update(bytes_per_s=0), "bytes_per_s"),
    (lambda d: d.update(kind="machine"), "not a cluster profile"),
    (lambda d: d.update(hosts=[{"name": "h0"}]), "machine"),
])
def test_bad_cluster_profiles_are_one_line_errors(tmp_path, capsys, edit, words):
    data = json.loads((PROFILES / "clusters" / "local-2hosts.json").read_text())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=words.replace("(", r"\(")):
        load_cluster(path)
    assert main(["plan", str(EXAMPLES / "dlrm_small.pbtxt"), "--cluster", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and "Traceback" not in "".join(err)


# ------------------------------------------------------------------------ hosts-first planning

def _cluster_arrays(rng, n: int):
    """A random small net over 2 hosts x (CPU + 1 GPU) with the cluster's real links."""
    c = tiny_cluster(1)
    arr = random_small(n, rng, gpus=3)
    op_s = arr.op_s[:, [0, 1, 0, 2]] * np.array([1, 1, rng.uniform(0.8, 1.2), 1])
    allowed = arr.allowed[:, [0, 1, 0, 2]]
    tables = c.link_classes()
    return c, replace(arr, op_s=op_s, allowed=allowed, link_class=tables.link_class,
                      class_s=tables.class_seconds(arr.t_bytes), devices=c.names,
                      device_kinds=tuple(d.kind for d in c.devices), lanes=tables.lanes, routes=tables.routes)


def test_hosts_first_against_brute_force_on_small_cluster_nets():
    """20 random nets of 7-8 ops over 2 hosts x (CPU + GPU): every placement enumerated."""
    rng = np.random.default_rng(11)
    gaps = []
    for _ in range(20):
        c, arr = _cluster_arrays(rng, int(rng.integers(7, 9)))
        best = serial_costs(arr, placements(arr)).min()
        plan = HostsFirstPartitioner(partition, c.host_of, [0, 2], c.hosts).partition(arr)
        gaps.append(serial_cost(arr, plan.placement).total_s / best - 1)
    # measured: the optimum on all 20 (never below it, which would be a costing bug)
    assert min(gaps) > -1e-9 and max(gaps) < 1e-9, gaps


def test_host_arrays_collapse_each_host_to_its_fastest_device_and_the_network():
    c, arr = _cluster_arrays(np.random.default_rng(3), 6)
    h = host_arrays(arr, c.host_of, [0, 2], c.hosts)
    for i in range(arr.n_ops):
        for host, devs in ((0, [0, 1]), (1, [2, 3])):
            ok = [d for d in devs if arr.feasible[i, d]]
            assert h.allowed[i, host] == bool(ok)
            if ok:
                assert h.op_s[i, host] == min(arr.op_s[i, d] for d in ok)
    assert (h.class_s[h.link_class[0, 1]] == arr.class_s[arr.link_class[0, 2]]).all()


# ------------------------------------------------------------------------ typical cluster plans

def _typed(name: str):
    return infer(load_net(EXAMPLES / f"{name}.pbtxt"), {})


def test_parameter_server_tables_in_several_hosts_cpu_memory():
    """Embedding tables pinned to CPUs (any host's) with too little memory on one host:
    the tables spread over both hosts' CPU memory, the dense part stays on a GPU."""
    typed = _typed("dlrm_small")
    c = load_cluster("local-2hosts")
    tables = sum(t.nbytes for b, t in typed.net.params.items() if b.startswith("emb"))
    options = PlanOptions(pins=("emb:::sls*=cpu",), host_mem_bytes=0.6 * tables, time_limit_s=1.0)
    result = plan_cluster(typed, c, options)
    dev, names = result.plan.placement, result.arrays.devices
    on = {names[dev[op.index]] for op in typed.net.ops if op.type == "SparseLengthsSum"}
    assert on == {"h0/cpu", "h1/cpu"}
    assert (result.plan.memory_bytes <= result.usable_bytes * (1 + 1e-12)).all()
    fcs = {names[dev[op.index]] for op in typed.net.ops if op.type == "FC"}
    assert all("cuda" in d for d in fcs)


def pipeline_plan():
    """Eight 256x256 FC layers (256 KiB of weights each) on hosts whose GPUs hold two layers
    each and whose CPUs hold none: more than one host's GPUs hold."""
    typed = infer(chain_net(layers=8, width=256), {})
    options = PlanOptions(gpu_mem_bytes=0.55 * MiB, host_mem_bytes=0.05 * MiB, reserve=0.0, time_limit_s=1.0)
    return typed, plan_cluster(typed, load_cluster("local-2hosts"), options)


def test_pipeline_split_of_a_model_that_does_not_fit_one_host():
    typed, result = pipeline_plan()
    names = [result.arrays.devices[d] for d in result.plan.placement]
    assert {n.split("/")[0] for n in names} == {"h0", "h1"}
    assert {n for n in names} == {"h0/cuda:0", "h0/cuda:1", "h1/cuda:0", "h1/cuda:1"}
    changes = sum(a != b for a, b in zip(names, names[1:]))
    assert changes == 3                                   # four stages, each a contiguous run of layers
    assert (result.plan.memory_bytes <= result.usable_bytes * (1 + 1e-12)).all()


def test_unknown_pin_device_and_machine_with_cluster_are_errors(capsys):
    net = str(EXAMPLES / "dlrm_small.pbtxt")
    assert main(["plan", net, "--cluster", "local-2hosts", "--pin", "fc*=h3/cuda:0"]) == 2
    assert "h3/cuda:0" in capsys.readouterr().err
    assert main(["plan", net, "--cluster", "local-2hosts", "--machine", "2x-t4-pcie3"]) == 2
    assert "--cluster already names" in capsys.readouterr().err


# ------------------------------------------------------------------------ the split

def _forced_split(tmp_path=None):
    """dlrm_small over local-2hosts with parts pinned to every device of both hosts."""
    typed = _typed("dlrm_small")
    c = load_cluster("local-2hosts")
    pins = ("bot:::fc0*=h1/cuda:1", "bot:::fc1*=h1/cuda:0", "emb:::sls1*=h1/cpu", "emb:::sls2*=h0/cpu",
            "top:::fc1*=h0/cuda:1", "top:::fc2*=h1/cuda:1")
    return typed, c, plan_cluster(typed, c, PlanOptions(pins=pins))


def test_every_copy_between_hosts_becomes_one_send_and_one_receive_with_one_tag():
    typed, c, result = _forced_split()
    placed = place(typed.net, result.plan.placement, c)
    from placer.rewrite.manifest import placed_types
    types = placed_types(placed.predict, placed.init, typed.blobs, typed.net.data_inputs)
    split = split_workers(placed.predict, placed.init, c, types, typed.net.data_inputs)
    across = [cp for cp in result.plan.copies if cp.src.split("/")[0] != cp.dst.split("/")[0]]
    assert len(split.messages) == len(across) > 0
    # an external output keeps the user's name where it is read back (its maker's copy is renamed)
    sent = sorted((m.received_as if m.received_as in typed.net.external_outputs else m.blob, m.src, m.dst)
                  for m in split.messages)
    assert sent == sorted((cp.tensor, cp.src, cp.dst) for cp in across)
    sends = {w.host: [op for op in w.predict.op if op.type == "SendTensor"] for w in split.workers}
    recvs = {w.host: [op for op in w.predict.op if op.type == "ReceiveTensor"] for w in split.workers}
    for m in split.messages:
        src_host, dst_host = m.src.split("/")[0], m.dst.split("/")[0]
        send = [op for op in sends[src_host] if {a.name: a.i for a in op.arg}["tag"] == m.tag]
        recv = [op for op in recvs[dst_host] if {a.name: a.i for a in op.arg}["tag"] == m.tag]
        assert len(send) == len(recv) == 1
        assert send[0].name.replace("send", "recv") == recv[0].name
        args_s, args_r = {a.name: a.i for a in send[0].arg}, {a.name: a.i for a in recv[0].arg}
        assert args_s["dst"] == c.hosts.index(dst_host) and args_r["src"] == c.hosts.index(src_host)
        assert args_s["raw_buffer"] == args_r["raw_buffer"] == 1
        assert send[0].engine == recv[0].engine == "MPI" and len(recv[0].output) == 3
        assert recv[0].output[0] == recv[0].input[1] == m.received_as
        assert m.nbytes == types[m.blob].nbytes
    for w in split.workers:
        # Caffe2 runs no op with a node_name (net.cc): the worker nets carry none
        assert not any(op.device_option.HasField("node_name") for op in [*w.predict.op, *w.init.op])
        assert w.init.op[0].type == "CreateCommonWorld"
        assert {a.name: a.i for a in w.init.op[0].arg} == {"size": 2, "rank": w.rank}
        # each worker net is whole: every op input exists when the op runs
        from placer.formats.caffe2 import net_from_netdef
        net_from_netdef(w.predict, w.init, fed=w.inputs)
    assert split.workers[0].inputs == [b for b in typed.net.data_inputs if b in split.workers[0].inputs]
    assert split.workers[0].outputs == ["prob_click"] and split.workers[1].inputs == []


def test_one_process_numbers_gpus_across_the_cluster():
    typed, c, result = _forced_split()
    placed = place(typed.net, result.plan.placement, c)
    flat = one_process(placed.predict, c)
    for a, b in zip(placed.predict.op, flat.op):
        host, option = a.device_option.node_name, a.device_option
        want = option.device_id + (2 if host == "h1" and option.device_type == 1 else 0)
        assert b.device_option.device_id == want and not b.device_option.node_name


def test_collectives_across_hosts_become_one_op_per_worker_over_its_own_buffers():
    c = tiny_cluster(1)
    for devices, kind in ((("h0/cuda:0", "h1/cuda:0"), "NCCLAllreduce"), (("h0/cpu", "h1/cpu"), "Allreduce")):
        predict, init, inputs, _, types = dp_linear(devices)
        split = split_workers(predict, init, c, types, list(inputs))
        assert split.collectives == 1
        for w in split.workers:
            ops = [op for op in w.predict.op if op.type == "Allreduce"]
            assert len(ops) == 1 and list(ops[0].input) == ["comm_world", f"r{w.rank}/dW"]
            assert list(ops[0].output) == [f"r{w.rank}/dW"] and ops[0].engine == "MPI"
            assert not any(op.type == kind != "Allreduce" for op in w.predict.op)


def test_on_hosts_copies_what_another_host_reads_and_leaves_collectives_to_the_split():
    """A net over the cluster's GPUs numbered across hosts (as one_process writes it):
    hosts from the GPU numbers, CPU ops on the first host, one Copy per blob read on
    another host (to host memory for an input the op reads there)."""
    from placer.rewrite.workers import on_hosts
    predict, init, inputs, _, types = dp_linear(("h0/cuda:0", "h1/cuda:0"))
    c = tiny_cluster(1)
    flat_predict, flat_init = one_process(predict, c), one_process(init, c)
    back, back_init = on_hosts(flat_predict, flat_init, c, list(inputs))
    hosts = [op.device_option.node_name for op in back.op]
    assert set(hosts) == {"h0", "h1"} and all(op.device_option.device_id == 0 for op in back.op)
    # the original's cross-host copies are copies already: nothing to add, the same ops come back
    assert [op.type for op in back.op] == [op.type for op in predict.op]
    assert [op.device_option.node_name for op in back.op] == [op.device_option.node_name for op in predict.op]
    # a reader on h1 of a blob made on h0 without a copy gets one
    on_h1 = flat_predict.op[-1].device_option           # r1's update: GPU 1 of the cluster, h1/cuda:0
    flat_predict.op.add(type="Relu", input=["r0/y"], output=["late"]).device_option.CopyFrom(on_h1)
    back, _ = on_hosts(flat_predict, flat_init, c, list(inputs))
    copy = back.op[-2]
    assert (copy.type, list(copy.input), copy.device_option.node_name) == ("Copy", ["r0/y"], "h1")
    assert list(back.op[-1].input) == list(copy.output)


def test_a_collective_missing_a_host_or_not_in_place_is_refused():
    c = tiny_cluster(1, hosts=("h0", "h1", "h2"))
    predict, init, inputs, _, types = dp_linear()
    with pytest.raises(PlacerError, match="none is on h2"):
        split_workers(predict, init, c, types, list(inputs))
    c = tiny_cluster(1)
    bad = [op for op in predict.op if op.type == "NCCLAllreduce"][0]
    bad.output[0] = "elsewhere"
    with pytest.raises(PlacerError, match="does not work in place"):
        split_workers(predict, init, c, types, list(inputs))


def test_a_send_without_a_world_says_how_to_run_the_plan():
    from placer.formats import caffe2_pb as pb
    from placer.formats.caffe2 import net_from_netdef
    from placer.runtime.executor import Executor
    netdef = pb.NetDef(name="h0", external_input=["comm_world", "x"])
    send = netdef.op.add(type="SendTensor", input=["comm_world", "x"], engine="MPI", name="send 0: x")
    send.arg.add(name="dst", i=1)
    send.arg.add(name="tag", i=0)
    ex = Executor(net_from_netdef(netdef))
    cw = np.array([1, 0], np.int64)
    with pytest.raises(PlacerError, match="placer run OUTDIR --ray"):
        ex.run({"comm_world": cw, "x": np.ones(3, np.float32)}, iterations=1, warmup=0)


def test_plan_cluster_command_writes_the_directory_and_refuses_a_foreign_one(tmp_path, capsys):
    net = str(EXAMPLES / "dlrm_small.pbtxt")
    out = tmp_path / "plan"
    assert main(["plan", net, "--cluster", "local-2hosts", "--pin", "bot*=h1/cuda:0", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "host h1:" in text and "h1/cuda:0" in text
    m = json.loads((out / "manifest.json").read_text())
    assert [w["host"] for w in m["workers"]] == ["h0", "h1"] and m["world"]["size"] == 2
    assert m["workers"][1]["devices"] == ["h1/cpu", "h1/cuda:0", "h1/cuda:1"]
    for w in m["workers"]:
        assert (out / w["net"]).is_file() and (out / w["init_net"]).is_file()
    doc = json.loads((out / "plan.json").read_text())
    assert any(o["device"] == "h1/cuda:0" for o in doc["ops"])
    # a second plan replaces a plan directory; a directory of other files is refused
    assert main(["plan", net, "--cluster", "local-2hosts", "-o", str(out)]) == 0
    capsys.readouterr()
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert main(["plan", net, "--cluster", "local-2hosts", "-o", str(other)]) == 2
    assert (other / "notes.txt").read_text() == "keep" and not (other / "manifest.json").exists()
    assert "not a previous `cluster-plan` output of placer" in capsys.readouterr().err


def test_network_object_is_what_the_profile_says():
    c = load_cluster("4x-8gpu-100g")
    assert c.network == Network("ethernet-100g", 1.2e10, 2e-5, False, c.network.source)
    assert c.link(c.index("h2/cuda:7"), c.index("h3/cuda:0")).kind == "network-staged"
    assert TEN_GBE.bytes_per_s == 1.17e9


# ------------------------------------------------------------------------ GPU rules (strict cupy stand-in)

STRICT_CHECKED = ("SendTensor", "ReceiveTensor")     # tests/test_ops_gpu_rules.py counts them covered


def test_send_and_receive_keep_to_cupys_rules_kernels_and_moves():
    """The one-device kernels through ``check_gpu_kernel``; the moves with GPU ends on the
    strict stand-in and a loop-back world: a send copies to host memory once, a receive
    writes what arrived onto its GPU, and neither reads the device back on its own."""
    from conftest import require_cupy
    require_cupy()
    from cupy_standin import StrictCupy, check_gpu_kernel
    from test_collectives_ops import StandInGpu, StandInHost
    from placer.ops import registry
    from placer.ops.p2p import world_for_sends
    from placer.types import Args
    cw, x = np.array([1, 0], np.int64), np.arange(12, dtype=np.float32).reshape(4, 3)
    args = Args({"src": 1, "dst": 1, "tag": 7, "raw_buffer": 1}, op="#0 p2p")
    check_gpu_kernel(registry.get("SendTensor"), [cw, x], args)
    check_gpu_kernel(registry.get("ReceiveTensor"), [cw, np.zeros_like(x)], args)

    xp = StrictCupy()

    class Gpu(StandInGpu):
        def to_device(self, a, key=None):
            return xp.wrap(np.array(a, copy=True))

    class Moves:
        def __init__(self, sources, targets):
            self.sources, self.targets, self.host, self.moved = sources, targets, host, []

        def copy(self, array, source, target):
            self.moved.append((source.name, target.name, int(array.nbytes)))
            return np.array(array._a, copy=True) if target is host else xp.wrap(np.array(array, copy=True))

    class LoopBack:
        rank, size, device_names, box = 0, 2, {"standin:0": "h0/cuda:0"}, {}

        def send(self, array, dst, tag, source):
            assert type(array) is np.ndarray
            self.box[(dst, tag)] = (array, source)

        def recv(self, src, tag):
            return self.box.pop((src, tag))

    host, gpu = StandInHost(), Gpu(xp, 0)
    with world_for_sends(LoopBack()):
        send = Moves([host, gpu], [])
        assert registry.get("SendTensor").transfer.move(send, [cw, xp.wrap(x)], args) == ()
        assert send.moved == [("standin:0", "cpu", x.nbytes)]
        recv = Moves([host, gpu], [gpu, gpu, gpu])
        y, src, tag = registry.get("ReceiveTensor").transfer.move(recv, [cw, xp.wrap(np.zeros_like(x))], args)
        np.testing.assert_array_equal(y._a, x)
        assert (int(src._a), int(tag._a)) == (1, 7)
        assert recv.moved == [("cpu", "standin:0", x.nbytes), ("h0/cuda:0", "standin:0", x.nbytes)]
        assert not xp.ledger.syncs, xp.ledger.syncs
