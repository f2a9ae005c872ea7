"""The models the training-run tests train in placer and in real Caffe2, and the oracle side.

Each model is a forward NetDef (ending in a loss) and its init net, made by placer:
- ``lenet``, ``alexnet``: the corpus's Caffe train_val prototxts, converted (seeded fills)
  and made out of place for the gradients as ``placer train-net`` does for a Caffe net.
  AlexNet runs at batch 2 on 67x67 images (every layer as in the file; fc6 reads a 1x1
  pool5), and its Dropout ratio is set to 0: Caffe2 draws the mask from its own
  generator, so only a ratio of 0 (mask all ones, scale 1) gives both the same one, while
  Dropout and DropoutGrad stay in the net.
- ``resnet``: a ResNet-style net (Conv without bias, SpatialBN in training mode with its
  running statistics in place, Relu, residual Sum, pools, FC, SoftmaxWithLoss).
- ``dlrm``: the bundled DLRM generator (placer/examples/dlrm.py) at a tiny size, with a
  squared-error loss on its click probability (SquaredL2Distance + AveragedLoss).

``oracle_train(model, optimizers, batches, init_values)`` runs real Caffe2: for each
optimizer it builds ``AddGradientOperators([loss])`` and the optimizer's builder on the
same forward net (``caffe2.python.optimizer``), returns the train and init nets it wrote,
and trains them from ``init_values`` on ``batches`` (one per step): the gradients after
the first step and every blob its init net makes (parameters, optimizer state, the
iteration counter, running statistics) after the last.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from conftest import corpus_dir
from placer.examples.builder import NetBuilder, make_op
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.types import Net, TensorType

# placer --optimizer -> (its OptimizerChoice arguments, the Caffe2 builder call it mirrors;
# ``m`` is the model helper). The two systems sum in other orders (their own kernels, the
# BLAS build and thread count), so their step-1 gradients differ by float32 rounding: a
# difference d_g of at most gamma_K * sum|terms| (K terms per sum, gamma_K ~ K * 2**-24),
# measured here at <= 6e-7 for every gradient of these models. How far that moves a
# parameter in S = 5 steps is S * gain * d_g, where the gain is the optimizer's largest
# d(step)/d(gradient): lr / (1 - momentum) for SGD, lr / eps for Adagrad (step
# lr * g / (sqrt(h) + eps)) and about lr / eps for Adam -- as long as the steps stay small
# enough that the changed parameters do not change later gradients by more than they
# did (no ReLU switching over, no divergence). Adagrad and Adam's default eps (1e-4, 1e-8)
# make that gain 1e3..1e6, so these eps values are given to both systems; Adagrad's rate
# is 0.01 (gain 1): at 0.05, steps of ~10% of AlexNet's weights turned a gradient
# difference of 2e-10 into 1.6e-3 in conv4_w after five steps (an amplification of 1e7,
# chaos rather than arithmetic), where at 0.01 every state blob of LeNet and AlexNet stays
# within 1e-6 of Caffe2's (dp/dg <= 120, at the size of one ulp of the weight). SGD's rate
# stays at 0.01: at 0.05 with momentum LeNet diverges within five steps. The comparison
# tolerance (test_training_run_caffe2.assert_close: rtol 1e-4, atol 1e-4 of the blob's
# largest value) then holds with a margin of 5x on every state blob of every model and
# optimizer (the largest difference uses 19% of it: LeNet/Adam's ip2_w, 3.3e-6).
OPTIMIZERS = {
    "nesterov": (dict(lr=0.01), "optimizer.build_sgd(m, 0.01, momentum=0.9)"),
    "momentum": (dict(lr=0.01), "optimizer.build_sgd(m, 0.01, momentum=0.9, nesterov=False)"),
    "adagrad": (dict(lr=0.01, epsilon=0.01), "optimizer.build_adagrad(m, 0.01, epsilon=0.01)"),
    "adam": (dict(lr=0.01, epsilon=1e-3), "optimizer.build_adam(m, 0.01, epsilon=1e-3)"),
    "rowwise-adagrad": (dict(lr=0.01, epsilon=0.01), (
        "sparse = [p for p, g in m.param_to_grad.items() if isinstance(g, core.GradientSlice)]\n"
        "table_opt = optimizer.AdagradOptimizer(alpha=0.01, epsilon=0.01, rowWise=True)\n"
        "for p in sparse:\n"
        "    m.get_param_info(p).optimizer = table_opt\n"
        "optimizer.build_adagrad(m, 0.01, epsilon=0.01)")),
}


def choice(opt: str):
    """placer's OptimizerChoice for ``opt`` (as ``placer train-net`` makes it)."""
    from placer.training.recipe import OptimizerChoice
    return OptimizerChoice(opt, **OPTIMIZERS[opt][0])


@dataclass
class Model:
    name: str
    predict: pb.NetDef          # forward ops, ending in ``loss``
    init: pb.NetDef
    inputs: dict[str, TensorType]
    loss: str = "loss"

    def net(self) -> Net:
        return net_from_netdef(self.predict, self.init, path=self.name)


# ---------------------------------------------------------------- the models
def _caffe_forward(prototxt: str, inputs: dict[str, TensorType], zero_dropout: bool) -> tuple:
    """A Caffe train_val as the forward part of its placer train net (out of place)."""
    from placer.formats import load_net
    from placer.training.recipe import OptimizerChoice, make_train_nets
    # corpus_dir(): a skip where ../shared is absent (a user's clone), a failure under CI=true
    net = load_net(corpus_dir() / "caffe" / prototxt, phase="train", input_shapes=inputs)
    if zero_dropout:
        for op in net.proto.op:
            if op.type == "Dropout":
                for arg in op.arg:
                    if arg.name == "ratio":
                        arg.f = 0.0
    made = make_train_nets(net, ["loss"], OptimizerChoice("sgd", 0.1))
    forward = pb.NetDef()
    forward.CopyFrom(made.train)
    del forward.op[made.forward_ops:]
    forward.name = net.proto.name
    del forward.external_input[:]
    forward.external_input.extend(net.proto.external_input)
    return forward, net.init_proto


@lru_cache(maxsize=None)
def model(name: str) -> Model:
    if name == "lenet":
        inputs = {"data": TensorType((4, 1, 28, 28)), "label": TensorType((4,), "int32")}
        predict, init = _caffe_forward("mnist_lenet_train_test.prototxt", inputs, False)
        return Model(name, predict, init, inputs)
    if name == "alexnet":
        inputs = {"data": TensorType((2, 3, 67, 67)), "label": TensorType((2,), "int32")}
        predict, init = _caffe_forward("bvlc_alexnet_train_val.prototxt", inputs, True)
        return Model(name, predict, init, inputs)
    if name == "resnet":
        return _resnet()
    if name == "dlrm":
        return _dlrm()
    raise KeyError(name)


def _conv_bn(b: NetBuilder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int) -> str:
    w = b.param(f"{name}_w", (cout, cin, kernel, kernel), "MSRAFill")
    y = b.op("Conv", [x, w], name, kernel=kernel, stride=stride, pad=kernel // 2)
    scale = b.param(f"{name}_bn_s", (cout,), "UniformFill", min=0.5, max=1.5)
    shift = b.param(f"{name}_bn_b", (cout,), "UniformFill", min=-0.1, max=0.1)
    rm = b.param(f"{name}_bn_rm", (cout,), "ConstantFill", value=0.0)
    rv = b.param(f"{name}_bn_rv", (cout,), "ConstantFill", value=1.0)
    return b.op("SpatialBN", [y, scale, shift, rm, rv],
                [f"{name}_bn", rm, rv, f"{name}_bn_sm", f"{name}_bn_siv"],
                is_test=0, momentum=0.9, epsilon=1e-5)


def _resnet() -> Model:
    """Stem conv-BN-Relu-MaxPool, a basic block, a strided block with a projection,
    global AveragePool, FC, SoftmaxWithLoss."""
    b = NetBuilder("resnet_train")
    x = b.input("data", (4, 3, 16, 16))
    b.input("label", (4,), "int32")
    x = b.op("Relu", [_conv_bn(b, "conv1", x, 3, 8, 3, 1)], "conv1_relu")
    x = b.op("MaxPool", [x], "pool1", kernel=2, stride=2)
    cin = 8
    for stage, (cout, stride) in enumerate(((8, 1), (16, 2))):
        name = f"res{stage}"
        y = b.op("Relu", [_conv_bn(b, f"{name}_a", x, cin, cout, 3, stride)], f"{name}_a_relu")
        y = _conv_bn(b, f"{name}_b", y, cout, cout, 3, 1)
        short = x if stride == 1 and cin == cout else _conv_bn(b, f"{name}_proj", x, cin, cout, 1, stride)
        s = b.op("Sum", [y, short], f"{name}_sum")
        x = b.op("Relu", [s], s)
        cin = cout
    x = b.op("AveragePool", [x], "pool5", global_pooling=1)
    w = b.param("pred_w", (5, cin), "XavierFill")
    bias = b.param("pred_b", (5,), "UniformFill", min=-0.1, max=0.1)
    x = b.op("FC", [x, w, bias], "pred")
    b.op("SoftmaxWithLoss", [x, "label"], ["softmax", "loss"])
    return Model("resnet", b.predict, b.init, {"data": TensorType((4, 3, 16, 16)),
                                               "label": TensorType((4,), "int32")})


def _dlrm() -> Model:
    from placer.examples import dlrm
    cfg = dlrm.DlrmConfig("dlrm_tiny", table_rows=(40, 25, 12), dim=4, bottom=(3, 8, 4), top=(8, 1),
                          batch=6, lookups_per_sample=2)
    b = dlrm.build(cfg)
    b.predict.external_input.append("click")
    b.predict.op.append(make_op("SquaredL2Distance", ["prob_click", "click"], ["dist"]))
    b.predict.op.append(make_op("AveragedLoss", ["dist"], ["loss"]))
    del b.predict.external_output[:]
    inputs = {n: TensorType(shape, dtype) for n, (dtype, shape) in b.value_info.items()}
    inputs["click"] = TensorType((cfg.batch, 1))
    return Model("dlrm", b.predict, b.init, inputs)


# ---------------------------------------------------------------- batches and the oracle
@lru_cache(maxsize=None)
def initial_values(name: str) -> dict[str, np.ndarray]:
    """The forward net's init net run by placer (seeded fills): every run starts here
    (read only: executors take copies)."""
    from placer.runtime.executor import Executor
    ex = Executor(model(name).net())
    ex.run_init()
    return ex.host_state()


def batches(m: Model, steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """One batch per step: random inputs valid for their readers (indices, lengths, labels)."""
    from placer.runtime.inputs import random_inputs
    from placer.shapes import infer
    net = m.net()
    types = infer(net, m.inputs).blobs
    out = []
    for step in range(steps):
        batch = random_inputs(net, types, list(m.inputs), seed=(seed, step))
        if "click" in batch:
            batch["click"] = (batch["click"] > 0).astype(np.float32)
        out.append(batch)
    return out


ORACLE = """
from caffe2.python import model_helper, optimizer
spec = json.loads({spec!r})
predict, init = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
text_format.Parse(spec["predict"], predict)
text_format.Parse(spec["init"], init)
params = [o for op in init.op for o in op.output]
result = {{}}
for opt, code in spec["builders"].items():
    optimizer._optimizer_instance_count.clear()     # as in a fresh process
    workspace.ResetWorkspace()
    m = model_helper.ModelHelper(name=predict.name)
    m.net = core.Net(predict)
    m.param_init_net = core.Net(init)
    for p in params:
        m.AddParameter(core.BlobReference(p))
    m.AddGradientOperators([spec["loss"]])
    exec(code)
    grads = {{str(p): ([str(g.indices), str(g.values)] if isinstance(g, core.GradientSlice) else [str(g)])
             for p, g in m.param_to_grad.items()}}
    result[opt] = {{"train": net_text(m.net), "init": net_text(m.param_init_net), "grads": grads}}
    workspace.RunNetOnce(m.param_init_net)
    for p in params:
        if "init/" + p in inputs:
            workspace.FeedBlob(p, inputs["init/" + p])
    for step in range(spec["steps"]):
        for name in spec["inputs"]:
            workspace.FeedBlob(name, inputs["batch%d/%s" % (step, name)])
        if step == 0:
            workspace.CreateNet(m.net)
        workspace.RunNet(m.net.Proto().name)
        if step == 0:
            save(**{{"%s/grad/%s" % (opt, b): workspace.FetchBlob(b) for bs in grads.values() for b in bs}})
    state = {{o for op in m.param_init_net.Proto().op for o in op.output}}
    for b in workspace.Blobs():
        if b in state:
            try:
                value = workspace.FetchBlob(b)
            except Exception:
                continue                                   # the mutex is not a tensor
            if isinstance(value, np.ndarray) and value.dtype != object:
                save(**{{"%s/state/%s" % (opt, b): value}})
save_json(result)
"""


def oracle_train(m: Model, optimizers: list[str], steps: list[dict], init_values: dict) -> tuple[dict, dict]:
    """Real Caffe2 on ``m`` with each optimizer: (arrays, {opt: {train, init, grads}})."""
    spec = {"predict": text_format.MessageToString(m.predict), "init": text_format.MessageToString(m.init),
            "loss": m.loss, "builders": {o: OPTIMIZERS[o][1] for o in optimizers}, "steps": len(steps),
            "inputs": sorted(m.inputs)}
    feeds = {f"init/{k}": v for k, v in init_values.items()}
    for k, batch in enumerate(steps):
        feeds.update({f"batch{k}/{n}": v for n, v in batch.items()})
    return run_caffe2(ORACLE.format(spec=json.dumps(spec)), feeds, timeout=600)


def parse(text: str) -> pb.NetDef:
    net = pb.NetDef()
    text_format.Parse(text, net)
    return net
