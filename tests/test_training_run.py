"""Training runs in placer's executor and ``placer run``: state carried across iterations,
warm-ups that do not train, batches per step, the loss lines, the trained init net.

Reference values come from torch (autograd + the SGD update written out), never from
placer. The model is tests/data/training/mlp (FC -> Relu -> FC -> SoftmaxWithLoss, written
by real Caffe2) with placer's train net for plain SGD (WeightedSum with -lr).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import require_torch
from placer import cli
from placer.formats.caffe2 import load_netdef, net_from_netdef, save_netdef
from placer.runtime.executor import Executor
from placer.runtime.inputs import RandomBatches
from placer.runtime.state import loss_blobs, trained_init_net
from placer.shapes import infer
from placer.training.data_parallel import data_parallel
from placer.training.recipe import OptimizerChoice, make_train_nets
from placer.types import TensorType

DATA = Path(__file__).parent / "data" / "training"
LR = 0.1
PARAMS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")


def mlp_train_nets(optimizer: str = "sgd"):
    predict, init = DATA / "mlp_predict_net.pbtxt", DATA / "mlp_init_net.pbtxt"
    net = net_from_netdef(load_netdef(predict), load_netdef(init), path=str(predict))
    made = make_train_nets(net, ["loss"], OptimizerChoice(optimizer, LR))
    return made.train, made.init


def executor(optimizer: str = "sgd") -> Executor:
    train, init = mlp_train_nets(optimizer)
    ex = Executor(net_from_netdef(train, init))
    ex.run_init()
    return ex


def batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"data": rng.standard_normal((4, 6)).astype(np.float32),
            "label": rng.integers(0, 3, 4).astype(np.int32)}


def torch_sgd(start: dict, batches: list[dict]) -> tuple[dict, list[float]]:
    """The same model and plain SGD in torch: (parameters after the steps, loss per step)."""
    torch = require_torch()
    p = {k: torch.tensor(start[k], dtype=torch.float64, requires_grad=True) for k in PARAMS}
    losses = []
    for b in batches:
        x = torch.tensor(b["data"], dtype=torch.float64)
        h = torch.relu(x @ p["fc1_w"].T + p["fc1_b"])
        loss = torch.nn.functional.cross_entropy(h @ p["fc2_w"].T + p["fc2_b"],
                                                 torch.tensor(b["label"], dtype=torch.long))
        losses.append(float(loss.detach()))
        grads = torch.autograd.grad(loss, [p[k] for k in PARAMS])
        with torch.no_grad():
            for k, g in zip(PARAMS, grads):
                p[k] -= LR * g
    return {k: v.detach().numpy() for k, v in p.items()}, losses


def state_after(ex: Executor, batches, iterations: int, warmup: int) -> dict:
    ex.run(lambda step: batches[step % len(batches)], iterations=iterations, warmup=warmup)
    return ex.host_state()


# ---------------------------------------------------------------- the executor
def test_n_iterations_train_n_steps_as_torch_does():
    ex = executor()
    start = {k: v.copy() for k, v in ex.host_state().items()}
    batches = [batch(s) for s in range(3)]
    seen = []
    ex.run(lambda step: batches[step], iterations=3, warmup=0, watch=["loss"],
           on_step=lambda step, values: seen.append((step, float(values["loss"]))))
    want, losses = torch_sgd(start, batches)
    state = ex.host_state()
    for k in PARAMS:
        np.testing.assert_allclose(state[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert [s for s, _ in seen] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v in seen], losses, rtol=1e-5)
    assert state["optimizer_iteration"].tolist() == [3] and ex.steps_done == 3


def test_warmup_trains_a_copy_that_is_dropped():
    batches = [batch(s) for s in range(4)]
    plain = state_after(executor(), batches, iterations=3, warmup=0)
    warmed = state_after(executor(), batches, iterations=3, warmup=2)
    assert set(plain) == set(warmed)
    for k in plain:
        np.testing.assert_array_equal(warmed[k], plain[k], err_msg=k)
    assert warmed["optimizer_iteration"].tolist() == [3]


def test_the_state_carries_over_from_one_run_to_the_next():
    batches = [batch(s) for s in range(5)]
    once = state_after(executor("adam"), batches, iterations=5, warmup=0)
    ex = executor("adam")
    ex.run(lambda step: batches[step], iterations=2, warmup=1)
    twice = state_after(ex, batches, iterations=3, warmup=1)
    for k in once:
        np.testing.assert_array_equal(twice[k], once[k], err_msg=k)


def test_a_forward_net_has_no_state_and_keeps_its_parameters():
    predict, init = DATA / "mlp_predict_net.pbtxt", DATA / "mlp_init_net.pbtxt"
    ex = Executor(net_from_netdef(load_netdef(predict), load_netdef(init)))
    ex.run_init()
    before = ex.host_state()
    ex.run(batch(0), iterations=2)
    assert ex.state_names == ()
    for k, v in ex.host_state().items():
        np.testing.assert_array_equal(v, before[k])


def test_loss_blobs_are_found_from_the_gradient_seed():
    train, init = mlp_train_nets()
    assert loss_blobs(net_from_netdef(train, init)) == ["loss"]


def test_loss_blobs_of_a_data_parallel_net_are_each_devices_loss():
    """data_parallel_model seeds ``<p>/loss -> <p>/loss_grad`` per device, as placer's
    data-parallel and sharded nets do; a zero fill of a gradient is no seed."""
    train, init = mlp_train_nets()
    nets = data_parallel(train, init, devices=2)
    net = net_from_netdef(nets.train, nets.init)
    assert loss_blobs(net) == ["gpu_0/loss", "gpu_1/loss"]
    zero = next(op for op in nets.train.op if op.type == "ConstantFill" and op.output[0] == "gpu_1/loss_grad")
    zero.arg[0].f = 0.0
    assert loss_blobs(net_from_netdef(nets.train, nets.init)) == ["gpu_0/loss"]


def test_watching_a_blob_no_op_makes_is_an_error():
    from placer.errors import InputError
    with pytest.raises(InputError, match="no op writes 'los'"):
        executor().run(batch(0), watch=["los"])


def test_random_batches_differ_per_step_and_repeat_per_seed():
    train, init = mlp_train_nets()
    net = net_from_netdef(train, init)
    types = infer(net, {"data": TensorType((4, 6)), "label": TensorType((4,), "int32")}).blobs
    a, b = RandomBatches(net, types, ["data", "label"], 7), RandomBatches(net, types, ["data", "label"], 7)
    assert not np.array_equal(a(0)["data"], a(1)["data"])
    np.testing.assert_array_equal(a(1)["data"], b(1)["data"])
    assert a(3)["label"].dtype == np.int32 and 0 <= a(3)["label"].min() and a(3)["label"].max() < 3


# ---------------------------------------------------------------- the trained init net
@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_trained_init_net_restores_the_state_exactly(tmp_path, suffix):
    ex = executor("adam")
    ex.run(batch(0), iterations=2, warmup=0)
    state = ex.host_state()
    path = tmp_path / f"trained{suffix}"
    save_netdef(trained_init_net(ex.net.init_proto, state), path)
    again = Executor(net_from_netdef(ex.net.proto, load_netdef(path)))
    restored = again.run_init()
    assert set(restored) == set(state)
    for k, v in state.items():
        if k != "iteration_mutex":
            got = np.asarray(restored[k])
            assert got.dtype == v.dtype and got.shape == v.shape, k
            np.testing.assert_array_equal(got, v, err_msg=k)
    types = {op.output[0]: op.type for op in load_netdef(path).op}
    assert types["fc1_w"] == "GivenTensorFill" and types["optimizer_iteration"] == "GivenTensorInt64Fill"
    assert types["iteration_mutex"] == "CreateMutex"


# ---------------------------------------------------------------- placer run
def write_train_net(tmp_path) -> tuple[Path, Path]:
    train, init = mlp_train_nets()
    paths = tmp_path / "train_net.pbtxt", tmp_path / "train_init_net.pbtxt"
    save_netdef(train, paths[0])
    save_netdef(init, paths[1])
    return paths


def test_placer_run_trains_on_a_folder_of_batches(tmp_path, capsys):
    net, init = write_train_net(tmp_path)
    folder = tmp_path / "batches"
    folder.mkdir()
    batches = [batch(10), batch(11)]
    for k, b in enumerate(batches):
        np.savez(folder / f"b{k}.npz", **b)
    code = cli.main(["run", str(net), "--init-net", str(init), "--inputs", str(folder), "--iterations", "4",
                     "--print-every", "2", "--save-init", str(tmp_path / "trained.pb")])
    out, err = capsys.readouterr()
    assert code == 0, err
    start = Executor(net_from_netdef(load_netdef(net), load_netdef(init))).run_init()
    want, losses = torch_sgd({k: np.asarray(v) for k, v in start.items()}, [batches[k % 2] for k in range(4)])
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    np.testing.assert_allclose([float(line.split()[-1]) for line in lines], [losses[1], losses[3]], rtol=1e-5)
    assert "trained 4 step(s); the 1 warm-up run(s) trained a copy" in out
    trained = Executor(net_from_netdef(load_netdef(net), load_netdef(tmp_path / "trained.pb"))).run_init()
    for k in PARAMS:
        np.testing.assert_allclose(trained[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert np.asarray(trained["optimizer_iteration"]).tolist() == [4]


def test_placer_run_with_one_batch_file_per_step_cycles_them(tmp_path, capsys):
    net, init = write_train_net(tmp_path)
    files = []
    for k in range(3):
        files.append(tmp_path / f"in{k}.npz")
        np.savez(files[-1], **batch(20 + k))
    code = cli.main(["run", str(net), "--init-net", str(init), "--inputs", *map(str, files),
                     "--iterations", "3", "--warmup", "0", "--quiet", "--save-init", str(tmp_path / "t.pbtxt")])
    assert code == 0, capsys.readouterr().err
    assert capsys.readouterr().out == ""
    start = Executor(net_from_netdef(load_netdef(net), load_netdef(init))).run_init()
    want, _ = torch_sgd({k: np.asarray(v) for k, v in start.items()}, [batch(20 + k) for k in range(3)])
    trained = Executor(net_from_netdef(load_netdef(net), load_netdef(tmp_path / "t.pbtxt"))).run_init()
    for k in PARAMS:
        np.testing.assert_allclose(trained[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_placer_run_training_errors(tmp_path, capsys):
    net, init = write_train_net(tmp_path)
    argv = ["run", str(net), "--init-net", str(init), "--input", "data=4,6", "--input", "label=4:int32"]
    assert cli.main([*argv, "--loss", "los"]) == 2 and "no op writes 'los'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:       # argparse names the option (placer.arguments)
        cli.main([*argv, "--print-every", "0"])
    assert refused.value.code == 2
    assert "argument --print-every: expected an integer >= 1, found '0'" in capsys.readouterr().err


def test_save_init_needs_the_init_net_before_running(tmp_path, capsys):
    net, _ = write_train_net(tmp_path)
    code = cli.main(["run", str(net), "--input", "data=4,6", "--input", "label=4:int32",
                     "--save-init", str(tmp_path / "x.pb")])
    err = capsys.readouterr().err
    assert code == 2 and "--save-init needs the net's init net" in err
    assert not (tmp_path / "x.pb").exists()


def test_each_step_draws_a_new_dropout_mask_and_runs_repeat():
    from placer.examples.builder import NetBuilder
    b = NetBuilder("drop")
    b.input("data", (4, 6))
    b.input("label", (4,), "int32")
    h = b.op("FC", ["data", b.param("w1", (8, 6)), b.param("b1", (8,), "ConstantFill")], "h")
    d = b.op("Dropout", [h], ["d", "d_mask"], ratio=0.5, is_test=0)
    logits = b.op("FC", [d, b.param("w2", (3, 8)), b.param("b2", (3,), "ConstantFill")], "logits")
    b.op("SoftmaxWithLoss", [logits, "label"], ["softmax", "loss"])
    made = make_train_nets(net_from_netdef(b.predict, b.init), ["loss"], OptimizerChoice("sgd", LR))

    def masks(steps: int):
        ex = Executor(net_from_netdef(made.train, made.init))
        seen = []
        ex.run(batch(0), iterations=steps, warmup=1, watch=["d_mask"],
               on_step=lambda step, values: seen.append(values["d_mask"]))
        return seen

    first, again = masks(3), masks(3)
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    for a, b_ in zip(first, again):
        np.testing.assert_array_equal(a, b_)
    assert 0.3 < first[1].mean() < 0.7


def test_a_failed_warmup_leaves_the_real_state_in_place():
    from placer.errors import PlacerError
    ex = executor("adam")
    real = ex.params
    bad = {**batch(0), "label": np.array([0, 1, 2, 9], np.int32)}   # class 9 of 3
    with pytest.raises(PlacerError):
        ex.run(bad, iterations=2, warmup=1)
    assert ex.params is real and ex.steps_done == 0
    assert ex.host_state()["optimizer_iteration"].tolist() == [0]
