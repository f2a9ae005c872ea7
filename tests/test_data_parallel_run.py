"""Data-parallel training steps run by placer equal one device's step on the whole batch.

A one-device train net (placer's train-net recipe) on a batch of 4b, against its
data_parallel_model layout over four devices, each fed its b rows: after one step the
all-reduced gradients on every device equal the one-device gradients, and the updated
parameters (and optimizer state) equal the one-device ones, to float rounding. The mean
loss over 4b is the mean of the four replicas' means, so loss_scale = 1/4 makes the summed
gradients the one-device gradient; SGD then makes the same update.

Layouts run: GPUs with NCCLAllreduce, GPUs with the Sum tree and copies, over four
emulated GPUs; CPU devices with Sum + Copy (the tables of the DLRM-shaped net shared).
Gradients and parameters are compared after one step, the executor keeping no state
across runs yet.
"""
from __future__ import annotations

import numpy as np
import pytest

from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.runtime.executor import Executor
from placer.training.data_parallel import data_parallel
from placer.training.recipe import OptimizerChoice, make_train_nets

B = 3          # rows per device
N = 4          # devices


def given(b: NetBuilder, name: str, shape, rng, scale: float = 0.3) -> str:
    values = (rng.standard_normal(int(np.prod(shape))) * scale).astype(np.float32)
    return b.param(name, shape, "GivenTensorFill", values=[float(v) for v in values])


def lenet(rng):
    """A small LeNet: Conv-MaxPool-Conv-FC-Relu-FC-Softmax-LabelCrossEntropy-AveragedLoss."""
    b = NetBuilder("lenet")
    x = b.input("data", (N * B, 1, 10, 10))
    b.input("label", (N * B,), "int32")
    h = b.op("Conv", [x, given(b, "conv1_w", (4, 1, 3, 3), rng), given(b, "conv1_b", (4,), rng)], "conv1", kernel=3)
    h = b.op("MaxPool", [h], "pool1", kernel=2, stride=2)
    h = b.op("Conv", [h, given(b, "conv2_w", (6, 4, 3, 3), rng), given(b, "conv2_b", (6,), rng)], "conv2", kernel=3)
    h = b.op("FC", [h, given(b, "fc3_w", (16, 24), rng), given(b, "fc3_b", (16,), rng)], "fc3")
    h = b.op("Relu", [h], "fc3")
    h = b.op("FC", [h, given(b, "pred_w", (10, 16), rng), given(b, "pred_b", (10,), rng)], "pred")
    h = b.op("Softmax", [h], "softmax")
    h = b.op("LabelCrossEntropy", [h, "label"], "xent")
    b.op("AveragedLoss", [h], "loss")
    return net_from_netdef(b.predict, b.init)


def dlrm(rng):
    """An embedding table read by SparseLengthsSum beside a dense FC, concatenated, FC,
    SoftmaxWithLoss (the DLRM shape of tests/data/training/make_nets.py)."""
    b = NetBuilder("dlrm")
    b.input("indices", (N * B * 2,), "int64")
    b.input("lengths", (N * B,), "int32")
    b.input("dense", (N * B, 3))
    b.input("label", (N * B,), "int32")
    pooled = b.op("SparseLengthsSum", [given(b, "emb", (50, 4), rng), "indices", "lengths"], "pooled")
    dense = b.op("FC", ["dense", given(b, "bot_w", (4, 3), rng), given(b, "bot_b", (4,), rng)], "bot")
    both = b.op("Concat", [pooled, dense], ["both", "both_dims"], axis=1)
    top = b.op("FC", [both, given(b, "top_w", (2, 8), rng), given(b, "top_b", (2,), rng)], "top")
    b.op("SoftmaxWithLoss", [top, "label"], ["softmax", "loss"])
    return net_from_netdef(b.predict, b.init)


def batch(model: str, rng, repeat_rows: bool = True) -> dict[str, np.ndarray]:
    """A batch of 4b rows; ``repeat_rows`` False: every table row looked up at most once."""
    if model == "lenet":
        return {"data": rng.standard_normal((N * B, 1, 10, 10)).astype(np.float32),
                "label": rng.integers(0, 10, N * B).astype(np.int32)}
    rows = rng.integers(0, 50, N * B * 2) if repeat_rows else rng.permutation(50)[:N * B * 2]
    return {"indices": rows.astype(np.int64),
            "lengths": np.full(N * B, 2, np.int32),
            "dense": rng.standard_normal((N * B, 3)).astype(np.float32),
            "label": rng.integers(0, 2, N * B).astype(np.int32)}


def shard(model: str, feed: dict, k: int) -> dict[str, np.ndarray]:
    """Device k's b rows (and, for the table lookups, its indices)."""
    rows = slice(k * B, (k + 1) * B)
    if model == "lenet":
        return {n: v[rows] for n, v in feed.items()}
    lookups = slice(2 * k * B, 2 * (k + 1) * B)
    return {"indices": feed["indices"][lookups], "lengths": feed["lengths"][rows],
            "dense": feed["dense"][rows], "label": feed["label"][rows]}


def one_device(model: str, optimizer: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    net = (lenet if model == "lenet" else dlrm)(rng)
    nets = make_train_nets(net, ["loss"], OptimizerChoice(optimizer, lr=0.1))
    # sparse momentum updates a row once per lookup, in slice order, and the shared table's
    # slices arrive device 3 first (Caffe2's gradient accumulation): only distinct rows
    # make the result independent of that order
    return nets, batch(model, rng, repeat_rows=optimizer != "momentum")


def run(train, init, feed: dict, outputs: list[str], **kw) -> dict[str, np.ndarray]:
    train.external_output[:] = outputs
    ex = Executor(net_from_netdef(train, init), **kw)
    return ex.run(feed, iterations=1, warmup=0)


def state_blobs(nets) -> list[str]:
    """Parameters and the optimizer state the init net makes for them."""
    made = [b for op in nets.init.op for b in op.output]
    return [b for b in made if any(b == p or b.startswith(p + "_") for p in nets.params)]


CASES = [("lenet", "sgd", "gpu", True), ("lenet", "momentum", "gpu", True), ("lenet", "sgd", "gpu", False),
         ("lenet", "adagrad", "cpu", False), ("dlrm", "sgd", "gpu", True), ("dlrm", "sgd", "cpu", False),
         ("dlrm", "momentum", "cpu", False)]


@pytest.mark.parametrize("model,optimizer,kind,nccl", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_a_data_parallel_step_equals_one_device_on_the_whole_batch(model, optimizer, kind, nccl):
    nets, feed = one_device(model, optimizer)
    grads = [f"{p}_grad" for p in nets.params if p not in nets.sparse_params]
    state = state_blobs(nets)
    want = run(nets.train, nets.init, feed, grads + state)

    dp = data_parallel(nets.train, nets.init, N, kind, use_nccl=nccl)
    assert dp.shared == (nets.sparse_params if kind == "cpu" else [])
    shared_state = [b for b in state if any(b == s or b.startswith(s + "_") for s in dp.shared)]
    local = [f"{kind}_{k}/{b}" for k in range(N) for b in grads + state if b not in shared_state]
    dp_feed = {f"{kind}_{k}/{n}": v for k in range(N) for n, v in shard(model, feed, k).items()}
    got = run(dp.train, dp.init, dp_feed, local + shared_state, emulate_gpus=N if kind == "gpu" else None)

    # momentum SGD rewrites the gradient in place: compare it only where the update keeps it
    kept = set(grads) if optimizer in ("sgd", "adagrad") else set()
    for k in range(N):
        for b in state + sorted(kept):
            name = b if b in shared_state else f"{kind}_{k}/{b}"
            np.testing.assert_allclose(got[name], want[b], rtol=2e-5, atol=2e-6, err_msg=name)
    changed = [p for p in nets.params if not np.allclose(want[p], initial(nets.init, p))]
    assert len(changed) == len(nets.params)      # the step did move every parameter


def initial(init, name: str) -> np.ndarray:
    op = next(op for op in init.op if name in op.output)
    values = next(a for a in op.arg if a.name == "values")
    shape = next(a for a in op.arg if a.name == "shape")
    return np.array(values.floats, np.float32).reshape(list(shape.ints))


def test_the_emulated_gpus_move_the_gradients_over_their_links():
    """The NCCLAllreduce of each gradient over four emulated GPUs moves 2(n-1)/n of its
    bytes over each ring edge (cuda:k -> cuda:k+1), as NCCL's ring does."""
    nets, feed = one_device("lenet", "sgd")
    dp = data_parallel(nets.train, nets.init, N, "gpu")
    dp.train.external_output[:] = ["gpu_0/loss"]
    ex = Executor(net_from_netdef(dp.train, dp.init), emulate_gpus=N)
    ex.run({f"gpu_{k}/{n}": v for k in range(N) for n, v in shard("lenet", feed, k).items()}, warmup=0)
    reduce_ops = [o for o in ex.record.ops if o.type == "NCCLAllreduce"]
    assert len(reduce_ops) == len(nets.params)
    param_bytes = sum(initial(nets.init, p).nbytes for p in nets.params)
    edges = {}
    for o in reduce_ops:
        for src, dst, n in o.links:
            edges[(src, dst)] = edges.get((src, dst), 0) + n
    ring = {(f"emulated-cuda:{k}", f"emulated-cuda:{(k + 1) % N}") for k in range(N)}
    assert set(edges) == ring
    for n in edges.values():
        assert abs(n - 2 * (N - 1) / N * param_bytes) <= 2 * len(nets.params) * 4 * N   # chunk rounding
