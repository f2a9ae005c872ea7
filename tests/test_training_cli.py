"""``placer train-net`` and ``placer convert --solver`` from the command line.

The expected train nets in tests/data/training/expected were written by real Caffe2
(tests/data/training/make_nets.py) with the builder each --optimizer mirrors; the files
placer writes must hold the same ops (up to the order of independent ops).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from placer.cli import main
from placer.formats.caffe2 import load_netdef
from test_training_compare import assert_same_ops

DATA = Path(__file__).parent / "data" / "training"

# (model, --optimizer, further arguments): the same builders as make_nets.EXPECTED.
CASES = [
    ("mlp", "sgd", ["--lr", "0.1"]),
    ("mlp", "nesterov", ["--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-4",
                         "--lr-policy", "step", "--lr-arg", "stepsize=100", "--lr-arg", "gamma=0.5"]),
    ("dlrm", "rowwise-adagrad", ["--lr", "0.05"]),
    ("dlrm", "adam", ["--lr", "0.01"]),
]


@pytest.mark.parametrize("model,opt,extra", CASES, ids=[f"{m}-{o}" for m, o, _ in CASES])
def test_train_net_writes_the_nets_caffe2_writes(tmp_path, capsys, model, opt, extra):
    out = tmp_path / "out"
    code = main(["train-net", str(DATA / f"{model}_predict_net.pbtxt"), "--loss", "loss",
                 "--optimizer", opt, *extra, "-o", str(out)])
    assert code == 0
    for name in ("train_net", "train_init_net"):
        ours = load_netdef(out / f"{name}.pbtxt")
        theirs = load_netdef(DATA / "expected" / f"{model}_{opt}_{name}.pbtxt")
        assert_same_ops(ours.op, theirs.op, f"{model}/{opt} {name}")
        if name == "train_net":
            assert list(ours.external_input) == list(theirs.external_input)
    printed = capsys.readouterr().out
    assert f"wrote {out / 'train_net.pbtxt'}" in printed and "rate blob(s)" in printed


def test_binary_outputs_hold_the_same_nets(tmp_path):
    out = tmp_path / "out"
    assert main(["train-net", str(DATA / "mlp_predict_net.pbtxt"), "--loss", "loss",
                 "--optimizer", "adagrad", "--lr", "0.1", "--binary", "-o", str(out)]) == 0
    for name in ("train_net", "train_init_net"):
        assert load_netdef(out / f"{name}.pb") == load_netdef(out / f"{name}.pbtxt")


@pytest.mark.parametrize("args,message", [
    (["--loss", "los", "--optimizer", "sgd", "--lr", "0.1"],
     r"--loss los: no op of the net writes a blob 'los' \(candidates: .*loss"),
    (["--loss", "loss", "--optimizer", "adam", "--lr", "0.1", "--momentum", "0.9"],
     "--momentum applies to --optimizer momentum or nesterov, not adam"),
    (["--loss", "loss", "--optimizer", "sgd", "--lr", "0.1", "--lr-policy", "step", "--lr-arg", "gamma=0.5"],
     "--lr-policy step needs --lr-arg stepsize"),
    (["--loss", "loss", "--optimizer", "sgd", "--lr", "0.1", "--lr-policy", "step",
      "--lr-arg", "stepsize=10", "--lr-arg", "gama=0.5"], "LearningRate has no argument 'gama'"),
    (["--loss", "loss", "--optimizer", "sgd", "--lr", "0.1", "--lr-policy", "triangle"],
     "--lr-policy triangle: not a Caffe2 LearningRate policy"),
    (["--loss", "softmax", "--optimizer", "sgd", "--lr", "0.1"],
     "op SoftmaxWithLoss -> softmax, loss: the gradient of its output 'loss' is not provided"),
])
def test_bad_requests_are_one_line_errors(tmp_path, capsys, args, message):
    import re
    code = main(["train-net", str(DATA / "mlp_predict_net.pbtxt"), *args, "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "o" / "train_net.pbtxt").exists()


def test_a_net_without_init_net_has_no_parameters(tmp_path, capsys):
    lone = tmp_path / "lone.pbtxt"
    lone.write_text((DATA / "mlp_predict_net.pbtxt").read_text())
    code = main(["train-net", str(lone), "--loss", "loss", "--optimizer", "sgd", "--lr", "0.1",
                 "-o", str(tmp_path / "o")])
    assert code == 2
    assert "no parameters: the net comes without an init net" in capsys.readouterr().err


def test_a_loss_that_no_parameter_reaches_is_refused(tmp_path, capsys):
    net = tmp_path / "net_predict.pbtxt"
    net.write_text((DATA / "mlp_predict_net.pbtxt").read_text()
                   + 'op { input: "data" output: "data_mean" type: "AveragedLoss" }\n')
    (tmp_path / "net_init.pbtxt").write_text((DATA / "mlp_init_net.pbtxt").read_text())
    code = main(["train-net", str(net), "--loss", "data_mean", "--optimizer", "sgd", "--lr", "0.1",
                 "-o", str(tmp_path / "o")])
    assert code == 2
    assert "none of the 4 blobs the init net fills gets a gradient from data_mean" in capsys.readouterr().err


def test_outputs_never_overwrite_the_input(tmp_path, capsys):
    net = tmp_path / "train_net.pbtxt"
    net.write_text((DATA / "mlp_predict_net.pbtxt").read_text())
    code = main(["train-net", str(net), "--init-net", str(DATA / "mlp_init_net.pbtxt"), "--loss", "loss",
                 "--optimizer", "sgd", "--lr", "0.1", "-o", str(tmp_path)])
    assert code == 2 and "refusing to overwrite an input" in capsys.readouterr().err


# ---------------------------------------------------------------- convert --solver

SOLVER = 'base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\npower: 0.75\n'


@pytest.mark.corpus
def test_convert_with_a_solver_writes_the_train_nets(tmp_path, capsys, corpus):
    from placer.training.solver import solver_train_nets
    from placer.types import TensorType
    solver = tmp_path / "solver.prototxt"
    solver.write_text(SOLVER)
    net = corpus / "caffe" / "mnist_lenet_train_test.prototxt"
    out = tmp_path / "out"
    assert main(["convert", str(net), "--solver", str(solver), "--input", "data=4,1,28,28",
                 "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["init_net.pbtxt", "manifest.json", "predict_net.pbtxt", "train_init_net.pbtxt", "train_net.pbtxt",
                     "train_net.value_info.json", "value_info.json"]
    expected = solver_train_nets(net, solver, input_shapes={"data": TensorType((4, 1, 28, 28))})
    assert load_netdef(out / "train_net.pbtxt") == expected.train
    types = {op.type for op in load_netdef(out / "train_net.pbtxt").op}
    assert {"ConvGradient", "MomentumSGDUpdate", "LearningRate", "AtomicIter"} <= types
    assert "Accuracy" not in types  # the TRAIN phase


def test_convert_with_a_bad_solver_writes_nothing(tmp_path, capsys):
    net = tmp_path / "tiny.prototxt"
    from test_training_solver import TINY
    net.write_text(TINY)
    solver = tmp_path / "solver.prototxt"
    solver.write_text('type: "RMSProp"\nbase_lr: 0.1\nlr_policy: "fixed"\n')
    code = main(["convert", str(net), "--solver", str(solver), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "solver.prototxt: type: RMSProp has no Caffe2 equivalent" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.caffe2
@pytest.mark.parametrize("model,opt", [("mlp", "nesterov"), ("dlrm", "rowwise-adagrad"), ("dlrm", "adam")])
def test_written_train_nets_train_in_caffe2(tmp_path, model, opt):
    """Three iterations in real Caffe2 on a fixed batch: every parameter moves, the loss falls."""
    import json

    import numpy as np

    from caffe2_oracle import run_caffe2
    out = tmp_path / "out"
    assert main(["train-net", str(DATA / f"{model}_predict_net.pbtxt"), "--loss", "loss",
                 "--optimizer", opt, "--lr", "0.05", "-o", str(out)]) == 0
    rng = np.random.default_rng(0)
    feeds = {"label": np.array([0, 1, 1, 0], np.int32)}
    if model == "mlp":
        feeds["data"] = rng.normal(size=(4, 6)).astype(np.float32)
    else:
        feeds.update(indices=rng.integers(0, 50, size=10).astype(np.int64),
                     lengths=np.array([3, 2, 4, 1], np.int32), dense=rng.normal(size=(4, 3)).astype(np.float32))
    params = [b for op in load_netdef(DATA / f"{model}_init_net.pbtxt").op for b in op.output]
    script = f"""
train = text_format.Parse(open({json.dumps(str(out / 'train_net.pbtxt'))}).read(), caffe2_pb2.NetDef())
init = text_format.Parse(open({json.dumps(str(out / 'train_init_net.pbtxt'))}).read(), caffe2_pb2.NetDef())
params = {params!r}
for k, v in inputs.items():
    workspace.FeedBlob(k, v)
workspace.RunNetOnce(init)
start = {{p: workspace.FetchBlob(p).copy() for p in params}}
workspace.CreateNet(train)
losses = []
for _ in range(3):
    workspace.RunNet(train.name)
    losses.append(float(workspace.FetchBlob("loss")))
save_json({{"losses": losses, "moved": [p for p in params if not np.array_equal(start[p], workspace.FetchBlob(p))]}})
"""
    result = run_caffe2(script, feeds)[1]
    assert result["moved"] == params
    assert result["losses"][-1] < result["losses"][0], result["losses"]
