"""Caffe2's Int8 ops (QNNPACK) -- Int8Quantize, Int8Dequantize, the Int8 fills, Int8Conv,
Int8ConvRelu, Int8ConvTranspose, Int8FC -- against real Caffe2 (torch 1.8.1) bit for bit:
many random cases in one oracle script each, a whole quantized net on the executor, and
the requantization arithmetic, types, costs and errors."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from caffe2_oracle import run_caffe2
from google.protobuf import text_format

from placer import shapes
from placer.errors import ArgumentError, ShapeError
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.ops.int8_base import Int8Tensor, requantization_scale, requantize
from placer.runtime.executor import Executor
from placer.types import Args, TensorType


def f32(v: float) -> float:
    """A scale as the float32 value both sides hold."""
    return float(np.float32(v))


def ours(op_type, inputs, args):
    a = Args(args, op=f"#0 {op_type}")
    opdef = registry.get(op_type)
    (y,) = opdef.kernel(np, inputs, a)
    types = [TensorType(t.shape, str(t.dtype)) for t in inputs]
    (t,) = opdef.infer(types, a)
    assert y.shape == t.shape and str(y.dtype) == t.dtype
    return y


# ---------------------------------------------------------------- the oracle script

# Each case: the op, its arguments, and X, W, B as (uint8 / int32 data, scale, zero point).
# Caffe2 gets them from Int8GivenTensorFill (the bytes of X and W as the string 'values')
# and Int8GivenIntTensorFill, runs the op once and hands back FetchInt8Blob's triple.
ORACLE = """
for i, (op_type, args, q) in enumerate(CASES):
    for name, (dtype, scale, zp) in zip(("X", "W", "B"), q):
        data = inputs[f"{name}{i}"]
        fill = "Int8GivenTensorFill" if dtype == "uint8" else "Int8GivenIntTensorFill"
        values = data.tobytes() if dtype == "uint8" else [int(v) for v in data.reshape(-1)]
        workspace.RunOperatorOnce(core.CreateOperator(fill, [], [name], values=values,
            shape=list(data.shape), Y_scale=scale, Y_zero_point=zp))
    workspace.RunOperatorOnce(core.CreateOperator(op_type, ["X", "W", "B"], ["Y"], **args))
    y, s, z = workspace.FetchInt8Blob("Y")
    save(**{f"Y{i}": y})
    quant.append([float(s), int(z)])
save_json(quant)
"""


def run_oracle(cases):
    """cases: (op_type, args, [Int8Tensor X, W, B]) -> Caffe2's (data, scale, zero point) each."""
    spec, arrays = [], {}
    for i, (op_type, args, ins) in enumerate(cases):
        spec.append((op_type, args, [(str(t.dtype), t.scale, t.zero_point) for t in ins]))
        arrays.update({f"{n}{i}": t.data for n, t in zip("XWB", ins)})
    saved, quant = run_caffe2(f"CASES = {spec!r}\nquant = []\n" + ORACLE, arrays)
    return [(saved[f"Y{i}"], *quant[i]) for i in range(len(cases))]


def _zp(rng, kind):
    return {"zero": 0, "mid": 128, "rand": int(rng.integers(0, 256))}[kind]


def _quantized(rng, shape, zp_kind, scale, spread=None):
    """Random uint8 data; with ``spread``, within +-spread of the zero point."""
    zp = _zp(rng, zp_kind)
    if spread is None:
        return Int8Tensor(rng.integers(0, 256, shape, dtype=np.uint8), f32(scale), zp)
    data = np.clip(zp + rng.integers(-spread, spread + 1, shape), 0, 255).astype(np.uint8)
    return Int8Tensor(data, f32(scale), zp)


def conv_case(seed, n, h, w, c, m, k, stride=1, pads=(0, 0, 0, 0), dilation=1, group=1,
              zps=("rand", "rand", "rand"), y_factor=1.0, relu=False, transpose=False, adj=0,
              scales=None, spread=None):
    """Random X (N, H, W, C), W, B with scales whose requantization scale is
    x_scale * w_scale / y_scale; y_factor < 1 pushes outputs into saturation. ``scales``
    (x, w, y) fixes them: a power of two puts many accumulators on a rounding tie, more so
    with data within ``spread`` of the zero points (small accumulators, small bias)."""
    rng = np.random.default_rng(seed)
    x_scale, w_scale = f32(rng.uniform(0.01, 0.1)), f32(rng.uniform(0.002, 0.05))
    if scales:
        x_scale, w_scale = f32(scales[0]), f32(scales[1])
    x = _quantized(rng, (n, h, w, c), zps[0], x_scale, spread)
    if transpose:
        wt = _quantized(rng, (c, k, k, m), zps[1], w_scale, spread)
        taps = c * k * k // max(stride * stride, 1)
    else:
        wt = _quantized(rng, (m, k, k, c // group), zps[1], w_scale, spread)
        taps = k * k * c // group
    # a typical |accumulator| is ~ 74 * sqrt(taps) * 74 (centred uniform uint8 values);
    # choose y_scale so that it lands near 128 levels, times y_factor
    typical = 74.0 * 74.0 * np.sqrt(taps) * x_scale * w_scale
    y_scale = f32(max(typical / 128.0 * y_factor, x_scale * w_scale * 1.0001))
    if scales:
        y_scale = f32(scales[2])
    b_range = 20000 if spread is None else 4 * spread * spread
    b = Int8Tensor(rng.integers(-b_range, b_range, (m,), dtype=np.int32), f32(x_scale * w_scale), 0)
    args = {"order": "NHWC", "kernel": k, "Y_scale": y_scale, "Y_zero_point": _zp(rng, zps[2])}
    if stride != 1:
        args["stride"] = stride
    if any(pads):
        args["pads"] = list(pads)
    if dilation != 1:
        args["dilation"] = dilation
    if group != 1:
        args["group"] = group
    if adj:
        args["adj"] = adj
    op_type = "Int8ConvTranspose" if transpose else ("Int8ConvRelu" if relu else "Int8Conv")
    return op_type, args, [x, wt, b]


CONV_CASES = [
    conv_case(1, 1, 7, 7, 3, 4, 3),                                          # C/group < 8
    conv_case(2, 2, 9, 8, 16, 8, 3, pads=(1, 1, 1, 1), relu=True),
    conv_case(3, 1, 10, 11, 8, 12, 3, stride=2, pads=(1, 0, 2, 1)),
    conv_case(4, 1, 8, 8, 16, 16, 1, zps=("zero", "zero", "zero")),          # 1x1: QNNPACK's GEMM path
    conv_case(5, 2, 6, 7, 32, 24, 1, zps=("mid", "mid", "mid"), relu=True),
    conv_case(6, 1, 9, 9, 8, 8, 3, pads=(1, 1, 1, 1), group=8),              # depthwise, group < 8
    conv_case(7, 1, 10, 9, 24, 24, 3, stride=2, pads=(1, 1, 1, 1), group=24, relu=True),  # depthwise
    conv_case(8, 1, 8, 8, 16, 16, 5, pads=(2, 2, 2, 2), group=16),           # depthwise 5x5: conv path
    conv_case(9, 1, 9, 10, 12, 8, 3, group=4, pads=(0, 1, 1, 0)),            # grouped
    conv_case(10, 1, 11, 11, 4, 6, 3, dilation=2, pads=(2, 2, 2, 2)),
    conv_case(11, 2, 8, 8, 8, 16, 3, pads=(1, 1, 1, 1), y_factor=0.05),      # heavy saturation
    conv_case(12, 1, 8, 8, 8, 8, 3, y_factor=0.05, relu=True, zps=("rand", "rand", "mid")),
    conv_case(13, 1, 12, 12, 16, 8, 2, stride=2, zps=("mid", "rand", "zero"), y_factor=20.0),
    conv_case(14, 1, 7, 9, 40, 9, 3, pads=(1, 2, 0, 1)),
    conv_case(15, 1, 6, 6, 3, 5, 3, transpose=True),
    conv_case(16, 2, 5, 4, 8, 6, 3, stride=2, pads=(1, 1, 1, 1), transpose=True),
    conv_case(17, 1, 4, 5, 16, 8, 4, stride=2, pads=(1, 1, 1, 1), adj=1, transpose=True,
              zps=("mid", "zero", "rand")),
    conv_case(18, 1, 5, 5, 4, 4, 2, stride=3, transpose=True, y_factor=0.1),
    conv_case(19, 2, 16, 16, 32, 32, 3, pads=(1, 1, 1, 1), y_factor=0.5),  # 16k outputs
    conv_case(20, 1, 14, 14, 16, 16, 3, pads=(1, 1, 1, 1), group=16, y_factor=0.3, relu=True),
    # requantization scales 2^-10 and 2^-3: ties, which QNNPACK rounds half away from zero
    conv_case(26, 1, 10, 10, 8, 8, 3, pads=(1, 1, 1, 1), scales=(0.125, 0.0625, 0.03125),
              spread=3),
    conv_case(27, 1, 10, 10, 4, 4, 1, scales=(0.5, 0.25, 0.5), zps=("rand", "rand", "mid"),
              spread=5),
    conv_case(28, 1, 9, 9, 8, 8, 3, group=8, scales=(0.25, 0.25, 0.125), zps=("mid", "mid", "mid"),
              spread=4),
    conv_case(29, 1, 6, 6, 8, 8, 3, stride=2, scales=(0.25, 0.25, 0.25), transpose=True, spread=3),
]
# legacy_pad SAME (conv) and VALID (transpose), and a transpose whose 'group' Caffe2 ignores
for _case, _extra in ((conv_case(30, 1, 9, 9, 8, 8, 3, stride=2), {"legacy_pad": 2}),
                      (conv_case(31, 1, 5, 5, 8, 8, 3, stride=2, transpose=True), {"legacy_pad": 1}),
                      (conv_case(32, 1, 5, 5, 8, 8, 3, stride=2, transpose=True), {"group": 2})):
    CONV_CASES.append((_case[0], {**_case[1], **_extra}, _case[2]))


def fc_case(seed, x_shape, n, zps=("rand", "rand", "rand"), y_factor=1.0):
    rng = np.random.default_rng(seed)
    x_scale, w_scale = f32(rng.uniform(0.01, 0.1)), f32(rng.uniform(0.002, 0.05))
    k = int(np.prod(x_shape[1:]))
    x = _quantized(rng, x_shape, zps[0], x_scale)
    w = _quantized(rng, (n, k), zps[1], w_scale)
    b = Int8Tensor(rng.integers(-50000, 50000, (n,), dtype=np.int32), f32(x_scale * w_scale), 0)
    typical = 74.0 * 74.0 * np.sqrt(k) * x_scale * w_scale
    y_scale = f32(max(typical / 128.0 * y_factor, x_scale * w_scale * 1.0001))
    return "Int8FC", {"Y_scale": y_scale, "Y_zero_point": _zp(rng, zps[2])}, [x, w, b]


FC_CASES = [
    fc_case(21, (4, 20), 7),
    fc_case(22, (3, 5), 16, zps=("zero", "zero", "zero")),           # K < 8
    fc_case(23, (2, 3, 4, 5), 9, zps=("mid", "mid", "rand")),        # X flattened after dim 0
    fc_case(24, (17, 64), 33, y_factor=0.05),                        # saturation
    fc_case(25, (1, 300), 4, y_factor=30.0),                         # tiny requantization scale
]


@pytest.mark.caffe2
def test_int8_conv_fc_match_caffe2_bit_for_bit():
    cases = CONV_CASES + FC_CASES
    want = run_oracle(cases)
    saturated = 0
    for (op_type, args, ins), (y, scale, zp) in zip(cases, want):
        got = ours(op_type, ins, args)
        assert got.data.dtype == np.uint8 and got.shape == y.shape, (op_type, args)
        assert (got.scale, got.zero_point) == (f32(scale), zp)
        bad = np.flatnonzero(got.data != y)
        assert bad.size == 0, (f"{op_type} {args}: {bad.size} of {y.size} differ, e.g. "
                               f"ours {got.data.reshape(-1)[bad[:5]]} vs Caffe2 {y.reshape(-1)[bad[:5]]}")
        saturated += int(np.sum((y == 0) | (y == 255)))
    assert saturated > 100    # the saturating cases do saturate


# ---------------------------------------------------------------- Quantize / Dequantize / fills

QUANTIZE_ORACLE = """
for i, (scale, zp) in enumerate(QUANT):
    workspace.FeedBlob("x", inputs["x"])
    workspace.RunOperatorOnce(core.CreateOperator("Int8Quantize", ["x"], ["q"], Y_scale=scale,
                                                  Y_zero_point=zp))
    q, s, z = workspace.FetchInt8Blob("q")
    workspace.RunOperatorOnce(core.CreateOperator("Int8Dequantize", ["q"], ["d"]))
    save(**{f"q{i}": q, f"d{i}": workspace.FetchBlob("d")})
    out.append([float(s), int(z)])
save_json(out)
"""


@pytest.mark.caffe2
def test_quantize_and_dequantize_match_caffe2():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(500) * 4, rng.uniform(-300, 300, 500),
                        np.arange(-20, 20) * 0.25,                 # ties: round half to even
                        [1e10, -1e10, 3e9, 2.2e9, 2.1e9, np.inf, -np.inf, np.nan, 0.0, -0.0]]
                       ).astype(np.float32).reshape(2, -1, 5)
    quant = [(f32(1.0), 10), (f32(0.5), 0), (f32(0.037), 128), (f32(3.3), 255), (f32(1e-3), 77),
             (f32(1.0), 300), (f32(2.0), -5)]
    saved, out = run_caffe2(f"QUANT = {quant!r}\nout = []\n" + QUANTIZE_ORACLE, {"x": x})
    for i, (scale, zp) in enumerate(quant):
        q = ours("Int8Quantize", [x], {"Y_scale": scale, "Y_zero_point": zp})
        np.testing.assert_array_equal(q.data, saved[f"q{i}"])
        assert (q.scale, q.zero_point) == tuple(out[i])
        d = ours("Int8Dequantize", [q], {})
        assert d.dtype == np.float32
        np.testing.assert_array_equal(d, saved[f"d{i}"])      # one float32 multiply: exact


def test_fills_make_int8_tensors():
    raw = bytes([0, 1, 255, 128, 200, 3])
    for values in (raw, "abc\x01\x7f!"):       # undecodable bytes, and bytes the loader gives as text
        a = {"values": values, "shape": [2, 3], "Y_scale": 0.5, "Y_zero_point": 128}
        w = ours("Int8GivenTensorFill", [], a)
        want = values if isinstance(values, bytes) else values.encode()
        assert w.data.tolist() == list(np.frombuffer(want, np.uint8).reshape(2, 3).tolist())
        assert (w.scale, w.zero_point, w.dtype) == (0.5, 128, np.uint8)
    b = ours("Int8GivenIntTensorFill", [], {"values": [1, -2, 3], "shape": [3], "Y_scale": 0.25})
    assert b.data.dtype == np.int32 and b.data.tolist() == [1, -2, 3] and b.zero_point == 0
    with pytest.raises(ShapeError, match="#0 Int8GivenTensorFill.*holds 4 values"):
        ours("Int8GivenTensorFill", [], {"values": raw, "shape": [2, 2]})
    with pytest.raises(ArgumentError, match="one string"):
        ours("Int8GivenTensorFill", [], {"values": [1, 2], "shape": [2]})


# ---------------------------------------------------------------- requantization arithmetic

def test_requantize_against_an_exact_reference():
    """QNNPACK's scheme, written independently with Python integers: the rounded product
    (half up), then the shift rounded half away from zero, then the zero point and clamp."""
    rng = np.random.default_rng(9)
    acc = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 3000), rng.integers(-5000, 5000, 3000),
                          [0, 1, -1, 2 ** 31 - 1, -2 ** 31]]).astype(np.int64)
    for scale in (f32(0.9999), f32(0.5), f32(0.001234), f32(3e-7), f32(2.0 ** -20)):
        bits = int(np.float32(scale).view(np.uint32))
        mult = ((bits & 0x7FFFFF) | 0x800000) << 7
        shift = 126 - (bits >> 23)
        for zp in (0, 128, 255):
            got = requantize(np, acc, scale, zp)
            want = []
            for a in acc.tolist():
                p = a * mult
                q31 = (p + (1 << 30)) >> 31                        # floor: half up
                q31 = (q31 + 2 ** 31) % 2 ** 32 - 2 ** 31
                mag = abs(q31)
                r = (mag + (1 << (shift - 1))) >> shift if shift else mag   # half away from zero
                if shift and (mag & ((1 << shift) - 1)) == (1 << (shift - 1)):
                    r = (mag >> shift) + 1
                r = r if q31 >= 0 else -r
                want.append(min(max(max(min(r, 32767), -32768) + zp, 0), 255))
            np.testing.assert_array_equal(got, np.asarray(want, np.uint8))


def test_requantization_scale_checks():
    assert requantization_scale("#0 Int8Conv", 0.5, 0.5, 0.5) == np.float32(0.5)
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*must be < 1"):
        requantization_scale("#0 Int8Conv", 0.5, 0.5, 0.25)
    with pytest.raises(ArgumentError, match="scale"):
        requantization_scale("#0 Int8Conv", 0.0, 0.5, 0.25)


# ---------------------------------------------------------------- types, costs, devices, errors

def test_types_costs_and_devices():
    _, args, (x, w, b) = CONV_CASES[1]
    types = [TensorType(t.shape, str(t.dtype)) for t in (x, w, b)]
    a = Args(args, op="#0 Int8Conv")
    (y,) = registry.get("Int8Conv").infer(types, a)
    assert y == TensorType((2, 9, 8, 8), "uint8")
    cost = registry.get("Int8Conv").cost(types, [y], a)
    assert cost.macs == 2 * 9 * 8 * 8 * 16 * 3 * 3                   # N*Ho*Wo*M * C*kH*kW
    assert cost.bytes_read == x.data.size + w.data.size + 4 * b.data.size
    assert cost.bytes_written == y.size                              # one byte per element
    ft = [TensorType((3, 2, 5), "uint8"), TensorType((7, 10), "uint8"), TensorType((7,), "int32")]
    (fy,) = registry.get("Int8FC").infer(ft, Args({}, op="#1 Int8FC"))
    assert fy == TensorType((3, 7), "uint8")
    assert registry.get("Int8FC").cost(ft, [fy], Args({})).macs == 3 * 10 * 7
    for t in ("Int8Quantize", "Int8Dequantize", "Int8GivenTensorFill", "Int8GivenIntTensorFill",
              "Int8Conv", "Int8ConvRelu", "Int8ConvTranspose", "Int8FC"):
        assert registry.get(t).devices == {"cpu"} and registry.get(t).caffe2_kinds() == {"cpu"}


def test_errors_name_the_op_and_blob():
    _, args, ins = CONV_CASES[1]
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*NHWC"):
        ours("Int8Conv", ins, {**args, "order": "NCHW"})
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*input 1 \\(W\\).*Int8 tensor"):
        ours("Int8Conv", [ins[0], ins[1].data, ins[2]], args)
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*kernel size"):
        ours("Int8Conv", ins, {k: v for k, v in args.items() if k != "kernel"})
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*< 1"):
        ours("Int8Conv", ins, {**args, "Y_scale": 1e-6})
    with pytest.raises(ArgumentError, match="#0 Int8Conv.*input X zero point 300"):
        ours("Int8Conv", [Int8Tensor(ins[0].data, ins[0].scale, 300), *ins[1:]], args)
    types = [TensorType(t.shape, str(t.dtype)) for t in ins]
    with pytest.raises(ShapeError, match="#0 Int8Conv.*input 2 \\(B\\).*int32"):
        registry.get("Int8Conv").infer(types[:2] + [TensorType(types[2].shape, "uint8")],
                                       Args(args, op="#0 Int8Conv"))
    with pytest.raises(ShapeError, match="#1 Int8FC.*K=10"):
        registry.get("Int8FC").infer([TensorType((3, 9), "uint8"), TensorType((7, 10), "uint8"),
                                      TensorType((7,), "int32")], Args({}, op="#1 Int8FC"))
    with pytest.raises(ShapeError, match="#0 Int8Dequantize.*input 0 \\(X\\).*uint8, found int32"):
        ours("Int8Dequantize", [ins[2]], {})          # Caffe2 reads the data as uint8 only
    with pytest.raises(ShapeError, match="#0 Int8Quantize.*float32"):
        registry.get("Int8Quantize").infer([TensorType((3,), "uint8")], Args({}, op="#0 Int8Quantize"))


# ---------------------------------------------------------------- a whole quantized net

def _byte_arg(op, name, data: np.ndarray):
    op.arg.add(name=name, s=data.tobytes())


def quantized_nets(seed=3):
    """init: the Int8 weights; predict: NCHW2NHWC -> Int8Quantize -> Int8ConvRelu ->
    Int8Conv (depthwise) -> Int8FC -> Int8Dequantize, and the conv's map back to NCHW."""
    rng = np.random.default_rng(seed)
    init, net = pb.NetDef(name="init"), pb.NetDef(name="int8_net")
    xs, w1s, w2s, w3s = f32(0.05), f32(0.01), f32(0.02), f32(0.004)
    c1s, c2s, fs = f32(0.08), f32(0.06), f32(0.2)

    def weight(name, shape, scale, zp):
        op = init.op.add(type="Int8GivenTensorFill", output=[name])
        _byte_arg(op, "values", rng.integers(0, 256, shape, dtype=np.uint8))
        op.arg.add(name="shape", ints=list(shape))
        op.arg.add(name="Y_scale", f=scale)
        op.arg.add(name="Y_zero_point", i=zp)

    def bias(name, n, scale):
        op = init.op.add(type="Int8GivenIntTensorFill", output=[name])
        op.arg.add(name="values", ints=rng.integers(-3000, 3000, n).tolist())
        op.arg.add(name="shape", ints=[n])
        op.arg.add(name="Y_scale", f=scale)
        op.arg.add(name="Y_zero_point", i=0)

    weight("w1", (8, 3, 3, 3), w1s, 120)
    bias("b1", 8, f32(xs * w1s))
    weight("w2", (8, 3, 3, 1), w2s, 128)
    bias("b2", 8, f32(c1s * w2s))
    weight("w3", (5, 4 * 4 * 8), w3s, 131)
    bias("b3", 5, f32(c2s * w3s))

    def op(type_, ins, outs, **args):
        o = net.op.add(type=type_, input=ins, output=outs)
        for k, v in args.items():
            if isinstance(v, str):
                o.arg.add(name=k, s=v.encode())
            elif isinstance(v, float):
                o.arg.add(name=k, f=v)
            elif isinstance(v, list):
                o.arg.add(name=k, ints=v)
            else:
                o.arg.add(name=k, i=v)

    op("NCHW2NHWC", ["data"], ["data_nhwc"])
    op("Int8Quantize", ["data_nhwc"], ["xq"], Y_scale=xs, Y_zero_point=128)
    op("Int8ConvRelu", ["xq", "w1", "b1"], ["c1"], order="NHWC", kernel=3, pad=1, stride=2,
       Y_scale=c1s, Y_zero_point=3)
    op("Int8Conv", ["c1", "w2", "b2"], ["c2"], order="NHWC", kernel=3, pad=1, group=8,
       Y_scale=c2s, Y_zero_point=128)
    op("Int8FC", ["c2", "w3", "b3"], ["fq"], Y_scale=fs, Y_zero_point=100)
    op("Int8Dequantize", ["fq"], ["out"])
    op("Int8Dequantize", ["c2"], ["c2f"])
    op("NHWC2NCHW", ["c2f"], ["c2_nchw"])
    net.external_input.extend(["data", "w1", "b1", "w2", "b2", "w3", "b3"])
    net.external_output.extend(["out", "c2_nchw", "fq"])
    return init, net


NET_ORACLE = """
init, net = caffe2_pb2.NetDef(), caffe2_pb2.NetDef()
text_format.Parse(init_text, init)
text_format.Parse(net_text_, net)
workspace.RunNetOnce(init)
workspace.FeedBlob("data", inputs["data"])
workspace.RunNetOnce(net)
fq, fq_scale, fq_zp = workspace.FetchInt8Blob("fq")
save(out=workspace.FetchBlob("out"), c2_nchw=workspace.FetchBlob("c2_nchw"), fq=fq)
save_json([float(fq_scale), int(fq_zp)])
"""


@pytest.mark.caffe2
def test_quantized_net_runs_as_in_caffe2():
    init, net = quantized_nets()
    data = (np.random.default_rng(4).standard_normal((2, 3, 8, 8)) * 2).astype(np.float32)
    script = (f"init_text = {text_format.MessageToString(init)!r}\n"
              f"net_text_ = {text_format.MessageToString(net)!r}\n" + NET_ORACLE)
    want, (fq_scale, fq_zp) = run_caffe2(script, {"data": data})
    placer_net = net_from_netdef(net, init)
    ex = Executor(placer_net)
    got = ex.run({"data": data}, warmup=1)
    record = ex.record
    assert record.peak_bytes["cpu"] > 0 and len(record.ops) == len(net.op)
    for name in ("out", "c2_nchw"):
        assert got[name].dtype == np.float32 and got[name].shape == want[name].shape
        np.testing.assert_array_equal(got[name], want[name])   # integers, then one float32 multiply
    assert got["c2_nchw"].shape == (2, 8, 4, 4)
    assert len(np.unique(want["out"])) > 3                    # the net does not saturate to one value
    # an Int8 external output comes back as the Int8Tensor Caffe2's FetchInt8Blob gives
    fq = got["fq"]
    assert isinstance(fq, Int8Tensor) and (fq.scale, fq.zero_point) == (f32(fq_scale), fq_zp)
    np.testing.assert_array_equal(fq.data, want["fq"])
    # the planner's view: uint8 / int32 blobs of the data's shapes, MACs like the float ops
    typed = shapes.infer(placer_net, {"data": TensorType((2, 3, 8, 8))})
    assert typed.blobs["xq"] == TensorType((2, 8, 8, 3), "uint8")
    assert typed.blobs["c1"] == TensorType((2, 4, 4, 8), "uint8")
    assert typed.blobs["b1"] == TensorType((8,), "int32")
    assert typed.blobs["fq"] == TensorType((2, 5), "uint8")
    conv1 = typed.features[2]
    assert conv1.macs == 2 * 4 * 4 * 8 * 3 * 3 * 3
    assert conv1.bytes_read == 2 * 8 * 8 * 3 + 8 * 3 * 3 * 3 + 4 * 8


# ---------------------------------------------------------------- declared temporaries

SCRATCH_CASES = [conv_case(50, 4, 32, 32, 64, 64, 3, pads=(1, 1, 1, 1)),
                 conv_case(51, 4, 32, 32, 64, 64, 1),
                 conv_case(52, 4, 32, 32, 64, 64, 3, pads=(1, 1, 1, 1), group=64),
                 conv_case(53, 4, 32, 32, 3, 64, 3, stride=2),
                 conv_case(55, 4, 32, 32, 64, 16, 7, pads=(3, 3, 3, 3), stride=2),
                 conv_case(54, 4, 16, 16, 64, 32, 3, stride=2, transpose=True),
                 conv_case(57, 2, 16, 16, 16, 32, 5, transpose=True),
                 fc_case(56, (256, 1024), 512),
                 ("Int8Quantize", {"Y_scale": 0.1, "Y_zero_point": 3},
                  [np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)])]


@pytest.mark.parametrize("op_type,args,inputs", SCRATCH_CASES, ids=[f"s{i}" for i in range(len(SCRATCH_CASES))])
def test_kernels_stay_within_their_declared_scratch(op_type, args, inputs):
    """tracemalloc's peak during the kernel, less its output, is at most what the entry
    declares (plus 64 KiB of small objects), as tests/test_resource_limits.py holds the
    float kernels to."""
    opdef, a = registry.get(op_type), Args(args, op=op_type)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        (y,) = opdef.kernel(np, inputs, a)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    types = [TensorType(t.shape, str(t.dtype)) for t in inputs]
    declared = opdef.scratch_bytes(types, [TensorType(y.shape, str(y.dtype))], a)
    assert peak - y.nbytes <= declared + 64 * 1024
