"""The placed NetDef on CPU + one GPU: device options, one copy per tensor per direction,
same outputs (several GPUs: tests/test_rewrite_devices.py, tests/test_runtime_multigpu.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from google.protobuf import text_format

from placer.examples.builder import NetBuilder
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import compose_machine
from placer.hardware.profiles import load_device_profile
from placer.rewrite.netdef import place
from placer.runtime.executor import Executor

CPU, GPU = 0, 1   # device indices of the machine below
MACHINE = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("t4-pcie3", "gpu"))


def fanout_net():
    """x -> FC -> h; h feeds Relu, Sigmoid and Sum (fan-out); w used by two FCs."""
    b = NetBuilder("fanout")
    x = b.input("x", (4, 8))
    w = b.param("w", (8, 8), "XavierFill")
    bias = b.param("bias", (8,), "ConstantFill", value=0.1)
    h = b.op("FC", [x, w, bias], "h")
    r = b.op("Relu", [h], "r")
    s = b.op("Sigmoid", [h], "s")
    t = b.op("Sum", [r, s, h], "t")
    u = b.op("FC", [t, w, bias], "u")
    b.op("Relu", [u], u)  # in place
    b.output(u)
    b.output(s)
    return net_from_netdef(b.predict, b.init)


def run(net, emulate):
    rng = np.random.default_rng(1)
    return Executor(net, emulate_gpu=emulate).run({"x": rng.standard_normal((4, 8)).astype(np.float32)})


def test_every_placement_of_a_fanout_net_gives_the_cpu_outputs():
    net = fanout_net()
    ref = run(net, emulate=False)
    n = len(net.ops)
    # FC(u) and its in-place Relu stay together, as the planner colocates them.
    for bits in itertools.product([CPU, GPU], repeat=n - 1):
        placement = list(bits) + [bits[-1]]
        placed = place(net, placement, MACHINE)
        out = run(net_from_netdef(placed.predict, placed.init), emulate=True)
        for k in ref:
            np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-6)


def test_copies_once_per_tensor_and_direction_with_user_names_kept():
    net = fanout_net()
    # FC(h) on CPU; Relu, Sigmoid on GPU; Sum on CPU; FC(u)+Relu on GPU.
    placement = [CPU, GPU, GPU, CPU, GPU, GPU]
    placed = place(net, placement, MACHINE)
    copies = [(op.type, op.input[0], op.output[0]) for op in placed.predict.op if op.type.startswith("Copy")]
    assert copies.count(("CopyCPUToGPU", "h", "h_gpu_0")) == 1   # h: read by two GPU ops, copied once
    assert ("CopyGPUToCPU", "r", "r_cpu") in copies
    assert ("CopyGPUToCPU", "s_gpu_0", "s") in copies             # external output back under its name
    assert ("CopyGPUToCPU", "u_gpu_0", "u") in copies
    assert ("CopyCPUToGPU", "t", "t_gpu_0") in copies
    assert len(copies) == 5
    for op in placed.predict.op:
        assert op.HasField("device_option")
        if op.type.startswith("Copy"):
            assert (op.device_option.device_type, op.device_option.device_id) == (1, 0)
    # w is used on both devices: filled on the CPU and copied once by the init net, no per-run copy.
    init_ops = [(op.type, op.output[0], op.device_option.device_type) for op in placed.init.op]
    assert ("XavierFill", "w", 0) in init_ops and ("CopyCPUToGPU", "w_gpu_0", 1) in init_ops
    assert ("ConstantFill", "bias", 0) in init_ops
    assert list(placed.predict.external_output) == ["u", "s"]


def test_unchanged_fields_survive_and_input_is_not_modified():
    net = fanout_net()
    net.proto.op[0].engine = "CUDNN"
    net.proto.op[0].debug_info = "kept"
    before = text_format.MessageToString(net.proto)
    placed = place(net, [GPU] * len(net.ops), MACHINE)
    assert text_format.MessageToString(net.proto) == before
    fc = placed.predict.op[1]  # after the copy of x
    assert fc.type == "FC" and fc.engine == "CUDNN" and fc.debug_info == "kept"
    assert placed.predict.op[0].type == "CopyCPUToGPU" and placed.predict.op[0].input[0] == "x"


def test_placement_length_is_checked():
    from placer.errors import PlacerError
    with pytest.raises(PlacerError, match="placement has 1 entries for 6 ops"):
        place(fanout_net(), [CPU], MACHINE)


def test_all_cpu_placement_adds_no_copy():
    placed = place(fanout_net(), [CPU] * 6, MACHINE)
    assert not placed.copies
    assert all(op.device_option.device_type == pb.PROTO_CPU for op in placed.predict.op)
