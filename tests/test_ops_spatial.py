"""Conformance, shape-inference and cost tests for Conv, ConvTranspose, pools, SpatialBN, LRN, PadImage.

The cases are data (tests/cases/spatial.py); each names a PyTorch CPU reference below,
with the PyTorch-side parameters written by hand in the case. Every case runs on numpy
and, where a GPU is visible, on cupy.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cases.spatial import CASES, SHAPE_ERRORS
from conftest import require_cupy, require_torch
from cupy_standin import check_gpu_kernel
from placer.errors import ArgumentError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

DEVICES = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


def make_inputs(case):
    rng = np.random.default_rng(zlib.crc32(case["id"].encode()))
    out = []
    for spec in case["inputs"]:
        if spec["kind"] == "positive":
            a = rng.uniform(0.5, 1.5, spec["shape"])
        else:
            a = rng.standard_normal(spec["shape"])
        out.append(a.astype(spec["dtype"]))
    return out


# ---------------------------------------------------------------- PyTorch references

def _nchw(torch, a, nhwc):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.permute(0, 3, 1, 2) if nhwc else t


def _back(t, nhwc):
    return (t.permute(0, 2, 3, 1) if nhwc else t).contiguous().numpy()


def ref_conv2d(torch, inputs, ra, transpose=False):
    F = torch.nn.functional
    ra = dict(ra)
    nhwc, pad, crop = ra.pop("nhwc", False), ra.pop("pad", None), ra.pop("crop", None)
    x, w = _nchw(torch, inputs[0], nhwc), _nchw(torch, inputs[1], nhwc)
    b = torch.from_numpy(inputs[2]) if len(inputs) > 2 else None
    if pad is not None:
        x = F.pad(x, pad)
    y = (F.conv_transpose2d if transpose else F.conv2d)(x, w, b, **ra)
    if crop is not None:
        top, bottom, left, right = crop
        y = y[:, :, top:y.shape[2] - bottom, left:y.shape[3] - right]
    return [_back(y, nhwc)]


def ref_pool(torch, inputs, ra, kind):
    F = torch.nn.functional
    ra = dict(ra)
    nhwc, pad, from_mask = ra.pop("nhwc", False), ra.pop("pad", None), ra.pop("count_pad_from_mask", False)
    x = _nchw(torch, inputs[0], nhwc)
    if kind == "max":
        if pad is not None:
            x = F.pad(x, pad, value=float("-inf"))
        return [_back(F.max_pool2d(x, **ra), nhwc)]
    if from_mask:       # average over the positions inside the image, asymmetric pads
        sums = F.avg_pool2d(F.pad(x, pad), divisor_override=1, **ra)
        counts = F.avg_pool2d(F.pad(torch.ones_like(x), pad), divisor_override=1, **ra)
        return [_back(sums / counts, nhwc)]
    if pad is not None:
        x = F.pad(x, pad)
    return [_back(F.avg_pool2d(x, **ra), nhwc)]


def ref_batch_norm(torch, inputs, ra):
    nhwc = ra.get("nhwc", False)
    x = _nchw(torch, inputs[0], nhwc).contiguous()
    scale, bias, mean, var = (torch.from_numpy(a.copy()) for a in inputs[1:])
    if not ra["training"]:
        y = torch.nn.functional.batch_norm(x, mean, var, scale, bias, False, 0.0, ra["eps"])
        return [_back(y, nhwc)]
    y, saved_mean, saved_invstd = torch.native_batch_norm(x, scale, bias, mean, var, True,
                                                          ra["momentum"], ra["eps"])
    return [_back(y, nhwc), mean.numpy(), var.numpy(), saved_mean.numpy(), saved_invstd.numpy()]


def ref_lrn(torch, inputs, ra):
    """Y from torch's local_response_norm (odd sizes); the scale from a channel avg-pool."""
    F = torch.nn.functional
    nhwc, size = ra.get("nhwc", False), ra["size"]
    x = _nchw(torch, inputs[0], nhwc)
    front = ra.get("front", size // 2)
    sq = F.pad((x * x).unsqueeze(1), (0, 0, 0, 0, front, size - 1 - front))
    scale = F.avg_pool3d(sq, (size, 1, 1), stride=1).squeeze(1) * ra["alpha"] + ra["k"]
    if "front" in ra:
        y = x * scale ** -ra["beta"]
    else:
        y = F.local_response_norm(x, size, alpha=ra["alpha"], beta=ra["beta"], k=ra["k"])
    return [_back(y, nhwc), _back(scale, nhwc)]


def ref_pad(torch, inputs, ra):
    nhwc = ra.get("nhwc", False)
    x = _nchw(torch, inputs[0], nhwc)
    kw = {"value": ra["value"]} if ra["mode"] == "constant" else {}
    return [_back(torch.nn.functional.pad(x, ra["pad"], mode=ra["mode"], **kw), nhwc)]


REFERENCES = {
    "conv2d": ref_conv2d,
    "conv_transpose2d": lambda t, i, ra: ref_conv2d(t, i, ra, transpose=True),
    "max_pool2d": lambda t, i, ra: ref_pool(t, i, ra, "max"),
    "avg_pool2d": lambda t, i, ra: ref_pool(t, i, ra, "avg"),
    "batch_norm": ref_batch_norm,
    "lrn": ref_lrn,
    "pad": ref_pad,
}


def _array_module(device):
    if device == "numpy":
        return np, (lambda a: a), (lambda a: a)
    import cupy
    return cupy, cupy.asarray, cupy.asnumpy


def run_kernel(case, inputs, device="numpy"):
    xp, to_dev, to_host = _array_module(device)
    opdef = registry.get(case["op"])
    outs = opdef.kernel(xp, [to_dev(a) for a in inputs], Args(case["args"], op=case["id"]))
    return [to_host(o) for o in outs]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_gpu_kernels_keep_to_cupy_rules(case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(case["op"]), make_inputs(case), Args(case["args"], op=case["id"]))


# ---------------------------------------------------------------- conformance

@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_conformance(case, device):
    torch = require_torch()
    inputs = make_inputs(case)
    expected = REFERENCES[case["ref"]](torch, inputs, case["ref_args"])
    got = run_kernel(case, inputs, device)
    assert len(got) >= len(expected)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"output {k}: shape {g.shape} != reference {e.shape}"
        assert g.dtype == inputs[0].dtype, f"output {k}: dtype {g.dtype} (input {inputs[0].dtype})"
        scale = max(1.0, float(np.abs(e).max()))
        err = float(np.abs(g.astype(np.float64) - e).max())
        assert err <= case.get("tol", 1e-5) * scale, f"output {k}: max abs error {err:.3g}"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_infer_matches_kernel(case):
    inputs = make_inputs(case)
    args = Args(case["args"], op=case["id"])
    types = registry.get(case["op"]).infer([TensorType(a.shape, str(a.dtype)) for a in inputs], args)
    outs = run_kernel(case, inputs)
    assert [t.shape for t in types] == [o.shape for o in outs]
    assert [t.dtype for t in types] == [str(o.dtype) for o in outs]


@pytest.mark.parametrize("case", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors_name_op_and_mismatch(case):
    name, op, args, shapes, words = case
    with pytest.raises(ShapeError) as err:
        registry.get(op).infer([TensorType(s) for s in shapes], Args(args, op=f"#3 {op} 'bad'"))
    msg = str(err.value)
    assert f"#3 {op} 'bad'" in msg
    for word in words:
        assert word in msg, msg


def test_argument_errors():
    conv = registry.get("Conv")
    x, w = TensorType((1, 3, 8, 8)), TensorType((4, 3, 3, 3))
    with pytest.raises(ArgumentError, match="order"):
        conv.infer([x, w], Args({"kernel": 3, "order": "CHWN"}, op="c"))
    with pytest.raises(ArgumentError, match="legacy_pad"):
        conv.infer([x, w], Args({"kernel": 3, "pad": 1, "legacy_pad": 2}, op="c"))
    with pytest.raises(ArgumentError, match="dilation"):
        registry.get("ConvTranspose").infer([x, TensorType((3, 4, 3, 3))], Args({"kernel": 3, "dilation": 2}, op="c"))
    with pytest.raises(ArgumentError, match="kernel"):
        registry.get("MaxPool").infer([x], Args({"stride": 2}, op="p"))


# ---------------------------------------------------------------- shapes of real layers

@pytest.mark.parametrize("op, args, shapes, expected", [
    # Caffe ceil-mode pooling as Caffe2's translator writes it (GoogLeNet pool1, AlexNet pool5).
    ("MaxPool", {"kernel": 3, "stride": 2, "legacy_pad": 3}, [(1, 64, 112, 112)], (1, 64, 56, 56)),
    ("MaxPool", {"kernel": 3, "stride": 2}, [(1, 64, 112, 112)], (1, 64, 55, 55)),
    ("MaxPool", {"kernel": 3, "stride": 2, "legacy_pad": 3}, [(1, 256, 13, 13)], (1, 256, 6, 6)),
    ("MaxPool", {"kernel": 3, "stride": 2, "pad": 1, "legacy_pad": 3}, [(1, 8, 13, 13)], (1, 8, 7, 7)),
    ("AveragePool", {"global_pooling": 1}, [(2, 2048, 7, 7)], (2, 2048, 1, 1)),
    ("Conv", {"kernel": 7, "stride": 2, "pad": 3}, [(1, 3, 224, 224), (64, 3, 7, 7)], (1, 64, 112, 112)),
    ("Conv", {"kernel": 11, "stride": 4}, [(10, 3, 227, 227), (96, 3, 11, 11), (96,)], (10, 96, 55, 55)),
    ("Conv", {"kernel": 3, "pad": 1, "order": "NHWC"}, [(1, 56, 56, 64), (64, 3, 3, 64)], (1, 56, 56, 64)),
    ("ConvTranspose", {"kernel": 4, "stride": 2, "pad": 1}, [(1, 16, 32, 32), (16, 8, 4, 4)], (1, 8, 64, 64)),
    ("ConvTranspose", {"kernel": 3, "stride": 2, "legacy_pad": 1, "adj": 1}, [(1, 4, 5, 5), (4, 2, 3, 3)], (1, 2, 12, 12)),
    ("PadImage", {"pad_t": 1, "pad_l": 2, "pad_b": 3, "pad_r": 4}, [(1, 3, 10, 10)], (1, 3, 14, 16)),
    ("LRN", {"size": 5, "alpha": 1e-4, "beta": 0.75}, [(1, 96, 55, 55)], (1, 96, 55, 55)),
])
def test_output_shapes(op, args, shapes, expected):
    types = registry.get(op).infer([TensorType(s) for s in shapes], Args(args, op="t"))
    assert types[0].shape == expected


def test_spatial_bn_output_counts():
    bn = registry.get("SpatialBN")
    ins = [TensorType((2, 4, 3, 3))] + [TensorType((4,))] * 4
    assert len(bn.infer(ins, Args({"is_test": 1}, op="b"))) == 1
    assert [t.shape for t in bn.infer(ins, Args({}, op="b"))] == [(2, 4, 3, 3)] + [(4,)] * 4


# ---------------------------------------------------------------- costs

def _cost(op, args, shapes):
    opdef = registry.get(op)
    ins = [TensorType(s) for s in shapes]
    a = Args(args, op="t")
    return opdef.cost(ins, opdef.infer(ins, a), a)


def test_resnet50_conv1_macs():
    f = _cost("Conv", {"kernel": 7, "stride": 2, "pad": 3}, [(1, 3, 224, 224), (64, 3, 7, 7)])
    assert f.macs == 118_013_952           # 64 * 112 * 112 * 3 * 7 * 7
    assert f.flops == 2 * 118_013_952
    assert f.bytes_read == 4 * (3 * 224 * 224 + 64 * 3 * 49)
    assert f.bytes_written == 4 * 64 * 112 * 112


def test_alexnet_conv1_and_grouped_conv2_macs():
    f1 = _cost("Conv", {"kernel": 11, "stride": 4}, [(1, 3, 227, 227), (96, 3, 11, 11), (96,)])
    assert f1.macs == 96 * 55 * 55 * 3 * 121 == 105_415_200
    assert f1.flops == 2 * f1.macs + 96 * 55 * 55
    f2 = _cost("Conv", {"kernel": 5, "pad": 2, "group": 2}, [(1, 96, 27, 27), (256, 48, 5, 5), (256,)])
    assert f2.macs == 256 * 27 * 27 * 48 * 25 == 223_948_800


def test_depthwise_and_transpose_macs():
    f = _cost("Conv", {"kernel": 3, "pad": 1, "group": 32}, [(8, 32, 112, 112), (32, 1, 3, 3)])
    assert f.macs == 8 * 32 * 112 * 112 * 9
    t = _cost("ConvTranspose", {"kernel": 4, "stride": 2, "pad": 1}, [(2, 16, 8, 8), (16, 8, 4, 4)])
    assert t.macs == 2 * 16 * 8 * 8 * 8 * 16


def test_pool_bn_lrn_costs():
    p = _cost("MaxPool", {"kernel": 3, "stride": 2, "legacy_pad": 3}, [(1, 64, 112, 112)])
    assert p.flops == 64 * 56 * 56 * 9 and p.macs == 0
    g = _cost("AveragePool", {"global_pooling": 1}, [(1, 2048, 7, 7)])
    assert g.flops == 2048 * 49
    bn = _cost("SpatialBN", {"is_test": 1}, [(1, 64, 56, 56)] + [(64,)] * 4)
    assert bn.flops == 2 * 64 * 56 * 56
    lrn = _cost("LRN", {"size": 5, "alpha": 1e-4, "beta": 0.75}, [(1, 96, 55, 55)])
    assert lrn.flops == 10 * 96 * 55 * 55
    assert lrn.bytes_written == 2 * 4 * 96 * 55 * 55      # Y and the scale


def test_kernels_keep_float32_and_do_not_write_inputs():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    before = x.copy()
    y = registry.get("Conv").kernel(np, [x, w], Args({"kernel": 3, "pad": 1}, op="c"))[0]
    assert y.dtype == np.float32 and y.flags.c_contiguous
    y2 = registry.get("MaxPool").kernel(np, [x], Args({"kernel": 3, "pad": 1}, op="p"))[0]
    assert y2.dtype == np.float32
    assert np.array_equal(x, before)


def test_every_family_op_has_cases():
    covered = {c["op"] for c in CASES}
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "SpatialBN", "LRN", "PadImage"} <= covered
