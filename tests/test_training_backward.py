"""The backward pass of whole nets against real Caffe2's ``AddGradientOperators``.

Each model is built in real Caffe2 with brew (an MLP, LeNet, a SpatialBN conv net, a
DLRM-like SparseLengthsSum model, nets that read a blob twice); the forward net it exports
goes through placer's ``add_gradient_ops`` and the result must equal what Caffe2 appended,
op for op up to the order of independent ops, with the same blob -> gradient map.
``MODELS`` is shared with the optimizer tests.
"""
from __future__ import annotations

import json

import pytest

from caffe2_oracle import run_caffe2
from placer.training import GradientError, GradientSlice, add_gradient_ops
from test_training_compare import assert_same_ops, parse_net

pytestmark = pytest.mark.caffe2

# Oracle-side builders: each defines build() -> (ModelHelper, loss blob name).
MODELS = {
    "mlp": """
def build():
    m = model_helper.ModelHelper(name="mlp")
    h = brew.fc(m, "data", "fc1", dim_in=6, dim_out=8)
    h = brew.relu(m, h, "relu1")
    h = brew.fc(m, h, "fc2", dim_in=8, dim_out=3)
    p = brew.softmax(m, h, "prob")
    xent = m.net.LabelCrossEntropy([p, "label"], "xent")
    return m, m.net.AveragedLoss(xent, "loss")
""",
    "lenet": """
def build():
    m = model_helper.ModelHelper(name="lenet")
    c1 = brew.conv(m, "data", "conv1", dim_in=1, dim_out=4, kernel=5)
    p1 = brew.max_pool(m, c1, "pool1", kernel=2, stride=2)
    c2 = brew.conv(m, p1, "conv2", dim_in=4, dim_out=6, kernel=5)
    p2 = brew.max_pool(m, c2, "pool2", kernel=2, stride=2)
    f3 = brew.fc(m, p2, "fc3", dim_in=6 * 4 * 4, dim_out=10)
    r3 = brew.relu(m, f3, f3)
    f4 = brew.fc(m, r3, "pred", dim_in=10, dim_out=10)
    _, loss = m.net.SoftmaxWithLoss([f4, "label"], ["softmax", "loss"])
    return m, loss
""",
    "spatial_bn": """
def build():
    m = model_helper.ModelHelper(name="bn")
    c = brew.conv(m, "data", "conv", dim_in=1, dim_out=3, kernel=3, pad=1)
    b = brew.spatial_bn(m, c, "bn", 3, epsilon=1e-3, momentum=0.9, is_test=False)
    r = brew.relu(m, b, b)
    d = brew.dropout(m, r, "drop", ratio=0.5, is_test=False)
    p = brew.average_pool(m, d, "pool", kernel=2, stride=2)
    f = brew.fc(m, p, "fc", dim_in=3 * 4 * 4, dim_out=4)
    _, loss = m.net.SoftmaxWithLoss([f, "label"], ["softmax", "loss"])
    return m, loss
""",
    "sparse": """
def build():
    m = model_helper.ModelHelper(name="dlrm")
    emb = m.create_param("emb", shape=[20, 4], initializer=initializers.Initializer("UniformFill", min=-0.1, max=0.1))
    pooled = m.net.SparseLengthsSum([emb, "idx", "lengths"], "pooled")
    dense = brew.fc(m, "dense", "bot", dim_in=3, dim_out=4)
    both = brew.concat(m, [pooled, dense], "both", axis=1)
    top = brew.fc(m, both, "top", dim_in=8, dim_out=2)
    _, loss = m.net.SoftmaxWithLoss([top, "label"], ["softmax", "loss"])
    return m, loss
""",
    "shared_table": """
def build():
    m = model_helper.ModelHelper(name="w2v")
    emb = m.create_param("emb", shape=[20, 4], initializer=initializers.Initializer("UniformFill", min=-0.1, max=0.1))
    a = m.net.SparseLengthsSum([emb, "idx_a", "len_a"], "a")
    b = m.net.SparseLengthsWeightedSum([emb, "w_b", "idx_b", "len_b"], "b")
    s = m.net.Sum([a, b], "ab")
    f = brew.fc(m, s, "out", dim_in=4, dim_out=2)
    _, loss = m.net.SoftmaxWithLoss([f, "label"], ["softmax", "loss"])
    return m, loss
""",
    "mlp_gpu1": """
def build():
    m = model_helper.ModelHelper(name="mlp_gpu1")
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CUDA, 1)):
        h = brew.fc(m, "data", "fc1", dim_in=6, dim_out=8)
        h = brew.relu(m, h, "relu1")
        h = brew.fc(m, h, "fc2", dim_in=8, dim_out=3)
        _, loss = m.net.SoftmaxWithLoss([h, "label"], ["softmax", "loss"])
    return m, loss
""",
    "read_twice": """
def build():
    m = model_helper.ModelHelper(name="twice")
    h = brew.fc(m, "data", "fc1", dim_in=6, dim_out=8)
    h = brew.tanh(m, h, "t1")
    left = brew.fc(m, h, "left", dim_in=8, dim_out=8)
    right = brew.fc(m, h, "right", dim_in=8, dim_out=8)
    both = m.net.Add([left, right], "both")
    sq = m.net.Mul([both, h], "sq")
    out = brew.fc(m, sq, "out", dim_in=8, dim_out=3, weight_init=("XavierFill", {}))
    _, loss = m.net.SoftmaxWithLoss([out, "label"], ["softmax", "loss"])
    return m, loss
""",
}

PRELUDE = """
from caffe2.python import model_helper, brew, optimizer
from caffe2.python.modeling import initializers
"""


def oracle_model(name: str, after: str = "") -> dict:
    """Build MODELS[name] in Caffe2; return its forward and init nets as text, then the
    net after AddGradientOperators (and ``after``, code run with ``m`` and ``grads``)."""
    script = PRELUDE + MODELS[name] + f"""
m, loss = build()
forward = net_text(m.net)
init = net_text(m.param_init_net)
grads = m.AddGradientOperators([loss])
{after}
save_json({{"forward": forward, "init": init, "net": net_text(m.net),
           "train_init": net_text(m.param_init_net), "loss": str(loss),
           "params": [str(p) for p in m.params], "weights": [str(p) for p in m.weights],
           "grads": {{str(k): [str(v.indices), str(v.values)] if isinstance(v, core.GradientSlice)
                      else str(v) for k, v in grads.items()}}}})
"""
    return run_caffe2(script)[1]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_backward_pass_equals_caffe2s(name):
    result = oracle_model(name)
    net = parse_net(result["forward"])
    n_forward = len(net.op)
    grads = add_gradient_ops(net, [result["loss"]])
    theirs = parse_net(result["net"])
    assert_same_ops(net.op[n_forward:], theirs.op[n_forward:], f"{name} backward")
    ours = {k: list(v) if isinstance(v, GradientSlice) else v for k, v in grads.items()}
    assert ours == result["grads"]


def test_shared_table_gets_concatenated_slices():
    """The table read by two sparse ops: both value writers renamed, indices and values
    concatenated (Caffe2 does not sum GradientSlices)."""
    net = parse_net(oracle_model("shared_table")["forward"])
    grads = add_gradient_ops(net, ["loss"])
    assert grads["emb"] == GradientSlice("emb_grad_indices_concat", "emb_grad_values_concat")
    concat = [op for op in net.op if op.type == "Concat"]
    assert [list(op.input) for op in concat] == [
        ["idx_b", "idx_a"], ["_emb_grad_values_autosplit_0", "_emb_grad_values_autosplit_1"]]


def test_a_loss_no_op_writes_is_refused():
    net = parse_net(oracle_model("mlp")["forward"])
    with pytest.raises(GradientError, match="no op writes the loss blob 'los'"):
        add_gradient_ops(net, ["los"])


def test_an_overwritten_input_is_refused_as_caffe2_does():
    """Sigmoid's gradient needs its output y; a later in-place op overwrites y."""
    net = parse_net("""
        op { input: "x" output: "y" type: "Sigmoid" }
        op { input: "y" output: "y" type: "Sigmoid" }
        op { input: "y" output: "loss" type: "AveragedLoss" }""")
    script = f"""
net = core.Net(caffe2_pb2.NetDef())
net.Proto().CopyFrom(text_format.Parse({json.dumps(str(net))}, caffe2_pb2.NetDef()))
try:
    net.AddGradientOperators(["loss"])
    save_json("ok")
except Exception as e:
    save_json(type(e).__name__)
"""
    assert run_caffe2(script)[1] == "RuntimeError"
    with pytest.raises(GradientError, match="later op overwrites it"):
        add_gradient_ops(net, ["loss"])


def test_in_place_ops_made_out_of_place_give_the_net_caffe2_differentiates():
    """ReLU then Dropout in place (Caffe's habit): Caffe2 refuses the net as written; after
    ``out_of_place`` it accepts it and writes the same backward pass as placer."""
    from placer.training.backward import out_of_place
    net = parse_net("""
        op { input: "x" input: "w" input: "b" output: "fc" name: "fc" type: "FC" }
        op { input: "fc" output: "fc" name: "relu" type: "Relu" }
        op { input: "fc" output: "fc" output: "_fc_mask" name: "drop" type: "Dropout"
             arg { name: "ratio" f: 0.5 } arg { name: "is_test" i: 0 } }
        op { input: "fc" output: "fc" name: "relu2" type: "Relu" }
        op { input: "fc" input: "label" output: "p" output: "loss" name: "loss" type: "SoftmaxWithLoss" }
        external_input: "x" external_input: "w" external_input: "b" external_input: "label"
        external_output: "fc" """)
    renamed = out_of_place(net, ["loss"])
    assert [op.output[0] for op in net.op] == ["fc", "fc", "fc_drop", "fc_drop", "p"]
    assert len(renamed) == 1 and "'fc_drop' instead of overwriting 'fc'" in renamed[0]
    assert list(net.external_output) == ["fc_drop"]
    script = f"""
net = core.Net(text_format.Parse({json.dumps(str(net))}, caffe2_pb2.NetDef()))
net.AddGradientOperators(["loss"])
save_json(net_text(net))
"""
    theirs = parse_net(run_caffe2(script)[1])
    n = len(net.op)
    add_gradient_ops(net, ["loss"])
    assert_same_ops(net.op[n:], theirs.op[n:], "out-of-place net")


def test_contributions_from_two_devices_are_refused_as_caffe2_does():
    """x feeds a CPU op and a GPU op: Caffe2 will not sum gradients made on different devices."""
    net = parse_net("""
        op { input: "x" output: "a" type: "Relu" }
        op { input: "x" output: "b" type: "Sigmoid" device_option { device_type: 1 device_id: 0 } }
        op { input: "a" input: "b" output: "s" type: "Sum" }
        op { input: "s" output: "loss" type: "AveragedLoss" }
        external_input: "x" """)
    script = f"""
net = core.Net(text_format.Parse({json.dumps(str(net))}, caffe2_pb2.NetDef()))
try:
    net.AddGradientOperators(["loss"])
    save_json("ok")
except Exception as e:
    save_json(str(e))
"""
    assert "same device option" in run_caffe2(script)[1]
    with pytest.raises(GradientError, match="blob 'x': its gradient contributions come from ops on different devices"):
        add_gradient_ops(net, ["loss"])
