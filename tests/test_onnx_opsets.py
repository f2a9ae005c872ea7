"""One model at every opset placer reads, 9 to the newest of the installed onnx: written at
opset 9 with the ops whose attributes later opsets moved to inputs (Clip's bounds, Pad's
pads, Slice's bounds, Squeeze/Unsqueeze's axes, Split's sizes, ReduceSum's axes) and the
ones whose semantics changed (Softmax's axis at 13, Upsample -> Resize at 10), raised by
``onnx.version_converter`` to each later opset, converted by placer and run: outputs equal
ONNX Runtime's. Tolerance: float32 sums of at most 36 terms (rtol 1e-5, atol 1e-6 of the
largest output; a wrong mapping moves values by far more).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, version_converter

from placer.formats.onnx import convert_onnx, OLDEST_OPSET
from placer.formats.caffe2 import net_from_netdef
from placer.runtime.executor import Executor

ort = pytest.importorskip("onnxruntime")
NEWEST = onnx.defs.onnx_opset_version()
# ONNX Runtime lags the onnx package by an opset or two; newer ones are converted, not run by it
ORT_NEWEST = 21


def opset9_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 4, 1, 144], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c"], ["r"], min=-0.5, max=0.7),
        helper.make_node("Pad", ["r"], ["p"], pads=[0, 0, 1, 0, 0, 0, 0, 1], mode="constant", value=0.25),
        helper.make_node("Slice", ["p"], ["s"], starts=[1, 0], ends=[7, 6], axes=[2, 3]),
        helper.make_node("Upsample", ["s", "scales"], ["u"], mode="nearest"),
        helper.make_node("Split", ["u"], ["a", "b"], axis=1, split=[1, 3]),
        helper.make_node("ReduceSum", ["b"], ["bs"], axes=[1], keepdims=1),
        helper.make_node("Add", ["a", "bs"], ["ab"]),
        helper.make_node("Squeeze", ["ab"], ["sq"], axes=[1]),
        helper.make_node("Unsqueeze", ["sq"], ["us"], axes=[1]),
        helper.make_node("Concat", ["us", "b"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["flat"]),
        helper.make_node("Softmax", ["flat"], ["y"], axis=3),
    ]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 144])],
                              [w, shape, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def base():
    model = opset9_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    return model, x, want


@pytest.mark.parametrize("opset", range(OLDEST_OPSET, NEWEST + 1))
def test_the_model_at_every_opset_gives_onnx_runtimes_outputs(base, opset, tmp_path):
    model, x, want = base
    raised = model if opset == 9 else version_converter.convert_version(model, opset)
    assert raised.opset_import[0].version == opset
    path = tmp_path / f"m{opset}.onnx"
    onnx.save(raised, str(path))
    if opset <= ORT_NEWEST:  # the raised model means what the original means
        again = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
        np.testing.assert_allclose(again, want, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(want))))
    result = convert_onnx(path)
    assert result.opset == opset
    ex = Executor(net_from_netdef(result.predict, result.init))
    ex.run_init()
    got = ex.run({"x": x}, warmup=0)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(want))))
