"""A placed train net does what its plan priced: state lives where it is updated, and a
device that only reads it gets a fresh copy at the top of every run (never a copy the init
net made once, which the first update would leave stale).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_training_plan import dense_net, machine, typed

from placer.formats.caffe2 import net_from_netdef
from placer.rewrite.netdef import place
from placer.runtime.executor import Executor
from placer.runtime.inputs import random_inputs

FORWARD_ON_GPU = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]     # updates (and the decay) on the CPU
UPDATES_ON_GPU = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]     # the rest on the CPU


@pytest.fixture(scope="module")
def tn():
    b = dense_net()
    for name in ("w_momentum", "bias_momentum", "lr"):   # as Caffe2's generators list them
        if name not in b.predict.external_input:
            b.predict.external_input.append(name)
    return typed(b)


def run_once(net, emulate: bool, inputs):
    ex = Executor(net, emulate_gpu=emulate)
    ex.run_init()
    return ex.run(inputs, iterations=1, warmup=0)


@pytest.mark.parametrize("dev,src,dst,copy", [(FORWARD_ON_GPU, "cpu", "cuda:0", "CopyCPUToGPU"),
                                              (UPDATES_ON_GPU, "cuda:0", "cpu", "CopyGPUToCPU")],
                         ids=["updates-on-cpu", "updates-on-gpu"])
def test_state_read_away_from_its_home_is_copied_at_the_top_of_every_run(tn, dev, src, dst, copy):
    placed = place(tn.net, dev, machine(1))
    top = [(op.type, op.input[0], op.output[0]) for op in placed.predict.op[:2]]
    suffix = "_gpu_0" if dst == "cuda:0" else "_cpu"
    assert sorted(top) == [(copy, "bias", "bias" + suffix), (copy, "w", "w" + suffix)]
    readers = [op for op in placed.predict.op if op.type in ("FC", "FCGradient")]
    assert all("w" + suffix in op.input and "w" not in op.input for op in readers)
    updates = [op for op in placed.predict.op if op.type == "MomentumSGDUpdate"]
    assert [op.output[2] for op in updates] == ["w", "bias"]            # updated in place at home
    home = 1 if src == "cuda:0" else 0
    fills = {op.output[0]: op.device_option.device_type for op in placed.init.op}
    assert fills["w"] == fills["bias"] == home                          # made where it is updated
    assert not any(op.type.startswith("Copy") and op.input[0] in ("w", "bias") for op in placed.init.op)
    assert {(c[0], c[1], c[2]) for c in placed.copies} >= {("w", src, dst), ("bias", src, dst)}


def test_a_placed_train_step_runs_emulated_and_computes_the_cpu_loss(tn):
    inputs = random_inputs(tn.net, tn.blobs, ["x", "label"], seed=0)
    cpu_out = run_once(tn.net, False, inputs)
    for dev in (FORWARD_ON_GPU, UPDATES_ON_GPU):
        placed = place(tn.net, dev, machine(1))
        out = run_once(net_from_netdef(placed.predict, placed.init, path="placed"), True, inputs)
        np.testing.assert_allclose(out["loss"], cpu_out["loss"], rtol=1e-6)


@pytest.mark.parametrize("dev", [FORWARD_ON_GPU, UPDATES_ON_GPU], ids=["updates-on-cpu", "updates-on-gpu"])
def test_a_placed_train_net_trains_like_the_cpu_over_several_steps(tn, dev):
    """The per-run copies carry each step's update to the devices that read the state:
    after four steps every parameter and momentum equals the all-CPU run's (a copy made
    once by the init net would have frozen the readers' weights at their initial values)."""
    inputs = random_inputs(tn.net, tn.blobs, ["x", "label"], seed=1)

    def trained(net, emulate):
        ex = Executor(net, emulate_gpu=emulate)
        ex.run_init()
        ex.run(inputs, iterations=4, warmup=0)
        return ex.host_state()
    want = trained(tn.net, False)
    placed = place(tn.net, dev, machine(1))
    got = trained(net_from_netdef(placed.predict, placed.init, path="placed"), True)
    for name in ("w", "bias", "w_momentum", "bias_momentum"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(want["w"], initial_w(tn))


def initial_w(tn):
    ex = Executor(tn.net)
    ex.run_init()
    return ex.host_state()["w"]
