"""Optimizer ops against real Caffe2's ``optimizer.build_*``.

For each model of ``test_training_backward.MODELS`` and each optimizer variant, Caffe2 builds
the train net (AddGradientOperators + the builder) and its init net; placer's builders run
on the exported forward net with the same parameters, and both nets must hold the same ops
(up to the order of independent ops) and the same external inputs.
"""
from __future__ import annotations

import pytest

from placer.formats.caffe2 import params_from_init
from placer.training import add_gradient_ops
from placer.training.optimizers import (
    AdagradOptimizer, OptimizerError, TrainNets, add_weight_decay, build, build_adadelta, build_adagrad,
    build_adam, build_sgd)
from test_training_backward import oracle_model
from test_training_compare import assert_same_ops, parse_net

pytestmark = pytest.mark.caffe2

# Rowwise optimizers: Caffe2 takes them for sparse parameters only, so a model gives its
# tables their own instance (made first) and the dense parameters the plain optimizer.
ROWWISE = """
sparse = [p for p, g in m.param_to_grad.items() if isinstance(g, core.GradientSlice)]
if sparse:
    table_opt = optimizer.{cls}(alpha={lr}, rowWise=True)
    for p in sparse:
        m.get_param_info(p).optimizer = table_opt
optimizer.{build}(m, {lr})
"""

# name -> (Caffe2 code run with the model `m`, placer builder call on TrainNets)
VARIANTS = {
    "sgd": ("optimizer.build_sgd(m, 0.1)", lambda n: build_sgd(n, 0.1)),
    "momentum": ("optimizer.build_sgd(m, 0.1, momentum=0.9, nesterov=False)",
                 lambda n: build_sgd(n, 0.1, momentum=0.9, nesterov=False)),
    "nesterov": ("optimizer.build_sgd(m, 0.1, momentum=0.9)",
                 lambda n: build_sgd(n, 0.1, momentum=0.9)),
    "sgd_step": ("optimizer.build_sgd(m, 0.1, policy='step', stepsize=10, gamma=0.5)",
                 lambda n: build_sgd(n, 0.1, schedule=_schedule("step", stepsize=10, gamma=0.5))),
    "sgd_inv": ("optimizer.build_sgd(m, 0.1, momentum=0.5, policy='inv', gamma=1e-4, power=0.75)",
                lambda n: build_sgd(n, 0.1, momentum=0.5, schedule=_schedule("inv", gamma=1e-4, power=0.75))),
    "weight_decay": ("optimizer.add_weight_decay(m, 5e-4); optimizer.build_sgd(m, 0.05, momentum=0.9)",
                     lambda n: (add_weight_decay(n, 5e-4), build_sgd(n, 0.05, momentum=0.9))),
    "adagrad": ("optimizer.build_adagrad(m, 0.1)", lambda n: build_adagrad(n, 0.1)),
    "adagrad_wd": ("optimizer.build_adagrad(m, 0.1, epsilon=1e-6, weight_decay=0.01)",
                   lambda n: build_adagrad(n, 0.1, epsilon=1e-6, weight_decay=0.01)),
    "rowwise_adagrad": (ROWWISE.format(cls="AdagradOptimizer", build="build_adagrad", lr=0.1),
                        lambda n: build_adagrad(n, 0.1, rowwise=True)),
    "adam": ("optimizer.build_adam(m, 0.01)", lambda n: build_adam(n, 0.01)),
    "adam_betas": ("optimizer.build_adam(m, 0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, policy='exp', gamma=0.9)",
                   lambda n: build_adam(n, 0.01, beta1=0.8, beta2=0.99, epsilon=1e-6,
                                        schedule=_schedule("exp", gamma=0.9))),
    "adadelta": ("optimizer.build_adadelta(m, 1.0, epsilon=1e-6, decay=0.9)",
                 lambda n: build_adadelta(n, 1.0, epsilon=1e-6, decay=0.9)),
    "rowwise_adam": (ROWWISE.format(cls="AdamOptimizer", build="build_adam", lr=0.01),
                     lambda n: build_adam(n, 0.01, rowwise=True)),
}

CASES = [
    ("mlp", "sgd"), ("mlp", "momentum"), ("mlp", "nesterov"), ("mlp", "sgd_step"), ("mlp", "sgd_inv"),
    ("mlp", "adagrad"), ("mlp", "adam"), ("mlp", "adam_betas"), ("mlp", "weight_decay"),
    ("mlp", "rowwise_adagrad"), ("mlp", "adadelta"), ("sparse", "adadelta"),
    ("lenet", "nesterov"), ("lenet", "weight_decay"), ("lenet", "adagrad_wd"),
    ("spatial_bn", "momentum"), ("spatial_bn", "adam"),
    ("sparse", "sgd"), ("sparse", "momentum"), ("sparse", "adagrad"), ("sparse", "adagrad_wd"),
    ("sparse", "rowwise_adagrad"), ("sparse", "adam"), ("sparse", "rowwise_adam"),
    ("sparse", "weight_decay"),
    ("mlp_gpu1", "nesterov"), ("mlp_gpu1", "adam"), ("mlp_gpu1", "weight_decay"),
    ("shared_table", "nesterov"), ("shared_table", "rowwise_adagrad"), ("shared_table", "rowwise_adam"),
]


def _schedule(policy, **args):
    from placer.training.optimizers import LearningRateSchedule
    return LearningRateSchedule(policy, args)


def placer_train_nets(result: dict) -> TrainNets:
    """The forward net Caffe2 exported, with placer's backward pass, as TrainNets."""
    net, init = parse_net(result["forward"]), parse_net(result["init"])
    grads = add_gradient_ops(net, [result["loss"]])
    params = [p for p in result["params"] if p in grads]
    shapes = {name: t.shape for name, t in params_from_init(init).items()}
    return TrainNets(net, init, params, {p: grads[p] for p in params},
                     weights=result["weights"], param_shapes=shapes)


@pytest.mark.parametrize("model,variant", CASES, ids=[f"{m}-{v}" for m, v in CASES])
def test_optimizer_ops_equal_caffe2s(model, variant):
    code, ours = VARIANTS[variant]
    result = oracle_model(model, after=code)
    nets = placer_train_nets(result)
    ours(nets)
    theirs_net, theirs_init = parse_net(result["net"]), parse_net(result["train_init"])
    assert_same_ops(nets.net.op, theirs_net.op, f"{model}/{variant} train net")
    assert_same_ops(nets.init.op, theirs_init.op, f"{model}/{variant} init net")
    assert list(nets.net.external_input) == list(theirs_net.external_input)


def test_weight_decay_refuses_a_sparse_gradient():
    nets = placer_train_nets(oracle_model("sparse"))
    nets.weights = ["emb"]
    from placer.training.optimizers import WeightDecayBuilder
    with pytest.raises(OptimizerError, match="'emb'.*sparse"):
        build(nets, WeightDecayBuilder(nets, 1e-4), params=["emb"])


def test_rowwise_adagrad_refuses_a_dense_gradient_as_caffe2_does():
    nets = placer_train_nets(oracle_model("mlp"))
    with pytest.raises(OptimizerError, match="rowwise Adagrad needs a sparse gradient"):
        build(nets, AdagradOptimizer(nets, 0.1, rowwise=True))


def test_adagrad_weight_decay_needs_the_parameter_shape():
    nets = placer_train_nets(oracle_model("mlp"))
    nets.param_shapes.pop("fc1_w")
    with pytest.raises(OptimizerError, match="'fc1_w': its shape is unknown"):
        build_adagrad(nets, 0.1, weight_decay=0.01)
