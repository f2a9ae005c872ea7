"""ResizeNearest and Upsample against PyTorch's nearest interpolation."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import gpu_available, require_cupy, require_torch
from cupy_standin import check_gpu_kernel

from placer.errors import ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

CASES = [  # (op, args, input shape, torch scale (h, w), NHWC)
    ("ResizeNearest", {"height_scale": 2.0, "width_scale": 2.0}, (2, 3, 5, 4), (2.0, 2.0), False),
    ("ResizeNearest", {"height_scale": 1.5, "width_scale": 3.0}, (1, 2, 5, 3), (1.5, 3.0), False),
    ("ResizeNearest", {"height_scale": 0.5, "width_scale": 0.5}, (1, 2, 8, 6), (0.5, 0.5), False),
    ("ResizeNearest", {"height_scale": 2.0, "width_scale": 1.0, "order": "NHWC"}, (1, 4, 3, 5), (2.0, 1.0), True),
    ("Upsample", {"scale": 2}, (1, 8, 13, 13), (2.0, 2.0), False),
    ("Upsample", {"scale": 3}, (2, 1, 4, 5), (3.0, 3.0), False),
]


def _reference(x, scale, nhwc):
    torch = require_torch()
    t = torch.from_numpy(x.transpose(0, 3, 1, 2).copy() if nhwc else x)
    y = torch.nn.functional.interpolate(t, scale_factor=scale, mode="nearest").numpy()
    return y.transpose(0, 2, 3, 1) if nhwc else y


def _devices():
    return [pytest.param("numpy", id="cpu"),
            pytest.param("cupy", id="gpu", marks=pytest.mark.gpu)]


@pytest.mark.torch
@pytest.mark.parametrize("xp_name", _devices())
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[1]}")
def test_matches_torch_nearest(case, xp_name):
    op_type, args, shape, scale, nhwc = case
    if xp_name == "cupy" and not gpu_available():
        pytest.skip("no CUDA GPU visible")
    xp = __import__(xp_name)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    opdef = registry.get(op_type)
    a = Args(args, op=f"#0 {op_type}")
    (y,) = opdef.kernel(xp, [xp.asarray(x)], a)
    y = y.get() if hasattr(y, "get") else y
    expected = _reference(x, scale, nhwc)
    np.testing.assert_array_equal(y, expected)
    (t,) = opdef.infer([TensorType(shape)], a)
    assert t.shape == expected.shape and t.dtype == "float32"
    cost = opdef.cost([TensorType(shape)], [t], a)
    assert cost.flops == 0 and cost.bytes_written == expected.size * 4


def test_bad_inputs_name_the_op():
    with pytest.raises(ShapeError, match="#3 ResizeNearest.*4-D"):
        registry.get("ResizeNearest").infer([TensorType((3, 4))], Args({}, op="#3 ResizeNearest"))
    with pytest.raises(ShapeError, match="positive"):
        registry.get("ResizeNearest").infer([TensorType((1, 1, 3, 4))], Args({"height_scale": 0.0}, op="#3"))
    with pytest.raises(ShapeError, match="positive integer"):
        registry.get("Upsample").infer([TensorType((1, 1, 3, 4))], Args({"scale": 0}, op="#4 Upsample"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[1]}")
def test_gpu_kernels_keep_to_cupy_rules(case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    op_type, args, shape, _, _ = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    check_gpu_kernel(registry.get(op_type), [x], Args(args, op=f"#0 {op_type}"))
