"""The cuDNN dispatch of the convolution kernels (placer/ops/cudnn_conv.py).

Without a GPU, cupy's cuDNN is replaced by ``FakeCudnn``: functions with the exact
signatures of cupyx.cudnn (CuPy 13, keyword-only arguments included, so a wrong call
fails) that record their arguments and compute the result with numpy from those
arguments alone -- the pads, strides, dilations, groups and layouts cuDNN would be told
-- through placer's matmul code. A mapping that hands cuDNN the wrong geometry then gives
a different result from the kernel's own matmul path on Caffe2's arguments.

Tolerances: where the two sides run the same code on the same geometry the results are
bitwise equal and are compared exactly. Where they sum in different orders (ConvTranspose
as a data gradient, db over other axes) each output is a sum of at most K = C/group*kH*kW
(or N*Ho*Wo) products, and two float64 summations of the same terms differ by at most
2*K*u*sum|terms| (u = 2^-53, Higham's gamma_K for each side); the bound is computed per
element from the kernel run on |X| and |W|.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from placer import cli
from placer.commands.run import conv_engine_line
from placer.formats.caffe2 import load_netdef
from placer.ops import cudnn_conv
from placer.ops.conv import conv2d, conv_kernel, conv_transpose_kernel
from placer.ops.gradients_spatial import _conv_grad_kernel, conv_grad_matmul
from placer.ops.spatial_args import parse_window
from placer.runtime import record as run_record
from placer.types import Args

from cupy_standin import StrictCupy

NCHW, NHWC = 0, 1       # cupy.cuda.cudnn.CUDNN_TENSOR_NCHW / _NHWC (cuDNN's cudnnTensorFormat_t)
EPS64 = 2.0 ** -53
RESNET = "placer/examples/data/resnet_small.pbtxt"


class FakeCupy:
    """numpy under the name "cupy": the kernels' GPU branches, on host arrays."""

    __name__ = "cupy"

    def __getattr__(self, name):
        return getattr(np, name)


XP = FakeCupy()


def _args_from_cudnn(pad, stride, dilation, groups, layout, **more) -> Args:
    """The Caffe2 arguments that say what cuDNN was told (symmetric pads by construction)."""
    assert layout in (NCHW, NHWC)
    return Args({"pads": [pad[0], pad[1], pad[0], pad[1]], "strides": list(stride),
                 "dilations": list(dilation), "group": groups,
                 "order": "NCHW" if layout == NCHW else "NHWC", **more}, op="fake")


def _kernel_of(w, layout):
    return (w.shape[2], w.shape[3]) if layout == NCHW else (w.shape[1], w.shape[2])


class FakeCudnn:
    """cupyx.cudnn's three convolution functions, recorded and computed with numpy."""

    def __init__(self, refuse: str = ""):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.refuse = refuse

    def _enter(self, name, args, kwargs):
        self.calls.append((name, args, kwargs))
        if self.refuse:
            raise RuntimeError(self.refuse)
        assert kwargs["d_layout"] == kwargs["w_layout"]

    def convolution_forward(self, x, W, b, y, pad, stride, dilation, groups, *, auto_tune, tensor_core,
                            d_layout=NCHW, w_layout=NCHW):
        self._enter("forward", (x, W, b, y, pad, stride, dilation, groups),
                    dict(auto_tune=auto_tune, tensor_core=tensor_core, d_layout=d_layout, w_layout=w_layout))
        args = _args_from_cudnn(pad, stride, dilation, groups, d_layout)
        win = parse_window(args, kernel_from=_kernel_of(W, d_layout))
        out = y.shape[2:] if d_layout == NCHW else y.shape[1:3]
        if x.dtype == np.float16:   # cuDNN's half convolution computes in float, then adds b in half
            y[...] = conv2d(np, x.astype(np.float32), W.astype(np.float32), None, win,
                            (pad[0], pad[1], pad[0], pad[1]), out, groups).astype(np.float16)
            if b is not None:
                y[...] = y + (b.reshape(1, -1, 1, 1) if d_layout == NCHW else b)
            return
        y[...] = conv2d(np, x, W, b, win, (pad[0], pad[1], pad[0], pad[1]), out, groups)

    def convolution_backward_filter(self, x, gy, gW, pad, stride, dilation, groups, *, deterministic,
                                    auto_tune, tensor_core, d_layout=NCHW, w_layout=NCHW):
        self._enter("backward_filter", (x, gy, gW, pad, stride, dilation, groups),
                    dict(deterministic=deterministic, auto_tune=auto_tune, tensor_core=tensor_core,
                         d_layout=d_layout, w_layout=w_layout))
        args = _args_from_cudnn(pad, stride, dilation, groups, d_layout, no_bias=1, no_gradient_to_input=1)
        gW[...] = conv_grad_matmul(np, x, np.zeros(gW.shape, gW.dtype), gy, args)[0]

    def convolution_backward_data(self, W, x, b, y, pad, stride, dilation, groups, *, deterministic,
                                  auto_tune, tensor_core, d_layout=NCHW, w_layout=NCHW):
        self._enter("backward_data", (W, x, b, y, pad, stride, dilation, groups),
                    dict(deterministic=deterministic, auto_tune=auto_tune, tensor_core=tensor_core,
                         d_layout=d_layout, w_layout=w_layout))
        args = _args_from_cudnn(pad, stride, dilation, groups, d_layout, no_bias=1)
        dx = conv_grad_matmul(np, np.zeros(y.shape, y.dtype), W, x, args)[1]
        if b is not None:
            dx = dx + (b.reshape(-1, 1, 1) if d_layout == NCHW else b)
        y[...] = dx


@pytest.fixture
def fake():
    """cuDNN present: the fake module, for arrays of the FakeCupy module."""
    calls = FakeCudnn()
    saved = cudnn_conv._is_cupy
    cudnn_conv.reset()
    cudnn_conv._is_cupy = lambda xp: xp is XP
    cudnn_conv._loaded = cudnn_conv.CudnnApi(calls, NCHW, NHWC)
    yield calls
    cudnn_conv._is_cupy = saved
    cudnn_conv.reset()


def _rand(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed + len(shape) + sum(shape)).standard_normal(shape).astype(dtype)


def _conv_inputs(order, n, c, m, hw, k, group, bias, dtype=np.float64):
    x = _rand((n, c, *hw) if order == "NCHW" else (n, *hw, c), dtype, 1)
    w = _rand((m, c // group, k, k) if order == "NCHW" else (m, k, k, c // group), dtype, 2)
    return [x, w] + ([_rand((m,), dtype, 3)] if bias else [])


# order, (N, C, M, H, W, k, group, bias), extra Caffe2 arguments, cuDNN's (pad, stride, dilation)
FORWARD = [
    ("NCHW", (2, 4, 6, 7, 7, 3, 1, True), {"pad": 1}, ((1, 1), (1, 1), (1, 1))),
    ("NCHW", (2, 4, 6, 9, 8, 3, 2, False), {"pad_t": 2, "pad_b": 2, "pad_l": 0, "pad_r": 0, "stride": 2},
     ((2, 0), (2, 2), (1, 1))),
    ("NCHW", (1, 3, 4, 11, 11, 3, 1, True), {"pads": [2, 1, 2, 1], "dilations": [2, 1], "strides": [1, 2]},
     ((2, 1), (1, 2), (2, 1))),
    ("NHWC", (2, 4, 6, 7, 7, 3, 1, True), {"pad": 1, "stride": 2}, ((1, 1), (2, 2), (1, 1))),
    ("NHWC", (2, 6, 6, 8, 8, 3, 6, False), {"pad": 1}, ((1, 1), (1, 1), (1, 1))),        # depthwise
    ("NHWC", (2, 4, 8, 6, 6, 1, 2, True), {}, ((0, 0), (1, 1), (1, 1))),                 # 1x1, groups
    ("NCHW", (2, 4, 6, 7, 7, 3, 1, True), {"legacy_pad": 2, "stride": 2}, ((1, 1), (2, 2), (1, 1))),  # SAME
]


@pytest.mark.parametrize("order,dims,extra,expect", FORWARD)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_forward_hands_cudnn_the_caffe2_geometry(fake, order, dims, extra, expect, dtype):
    n, c, m, h, w_, k, group, bias = dims
    inputs = _conv_inputs(order, n, c, m, (h, w_), k, group, bias, dtype)
    args = Args({"order": order, "group": group, "kernel": k, **extra}, op="conv0")
    (y,) = conv_kernel(XP, inputs, args)
    assert cudnn_conv.conv_engines() == {"conv0": (cudnn_conv.CUDNN, "")}
    (want,) = conv_kernel(np, inputs, args)
    assert cudnn_conv.conv_engines() == {"conv0": (cudnn_conv.NUMPY, "")}   # the last run of the op
    [(name, call, options)] = fake.calls
    assert name == "forward"
    x, w, b, out, pad, stride, dilation, groups = call
    assert x is inputs[0] and w is inputs[1] and out is y
    assert b is (inputs[2] if bias else None)
    assert (pad, stride, dilation, groups) == (*expect, group)
    layout = NCHW if order == "NCHW" else NHWC
    assert options == dict(auto_tune=False, tensor_core="auto", d_layout=layout, w_layout=layout)
    assert y.dtype == dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)


def _bound(kernel, inputs, args, terms):
    """2 * K * u * (the kernel on |inputs|): two float64 sums of the same K terms differ by at most this."""
    absolute = kernel(np, [np.abs(a) for a in inputs], args)
    return [2 * terms * EPS64 * a for a in absolute]


# order, (N, C, M, H, W, k, group, bias), ConvTranspose arguments, cuDNN's (pad, stride)
TRANSPOSE = [
    ("NCHW", (2, 4, 6, 5, 5, 3, 1, True), {"pad": 1, "stride": 2, "adj": 1}, ((1, 1), (2, 2))),
    ("NCHW", (2, 4, 6, 4, 6, 4, 2, False), {"pad": 1, "stride": 2}, ((1, 1), (2, 2))),
    ("NHWC", (2, 4, 6, 5, 5, 3, 2, True), {"pads": [0, 1, 0, 1], "strides": [1, 2]}, ((0, 1), (1, 2))),
    ("NCHW", (1, 3, 3, 6, 6, 2, 1, True), {"legacy_pad": 1, "stride": 2}, ((0, 0), (2, 2))),
]


@pytest.mark.parametrize("order,dims,extra,expect", TRANSPOSE)
def test_conv_transpose_is_cudnn_backward_data(fake, order, dims, extra, expect):
    n, c, m, h, w_, k, group, bias = dims
    x = _rand((n, c, h, w_) if order == "NCHW" else (n, h, w_, c), seed=4)
    w = _rand((c, m // group, k, k) if order == "NCHW" else (c, k, k, m // group), seed=5)
    inputs = [x, w] + ([_rand((m,), seed=6)] if bias else [])
    args = Args({"order": order, "group": group, "kernel": k, **extra}, op="deconv")
    (y,) = conv_transpose_kernel(XP, inputs, args)
    assert cudnn_conv.conv_engines()["deconv"] == (cudnn_conv.CUDNN, "")
    (want,) = conv_transpose_kernel(np, inputs, args)
    [(name, call, options)] = fake.calls
    assert name == "backward_data"
    w_in, gy, b, out, pad, stride, dilation, groups = call
    assert w_in is w and gy is x and out is y and b is (inputs[2] if bias else None)
    assert (pad, stride, dilation, groups) == (*expect, (1, 1), group)
    layout = NCHW if order == "NCHW" else NHWC
    assert options == dict(deterministic=False, auto_tune=False, tensor_core="auto", d_layout=layout,
                           w_layout=layout)
    assert y.shape == want.shape
    [bound] = _bound(conv_transpose_kernel, inputs, args, c // group * k * k + 1)
    assert np.all(np.abs(y - want) <= bound)
    assert np.abs(y).max() > 0.5         # a real result, not zeros against zeros


def _gradient_case(order, dims, extra, has_dx, has_db):
    n, c, m, h, w_, k, group, _ = dims
    x, w = _conv_inputs(order, n, c, m, (h, w_), k, group, False)
    forward = Args({"order": order, "group": group, "kernel": k, **extra}, op="f")
    dy = _rand(conv_kernel(np, [x, w], forward)[0].shape, seed=7)
    flags = {"no_gradient_to_input": 0 if has_dx else 1, "no_bias": 0 if has_db else 1}
    return [x, w, dy], Args({"order": order, "group": group, "kernel": k, **extra, **flags}, op="conv0_grad")


@pytest.mark.parametrize("order,dims,extra,expect", FORWARD[:6])
@pytest.mark.parametrize("has_dx,has_db", [(True, True), (False, True), (True, False)])
def test_conv_gradient_is_cudnn_backward_filter_and_data(fake, order, dims, extra, expect, has_dx, has_db):
    inputs, args = _gradient_case(order, dims, extra, has_dx, has_db)
    x, w, dy = inputs
    got = _conv_grad_kernel(XP, inputs, args)
    assert cudnn_conv.conv_engines()["conv0_grad"] == (cudnn_conv.CUDNN, "")
    want = _conv_grad_kernel(np, inputs, args)
    assert [a.shape for a in got] == [a.shape for a in want]
    names = [name for name, _, _ in fake.calls]
    assert names == ["backward_filter"] + (["backward_data"] if has_dx else [])
    layout = NCHW if order == "NCHW" else NHWC
    options = dict(deterministic=False, auto_tune=False, tensor_core="auto", d_layout=layout, w_layout=layout)
    group = dims[6]
    _, call, opts = fake.calls[0]
    assert call[0] is x and call[1] is dy and call[2] is got[0] and call[3:] == (*expect, group)
    assert opts == options
    if has_dx:
        _, call, opts = fake.calls[1]
        assert call[0] is w and call[1] is dy and call[2] is None and call[3] is got[-1]
        assert call[4:] == (*expect, group) and opts == options
    np.testing.assert_array_equal(got[0], want[0])        # dW: the same code on the same geometry
    if has_dx:
        np.testing.assert_array_equal(got[-1], want[-1])  # dX: likewise
    if has_db:                                            # db: N*Ho*Wo terms summed over other axes
        terms = dy.size // dy.shape[1 if order == "NCHW" else 3]
        bound = 2 * terms * EPS64 * np.abs(dy).sum(axis=(0, 2, 3) if order == "NCHW" else (0, 1, 2))
        assert np.all(np.abs(got[1] - want[1]) <= bound)


def test_asymmetric_pads_fall_back_and_say_why(fake):
    inputs = _conv_inputs("NCHW", 1, 2, 3, (6, 6), 3, 1, True)
    args = Args({"kernel": 3, "pads": [1, 0, 0, 1]}, op="odd")
    (y,) = conv_kernel(XP, inputs, args)
    engine, why = cudnn_conv.conv_engines()["odd"]
    assert engine == cudnn_conv.MATMUL and why.startswith("asymmetric pads t,l,b,r=1,0,0,1")
    np.testing.assert_array_equal(y, conv_kernel(np, inputs, args)[0])
    assert fake.calls == []
    grad = Args({"kernel": 3, "pads": [1, 0, 0, 1]}, op="odd_grad")
    dy = _rand(y.shape)
    _conv_grad_kernel(XP, [inputs[0], inputs[1], dy], grad)
    assert fake.calls == [] and cudnn_conv.conv_engines()["odd_grad"][0] == cudnn_conv.MATMUL


def test_transpose_with_adj_equal_to_stride_falls_back(fake):
    x, w = _rand((1, 2, 4, 4)), _rand((2, 3, 3, 3))
    args = Args({"kernel": 3, "stride": 2, "adj": 2}, op="t")
    (y,) = conv_transpose_kernel(XP, [x, w], args)
    assert cudnn_conv.conv_engines()["t"] == (cudnn_conv.MATMUL, "adj (2, 2) not below stride (2, 2)")
    np.testing.assert_array_equal(y, conv_transpose_kernel(np, [x, w], args)[0])
    assert fake.calls == []


def test_dtypes_cudnn_cannot_take_fall_back(fake):
    x, w = _rand((1, 2, 5, 5)), _rand((3, 2, 3, 3), np.float32)
    win = parse_window(Args({"kernel": 3}), kernel_from=(3, 3))
    assert cudnn_conv.forward(XP, "mixed", x, w, None, win, (0, 0, 0, 0), (3, 3), 1) is None
    assert cudnn_conv.conv_engines()["mixed"] == (
        cudnn_conv.MATMUL, "dtype float32/float64 (cuDNN takes one of float16, float32, float64)")
    xi, wi = x.astype(np.int32), w.astype(np.int32)
    assert cudnn_conv.forward(XP, "ints", xi, wi, None, win, (0, 0, 0, 0), (3, 3), 1) is None
    assert cudnn_conv.conv_engines()["ints"][1].startswith("dtype int32")
    assert fake.calls == []


def test_a_call_cudnn_refuses_runs_the_matmul_path(fake):
    fake.refuse = "CUDNN_STATUS_NOT_SUPPORTED"
    inputs = _conv_inputs("NHWC", 2, 4, 4, (5, 5), 3, 2, True)
    args = Args({"kernel": 3, "pad": 1, "order": "NHWC", "group": 2}, op="no")
    (y,) = conv_kernel(XP, inputs, args)
    assert cudnn_conv.conv_engines()["no"] == (cudnn_conv.MATMUL, "cuDNN refused: CUDNN_STATUS_NOT_SUPPORTED")
    np.testing.assert_array_equal(y, conv_kernel(np, inputs, args)[0])
    assert len(fake.calls) == 1


def test_numpy_and_stand_ins_never_reach_cudnn(fake):
    inputs = _conv_inputs("NCHW", 1, 2, 3, (5, 5), 3, 1, False)
    conv_kernel(np, inputs, Args({"kernel": 3}, op="host"))
    conv_kernel(StrictCupy(), [StrictCupy().asarray(a) for a in inputs], Args({"kernel": 3}, op="standin"))
    assert fake.calls == []
    engines = cudnn_conv.conv_engines()
    assert engines["host"] == (cudnn_conv.NUMPY, "")
    assert engines["standin"][0] == cudnn_conv.MATMUL and "is not cupy" in engines["standin"][1]


def test_missing_cudnn_is_a_fallback_with_how_to_get_it(fake):
    cudnn_conv._loaded = f"{cudnn_conv.NO_CUDNN} (cupy 14.2.0, CuPy v14 removed it: No module named 'cupyx.cudnn')"
    inputs = _conv_inputs("NCHW", 1, 2, 3, (5, 5), 3, 1, False)
    for label in ("a", "b"):
        conv_kernel(XP, inputs, Args({"kernel": 3}, op=label))
    assert fake.calls == []
    line = conv_engine_line(["a", "b", "not a conv"])
    assert line == ("convolutions: cuDNN (cupyx.cudnn) for 0 op(s), matmul fallback for 2 (2: no cuDNN (cupy "
                    "14.2.0, CuPy v14 removed it: No module named 'cupyx.cudnn')); " + cudnn_conv.HOW_TO_GET)
    assert "placer[cudnn]" in line and "install_library --cuda 12.x --library cudnn" in line


def test_engine_line_counts_each_op_once(fake):
    inputs = _conv_inputs("NCHW", 1, 2, 3, (5, 5), 3, 1, False)
    for _ in range(3):   # warm-up and timed runs of the same two ops
        conv_kernel(XP, inputs, Args({"kernel": 3}, op="c1"))
        conv_kernel(XP, inputs, Args({"kernel": 3, "pads": [1, 1, 0, 0]}, op="c2"))
    conv_kernel(np, inputs, Args({"kernel": 3}, op="c3"))
    assert len(fake.calls) == 3
    assert conv_engine_line(["c1", "c2", "c3"]) == (
        "convolutions: cuDNN (cupyx.cudnn) for 1 op(s), matmul fallback for 1 (1: asymmetric pads "
        "t,l,b,r=1,1,0,0 (cuDNN pads both ends alike)), matmul decomposition (numpy) for 1 op(s)")
    assert conv_engine_line(["c4"]) is None


def test_the_installed_cupy_is_looked_up_for_real():
    """This machine's cupy: CuPy 14 has no cuDNN at all; CuPy 13 has it when libcudnn loads."""
    cupy = pytest.importorskip("cupy")
    cudnn_conv.reset()
    try:
        api = cudnn_conv._load()
    finally:
        found, cudnn_conv._loaded = cudnn_conv._loaded, None
    assert found is api
    if int(cupy.__version__.split(".")[0]) >= 14:
        assert isinstance(api, str) and api.startswith(cudnn_conv.NO_CUDNN)
        assert f"cupy {cupy.__version__}, CuPy v14 removed it" in api
    elif not isinstance(api, str):
        assert (api.nchw, api.nhwc) == (NCHW, NHWC) and callable(api.conv.convolution_forward)


def test_placer_run_says_the_numpy_engine_ran(tmp_path, capsys):
    convs = sum(op.type == "Conv" for op in load_netdef(RESNET).op)
    assert convs > 0
    record = tmp_path / "run.json"
    assert cli.main(["run", RESNET, "--record", str(record)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"convolutions: matmul decomposition (numpy) for {convs} op(s)" in lines
    assert json.loads(record.read_text())["conv_engines"] == {"numpy": convs}
    cli.main(["run", RESNET, "--quiet"])
    assert "convolutions" not in capsys.readouterr().out


def test_records_without_engines_read_back():
    data = {"schema": "placer.run_record", "schema_version": 1, "net_name": "n", "devices": ["cpu"], "ops": [],
            "peak_bytes": {"cpu": 0}, "emulated": False, "iterations": 1, "warmup": 0}
    assert run_record.from_dict(data).conv_engines == {}
    assert run_record.from_dict({**data, "conv_engines": {"cudnn": 3}}).conv_engines == {"cudnn": 3}
    with pytest.raises(Exception, match="conv_engines"):
        run_record.from_dict({**data, "conv_engines": {"cudnn": -1}})


# ---------------------------------------------------------------- on a GPU with cuDNN

def _real_cudnn():
    cupy = pytest.importorskip("cupy")
    cudnn_conv.reset()
    api = cudnn_conv._load()
    if isinstance(api, str):
        pytest.skip(f"{api}; {cudnn_conv.HOW_TO_GET}")
    return cupy


GPU_SHAPES = [  # order, (N, C, M, H, W, k, group, bias), arguments
    ("NCHW", (8, 64, 64, 28, 28, 3, 1, True), {"pad": 1}),
    ("NCHW", (4, 32, 64, 30, 30, 3, 1, False), {"stride": 2, "pad": 1}),
    ("NCHW", (4, 64, 128, 14, 14, 1, 1, True), {}),
    ("NCHW", (4, 32, 32, 16, 16, 3, 32, True), {"pad": 1}),
    ("NHWC", (4, 64, 64, 14, 14, 3, 2, True), {"pad": 2, "dilation": 2}),
    ("NCHW", (2, 3, 16, 56, 56, 7, 1, True), {"pad": 3, "stride": 2}),
]


def _float32_bound(cupy, kernel, inputs, args, terms):
    """|cuDNN - matmul| for float32: cuDNN may round X and W to TF32 (its default math on
    Ampere and later: 10-bit mantissa, relative error 2^-11 each, so 2^-10 + 2^-22 per
    product); each side then sums ``terms`` products in float32 (gamma_K = K * 2^-24 each)
    and the bias add rounds once more (2^-24): (2^-10 + (2K + 2) * 2^-24) * sum|x||w|
    (+ |b|), the kernel run on |inputs| in float64 giving sum|x||w| per element."""
    host = [cupy.asnumpy(a).astype(np.float64) for a in inputs]
    absolute = kernel(np, [np.abs(a) for a in host], args)
    return [(2.0 ** -10 + (2 * terms + 2) * 2.0 ** -24) * a for a in absolute]


@pytest.mark.gpu
@pytest.mark.parametrize("order,dims,extra", GPU_SHAPES)
def test_cudnn_matches_the_matmul_path_on_a_gpu(order, dims, extra):
    cupy = _real_cudnn()
    n, c, m, h, w_, k, group, bias = dims
    inputs = [cupy.asarray(a) for a in _conv_inputs(order, n, c, m, (h, w_), k, group, bias, np.float32)]
    args = Args({"order": order, "group": group, "kernel": k, **extra}, op="gpu_conv")
    (y,) = conv_kernel(cupy, inputs, args)
    assert cudnn_conv.conv_engines()["gpu_conv"] == (cudnn_conv.CUDNN, "")
    x, w = inputs[0], inputs[1]
    win = parse_window(args, kernel_from=(k, k))
    hw = x.shape[2:] if win.nchw else x.shape[1:3]
    out, pads = win.resolve(*hw, "gpu_conv")
    want = conv2d(cupy, x, w, inputs[2] if bias else None, win, pads, out, group)
    [bound] = _float32_bound(cupy, conv_kernel, inputs, args, c // group * k * k)
    assert np.all(np.abs(cupy.asnumpy(y).astype(np.float64) - cupy.asnumpy(want)) <= bound)


@pytest.mark.gpu
@pytest.mark.parametrize("order,dims,extra", GPU_SHAPES[:5])
def test_cudnn_gradients_match_the_matmul_path_on_a_gpu(order, dims, extra):
    cupy = _real_cudnn()
    host, args = _gradient_case(order, dims, extra, True, True)
    inputs = [cupy.asarray(a.astype(np.float32)) for a in host]
    got = _conv_grad_kernel(cupy, inputs, args)
    assert cudnn_conv.conv_engines()["conv0_grad"] == (cudnn_conv.CUDNN, "")
    want = conv_grad_matmul(cupy, *inputs, args)
    x, w, dy = (cupy.asnumpy(a).astype(np.float64) for a in inputs)
    n, c, m, h, w_, k, group, _ = dims
    # dW sums N*Ho*Wo products of x and dY; dX sums (M/group)*k*k products of W and dY
    dw_terms, dx_terms = dy.size // dy.shape[1 if order == "NCHW" else 3], m // group * k * k
    abs_grads = conv_grad_matmul(np, np.abs(x), np.abs(w), np.abs(dy), args)
    for got_a, want_a, absolute, terms in ((got[0], want[0], abs_grads[0], dw_terms),
                                           (got[-1], want[-1], abs_grads[-1], dx_terms)):
        bound = (2.0 ** -10 + (2 * terms + 2) * 2.0 ** -24) * absolute
        assert np.all(np.abs(cupy.asnumpy(got_a).astype(np.float64) - cupy.asnumpy(want_a)) <= bound)


def test_module_state_is_restored():
    """The fixture leaves the real lookup in place for the other test modules."""
    assert cudnn_conv._is_cupy.__name__ == "_is_cupy" and cudnn_conv._loaded is None
