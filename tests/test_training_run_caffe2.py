"""Training in placer's executor equals training in real Caffe2 (torch 1.8.1's caffe2.python).

For LeNet and AlexNet (the corpus's Caffe train_val prototxts, converted), a ResNet-style
net with SpatialBN in training mode and the tiny DLRM with sparse tables
(tests/training_models.py): the train net ``placer train-net`` writes holds the ops Caffe2's
``AddGradientOperators`` and optimizer builder write for the same forward net, and placer's
executor, trained from the same initial parameters on the same batches, gives
- every parameter's gradient after the first step (dense, and the rows of a sparse one),
- every parameter and optimizer state blob, the iteration counter and SpatialBN's running
  statistics after 5 steps of SGD with (Nesterov) momentum, Adagrad (dense, and rowwise
  sparse on the DLRM's tables) and Adam,
within rtol 1e-4 (entries smaller than 1e-4 of their array's largest compared absolutely
at that level: float32 sums in another order). Adagrad and Adam run with a larger
epsilon than their default, in both systems (see training_models.OPTIMIZERS for why).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from test_training_compare import assert_same_ops
from training_models import batches, choice, initial_values, model, oracle_train, parse
from placer.formats.caffe2 import net_from_netdef
from placer.runtime.executor import Executor
from placer.training.recipe import make_train_nets

pytestmark = pytest.mark.caffe2

STEPS = 5
RUNS = {"lenet": ["nesterov", "adagrad", "adam"], "alexnet": ["nesterov", "adagrad", "adam"],
        "resnet": ["nesterov", "momentum", "adagrad", "adam"],
        "dlrm": ["nesterov", "adagrad", "rowwise-adagrad", "adam"]}
CASES = [(m, o) for m, opts in RUNS.items() for o in opts]


@lru_cache(maxsize=None)
def caffe2_run(name: str):
    m = model(name)
    return oracle_train(m, RUNS[name], batches(m, STEPS), initial_values(name))


@lru_cache(maxsize=None)
def placer_run(name: str, opt: str):
    """placer's train net for ``opt``, trained: (train net, init net, step-1 values, state)."""
    m = model(name)
    made = make_train_nets(m.net(), [m.loss], choice(opt))
    _, info = caffe2_run(name)
    grads = [b for names in info[opt]["grads"].values() for b in names]
    ex = Executor(net_from_netdef(made.train, made.init))
    ex.run_init()
    ex.load_state(initial_values(name))
    first: dict = {}
    data = batches(m, STEPS)
    ex.run(lambda step: data[step], iterations=STEPS, warmup=0, watch=grads,
           on_step=lambda step, values: first.update(values) if step == 1 else None)
    return made.train, made.init, first, ex.host_state()


def assert_close(got, want, what: str) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    scale = float(np.abs(want).max()) if want.size and want.dtype.kind == "f" else 0.0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("name,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_train_net_is_the_one_caffe2_writes(name, opt):
    _, info = caffe2_run(name)
    train, init, _, _ = placer_run(name, opt)
    theirs = parse(info[opt]["train"])
    assert_same_ops(train.op, theirs.op, f"{name}/{opt} train net")
    assert_same_ops(init.op, parse(info[opt]["init"]).op, f"{name}/{opt} init net")
    assert list(train.external_input) == list(theirs.external_input)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_gradients_equal_caffe2s(name):
    opt = "adam"       # Adam leaves the gradient blobs as the backward pass wrote them
    arrays, info = caffe2_run(name)
    _, _, first, _ = placer_run(name, opt)
    grads = info[opt]["grads"]
    assert grads, "no parameter got a gradient"
    for param, names in grads.items():
        for blob in names:
            assert_close(first[blob], arrays[f"{opt}/grad/{blob}"], f"{name}: gradient {blob} of {param}")


@pytest.mark.parametrize("name,opt", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_state_after_five_steps_equals_caffe2s(name, opt):
    arrays, _ = caffe2_run(name)
    _, init, _, state = placer_run(name, opt)
    want = {k.split("/", 2)[2]: v for k, v in arrays.items() if k.startswith(f"{opt}/state/")}
    made = {o for op in init.op for o in op.output if op.type != "CreateMutex"}
    assert made == set(want), sorted(made ^ set(want))
    before = initial_values(name)
    for blob, value in want.items():
        assert_close(state[blob], value, f"{name}/{opt}: {blob} after {STEPS} steps")
    changed = [p for p in before if p in want and not np.array_equal(want[p], before[p])]
    assert len(changed) >= len(before) // 2, "training changed too few blobs to tell anything"
    assert int(state["optimizer_iteration"][0]) == STEPS
