"""Generated train nets load through placer: every op type has a registry entry and shape
inference types every blob (the init net is inferred first; its outputs feed the train net).

These tests need the gradient and optimizer operators (FCGradient, MomentumSGDUpdate,
LearningRate, AtomicIter, Adagrad, Adam, ...) in placer's op registry, which are added in
``placer/ops`` separately; until they are there, the tests fail on the first check with the
list of op types that have no entry, and are marked xfail (not strict) for that reason.
Remove the mark once they pass.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from placer.cli import main
from placer.formats.caffe2 import load_netdef, net_from_netdef
from placer.ops import registry
from placer.shapes import infer, require_complete
from placer.types import TensorType

DATA = Path(__file__).parent / "data" / "training"

REGISTRY_PENDING = pytest.mark.xfail(
    reason="gradient/optimizer op types (FCGradient, MomentumSGDUpdate, LearningRate, "
           "AtomicIter, CreateMutex, Adagrad, Adam, ...) have no entry in placer's op registry "
           "yet; they are added in placer/ops separately", strict=False)

INPUTS = {
    "mlp": {"data": TensorType((4, 6)), "label": TensorType((4,), "int32")},
    "dlrm": {"indices": TensorType((10,), "int64"), "lengths": TensorType((4,), "int32"),
             "dense": TensorType((4, 3)), "label": TensorType((4,), "int32")},
}


def typed_train_net(train_path: Path, init_path: Path, inputs: dict):
    """Infer the init net, then the train net with the init net's outputs as known blobs."""
    init = load_netdef(init_path)
    train = load_netdef(train_path)
    missing = sorted({op.type for op in (*init.op, *train.op) if registry.get(op.type) is None})
    assert not missing, f"op types without an entry in placer's op registry: {', '.join(missing)}"
    init_types = infer(net_from_netdef(init, path=str(init_path)))
    known = {b: t for b, t in init_types.blobs.items() if t is not None}
    net = net_from_netdef(train, path=str(train_path), fed=[*known, *inputs])
    return require_complete(infer(net, {**known, **inputs}))


@REGISTRY_PENDING
@pytest.mark.parametrize("model,opt", [("mlp", "sgd"), ("mlp", "nesterov"), ("dlrm", "rowwise-adagrad"),
                                       ("dlrm", "adam")])
def test_train_nets_load_and_every_blob_gets_a_shape(tmp_path, model, opt):
    out = tmp_path / "out"
    assert main(["train-net", str(DATA / f"{model}_predict_net.pbtxt"), "--loss", "loss",
                 "--optimizer", opt, "--lr", "0.1", "-o", str(out)]) == 0
    typed = typed_train_net(out / "train_net.pbtxt", out / "train_init_net.pbtxt", INPUTS[model])
    params = [b for b in load_netdef(DATA / f"{model}_init_net.pbtxt").op for b in b.output]
    for p in params:  # a gradient has its parameter's shape
        grad = typed.blobs.get(f"{p}_grad")
        if grad is not None:
            assert grad.shape == typed.blobs[p].shape, p


@REGISTRY_PENDING
@pytest.mark.corpus
def test_solver_train_net_loads(tmp_path, corpus):
    solver = tmp_path / "solver.prototxt"
    solver.write_text('base_lr: 0.01\nmomentum: 0.9\nlr_policy: "multistep"\ngamma: 0.1\n'
                      'stepvalue: 100\nstepvalue: 200\nweight_decay: 0.0005\n')
    out = tmp_path / "out"
    assert main(["convert", str(corpus / "caffe" / "mnist_lenet_train_test.prototxt"), "--solver",
                 str(solver), "--input", "data=4,1,28,28", "-o", str(out)]) == 0
    typed_train_net(out / "train_net.pbtxt", out / "train_init_net.pbtxt",
                    {"data": TensorType((4, 1, 28, 28)), "label": TensorType((4,), "int32")})


def test_the_registry_check_names_the_missing_types(tmp_path):
    """The check itself: a made-up op type is reported by name."""
    net = tmp_path / "net.pbtxt"
    net.write_text('op { input: "x" output: "y" type: "NoSuchGradientOp" }\nexternal_input: "x"\n')
    init = tmp_path / "init.pbtxt"
    init.write_text('op { output: "x" type: "ConstantFill" arg { name: "shape" ints: 2 } }\n')
    with pytest.raises(AssertionError, match="registry: NoSuchGradientOp"):
        typed_train_net(net, init, {})
