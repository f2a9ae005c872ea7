"""Caffe2's LayerNorm, LayerNormGradient, Gelu and GeluGradient against real Caffe2 (torch 1.8.1)
on the same inputs, and their shapes, costs and errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from caffe2_oracle import run_operator
from conftest import require_cupy
from cupy_standin import check_gpu_kernel

from placer.errors import ShapeError
from placer.ops import registry
from placer.ops.transformer import _erf
from placer.types import Args, TensorType
from test_ops_roi import ours  # the kernel run with its inferred types checked


# Caffe2 computes in float32 (a sum over n elements: relative error ~ n * 2^-24 at worst,
# ~sqrt(n) * 2^-24 typically); ours in float64 rounded once. Y = (X - mean) / std is O(1):
# with n <= 120 here, 1e-5 relative plus 1e-5 absolute covers the float32 reductions.
TOL = dict(rtol=1e-5, atol=1e-5)


def _x(seed, shape, scale=3.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + rng.uniform(-2, 2)).astype(np.float32)


LN_CASES = [
    ((4, 6), {"axis": 1}),
    ((2, 3, 5), {"axis": 1}),
    ((2, 3, 5), {"axis": 2, "epsilon": 1e-3}),
    ((2, 3, 5), {"axis": -1}),
    ((3, 4, 2, 5), {"axis": 2}),
    ((3, 4, 2, 5), {"axis": 0}),
    ((4, 6), {"axis": 1, "elementwise_affine": 1}),
    ((2, 3, 5), {"axis": 2, "elementwise_affine": 1, "epsilon": 1e-2}),
    ((3, 4, 2, 5), {"axis": 1, "elementwise_affine": 1}),
]


def _ln_inputs(seed, shape, args):
    x = _x(seed, shape)
    arrays = [x]
    if args.get("elementwise_affine"):
        ax = args.get("axis", 1) % len(shape)
        rng = np.random.default_rng(seed + 100)
        arrays += [rng.standard_normal(shape[ax:]).astype(np.float32),
                   rng.standard_normal(shape[ax:]).astype(np.float32)]
    return arrays


@pytest.mark.caffe2
@pytest.mark.parametrize("i", range(len(LN_CASES)))
def test_layer_norm_matches_caffe2(i):
    shape, args = LN_CASES[i]
    arrays = _ln_inputs(i, shape, args)
    want = run_operator("LayerNorm", arrays, args, 3)
    got = ours("LayerNorm", arrays, args, 3)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def _ln_grad_inputs(seed, shape, args):
    arrays = _ln_inputs(seed, shape, args)
    y, mean, std = ours("LayerNorm", arrays, args, 3)
    dy = _x(seed + 7, shape, 1.0)
    ins = [dy, y, mean, std, arrays[0]]
    if args.get("elementwise_affine"):
        ins.append(arrays[1])
    return ins


# dX = (g - mean g - xhat mean(g xhat)) / std: the two means cancel much of g, so the
# float32 error is relative to |g| / std, not to |dX|: atol 2e-5 * max|g| / min std.
@pytest.mark.caffe2
@pytest.mark.parametrize("i", range(len(LN_CASES)))
def test_layer_norm_gradient_matches_caffe2(i):
    shape, args = LN_CASES[i]
    ins = _ln_grad_inputs(i, shape, args)
    n_out = 3 if args.get("elementwise_affine") else 1
    want = run_operator("LayerNormGradient", ins, args, n_out)
    got = ours("LayerNormGradient", ins, args, n_out)
    scale = float(np.abs(ins[0]).max()) * (float(np.abs(ins[5]).max()) if n_out == 3 else 1.0)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        atol = 2e-5 * max(scale / float(ins[3].min()), float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)


GELU_CASES = [((7, 9), {}), ((3, 4, 5), {"fast_gelu": 0}), ((7, 9), {"fast_gelu": 1}),
              ((2, 50), {"fast_gelu": 1})]


def _gelu_x(seed, shape):
    x = _x(seed, shape, 3.0)
    x.flat[:4] = [0.0, -10.0, 9.0, -0.5]
    return x


# Y and dX are products of O(|x|) and float32 erf / tanh (a few ulps): rtol 1e-5 with atol
# 1e-6 for results near 0 (large negative x, where Y ~ 0).
@pytest.mark.caffe2
@pytest.mark.parametrize("i", range(len(GELU_CASES)))
def test_gelu_matches_caffe2(i):
    shape, args = GELU_CASES[i]
    x = _gelu_x(i, shape)
    (want,) = run_operator("Gelu", [x], args)
    np.testing.assert_allclose(ours("Gelu", [x], args)[0], want, rtol=1e-5, atol=1e-6)
    dy = _x(i + 9, shape, 1.0)
    (want,) = run_operator("GeluGradient", [dy, x], args)
    got = ours("GeluGradient", [dy, x], args)[0]
    if args.get("fast_gelu"):
        # Caffe2's CPU kernel (gelu_op.cc) evaluates 0.5 dY (1 + th + x (1 - th^2)(kBeta x^2 +
        # kAlpha)) in float32 with Eigen's tanh, which saturates to +-1 for |z| > 7.905
        # (an absolute error up to 1 - tanh(7.905) = 2.7e-7, doubled in 1 - th^2): per element
        # 0.5 |dY| (1 + |x| (kBeta x^2 + kAlpha)) * 6e-7, plus rtol 1e-5.
        ka = math.sqrt(2 / math.pi)
        xd, dyd = x.astype(np.float64), dy.astype(np.float64)
        slack = 0.5 * np.abs(dyd) * (1 + np.abs(xd) * (3 * 0.044715 * ka * xd * xd + ka)) * 6e-7
        assert np.all(np.abs(got.astype(np.float64) - want) <= 1e-5 * np.abs(want) + slack + 1e-7)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_erf_against_scipy():
    special = pytest.importorskip("scipy.special")
    t = np.linspace(-9.0, 9.0, 400001)
    assert np.abs(_erf(np, t) - special.erf(t)).max() < 2e-15
    t = np.array([0.0, 1e-300, -1e-8, 2.9999999, 3.0, 3.0000001, 30.0, -30.0, np.inf, -np.inf])
    np.testing.assert_allclose(_erf(np, t), special.erf(t), rtol=1e-15, atol=1e-300)


def test_layer_norm_shapes():
    a = Args({"axis": 2}, op="#0 LayerNorm")
    y, m, s = registry.get("LayerNorm").infer([TensorType((8, 16, 512), "float32")], a)
    assert y.shape == (8, 16, 512) and m.shape == s.shape == (8, 16, 1)
    a = Args({"axis": 0}, op="#0 LayerNorm")
    _, m, _ = registry.get("LayerNorm").infer([TensorType((8, 16), "float32")], a)
    assert m.shape == (1,)
    a = Args({"axis": -1, "elementwise_affine": 1}, op="#0 LayerNormGradient")
    ins = [TensorType((8, 16, 512), "float32")] * 2 + [TensorType((8, 16, 1), "float32")] * 2 + [
        TensorType((8, 16, 512), "float32"), TensorType((512,), "float32")]
    dx, dg, db = registry.get("LayerNormGradient").infer(ins, a)
    assert dx.shape == (8, 16, 512) and dg.shape == db.shape == (512,)


def test_costs():
    x = TensorType((8, 16, 512), "float32")
    a = Args({"axis": 2}, op="#0 LayerNorm")
    op = registry.get("LayerNorm")
    outs = op.infer([x], a)
    f = op.cost([x], outs, a)
    assert f.flops >= 8 * 65536 and f.bytes_read == 2 * x.nbytes
    assert f.bytes_written == x.nbytes + 2 * 8 * 16 * 4
    g = registry.get("Gelu")
    f = g.cost([x], g.infer([x], Args({}, op="#0 Gelu")), Args({}, op="#0 Gelu"))
    assert f.bytes_read == f.bytes_written == x.nbytes and f.flops > 0


def test_errors_name_the_op():
    x = TensorType((4, 6), "float32")
    with pytest.raises(ShapeError, match="#3 LayerNorm.*axis 2"):
        registry.get("LayerNorm").infer([x], Args({"axis": 2}, op="#3 LayerNorm"))
    with pytest.raises(ShapeError, match="#3 LayerNorm.*gamma"):
        registry.get("LayerNorm").infer([x, TensorType((5,), "float32"), TensorType((6,), "float32")],
                                        Args({"elementwise_affine": 1}, op="#3 LayerNorm"))
    with pytest.raises(ShapeError, match="#3 LayerNorm.*elementwise_affine"):
        registry.get("LayerNorm").infer([x, x, x], Args({}, op="#3 LayerNorm"))
    with pytest.raises(ShapeError, match="#3 GeluGradient"):
        registry.get("GeluGradient").infer([x, TensorType((6, 4), "float32")], Args({}, op="#3 GeluGradient"))
    with pytest.raises(ShapeError, match="#3 LayerNormGradient.*mean and std"):
        registry.get("LayerNormGradient").infer(
            [x, x, TensorType((3, 1), "float32"), TensorType((4, 1), "float32"), x],
            Args({}, op="#3 LayerNormGradient"))
    assert math.isfinite(ours("Gelu", [np.float32([1e30, -1e30])], {})[0][0])


KERNEL_CASES = [
    ("LayerNorm", lambda: _ln_inputs(1, (2, 3, 5), LN_CASES[1][1]), LN_CASES[1][1]),
    ("LayerNorm", lambda: _ln_inputs(7, (2, 3, 5), LN_CASES[7][1]), LN_CASES[7][1]),
    ("LayerNormGradient", lambda: _ln_grad_inputs(2, (2, 3, 5), LN_CASES[2][1]), LN_CASES[2][1]),
    ("LayerNormGradient", lambda: _ln_grad_inputs(8, (3, 4, 2, 5), LN_CASES[8][1]), LN_CASES[8][1]),
    ("Gelu", lambda: [_gelu_x(0, (7, 9))], {}),
    ("Gelu", lambda: [_gelu_x(1, (7, 9))], {"fast_gelu": 1}),
    ("GeluGradient", lambda: [_x(3, (7, 9), 1.0), _gelu_x(2, (7, 9))], {}),
    ("GeluGradient", lambda: [_x(4, (7, 9), 1.0), _gelu_x(3, (7, 9))], {"fast_gelu": 1}),
]


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=[f"k{i}" for i in range(len(KERNEL_CASES))])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(op_type), make(), Args(args, op=f"#0 {op_type}"))
