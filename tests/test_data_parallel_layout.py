"""data_parallel against real Caffe2's data_parallel_model, op for op.

Real Caffe2 builds each model twice with brew: once on one device (``AddGradientOperators``
+ an ``optimizer.build_*``), once through ``data_parallel_model.Parallelize_CPU`` (or
``Parallelize_GPU``) over devices 0..3 with the same builder functions; placer lays out
the one-device nets and must write the same ops (types, inputs, outputs, arguments,
device options, order up to independent ops), the same init net, the same net fields.

The models: the Caffe2 tutorial's LeNet, and a DLRM-shaped net (an embedding table read
by SparseLengthsSum beside a dense MLP). On CPU devices the table is made before
``Parallelize`` (data_parallel_model keeps such parameters once; it cannot all-reduce
gradient slices on CPUs); on GPUs it is replicated and its gradient slices gathered.
Caffe2's GPU code runs here with the NCCL op names registered and no peer access between
GPUs (so it writes the copies of its Sum tree, as placer does); where it reads a peer's
blob directly (the gathered slices' Concat), placer's copies are added to Caffe2's net
by the rule placer documents before comparing.
"""
from __future__ import annotations

import json

import pytest

from caffe2_oracle import run_caffe2
from placer.formats import caffe2_pb as pb
from placer.training.data_parallel import DataParallelError, data_parallel
from test_training_compare import assert_same_ops, parse_net

pytestmark = pytest.mark.caffe2

ORACLE = '''
from caffe2.python import brew, model_helper, optimizer, data_parallel_model as dpm
from caffe2.python.modeling import initializers
for name in ["NCCLAllreduce", "NCCLBroadcast"]:      # the CPU build knows their schemas only
    core._REGISTERED_OPERATORS.add(workspace.C.op_registry_key(name, "DEFAULT"))
workspace.GetGpuPeerAccessPattern = lambda: np.zeros((4, 4), bool)

def scaled(m, loss, loss_scale):
    return [m.net.Scale(loss, loss, scale=loss_scale) if loss_scale is not None else loss]

def lenet(m, loss_scale=None):
    conv1 = brew.conv(m, "data", "conv1", dim_in=1, dim_out=20, kernel=5)
    pool1 = brew.max_pool(m, conv1, "pool1", kernel=2, stride=2)
    conv2 = brew.conv(m, pool1, "conv2", dim_in=20, dim_out=50, kernel=5)
    pool2 = brew.max_pool(m, conv2, "pool2", kernel=2, stride=2)
    fc3 = brew.fc(m, pool2, "fc3", dim_in=50 * 4 * 4, dim_out=500)
    relu = brew.relu(m, fc3, fc3)
    pred = brew.fc(m, relu, "pred", 500, 10)
    softmax = brew.softmax(m, pred, "softmax")
    xent = m.net.LabelCrossEntropy([softmax, "label"], "xent")
    return scaled(m, m.net.AveragedLoss(xent, "loss"), loss_scale)

def table(m):
    return m.create_param("emb", shape=[50, 4],
                          initializer=initializers.Initializer("UniformFill", min=-0.1, max=0.1))

def dlrm(m, loss_scale=None, emb=None):
    pooled = m.net.SparseLengthsSum([emb or table(m), "indices", "lengths"], "pooled")
    dense = brew.fc(m, "dense", "bot", dim_in=3, dim_out=4)
    both = brew.concat(m, [pooled, dense], "both", axis=1)
    top = brew.fc(m, both, "top", dim_in=8, dim_out=2)
    _, loss = m.net.SoftmaxWithLoss([top, "label"], ["softmax", "loss"])
    return scaled(m, loss, loss_scale)

OPT = {"sgd": lambda m: optimizer.build_sgd(m, 0.1),
       "momentum": lambda m: (optimizer.add_weight_decay(m, 1e-4), optimizer.build_sgd(m, 0.1, momentum=0.9)),
       "adagrad": lambda m: optimizer.build_adagrad(m, 0.05), "adam": lambda m: optimizer.build_adam(m, 0.01)}

out = {}
for model, opt, kind, nccl in json.loads(cases):
    optimizer._optimizer_instance_count.clear()
    one = model_helper.ModelHelper(name=model)
    one.AddGradientOperators((lenet if model == "lenet" else dlrm)(one))
    OPT[opt](one)
    optimizer._optimizer_instance_count.clear()
    dp = model_helper.ModelHelper(name=model)
    forward = lenet
    if model == "dlrm":
        emb = table(dp) if kind == "cpu" else None
        forward = lambda m, s: dlrm(m, s, emb)
    parallelize = dpm.Parallelize_CPU if kind == "cpu" else dpm.Parallelize_GPU
    parallelize(dp, input_builder_fun=lambda m: None, forward_pass_builder_fun=forward,
                optimizer_builder_fun=OPT[opt], devices=[0, 1, 2, 3], use_nccl=nccl)
    out["/".join(map(str, (model, opt, kind, nccl)))] = [
        net_text(one.net), net_text(one.param_init_net), net_text(dp.net), net_text(dp.param_init_net)]
save_json(out)
'''

CASES = [(m, o, "cpu", False) for m in ("lenet", "dlrm") for o in ("sgd", "momentum", "adagrad", "adam")]
CASES += [("lenet", "momentum", "gpu", True), ("lenet", "adam", "gpu", True), ("dlrm", "sgd", "gpu", True),
          ("dlrm", "adagrad", "gpu", True), ("lenet", "sgd", "gpu", False)]


@pytest.fixture(scope="module")
def caffe2_nets():
    _, nets = run_caffe2(f"cases = {json.dumps(json.dumps(CASES))}\n" + ORACLE, {})
    return {key: [parse_net(text) for text in texts] for key, texts in nets.items()}


def with_peer_copies(net):
    """Caffe2's net with placer's rule applied: each input of a gathering Concat that lives
    on another GPU is first copied to the Concat's GPU as ``gpu_<d0>/<blob>_gpu<peer>_copy``."""
    out = pb.NetDef()
    out.CopyFrom(net)
    del out.op[:]
    for op in net.op:
        if op.type == "Concat" and op.name == "note:data_parallel_model":
            op = pb.OperatorDef.FromString(op.SerializeToString())
            master = op.device_option.device_id
            for i, blob in enumerate(op.input):
                scope, _, stripped = blob.partition("/")
                peer = int(scope.split("_")[1])
                if peer != master:
                    copy = out.op.add(type="Copy", name="", input=[blob],
                                      output=[f"gpu_{master}/{stripped}_gpu{peer}_copy"])
                    copy.device_option.device_type, copy.device_option.device_id = 1, master
                    op.input[i] = copy.output[0]
        out.op.append(op)
    return out


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_layout_is_data_parallel_models(case, caffe2_nets):
    model, opt, kind, nccl = case
    one, one_init, theirs, theirs_init = caffe2_nets["/".join(map(str, case))]
    got = data_parallel(one, one_init, 4, kind, use_nccl=nccl)
    if kind == "gpu" and model == "dlrm":
        theirs = with_peer_copies(theirs)
    assert_same_ops(got.train.op, theirs.op, f"{case} train net")
    assert_same_ops(got.init.op, theirs_init.op, f"{case} init net")
    assert (got.train.type, got.train.num_workers) == (theirs.type, theirs.num_workers) == ("dag", 16)
    assert [(a.name, a.i) for a in got.train.arg] == [(a.name, a.i) for a in theirs.arg]
    assert list(got.train.external_input) == list(theirs.external_input)
    assert got.shared == (["emb"] if (model, kind) == ("dlrm", "cpu") else [])
    ops = {op.type for op in got.train.op}
    if kind == "gpu" and nccl:
        assert "NCCLAllreduce" in ops and "Sum" not in ops
    elif kind == "cpu":
        assert "NCCLAllreduce" not in ops and "Sum" in ops


# -- refusals --------------------------------------------------------------------------

def test_a_net_without_a_loss_seed_is_refused_in_one_line():
    net = pb.NetDef(name="predict")
    net.op.add(type="Relu", input=["x"], output=["y"])
    with pytest.raises(DataParallelError) as e:
        data_parallel(net, pb.NetDef(), 4, "cpu")
    assert "\n" not in str(e.value) and "no loss seed" in str(e.value) and "'predict'" in str(e.value)


def test_sparse_gradients_replicated_on_cpus_are_refused_as_data_parallel_model_does(caffe2_nets):
    one, one_init, *_ = caffe2_nets["dlrm/sgd/cpu/False"]
    with pytest.raises(DataParallelError, match=r"\['emb'\] have sparse gradients"):
        data_parallel(one, one_init, 4, "cpu", shared=[])
    with pytest.raises(DataParallelError, match="distinct device numbers"):
        data_parallel(one, one_init, [0, 0], "cpu")
