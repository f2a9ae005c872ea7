"""Mixed-precision train nets run in placer's executor against the float32 run.

Real Caffe2's CPU build has no float16 FC, Conv or pool kernels, so it cannot run these
nets; the reference is the float32 train net of the same model from the same initial
values (the fp32 run's parameters, the amp run's masters set to them and its half
parameters to their float16 rounding) on the same batches.

What float16 changes: each half op rounds its result to 11 significant bits (unit roundoff
u = 2**-11 = 4.9e-4), and a pre-activation within that rounding of 0 can land on the other
side of a ReLU's kink. One such flip changes the unit's gradient from its full value to 0:
in LeNet's first step one of 2000 ip1 units flips and moves ip1_w's gradient by 7% (L2),
while the gradients above the kinks (ip2's) differ by 7e-4, u's order. Over 20 steps the
flips add up in the trajectory, not in any one step: the loss of each step is held to 10%
of the fp32 run's (measured: at most 3.7%, LeNet, Nesterov at 0.002).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from placer.formats.caffe2 import load_netdef, net_from_netdef
from placer.runtime.executor import Executor
from placer.training.recipe import OptimizerChoice, make_train_nets
from placer.types import TensorType
from training_models import batches, initial_values, model

DATA = Path(__file__).parent / "data" / "training"


def _executor(net, losses, init: dict, **choice):
    opt, lr = choice.pop("optimizer"), choice.pop("lr")
    r = make_train_nets(net, losses, OptimizerChoice(opt, lr, **choice))
    ex = Executor(net_from_netdef(r.train, r.init))
    ex.run_init()
    state = {}
    for p, v in init.items():
        if p in r.masters:
            state[r.masters[p]] = v
            state[p] = v.astype(np.float16)
        else:
            state[p] = v
    ex.load_state(state)
    return r, ex


def _train(net, losses, init, steps, watch="loss", **choice):
    r, ex = _executor(net, losses, init, **choice)
    seen: list[float] = []
    ex.run(lambda s: steps[s], iterations=len(steps), warmup=0, watch=[watch],
           on_step=lambda s, v: seen.append(float(np.asarray(v[watch], dtype=np.float64).sum())))
    state = ex.host_state()
    return np.array(seen), {p: state[r.masters.get(p, p)].astype(np.float64) for p in r.params}, state


@pytest.mark.corpus
@pytest.mark.slow
def test_lenet_amp_fp16_trains_20_steps_within_tolerance_of_fp32():
    m = model("lenet")
    init, steps = initial_values("lenet"), batches(m, 20)

    def run(**extra):
        net = m.net()
        net.input_shapes.update(m.inputs)
        return _train(net, ["loss"], init, steps, optimizer="nesterov", lr=0.002, **extra)

    fp32, p32, _ = run()
    amp, pamp, state = run(precision="amp-fp16")
    assert np.all(np.abs(amp - fp32) <= 0.1 * np.abs(fp32)), (amp, fp32)
    assert amp[0] == pytest.approx(fp32[0], rel=1e-3)        # step 1: only the rounding of the forward
    assert state["conv1_w"].dtype == np.float16 and state["conv1_w_fp32"].dtype == np.float32
    # the half parameter is its master rounded, after the last update
    np.testing.assert_array_equal(state["conv1_w"], state["conv1_w_fp32"].astype(np.float16))
    for p in p32:                                             # the masters moved as fp32's did
        moved = np.linalg.norm(p32[p] - init[p])
        assert moved > 0 and np.linalg.norm(pamp[p] - init[p]) == pytest.approx(moved, rel=0.5), p


def _tiny_loss_mlp():
    """tests/data/training/mlp with its loss times 1e-6: gradients of ~1e-7, below float16's
    normal range (6.1e-5) and mostly below its smallest subnormal (6e-8)."""
    predict, init = load_netdef(DATA / "mlp_predict_net.pbtxt"), load_netdef(DATA / "mlp_init_net.pbtxt")
    op = predict.op.add(type="Scale", input=["loss"], output=["tiny_loss"])
    op.arg.add(name="scale", f=1e-6)
    net = net_from_netdef(predict, init, path="mlp")
    net.input_shapes.update({"data": TensorType((4, 6)), "label": TensorType((4,), "int32")})
    ex = Executor(net_from_netdef(predict, init))
    ex.run_init()
    rng = np.random.default_rng(7)
    steps = [{"data": rng.standard_normal((4, 6)).astype(np.float32),
              "label": rng.integers(0, 3, 4).astype(np.int32)} for _ in range(5)]
    return net, ex.host_state(), steps


def test_a_static_loss_scale_keeps_gradients_that_float16_would_flush():
    net, init, steps = _tiny_loss_mlp()
    kw = dict(optimizer="sgd", lr=1e4, watch="tiny_loss")      # lr * 1e-7 gradients: steps of 1e-3
    _, p32, _ = _train(net, ["tiny_loss"], init, steps, **kw)
    _, pflush, _ = _train(net, ["tiny_loss"], init, steps, precision="amp-fp16", **kw)
    _, pscaled, _ = _train(net, ["tiny_loss"], init, steps, precision="amp-fp16", loss_scale=65536.0, **kw)
    for p in ("fc1_w", "fc2_w"):
        moved = np.linalg.norm(p32[p] - init[p])
        # unscaled, the half gradients are subnormal or 0: the weights' paths are off by
        # 18% (fc2_w) and 33% (fc1_w) of their length
        assert np.linalg.norm(pflush[p] - p32[p]) > 0.1 * moved, p
        # scaled by 2**16 they are ~6e-3, normal float16 numbers: the fp32 run within the
        # rounding of the half activations and gradients (a few u per layer over 5 steps;
        # measured 4e-4 and 6e-4 of the path)
        assert np.linalg.norm(pscaled[p] - p32[p]) <= 5e-3 * moved, p
