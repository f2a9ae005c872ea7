"""Writes the small nets in this folder with real Caffe2 (torch 1.8.1's caffe2.python).

Run with the Caffe2 python (see tests/caffe2_oracle.py), from anywhere:

    ~/.cache/placer-caffe2-venv/bin/python tests/data/training/make_nets.py

- ``mlp_predict_net.pbtxt`` / ``mlp_init_net.pbtxt``: brew FC-Relu-FC-SoftmaxWithLoss;
- ``dlrm_predict_net.pbtxt`` / ``dlrm_init_net.pbtxt``: a SparseLengthsSum embedding table
  and a dense FC, concatenated, FC, SoftmaxWithLoss;
- ``expected/<model>_<optimizer>_{train_net,train_init_net}.pbtxt``: what Caffe2 writes with
  ``AddGradientOperators(["loss"])`` and the builder ``placer train-net --optimizer
  <optimizer>`` mirrors (arguments in ``EXPECTED``).
"""
import os

from caffe2.python import brew, core, model_helper, optimizer
from caffe2.python.modeling import initializers
from google.protobuf import text_format

HERE = os.path.dirname(os.path.abspath(__file__))


def mlp():
    m = model_helper.ModelHelper(name="mlp")
    h = brew.fc(m, "data", "fc1", dim_in=6, dim_out=8)
    h = brew.relu(m, h, h)
    h = brew.fc(m, h, "fc2", dim_in=8, dim_out=3)
    m.net.SoftmaxWithLoss([h, "label"], ["softmax", "loss"])
    return m


def dlrm():
    m = model_helper.ModelHelper(name="dlrm")
    emb = m.create_param("emb", shape=[50, 4],
                         initializer=initializers.Initializer("UniformFill", min=-0.1, max=0.1))
    pooled = m.net.SparseLengthsSum([emb, "indices", "lengths"], "pooled")
    dense = brew.fc(m, "dense", "bot", dim_in=3, dim_out=4)
    both = brew.concat(m, [pooled, dense], "both", axis=1)
    top = brew.fc(m, both, "top", dim_in=8, dim_out=2)
    m.net.SoftmaxWithLoss([top, "label"], ["softmax", "loss"])
    return m


def rowwise(cls, build, lr):
    def run(m):
        sparse = [p for p, g in m.param_to_grad.items() if isinstance(g, core.GradientSlice)]
        if sparse:
            table_opt = getattr(optimizer, cls)(alpha=lr, rowWise=True)
            for p in sparse:
                m.get_param_info(p).optimizer = table_opt
        getattr(optimizer, build)(m, lr)
    return run


# (model, --optimizer, Caffe2 code); the CLI arguments are in tests/test_training_cli.py.
EXPECTED = [
    ("mlp", "sgd", lambda m: optimizer.build_sgd(m, 0.1)),
    ("mlp", "nesterov", lambda m: (optimizer.add_weight_decay(m, 1e-4),
                                   optimizer.build_sgd(m, 0.1, momentum=0.9, policy="step",
                                                       stepsize=100, gamma=0.5))),
    ("dlrm", "rowwise-adagrad", rowwise("AdagradOptimizer", "build_adagrad", 0.05)),
    ("dlrm", "adam", lambda m: optimizer.build_adam(m, 0.01)),
]


def write(path, net):
    with open(path, "w") as f:
        f.write(text_format.MessageToString(net.Proto()))


def main():
    os.makedirs(os.path.join(HERE, "expected"), exist_ok=True)
    models = {"mlp": mlp, "dlrm": dlrm}
    for name, make in models.items():
        m = make()
        write(os.path.join(HERE, f"{name}_predict_net.pbtxt"), m.net)
        write(os.path.join(HERE, f"{name}_init_net.pbtxt"), m.param_init_net)
    for name, opt, build in EXPECTED:
        optimizer._optimizer_instance_count.clear()  # as in a fresh process, like the CLI
        m = models[name]()
        m.AddGradientOperators(["loss"])
        build(m)
        stem = os.path.join(HERE, "expected", f"{name}_{opt}")
        write(f"{stem}_train_net.pbtxt", m.net)
        write(f"{stem}_train_init_net.pbtxt", m.param_init_net)


if __name__ == "__main__":
    main()
