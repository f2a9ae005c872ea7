"""Caffe solvers turned into Caffe2 train nets, run in real Caffe2.

The expected values come from Caffe itself, re-implemented here from BVLC caffe's
``sgd_solver.cpp`` / ``adagrad_solver.cpp`` / ``adadelta_solver.cpp`` / ``adam_solver.cpp``
(``caffe_rate`` and ``CaffeUpdate`` below), never from placer: the learning rate of every
iteration for each policy, and the parameters after each update given the gradients the
net computed (fetched from a run of the forward + backward part alone).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from placer.training.solver import SolverError, solver_train_nets
from placer.types import TensorType

LENET = "caffe/mnist_lenet_train_test.prototxt"  # in the corpus
ALEXNET = "caffe/bvlc_alexnet_train_val.prototxt"

# A small net with every kind of multiplier: decay_mult 2 and 0, lr_mult 0.5, 0 and 2.
TINY = """
name: "tiny"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
        param { lr_mult: 1 decay_mult: 2 } param { lr_mult: 0.5 decay_mult: 0 }
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "fc1" top: "fc1" }
layer { name: "fc2" type: "InnerProduct" bottom: "fc1" top: "fc2"
        param { lr_mult: 0 } param { lr_mult: 2 }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc2" bottom: "label" top: "loss" }
"""
TINY_MULTS = {"fc1_w": (1.0, 2.0), "fc1_b": (0.5, 0.0), "fc2_w": (0.0, 1.0), "fc2_b": (2.0, 1.0)}

RUNNER = """
spec = json.loads(spec_json)
nets = {}
for name, text in spec["nets"].items():
    nets[name] = text_format.Parse(text, caffe2_pb2.NetDef())
for step in spec["steps"]:
    if step[0] == "feed":
        workspace.FeedBlob(step[1], inputs[step[2]])
    elif step[0] == "run":
        workspace.RunNetOnce(nets[step[1]])
    else:
        save(**{step[2]: np.array(workspace.FetchBlob(step[1]))})
save_json("ok")
"""


def run_program(nets: dict, steps: list, inputs: dict) -> dict:
    """Run nets (NetDefs) in real Caffe2 by steps: ("feed", blob, key), ("run", net),
    ("fetch", blob, key); returns the fetched arrays."""
    spec = {"nets": {k: text_format.MessageToString(v) for k, v in nets.items()}, "steps": steps}
    return run_caffe2(f"spec_json = {json.dumps(json.dumps(spec))}\n" + RUNNER, inputs)[0]


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def solver_text(**fields) -> str:
    lines = []
    for key, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"{key}: {json.dumps(v) if isinstance(v, str) else v}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Caffe, re-implemented

def caffe_rate(it: int, s: dict) -> float:
    """SGDSolver::GetLearningRate at iter_ = it (multistep advances one step per call)."""
    base, policy = s["base_lr"], s["lr_policy"]
    if policy == "fixed":
        return base
    if policy == "step":
        return base * s["gamma"] ** (it // s["stepsize"])
    if policy == "exp":
        return base * s["gamma"] ** it
    if policy == "inv":
        return base * (1 + s["gamma"] * it) ** (-s["power"])
    if policy == "multistep":
        step = 0
        for i in range(it + 1):
            if step < len(s["stepvalue"]) and i >= s["stepvalue"][step]:
                step += 1
        return base * s["gamma"] ** step
    if policy == "poly":
        return base * (1 - it / s["max_iter"]) ** s["power"]
    if policy == "sigmoid":
        return base * (1 / (1 + math.exp(-s["gamma"] * (it - s["stepsize"]))))
    raise ValueError(policy)


class CaffeUpdate:
    """Caffe's ApplyUpdate for one parameter: regularise, then the solver's update."""

    def __init__(self, solver: dict, lr_mult: float, decay_mult: float):
        self.s, self.lr_mult, self.decay_mult = solver, lr_mult, decay_mult
        self.h = self.h2 = None

    def step(self, it: int, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        s, w, g = self.s, w.astype(np.float64), g.astype(np.float64)
        rate = caffe_rate(it, s) * self.lr_mult
        diff = g + s.get("weight_decay", 0.0) * self.decay_mult * w
        if self.h is None:
            self.h, self.h2 = np.zeros_like(w), np.zeros_like(w)
        kind, mu, delta = s.get("type", "SGD"), s.get("momentum", 0.0), s.get("delta", 1e-8)
        if kind == "SGD":
            self.h = mu * self.h + rate * diff
            return w - self.h
        if kind == "Nesterov":
            prev = self.h.copy()
            self.h = mu * self.h + rate * diff
            return w - ((1 + mu) * self.h - mu * prev)
        if kind == "AdaGrad":
            self.h += diff * diff
            return w - rate * diff / (np.sqrt(self.h) + delta)
        if kind == "AdaDelta":
            self.h = mu * self.h + (1 - mu) * diff * diff
            update = diff * np.sqrt(self.h2 + delta) / np.sqrt(self.h + delta)
            self.h2 = mu * self.h2 + (1 - mu) * update * update
            return w - rate * update
        if kind == "Adam":
            b1, b2, t = mu, s.get("momentum2", 0.999), it + 1
            self.h = b1 * self.h + (1 - b1) * diff
            self.h2 = b2 * self.h2 + (1 - b2) * diff * diff
            correction = math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            return w - rate * correction * self.h / (np.sqrt(self.h2) + delta)
        raise ValueError(kind)


def tiny_inputs(seed: int = 0, batch: int = 4) -> dict:
    rng = np.random.default_rng(seed)
    return {"data": rng.normal(size=(batch, 5)).astype(np.float32),
            "label": rng.integers(0, 3, size=batch).astype(np.int32)}


def gradient_net(result):
    net = type(result.train)()
    net.CopyFrom(result.train)
    del net.op[result.gradient_ops_end:]
    return net


def check_updates_against_caffe(tmp_path, solver: dict, iterations: int = 3, atol: float = 2e-6):
    """Run the tiny net's train net; before each iteration fetch the gradients (from the
    forward + backward part) and the parameters, then compare the parameters after the
    update with Caffe's update of the same gradients."""
    sp = write(tmp_path, "solver.prototxt", solver_text(**solver))
    result = solver_train_nets(write(tmp_path, "tiny.prototxt", TINY), sp)
    steps = [("feed", "data", "data"), ("feed", "label", "label"), ("run", "init")]
    for it in range(iterations):
        steps += [("run", "grad")]
        steps += [("fetch", p, f"w{it}_{p}") for p in TINY_MULTS]
        steps += [("fetch", f"{p}_grad", f"g{it}_{p}") for p in TINY_MULTS]
        steps += [("run", "train")]
    steps += [("fetch", p, f"w{iterations}_{p}") for p in TINY_MULTS]
    out = run_program({"init": result.init, "grad": gradient_net(result), "train": result.train},
                      steps, tiny_inputs())
    for p, (lr_mult, decay_mult) in TINY_MULTS.items():
        caffe = CaffeUpdate(solver, lr_mult, decay_mult)
        for it in range(iterations):
            expected = caffe.step(it, out[f"w{it}_{p}"], out[f"g{it}_{p}"])
            np.testing.assert_allclose(out[f"w{it + 1}_{p}"], expected, rtol=1e-4, atol=atol,
                                       err_msg=f"{solver.get('type', 'SGD')}: {p} after iteration {it}")
        moved = not np.array_equal(out[f"w0_{p}"], out[f"w{iterations}_{p}"])
        assert moved == (lr_mult != 0), f"{p} (lr_mult {lr_mult}) moved: {moved}"
    return result


# ---------------------------------------------------------------- the learning rate per policy

POLICY_SOLVERS = {
    "fixed": dict(lr_policy="fixed"),
    "step": dict(lr_policy="step", stepsize=3, gamma=0.5),
    "exp": dict(lr_policy="exp", gamma=0.9),
    "inv": dict(lr_policy="inv", gamma=0.1, power=0.75),
    "multistep": dict(lr_policy="multistep", gamma=0.1, stepvalue=[2, 3, 6]),
    "poly": dict(lr_policy="poly", power=2.0, max_iter=10),
    "sigmoid": dict(lr_policy="sigmoid", gamma=-0.8, stepsize=4),
}


@pytest.mark.caffe2
@pytest.mark.corpus
def test_lenet_learning_rate_follows_caffes_formula_for_every_policy(tmp_path, corpus):
    iterations, nets, steps = 8, {}, [("feed", "data", "data"), ("feed", "label", "label")]
    params = None
    for policy, fields in POLICY_SOLVERS.items():
        solver = dict(base_lr=0.01, momentum=0.9, weight_decay=5e-4, **fields)
        sp = write(tmp_path, f"{policy}.prototxt", solver_text(**solver))
        result = solver_train_nets(corpus / LENET, sp, input_shapes={"data": TensorType((2, 1, 28, 28))})
        (lr,) = result.lr_blobs
        params = result.params
        nets[f"{policy}_init"], nets[f"{policy}_train"] = result.init, result.train
        steps += [("run", f"{policy}_init")]
        steps += [("fetch", p, f"{policy}_start_{p}") for p in params]
        for it in range(iterations):
            steps += [("run", f"{policy}_train"), ("fetch", lr, f"{policy}_lr{it}")]
        steps += [("fetch", p, f"{policy}_end_{p}") for p in params]
    rng = np.random.default_rng(1)
    inputs = {"data": rng.normal(size=(2, 1, 28, 28)).astype(np.float32),
              "label": np.array([3, 7], np.int32)}
    out = run_program(nets, steps, inputs)
    for policy, fields in POLICY_SOLVERS.items():
        solver = dict(base_lr=0.01, **fields)
        got = [float(out[f"{policy}_lr{it}"].reshape(-1)[0]) for it in range(iterations)]
        want = [caffe_rate(it, solver) for it in range(iterations)]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=policy)
        for p in params:
            assert not np.array_equal(out[f"{policy}_start_{p}"], out[f"{policy}_end_{p}"]), (policy, p)


# ---------------------------------------------------------------- the update itself

@pytest.mark.caffe2
@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "AdaDelta", "Adam"])
def test_updates_equal_caffes_with_lr_mult_and_decay_mult(tmp_path, kind):
    solver = {"SGD": dict(momentum=0.9), "Nesterov": dict(momentum=0.9), "AdaGrad": dict(delta=1e-6),
              "AdaDelta": dict(momentum=0.95, delta=1e-6, base_lr=1.0),
              "Adam": dict(momentum=0.9, momentum2=0.999, delta=1e-8, base_lr=0.01)}[kind]
    base = dict(type=kind, base_lr=0.1, lr_policy="step", stepsize=2, gamma=0.5, weight_decay=0.01)
    check_updates_against_caffe(tmp_path, {**base, **solver})


@pytest.mark.caffe2
def test_l1_regularization_and_plain_sgd(tmp_path):
    solver = dict(base_lr=0.1, lr_policy="inv", gamma=0.1, power=0.75, weight_decay=0.01,
                  regularization_type="L1")
    sp = write(tmp_path, "solver.prototxt", solver_text(**solver))
    result = solver_train_nets(write(tmp_path, "tiny.prototxt", TINY), sp)
    assert "Sign" in {op.type for op in result.train.op}
    # Caffe's L1: diff += wd * decay_mult * sign(W); plain SGD: W -= rate * diff.
    steps = [("feed", "data", "data"), ("feed", "label", "label"), ("run", "init"), ("run", "grad")]
    steps += [("fetch", p, f"w_{p}") for p in TINY_MULTS] + [("fetch", f"{p}_grad", f"g_{p}") for p in TINY_MULTS]
    steps += [("run", "train")] + [("fetch", p, f"w1_{p}") for p in TINY_MULTS]
    out = run_program({"init": result.init, "grad": gradient_net(result), "train": result.train},
                      steps, tiny_inputs())
    for p, (lr_mult, decay_mult) in TINY_MULTS.items():
        w, g = out[f"w_{p}"], out[f"g_{p}"]
        want = w - 0.1 * lr_mult * (g + 0.01 * decay_mult * np.sign(w))
        np.testing.assert_allclose(out[f"w1_{p}"], want, rtol=1e-5, atol=1e-7, err_msg=p)


@pytest.mark.caffe2
def test_clip_gradients_scales_by_the_global_norm(tmp_path):
    solver = dict(base_lr=0.1, lr_policy="fixed", clip_gradients=0.05)
    sp = write(tmp_path, "solver.prototxt", solver_text(**solver))
    result = solver_train_nets(write(tmp_path, "tiny.prototxt", TINY), sp)
    steps = [("feed", "data", "data"), ("feed", "label", "label"), ("run", "init"), ("run", "grad")]
    steps += [("fetch", p, f"w_{p}") for p in TINY_MULTS] + [("fetch", f"{p}_grad", f"g_{p}") for p in TINY_MULTS]
    steps += [("run", "train")] + [("fetch", p, f"w1_{p}") for p in TINY_MULTS]
    out = run_program({"init": result.init, "grad": gradient_net(result), "train": result.train},
                      steps, tiny_inputs())
    learned = [p for p, (lr_mult, _) in TINY_MULTS.items() if lr_mult]  # Caffe computes no diff for lr_mult 0
    norm = math.sqrt(sum(float((out[f"g_{p}"].astype(np.float64) ** 2).sum()) for p in learned))
    assert norm > 0.05, "the test needs a gradient norm above the clip"
    for p, (lr_mult, _) in TINY_MULTS.items():
        want = out[f"w_{p}"] - 0.1 * lr_mult * out[f"g_{p}"] * (0.05 / norm)
        np.testing.assert_allclose(out[f"w1_{p}"], want, rtol=1e-5, atol=1e-7, err_msg=p)


@pytest.mark.caffe2
def test_iter_size_accumulates_like_one_big_batch(tmp_path):
    """iter_size 2 over two halves of a batch = iter_size 1 over the batch (the loss is a
    mean over the batch, and Caffe divides the summed gradients by iter_size)."""
    net8 = TINY.replace("dim: 4 dim: 5", "dim: 8 dim: 5").replace("shape { dim: 4 }", "shape { dim: 8 }")
    solver = dict(base_lr=0.1, momentum=0.9, lr_policy="fixed", weight_decay=0.01)
    big = solver_train_nets(write(tmp_path, "tiny8.prototxt", net8),
                            write(tmp_path, "s1.prototxt", solver_text(**solver)))
    acc = solver_train_nets(write(tmp_path, "tiny.prototxt", TINY),
                            write(tmp_path, "s2.prototxt", solver_text(iter_size=2, **solver)))
    assert big.update is None and acc.update is not None
    both = tiny_inputs(5, batch=8)
    inputs = {"data": both["data"], "label": both["label"], "data_a": both["data"][:4],
              "label_a": both["label"][:4], "data_b": both["data"][4:], "label_b": both["label"][4:]}
    shapes = {"fc1_w": (6, 5), "fc1_b": (6,), "fc2_w": (3, 6), "fc2_b": (3,)}
    rng = np.random.default_rng(6)  # the same start for both (fill ops draw unseeded)
    inputs.update({f"w0_{p}": rng.normal(size=s).astype(np.float32) for p, s in shapes.items()})
    start = [("feed", p, f"w0_{p}") for p in shapes]
    steps = [("feed", "data", "data"), ("feed", "label", "label"), ("run", "big_init"), *start, ("run", "big")]
    steps += [("fetch", p, f"big_{p}") for p in TINY_MULTS]
    steps += [("run", "acc_init"), *start]
    for half in "ab":
        steps += [("feed", "data", f"data_{half}"), ("feed", "label", f"label_{half}"), ("run", "acc")]
    steps += [("run", "update")] + [("fetch", p, f"acc_{p}") for p in TINY_MULTS]
    steps += [("fetch", f"{p}_grad_acc", f"zero_{p}") for p in TINY_MULTS]
    out = run_program({"big_init": big.init, "big": big.train, "acc_init": acc.init,
                       "acc": acc.train, "update": acc.update}, steps, inputs)
    for p in TINY_MULTS:
        np.testing.assert_allclose(out[f"acc_{p}"], out[f"big_{p}"], rtol=1e-5, atol=1e-7, err_msg=p)
        assert not out[f"zero_{p}"].any(), f"{p}_grad_acc not reset after the update"


@pytest.mark.caffe2
@pytest.mark.corpus
@pytest.mark.slow
def test_alexnet_trains_two_iterations_in_caffe2(tmp_path, corpus):
    solver = dict(base_lr=0.01, lr_policy="step", gamma=0.1, stepsize=1, momentum=0.9,
                  weight_decay=5e-4)
    sp = write(tmp_path, "solver.prototxt", solver_text(**solver))
    result = solver_train_nets(corpus / ALEXNET, sp, input_shapes={"data": TensorType((1, 3, 227, 227))})
    (lr,) = result.lr_blobs
    assert len(result.params) == 16
    # The file's multipliers: weights lr 1 / decay 1, biases lr 2 / decay 0.
    scaled = {op.input[2] for op in result.train.op if op.type == "MomentumSGDUpdate" and op.input[3].endswith("_b")}
    assert scaled == {f"{lr}_lr_mult_2"}
    decayed = {op.input[0] for op in result.train.op if op.type == "WeightedSum"}
    assert decayed == {f"{p}_grad" for p in result.params if p.endswith("_w")}
    watch = ["conv1_w", "fc8_b"]
    rng = np.random.default_rng(2)
    steps = [("feed", "data", "data"), ("feed", "label", "label"), ("run", "init")]
    steps += [("fetch", p, f"start_{p}") for p in watch]
    for it in range(2):
        steps += [("run", "train"), ("fetch", lr, f"lr{it}")]
    steps += [("fetch", p, f"end_{p}") for p in watch] + [("fetch", "loss", "loss")]
    out = run_program({"init": result.init, "train": result.train}, steps,
                      {"data": rng.normal(size=(1, 3, 227, 227)).astype(np.float32),
                       "label": np.array([17], np.int32)})
    np.testing.assert_allclose([float(out["lr0"]), float(out["lr1"])],
                               [caffe_rate(0, solver), caffe_rate(1, solver)], rtol=1e-6)
    assert np.isfinite(out["loss"]).all()
    for p in watch:
        assert not np.array_equal(out[f"start_{p}"], out[f"end_{p}"]), p


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("fields,message", [
    (dict(type="RMSProp", base_lr=0.1, lr_policy="fixed"), "type: RMSProp has no Caffe2 equivalent"),
    (dict(base_lr=0.1, lr_policy="triangular"), "lr_policy: unknown policy 'triangular'"),
    (dict(base_lr=0.1), "lr_policy: missing"),
    (dict(lr_policy="fixed"), "base_lr: missing"),
    (dict(base_lr=0.1, lr_policy="step", gamma=0.1), "stepsize: missing"),
    (dict(base_lr=0.1, lr_policy="multistep", gamma=0.1, stepvalue=[5, 3]), "stepvalue: \\[5, 3\\] must increase"),
    (dict(base_lr=0.1, lr_policy="poly", power=1.0, max_iter=0), "max_iter: 0 is not positive"),
    (dict(type="AdaGrad", base_lr=0.1, lr_policy="fixed", momentum=0.9), "momentum: AdaGrad takes no momentum"),
    (dict(base_lr=0.1, lr_policy="fixed", regularization_type="L3"), "regularization_type: 'L3'"),
    (dict(base_lr=0.1, lr_policy="fixed", iter_size=0), "iter_size: 0 is not a positive"),
])
def test_a_solver_setting_without_equivalent_names_file_and_field(tmp_path, fields, message):
    sp = write(tmp_path, "solver.prototxt", solver_text(**fields))
    with pytest.raises(SolverError, match=f"solver.prototxt: {message}"):
        solver_train_nets(write(tmp_path, "tiny.prototxt", TINY), sp)


def test_a_loss_weight_the_converter_drops_is_refused(tmp_path):
    net = TINY.replace('type: "SoftmaxWithLoss"', 'type: "EuclideanLoss" loss_weight: 0.5')
    sp = write(tmp_path, "solver.prototxt", solver_text(base_lr=0.1, lr_policy="fixed"))
    with pytest.raises(SolverError, match="layer 'loss' \\(EuclideanLoss\\): loss_weight 0.5"):
        solver_train_nets(write(tmp_path, "tiny.prototxt", net), sp)


@pytest.mark.corpus
def test_open_input_shapes_are_asked_for(tmp_path, corpus):
    sp = write(tmp_path, "solver.prototxt", solver_text(base_lr=0.1, lr_policy="fixed"))
    with pytest.raises(SolverError, match="--input"):
        solver_train_nets(corpus / LENET, sp)


def test_a_net_given_as_solver_is_a_parse_error_with_a_hint(tmp_path):
    from placer.errors import NetParseError
    with pytest.raises(NetParseError, match="tiny.prototxt:2:1: not a valid Caffe solver.*give it as the net"):
        solver_train_nets(write(tmp_path, "net.prototxt", TINY), write(tmp_path, "tiny.prototxt", TINY))


@pytest.mark.corpus
def test_convert_solver_gives_the_train_net_its_own_phases_input_shapes(tmp_path, corpus, capsys):
    """LeNet's train_test file feeds 64 images a batch in TRAIN and 100 in TEST: the
    folder's value_info.json is the converted (TEST) net's, so the train net gets its own
    train_net.value_info.json (label at 64), and convert -> plan -> run works with no flag."""
    from placer import cli
    sp = write(tmp_path, "solver.prototxt", solver_text(base_lr=0.01, momentum=0.9, lr_policy="fixed"))
    out = tmp_path / "out"
    assert cli.main(["convert", str(corpus / LENET), "--solver", sp, "--input", "data=64,1,28,28",
                     "-o", str(out)]) == 0
    train_shapes = json.loads((out / "train_net.value_info.json").read_text())
    assert train_shapes == {"data": [1, [64, 1, 28, 28]], "label": [2, [64]]}
    assert json.loads((out / "value_info.json").read_text())["label"] == [2, [100]]
    train, init = str(out / "train_net.pbtxt"), str(out / "train_init_net.pbtxt")
    assert cli.main(["plan", train, "--init-net", init, "--machine", "2x-t4-pcie3"]) == 0
    capsys.readouterr()
    assert cli.main(["run", train, "--init-net", init, "--random-inputs", "0", "--iterations", "2",
                     "--loss", "loss"]) == 0
    assert "step 2: loss" in capsys.readouterr().out
