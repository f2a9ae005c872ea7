"""The logical family (comparisons, And/Or/Xor/Not, IsNaN, Where, SumElements, SumSqrElements,
SumElementsGradient) against real Caffe2 (torch 1.8.1) on the same inputs, on numpy and on
the cupy stand-in; the dtypes and shapes Caffe2 refuses; and FP32MomentumSGDUpdate against an
independent exact reference written from caffe2/sgd/fp32_momentum_sgd_op.cu (Caffe2 has a
CUDA kernel only, so the CPU oracle cannot run it)."""
from __future__ import annotations

import json
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from conftest import require_cupy
from cupy_standin import check_gpu_kernel

from placer.errors import PlacerError, ShapeError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.runtime.executor import Executor
from placer.types import Args, TensorType
from test_ops_roi import ours  # the kernel run with its inferred types checked

F32, F64 = np.float32, np.float64
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.5]


def _values(seed, shape, dtype):
    """Values of ``dtype`` with repeats (so that EQ and LE see ties); floats hold NaN, +-inf
    and both zeros."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-3, 4, shape).astype(dtype)
    x = rng.integers(-3, 4, shape).astype(dtype) * dtype_type(dtype)(0.5)
    flat = x.reshape(-1)
    k = min(flat.size, len(SPECIAL))
    flat[rng.permutation(flat.size)[:k]] = np.array(SPECIAL[:k], dtype)
    return x


def dtype_type(dtype):
    return np.dtype(dtype).type


def _pair(seed, shape_a, shape_b, dtype):
    return [_values(seed, shape_a, dtype), _values(seed + 1, shape_b, dtype)]


COMPARISONS = ["EQ", "NE", "LT", "LE", "GT", "GE"]
LOGICAL = ["And", "Or", "Xor"]

# (op, make inputs, args): every case runs in Caffe2 and in placer on numpy and the stand-in.
CASES = []
for _i, _op in enumerate(COMPARISONS):
    for _j, _dt in enumerate(["float32", "float64", "int32", "int64", "bool"]):
        CASES.append((_op, lambda s=10 * _i + _j, d=_dt: _pair(s, (4, 5), (4, 5), d), {}))
    CASES += [
        (_op, lambda s=_i: _pair(s, (2, 3, 4), (3, 1), "float32"), {}),                # numpy broadcasting
        (_op, lambda s=_i: _pair(s, (1, 4), (3, 1), "int32"), {}),                     # both sides grow
        (_op, lambda s=_i: _pair(s, (2, 3, 4), (3,), "float32"), {"broadcast": 1, "axis": 1}),
        (_op, lambda s=_i: _pair(s, (2, 3, 4), (4,), "int64"), {"broadcast": 1}),       # suffix
        (_op, lambda s=_i: _pair(s, (2, 3, 4, 5), (1, 3, 1), "float64"),
         {"broadcast": 1, "axis_str": "N", "order": "NCHW"}),          # B at dim 0, its outer 1s dropped
        (_op, lambda s=_i: _pair(s, (2, 3), (), "float32"), {"broadcast": 1}),          # B 0-d
        (_op, lambda s=_i: _pair(s, (5,), (1, 1), "int32"), {"broadcast": 1, "axis": 3}),  # one value: unchecked
        (_op, lambda s=_i: _pair(s, (), (), "float32"), {}),
        (_op, lambda s=_i: _pair(s, (0, 3), (3,), "float32"), {}),                      # empty
    ]
for _i, _op in enumerate(LOGICAL):
    CASES += [
        (_op, lambda s=_i: _pair(s, (5, 6), (5, 6), "bool"), {}),
        (_op, lambda s=_i: _pair(s, (2, 1, 6), (3, 1), "bool"), {}),
        (_op, lambda s=_i: _pair(s, (2, 3, 4), (2, 3), "bool"), {"broadcast": 1, "axis": 0}),
        (_op, lambda s=_i: _pair(s, (0, 2), (0, 2), "bool"), {}),
    ]
CASES += [
    ("Not", lambda: [_values(1, (5, 7), "bool")], {}),
    ("Not", lambda: [_values(2, (0,), "bool")], {}),
    ("IsNaN", lambda: [_values(3, (6, 5), "float32")], {}),
    ("IsNaN", lambda: [_values(4, (3, 4), "float64")], {}),
    ("IsNaN", lambda: [np.array([np.nan, -np.nan, np.float32(np.nan) * 0], F32)], {}),
    ("IsNaN", lambda: [np.zeros((0, 2), F32)], {}),
    ("Where", lambda: [_values(5, (4, 5), "bool"), _values(6, (4, 5), "float32"), _values(7, (4, 5), "float32")], {}),
    ("Where", lambda: [_values(8, (3, 2, 2), "bool"), _values(9, (3, 2, 2), "float64"),
                       _values(10, (3, 2, 2), "float64")], {}),
    ("Where", lambda: [_values(11, (7,), "bool"), _values(12, (7,), "int32"), _values(13, (7,), "int32")], {}),
    ("Where", lambda: [_values(14, (7,), "bool"), _values(15, (7,), "int64"), _values(16, (7,), "int64")], {}),
    ("Where", lambda: [_values(17, (7,), "bool"), _values(18, (7,), "bool"), _values(19, (7,), "bool")], {}),
    ("Where", lambda: [_values(20, (4,), "bool"), _values(21, (4, 3), "float32"), _values(22, (4, 3), "float32")],
     {"broadcast_on_rows": 1}),
    ("Where", lambda: [_values(23, (3,), "bool"), _values(24, (3, 2, 2), "int64"), _values(25, (3, 2, 2), "int64")],
     {"broadcast_on_rows": 1}),
    ("Where", lambda: [_values(26, (5,), "bool"), _values(27, (5,), "float32"), _values(28, (5,), "float32")],
     {"broadcast_on_rows": 1}),
    ("Where", lambda: [np.zeros((0,), bool), np.zeros((0, 3), F32), np.zeros((0, 3), F32)], {"broadcast_on_rows": 1}),
    ("Where", lambda: [np.array(True), np.array(1.5, F32), np.array(2.5, F32)], {}),
]

SUM_INPUTS = {
    "small": lambda: _rng_values(0, (7, 9), 3.0),
    "large": lambda: _rng_values(1, (4097,), 10.0),
    "empty": lambda: np.zeros((0, 4), F32),
    "scalar": lambda: np.array(-2.75, F32),
    "integers": lambda: np.array([1, 2, 2], F32),     # sums exact in any order: compared exactly
}


def _rng_values(seed, shape, scale, dtype=F32):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


for _name, _make in SUM_INPUTS.items():
    for _avg in (0, 1):
        CASES.append(("SumElements", lambda m=_make: [m()], {"average": _avg}))
        CASES.append(("SumSqrElements", lambda m=_make: [m()], {"average": _avg}))
CASES += [
    ("SumSqrElements", lambda: [_rng_values(2, (33, 5), 4.0, F64)], {"average": 1}),
    ("SumSqrElements", lambda: [_rng_values(3, (7,), 4.0, F64)], {}),
    ("SumElementsGradient", lambda: [_rng_values(4, (3, 7), 1.0), np.array(0.3, F32)], {}),
    ("SumElementsGradient", lambda: [_rng_values(5, (3, 7), 1.0), np.array([0.3], F32)], {"average": 1}),
    ("SumElementsGradient", lambda: [np.ones((6, 1), np.int32), np.array(-1.7, F32)], {"average": 1}),  # X unread
    ("SumElementsGradient", lambda: [np.ones((0, 3), F32), np.array(2.0, F32)], {"average": 1}),
]
IDS = [f"{c[0]}-{i}" for i, c in enumerate(CASES)]

# Inputs Caffe2's kernels refuse (a dtype not dispatched, B's dtype not A's, shapes that do not
# fit): the oracle must raise, and placer's shape inference raise a PlacerError naming the op.
REFUSED = [
    ("GE", [np.ones(3, np.float16), np.ones(3, np.float16)], {}),
    ("LT", [np.ones(3, np.int8), np.ones(3, np.int8)], {}),
    ("EQ", [np.ones(3, np.uint8), np.ones(3, np.uint8)], {}),
    ("NE", [np.ones(3, F32), np.ones(3, F64)], {}),
    ("GT", [np.ones((2, 3), F32), np.ones((2,), F32)], {}),
    ("LE", [np.ones((3,), F32), np.ones((2, 3), F32)], {"broadcast": 1}),
    ("GE", [np.ones((2, 3, 4), F32), np.ones((4,), F32)], {"broadcast": 1, "axis": 1}),
    ("GE", [np.ones((2, 3, 4, 5), F32), np.ones((1, 3, 1), F32)], {"broadcast": 1, "axis_str": "C", "order": "NCHW"}),
    ("And", [np.ones(3, F32), np.ones(3, F32)], {}),
    ("Or", [np.ones(3, bool), np.ones(3, np.int32)], {}),
    ("Xor", [np.ones(3, np.int32), np.ones(3, np.int32)], {}),
    ("Not", [np.ones(3, F32)], {}),
    ("Not", [np.ones(3, np.int32)], {}),
    ("IsNaN", [np.ones(3, np.float16)], {}),
    ("IsNaN", [np.ones(3, np.int32)], {}),
    ("Where", [np.ones(3, bool), np.ones(3, np.float16), np.ones(3, np.float16)], {}),
    ("Where", [np.ones(3, bool), np.ones(3, np.int8), np.ones(3, np.int8)], {}),
    ("Where", [np.ones(3, bool), np.ones(3, F32), np.ones(3, F64)], {}),
    ("Where", [np.ones(3, np.int32), np.ones(3, F32), np.ones(3, F32)], {}),
    ("Where", [np.ones(3, bool), np.ones((2, 3), F32), np.ones((2, 3), F32)], {}),
    ("Where", [np.ones((1, 2), bool), np.ones((1, 2), F32), np.ones((1, 2), F32)], {"broadcast_on_rows": 1}),
    ("Where", [np.ones(2, bool), np.ones((2, 3), F32), np.ones((2, 4), F32)], {"broadcast_on_rows": 1}),
    ("SumElements", [np.ones(3, F64)], {}),
    ("SumElements", [np.ones(3, np.int32)], {}),
    ("SumSqrElements", [np.ones(3, np.float16)], {}),
    ("SumSqrElements", [np.ones(3, np.int64)], {}),
    ("SumElementsGradient", [np.ones(3, F32), np.ones(1, F64)], {}),
]

ORACLE = """
cases = json.loads(CASES_JSON)
results = []
for i, (op_type, n_in, args, n_out) in enumerate(cases):
    workspace.ResetWorkspace()
    names = ["c%d_x%d" % (i, j) for j in range(n_in)]
    outs = ["c%d_y%d" % (i, k) for k in range(n_out)]
    for name in names:
        workspace.FeedBlob(name, inputs[name])
    try:
        workspace.RunOperatorOnce(core.CreateOperator(op_type, names, outs, **args))
    except Exception as e:
        results.append(str(e).splitlines()[0][:300])
        continue
    save(**{o: workspace.FetchBlob(o) for o in outs})
    results.append(None)
save_json(results)
"""


def _run_in_caffe2(cases):
    """Each (op, inputs, args, n_outputs) run once in its own workspace, in one Caffe2 process:
    the outputs of each case, or the first line of the error Caffe2 raised."""
    spec = [(op, len(ins), args, n_out) for op, ins, args, n_out in cases]
    arrays = {f"c{i}_x{j}": x for i, (_, ins, _, _) in enumerate(cases) for j, x in enumerate(ins)}
    saved, errors = run_caffe2(f"CASES_JSON = {json.dumps(json.dumps(spec))}\n" + ORACLE, arrays)
    return [err if err is not None else [saved[f"c{i}_y{k}"] for k in range(cases[i][3])]
            for i, err in enumerate(errors)]


@pytest.fixture(scope="module")
def oracle():
    cases = [(op, make(), args, 1) for op, make, args in CASES] + [(op, ins, args, 1) for op, ins, args in REFUSED]
    results = _run_in_caffe2(cases)
    return results[:len(CASES)], results[len(CASES):]


def _sum_tolerance(op_type, x):
    """Caffe2 sums in float32 (Eigen, one order), placer in float64 rounded once; either
    differs from the exact sum by at most (n - 1) * 2^-24 * sum|terms| (float32 recursive
    summation, any order) plus one rounding of the result, and each float32 square rounds
    once more (2^-24 relative, positive terms). Small integers sum exactly: no tolerance."""
    if np.all(x == np.round(x)) and np.abs(x).max() < 64 and x.size < 64:
        return 0.0
    terms = np.abs(x.astype(F64)) ** (2 if op_type == "SumSqrElements" else 1)
    eps = np.finfo(x.dtype).eps / 2
    return 2 * (x.size + 2) * eps * float(terms.sum()) + float(np.finfo(x.dtype).tiny)


@pytest.mark.caffe2
@pytest.mark.parametrize("i", range(len(CASES)), ids=IDS)
def test_matches_caffe2(oracle, i):
    op_type, make, args = CASES[i]
    want = oracle[0][i]
    assert not isinstance(want, str), f"Caffe2 refused the case: {want}"
    arrays = make()
    (got,) = ours(op_type, arrays, args)
    assert got.shape == want[0].shape and got.dtype == want[0].dtype, (got.shape, got.dtype, want[0].shape,
                                                                       want[0].dtype)
    if op_type in ("SumElements", "SumSqrElements") and arrays[0].size:
        # the average's scale is one float rounding more, inside the same bound
        assert abs(float(got) - float(want[0])) <= _sum_tolerance(op_type, arrays[0]), (float(got), float(want[0]))
    else:   # booleans, uint8, selected values, fills: exact
        np.testing.assert_array_equal(got, want[0])


@pytest.mark.caffe2
@pytest.mark.parametrize("i", range(len(REFUSED)), ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED)])
def test_refuses_what_caffe2_refuses(oracle, i):
    op_type, arrays, args = REFUSED[i]
    assert isinstance(oracle[1][i], str), f"Caffe2 ran the case: {oracle[1][i]}"
    label = f"#4 {op_type}"
    with pytest.raises(ShapeError, match=f"op {label}: "):
        registry.get(op_type).infer([TensorType(x.shape, str(x.dtype)) for x in arrays], Args(args, op=label))


def test_nan_and_infinity_compare_as_ieee():
    """Independent of Caffe2: NaN is unequal to everything, itself included; inf is ordered."""
    a = np.array([np.nan, np.nan, np.inf, -np.inf, np.inf, 1.0], F32)
    b = np.array([np.nan, 1.0, np.inf, np.inf, 1e38, np.nan], F32)
    got = {op: ours(op, [a, b], {})[0].tolist() for op in COMPARISONS}
    assert got["EQ"] == [False, False, True, False, False, False]
    assert got["NE"] == [True, True, False, True, True, True]
    assert got["LT"] == [False, False, False, True, False, False]
    assert got["GE"] == [False, False, True, False, True, False]


def test_sum_average_scales_by_float32_reciprocal():
    """average=1 multiplies by float32(1/N) in float32 (math::Scale), not divides by N: for
    a sum of 5 over N = 3 the two differ (the "integers" case above holds Caffe2 to it)."""
    x = np.array([1, 2, 2], F32)
    (y,) = ours("SumElements", [x], {"average": 1})
    assert y == F32(5) * (F32(1) / F32(3)) and y != F32(5) / F32(3)
    (y,) = ours("SumSqrElements", [x.astype(F64)], {"average": 1})
    assert y == F64(9) * F64(F32(1) / F32(3)) and y != F64(9) / 3 and y.dtype == F64


def test_shapes_dtypes_and_costs():
    x = TensorType((8, 16, 32), "float32")
    for op_type in COMPARISONS:
        (y,) = registry.get(op_type).infer([x, TensorType((16, 1), "float32")], Args({}, op=f"#0 {op_type}"))
        assert y == TensorType((8, 16, 32), "bool")
        f = registry.get(op_type).cost([x, TensorType((16, 1), "float32")], [y], Args({}))
        assert (f.flops, f.bytes_read, f.bytes_written) == (y.size, x.nbytes + 64, y.size)
    (y,) = registry.get("IsNaN").infer([x], Args({}, op="#0 IsNaN"))
    assert y == TensorType(x.shape, "uint8")
    for op_type in ("SumElements", "SumSqrElements"):
        (s,) = registry.get(op_type).infer([x], Args({}, op=f"#0 {op_type}"))
        assert s == TensorType((), "float32")
        f = registry.get(op_type).cost([x], [s], Args({}))
        assert (f.flops, f.bytes_read, f.bytes_written) == (x.size, x.nbytes, 4)
    dy = TensorType((), "float32")
    (dx,) = registry.get("SumElementsGradient").infer([TensorType((8, 16), "int64"), dy], Args({}, op="#0 g"))
    assert dx == TensorType((8, 16), "float32")
    f = registry.get("SumElementsGradient").cost([TensorType((8, 16), "int64"), dy], [dx], Args({}))
    assert (f.bytes_read, f.bytes_written) == (4, 8 * 16 * 4)
    (w,) = registry.get("Where").infer([TensorType((8,), "bool"), x, x],
                                       Args({"broadcast_on_rows": 1}, op="#0 Where"))
    assert w == x
    with pytest.raises(ShapeError, match="#2 SumElementsGradient.*one value"):
        registry.get("SumElementsGradient").infer([x, TensorType((2,), "float32")],
                                                  Args({}, op="#2 SumElementsGradient"))
    with pytest.raises(ShapeError, match="#2 Where.*broadcast_on_rows"):
        registry.get("Where").infer([TensorType((8,), "bool"), x, x], Args({}, op="#2 Where"))


def test_devices_follow_caffe2s_registrations():
    """CUDA kernels in torch 1.8.1: elementwise_ops.cu (comparisons, And/Or/Xor, Not),
    reduction_ops.cu (SumElements, SumSqrElements, SumElementsGradient); none for IsNaN and
    Where; FP32MomentumSGDUpdate has only its CUDA kernel."""
    for op_type in COMPARISONS + LOGICAL + ["Not", "SumElements", "SumSqrElements", "SumElementsGradient"]:
        assert registry.get(op_type).caffe2_kinds() == {"cpu", "gpu"}, op_type
    assert registry.get("IsNaN").caffe2_kinds() == registry.get("Where").caffe2_kinds() == {"cpu"}
    assert registry.get("FP32MomentumSGDUpdate").caffe2_kinds() == {"gpu"}
    assert all(registry.get(t).devices == {"cpu", "gpu"} for t in COMPARISONS + ["IsNaN", "Where",
                                                                                 "FP32MomentumSGDUpdate"])


@pytest.mark.caffe2
def test_fp32_momentum_sgd_update_is_unknown_to_caffe2_on_the_cpu():
    """Why FP32MomentumSGDUpdate is checked against a reference, not the oracle."""
    (error,) = _run_in_caffe2([("FP32MomentumSGDUpdate", [np.ones(4, F32)] * 4, {}, 3)])
    assert isinstance(error, str) and "CPU" in error


# ---------------------------------------------------------------- FP32MomentumSGDUpdate
def _round_f32(x: Fraction) -> np.float32:
    """The float32 nearest the rational ``x`` (ties to even): a correctly rounded operation."""
    guess = np.float32(float(x))
    best = min((np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))),
               key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))
    return F32(best)


def _fma(a, b, c) -> np.float32:
    return _round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def _mul(a, b) -> np.float32:
    return _round_f32(Fraction(float(a)) * Fraction(float(b)))


def _sub(a, b) -> np.float32:
    return _round_f32(Fraction(float(a)) - Fraction(float(b)))


def fp32_momentum_reference(grad, mom, lr, param, momentum=0.0, weight_decay=0.0, nesterov=0):
    """FP32MomentumSGDKernel (caffe2/sgd/fp32_momentum_sgd_op.cu) value by value, in exact
    rational arithmetic rounded to float32 where the CUDA code rounds; only the first
    N // 2 pairs are updated (the odd last value keeps its inputs, the op being in place)."""
    g, m, p = (x.reshape(-1).copy() for x in (grad, mom, param))
    mu, wd, rate = F32(momentum), F32(weight_decay), F32(lr.reshape(-1)[0])
    for i in range(g.size - g.size % 2):
        ng = _fma(wd, p[i], g[i])
        mm = _mul(mu, m[i])
        m[i] = _fma(rate, ng, mm)
        g[i] = _sub(_fma(m[i], mu, m[i]), mm) if nesterov else m[i]
        p[i] = _sub(p[i], g[i])
    return g.reshape(grad.shape), m.reshape(mom.shape), p.reshape(param.shape)


def _fp32_inputs(seed, shape):
    rng = np.random.default_rng(seed)
    grad, mom, param = (rng.standard_normal(shape).astype(F32) * s for s in (1e-2, 1e-1, 1.0))
    return [grad, mom, np.array([0.05], F32), param]


FP32_CASES = [
    ((64,), {"momentum": 0.9}),
    ((8, 9), {"momentum": 0.9, "weight_decay": 1e-4}),
    ((7, 9), {"momentum": 0.95, "weight_decay": 5e-4, "nesterov": 1}),       # odd: the last value stays
    ((33,), {"momentum": 0.9, "nesterov": 1}),
    ((6, 5), {"weight_decay": 1e-3}),                                       # momentum 0 by default
    ((1,), {"momentum": 0.9}),                                              # no pair at all
]


@pytest.mark.parametrize("shape,args", FP32_CASES, ids=[f"fp32-{i}" for i in range(len(FP32_CASES))])
def test_fp32_momentum_sgd_update_matches_the_cuda_kernels_arithmetic(shape, args):
    """Exact: placer's float64 fma emulation equals the correctly rounded fma except when
    double rounding hits a float32 halfway point, which these seeded inputs never do (the
    comparison is deterministic); the odd last value is the input's, bit for bit."""
    inputs = _fp32_inputs(len(shape) + shape[0], shape)
    want = fp32_momentum_reference(*inputs, **args)
    got = ours("FP32MomentumSGDUpdate", inputs, args, 3)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    if inputs[0].size % 2:
        for g, x in zip(got, (inputs[0], inputs[1], inputs[3])):
            assert g.reshape(-1)[-1] == x.reshape(-1)[-1]


def test_fp32_momentum_sgd_update_fuses_its_multiply_adds():
    """The reference is not met by plain float32 arithmetic (a * b rounded, then + c rounded):
    on these inputs the two differ in some values, so the test above can tell them apart."""
    grad, mom, lr, param = _fp32_inputs(5, (256,))
    args = {"momentum": 0.9, "weight_decay": 1e-1}
    mu, wd = F32(0.9), F32(0.1)
    ng = wd * param + grad
    naive_m = lr[0] * ng + mu * mom
    want = fp32_momentum_reference(grad, mom, lr, param, **args)
    got = ours("FP32MomentumSGDUpdate", [grad, mom, lr, param], args, 3)
    assert (naive_m != want[1]).any()
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("shape,args", [((5,), {"momentum": 0.9, "weight_decay": 1e-4}),
                                        ((4, 6), {"momentum": 0.9, "weight_decay": 1e-4, "nesterov": 1})])
def test_fp32_momentum_sgd_update_in_place_writes_only_what_it_may(shape, args):
    """With args.inplace the update writes into its state inputs (an odd last value kept)
    and gives the same values; without it no input changes."""
    inputs = _fp32_inputs(3, shape)
    before = [x.copy() for x in inputs]
    want = fp32_momentum_reference(*inputs, **args)
    opdef = registry.get("FP32MomentumSGDUpdate")
    opdef.kernel(np, inputs, Args(args, op="#0 FP32MomentumSGDUpdate"))
    for x, b in zip(inputs, before):
        np.testing.assert_array_equal(x, b)
    outs = opdef.kernel(np, inputs, Args(args, op="#0 FP32MomentumSGDUpdate", inplace=frozenset({0, 1, 3})))
    assert outs[0] is inputs[0] and outs[1] is inputs[1] and outs[2] is inputs[3]
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o, w)


def test_fp32_momentum_sgd_update_shapes_costs_and_errors():
    opdef = registry.get("FP32MomentumSGDUpdate")
    g, lr = TensorType((64, 32), "float32"), TensorType((), "float32")
    a = Args({"momentum": 0.9}, op="#5 FP32MomentumSGDUpdate")
    outs = opdef.infer([g, TensorType((2048,), "float32"), lr, g], a)
    assert outs == [g, TensorType((2048,), "float32"), g]
    f = opdef.cost([g, g, lr, g], [g, g, g], a)
    assert (f.flops, f.bytes_read, f.bytes_written) == (6 * g.size, 3 * g.nbytes + 4, 3 * g.nbytes)
    assert opdef.cost([g, g, lr, g], [g, g, g], Args({"nesterov": 1})).flops == 9 * g.size
    assert opdef.inplace == ((0, 0), (1, 1), (3, 2))
    for bad, words in [([TensorType((64, 32), "float16"), g, lr, g], "grad is float16"),
                       ([g, TensorType((63, 32), "float32"), lr, g], "momentum"),
                       ([g, g, TensorType((2,), "float32"), g], "lr must hold exactly one value"),
                       ([g, g, lr, TensorType((64,), "float32")], "param")]:
        with pytest.raises(ShapeError, match=f"#5 FP32MomentumSGDUpdate.*{words}"):
            opdef.infer(bad, a)


# ---------------------------------------------------------------- memory and the GPU path
MEASURED = [
    ("GE", lambda: _pair(0, (512, 1024), (1024,), "float32"), {}),
    ("And", lambda: _pair(0, (512, 1024), (512, 1024), "bool"), {}),
    ("Not", lambda: [_values(0, (1 << 20,), "bool")], {}),
    ("IsNaN", lambda: [_values(0, (1 << 20,), "float32")], {}),
    ("Where", lambda: [_values(0, (1 << 18,), "bool"), _rng_values(1, (1 << 18,), 1.0),
                       _rng_values(2, (1 << 18,), 1.0)], {}),
    ("SumElements", lambda: [_rng_values(0, (1 << 20,), 1.0)], {"average": 1}),
    ("SumSqrElements", lambda: [_rng_values(0, (1 << 20,), 1.0)], {"average": 1}),
    ("SumElementsGradient", lambda: [_rng_values(0, (1 << 20,), 1.0), np.array(2.0, F32)], {"average": 1}),
    ("FP32MomentumSGDUpdate", lambda: _fp32_inputs(0, (1 << 18,)), {"momentum": 0.9, "nesterov": 1}),
    ("FP32MomentumSGDUpdate", lambda: _fp32_inputs(0, ((1 << 18) + 1,)), {"momentum": 0.9}),
]


@pytest.mark.parametrize("op_type,make,args", MEASURED, ids=[f"{c[0]}-{i}" for i, c in enumerate(MEASURED)])
def test_kernel_temporaries_stay_within_the_declaration(op_type, make, args):
    """tracemalloc's peak during the numpy kernel, less its outputs, within ``scratch``
    (plus 64 KiB of small objects), as tests/test_resource_limits.py measures it."""
    inputs = make()
    opdef, a = registry.get(op_type), Args(args, op=f"#0 {op_type}")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        outputs = opdef.kernel(np, inputs, a)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    out_types = [TensorType(o.shape, str(o.dtype)) for o in outputs]
    declared = opdef.scratch_bytes([TensorType(x.shape, str(x.dtype)) for x in inputs], out_types, a)
    assert peak - sum(o.nbytes for o in outputs) <= declared + 64 * 1024


KERNEL_CASES = [c for c in CASES] + [
    ("FP32MomentumSGDUpdate", lambda s=s, a=a: _fp32_inputs(len(s) + s[0], s), a) for s, a in FP32_CASES]


@pytest.mark.parametrize("op_type,make,args", KERNEL_CASES, ids=[f"k{i}-{c[0]}" for i, c in enumerate(KERNEL_CASES)])
def test_gpu_kernels_keep_to_cupy_rules(op_type, make, args):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(op_type), make(), Args(args, op=f"#0 {op_type}"))


def test_errors_are_placer_errors_naming_the_op():
    x = TensorType((2, 3), "float32")
    for op_type, inputs in [("GE", [x, TensorType((4,), "float32")]), ("And", [x, x]),
                            ("Where", [TensorType((2, 3), "bool"), x, TensorType((3, 2), "float32")]),
                            ("SumElements", [TensorType((2,), "int32")]),
                            ("Where", [TensorType((2,), "bool"), TensorType((2,), "object"),
                                       TensorType((2,), "object")])]:
        with pytest.raises(PlacerError, match=f"op #7 {op_type}: "):
            registry.get(op_type).infer(inputs, Args({}, op=f"#7 {op_type}"))


# ---------------------------------------------------------------- a loss-scale step as ops
# The overflow test of dynamic loss scaling written with these ops: the squared norm of the
# gradients is finite (LT +inf: false for inf and NaN) and their mean not below a floor;
# the next scale is picked with Where. Run by placer's executor and by Caffe2's RunNetOnce.
SCALE_STEP = [
    ("SumSqrElements", ["g1"], ["s1"], {}),
    ("SumSqrElements", ["g2"], ["s2"], {}),
    ("Sum", ["s1", "s2"], ["total"], {}),
    ("LT", ["total", "inf"], ["finite"], {}),
    ("SumElements", ["g1"], ["mean"], {"average": 1}),
    ("LT", ["mean", "floor"], ["low"], {}),
    ("Not", ["low"], ["high"], {}),
    ("And", ["finite", "high"], ["ok"], {}),
    ("Where", ["ok", "up", "down"], ["scale"], {}),
    ("IsNaN", ["g2"], ["nan_mask"], {}),
    ("GE", ["g1", "bound"], ["over"], {"broadcast": 1, "axis": 1}),
]
SCALE_OUTPUTS = ["total", "finite", "ok", "scale", "nan_mask", "over"]


def _scale_feed(poison):
    rng = np.random.default_rng(3)
    g2 = rng.standard_normal(7).astype(F32)
    if poison is not None:
        g2[2] = poison
    return {"g1": rng.standard_normal((6, 5)).astype(F32) + 0.5, "g2": g2, "inf": np.array(np.inf, F32),
            "floor": np.array(-1.0, F32), "up": np.array(2048.0, F32), "down": np.array(512.0, F32),
            "bound": rng.standard_normal(5).astype(F32)}


def _placer_net(device_type=None):
    """The step as a placer Net, every op on ``device_type`` (1: CUDA) when given."""
    netdef = pb.NetDef(name="scale_step", external_input=list(_scale_feed(None)), external_output=SCALE_OUTPUTS)
    for op_type, ins, outs, args in SCALE_STEP:
        p = netdef.op.add(type=op_type, input=ins, output=outs)
        for key, value in args.items():
            p.arg.add(name=key, i=value)
        if device_type is not None:
            p.device_option.device_type = device_type
    return net_from_netdef(netdef, None)


SCALE_ORACLE = """
net = core.Net("scale_step")
for op_type, ins, outs, args in json.loads(STEP):
    net.Proto().op.extend([core.CreateOperator(op_type, ins, outs, **args)])
for case in range(N_CASES):
    workspace.ResetWorkspace()
    for name in FEED_NAMES:
        workspace.FeedBlob(name, inputs["%d_%s" % (case, name)])
    workspace.RunNetOnce(net)
    save(**{"%d_%s" % (case, o): workspace.FetchBlob(o) for o in OUTPUTS})
"""


@pytest.mark.caffe2
def test_a_loss_scale_step_runs_as_in_caffe2():
    """On the CPU and with every op on an emulated GPU (IsNaN and Where included, which
    Caffe2 itself runs on the CPU only)."""
    poisons = [None, np.inf, np.nan]
    feeds = [_scale_feed(p) for p in poisons]
    names = list(feeds[0])
    arrays = {f"{i}_{k}": v for i, feed in enumerate(feeds) for k, v in feed.items()}
    script = (f"STEP = {json.dumps(json.dumps(SCALE_STEP))}\nN_CASES = {len(feeds)}\n"
              f"FEED_NAMES = {names!r}\nOUTPUTS = {SCALE_OUTPUTS!r}\n" + SCALE_ORACLE)
    saved, _ = run_caffe2(script, arrays)
    for i, feed in enumerate(feeds):
        for device_type in (None, 1):
            ex = Executor(_placer_net(device_type), emulate_gpu=device_type is not None)
            got = ex.run(feed)
            assert {o.device for o in ex.record.ops} == {"cpu" if device_type is None else "emulated-cuda:0"}
            for name in SCALE_OUTPUTS:
                want = saved[f"{i}_{name}"]
                assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
                if name == "total" and np.isfinite(want):
                    assert abs(float(got[name]) - float(want)) <= _sum_tolerance(
                        "SumSqrElements", np.concatenate([feed["g1"].ravel(), feed["g2"]]))
                else:
                    np.testing.assert_array_equal(got[name], want, err_msg=name)
        assert saved[f"{i}_scale"] == (2048.0 if poisons[i] is None else 512.0)
