"""Whole train nets written by Caffe2 itself, run op by op with placer's kernels.

Real Caffe2 builds each model (brew + ``AddGradientOperators`` + one of its optimizer
builders), runs the init net, records every blob, runs one training iteration and
records every blob again. Here each op of that train net (as Caffe2 wrote it) runs
through placer's registry: its inference must predict the kernel's output types, and
after the iteration every blob must equal Caffe2's. Dropout is left out (its mask is
random); everything else a small MLP, CNN and embedding model trains with is in, under
every optimizer builder (SGD with and without momentum, Adagrad dense, sparse and rowwise,
Adam dense and sparse).
"""
from __future__ import annotations

import numpy as np
import pytest

from caffe2_oracle import run_caffe2
from placer.formats.caffe2 import op_from_proto, parse_text
from placer.ops import registry
from placer.types import Args, TensorType

pytestmark = pytest.mark.caffe2

MODELS = {
    "mlp_momentum_sgd": """
        m = model_helper.ModelHelper("mlp")
        h = brew.relu(m, brew.fc(m, "data", "fc1", 8, 16), "relu1")
        h = m.net.Tanh(brew.fc(m, h, "fc2", 16, 16), "tanh2")
        h = m.net.Sigmoid(h, "sig2")
        logits = brew.fc(m, h, "fc3", 16, 4)
        _, loss = m.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
        m.AddGradientOperators([loss])
        optimizer.build_sgd(m, base_learning_rate=0.1, momentum=0.9, policy="step", stepsize=1, gamma=0.5)
        feeds = {"data": rng.randn(6, 8).astype(np.float32), "label": rng.randint(0, 4, 6).astype(np.int32)}
    """,
    "cnn_adam": """
        m = model_helper.ModelHelper("cnn")
        h = brew.conv(m, "data", "conv1", 3, 4, 3, pad=1, no_bias=1)   # a bias before BN gets no gradient
        h = brew.spatial_bn(m, h, "bn1", 4, epsilon=1e-3, is_test=False)
        h = brew.relu(m, h, "relu1")
        h = brew.lrn(m, h, "lrn1", size=3, alpha=1e-3, beta=0.75)
        h = brew.max_pool(m, h, "pool1", kernel=2, stride=2)
        h = brew.conv(m, h, "conv2", 4, 6, 3, pad=1)
        h = brew.average_pool(m, h, "pool2", kernel=2, stride=2)
        logits = brew.fc(m, h, "fc", 6 * 2 * 2, 3)
        _, loss = m.net.SoftmaxWithLoss([logits, "label"], ["softmax", "loss"])
        m.AddGradientOperators([loss])
        optimizer.build_adam(m, base_learning_rate=0.01)
        feeds = {"data": rng.randn(4, 3, 8, 8).astype(np.float32), "label": rng.randint(0, 3, 4).astype(np.int32)}
    """,
}

EMBEDDING = """
        m = model_helper.ModelHelper("emb")
        table = m.param_init_net.GaussianFill([], "table", shape=[20, 4], std=0.1)
        m.params.append(core.BlobReference("table"))
        pooled = m.net.SparseLengthsSum([table, "ids", "lengths"], "pooled")
        dense = brew.fc(m, "dense_in", "fc_dense", 3, 4)
        both = m.net.Concat([pooled, dense], ["both", "both_info"], axis=1)[0]
        logit = brew.fc(m, both, "fc_out", 8, 1)
        xent = m.net.SigmoidCrossEntropyWithLogits([logit, "target"], "xent")
        loss = m.net.AveragedLoss(xent, "loss")
        m.AddGradientOperators([loss])
        {optimizer}
        feeds = {{"ids": np.array([1, 5, 5, 19, 0, 1, 7], np.int64), "lengths": np.array([2, 3, 0, 2], np.int32),
                 "dense_in": rng.randn(4, 3).astype(np.float32),
                 "target": rng.randint(0, 2, (4, 1)).astype(np.float32)}}
"""
# Each optimizer builder on a model with a sparse (SparseLengthsSum) and dense parameters:
# Adagrad -> SparseAdagrad, rowwise -> RowWiseSparseAdagrad, SGD -> ScatterWeightedSum,
# momentum -> SparseMomentumSGDUpdate, Adam -> SparseAdam.
for _name, _call in (("adagrad", "optimizer.build_adagrad(m, base_learning_rate=0.1)"),
                     ("rowwise_adagrad", "dense_opt = optimizer.AdagradOptimizer(alpha=0.1)\n        "
                                         "row_opt = optimizer.AdagradOptimizer(alpha=0.1, rowWise=True)\n        "
                                         "for p, g in m.param_to_grad.items():\n        "
                                         "    (row_opt if str(p) == 'table' else dense_opt)(m.net, m.param_init_net, p, grad=g)"),
                     ("sgd", "optimizer.build_sgd(m, base_learning_rate=0.1)"),
                     ("momentum_sgd", "optimizer.build_sgd(m, base_learning_rate=0.1, momentum=0.9)"),
                     ("adam", "optimizer.build_adam(m, base_learning_rate=0.05)")):
    MODELS[f"embedding_{_name}"] = EMBEDDING.format(optimizer=_call)

SCRIPT = """
from caffe2.python import brew, model_helper, optimizer
rng = np.random.RandomState(0)
{model}
for name, value in feeds.items():
    workspace.FeedBlob(name, value)
workspace.RunNetOnce(m.param_init_net)
def snapshot(tag):
    for b in workspace.Blobs():
        try:
            value = workspace.FetchBlob(b)
        except Exception:
            continue                       # the mutex: not a tensor
        if isinstance(value, np.ndarray) and value.dtype != object:
            save(**{{tag + "/" + b: value}})
snapshot("before")
workspace.RunNetOnce(m.net)
snapshot("after")
save_json(net_text(m.net))
"""


@pytest.fixture(scope="module")
def caffe2_runs():
    return {name: run_caffe2(SCRIPT.format(model=body.replace("\n        ", "\n").strip())) for name, body in MODELS.items()}


def _blobs(arrays, tag):
    return {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(tag + "/")}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_train_net_runs_like_caffe2(caffe2_runs, model):
    arrays, text = caffe2_runs[model]
    netdef = parse_text(text)
    blobs = dict(_blobs(arrays, "before"))
    types_seen = set()
    for i, proto in enumerate(netdef.op):
        op = op_from_proto(i, proto)
        opdef = registry.get(op.type)
        assert opdef is not None and opdef.kernel is not None, f"{op.label}: no kernel"
        for name in op.inputs:
            if name not in blobs and "mutex" in name:
                blobs[name] = registry.get("CreateMutex").kernel(np, [], Args({}))[0]
        ins = [blobs[n] for n in op.inputs]
        args = Args(dict(op.args), op=op.label, n_outputs=len(op.outputs))
        outs = opdef.kernel(np, ins, args)
        predicted = list(opdef.infer([TensorType(x.shape, str(x.dtype)) for x in ins], args))
        predicted += [None] * (len(op.outputs) - len(predicted))   # None: known only when run
        assert len(outs) >= len(op.outputs), op.label
        for name, value, t in zip(op.outputs, outs, predicted):
            if t is not None:
                assert (tuple(value.shape), str(value.dtype)) == (t.shape, t.dtype), f"{op.label} -> {name}"
            blobs[name] = np.asarray(value)
        types_seen.add(op.type)
    after = _blobs(arrays, "after")
    for name, want in after.items():
        assert name in blobs, name
        np.testing.assert_allclose(blobs[name], want, rtol=2e-4, atol=2e-5, err_msg=f"{model}: blob {name}")
    assert {"AtomicIter", "LearningRate"} <= types_seen


def test_the_train_nets_use_every_optimizer(caffe2_runs):
    used = {proto.type for arrays, text in caffe2_runs.values() for proto in parse_text(text).op}
    assert {"SparseAdagrad", "RowWiseSparseAdagrad", "ScatterWeightedSum", "SparseMomentumSGDUpdate",
            "SparseAdam", "Adam", "Adagrad", "MomentumSGDUpdate", "WeightedSum", "ConvGradient",
            "SpatialBNGradient", "LRNGradient", "MaxPoolGradient", "AveragePoolGradient",
            "SparseLengthsIndicesInGradientSumGradient", "SoftmaxWithLossGradient"} <= used, sorted(used)
