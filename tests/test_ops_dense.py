"""Dense, elementwise and loss ops against PyTorch's CPU build, on every device.

The cases are data (tests/cases/dense.py); each names a reference below, written with
torch so that it shares no code with the kernels. Caffe2's old broadcast rule is
reproduced in the references by reshaping B explicitly before torch broadcasts.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cases.dense import CASES, SHAPE_ERRORS
from conftest import require_cupy, require_torch
from cupy_standin import check_gpu_kernel
from placer.errors import ArgumentError, InputError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

IDS = [c["id"] for c in CASES]


# ---------------------------------------------------------------- inputs
def make_input(spec: dict, rng: np.random.Generator) -> np.ndarray:
    kind, dtype = spec["kind"], spec["dtype"]
    if kind == "given":
        return np.array(spec["values"], dtype=dtype)
    shape = spec["shape"]
    if kind == "randn":
        return (rng.standard_normal(shape) * spec["scale"]).astype(dtype)
    if kind == "uniform":
        return rng.uniform(spec["low"], spec["high"], shape).astype(dtype)
    if kind == "randint":
        return rng.integers(spec["low"], spec["high"], shape).astype(dtype)
    if kind == "nonzero_int":
        return (rng.integers(1, 10, shape) * rng.choice([-1, 1], shape)).astype(dtype)
    if kind == "prob_rows":
        p = rng.uniform(0.05, 1, shape)
        return (p / p.sum(axis=-1, keepdims=True)).astype(dtype)
    raise ValueError(kind)


def case_inputs(case) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(case["id"].encode()))
    return [make_input(s, rng) for s in case["inputs"]]


def case_args(case) -> Args:
    return Args(case["args"], op=f"#0 {case['op']} '{case['id']}'", seed=7, n_outputs=case.get("n_outputs"))


# ---------------------------------------------------------------- references (torch)
def _legacy_b(a, b, args):
    """B reshaped so that torch broadcasting equals Caffe2's broadcast=1/axis rule."""
    if not args.get("broadcast"):
        return b
    axis = "NCHW".index(args["axis_str"]) if "axis_str" in args else args.get("axis", -1)
    if axis == -1:
        axis = a.dim() - b.dim()
    return b.reshape([1] * axis + list(b.shape) + [1] * (a.dim() - axis - b.dim()))


def _fc(t, x, w, b, args, transposed=False):
    axis = args.get("axis", 1) % x.dim()
    lead = x.shape[:axis]
    x2 = x.reshape(int(np.prod(lead)), -1)
    w2 = w.reshape(x2.shape[1], -1).T if transposed else w.reshape(-1, x2.shape[1])
    return [t.nn.functional.linear(x2, w2, b).reshape(*lead, -1)]


def _matmul(t, a, b, args):
    a2 = a.reshape(int(np.prod(a.shape[:args.get("axis_a", 1)])), -1)
    b2 = b.reshape(int(np.prod(b.shape[:args.get("axis_b", 1)])), -1)
    return [t.matmul(a2.T if args.get("trans_a") else a2, b2.T if args.get("trans_b") else b2)]


def _bmm(t, a, b, args):
    if args.get("trans_a") and a.dim() > 1:
        a = a.transpose(-1, -2)
    if args.get("trans_b") and b.dim() > 1:
        b = b.transpose(-1, -2)
    return [t.matmul(a, b)]


def _swl(t, x, label, *w, args):
    x2 = x.reshape(x.shape[0], -1)
    ce = t.nn.functional.cross_entropy(x2, label.reshape(-1).long(), reduction="none")
    weight = w[0] if w else t.ones_like(ce)
    loss = (ce * weight).sum() / weight.sum() * args.get("scale", 1.0)
    return [t.softmax(x2, dim=1).reshape(x.shape), loss]


def _swl_prob(t, x, p, args):
    return [t.softmax(x, 1), t.nn.functional.cross_entropy(x, p, reduction="mean")]


def _swl_spatial(t, x, label, *w, args):
    ce = t.nn.functional.cross_entropy(x, label.long(), ignore_index=-1, reduction="none")
    weight = (w[0] if w else t.ones_like(ce)) * (label != -1)
    return [t.softmax(x, 1), (ce * weight).sum() / weight.sum()]


def _accuracy(t, x, label, args):
    top = t.topk(x, args.get("top_k", 1), dim=1).indices
    return [(top == label.reshape(-1, 1).long()).any(dim=1).float().mean()]


def _softmax(t, x, args):
    axis = args.get("axis", 1) % x.dim()
    return [t.softmax(x.reshape(int(np.prod(x.shape[:axis])), -1), dim=1).reshape(x.shape)]


def _sxe_value(t, x, y, args):
    logsig, log1m = t.nn.functional.logsigmoid(x), t.nn.functional.logsigmoid(-x)
    if args.get("log_D_trick"):
        return (2 * y - 1) * logsig
    if args.get("unjoined_lr_loss"):
        return y * x + (1 - y) * log1m
    return -t.nn.functional.binary_cross_entropy_with_logits(x, y, reduction="none")


def _prelu_nhwc(t, x, s, args):
    return [t.nn.functional.prelu(x.permute(0, 3, 1, 2), s).permute(0, 2, 3, 1)]


def _cast(t, x, args):
    names = {1: t.float32, 2: t.int32, 5: t.bool, 10: t.int64, 13: t.float64, "INT64": t.int64}
    return [x.to(names[args["to"]])]


REFS = {
    "fc": lambda t, x, w, b, args: _fc(t, x, w, b, args),
    "fc_t": lambda t, x, w, b, args: _fc(t, x, w, b, args, transposed=True),
    "matmul": _matmul,
    "bmm": _bmm,
    "add": lambda t, a, b, args: [a + _legacy_b(a, b, args)],
    "sub": lambda t, a, b, args: [a - _legacy_b(a, b, args)],
    "mul": lambda t, a, b, args: [a * _legacy_b(a, b, args)],
    "div": lambda t, a, b, args: [a / _legacy_b(a, b, args)],
    "div_trunc": lambda t, a, b, args: [t.div(a, b, rounding_mode="trunc")],
    "pow_arg": lambda t, x, args: [t.pow(x, args["exponent"])],
    "pow": lambda t, a, b, args: [t.pow(a, b)],
    "sum": lambda t, *xs, args: [sum(xs[1:], xs[0].clone())],
    "max": lambda t, *xs, args: [t.stack(xs).amax(0)],
    "min": lambda t, *xs, args: [t.stack(xs).amin(0)],
    "mean_n": lambda t, *xs, args: [t.stack(xs).mean(0)],
    "swish": lambda t, x, args: [t.nn.functional.silu(x)],
    "softsign": lambda t, x, args: [t.nn.functional.softsign(x)],
    "thresholded_relu": lambda t, x, args: [t.where(x > args.get("alpha", 1.0), x, t.zeros_like(x))],
    "reciprocal": lambda t, x, args: [t.reciprocal(x)],
    "rsqrt": lambda t, x, args: [t.rsqrt(x)],
    "cos": lambda t, x, args: [t.cos(x)],
    "sin": lambda t, x, args: [t.sin(x)],
    "relu": lambda t, x, args: [t.relu(x)],
    "leaky_relu": lambda t, x, args: [t.nn.functional.leaky_relu(x, args.get("alpha", 0.01))],
    "sigmoid": lambda t, x, args: [t.sigmoid(x)],
    "tanh": lambda t, x, args: [t.tanh(x)],
    "exp": lambda t, x, args: [t.exp(x)],
    "log": lambda t, x, args: [t.log(x)],
    "sqrt": lambda t, x, args: [t.sqrt(x)],
    "sqr": lambda t, x, args: [t.square(x)],
    "abs": lambda t, x, args: [t.abs(x)],
    "negative": lambda t, x, args: [t.neg(x)],
    "scale": lambda t, x, args: [x * args.get("scale", 1.0)],
    "clip": lambda t, x, args: [t.clamp(x, args.get("min"), args.get("max"))],
    "elu": lambda t, x, args: [t.nn.functional.elu(x, args.get("alpha", 1.0))],
    "softplus": lambda t, x, args: [t.nn.functional.softplus(x, threshold=1e9)],
    "logit": lambda t, x, args: [t.logit(x, eps=args.get("eps", 1e-6))],
    "replace_nan": lambda t, x, args: [t.nan_to_num(x, nan=args.get("value", 0.0))],
    "prelu": lambda t, x, s, args: [t.nn.functional.prelu(x, s)],
    "prelu_nhwc": _prelu_nhwc,
    "identity": lambda t, x, args: [x.clone()],
    "cast": _cast,
    "softmax": _softmax,
    "swl": _swl,
    "swl_prob": _swl_prob,
    "swl_spatial": _swl_spatial,
    "lce": lambda t, x, label, args: [-t.log(x.gather(1, label.reshape(-1, 1).long())).reshape(-1)],
    "sxe": lambda t, x, y, args: [-_sxe_value(t, x, y, args).mean(-1)],
    "sxe_log_d": lambda t, x, y, args: [-_sxe_value(t, x, y, args).mean(-1)],
    "sxe_unjoined": lambda t, x, y, args: [-_sxe_value(t, x, y, args).mean(-1)],
    "mean": lambda t, x, args: [x.mean()],
    "accuracy": _accuracy,
    "sq_l2": lambda t, x, y, args: [0.5 * ((x - y) ** 2).reshape(x.shape[0], -1).sum(1)],
    "two_class": lambda t, x, args: [t.stack([1 - x, x], dim=-1)],
}


def expected(case, inputs) -> list[np.ndarray]:
    torch = require_torch()
    tensors = [torch.from_numpy(x.copy()) for x in inputs]
    with torch.no_grad():
        outs = REFS[case["ref"]](torch, *tensors, args=case["args"])
    return [o.numpy() for o in outs]


# ---------------------------------------------------------------- conformance
def run_kernel(case, xp, to_host):
    inputs = case_inputs(case)
    opdef = registry.get(case["op"])
    outs = opdef.kernel(xp, [xp.asarray(x) for x in inputs], case_args(case))
    return inputs, [to_host(o) for o in outs]


def check_against_reference(case, inputs, outs):
    want = expected(case, inputs)
    tol = case.get("tol", 1e-5)
    assert len(outs) >= len(want)
    for got, ref in zip(outs, want):
        assert got.shape == ref.shape, (got.shape, ref.shape)
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
        if got.dtype.kind in "biu":
            np.testing.assert_array_equal(got, ref)
        else:
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numpy_kernel_matches_torch(case):
    inputs, outs = run_kernel(case, np, np.asarray)
    check_against_reference(case, inputs, outs)


@pytest.mark.gpu
@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cupy_kernel_matches_torch(case):
    import cupy
    inputs, outs = run_kernel(case, cupy, cupy.asnumpy)
    check_against_reference(case, inputs, outs)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_kernel_keeps_to_cupy_rules(case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    check_gpu_kernel(registry.get(case["op"]), case_inputs(case), case_args(case))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_infer_agrees_with_kernel(case):
    """Shape and dtype inference predicts what the kernel makes, output by output."""
    inputs, outs = run_kernel(case, np, np.asarray)
    opdef = registry.get(case["op"])
    opdef.check_arity(len(inputs), case["id"])
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in inputs], case_args(case))
    n = case.get("n_outputs") or len(types)
    assert len(outs) >= n
    for got, t in zip(outs[:n], types[:n]):
        assert (got.shape, str(got.dtype)) == (t.shape, t.dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_leaves_inputs_alone(case):
    """Outputs are fresh arrays: in-place nets (output named like an input) stay correct."""
    inputs = case_inputs(case)
    before = [x.copy() for x in inputs]
    outs = registry.get(case["op"]).kernel(np, inputs, case_args(case))
    for x, was in zip(inputs, before):
        np.testing.assert_array_equal(x, was)
        assert not any(np.shares_memory(x, o) for o in outs)


def test_every_family_op_has_cases():
    families = {"fc", "elementwise", "loss"}
    ours = {t for t in registry.all_types()
            if registry.get(t).kernel is not None
            and registry.get(t).kernel.__module__.rsplit(".", 1)[-1] in families}
    covered = {c["op"] for c in CASES}
    assert ours - covered <= {"EnforceFinite"}, sorted(ours - covered)


# ---------------------------------------------------------------- behaviour beyond the reference
def test_fc_keeps_float32_and_does_not_copy_weights():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8), dtype=np.float32)
    w = rng.standard_normal((5, 8), dtype=np.float32)
    b = np.zeros(5, np.float32)
    (y,) = registry.get("FC").kernel(np, [x, w, b], Args({}))
    assert y.dtype == np.float32 and y.flags.c_contiguous
    assert np.shares_memory(w.reshape(-1, 8).T, w)


def test_sigmoid_keeps_relative_precision_for_tiny_values():
    x = np.array([-80.0, -60.0, -30.0, -10.0], np.float32)
    (y,) = registry.get("Sigmoid").kernel(np, [x], Args({}))
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(y, exact, rtol=1e-6)


def test_dropout_training_keeps_about_one_minus_ratio_and_rescales():
    x = np.ones((200, 100), np.float32)
    y, mask = registry.get("Dropout").kernel(np, [x], Args({"ratio": 0.25}, seed=3))
    assert mask.dtype == bool and abs(mask.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[mask], 1 / 0.75, rtol=1e-6)
    assert (y[~mask] == 0).all()


def test_softmax_with_loss_zero_weights_gives_zero_loss():
    x = np.zeros((2, 3), np.float32)
    _, loss = registry.get("SoftmaxWithLoss").kernel(
        np, [x, np.array([0, 1], np.int32), np.zeros(2, np.float32)], Args({}))
    assert loss.shape == () and float(loss) == 0.0


def test_label_out_of_range_is_an_input_error():
    with pytest.raises(InputError, match="outside 0..2"):
        registry.get("SoftmaxWithLoss").kernel(
            np, [np.zeros((2, 3), np.float32), np.array([0, 3], np.int32)], Args({}, op="#5 loss"))


def test_enforce_finite():
    kernel = registry.get("EnforceFinite").kernel
    assert kernel(np, [np.ones(3, np.float32)], Args({})) == ()
    with pytest.raises(InputError, match="#2 EnforceFinite"):
        kernel(np, [np.array([1.0, np.inf], np.float32)], Args({}, op="#2 EnforceFinite"))


def test_cast_rejects_unknown_type():
    with pytest.raises(ArgumentError, match="to=99"):
        registry.get("Cast").infer([TensorType((2,))], Args({"to": 99}, op="#1 Cast"))


def test_bad_axis_names_the_argument():
    with pytest.raises(ArgumentError, match="'axis' = 3"):
        registry.get("FC").infer([TensorType((2, 3)), TensorType((4, 3)), TensorType((4,))],
                                 Args({"axis": 3}, op="#1 FC"))


@pytest.mark.parametrize("name,op,args,shapes,needles", SHAPE_ERRORS, ids=[e[0] for e in SHAPE_ERRORS])
def test_shape_errors_name_op_inputs_and_misfit(name, op, args, shapes, needles):
    label = f"#4 {op} '{name}'"
    with pytest.raises(ShapeError) as err:
        types = [TensorType(*s) if isinstance(s[-1], str) else TensorType(s) for s in shapes]
        registry.get(op).infer(types, Args(args, op=label))
    message = str(err.value)
    for needle in [label] + needles:
        assert needle in message, message


# ---------------------------------------------------------------- costs
def features(op, shapes, args=None, dtypes=None):
    args = Args(args or {})
    types = [TensorType(s, d) for s, d in zip(shapes, dtypes or ["float32"] * len(shapes))]
    opdef = registry.get(op)
    return opdef.cost(types, opdef.infer(types, args), args)


def test_fc_cost_alexnet_fc6():
    f = features("FC", [(1, 9216), (4096, 9216), (4096,)])
    assert f.macs == 37_748_736
    assert f.flops == 2 * 37_748_736 + 4096
    assert f.bytes_read == 4 * (9216 + 4096 * 9216 + 4096)
    assert f.bytes_written == 4 * 4096


def test_fc_cost_with_axis2():
    f = features("FC", [(2, 3, 4, 5), (7, 20), (7,)], {"axis": 2})
    assert f.macs == 6 * 20 * 7 and f.flops == 2 * 840 + 42


def test_matmul_and_batch_matmul_costs():
    assert features("MatMul", [(4, 3), (5, 4)], {"trans_a": 1, "trans_b": 1}).macs == 3 * 4 * 5
    f = features("BatchMatMul", [(8, 6, 16), (8, 6, 16)], {"trans_b": 1})
    assert f.macs == 8 * 6 * 6 * 16 and f.flops == 2 * 4608
    assert features("BatchMatMul", [(2, 1, 3, 4), (5, 4, 6)], {"broadcast": 1}).macs == 2 * 5 * 3 * 6 * 4


def test_elementwise_and_movement_costs():
    f = features("Add", [(2, 3, 4, 5), (3, 4)], {"broadcast": 1, "axis": 1})
    assert (f.flops, f.macs, f.bytes_read, f.bytes_written) == (120, 0, 4 * 132, 4 * 120)
    assert features("Sum", [(10,), (10,), (10,)]).flops == 20
    assert features("Relu", [(1, 64, 56, 56)]).flops == 64 * 56 * 56
    cast = features("Cast", [(4, 6)], {"to": 10})
    assert (cast.flops, cast.bytes_read, cast.bytes_written) == (0, 96, 192)
    drop = features("Dropout", [(4, 6)], {"is_test": 1})
    assert (drop.flops, drop.bytes_read, drop.bytes_written) == (0, 96, 96)
    assert features("Softmax", [(2, 1000)]).flops == 4 * 2000
