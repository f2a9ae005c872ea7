"""Caffe2's quantized Int8 ops of placer/ops/int8_tensor.py against real Caffe2 (torch 1.8.1,
QNNPACK), bit for bit, plus their shapes, costs and errors.

Every case builds its Int8 inputs inside Caffe2 with Int8GivenTensorFill (uint8 bytes, scale,
zero point), runs the op, and reads the outputs back with FetchInt8Blob; all cases run in one
oracle script. Outputs are integers: compared exactly, scale and zero point included.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from caffe2_oracle import run_caffe2

from placer.errors import ArgumentError, InputError, ShapeError
from placer.ops import registry
from placer.ops.int8_base import Int8Tensor
from placer.types import Args, TensorType

ORACLE = '''
results = []
for i, case in enumerate(json.loads(inputs["cases"].tobytes().decode())):
    names = []
    for j, spec in enumerate(case["inputs"]):
        name = "c%d_%d" % (i, j)
        arr = inputs[name]
        if spec["kind"] == "q":
            workspace.RunOperatorOnce(core.CreateOperator(
                "Int8GivenTensorFill", [], [name], values=arr.astype(np.uint8).tobytes(),
                shape=list(arr.shape), Y_scale=spec["scale"], Y_zero_point=spec["zero_point"]))
        else:
            workspace.FeedBlob(name, arr)
        names.append(name)
    outs = ["c%d_y%d" % (i, k) for k in range(case["n_out"])]
    workspace.RunOperatorOnce(core.CreateOperator(case["op"], names, outs, **case["args"]))
    meta = []
    for k, o in enumerate(outs):
        if k == 0:
            b = workspace.FetchInt8Blob(o)
            save(**{o: b.data})
            meta.append([float(b.scale), int(b.zero_point)])
        else:
            save(**{o: workspace.FetchBlob(o)})
    results.append(meta)
save_json(results)
'''


def q(data, scale, zero_point):
    """An Int8 input: uint8 data with its (float32) scale and zero point."""
    return Int8Tensor(np.asarray(data, dtype=np.uint8), float(np.float32(scale)), int(zero_point))


def run_oracle(cases):
    """cases: [(op, inputs (Int8Tensor or float array), args, n_outputs)] -> per case the
    outputs: the first as Int8Tensor, the others as arrays."""
    arrays, specs = {}, []
    for i, (op, ins, args, n_out) in enumerate(cases):
        spec = []
        for j, x in enumerate(ins):
            if isinstance(x, Int8Tensor):
                arrays[f"c{i}_{j}"] = x.data
                spec.append({"kind": "q", "scale": x.scale, "zero_point": x.zero_point})
            else:
                arrays[f"c{i}_{j}"] = np.asarray(x)
                spec.append({"kind": "f"})
        specs.append({"op": op, "inputs": spec, "args": args, "n_out": n_out})
    arrays["cases"] = np.frombuffer(json.dumps(specs).encode(), dtype=np.uint8)
    saved, meta = run_caffe2(ORACLE, arrays)
    out = []
    for i, (op, ins, args, n_out) in enumerate(cases):
        (scale, zp), = meta[i][:1]
        outs = [Int8Tensor(saved[f"c{i}_y0"], scale, zp)]
        outs += [saved[f"c{i}_y{k}"] for k in range(1, n_out)]
        out.append(outs)
    return out


def ours(op, ins, args, n_out=1):
    a = Args(args, op=f"#0 {op}", n_outputs=n_out)
    opdef = registry.get(op)
    outs = opdef.kernel(np, list(ins), a)
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in ins], a)
    assert len(outs) == n_out
    for x, t in zip(outs, types):
        if t is not None:
            assert tuple(x.shape) == t.shape and str(x.dtype) == t.dtype
    return list(outs)


def assert_same(got, want, label):
    g, w = got[0], want[0]
    assert g.data.dtype == np.uint8, label
    assert g.data.shape == w.data.shape, label
    bad = np.flatnonzero(g.data.reshape(-1) != w.data.reshape(-1))
    assert bad.size == 0, f"{label}: {bad.size} of {g.data.size} differ, first at {bad[:5]}: " \
                          f"ours {g.data.reshape(-1)[bad[:5]]} Caffe2 {w.data.reshape(-1)[bad[:5]]}"
    assert np.float32(g.scale) == np.float32(w.scale) and g.zero_point == w.zero_point, label
    for x, y in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(np.asarray(x), y, err_msg=label)


def _u8(rng, shape, lo=0, hi=256):
    return rng.integers(lo, hi, shape).astype(np.uint8)


def _cases():
    """Many random cases per op: shapes, zero points, scale ratios that saturate, and
    rounding ties (scale ratios that are powers of two make half-way sums)."""
    rng = np.random.default_rng(1234)
    cases = []
    # Add / Sum (+Relu): ratios from 2^-13 to ~200, powers of two (ties), saturation
    ratios = [(1.0, 1.0, 1.0), (0.5, 0.25, 1.0), (0.02, 0.03, 0.05), (0.1, 0.1, 0.0125),
              (0.3, 0.01, 0.3), (1.0, 2.0, 4.0), (0.05, 0.07, 0.1), (0.001, 0.2, 0.002),
              (3.0, 2.5, 0.02), (1e-3, 2e-4, 1.0), (0.125, 0.125, 0.25), (0.75, 0.5, 0.5)]
    for k, (sa, sb, sy) in enumerate(ratios):
        shape = [(2, 3, 4, 5), (7,), (3, 17), (1, 2, 2, 33)][k % 4]
        za, zb, zy = (int(v) for v in rng.integers(0, 256, 3))
        if k % 3 == 0:
            za, zb, zy = 128, 0, 255 - k
        a, b = q(_u8(rng, shape), sa, za), q(_u8(rng, shape), sb, zb)
        op = ["Int8Add", "Int8Sum", "Int8AddRelu", "Int8SumRelu"][k % 4]
        cases.append((op, [a, b], {"Y_scale": sy, "Y_zero_point": zy}, 1))
    # Relu
    for k, zp in enumerate([0, 1, 77, 128, 255]):
        x = q(_u8(rng, (2, 5, 3, 4)), 0.01 * (k + 1), zp)
        cases.append(("Int8Relu", [x], {"Y_scale": x.scale, "Y_zero_point": zp}, 1))
    # MaxPool (+Relu)
    pools = [{"kernel": 2, "stride": 2}, {"kernel": 3, "stride": 1, "pad": 1},
             {"kernel_h": 3, "kernel_w": 2, "stride_h": 2, "stride_w": 1, "pads": [1, 0, 2, 1]},
             {"kernel": 3, "stride": 2, "pad": 1}, {"global_pooling": 1},
             {"kernel": 3, "stride": 2, "legacy_pad": 3}, {"kernel": 2, "stride": 1, "legacy_pad": 2}]
    for k, p in enumerate(pools):
        c = [3, 8, 16, 5, 9, 1, 20][k]
        x = q(_u8(rng, (2, 7, 9, c)), 0.05, int(rng.integers(0, 256)))
        op = "Int8MaxPoolRelu" if k % 3 == 2 else "Int8MaxPool"
        cases.append((op, [x], {**p, "order": "NHWC", "Y_scale": x.scale, "Y_zero_point": x.zero_point}, 1))
    # AveragePool (+Relu): kernels <= 9 and > 9, channels < 8 and >= 8, padding, global;
    # output scales from ratio 2^-7 to ~200; powers of two for ties
    avg = [({"kernel": 2, "stride": 2}, 0.05, 0.05), ({"kernel": 3, "pad": 1}, 0.1, 0.05),
           ({"kernel": 4, "stride": 1, "pad": 2}, 0.02, 0.3), ({"kernel": 5, "stride": 2, "pad": 1}, 1.0, 0.125),
           ({"global_pooling": 1}, 0.5, 0.5), ({"global_pooling": 1}, 0.01, 1.0),
           ({"kernel_h": 3, "kernel_w": 4, "stride": 1}, 2.0, 0.011), ({"kernel": 2, "stride": 1}, 0.25, 1.0),
           ({"kernel": 3, "stride": 3, "legacy_pad": 3}, 0.1, 0.1), ({"global_pooling": 1}, 0.3, 0.002)]
    for k, (p, sx, sy) in enumerate(avg):
        c = [3, 8, 16, 7, 9, 24, 1, 12, 5, 40][k]
        hw = (7, 9) if k != 9 else (13, 11)
        x = q(_u8(rng, (2, *hw, c)), sx, int(rng.integers(0, 256)))
        op = "Int8AveragePoolRelu" if k % 4 == 3 else "Int8AveragePool"
        cases.append((op, [x], {**p, "order": "NHWC", "Y_scale": sy, "Y_zero_point": int(rng.integers(0, 256))}, 1))
    # Softmax: rows x channels, small and large input scales
    for k, (shape, sx) in enumerate([((4, 10), 0.1), ((3, 2, 2, 5), 0.05), ((2, 300), 0.02),
                                     ((5, 1), 1.0), ((2, 17), 0.5), ((3, 64), 0.004)]):
        x = q(_u8(rng, shape), sx, int(rng.integers(0, 256)))
        cases.append(("Int8Softmax", [x], {"Y_scale": 1 / 256, "Y_zero_point": 0}, 1))
    # Sigmoid, LeakyRelu: every uint8 value once
    full = np.arange(256, dtype=np.uint8).reshape(4, 64)
    for k, (sx, zp) in enumerate([(0.05, 128), (0.1, 0), (0.01, 200), (0.25, 77)]):
        cases.append(("Int8Sigmoid", [q(full, sx, zp)], {"Y_scale": 1 / 256, "Y_zero_point": 0}, 1))
    for k, (sx, zp, sy, zy, alpha) in enumerate([(0.05, 128, 0.05, 128, 0.1), (0.1, 10, 0.03, 200, 0.01),
                                                 (0.02, 250, 0.5, 3, 0.5), (0.2, 100, 0.2, 0, 0.3)]):
        cases.append(("Int8LeakyRelu", [q(full, sx, zp)], {"alpha": alpha, "Y_scale": sy, "Y_zero_point": zy}, 1))
    # data movement
    x = q(_u8(rng, (2, 3, 4, 5)), 0.05, 100)
    x2 = q(_u8(rng, (2, 3, 4, 2)), 0.07, 90)    # other quantization: copied as it is
    x3 = q(_u8(rng, (1, 3, 4, 5)), 0.05, 100)
    same = {"Y_scale": x.scale, "Y_zero_point": 100}
    cases += [
        ("Int8Concat", [x, x2], {**same, "axis": 3}, 1),
        ("Int8Concat", [x, x3], same, 1),
        ("Int8Concat", [x, x, x], {**same, "order": "NCHW"}, 1),
        ("Int8Concat", [x, x2], {**same, "order": "NHWC"}, 1),
        ("Int8Reshape", [x], {**same, "shape": [6, -1]}, 2),
        ("Int8Reshape", [x], {**same, "shape": [0, 0, 20]}, 2),
        ("Int8Reshape", [x, np.array([4, 30], np.int64)], same, 2),
        ("Int8Flatten", [x], same, 1),
        ("Int8Flatten", [x], {**same, "axis": 3}, 1),
        ("Int8Transpose", [x], same, 1),
        ("Int8Transpose", [x], {**same, "axes": [0, 3, 1, 2]}, 1),
        ("Int8ResizeNearest", [x], {**same, "width_scale": 2.0, "height_scale": 2.0}, 1),
        ("Int8ResizeNearest", [x], {**same, "width_scale": 1.5, "height_scale": 0.7}, 1),
        ("Int8ResizeNearest", [x], {**same, "width_scale": 3.3, "height_scale": 1.0}, 1),
        ("Int8Slice", [x], {**same, "starts": [0, 1, 0, 0], "ends": [-1, 3, -1, -1]}, 1),
        ("Int8Slice", [x], {**same, "starts": [0, 0, 0, 1], "ends": [-1, -1, -1, -2]}, 1),
        ("Int8Slice", [x], {**same, "starts": [1, 0, 0, 0], "ends": [2, -1, -1, -1]}, 1),
        ("Int8ChannelShuffle", [q(_u8(rng, (2, 3, 4, 12)), 0.05, 100)],
         {**same, "group": 3, "kernel": 1, "order": "NHWC"}, 1),
        ("Int8ChannelShuffle", [q(_u8(rng, (1, 2, 2, 8)), 0.05, 100)],
         {**same, "group": 2, "kernel": 1, "order": "NHWC"}, 1),
    ]
    # RoIAlign: NHWC, rois partly outside, narrow, reversed; adaptive and fixed grids
    for k, (ph, pw, sr, ss, sy, zy) in enumerate([(2, 2, 2, 0.5, 0.05, 100), (3, 2, 0, 0.25, 0.1, 10),
                                                  (2, 3, -1, 1.0, 0.02, 200), (4, 4, 1, 0.125, 0.03, 0)]):
        n, h, w, c = 2, 9, 11, 6
        x = q(_u8(rng, (n, h, w, c)), 0.05, int(rng.integers(0, 256)))
        size = np.array([w, h, w, h], np.float32) / ss
        a = rng.uniform(-0.3, 1.0, (7, 2)) * size[:2]
        b = a + rng.uniform(0.05, 0.9, (7, 2)) * size[:2]
        boxes = np.concatenate([a, b], axis=1).astype(np.float32)
        boxes[0] = [boxes[0, 2], boxes[0, 1], boxes[0, 0], boxes[0, 3]]
        boxes[1, 2:] = boxes[1, :2] + 0.3
        image = rng.integers(0, n, (7, 1)).astype(np.float32)
        rois = np.concatenate([image, boxes], axis=1).astype(np.float32)
        if k == 3:
            x, rois = q(x.data[:1], x.scale, x.zero_point), boxes
        cases.append(("Int8RoIAlign", [x, rois], {"pooled_h": ph, "pooled_w": pw, "sampling_ratio": sr,
                                                  "spatial_scale": ss, "order": "NHWC",
                                                  "Y_scale": sy, "Y_zero_point": zy}, 1))
    return cases + _random_cases(rng)


def _random_cases(rng):
    """Random scales (log-uniform within QNNPACK's accepted ranges, a third of them powers
    of two so that half-way sums occur), zero points and shapes."""
    def scale(lo, hi):
        s = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        return 2.0 ** round(np.log2(s)) if rng.random() < 0.33 else s

    cases = []
    for k in range(30):
        sy = scale(1e-3, 1.0)
        sa = sy * scale(2 ** -9, 2 ** 7.9)
        sb = sy * scale(2 ** -9, 2 ** 7.9)
        shape = tuple(int(d) for d in rng.integers(1, 9, int(rng.integers(1, 5))))
        ins = [q(_u8(rng, shape), sa, int(rng.integers(0, 256))), q(_u8(rng, shape), sb, int(rng.integers(0, 256)))]
        op = ["Int8Add", "Int8Sum", "Int8AddRelu", "Int8SumRelu"][k % 4]
        cases.append((op, ins, {"Y_scale": sy, "Y_zero_point": int(rng.integers(0, 255))}, 1))
    for k in range(20):
        sx = scale(1e-3, 1.0)
        sy = sx * scale(2 ** -7.9, 2 ** 7.9)
        kh, kw = (int(v) for v in rng.integers(1, 6, 2))
        h, w = int(rng.integers(kh, 12)), int(rng.integers(kw, 12))
        pad = int(rng.integers(0, min(kh, kw)))
        p = ({"global_pooling": 1} if k % 5 == 4 else
             {"kernel_h": kh, "kernel_w": kw, "stride": int(rng.integers(1, 3)), "pad": pad})
        x = q(_u8(rng, (int(rng.integers(1, 3)), h, w, int(rng.integers(1, 20)))), sx, int(rng.integers(0, 256)))
        op = "Int8AveragePoolRelu" if k % 3 == 1 else "Int8AveragePool"
        cases.append((op, [x], {**p, "order": "NHWC", "Y_scale": sy, "Y_zero_point": int(rng.integers(0, 255))}, 1))
    for k in range(10):
        shape = (int(rng.integers(1, 5)), int(rng.integers(1, 200)))
        x = q(_u8(rng, shape, int(rng.integers(0, 128)), 256), scale(1e-3, 2.0), int(rng.integers(0, 256)))
        cases.append(("Int8Softmax", [x], {"Y_scale": 1 / 256, "Y_zero_point": 0}, 1))
    full = np.arange(256, dtype=np.uint8).reshape(1, 256)
    for k in range(10):
        cases.append(("Int8Sigmoid", [q(full, scale(1e-3, 1.0), int(rng.integers(0, 256)))],
                      {"Y_scale": 1 / 256, "Y_zero_point": 0}, 1))
        sx = scale(1e-3, 1.0)
        cases.append(("Int8LeakyRelu", [q(full, sx, int(rng.integers(0, 256)))],
                      {"alpha": float(rng.uniform(0.01, 0.99)), "Y_scale": sx * scale(2 ** -7.9, 2 ** 7.9),
                       "Y_zero_point": int(rng.integers(0, 256))}, 1))
    cases.append(("Int8RoIAlign", [q(_u8(rng, (1, 4, 5, 3)), 0.05, 9), np.zeros((0, 5), np.float32)],
                  {"pooled_h": 2, "pooled_w": 3, "order": "NHWC", "Y_scale": 0.1, "Y_zero_point": 10}, 1))
    for k in range(8):
        n, h, w, c = int(rng.integers(1, 3)), int(rng.integers(3, 12)), int(rng.integers(3, 12)), int(rng.integers(1, 9))
        ss = float(rng.choice([1.0, 0.5, 0.25, 1 / 16]))
        size = np.array([w, h, w, h], np.float32) / ss
        a = rng.uniform(-0.3, 1.0, (5, 2)) * size[:2]
        b = a + rng.uniform(0.0, 1.0, (5, 2)) * size[:2]
        rois = np.concatenate([rng.integers(0, n, (5, 1)), a, b], axis=1).astype(np.float32)
        sx = scale(1e-3, 1.0)
        x = q(_u8(rng, (n, h, w, c)), sx, int(rng.integers(0, 256)))
        cases.append(("Int8RoIAlign", [x, rois], {
            "pooled_h": int(rng.integers(1, 5)), "pooled_w": int(rng.integers(1, 5)),
            "sampling_ratio": int(rng.integers(0, 4)), "spatial_scale": ss, "order": "NHWC",
            "Y_scale": sx * scale(0.1, 4.0), "Y_zero_point": int(rng.integers(0, 256))}, 1))
        x = q(_u8(rng, (n, h, w, c)), sx, 7)
        cases.append(("Int8ResizeNearest", [x], {"width_scale": float(rng.uniform(0.3, 3.5)),
                                                 "height_scale": float(rng.uniform(0.3, 3.5)),
                                                 "Y_scale": x.scale, "Y_zero_point": 7}, 1))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def oracle():
    return run_oracle(CASES)


@pytest.mark.caffe2
@pytest.mark.parametrize("op", sorted({c[0] for c in CASES}))
def test_int8_ops_match_caffe2_bit_for_bit(oracle, op):
    n = 0
    for i, (t, ins, args, n_out) in enumerate(CASES):
        if t != op:
            continue
        assert_same(ours(t, ins, args, n_out), oracle[i], f"case {i} {t} {args}")
        n += 1
    assert n > 0


CHAIN = '''
x = inputs["x"]
net = core.Net("int8_chain")
net.Int8Quantize(["xf"], ["q0"], Y_scale=0.04, Y_zero_point=120)
net.Int8Quantize(["xf2"], ["q1"], Y_scale=0.06, Y_zero_point=60)
net.Int8Add(["q0", "q1"], ["s"], Y_scale=0.08, Y_zero_point=100)
net.Int8Relu(["s"], ["r"], Y_scale=0.08, Y_zero_point=100)
net.Int8MaxPool(["r"], ["m"], kernel=3, stride=1, pad=1, order="NHWC", Y_scale=0.08, Y_zero_point=100)
net.Int8AveragePool(["m"], ["a"], kernel=2, stride=2, order="NHWC", Y_scale=0.05, Y_zero_point=30)
net.Int8SumRelu(["a", "a"], ["b"], Y_scale=0.07, Y_zero_point=20)
net.Int8Concat(["b", "b"], ["c"], axis=3, Y_scale=0.07, Y_zero_point=20)
net.Int8Transpose(["c"], ["t"], axes=[0, 2, 1, 3], Y_scale=0.07, Y_zero_point=20)
net.Int8Flatten(["t"], ["f"], Y_scale=0.07, Y_zero_point=20)
net.Int8Softmax(["f"], ["y"], Y_scale=1 / 256, Y_zero_point=0)
workspace.FeedBlob("xf", inputs["xf"])
workspace.FeedBlob("xf2", inputs["xf2"])
workspace.RunNetOnce(net)
out = {}
for name in ["q0", "q1", "s", "r", "m", "a", "b", "c", "t", "f", "y"]:
    b = workspace.FetchInt8Blob(name)
    save(**{name: b.data})
    out[name] = [float(b.scale), int(b.zero_point)]
save_json(out)
'''


@pytest.mark.caffe2
def test_int8_chain_matches_caffe2():
    """A small Int8 net run by Caffe2 and by our kernels in sequence, from the same quantized
    inputs (Caffe2's own Int8Quantize outputs, fetched)."""
    rng = np.random.default_rng(7)
    xf = rng.normal(0, 2, (2, 6, 8, 5)).astype(np.float32)
    xf2 = rng.normal(0.5, 3, (2, 6, 8, 5)).astype(np.float32)
    saved, meta = run_caffe2(CHAIN, {"x": xf, "xf": xf, "xf2": xf2})
    q0 = Int8Tensor(saved["q0"], *meta["q0"])
    q1 = Int8Tensor(saved["q1"], *meta["q1"])
    steps = [("s", "Int8Add", ["q0", "q1"], {"Y_scale": 0.08, "Y_zero_point": 100}),
             ("r", "Int8Relu", ["s"], {"Y_scale": 0.08, "Y_zero_point": 100}),
             ("m", "Int8MaxPool", ["r"], {"kernel": 3, "stride": 1, "pad": 1, "order": "NHWC",
                                          "Y_scale": 0.08, "Y_zero_point": 100}),
             ("a", "Int8AveragePool", ["m"], {"kernel": 2, "stride": 2, "order": "NHWC",
                                              "Y_scale": 0.05, "Y_zero_point": 30}),
             ("b", "Int8SumRelu", ["a", "a"], {"Y_scale": 0.07, "Y_zero_point": 20}),
             ("c", "Int8Concat", ["b", "b"], {"axis": 3, "Y_scale": 0.07, "Y_zero_point": 20}),
             ("t", "Int8Transpose", ["c"], {"axes": [0, 2, 1, 3], "Y_scale": 0.07, "Y_zero_point": 20}),
             ("f", "Int8Flatten", ["t"], {"Y_scale": 0.07, "Y_zero_point": 20}),
             ("y", "Int8Softmax", ["f"], {"Y_scale": 1 / 256, "Y_zero_point": 0})]
    blobs = {"q0": q0, "q1": q1}
    for name, op, ins, args in steps:
        (blobs[name],) = ours(op, [blobs[i] for i in ins], args)
        want = Int8Tensor(saved[name], *meta[name])
        assert_same([blobs[name]], [want], f"{name} = {op}")
    assert len(np.unique(blobs["y"].data)) > 3       # the chain carries information to the end


# -- shapes, costs, errors (no oracle) ----------------------------------------------------------

def _infer(op, types, args, n_out=1):
    return registry.get(op).infer(types, Args(args, op=f"#0 {op}", n_outputs=n_out))


def test_int8_shapes_dtype_and_costs():
    t = TensorType((2, 7, 9, 16), "uint8")
    (y,) = _infer("Int8MaxPool", [t], {"kernel": 3, "stride": 2, "order": "NHWC"})
    assert y.shape == (2, 3, 4, 16) and y.dtype == "uint8"
    (y,) = _infer("Int8AveragePool", [t], {"global_pooling": 1, "order": "NHWC"})
    assert y.shape == (2, 1, 1, 16)
    c = registry.get("Int8AveragePool").cost([t], [y], Args({"global_pooling": 1, "order": "NHWC"}))
    assert c.flops == 2 * 16 * 63 and c.bytes_read == t.size and c.bytes_written == 32
    c = registry.get("Int8Add").cost([t, t], [t], Args({}))
    assert c.flops == t.size and c.bytes_read == 2 * t.size and c.bytes_written == t.size
    y, old = _infer("Int8Reshape", [t], {"shape": [0, -1]}, 2)
    assert y.shape == (2, 7 * 9 * 16) and old.values == (2, 7, 9, 16)
    (y,) = _infer("Int8ResizeNearest", [t], {"width_scale": 1.5, "height_scale": 0.7})
    assert y.shape == (2, 4, 13, 16)
    rois = TensorType((300, 5), "float32", bound="GenerateProposals post_nms_topN=300")
    (y,) = _infer("Int8RoIAlign", [t, rois], {"pooled_h": 7, "pooled_w": 7})
    assert y.shape == (300, 7, 7, 16) and y.bound == rois.bound
    for op in ("Int8Add", "Int8Relu", "Int8Softmax", "Int8RoIAlign", "Int8Concat"):
        assert registry.get(op).devices == frozenset({"cpu"})


def test_int8_errors_name_the_op():
    x = q(np.zeros((1, 4, 4, 3)), 0.05, 100)
    with pytest.raises(ArgumentError, match="#0 Int8Relu.*Y_zero_point"):
        ours("Int8Relu", [x], {})
    with pytest.raises(ArgumentError, match="#0 Int8MaxPool.*NHWC"):
        ours("Int8MaxPool", [x], {"kernel": 2, "Y_scale": 0.05, "Y_zero_point": 100})
    with pytest.raises(ArgumentError, match="#0 Int8Softmax.*1/256"):
        ours("Int8Softmax", [x], {"Y_scale": 0.1})
    with pytest.raises(ArgumentError, match="#0 Int8Add.*2\\*\\*-14"):      # Caffe2's QNNPACK refuses it
        ours("Int8Add", [x, x], {"Y_scale": 0.0001, "Y_zero_point": 10})
    with pytest.raises(ArgumentError, match="#0 Int8Add.*2\\*\\*-10"):     # QNNPACK's asserted range
        ours("Int8Add", [x, x], {"Y_scale": 0.05 / 2 ** -11, "Y_zero_point": 10})
    with pytest.raises(ArgumentError, match="#0 Int8Add.*2\\*\\*-10"):    # QNNPACK's asserted range
        ours("Int8Add", [x, x], {"Y_scale": 0.05 / 2 ** -11, "Y_zero_point": 10})
    with pytest.raises(ArgumentError, match="#0 Int8MaxPool.*dilation"):
        ours("Int8MaxPool", [x], {"kernel": 2, "dilation": 2, "order": "NHWC",
                                  "Y_scale": 0.05, "Y_zero_point": 100})
    with pytest.raises(ArgumentError, match="#0 Int8AveragePool.*2\\*\\*-8"):
        ours("Int8AveragePool", [x], {"kernel": 2, "order": "NHWC", "Y_scale": 100.0})
    with pytest.raises(ArgumentError, match="#0 Int8LeakyRelu.*alpha"):
        ours("Int8LeakyRelu", [x], {"alpha": 1.5, "Y_scale": 0.05, "Y_zero_point": 100})
    with pytest.raises(ArgumentError, match="#0 Int8AddRelu.*empty"):
        ours("Int8AddRelu", [x, x], {"Y_scale": 0.05, "Y_zero_point": 255})
    with pytest.raises(ShapeError, match="#0 Int8Add"):
        _infer("Int8Add", [TensorType((2, 3), "uint8"), TensorType((3, 2), "uint8")], {})
    with pytest.raises(ShapeError, match="#0 Int8Slice.*one dimension"):
        _infer("Int8Slice", [TensorType((2, 3, 4), "uint8")], {"starts": [0, 1, 1], "ends": [-1, 2, 3]})
    with pytest.raises(ArgumentError, match="#0 Int8ChannelShuffle.*kernel"):
        ours("Int8ChannelShuffle", [x], {"group": 3, "order": "NHWC", "Y_scale": 0.05, "Y_zero_point": 100})
    with pytest.raises(ArgumentError, match="#0 Int8AveragePool.*Y_scale"):
        ours("Int8AveragePool", [x], {"kernel": 2, "order": "NHWC", "Y_scale": 0.0})
    with pytest.raises(InputError, match="#0 Int8Sum.*uint8"):
        ours("Int8Sum", [x, Int8Tensor(np.zeros((1, 4, 4, 3), np.int32), 0.05, 0)], {})
    with pytest.raises(InputError, match="#0 Int8Relu.*Int8 tensor"):
        ours("Int8Relu", [np.zeros((2, 2), np.uint8)], {})


def test_int8_kernels_temporaries_stay_within_their_declaration():
    """tracemalloc's peak during each numpy kernel, less its outputs, is at most what its
    registry entry declares plus 64 KiB (numpy's and Python's small objects), as
    tests/test_resource_limits.py checks for the float kernels."""
    import tracemalloc
    rng = np.random.default_rng(0)

    def x(shape, s=0.05, z=100):
        return q(_u8(rng, shape), s, z)
    big = x((4, 64, 64, 64))
    same = {"Y_scale": big.scale, "Y_zero_point": 100}
    rois = np.array([[0, 0, 0, 60, 60], [1, 5, 5, 30, 50]] * 20, np.float32)
    cases = [("Int8Add", [big, x(big.shape, 0.07, 90)], {"Y_scale": 0.1, "Y_zero_point": 10}),
             ("Int8SumRelu", [big, big], {"Y_scale": 0.1, "Y_zero_point": 10}),
             ("Int8Relu", [big], same),
             ("Int8MaxPool", [big], {**same, "kernel": 3, "pad": 1, "order": "NHWC"}),
             ("Int8AveragePool", [big], {**same, "kernel": 3, "pad": 1, "order": "NHWC"}),
             ("Int8AveragePool", [big], {**same, "kernel": 5, "stride": 2, "order": "NHWC"}),
             ("Int8AveragePool", [big], {**same, "global_pooling": 1, "order": "NHWC"}),
             ("Int8Softmax", [x((64, 16384))], {"Y_scale": 1 / 256, "Y_zero_point": 0}),
             ("Int8Softmax", [x((2, 300000))], {"Y_scale": 1 / 256, "Y_zero_point": 0}),
             ("Int8Sigmoid", [big], {"Y_scale": 1 / 256, "Y_zero_point": 0}),
             ("Int8LeakyRelu", [big], {**same, "alpha": 0.1}),
             ("Int8Concat", [big, big], {**same, "axis": 3}),
             ("Int8Transpose", [big], same),
             ("Int8ResizeNearest", [big], {**same, "width_scale": 2.0, "height_scale": 2.0}),
             ("Int8ChannelShuffle", [big], {**same, "group": 4, "kernel": 1, "order": "NHWC"}),
             ("Int8RoIAlign", [big, rois], {"pooled_h": 7, "pooled_w": 7, "sampling_ratio": 2,
                                            "order": "NHWC", "Y_scale": 0.05, "Y_zero_point": 3})]
    for op, ins, args in cases:
        opdef, a = registry.get(op), Args(args, op=op)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            outs = opdef.kernel(np, ins, a)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        out_types = [TensorType(o.shape, str(o.dtype)) for o in outs]
        declared = opdef.scratch_bytes([TensorType(i.shape, str(i.dtype)) for i in ins], out_types, a)
        assert peak - sum(o.nbytes for o in outs) <= declared + 64 * 1024, op
