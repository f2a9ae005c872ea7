"""Hostile ONNX files for the command line (``tests/fuzz_cases.py`` runs them).

``onnx_cases`` returns ``(Case, expected)``: the case, and a phrase its one-line error must
hold (None where exit 0 is the right answer). The files are written with ``onnx.helper``:
a small valid CNN, then that model truncated, with bytes flipped, with an opset newer than
the installed onnx knows, importing no default opset, with a missing initializer, with a
cycle, with nodes out of order, with an op placer does not map, a custom-domain op, a
3-D convolution, an input of no shape or an open dimension, of 2^40 x 2^40 elements, external data that is
not there, an attribute the checker refuses, and ``--input`` sizes that contradict it.
"""
from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuzz_cases import Case

SEED = 20261202


def _model(nodes, inputs, outputs, inits=(), opset=17, **kw):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)


def small_cnn(opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    fw = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "fw")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1, name="fc")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])
    return _model(nodes, [x], [y], [w, b, fw], opset)


def _bytes(m: onnx.ModelProto) -> bytes:
    return m.SerializeToString()


def onnx_cases() -> list[tuple[Case, str | None]]:
    rng = random.Random(SEED)
    good = _bytes(small_cnn())
    out: list[tuple[Case, str | None]] = []

    def add(name, model_bytes, expected, argv=("inspect",), extra=(), files=None):
        out.append((Case(f"onnx-{name}", [*argv, "m.onnx", *extra], {"m.onnx": model_bytes, **(files or {})}),
                    expected))

    add("valid-inspect", good, None)
    add("valid-plan", good, None, ("plan",), ("--gpu-profile", "t4-pcie3", "--input", "x=4,3,8,8"))
    add("valid-run", good, None, ("run",), ("--quiet",))
    add("valid-convert", good, None, ("convert",), ("-o", "out"))
    add("truncated", good[: len(good) // 2], "not a valid ONNX model")
    add("truncated-plan", good[: len(good) - 7], "not a valid ONNX model", ("plan",))
    add("empty", b"", "not a valid ONNX model")
    add("garbage", bytes(rng.randrange(256) for _ in range(4096)), "not a valid ONNX model")
    for k in range(6):  # flipped bytes: refused or read, never a traceback
        data = bytearray(good)
        for _ in range(3):
            data[rng.randrange(len(data))] = rng.randrange(256)
        add(f"flipped-{k}", bytes(data), "")

    m = small_cnn()
    m.opset_import[0].version = 99
    add("opset-too-new", _bytes(m), "opset 99 is newer")
    m = small_cnn()
    m.opset_import[0].domain = "com.example"
    add("no-default-opset", _bytes(m), "imports no version of the default ONNX operator set")

    m = small_cnn()
    del m.graph.initializer[0]  # "w"
    add("missing-initializer", _bytes(m), "which no node, graph input or initializer provides")
    add("missing-initializer-plan", _bytes(m), "which no node, graph input or initializer provides", ("plan",))

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    cyc = _model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                  helper.make_node("Relu", ["b"], ["y"])], [x], [y])
    add("cycle", _bytes(cyc), "the graph has a cycle")
    order = _model([helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["x"], ["a"])], [x], [y])
    add("out-of-order", _bytes(order), "not in topological order")
    self_loop = _model([helper.make_node("Add", ["x", "y"], ["y"])], [x], [y])
    add("self-loop", _bytes(self_loop), "the graph has a cycle")

    einsum = _model([helper.make_node("Einsum", ["x", "x"], ["y"], equation="ij,ij->ij")], [x], [y], opset=17)
    add("unmapped-op", _bytes(einsum), "op type Einsum has no Caffe2 mapping")
    custom = _model([helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")], [x], [y],
                    opset=17)
    custom.opset_import.append(helper.make_opsetid("com.example", 1))
    add("custom-domain-op", _bytes(custom), "outside the default ONNX domain")

    x5 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4, 4])
    w5 = numpy_helper.from_array(np.ones((2, 2, 1, 1, 1), np.float32), "w")
    conv3d = _model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1, 1])], [x5],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4, 4])], [w5])
    add("conv-3d", _bytes(conv3d), "spatial dimension")

    shapeless = _model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], [y])
    add("input-without-shape", _bytes(shapeless), "onnx.checker refuses")
    open_dims = _model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    add("input-open-dim", _bytes(open_dims), None)
    add("input-open-dim-given", _bytes(open_dims), None, ("run",), ("--input", "x=2,3", "--quiet"))
    huge = _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2 ** 40, 2 ** 40])], [y])
    add("input-2^80-elements", _bytes(huge), "")
    add("input-2^80-elements-run", _bytes(huge), "", ("run",), ("--quiet",))

    m = small_cnn()
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="weights.bin")
    add("external-data-missing", _bytes(m), "external data")

    bad_attr = _model([helper.make_node("Relu", ["x"], ["y"], color="blue")], [x], [y])
    add("checker-refuses", _bytes(bad_attr), "onnx.checker refuses")

    add("input-wrong-rank", good, "dimensions given", extra=("--input", "x=4,3,8"))
    add("input-fixed-dim-changed", good, "fixes it at", extra=("--input", "x=4,3,9,8"))
    add("input-unknown-name", good, "no data input", extra=("--input", "z=1,2"))
    add("init-net-with-onnx", good, "--init-net and --weights apply", extra=("--init-net", "m.onnx"))
    add("convert-with-solver", good, "applies to Caffe nets", ("convert",), ("-o", "out", "--solver", "s.prototxt"),
        {"s.prototxt": b'net: "m.onnx"\n'})
    return out
