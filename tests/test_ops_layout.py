"""NCHW2NHWC and NHWC2NCHW against real Caffe2 (torch 1.8.1) on ranks 3 to 5, their
shapes, costs and errors, and the GPU kernels on the strict cupy stand-in."""
from __future__ import annotations

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from cupy_standin import check_gpu_kernel

from placer.errors import ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

SHAPES = [(2, 3, 4, 5), (1, 7, 6), (2, 3, 2, 4, 3), (3, 1, 1, 1), (0, 3, 2, 2)]
OPS = ("NCHW2NHWC", "NHWC2NCHW")

ORACLE = """
for i, shape in enumerate(SHAPES):
    workspace.FeedBlob("x", inputs[f"x{i}"])
    for op_type in OPS:
        workspace.RunOperatorOnce(core.CreateOperator(op_type, ["x"], ["y"]))
        save(**{f"{op_type}{i}": workspace.FetchBlob("y")})
"""


def ours(op_type, x):
    a = Args({}, op=f"#0 {op_type}")
    opdef = registry.get(op_type)
    (y,) = opdef.kernel(np, [x], a)
    (t,) = opdef.infer([TensorType(x.shape, str(x.dtype))], a)
    assert y.shape == t.shape and str(y.dtype) == t.dtype and y.flags.c_contiguous
    return y


def _x(i, shape):
    return np.random.default_rng(i).standard_normal(shape).astype(np.float32)


@pytest.mark.caffe2
def test_order_switches_match_caffe2():
    arrays = {f"x{i}": _x(i, s) for i, s in enumerate(SHAPES)}
    saved, _ = run_caffe2(f"SHAPES = {SHAPES!r}\nOPS = {OPS!r}\n" + ORACLE, arrays)
    for i, _ in enumerate(SHAPES):
        for op_type in OPS:
            want = saved[f"{op_type}{i}"]
            got = ours(op_type, arrays[f"x{i}"])
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)        # a copy: exact


def test_round_trip_and_axes():
    x = _x(0, (2, 3, 4, 5))
    y = ours("NCHW2NHWC", x)
    assert y.shape == (2, 4, 5, 3) and y[1, 2, 3, 0] == x[1, 0, 2, 3]
    np.testing.assert_array_equal(ours("NHWC2NCHW", y), x)


def test_costs_devices_and_errors():
    t = TensorType((2, 3, 4, 5))
    for op_type in OPS:
        opdef = registry.get(op_type)
        (y,) = opdef.infer([t], Args({}))
        cost = opdef.cost([t], [y], Args({}))
        assert cost.flops == 0 and cost.bytes_read == cost.bytes_written == t.nbytes
        assert opdef.devices == {"cpu", "gpu"} and opdef.caffe2_kinds() == {"cpu", "gpu"}
        with pytest.raises(ShapeError, match=f"#3 {op_type}.*rank >= 3"):
            opdef.infer([TensorType((4, 5))], Args({}, op=f"#3 {op_type}"))
        with pytest.raises(ShapeError, match=f"#3 {op_type}.*float32"):
            opdef.infer([TensorType((2, 3, 4), "int32")], Args({}, op=f"#3 {op_type}"))


KERNEL_CASES = [(op_type, [_x(i, s)], {}) for i, s in enumerate(SHAPES[:3]) for op_type in OPS]


@pytest.mark.parametrize("op_type,inputs,args", KERNEL_CASES, ids=[f"k{i}" for i in range(len(KERNEL_CASES))])
def test_gpu_kernels_keep_to_cupy_rules(op_type, inputs, args):
    check_gpu_kernel(registry.get(op_type), inputs, Args(args, op=f"#0 {op_type}"))
