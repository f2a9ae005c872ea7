"""``placer train-net --precision``: the mixed-precision train nets against real Caffe2.

The forward rewrite follows Caffe2's ImageNet trainer (caffe2/python/examples/
imagenet_trainer.py): parameters from ``PseudoFP16Initializer`` (a float32 master
``<p>_fp32`` filled, ``FloatToHalf`` to ``<p>``), the data in float16, the prediction cast
back (``HalfToFloat(pred) -> pred_fp32``) before the loss. The first tests hold placer's
rewrite of LeNet and AlexNet to exactly those casts. The rest hand placer's rewritten
forward net, its init net and the masters (``blob_copy``) to real Caffe2, which writes the
backward pass (``AddGradientOperators``) and the optimizer (``build_multi_precision_sgd``,
``build_fp16_sgd``); placer's train net and init net must hold the same ops.
"""
from __future__ import annotations

import json

import numpy as np

import pytest
from google.protobuf import text_format

from caffe2_oracle import run_caffe2
from placer.formats import caffe2_pb as pb
from placer.training.recipe import OptimizerChoice, TrainNetError, bias_blobs, make_train_nets
from test_training_compare import assert_same_ops, parse_net
from training_models import model


def _train(name: str, **choice):
    m = model(name)
    net = m.net()
    net.input_shapes.update(m.inputs)
    opt = choice.pop("optimizer", "nesterov")
    lr = choice.pop("lr", 0.01)
    return m, net, make_train_nets(net, [m.loss], OptimizerChoice(opt, lr, **choice))


def _forward_casts(result) -> list[tuple[str, str, str]]:
    return [(op.type, op.input[0], op.output[0]) for op in result.train.op[:result.forward_ops]
            if op.type in ("FloatToHalf", "HalfToFloat")]


@pytest.mark.corpus
@pytest.mark.parametrize("name,pred", [("lenet", "ip2"), ("alexnet", "fc8")])
def test_caffe_nets_are_cast_as_caffe2s_imagenet_trainer_casts(name, pred):
    m, net, r = _train(name, precision="amp-fp16")
    assert _forward_casts(r) == [("FloatToHalf", "data", "data_fp16"), ("HalfToFloat", pred, pred + "_fp32")]
    params = [p for p in net.params]
    assert sorted(r.masters) == sorted(params)
    assert all(r.masters[p] == p + "_fp32" for p in params)
    init_casts = [(op.input[0], op.output[0]) for op in r.init.op if op.type == "FloatToHalf"]
    assert init_casts == [(p + "_fp32", p) for p in params]    # each right after its fill
    for k, op in enumerate(r.init.op[:2 * len(params)]):
        assert (op.type == "FloatToHalf") == (k % 2 == 1)


def test_dlrm_keeps_its_tables_in_float32_and_casts_their_lookups():
    m, net, r = _train("dlrm", precision="amp-fp16")
    tables = [p for p in net.params if p.startswith("emb:::")]
    assert tables and not set(tables) & set(r.masters)
    assert set(r.masters) == set(r.params) - set(tables)     # not the int32 tril_indices either
    casts = _forward_casts(r)
    for k in range(3):
        assert ("FloatToHalf", f"emb:::sls{k}_z", f"emb:::sls{k}_z_fp16") in casts
    assert ("HalfToFloat", "prob_click", "prob_click_fp32") in casts


def test_fp16_takes_sgd_only():
    with pytest.raises(TrainNetError, match="fp16 --optimizer adam.*amp-fp16"):
        _train("dlrm", precision="fp16", optimizer="adam")


ORACLE = """
from caffe2.python import model_helper, optimizer
from caffe2.python.modeling.parameter_info import ParameterTags
spec = json.loads({spec!r})
result = {{}}
for case in spec:
    optimizer._optimizer_instance_count.clear()
    workspace.ResetWorkspace()
    predict, init = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
    text_format.Parse(case["forward"], predict)
    text_format.Parse(case["init"], init)
    m = model_helper.ModelHelper(name=predict.name)
    m.net = core.Net(predict)
    m.param_init_net = core.Net(init)
    for p in case["params"]:
        m.AddParameter(core.BlobReference(p),
                       ParameterTags.WEIGHT if p in case["weights"] else ParameterTags.BIAS)
    m.AddGradientOperators(case["losses"])
    for p, master in case["masters"].items():     # what PseudoFP16Initializer records
        m.get_param_info(core.BlobReference(p)).blob_copy = {{core.DataType.FLOAT: core.BlobReference(master)}}
    exec(case["builder"])
    result[case["id"]] = {{"train": net_text(m.net), "init": net_text(m.param_init_net)}}
save_json(result)
"""

SPARSE_SGD = ("for p, g in m.param_to_grad.items():\n"
              "    if isinstance(g, core.GradientSlice):\n"
              "        m.get_param_info(p).optimizer = table_opt\n")

# id -> (model, placer's choice, the Caffe2 builder code run with the model ``m``)
CASES = {
    "lenet-amp-nesterov": ("lenet", dict(precision="amp-fp16"),
                           "optimizer.build_multi_precision_sgd(m, 0.01, momentum=0.9)"),
    "lenet-amp-sgd": ("lenet", dict(precision="amp-fp16", optimizer="sgd"),
                      "optimizer.build_multi_precision_sgd(m, 0.01, momentum=0.0, nesterov=False)"),
    "lenet-amp-wd": ("lenet", dict(precision="amp-fp16", weight_decay=5e-4),
                     "optimizer.add_weight_decay(m, 5e-4)\n"
                     "optimizer.build_multi_precision_sgd(m, 0.01, momentum=0.9)"),
    "lenet-fp16-nesterov": ("lenet", dict(precision="fp16", weight_decay=1e-4),
                            "optimizer.build_fp16_sgd(m, 0.01, momentum=0.9, weight_decay=1e-4)"),
    "alexnet-amp-momentum": ("alexnet", dict(precision="amp-fp16", optimizer="momentum"),
                             "optimizer.build_multi_precision_sgd(m, 0.01, momentum=0.9, nesterov=False)"),
    "alexnet-fp16-nesterov": ("alexnet", dict(precision="fp16"),
                              "optimizer.build_fp16_sgd(m, 0.01, momentum=0.9, weight_decay=0.0)"),
    "dlrm-amp-nesterov": ("dlrm", dict(precision="amp-fp16"),
                          "optimizer.build_multi_precision_sgd(m, 0.01, momentum=0.9)"),
    "dlrm-fp16-nesterov": ("dlrm", dict(precision="fp16"),
                           "table_opt = optimizer.SgdOptimizer(0.01, momentum=0.9)\n" + SPARSE_SGD +
                           "optimizer.build_fp16_sgd(m, 0.01, momentum=0.9, weight_decay=0.0)"),
}


@pytest.fixture(scope="module")
def oracle_nets():
    spec, ours = [], {}
    for case_id, (name, choice, builder) in CASES.items():
        if name != "dlrm":
            from conftest import corpus_dir
            corpus_dir()         # skips (or fails under CI=true) without ../shared
        m, net, r = _train(name, **dict(choice))
        forward = pb.NetDef()
        forward.CopyFrom(r.train)
        del forward.op[r.forward_ops:]
        init = pb.NetDef()
        init.CopyFrom(r.init)
        del init.op[len(net.init_proto.op) + len(r.masters):]
        spec.append({"id": case_id, "forward": text_format.MessageToString(forward),
                     "init": text_format.MessageToString(init), "params": r.params,
                     "masters": r.masters, "losses": [m.loss], "builder": builder,
                     "weights": sorted(set(r.params) - bias_blobs(net.proto.op))})
        ours[case_id] = r
    theirs = run_caffe2(ORACLE.format(spec=json.dumps(spec)))[1]
    return ours, theirs


@pytest.mark.caffe2
@pytest.mark.parametrize("case_id", sorted(CASES))
def test_mixed_precision_train_nets_equal_caffe2s_builders(case_id, oracle_nets):
    ours, theirs = oracle_nets
    r, t = ours[case_id], theirs[case_id]
    assert_same_ops(r.train.op, parse_net(t["train"]).op, f"{case_id} train net")
    assert_same_ops(r.init.op, parse_net(t["init"]).op, f"{case_id} init net")


def test_bf16_casts_differentiate_into_each_other():
    m, net, r = _train("lenet", precision="amp-bf16")
    assert _forward_casts(r) == []
    grads = r.train.op[r.forward_ops:]
    ups = [(op.input[0], op.output[0]) for op in grads if op.type == "BFloat16ToFloat"]
    downs = [(op.input[0], op.output[0]) for op in grads if op.type == "FloatToBFloat16"]
    assert ("data_bf16_grad", "data_grad") in ups           # FloatToBFloat16(data)'s gradient
    assert ("ip2_fp32_grad", "ip2_grad") in downs            # BFloat16ToFloat(ip2)'s gradient
    assert ("ip2_w_fp32", "ip2_w") in [(op.input[0], op.output[0]) for op in r.init.op
                                       if op.type == "FloatToBFloat16"]
    assert any("Caffe2 has no bfloat16" in n for n in r.notes)


def test_interleaved_updates_keep_every_dependency_and_run_each_update_early():
    _, _, caffe2_order = _train("lenet", precision="amp-fp16")
    _, _, interleaved = _train("lenet", precision="amp-fp16", update_order="interleaved")
    # the same ops with the same dependencies (the canonical order depends on nothing else)
    assert_same_ops(interleaved.train.op, caffe2_order.train.op, "interleaved train net")
    ops = list(interleaved.train.op)
    where = {}
    for k, op in enumerate(ops):
        for b in op.output:
            where.setdefault(b, k)
    # ip2's update runs before conv1's gradient is made (the backward pass is not over yet)
    update = next(k for k, op in enumerate(ops) if op.type == "MomentumSGDUpdate" and "ip2_w_fp32" in op.output)
    assert update < where["conv1_w_grad"]
    assert where["ip2_w_grad"] < update


def test_interleaved_updates_train_to_the_same_values():
    from training_models import batches, initial_values
    from placer.formats.caffe2 import net_from_netdef
    from placer.runtime.executor import Executor
    m = model("lenet")
    steps, init = batches(m, 3), initial_values("lenet")
    states = []
    for order in ("after-backward", "interleaved"):
        _, _, r = _train("lenet", optimizer="adam", lr=1e-3, update_order=order)
        ex = Executor(net_from_netdef(r.train, r.init))
        ex.run_init()
        ex.load_state(init)
        ex.run(lambda s: steps[s], iterations=3, warmup=0)
        states.append(ex.host_state())
    for p in init:      # the same ops on the same values in another order: bit for bit
        np.testing.assert_array_equal(states[0][p], states[1][p], err_msg=p)
