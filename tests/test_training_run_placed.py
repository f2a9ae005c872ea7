"""Placed train nets: a forced CPU/GPU mix trains to the all-CPU run's parameters.

The train net (placer train-net's, for the models of tests/training_models.py) is placed by
``placer.rewrite.netdef.place`` on a mix of the CPU and GPU 0 chosen to cross devices often:
- ops that share state (a parameter and its optimizer state, SpatialBN's running
  statistics: blobs the init net makes and the net writes) form groups that stay on one
  device, as training needs (a parameter is updated where it lives); groups alternate
  between the GPU and the CPU;
- every other op alternates too, so activations and gradients cross in both directions;
- LearningRate and Adam on the GPU read the iteration counter from host memory;
- ops with no GPU kernel stay on the CPU.
Then (1) placer's executor runs the placed net under ``emulate_gpu`` (an op handed a blob
on the wrong device fails) to exactly the parameters of the all-CPU run, and (2) real
Caffe2 runs the same placed nets with every device mapped to the CPU (device options
dropped, CopyCPUToGPU / CopyGPUToCPU as Copy) to the same parameters (rtol 1e-4).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from caffe2_oracle import run_caffe2
from test_training_run_caffe2 import assert_close
from training_models import batches, choice, initial_values, model
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.rewrite.netdef import place
from placer.runtime.executor import Executor
from placer.runtime.state import trained_init_net
from placer.training.recipe import make_train_nets
from placer.hardware.machine import compose_machine
from placer.hardware.profiles import default_profiles
from placer.types import Net

STEPS = 4
CASES = [("resnet", "nesterov"), ("dlrm", "rowwise-adagrad"), ("dlrm", "adam"), ("lenet", "adam")]
CPU, GPU = 0, 1                      # device indices on the CPU + one GPU machine
MACHINE = compose_machine(*default_profiles())


def train_net(name: str, opt: str) -> Net:
    """The train net with an init net that starts from ``initial_values(name)``."""
    m = model(name)
    made = make_train_nets(m.net(), [m.loss], choice(opt))
    ex = Executor(net_from_netdef(made.train, made.init))
    ex.load_state(initial_values(name))
    return net_from_netdef(made.train, trained_init_net(made.init, ex.host_state()))


def forced_mix(net: Net) -> list[int]:
    """A placement that crosses devices often and keeps state with its ops (module doc)."""
    counter = {"optimizer_iteration", "iteration_mutex"}
    written = {o for op in net.ops for o in op.outputs}
    state = [b for b in net.params if b in written and b not in counter]
    group_of_op: dict[int, int] = {}
    group_of_blob: dict[str, int] = {}
    for op in net.ops:                       # ops joined by the state blobs they touch
        touched = [b for b in (*op.inputs, *op.outputs) if b in state]
        groups = {group_of_blob[b] for b in touched if b in group_of_blob}
        g = min(groups) if groups else len(set(group_of_blob.values()) | set(group_of_op.values()))
        for b in touched:
            group_of_blob[b] = g
        if touched:
            group_of_op[op.index] = g
        for other in groups - {g}:           # merge
            for b, h in list(group_of_blob.items()):
                if h == other:
                    group_of_blob[b] = g
            for i, h in list(group_of_op.items()):
                if h == other:
                    group_of_op[i] = g
    cpu_only = {g for i, g in group_of_op.items() if "gpu" not in registry.get(net.ops[i].type).devices}
    order = {g: k for k, g in enumerate(dict.fromkeys(group_of_op[i] for i in sorted(group_of_op)))}
    placement = []
    for op in net.ops:
        if "gpu" not in registry.get(op.type).devices:
            placement.append(CPU)
        elif op.index in group_of_op:
            g = group_of_op[op.index]
            placement.append(CPU if g in cpu_only or order[g] % 2 else GPU)
        elif op.type == "LearningRate":
            placement.append(GPU)
        else:
            placement.append(GPU if op.index % 2 else CPU)
    return placement


def trained(net: Net, name: str, emulate_gpu: bool) -> dict[str, np.ndarray]:
    data = batches(model(name), STEPS)
    ex = Executor(net, emulate_gpu=emulate_gpu)
    ex.run(lambda step: data[step], iterations=STEPS, warmup=1)
    return ex.host_state()


@lru_cache(maxsize=None)
def runs(name: str, opt: str):
    net = train_net(name, opt)
    placement = forced_mix(net)
    placed = place(net, placement, MACHINE)
    placed_net = net_from_netdef(placed.predict, placed.init)
    return net, placement, placed, trained(net, name, False), trained(placed_net, name, True)


def on_the_cpu(netdef: pb.NetDef) -> pb.NetDef:
    """Every device mapped to the CPU: device options dropped, device copies as Copy."""
    out = pb.NetDef()
    out.CopyFrom(netdef)
    out.ClearField("device_option")
    for op in out.op:
        op.ClearField("device_option")
        if op.type in ("CopyCPUToGPU", "CopyGPUToCPU"):
            op.type = "Copy"
    return out


CAFFE2_SCRIPT = """
predict, init = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
predict.ParseFromString(inputs["predict"].tobytes())
init.ParseFromString(inputs["init"].tobytes())      # binary: its GivenTensorFills are big
workspace.RunNetOnce(init)
for step in range(STEPS):
    for name in NAMES:
        workspace.FeedBlob(name, inputs["batch%d/%s" % (step, name)])
    if step == 0:
        workspace.CreateNet(predict)
    workspace.RunNet(predict.name)
for b in OUTPUTS:
    save(**{b: workspace.FetchBlob(b)})
"""


@pytest.mark.parametrize("name,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_the_mix_crosses_devices_both_ways_and_keeps_state_with_its_ops(name, opt):
    net, placement, placed, _, _ = runs(name, opt)
    assert set(placement) == {CPU, GPU}
    directions = {(src, dst) for _, src, dst, _ in placed.copies}
    assert directions == {("cpu", "cuda:0"), ("cuda:0", "cpu")}, directions
    by_type = {op.type: placement[op.index] for op in net.ops}
    assert by_type.get("LearningRate") == GPU and by_type["AtomicIter"] == CPU
    if opt == "adam":
        assert any(placement[op.index] == GPU for op in net.ops if op.type in ("Adam", "SparseAdam"))
    counter_copies = [op for op in placed.predict.op if op.input and op.input[0] == "optimizer_iteration"
                      and op.type.startswith("Copy")]
    assert counter_copies == []              # a host input is read in place, never copied


@pytest.mark.parametrize("name,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_placed_train_net_trains_like_the_cpu_run_under_emulate_gpu(name, opt):
    net, _, _, cpu, emulated = runs(name, opt)
    for blob in net.params:
        if blob != "iteration_mutex":
            np.testing.assert_array_equal(emulated[blob], cpu[blob], err_msg=f"{name}/{opt}: {blob}")
    assert emulated["optimizer_iteration"].tolist() == [STEPS]


@pytest.mark.caffe2
@pytest.mark.parametrize("name,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_placed_train_net_with_devices_on_the_cpu_trains_in_caffe2_like_placer(name, opt):
    net, _, placed, cpu, _ = runs(name, opt)
    names = sorted(model(name).inputs)
    wanted = [b for b in net.params if b != "iteration_mutex"]
    feeds = {f"batch{k}/{n}": v for k, b in enumerate(batches(model(name), STEPS)) for n, v in b.items()}
    for key, netdef in (("predict", placed.predict), ("init", placed.init)):
        feeds[key] = np.frombuffer(on_the_cpu(netdef).SerializeToString(), np.uint8)
    script = f"STEPS = {STEPS}\nNAMES = {names!r}\nOUTPUTS = {wanted!r}\n" + CAFFE2_SCRIPT
    arrays, _ = run_caffe2(script, feeds)
    for blob in wanted:
        assert_close(cpu[blob], arrays[blob], f"{name}/{opt}: {blob} after {STEPS} steps in Caffe2")
