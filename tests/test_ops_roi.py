"""Caffe2's RoI pooling ops (RoIAlign, RoIAlignGradient, RoIPool) against real Caffe2 (torch 1.8.1)
on the same inputs, and their shapes, bounds, costs and errors."""
from __future__ import annotations

import numpy as np
import pytest
from caffe2_oracle import run_operator
from conftest import require_cupy
from cupy_standin import check_gpu_kernel

from placer.errors import ArgumentError, InputError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

def caffe2_run(op_type, arrays, args, n_outputs=1):
    return run_operator(op_type, arrays, args, n_outputs)


# dtypes held at run time in another numpy dtype: bfloat16 as its uint16 bits (ops/half.py)
RUNTIME_DTYPES = {"bfloat16": "uint16"}


def ours(op_type, arrays, args, n_outputs=1, dtypes=None):
    """The kernel's outputs, their shapes and dtypes held to its inference; ``dtypes``: the
    inputs' declared dtypes where they are not the arrays' own (bfloat16 bits)."""
    a = Args(args, op=f"#0 {op_type}", n_outputs=n_outputs)
    opdef = registry.get(op_type)
    outs = opdef.kernel(np, arrays, a)
    dtypes = dtypes or [str(x.dtype) for x in arrays]
    types = opdef.infer([TensorType(x.shape, d) for x, d in zip(arrays, dtypes)], a)
    assert len(outs) == len(types) == n_outputs
    for x, t in zip(outs, types):
        assert x.shape == t.shape and str(x.dtype) == RUNTIME_DTYPES.get(t.dtype, t.dtype)
    return list(outs)


def _inputs(seed, n=2, c=3, h=12, w=10, r=9, scale=1 / 8, order="NCHW", cols=5):
    """Features and RoIs in image pixels (1 / scale per cell), some partly or wholly
    outside the map, some narrower than a cell, one reversed (x2 < x1)."""
    rng = np.random.default_rng(seed)
    shape = (n, c, h, w) if order == "NCHW" else (n, h, w, c)
    x = rng.standard_normal(shape).astype(np.float32)
    size = np.array([w, h, w, h], np.float32) / scale
    a = rng.uniform(-0.3, 1.1, (r, 2)) * size[:2]
    b = a + rng.uniform(0.02, 0.8, (r, 2)) * size[:2]
    boxes = np.concatenate([a, b], axis=1).astype(np.float32)
    boxes[0] = [boxes[0, 2], boxes[0, 1], boxes[0, 0], boxes[0, 3]]      # reversed in x
    boxes[1, 2:] = boxes[1, :2] + 0.3                                      # below a cell
    boxes[2] = [-3 / scale, -2 / scale, -1.5 / scale, -1.2 / scale]        # outside
    image = rng.integers(0, n, (r, 1)).astype(np.float32)
    rois = np.concatenate([image, boxes], axis=1) if cols == 5 else boxes
    return [x, rois.astype(np.float32)]


# Each output is a mean of at most 4 * grid^2 float32 products of weights in [0, 1] with
# X: the summation order differs from Caffe2's (sample by sample, then over the grid) by
# a few roundings of 2^-24 relative to max|X|, and Caffe2's compiler may fuse a
# multiply-add into the sample coordinates (one rounding of a coordinate up to ~H, moving
# a weight by ~1e-6): rtol 1e-5 with atol 1e-5 * max|X| (max|X| ~ 5 here) covers both.
def _tol(x):
    return dict(rtol=1e-5, atol=1e-5 * float(np.abs(x).max()))


ALIGN_CASES = [
    (1, {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 2, "sampling_ratio": 2}),
    (2, {"spatial_scale": 1 / 8, "pooled_h": 2, "pooled_w": 3, "sampling_ratio": 0}),
    (3, {"spatial_scale": 1 / 16, "pooled_h": 4, "pooled_w": 4, "sampling_ratio": 0, "aligned": 1}),
    (4, {"spatial_scale": 1 / 16, "pooled_h": 7, "pooled_w": 7, "sampling_ratio": 2, "aligned": 1}),
    (5, {"spatial_scale": 1 / 8, "pooled_h": 2, "pooled_w": 2}),
    (6, {"spatial_scale": 1 / 16, "pooled_h": 3, "pooled_w": 5, "sampling_ratio": 1, "aligned": 0}),
]


def _align_inputs(seed, args, **kw):
    arrays = _inputs(seed, scale=args.get("spatial_scale", 1.0), **kw)
    if args.get("aligned"):
        b = arrays[1]
        b[0, 1], b[0, 3] = min(b[0, 1], b[0, 3]), max(b[0, 1], b[0, 3])   # aligned: no reversed RoIs
    return arrays


@pytest.mark.caffe2
@pytest.mark.parametrize("seed,args", ALIGN_CASES, ids=[f"case{c[0]}" for c in ALIGN_CASES])
def test_roi_align_matches_caffe2(seed, args):
    arrays = _align_inputs(seed, args)
    (want,) = caffe2_run("RoIAlign", arrays, args)
    (got,) = ours("RoIAlign", arrays, args)
    np.testing.assert_allclose(got, want, **_tol(arrays[0]))


@pytest.mark.caffe2
def test_roi_align_nhwc_and_four_columns_match_caffe2():
    args = {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 3, "sampling_ratio": 0, "order": "NHWC"}
    arrays = _inputs(7, order="NHWC")
    (want,) = caffe2_run("RoIAlign", arrays, args)
    np.testing.assert_allclose(ours("RoIAlign", arrays, args)[0], want, **_tol(arrays[0]))
    args = {"spatial_scale": 1 / 8, "pooled_h": 2, "pooled_w": 2, "sampling_ratio": 2}
    arrays = _inputs(8, n=1, cols=4)
    (want,) = caffe2_run("RoIAlign", arrays, args)
    np.testing.assert_allclose(ours("RoIAlign", arrays, args)[0], want, **_tol(arrays[0]))


def test_roi_align_shapes_and_bound():
    a = Args({"pooled_h": 7, "pooled_w": 5}, op="#0 RoIAlign")
    rois = TensorType((300, 5), "float32", bound="GenerateProposals post_nms_topN=300")
    (y,) = registry.get("RoIAlign").infer([TensorType((1, 256, 50, 60), "float32"), rois], a)
    assert y.shape == (300, 256, 7, 5) and y.bound == "GenerateProposals post_nms_topN=300"
    a = Args({"pooled_h": 7, "pooled_w": 5, "order": "NHWC"}, op="#0 RoIAlign")
    (y,) = registry.get("RoIAlign").infer([TensorType((1, 50, 60, 256), "float32"), rois], a)
    assert y.shape == (300, 7, 5, 256)


def test_roi_align_aligned_refuses_negative_sizes_as_caffe2():
    """Caffe2 1.8.1 enforces roi_w >= 0 and roi_h >= 0 when aligned (roi_align_op.cc; the
    enforce inside its OpenMP loop terminates the process, so it is not run here)."""
    x, rois = _inputs(5)
    rois[0, 1], rois[0, 3] = 30.0, 10.0
    for s in (0, 2):
        with pytest.raises(InputError, match="#0 RoIAlign.*non-negative"):
            ours("RoIAlign", [x, rois], {"aligned": 1, "sampling_ratio": s, "spatial_scale": 1 / 8})
    ours("RoIAlign", [x, rois], {"aligned": 0, "spatial_scale": 1 / 8})     # unaligned: made 1 x 1


def test_roi_align_empty_rois():
    x = np.ones((1, 2, 4, 4), np.float32)
    (y,) = ours("RoIAlign", [x, np.zeros((0, 5), np.float32)], {"pooled_h": 2, "pooled_w": 2})
    assert y.shape == (0, 2, 2, 2)


def test_roi_align_cost_reads_the_cells_the_taps_touch():
    a = Args({"pooled_h": 7, "pooled_w": 7, "sampling_ratio": 2}, op="#0 RoIAlign")
    ins = [TensorType((1, 256, 200, 200), "float32"), TensorType((10, 5), "float32")]
    outs = registry.get("RoIAlign").infer(ins, a)
    f = registry.get("RoIAlign").cost(ins, outs, a)
    taps = 10 * 49 * 4 * 4 * 256
    cells = 10 * 256 * (7 * 2 + 1) ** 2      # the 14 x 14 sample lattice touches 15 x 15 cells
    assert f.bytes_read == cells * 4 + 10 * 5 * 4 < min(taps * 4, ins[0].nbytes)
    assert f.flops >= 2 * taps and f.bytes_written == outs[0].nbytes
    # a map smaller than the lattice: never more than the map per RoI and channel
    small = [TensorType((1, 256, 6, 6), "float32"), TensorType((10, 5), "float32")]
    f = registry.get("RoIAlign").cost(small, registry.get("RoIAlign").infer(small, a), a)
    assert f.bytes_read == 10 * 256 * 36 * 4 + 10 * 5 * 4


def test_roi_align_errors_name_the_op():
    op = registry.get("RoIAlign")
    a = Args({}, op="#3 RoIAlign")
    with pytest.raises(ShapeError, match="#3 RoIAlign"):
        op.infer([TensorType((1, 2, 4), "float32"), TensorType((3, 5), "float32")], a)
    with pytest.raises(ShapeError, match="#3 RoIAlign"):
        op.infer([TensorType((1, 2, 4, 4), "float32"), TensorType((3, 6), "float32")], a)
    with pytest.raises(ShapeError, match="#3 RoIAlign"):
        op.infer([TensorType((2, 2, 4, 4), "float32"), TensorType((3, 4), "float32")], a)
    with pytest.raises(ArgumentError, match="#3 RoIAlign"):
        op.infer([TensorType((1, 2, 4, 4), "float32"), TensorType((3, 5), "float32")],
                 Args({"pooled_h": 0}, op="#3 RoIAlign"))


def _grad_inputs(seed, args, **kw):
    x, rois = _align_inputs(seed, args, **kw)
    p = (args.get("pooled_h", 1), args.get("pooled_w", 1))
    rng = np.random.default_rng(seed + 100)
    c = x.shape[1] if args.get("order", "NCHW") == "NCHW" else x.shape[3]
    shape = (rois.shape[0], c) + p if args.get("order", "NCHW") == "NCHW" else (rois.shape[0],) + p + (c,)
    return [x, rois, rng.standard_normal(shape).astype(np.float32)]


# dX sums dY * weight / count over every sample of every RoI that touches a pixel (up to
# R * 4 * grid^2 terms here, ~100): placer adds them in another order than Caffe2's loop,
# each addition rounding at 2^-24 of the running sum, so rtol 1e-5 with atol
# 1e-5 * max|dY| * 10 (sums of ~10 terms of size max|dY|) covers it.
@pytest.mark.caffe2
@pytest.mark.parametrize("seed,args", ALIGN_CASES, ids=[f"case{c[0]}" for c in ALIGN_CASES])
def test_roi_align_gradient_matches_caffe2(seed, args):
    arrays = _grad_inputs(seed, args)
    (want,) = caffe2_run("RoIAlignGradient", arrays, args)
    (got,) = ours("RoIAlignGradient", arrays, args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * float(np.abs(arrays[2]).max()))


def test_roi_align_gradient_nhwc_is_nchw_transposed():
    args = {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 2, "sampling_ratio": 0}
    x, rois, dy = _grad_inputs(9, args)
    (want,) = ours("RoIAlignGradient", [x, rois, dy], args)
    (got,) = ours("RoIAlignGradient", [x.transpose(0, 2, 3, 1).copy(), rois, dy.transpose(0, 2, 3, 1).copy()],
                  dict(args, order="NHWC"))
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), want, rtol=1e-6, atol=1e-6)


def test_roi_align_gradient_is_the_adjoint_of_roi_align():
    """<RoIAlign(X), dY> = <X, RoIAlignGradient(dY)>: both are the same linear map."""
    args = {"spatial_scale": 1 / 16, "pooled_h": 4, "pooled_w": 4, "sampling_ratio": 0, "aligned": 1}
    x, rois, dy = _grad_inputs(10, args)
    (y,) = ours("RoIAlign", [x, rois], args)
    (dx,) = ours("RoIAlignGradient", [x, rois, dy], args)
    assert np.isclose(float((y.astype(np.float64) * dy).sum()), float((x.astype(np.float64) * dx).sum()),
                      rtol=1e-5, atol=1e-4)


def test_roi_align_gradient_shape_errors():
    a = Args({"pooled_h": 2, "pooled_w": 2}, op="#4 RoIAlignGradient")
    with pytest.raises(ShapeError, match="#4 RoIAlignGradient"):
        registry.get("RoIAlignGradient").infer([TensorType((1, 3, 8, 8), "float32"),
                                                TensorType((5, 5), "float32"),
                                                TensorType((5, 3, 2, 3), "float32")], a)
    (dx,) = registry.get("RoIAlignGradient").infer([TensorType((1, 3, 8, 8), "float32"),
                                                    TensorType((5, 5), "float32"),
                                                    TensorType((5, 3, 2, 2), "float32")], a)
    assert dx.shape == (1, 3, 8, 8)


POOL_CASES = [
    (21, {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 2}),
    (22, {"spatial_scale": 1 / 16, "pooled_h": 7, "pooled_w": 7}),
    (23, {"spatial_scale": 1 / 8, "pooled_h": 2, "pooled_w": 4, "is_test": 0}),
]


# A max copies a value and the argmax is an index: exact (standard normal X has no ties).
@pytest.mark.caffe2
@pytest.mark.parametrize("seed,args", POOL_CASES, ids=[f"pool{c[0]}" for c in POOL_CASES])
def test_roi_pool_matches_caffe2_exactly(seed, args):
    arrays = _inputs(seed, scale=args["spatial_scale"])
    want = caffe2_run("RoIPool", arrays, args, 2)
    got = ours("RoIPool", arrays, args, 2)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1].dtype == np.int32 and (got[1] == -1).any()      # the RoI outside: empty bins


@pytest.mark.caffe2
def test_roi_pool_is_test_matches_caffe2():
    args = {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 3, "is_test": 1}
    arrays = _inputs(24, scale=1 / 8)
    (want,) = caffe2_run("RoIPool", arrays, args, 1)
    (got,) = ours("RoIPool", arrays, args, 1)
    np.testing.assert_array_equal(got, want)


def test_roi_pool_shapes_and_errors():
    op = registry.get("RoIPool")
    rois = TensorType((64, 5), "float32", bound="DistributeFpnProposals rois")
    x = TensorType((2, 16, 30, 40), "float32")
    y, am = op.infer([x, rois], Args({"pooled_h": 6, "pooled_w": 6}, op="#1 RoIPool"))
    assert y.shape == am.shape == (64, 16, 6, 6) and am.dtype == "int32" and y.bound == rois.bound
    (y,) = op.infer([x, rois], Args({"is_test": 1}, op="#1 RoIPool", n_outputs=1))
    assert y.shape == (64, 16, 1, 1)
    with pytest.raises(ShapeError, match="#1 RoIPool"):
        op.infer([x, TensorType((64, 4), "float32")], Args({}, op="#1 RoIPool"))
    with pytest.raises(ShapeError, match="#1 RoIPool"):
        op.infer([x, rois], Args({}, op="#1 RoIPool", n_outputs=1))


KERNEL_CASES = [
    ("RoIPool", lambda: _inputs(21, scale=1 / 8), POOL_CASES[0][1]),
    ("RoIPool", lambda: _inputs(24, scale=1 / 8),
     {"spatial_scale": 1 / 8, "pooled_h": 3, "pooled_w": 3, "is_test": 1}),
    ("RoIAlignGradient", lambda: _grad_inputs(2, ALIGN_CASES[1][1]), ALIGN_CASES[1][1]),
    ("RoIAlignGradient", lambda: _grad_inputs(4, ALIGN_CASES[3][1]), ALIGN_CASES[3][1]),
    ("RoIAlign", lambda: _align_inputs(1, ALIGN_CASES[0][1]), ALIGN_CASES[0][1]),
    ("RoIAlign", lambda: _align_inputs(3, ALIGN_CASES[2][1]), ALIGN_CASES[2][1]),
]


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=[f"k{i}" for i in range(len(KERNEL_CASES))])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(op_type), make(), Args(args, op=f"#0 {op_type}"))
