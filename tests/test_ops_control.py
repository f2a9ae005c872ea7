"""IsEmpty and If (nested then_net / else_net): kernels and the executor against real
Caffe2, shape inference of nested nets, and Mask R-CNN2Go's If typed."""
from __future__ import annotations

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from conftest import corpus_dir
from cupy_standin import check_gpu_kernel
from google.protobuf import text_format

from placer import shapes
from placer.errors import DeviceError, ShapeError
from placer.formats import caffe2_pb as pb
from placer.formats import load_net
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.runtime.executor import Executor
from placer.types import Args, Device, TensorType

# IsEmpty(d) -> c; If(c): then y = Relu(x); else y = Sigmoid(x), z = Scale(y); then w = Add(y, x)
# outside. The If lists x and y (as Caffe2's python add_if_op does, and as the loader's
# structure check needs for y's later reader); else also writes z, which it does not list.
IF_NET = """
name: "if_test"
op { input: "d" output: "c" type: "IsEmpty" }
op {
  input: "c" input: "x" output: "y" type: "If"
  arg { name: "then_net" n { name: "t" op { input: "x" output: "y" type: "Relu" } } }
  arg { name: "else_net" n { name: "e"
    op { input: "x" output: "y" type: "Sigmoid" }
    op { input: "y" output: "z" type: "Scale" arg { name: "scale" f: 2.0 } } } }
}
op { input: "y" input: "x" output: "w" type: "Add" }
external_input: "d"
external_input: "x"
external_output: "w"
"""

ORACLE = """
net = caffe2_pb2.NetDef()
text_format.Parse(inputs_text, net)
for k, v in inputs.items():
    workspace.FeedBlob(k, v)
workspace.RunNetOnce(net)
save(**{b: workspace.FetchBlob(b) for b in ("c", "y", "w", "z") if workspace.HasBlob(b)
        and workspace.FetchBlob(b) is not None and not isinstance(workspace.FetchBlob(b), bytes)})
"""


def netdef(text: str = IF_NET) -> pb.NetDef:
    return text_format.Parse(text, pb.NetDef())


def feeds(empty: bool) -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    return {"x": x, "d": np.zeros((0 if empty else 3, 4), np.float32)}


def caffe2_run(arrays: dict, text: str = IF_NET) -> dict:
    script = f"inputs_text = {text!r}\n" + ORACLE
    saved, _ = run_caffe2(script, arrays)
    return saved


# ---------------------------------------------------------------- IsEmpty

@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (2, 3), ()], ids=str)
def test_is_empty_kernel_and_infer(shape):
    opdef = registry.get("IsEmpty")
    x = np.ones(shape, np.float32)
    (out,) = opdef.kernel(np, [x], Args({}, op="#0 IsEmpty"))
    assert out.dtype == np.bool_ and out.shape == () and bool(out) == (x.size == 0)
    assert opdef.infer([TensorType(shape)], Args({})) == [TensorType((), "bool")]
    assert opdef.caffe2_kinds() == {"cpu"} and opdef.devices == {"cpu", "gpu"}


@pytest.mark.caffe2
@pytest.mark.parametrize("shape", [(0, 4), (3, 4)], ids=str)
def test_is_empty_matches_caffe2(shape):
    x = np.zeros(shape, np.float32)
    saved, _ = run_caffe2("""
workspace.FeedBlob("x", inputs["x"])
workspace.RunOperatorOnce(core.CreateOperator("IsEmpty", ["x"], ["c"]))
save(c=workspace.FetchBlob("c"))
""", {"x": x})
    (out,) = registry.get("IsEmpty").kernel(np, [x], Args({}))
    assert saved["c"].dtype == out.dtype and saved["c"].shape == out.shape and bool(saved["c"]) == bool(out)


# (op type, inputs, args) for the strict cupy stand-in. If has no kernel of its own: the
# executor runs its branch's ops (covered by their families' cases, and by the emulated-GPU
# run below).
KERNEL_CASES = [("IsEmpty", [np.zeros((0, 4), np.float32)], {}),
                ("IsEmpty", [np.zeros((3, 4), np.float32)], {})]


@pytest.mark.parametrize("op_type,inputs,args", KERNEL_CASES, ids=lambda c: str(c)[:20])
def test_gpu_kernels_keep_to_cupy_rules(op_type, inputs, args):
    check_gpu_kernel(registry.get(op_type), inputs, Args(args, op=f"#0 {op_type}"))


# ---------------------------------------------------------------- If on the executor

@pytest.mark.caffe2
@pytest.mark.parametrize("empty", [True, False], ids=["then", "else"])
def test_if_runs_the_branch_caffe2_runs(empty):
    arrays = feeds(empty)
    want = caffe2_run(arrays)
    net = net_from_netdef(netdef())
    got = Executor(net).run(arrays, warmup=0)
    # Relu, Scale and Add are exact in float32; Sigmoid is 1/(1+exp(-x)) in both, with exp
    # from different libraries (Eigen vs numpy) within a few ulps: rtol 1e-6 is ~8 ulps
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6, atol=1e-7)
    assert bool(want["c"]) is empty
    # the branch wrote y in the outer workspace; else also made z, then did not
    assert ("z" in want) is (not empty)


@pytest.mark.parametrize("empty", [True, False], ids=["then", "else"])
def test_if_executor_reads_and_writes_outer_blobs(empty):
    arrays = feeds(empty)
    net = net_from_netdef(netdef())
    net.external_outputs += ["y"]
    got = Executor(net).run(arrays, warmup=0)
    x = arrays["x"]
    y = np.maximum(x, 0) if empty else 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(got["y"], y, rtol=1e-6)
    np.testing.assert_allclose(got["w"], y + x, rtol=1e-6)


@pytest.mark.parametrize("empty", [True, False], ids=["then", "else"])
def test_if_runs_its_branch_on_its_own_gpu(empty):
    """The whole If, branch included, on one (emulated) GPU; the outer ops there too."""
    arrays = feeds(empty)
    net = net_from_netdef(netdef())
    gpu = Device("gpu", 0)
    ex = Executor(net, device_map={op.index: gpu for op in net.ops}, emulate_gpu=True)
    got = ex.run(arrays, warmup=0)
    x = arrays["x"]
    y = np.maximum(x, 0) if empty else 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(got["w"], y + x, rtol=1e-6)


def test_if_on_a_gpu_wants_its_condition_there():
    """As Caffe2's CUDA If (a CUDA tensor condition): IsEmpty on the CPU, If on a GPU."""
    net = net_from_netdef(netdef())
    gpu = Device("gpu", 0)
    ex = Executor(net, device_map={1: gpu, 2: gpu}, emulate_gpu=True)
    with pytest.raises(DeviceError, match="If.*'c'"):
        ex.run(feeds(True), warmup=0)


# an If inside the then branch of an If: both levels read and write the outer blobs
NESTED_IF = """
name: "nested"
op {
  input: "c" input: "x" output: "y" type: "If"
  arg { name: "then_net" n { name: "t"
    op { input: "c2" input: "x" output: "y" type: "If"
      arg { name: "then_net" n { name: "tt" op { input: "x" output: "y" type: "Relu" } } }
      arg { name: "else_net" n { name: "te" op { input: "x" output: "y" type: "Sigmoid" } } } } } }
  arg { name: "else_net" n { name: "e" op { input: "x" input: "x" output: "y" type: "Add" } } }
}
op { input: "y" input: "x" output: "w" type: "Add" }
external_input: "c" external_input: "c2" external_input: "x"
external_output: "w"
"""


@pytest.mark.parametrize("c,c2", [(True, True), (True, False), (False, True)])
def test_nested_ifs_run_and_infer(c, c2):
    net = net_from_netdef(netdef(NESTED_IF))
    x = feeds(False)["x"]
    got = Executor(net).run({"c": np.array(c), "c2": np.array(c2), "x": x}, warmup=0)
    y = (np.maximum(x, 0) if c2 else 1 / (1 + np.exp(-x))) if c else 2 * x
    np.testing.assert_allclose(got["w"], y + x, rtol=1e-6)
    typed = shapes.infer(net, {"c": TensorType((), "bool"), "c2": TensorType((), "bool"),
                               "x": TensorType((2, 3))})
    assert typed.blobs["y"] == TensorType((2, 3)) and typed.blobs["w"] == TensorType((2, 3))
    assert not typed.missing and typed.features[0].known


@pytest.mark.caffe2
def test_nested_ifs_match_caffe2():
    x = feeds(False)["x"]
    for c, c2 in ((True, True), (True, False), (False, True)):
        arrays = {"c": np.array(c), "c2": np.array(c2), "x": x}
        want = caffe2_run(arrays, NESTED_IF)
        got = Executor(net_from_netdef(netdef(NESTED_IF))).run(arrays, warmup=0)
        np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6, atol=1e-7)  # as above: Sigmoid's exp


def test_if_without_else_and_false_condition_runs_nothing():
    text = IF_NET.replace('  arg { name: "else_net" n { name: "e"\n', "").replace(
        '    op { input: "x" output: "y" type: "Sigmoid" }\n', "").replace(
        '    op { input: "y" output: "z" type: "Scale" arg { name: "scale" f: 2.0 } } } }\n', "")
    net = net_from_netdef(netdef(text.replace('op { input: "y" input: "x" output: "w" type: "Add" }\n',
                                              'op { input: "x" input: "x" output: "w" type: "Add" }\n')))
    got = Executor(net).run(feeds(False), warmup=0)
    np.testing.assert_allclose(got["w"], 2 * feeds(False)["x"])


# ---------------------------------------------------------------- shape inference

def test_if_infers_the_larger_branch_and_marks_it():
    net = net_from_netdef(netdef())
    typed = shapes.infer(net, {"d": TensorType((5, 4)), "x": TensorType((2, 3))})
    assert not typed.missing
    assert typed.blobs["c"] == TensorType((), "bool")
    assert typed.blobs["y"] == TensorType((2, 3)) and typed.blobs["z"] == TensorType((2, 3))
    assert typed.blobs["z"].bound == "If: the larger branch"   # then_net does not write z
    assert typed.blobs["w"] == TensorType((2, 3))
    f = typed.features[1]
    # the else branch: Sigmoid and Scale, 6 elements each, float32 in and out
    assert f.known and f.flops > 0 and f.bytes_read == 2 * 24 and f.bytes_written == 2 * 24


def test_if_with_agreeing_branches_is_not_bound():
    text = IF_NET.replace('    op { input: "y" output: "z" type: "Scale" arg { name: "scale" f: 2.0 } } } }\n',
                          "    } }\n")
    typed = shapes.infer(net_from_netdef(netdef(text)), {"d": TensorType((5, 4)), "x": TensorType((2, 3))})
    assert typed.blobs["y"] == TensorType((2, 3)) and typed.blobs["y"].bound is None


def test_if_condition_must_be_one_value():
    text = IF_NET.replace('op { input: "d" output: "c" type: "IsEmpty" }\n', "").replace(
        'external_input: "d"', 'external_input: "c"')
    with pytest.raises(ShapeError, match="If.*one value"):
        shapes.infer(net_from_netdef(netdef(text)), {"c": TensorType((2,), "bool"), "x": TensorType((2, 3))})


def test_if_branch_missing_shape_is_reported():
    typed = shapes.infer(net_from_netdef(netdef()), {"d": TensorType((5, 4))})
    assert "x" in typed.missing


# ---------------------------------------------------------------- the corpus

@pytest.mark.corpus
def test_maskrcnn2go_is_empty_typed_and_if_names_what_its_branch_lacks():
    """With the detections' shape given (whatever the detection ops' state), IsEmpty is
    typed and the If's else_net is inferred on the outer blobs: a mask-head op placer
    lacks shows up in ``missing``, named with the If's branch."""
    net = load_net(corpus_dir() / "caffe2" / "maskrcnn2go_fp32_model.pbtxt")
    typed = shapes.infer(net, {"data": TensorType((1, 3, 320, 320)), "im_info": TensorType((1, 3)),
                               "bbox_nms": TensorType((100, 4))})
    is_empty = next(op for op in net.ops if op.type == "IsEmpty")
    if_op = next(op for op in net.ops if op.type == "If")
    assert typed.blobs[is_empty.outputs[0]] == TensorType((), "bool")
    assert typed.features[is_empty.index].known
    if registry.get("RoIAlign") is None:
        assert any("else_net" in why for why in typed.missing.values())
        assert "If's branch writes it" in typed.missing["mask_fcn_probs"]
        assert not typed.features[if_op.index].known
    else:
        assert typed.features[if_op.index].flops > 0


FC_IF = """
name: "fc_if"
op { input: "d" output: "c" type: "IsEmpty" }
op {
  input: "c" input: "x" output: "y" type: "If"
  arg { name: "then_net" n { name: "t" } }
  arg { name: "else_net" n { name: "e" op { input: "x" input: "W" input: "b" output: "y" type: "FC" } } }
}
external_input: "d" external_input: "x" external_input: "W" external_input: "b"
external_output: "y"
"""

FC_INIT = """
name: "init"
op { output: "W" type: "ConstantFill" arg { name: "shape" ints: 5 ints: 3 } arg { name: "value" f: 0.5 } }
op { output: "b" type: "ConstantFill" arg { name: "shape" ints: 5 } arg { name: "value" f: 1.0 } }
"""


def test_if_cost_is_its_branch_with_the_outer_parameters():
    net = net_from_netdef(netdef(FC_IF), netdef(FC_INIT))
    typed = shapes.infer(net, {"d": TensorType((0, 4)), "x": TensorType((2, 3))})
    assert not typed.missing
    assert typed.blobs["y"] == TensorType((2, 5)) and typed.blobs["y"].bound == "If: the larger branch"
    f = typed.features[1]
    assert f.macs == 2 * 3 * 5 and f.param_bytes == (15 + 5) * 4   # the FC's, W and b float32
    x = feeds(False)["x"]
    got = Executor(net).run({"d": np.zeros((3, 4), np.float32), "x": x}, warmup=0)
    np.testing.assert_allclose(got["y"], x @ np.full((3, 5), 0.5, np.float32) + 1, rtol=1e-6)
