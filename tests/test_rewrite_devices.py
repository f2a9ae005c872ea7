"""Placed nets over several GPUs: the copies Caffe2's own InjectCrossDeviceCopies inserts."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from placer.examples.builder import NetBuilder
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import load_machine
from placer.rewrite.netdef import place


def random_net(rng, n_ops: int, with_params: bool):
    """A random DAG of Relu / Sigmoid / Add / FC over one input, parameters fed as
    inputs (no init net) or made by an init net."""
    b = NetBuilder("r")
    blobs = [b.input("x", (4, 8))]
    w = b.param("w", (8, 8), "XavierFill") if with_params else b.input("w", (8, 8))
    bias = b.param("bias", (8,), "ConstantFill", value=0.1) if with_params else b.input("bias", (8,))
    for i in range(n_ops):
        kind = rng.choice(["Relu", "Sigmoid", "Add", "FC"])
        a = blobs[int(rng.integers(len(blobs)))]
        if kind == "Add":
            c = blobs[int(rng.integers(len(blobs)))]
            blobs.append(b.op("Add", [a, c], f"y{i}"))
        elif kind == "FC":
            blobs.append(b.op("FC", [a, w, bias], f"y{i}"))
        else:
            blobs.append(b.op(str(kind), [a], f"y{i}"))
    b.output(blobs[-1])
    return net_from_netdef(b.predict, b.init if with_params else None)


def _our_copies(placed, machine):
    out = collections.Counter()
    for blob, src, dst, _ in placed.copies:
        out[(blob, src, dst)] += 1
    return out


INJECT = """
import json
dev = json.loads(inputs_json)
net = caffe2_pb2.NetDef()
text_format.Merge(net_text_in, net)
def option(name):
    if name == "cpu":
        return core.DeviceOption(caffe2_pb2.CPU)
    return core.DeviceOption(caffe2_pb2.CUDA, int(name.split(":")[1]))
for op, d in zip(net.op, dev["ops"]):
    op.device_option.CopyFrom(option(d))
new, _ = core.InjectCrossDeviceCopies(core.Net(net), blob_to_device={b: option("cpu") for b in dev["inputs"]})
made = {b: "cpu" for b in dev["inputs"]}
copies = []
for op in new.Proto().op:
    here = "cpu" if op.device_option.device_type == 0 else "cuda:%d" % op.device_option.device_id
    if op.type in ("CopyCPUToGPU", "CopyGPUToCPU", "Copy"):
        src = made[op.input[0]]
        dst = "cpu" if op.type == "CopyGPUToCPU" else here
        copies.append([op.type, here, op.input[0], src, dst, op.output[0]])
        made[op.output[0]] = dst
    else:
        for o in op.output:
            made[o] = here
save_json(copies)
"""


@pytest.mark.caffe2
def test_copies_match_inject_cross_device_copies_on_random_nets():
    """Same op types, source and destination devices, device options and count as
    real Caffe2 for the same device assignment (parameters fed as inputs, outputs left
    where they are made, as InjectCrossDeviceCopies does)."""
    rng = np.random.default_rng(0)
    machine = load_machine("4x-v100-sxm2-nvlink")
    cases = []
    for _ in range(40):
        net = random_net(rng, int(rng.integers(3, 12)), with_params=False)
        dev = rng.integers(0, machine.k, len(net.ops))
        placed = place(net, dev, machine, outputs_on_host=False)
        proto = pb.NetDef()
        proto.CopyFrom(net.proto)
        cases.append((net, dev, placed, text_format.MessageToString(proto)))
    script = "results = []\n" + "\n".join(
        f"inputs_json = {repr(__import__('json').dumps({'ops': [machine.names[d] for d in dev.tolist()], 'inputs': list(net.external_inputs)}))}\n"
        f"net_text_in = {text!r}\n" + INJECT.replace("save_json(copies)", "results.append(copies)")
        for net, dev, placed, text in cases) + "\nsave_json(results)\n"
    _, results = run_caffe2(script)
    for (net, dev, placed, _), theirs in zip(cases, results):
        ours_ops = [(op.type, _where(op)) for op in placed.predict.op if op.type in ("CopyCPUToGPU", "CopyGPUToCPU", "Copy")]
        assert collections.Counter(ours_ops) == collections.Counter((t, here) for t, here, *_ in theirs)
        ours = collections.Counter((blob, src, dst) for blob, src, dst, _ in placed.copies)
        assert ours == collections.Counter((blob, src, dst) for _, _, blob, src, dst, _ in theirs)
        # and the same names: <blob>_gpu_<id> / <blob>_cpu
        assert sorted(name for *_, name in placed.copies) == sorted(out for *_, out in theirs)


def _where(op) -> str:
    return "cpu" if op.device_option.device_type == 0 else f"cuda:{op.device_option.device_id}"


def test_parameters_read_on_several_gpus_are_copied_once_by_the_init_net():
    rng = np.random.default_rng(3)
    machine = load_machine("4x-v100-sxm2-nvlink")
    net = random_net(rng, 10, with_params=True)
    fcs = [op.index for op in net.ops if op.type == "FC"]
    dev = np.ones(len(net.ops), np.int64)
    if len(fcs) >= 2:
        dev[fcs[0]], dev[fcs[1]] = 2, 3
    placed = place(net, dev, machine)
    per_run = [op for op in placed.predict.op if op.type.startswith("Copy") and op.input[0] in ("w", "bias")]
    assert not per_run
    init_copies = [(op.type, op.output[0], _where(op)) for op in placed.init.op if op.type.startswith("Copy")]
    readers = {machine.names[d] for d in dev[fcs].tolist()}
    for blob in ("w", "bias"):
        got = {where for t, out, where in init_copies if out.startswith(blob + "_gpu_")}
        assert got == {d for d in readers if d != "cpu"}
    assert all(t == "CopyCPUToGPU" for t, _, _ in init_copies)
