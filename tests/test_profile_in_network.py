"""In-network profiling: entries pooled per key from a whole-net run, marked in-network;
nets that cannot run whole are refused by name (the command then times op by op)."""
from __future__ import annotations

import numpy as np
import pytest

from placer.examples.builder import NetBuilder, make_op
from placer.formats.caffe2 import net_from_netdef, parse_text
from placer.profiling.in_network import InNetworkUnavailable, _entries, profile_in_network
from placer.hardware.device_profile import op_key
from placer.shapes import infer
from placer.types import TensorType


def _mlp(batch: int = 4):
    """FC -> Relu -> FC -> Relu (both Relus at [batch, 16]: one key) -> Softmax."""
    b = NetBuilder("mlp")
    x = b.input("data", (batch, 8))
    for i, (n, k) in enumerate(((16, 8), (16, 16))):
        w = b.param(f"w{i}", (n, k), "XavierFill")
        bias = b.param(f"b{i}", (n,), "ConstantFill", value=0.1)
        x = b.op("Relu", [b.op("FC", [x, w, bias], f"h{i}")], f"r{i}")
    b.output(b.op("Softmax", [x], "p"))
    net = net_from_netdef(b.predict, b.init)
    return infer(net, {"data": TensorType((batch, 8))})


def test_entries_pool_samples_of_ops_that_share_a_key():
    typed = _mlp()
    samples = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0], [4.0, 5.0, 6.0], [40.0, 50.0, 60.0], [7.0, 8.0, 9.0]]
    result = _entries(typed, [(s, len(s)) for s in samples])
    relu_key = op_key("Relu", (TensorType((4, 16)),), {})
    relu = result.timings[relu_key]
    pooled = samples[1] + samples[3]           # ops 1 and 3 are the two Relus
    q1, med, q3 = np.percentile(pooled, [25, 50, 75])
    assert relu.samples == 6 and relu.median_s == pytest.approx(med) and relu.iqr_s == pytest.approx(q3 - q1)
    assert relu.method == "in-network"
    assert relu.bytes == 2 * 4 * 16 * 4 and relu.flops == 4 * 16   # read + write float32; one max per element
    assert result.ops_timed == len(result.timings) == 4              # FC, FC (other K), Relu, Softmax


def test_profile_runs_the_net_and_times_every_op():
    typed = _mlp()
    result = profile_in_network(typed, iterations=3, warmup=1, progress=False)
    assert len(result.timings) == 4 and not result.skipped
    for timing in result.timings.values():
        assert timing.method == "in-network" and timing.median_s > 0 and timing.iqr_s >= 0
    relu = result.timings[op_key("Relu", (TensorType((4, 16)),), {})]
    assert relu.samples == 2 * 3                                     # two instances x three runs


def test_unknown_op_type_is_refused_by_name():
    net = net_from_netdef(parse_text('''name: "u"
op { type: "Relu" input: "x" output: "y" }
op { type: "MyCustomOp" input: "y" output: "z" }
external_input: "x" external_output: "z"'''))
    typed = infer(net, {"x": TensorType((2, 3))})
    with pytest.raises(InNetworkUnavailable) as e:
        profile_in_network(typed, progress=False)
    assert "MyCustomOp" in str(e.value) and "unknown op type" in str(e.value)
    assert list(e.value.reasons.values()) == ["unknown op type"]


def test_an_op_without_a_gpu_kernel_keeps_the_net_off_the_gpu_only():
    net = net_from_netdef(parse_text('''name: "r"
op { type: "LengthsToRanges" input: "lens" output: "ranges" name: "ranges" }
external_input: "lens" external_output: "ranges"'''))
    typed = infer(net, {"lens": TensorType((3,), "int32")})
    with pytest.raises(InNetworkUnavailable) as e:
        profile_in_network(typed, device_name="cuda:0", progress=False)
    assert list(e.value.reasons.values()) == ["no GPU kernel"] and "'ranges'" in str(e.value)
    assert profile_in_network(typed, device_name="cpu", iterations=1, warmup=0, progress=False).ops_timed == 1


def test_init_net_without_values_is_refused():
    b = NetBuilder("shapes_only")
    x = b.input("data", (2, 4))
    b.init.op.append(make_op("GivenTensorFill", [], ["w"], shape=[3, 4]))   # a shape, no values
    b.init.external_output.append("w")
    b.predict.external_input.append("w")
    b.output(b.op("FC", [x, "w"], "y", axis=1))
    net = net_from_netdef(b.predict, b.init)
    typed = infer(net, {"data": TensorType((2, 4))})
    with pytest.raises(InNetworkUnavailable, match="does not run"):
        profile_in_network(typed, progress=False)
