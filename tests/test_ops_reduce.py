"""ReduceMean/Sum/Max/Min/L1/L2, HardSigmoid and Erf against real Caffe2 (torch 1.8.1) on the
same inputs, and on the strict cupy stand-in. Caffe2 reduces in float32 and placer in float64
rounded once: sums of at most 60 terms of |x| < 4 differ by a few float32 ulps of the
result (rtol 1e-5); Erf is evaluated to 1e-15 and rounded (rtol 1e-6, Caffe2's std::erf)."""
from __future__ import annotations

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from conftest import require_cupy
from cupy_standin import check_gpu_kernel

from placer.errors import ShapeError
from placer.ops import registry
from placer.types import Args, TensorType
from test_ops_roi import ours

X = np.random.default_rng(0).uniform(-4, 4, (3, 4, 5)).astype(np.float32)
CASES = [(op, X, args) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")
         for args in ({}, {"axes": [1]}, {"axes": [0, 2], "keepdims": 0}, {"axes": [-1], "keepdims": 1},
                      {"axes": [2, 0]})]
XI = np.random.default_rng(1).integers(-50, 50, (3, 4, 5)).astype(np.int32)
CASES += [(op, XI.astype(dt), {"axes": [1]}) for op in ("ReduceSum", "ReduceMax", "ReduceMin")
          for dt in ("int32", "int64")]
CASES += [("HardSigmoid", X, {}), ("HardSigmoid", X, {"alpha": 1 / 6, "beta": 0.5}), ("Erf", X, {}),
          ("Erf", np.linspace(-6, 6, 101, dtype=np.float32), {})]
KERNEL_CASES = [(op, lambda x=x: [x], args) for op, x, args in CASES[::3]] + \
    [("HardSigmoid", lambda: [X], {}), ("Erf", lambda: [X], {})]

SCRIPT = """
out = {}
for k, (op_type, args) in enumerate(CASES):
    workspace.FeedBlob("x", inputs["x%d" % k])
    workspace.RunOperatorOnce(core.CreateOperator(op_type, ["x"], ["y"], **args))
    out["y%d" % k] = workspace.FetchBlob("y")
save(**out)
"""


@pytest.fixture(scope="module")
def caffe2_outputs():
    cases = [(op, args) for op, _, args in CASES]
    saved, _ = run_caffe2(f"CASES = {cases!r}\n" + SCRIPT, {f"x{k}": x for k, (_, x, _) in enumerate(CASES)})
    return saved


@pytest.mark.caffe2
@pytest.mark.parametrize("k", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_caffe2(caffe2_outputs, k):
    op, x, args = CASES[k]
    want = caffe2_outputs[f"y{k}"]
    got = ours(op, [x], args)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if op == "Erf" else 1e-5, atol=1e-6)


def test_refuses_what_caffe2_refuses():
    infer = registry.get("ReduceMean").infer
    with pytest.raises(ShapeError, match="out of range"):
        infer([TensorType((2, 3))], Args({"axes": [2]}, op="#0 ReduceMean"))
    with pytest.raises(ShapeError, match="takes float32"):
        infer([TensorType((2, 3), "int32")], Args({}, op="#0 ReduceMean"))
    with pytest.raises(ShapeError, match="takes float32"):
        infer([TensorType((2, 3), "float16")], Args({}, op="#0 ReduceSum"))


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=[f"k{i}" for i in range(len(KERNEL_CASES))])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    require_cupy()
    check_gpu_kernel(registry.get(op_type), make(), Args(args, op=f"#0 {op_type}"))
