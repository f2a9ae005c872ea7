"""The float16 ops (FloatToHalf, HalfToFloat, Float16ConstantFill, Float16UniformFill,
GivenTensorFp16Fill, FP16MomentumSGDUpdate), placer's bfloat16 casts, and float16 through
FC / MatMul / BatchMatMul and a whole net.

Real Caffe2 (torch 1.8.1, the CPU build) is the oracle for the casts and the fills, bit for
bit. FP16MomentumSGDUpdate has only a CUDA kernel in Caffe2, so it is checked against an
independent reference: a per-element loop following caffe2/sgd/fp16_momentum_sgd_op.cu in
exact rational arithmetic (fractions), each rounding done by choosing the nearer neighbour
(ties to even). The bfloat16 casts (no Caffe2 kernel anywhere) are checked against integer
bit arithmetic on each value and known values."""
from __future__ import annotations

import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from conftest import require_cupy
from cupy_standin import check_gpu_kernel

from placer.errors import ArgumentError, ShapeError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.ops.half import to_half_once
from placer.runtime.executor import Executor
from placer.runtime.inputs import random_inputs
from placer.types import Args, TensorType
from test_ops_roi import ours  # the kernel run with its inferred types checked
from google.protobuf import text_format


def _bits16(x):
    return np.asarray(x).view(np.uint16)


def _bits32(x):
    return np.asarray(x).view(np.uint32)


SPECIALS = np.array([np.nan, np.inf, -np.inf, 65504, 65519.99, 65520, 1e6, -1e6, 2.0 ** -24, 2.0 ** -25,
                     2.0 ** -25 * 1.0001, 3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 1e-10,
                     -0.0, 1.00048828125, 1.00146484375, -2.5e-5], np.float32)


def _float_inputs():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 100000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([SPECIALS, bits.view(np.float32), np.array([1, 0xFFFFFFFF, 0x7F800001, 0xFF800001], np.uint32).view(np.float32)])


ORACLE = """
def run(t, ins, outs, **kw):
    for k, v in ins.items():
        workspace.FeedBlob(k, v)
    workspace.RunOperatorOnce(core.CreateOperator(t, list(ins), outs, **kw))
    return [workspace.FetchBlob(o) for o in outs]
x, h = inputs["x"], inputs["h"]
out = {}
out["f2h"], = run("FloatToHalf", {"x": x}, ["a"])
out["f2h_clip"], = run("FloatToHalf", {"x": x}, ["b"], clip=1)
out["h2f"], = run("HalfToFloat", {"h": h}, ["c"])
out["h2f_tail"], = run("HalfToFloat", {"t": h[0x7BFC:0x7C09]}, ["c2"])
for i, kw in enumerate(CONSTANT_CASES):
    out["const%d" % i], = run("Float16ConstantFill", {}, ["d%d" % i], **kw)
for i, kw in enumerate(UNIFORM_CASES):
    out["unif%d" % i], = run("Float16UniformFill", {}, ["u%d" % i], **kw)
out["fake_fp16"], = run("FC", {"fx": inputs["fx"], "fw": inputs["fw"], "fb": inputs["fb"]}, ["fy"],
                        engine="FAKE_FP16")
errors = []
for kw in CONSTANT_ERRORS:
    try:
        run("Float16ConstantFill", {}, ["e"], **kw)
        errors.append(None)
    except Exception as e:
        errors.append(str(e).splitlines()[0])
for t, name in (("FloatToHalf", "h"), ("HalfToFloat", "x")):
    try:
        run(t, {name: inputs[name][:3]}, ["e"])
        errors.append(None)
    except Exception as e:
        errors.append(str(e).splitlines()[0])
save(**out)
save_json(errors)
"""

CONSTANT_CASES = [dict(value=1.5, shape=[2, 3]), dict(value=70000.0, shape=[2]), dict(shape=[3]),
                  dict(value=0.1), dict(value=1.0, shape=[0, 3]), dict(value=-3e-6, shape=[1, 2, 2]),
                  dict(value=0.1, shape=[4], dtype=1)]
UNIFORM_CASES = [dict(shape=[2000, 50], min=-2.0, max=3.0), dict(shape=[3, 0]), dict(shape=[200, 100]),
                 dict(shape=[100, 100], min=-60000.0, max=60000.0)]
CONSTANT_ERRORS = [dict(value=2, shape=[2])]
_fc_rng = np.random.default_rng(11)
FC_INPUTS = {"fx": _fc_rng.standard_normal((16, 256)).astype(np.float16).astype(np.float32),
             "fw": (_fc_rng.standard_normal((8, 256)) * 0.1).astype(np.float16).astype(np.float32),
             "fb": np.zeros(8, np.float32)}


@pytest.fixture(scope="module")
def oracle():
    x = _float_inputs()
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    script = (f"CONSTANT_CASES = {CONSTANT_CASES!r}\nUNIFORM_CASES = {UNIFORM_CASES!r}\n"
              f"CONSTANT_ERRORS = {CONSTANT_ERRORS!r}\n" + ORACLE)
    saved, errors = run_caffe2(script, {"x": x, "h": h, **FC_INPUTS})
    return x, h, saved, errors


@pytest.mark.caffe2
def test_float_to_half_matches_caffe2_bit_for_bit(oracle):
    """Every float32 class: NaNs (payload and quiet bit), overflow to inf, ties, subnormals."""
    x, _, saved, _ = oracle
    for key, args in (("f2h", {}), ("f2h_clip", {"clip": 1})):
        (got,) = ours("FloatToHalf", [x], args)
        assert np.array_equal(_bits16(got), _bits16(saved[key])), key
    assert np.isinf(saved["f2h"][1]) and saved["f2h_clip"][1] == 65504   # clip
    assert saved["f2h_clip"][0] == 65504                                 # NaN clipped: fbgemm's order


@pytest.mark.caffe2
def test_half_to_float_matches_caffe2_on_every_half(oracle):
    _, h, saved, _ = oracle
    (got,) = ours("HalfToFloat", [h], {})
    assert np.array_equal(_bits32(got), _bits32(saved["h2f"]))
    # 13 values: 8 converted together, then 5 NaNs by fbgemm's scalar code
    (got,) = ours("HalfToFloat", [h[0x7BFC:0x7C09]], {})
    assert np.array_equal(_bits32(got), _bits32(saved["h2f_tail"]))
    assert np.isnan(got[8:]).all() and (_bits32(got[8:]) == 0x7FFFFFFF).all()


@pytest.mark.caffe2
def test_float16_fills_match_caffe2(oracle):
    _, _, saved, errors = oracle
    for i, kw in enumerate(CONSTANT_CASES):
        (got,) = ours("Float16ConstantFill", [], kw)
        want = saved[f"const{i}"]
        assert got.shape == want.shape and np.array_equal(_bits16(got), _bits16(want)), kw
    for i, kw in enumerate(UNIFORM_CASES):
        got = ours("Float16UniformFill", [], kw)[0].astype(np.float64)
        want = saved[f"unif{i}"].astype(np.float64)
        assert got.shape == want.shape and want.dtype == np.float64
        if not want.size:
            continue
        lo, hi = kw.get("min", 0.0), kw.get("max", 1.0)
        # both in [min, max] after rounding to float16 (max itself can come out of the rounding);
        # with n >= 10^4 draws the mean of a uniform is within 5 sigma = 5 (hi - lo) / sqrt(12 n)
        # of (lo + hi) / 2, and so is the oracle's, hence 10 sigma between the two
        for a in (got, want):
            assert a.min() >= lo and a.max() <= np.float16(hi)
        sigma = (hi - lo) / np.sqrt(12 * want.size)
        assert abs(got.mean() - want.mean()) < 10 * sigma
        assert abs(got.std() - want.std()) < 0.02 * (hi - lo)
    assert errors[0] is not None and "has_f" in errors[0]     # an integer value: refused by both
    with pytest.raises(ArgumentError, match="Float16ConstantFill 'value' must be a float"):
        ours("Float16ConstantFill", [], CONSTANT_ERRORS[0])
    assert all(e is not None and "Tensor type mismatch" in e for e in errors[1:])


@pytest.mark.caffe2
def test_float16_fc_is_caffe2s_fake_fp16_fc_rounded(oracle):
    """Caffe2's CPU FC engine FAKE_FP16 (in the 1.8.1 build) rounds X, W and b to float16 and
    multiplies in float32 with a float32 result; placer's float16 FC is that product rounded
    to float16 (b = 0 here, so the bias add rounds nothing more). The two float32 sums differ
    in order only (2 K 2^-24 sum |x||w| at most), and the rounding to float16 is within half an
    ulp of whichever sum."""
    saved = oracle[2]
    x, w, b = (FC_INPUTS[k].astype(np.float16) for k in ("fx", "fw", "fb"))
    (got,) = ours("FC", [x, w, b], {})
    fake = saved["fake_fp16"].astype(np.float64)
    k = x.shape[1]
    slack = 2 * k * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T)
    half_ulp = np.spacing(np.abs(fake).astype(np.float16)).astype(np.float64) / 2
    assert got.dtype == np.float16 and np.all(np.abs(got - fake) <= half_ulp + slack)
    assert np.mean(got == fake.astype(np.float16)) > 0.95         # mostly the very same rounding


def test_cast_and_fill_errors_name_the_op():
    with pytest.raises(ShapeError, match=r"op #0 FloatToHalf: X must be float32, found float16"):
        registry.get("FloatToHalf").infer([TensorType((3,), "float16")], Args({}, op="#0 FloatToHalf"))
    with pytest.raises(ShapeError, match=r"X must be float16, found float32"):
        registry.get("HalfToFloat").infer([TensorType((3,), "float32")], Args({}, op="#0 HalfToFloat"))
    u = registry.get("Float16UniformFill")
    for kw, what in ((dict(shape=[4], min=1.0, max=1.0), "min < max"), (dict(shape=[]), "first dimension"),
                     (dict(shape=[0, 3]), "first dimension")):
        with pytest.raises(ArgumentError, match=what):
            u.infer([], Args(kw, op="#0 Float16UniformFill"))
    with pytest.raises(ShapeError, match="holds 4 values, 'values' has 3"):
        registry.get("GivenTensorFp16Fill").infer([], Args({"values": [1.0, 2.0, 3.0], "shape": [2, 2]}, op="#0 G"))


def test_uniform_fill_is_seeded():
    a = Args({"shape": [50, 4], "min": -1.0, "max": 1.0}, op="#0 U", seed=7)
    k = registry.get("Float16UniformFill").kernel
    assert np.array_equal(k(np, [], a)[0], k(np, [], a)[0])
    assert not np.array_equal(k(np, [], a)[0], k(np, [], Args(dict(a), op="#0 U", seed=8))[0])


def test_given_tensor_fp16_fill_rounds_its_values():
    values = [0.1, 65519.0, 70000.0, 1e-8, -2.0, 3.0]
    (got,) = ours("GivenTensorFp16Fill", [], {"values": values, "shape": [2, 3]})
    assert got.shape == (2, 3)
    # the values are float arguments (float32), rounded as FloatToHalf rounds (checked against Caffe2)
    (want,) = ours("FloatToHalf", [np.array(values, np.float32)], {})
    assert np.array_equal(_bits16(got.ravel()), _bits16(want)) and np.isinf(got.ravel()[2])
    assert ours("GivenTensorFp16Fill", [], {"values": values})[0].shape == (6,)


def test_devices_say_where_caffe2_has_kernels():
    # half_float_ops.cc (CPU) and half_float_ops.cu (CUDA: FloatToHalf, HalfToFloat,
    # Float16UniformFill); fp16_momentum_sgd_op.cu (CUDA only); no GivenTensorFp16Fill, no bfloat16
    want = {"FloatToHalf": {"cpu", "gpu"}, "HalfToFloat": {"cpu", "gpu"}, "Float16UniformFill": {"cpu", "gpu"},
            "Float16ConstantFill": {"cpu"}, "FP16MomentumSGDUpdate": {"gpu"}, "GivenTensorFp16Fill": set(),
            "FloatToBFloat16": set(), "BFloat16ToFloat": set()}
    for t, kinds in want.items():
        opdef = registry.get(t)
        assert opdef.devices == {"cpu", "gpu"} and opdef.caffe2_kinds() == kinds, t


def test_cast_costs_count_two_byte_values():
    f = registry.get("FloatToBFloat16")
    x = TensorType((10, 10), "float32")
    (y,) = f.infer([x], Args({}, op="#0 F"))
    assert y.dtype == "bfloat16" and y.nbytes == 200
    c = f.cost([x], [y], Args({}))
    assert c.bytes_read == 400 and c.bytes_written == 200


# ---------------------------------------------------------------- bfloat16
def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the float32 bits, one value at a time with Python ints."""
    out = []
    for b in _bits32(x).tolist():
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF):
            out.append((b >> 16) | 0x40)                          # NaN: quiet, top payload kept
            continue
        upper, lower = b >> 16, b & 0xFFFF
        if lower > 0x8000 or (lower == 0x8000 and upper & 1):
            upper += 1                                            # carries into the exponent: inf
        out.append(upper)
    return np.array(out, dtype=np.uint16)


def test_bfloat16_casts():
    x = _float_inputs()[:20000]
    (got,) = ours("FloatToBFloat16", [x], {})
    assert np.array_equal(got, _bf16_reference(x))
    known = np.array([1.0, -2.0, np.pi, np.inf, -np.inf, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 3.4e38, 1e-40, -0.0],
                     np.float32)
    want = [0x3F80, 0xC000, 0x4049, 0x7F80, 0xFF80, 0x3F80, 0x3F82, 0x7F80, 0x0001, 0x8000]
    assert ours("FloatToBFloat16", [known], {})[0].tolist() == want
    allb = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    (back,) = ours("BFloat16ToFloat", [allb], {}, dtypes=["bfloat16"])
    assert np.array_equal(_bits32(back) >> 16, allb) and not (_bits32(back) & 0xFFFF).any()
    (again,) = ours("FloatToBFloat16", [back], {})
    nan = np.isnan(back)
    assert np.array_equal(again[~nan], allb[~nan])               # exact round trip
    assert np.array_equal(again[nan], allb[nan] | 0x40)          # NaNs come back quiet


# ---------------------------------------------------------------- FP16MomentumSGDUpdate
def _round_to(q: Fraction, dtype) -> float:
    """Exact ``q`` rounded to nearest ``dtype`` (ties to even), found among the neighbours of
    the float64 nearest to it."""
    with np.errstate(over="ignore"):
        return _round_to_inner(q, dtype)


def _round_to_inner(q: Fraction, dtype) -> float:
    info = np.finfo(dtype)
    near = np.array(float(q), dtype=np.float64).astype(dtype)
    if np.isinf(near) and abs(q) < Fraction(float(info.max)) * (1 + Fraction(1, 2 ** (info.nmant + 1))):
        near = np.copysign(info.max, float(q)).astype(dtype)
    cands = [near, np.nextafter(near, dtype(np.inf)), np.nextafter(near, dtype(-np.inf))]
    cands = [c for c in cands if np.isfinite(c)]
    if not cands:
        return float(near)
    dist = [abs(Fraction(float(c)) - q) for c in cands]
    best = min(dist)
    ties = [c for c, d in zip(cands, dist) if d == best]
    if len(ties) > 1:
        ties = [c for c in ties if not (c.view(np.uint16 if dtype == np.float16 else np.uint32) & 1)]
    limit = Fraction(float(info.max)) + (Fraction(float(info.max)) - Fraction(float(np.nextafter(info.max, 0).astype(dtype)))) / 2
    if abs(q) >= limit:
        return float(np.copysign(np.inf, float(q)))
    return float(ties[0])


def _sgd_reference(g, m, lr, p, momentum, nesterov, wd, fp32):
    """caffe2/sgd/fp16_momentum_sgd_op.cu, element by element, in exact arithmetic."""
    fr = Fraction
    n = g.size
    g, m, p = (list(map(fr, a.astype(np.float64).tolist())) for a in (g, m, p))
    ng, nm, np_ = list(g), list(m), list(p)
    dt = np.float32 if fp32 else np.float16

    def r(v):
        return fr(_round_to(v, dt))
    if fp32:
        LR, MOM, WD = (fr(float(np.float32(v))) for v in (lr, momentum, wd))
        todo = range(n - n % 2)
    else:
        LR, MOM, WD = (fr(float(np.float32(v).astype(np.float16))) for v in (lr, momentum, wd))
        todo = range(n if n >= 2 else 0)
    for i in todo:
        g1 = r(WD * p[i] + g[i])
        mm = r(MOM * m[i])
        mi = r(LR * g1 + mm)
        nm[i] = mi
        ng[i] = r(r(mi * MOM + mi) - mm) if nesterov else mi
        base = np_[0] if (nesterov and not fp32 and n % 2 and i == n - 1) else p[i]
        np_[i] = r(base - ng[i])
    return [np.array([_round_to(v, np.float16) for v in a], np.float16) for a in (ng, nm, np_)]


def test_to_half_once_rounds_float64_once():
    """Where float64 -> float32 -> float16 would round twice: just past a float16 tie the
    float32 rounding lands on the tie and the second rounding goes to even."""
    tie = 1 + 2.0 ** -11
    v = np.array([tie + 2.0 ** -40, tie - 2.0 ** -40, -(tie + 2.0 ** -40), tie, 3 * tie, 2.0 ** -24 * 1.5 + 2.0 ** -60,
                  65519.99999, 65520.0, 1e-30, -1e-30, 1.0], np.float64)
    rng = np.random.default_rng(2)
    v = np.concatenate([v, rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 5, 2000)])
    got = to_half_once(np, v)
    want = np.array([_round_to(Fraction(x), np.float16) for x in v.tolist()], np.float16)
    assert np.array_equal(_bits16(got), _bits16(want))
    assert got[0] == 1 + 2.0 ** -10 and v[:1].astype(np.float32).astype(np.float16)[0] == 1.0
    assert _bits16(to_half_once(np, np.array([-0.0, -1e-30]))).tolist() == [0x8000, 0x8000]   # signed zeros


SGD_CASES = [(n, nesterov, fp32) for n in (1, 7, 8) for nesterov in (0, 1) for fp32 in (0, 1)]


@pytest.mark.parametrize("n,nesterov,fp32", SGD_CASES)
def test_fp16_momentum_sgd_matches_the_cuda_source(n, nesterov, fp32):
    """Bit for bit: both compute every rounding exactly (placer through float64 and float32
    rounded to odd, the reference in fractions), so any difference is a wrong formula."""
    rng = np.random.default_rng(n * 4 + nesterov * 2 + fp32)
    g = (rng.standard_normal(n) * 0.3).astype(np.float16)
    m = (rng.standard_normal(n) * 0.1).astype(np.float16)
    p = rng.standard_normal(n).astype(np.float16)
    lr = np.array([0.0123], np.float32)
    args = {"momentum": 0.9, "nesterov": nesterov, "weight_decay": 1e-3, "fp32_update": fp32}
    got = ours("FP16MomentumSGDUpdate", [g, m, lr, p], args, 3)
    want = _sgd_reference(g, m, lr[0], p, 0.9, nesterov, 1e-3, fp32)
    for a, b in zip(got, want):
        assert np.array_equal(_bits16(a), _bits16(b))
    if n == 1 or (fp32 and n % 2):      # the elements the CUDA kernel leaves alone
        for a, b in zip(got, (g, m, p)):
            assert a[-1] == b[-1]
    else:
        assert got[2][-1] != p[-1]


def test_fp16_momentum_sgd_shapes_and_errors():
    s = registry.get("FP16MomentumSGDUpdate")
    h, f = TensorType((4, 3), "float16"), TensorType((1,), "float32")
    a = Args({}, op="#0 FP16MomentumSGDUpdate")
    assert s.infer([h, h, f, h], a) == [h, h, h]
    with pytest.raises(ShapeError, match="param must be float16"):
        s.infer([h, h, f, TensorType((4, 3), "float32")], a)
    with pytest.raises(ShapeError, match="lr must hold exactly one value"):
        s.infer([h, h, TensorType((2,), "float32"), h], a)
    with pytest.raises(ShapeError, match="grad and moment must have the same number"):
        s.infer([h, TensorType((5,), "float16"), f, h], a)
    assert s.cost([h, h, f, h], [h, h, h], Args({"nesterov": 1})).flops == 9 * 12


# ---------------------------------------------------------------- float16 through FC and a net
def _half(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def _gemm_bound(a, b):
    """One float16 ulp of the float64 product (the float32 result may round the other way
    at a near-tie) plus the float32 accumulation error, K 2^-24 sum |a||b|."""
    exact = a.astype(np.float64) @ b.astype(np.float64)
    k = a.shape[-1]
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    return exact, ulp + k * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))


def test_fc_matmul_batch_matmul_float16_round_a_float32_product():
    rng = np.random.default_rng(3)
    x, w, b = _half(rng, (5, 64)), _half(rng, (7, 64), 0.2), _half(rng, (7,))
    (y,) = ours("FC", [x, w, b], {})
    exact, bound = _gemm_bound(x, w.T)
    # Y = round16(round16(X W^T) + b): the bias add is one more float16 rounding (half an ulp)
    step = (exact.astype(np.float16).astype(np.float64) + b).astype(np.float16)
    assert y.dtype == np.float16
    assert np.all(np.abs(y.astype(np.float64) - step) <= 2 * bound + np.spacing(np.abs(step)))
    a, c = _half(rng, (6, 32)), _half(rng, (32, 5))
    (z,) = ours("MatMul", [a, c], {})
    exact, bound = _gemm_bound(a, c)
    assert z.dtype == np.float16 and np.all(np.abs(z - exact) <= bound)
    a3, c3 = _half(rng, (2, 6, 32)), _half(rng, (2, 32, 5))
    (z3,) = ours("BatchMatMul", [a3, c3], {})
    exact, bound = _gemm_bound(a3, c3)
    assert z3.dtype == np.float16 and np.all(np.abs(z3 - exact) <= bound)


@pytest.mark.parametrize("op_type,shapes", [("FC", [(256, 512), (128, 512), (128,)]),
                                           ("MatMul", [(256, 512), (512, 128)]),
                                           ("BatchMatMul", [(4, 64, 512), (4, 512, 128)])])
def test_float16_products_declare_their_float32_temporaries(op_type, shapes):
    """tracemalloc's peak during the kernel, less its output, within the declared scratch."""
    rng = np.random.default_rng(1)
    arrays = [_half(rng, s) for s in shapes]
    opdef, a = registry.get(op_type), Args({}, op=f"#0 {op_type}")
    types = [TensorType(x.shape, "float16") for x in arrays]
    outs = opdef.infer(types, a)
    tracemalloc.start()
    try:
        (y,) = opdef.kernel(np, arrays, a)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    declared = opdef.scratch_bytes(types, outs, a)
    assert peak - y.nbytes <= declared and declared <= 4 * max(peak, 1)


NET = """
name: "half_mlp"
op { output: "w" type: "GivenTensorFp16Fill" arg { name: "shape" ints: 4 ints: 6 } arg { name: "values" %s } }
op { output: "b" type: "Float16ConstantFill" arg { name: "shape" ints: 4 } arg { name: "value" f: 0.25 } }
op { input: "x" output: "xh" type: "FloatToHalf" }
op { input: "xh" input: "w" input: "b" output: "yh" type: "FC" }
op { input: "yh" output: "rh" type: "Relu" }
op { input: "rh" output: "out" type: "HalfToFloat" }
external_input: "x"
external_output: "out"
"""


def test_float16_net_runs_end_to_end():
    rng = np.random.default_rng(5)
    wv = (rng.standard_normal(24) * 0.5).astype(np.float32)
    text = NET % " ".join(f"floats: {v!r}" for v in wv.tolist())
    net = net_from_netdef(text_format.Parse(text, pb.NetDef()))
    x = rng.standard_normal((3, 6)).astype(np.float32)
    got = Executor(net).run({"x": x}, warmup=0)["out"]
    assert got.dtype == np.float32 and got.shape == (3, 4)
    xh, wh = x.astype(np.float16), wv.astype(np.float16).reshape(4, 6)
    exact, bound = _gemm_bound(xh, wh.T)
    want = np.maximum((exact.astype(np.float16).astype(np.float64) + 0.25).astype(np.float16), 0)
    assert np.all(np.abs(got - want) <= 2 * bound + np.spacing(np.abs(want).astype(np.float16)))
    fed = random_inputs(net, {"x": TensorType((3, 6), "float16")}, ["x"], seed=1)
    assert fed["x"].dtype == np.float16 and fed["x"].shape == (3, 6)


CAST_NET = """
name: "half_casts"
op { output: "c" type: "Float16ConstantFill" arg { name: "shape" ints: 3 ints: 5 } arg { name: "value" f: 0.3 } }
op { input: "x" output: "xh" type: "FloatToHalf" arg { name: "clip" i: 1 } }
op { input: "xh" output: "y" type: "HalfToFloat" }
op { input: "c" output: "cf" type: "HalfToFloat" }
op { input: "y" input: "cf" output: "out" type: "Add" }
external_input: "x"
external_output: "out"
"""

NET_ORACLE = """
net = caffe2_pb2.NetDef()
text_format.Parse(NET_TEXT, net)
workspace.FeedBlob("x", inputs["x"])
workspace.RunNetOnce(net)
save(out=workspace.FetchBlob("out"), xh=workspace.FetchBlob("xh"))
"""


@pytest.mark.caffe2
def test_cast_net_matches_caffe2():
    """The float16 ops Caffe2's CPU build runs, in one net run by placer's executor and by
    Caffe2: the same bits (the float32 Add of two exact values rounds the same way)."""
    x = (np.random.default_rng(4).standard_normal((3, 5)) * 3e4).astype(np.float32)
    x[0, 0], x[1, 1] = 1e6, np.nan
    saved, _ = run_caffe2(f"NET_TEXT = {CAST_NET!r}\n" + NET_ORACLE, {"x": x})
    net = net_from_netdef(text_format.Parse(CAST_NET, pb.NetDef()))
    got = Executor(net).run({"x": x}, warmup=0)
    assert got["out"].dtype == np.float32
    assert np.array_equal(_bits32(got["out"]), _bits32(saved["out"]))


# ---------------------------------------------------------------- on the cupy stand-in
def _kernel_cases():
    rng = np.random.default_rng(9)
    x = _float_inputs()[:500]
    h = _half(rng, (8, 3))
    lr = np.array([0.01], np.float32)
    sgd = [h, _half(rng, (8, 3)), lr, _half(rng, (8, 3))]
    return [("FloatToHalf", [x], {}), ("FloatToHalf", [x], {"clip": 1}), ("HalfToFloat", [h], {}),
            ("FloatToBFloat16", [x], {}), ("BFloat16ToFloat", [_bits16(h)], {}),
            ("Float16ConstantFill", [], {"value": 2.5, "shape": [3, 2]}),
            ("Float16UniformFill", [], {"shape": [4, 5]}), ("GivenTensorFp16Fill", [], {"values": [1.0, 2.0]}),
            ("FP16MomentumSGDUpdate", sgd, {"momentum": 0.9}),
            ("FP16MomentumSGDUpdate", sgd, {"momentum": 0.9, "nesterov": 1, "fp32_update": 1}),
            ("FC", [_half(rng, (4, 6)), _half(rng, (3, 6)), _half(rng, (3,))], {}),
            ("MatMul", [_half(rng, (4, 6)), _half(rng, (6, 3))], {}),
            ("BatchMatMul", [_half(rng, (2, 4, 6)), _half(rng, (2, 6, 3))], {})]


KERNEL_CASES = _kernel_cases()


@pytest.mark.parametrize("op_type,inputs,args", KERNEL_CASES, ids=[f"k{i}" for i in range(len(KERNEL_CASES))])
def test_gpu_kernels_keep_to_cupy_rules(op_type, inputs, args):
    require_cupy()
    check_gpu_kernel(registry.get(op_type), inputs, Args(args, op=f"#0 {op_type}", n_outputs=3))
