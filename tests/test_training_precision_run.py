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
from placer.training.loss_scaling import DynamicScale
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


# ---------------------------------------------------------------- dynamic loss scaling

def _dynamic_run(precision: str, steps: list, window: int = 2):
    """The mlp with Adam and dynamic loss scaling from 2**10: per step, the state after it."""
    predict, init = load_netdef(DATA / "mlp_predict_net.pbtxt"), load_netdef(DATA / "mlp_init_net.pbtxt")
    net = net_from_netdef(predict, init, path="mlp")
    net.input_shapes.update({"data": TensorType((4, 6)), "label": TensorType((4,), "int32")})
    # Adam's epsilon 1e-3, not its 1e-8 default: the step lr * m / (sqrt(v) + eps) then moves
    # by at most lr / eps = 10 times a change of the gradient (at 1e-8, a gradient near 0
    # whose sign a BLAS build's rounding flips would move its weight by 2 lr)
    r = make_train_nets(net, ["loss"], OptimizerChoice("adam", 0.01, precision=precision, weight_decay=1e-3,
                                                       epsilon=1e-3, dynamic_scale=DynamicScale(1024.0, window)))
    ex = Executor(net_from_netdef(r.train, r.init))
    ex.run_init()
    states = [ex.host_state()]           # the initial state, then the state after each step
    for k in range(len(steps)):
        ex.run(lambda s: steps[k], iterations=1, warmup=0)
        states.append(ex.host_state())
    return r, states


def _steps(overflow_at: int, n: int = 6):
    rng = np.random.default_rng(3)
    steps = [{"data": rng.standard_normal((4, 6)).astype(np.float32),
              "label": rng.integers(0, 3, 4).astype(np.int32)} for _ in range(n)]
    steps[overflow_at]["data"][1, 2] = np.inf     # an inf input: NaN gradients for this step
    return steps


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # the inf input
@pytest.mark.parametrize("precision", ["fp32", "amp-fp16"])
def test_dynamic_loss_scale_skips_the_step_of_an_overflow_and_halves_then_grows(precision):
    steps = _steps(overflow_at=3)
    r, states = _dynamic_run(precision, steps)
    states = states[1:]
    scales = [float(s["loss_scale"]) for s in states]
    # window 2: doubles after steps 2 (1024 -> 2048); step 4 overflows: halves (1024),
    # the count restarts; doubles again after two more good steps
    assert scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 2048.0]
    state = [p for p in r.params] + [r.masters[p] for p in r.masters]
    moments = [b for b in states[0] if b.endswith("_moment")]
    for b in state + moments:            # the overflowed step changed no parameter, no state
        np.testing.assert_array_equal(states[3][b], states[2][b], err_msg=b)
        assert np.all(np.isfinite(states[3][b])), b
    for b in ("fc1_w", "fc2_w"):         # and the good steps did
        assert not np.array_equal(states[4][b], states[3][b])


ORACLE_DYNAMIC = """
spec = json.loads({spec!r})
train, init = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
text_format.Parse(spec["train"], train)
text_format.Parse(spec["init"], init)
workspace.RunNetOnce(init)
for name in spec["start"]:              # placer's initial values: random fills differ
    workspace.FeedBlob(name, inputs["start/" + name])
for k in range(spec["steps"]):
    workspace.FeedBlob("data", inputs["data%d" % k])
    workspace.FeedBlob("label", inputs["label%d" % k])
    if k == 0:
        workspace.CreateNet(train)      # its ops need their inputs to exist
    workspace.RunNet(train.name)
    save(**{{"%d/%s" % (k, b): workspace.FetchBlob(b) for b in spec["watch"]}})
"""


@pytest.mark.caffe2
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_dynamic_loss_scaling_runs_in_caffe2_as_in_placer():
    """The fp32 mlp (Caffe2's CPU build has every op) with dynamic scaling, an overflow at
    step 3: Caffe2 and placer keep the same scale and skip the same step (exactly: the scale
    is a power of two, the counts small integers). The parameters and moments come from two
    BLAS builds whose float32 gradients differ by rounding (~1e-7 relative); Adam with eps
    1e-3 moves a weight by at most lr / eps = 10 times that per step, so after six steps they
    agree within the project's comparison of Caffe2 runs (test_training_run_caffe2.assert_close:
    rtol 1e-4, atol 1e-4 of the blob's largest value): measured, the largest difference uses 0.3% of it."""
    import json
    from google.protobuf import text_format
    from caffe2_oracle import run_caffe2
    from test_training_run_caffe2 import assert_close
    steps = _steps(overflow_at=3)
    r, states = _dynamic_run("fp32", steps)
    start, states = states[0], states[1:]
    watch = ["loss_scale", "loss_scale_good_steps", "fc1_w", "fc2_w", "fc1_w_first_moment"]
    spec = {"train": text_format.MessageToString(r.train), "init": text_format.MessageToString(r.init),
            "steps": len(steps), "watch": watch, "start": sorted(r.params)}
    feeds = {f"{n}{k}": v for k, s in enumerate(steps) for n, v in s.items()}
    feeds.update({f"start/{p}": start[p] for p in r.params})
    saved, _ = run_caffe2(ORACLE_DYNAMIC.format(spec=json.dumps(spec)), feeds)
    for k, state in enumerate(states):
        assert float(saved[f"{k}/loss_scale"]) == float(state["loss_scale"]), k
        assert float(saved[f"{k}/loss_scale_good_steps"]) == float(state["loss_scale_good_steps"]), k
        for b in watch[2:]:
            assert_close(state[b], saved[f"{k}/{b}"], f"{k}/{b}")


# ---------------------------------------------------------------- placed, and a transformer

@pytest.mark.corpus
def test_a_placed_amp_fp16_net_over_an_emulated_gpu_trains_as_the_unplaced_one():
    """LeNet amp-fp16 with Adam, placed on a forced CPU/GPU mix that crosses devices both ways
    (tests/test_training_run_placed.py's ``forced_mix``: state stays with its update), run with
    the GPU emulated (an op handed a blob on the wrong device fails): the same kernels on the
    same values in the same process, so the parameters equal the unplaced run's exactly."""
    from placer.rewrite.netdef import place
    from placer.runtime.state import trained_init_net
    from test_training_run_placed import MACHINE, forced_mix
    m = model("lenet")
    net = m.net()
    net.input_shapes.update(m.inputs)
    r, ex = _executor(net, ["loss"], initial_values("lenet"), optimizer="adam", lr=1e-3,
                      precision="amp-fp16")
    start = net_from_netdef(r.train, trained_init_net(r.init, ex.host_state()))
    placement = forced_mix(start)
    placed = place(start, placement, MACHINE)
    assert {(src, dst) for _, src, dst, _ in placed.copies} == {("cpu", "cuda:0"), ("cuda:0", "cpu")}
    assert "float16" in _copied_dtypes(start, placed, m.inputs)          # half blobs cross devices
    steps = batches(m, 3)
    states = []
    for netdef, init, emulate in ((r.train, trained_init_net(r.init, ex.host_state()), False),
                                  (placed.predict, placed.init, True)):
        run = Executor(net_from_netdef(netdef, init), emulate_gpu=emulate)
        run.run(lambda s: steps[s], iterations=3, warmup=0)
        states.append(run.host_state())
    for p in list(r.params) + list(r.masters.values()):
        np.testing.assert_array_equal(states[0][p], states[1][p], err_msg=p)


def _copied_dtypes(net, placed, inputs) -> set[str]:
    from placer.shapes import infer
    types = infer(net, inputs).blobs
    return {types[b].dtype for b, _, _, _ in placed.copies if types.get(b) is not None}


def test_a_two_layer_gpt2_trains_20_steps_in_amp_fp16_as_in_fp32():
    """gpt2-tiny (2 blocks, width 32, 8 tokens, vocabulary 50) with Adam on one fixed batch:
    both runs fall from log(50) (3.93 -> 1.81) and stay within 1% of each other at every
    step (measured: at most 9.2e-5 relative). The half forward rounds each op to 2**-11 and
    this net has no ReLU whose kink a rounding could cross (Gelu is smooth), so the runs
    stay together, unlike LeNet's."""
    from placer.examples import gpt2
    cfg = gpt2.preset("gpt2-tiny")
    b = gpt2.build(cfg)
    net = net_from_netdef(b.predict, b.init, path="gpt2_tiny")
    net.input_shapes.update({k: TensorType(tuple(s), d) for k, (d, s) in b.value_info.items()})
    batch = gpt2.feeds(cfg)
    start = Executor(net_from_netdef(b.predict, b.init))
    start.run_init()
    init = start.host_state()
    fp32, _, _ = _train(net, ["loss"], init, [batch] * 20, optimizer="adam", lr=3e-3)
    amp, _, _ = _train(net, ["loss"], init, [batch] * 20, optimizer="adam", lr=3e-3, precision="amp-fp16")
    assert fp32[0] == pytest.approx(np.log(cfg.vocab), rel=0.05)
    assert fp32[-1] < 0.8 * fp32[0] and amp[-1] < 0.8 * amp[0]
    assert np.all(np.abs(amp - fp32) <= 0.01 * fp32), (amp, fp32)
