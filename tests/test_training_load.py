"""Generated train nets load through placer: every op type has a registry entry and shape
inference types every blob (the init net is inferred first; its outputs feed the train net).

The gradient of a Concat is a Split that reads the Concat's split_info blob, and the
gradient of a Reshape is a Reshape that reads the old shape: their output shapes come
from those blobs' values, which inference knows from shapes alone (``TensorType.values``).
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
    if model == "dlrm":  # the Split of Concat's gradient: each part has its input's shape
        for blob in ("pooled", "bot"):
            assert typed.blobs[f"{blob}_grad"] == typed.blobs[blob] == TensorType((4, 4)), blob


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


def test_reshape_gradient_takes_its_shape_from_the_old_shape_blob(tmp_path):
    """Reshape's gradient reshapes dY back with the forward op's old_shape output; both
    Reshape's forms (shape argument, shape blob from a Concat's split_info) give it."""
    net = tmp_path / "net.pbtxt"
    net.write_text("""
op { input: "a" input: "b" output: "ab" output: "ab_dims" type: "Concat" arg { name: "axis" i: 0 } }
op { input: "x" input: "ab_dims" output: "y" output: "x_shape" type: "Reshape" }
op { input: "y" output: "z" output: "y_shape" type: "Reshape" arg { name: "shape" ints: -1 } }
op { input: "dz" input: "y_shape" output: "dy" output: "_dy_dims" type: "Reshape" }
op { input: "dy" input: "x_shape" output: "dx" output: "_dx_dims" type: "Reshape" }
op { input: "dab" input: "ab_dims" output: "da" output: "db" type: "Split" arg { name: "axis" i: 0 } }
external_input: "a" external_input: "b" external_input: "x" external_input: "dz" external_input: "dab"
""")
    typed = require_complete(infer(net_from_netdef(load_netdef(net), path=str(net)), {
        "a": TensorType((2,)), "b": TensorType((3,)), "x": TensorType((6,)), "dz": TensorType((6,)),
        "dab": TensorType((5,))}))
    assert typed.blobs["y"].shape == (2, 3)
    assert typed.blobs["dy"].shape == (2, 3) and typed.blobs["dx"].shape == (6,)
    assert typed.blobs["da"].shape == (2,) and typed.blobs["db"].shape == (3,)
