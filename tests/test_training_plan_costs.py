"""Gradient and optimizer ops are priced like forward ones.

- A ConvGradient / FCGradient does twice its forward op's multiply-adds (the weight
  gradient and the input gradient, each one forward's worth), and the planner prices it
  at least as long as its forward op on every device.
- A sparse update costs by the rows it touches: the same lookups into a table 1,000 times
  larger give the same work and traffic (only the parameter bytes it holds differ) and
  the same op time.
- ``placer profile`` (in-network: one training step per timed run) records the gradient
  and optimizer ops of a train net like any other.
"""
from __future__ import annotations

import json

import numpy as np
from test_training_plan import dense_net, machine, sparse_net, typed

from placer.cli import main
from placer.costs.model import annotate
from placer.examples.builder import NetBuilder
from placer.formats import load_net
from placer.shapes import infer, require_complete
from placer.types import DATA_TYPE_TO_DTYPE, TensorType


def test_conv_and_fc_gradients_do_twice_the_forward_work():
    from placer.examples import DATA
    spec = json.loads((DATA / "resnet_small_train.value_info.json").read_text())
    shapes = {k: TensorType(tuple(s), DATA_TYPE_TO_DTYPE[t]) for k, (t, s) in spec.items()}
    net = load_net(DATA / "resnet_small_train.pbtxt", init_path=DATA / "resnet_small_train_init.pbtxt",
                   input_shapes=shapes)
    t = require_complete(infer(net, shapes))
    costs = annotate(t, machine(1))
    forward = {op.outputs[0]: op.index for op in net.ops if op.type in ("Conv", "FC")}
    pairs = [(forward[op.inputs[2][:-len("_grad")]], op.index) for op in net.ops
             if op.type in ("ConvGradient", "FCGradient")]
    assert len(pairs) == 16
    for f, g in pairs:
        assert t.features[g].macs == 2 * t.features[f].macs > 0
        assert (costs.op_s[g] >= costs.op_s[f]).all()


def sparse_update_net(rows: int) -> NetBuilder:
    b = sparse_net()
    for op in b.init.op:
        if op.output[0] == "emb":
            del op.arg[0].ints[:]
            op.arg[0].ints.extend([rows, 64])
    return b


def test_a_sparse_update_costs_by_the_rows_it_touches():
    small, large = typed(sparse_update_net(1000)), typed(sparse_update_net(1_000_000))
    i = next(op.index for op in small.net.ops if op.type == "SparseAdagrad")
    assert small.blobs["emb"].nbytes * 1000 == large.blobs["emb"].nbytes
    a, b = small.features[i], large.features[i]
    assert (a.flops, a.macs, a.bytes_read, a.bytes_written) == (b.flops, b.macs, b.bytes_read, b.bytes_written)
    assert small.features[i].bytes_read < 10 * 2048 * 64 * 4          # lookups, not the table
    m = machine(1)
    np.testing.assert_allclose(annotate(small, m).op_s[i], annotate(large, m).op_s[i])


def test_profile_times_gradient_and_optimizer_ops_in_a_train_net(tmp_path):
    dense_net().save(tmp_path, "dense")
    out = tmp_path / "cpu.json"
    args = ["profile", str(tmp_path / "dense.pbtxt"), "--init-net", str(tmp_path / "dense_init.pbtxt"),
            "--device", "cpu", "--repeats", "3", "--warmup", "1", "--quiet", "-o", str(out)]
    assert main(args) == 0
    entries = json.loads(out.read_text())["devices"][0]["ops"]
    timed = {e["type"] for e in entries if e["method"] == "in-network" and e["median_s"] > 0}
    assert {"FCGradient", "SoftmaxWithLossGradient", "ReluGradient", "MomentumSGDUpdate", "Scale"} <= timed
    assert {"FC", "Relu", "SoftmaxWithLoss"} <= timed
