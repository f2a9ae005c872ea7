"""Gradient ops against real Caffe2's own operators, torch autograd, and their costs.

Every case of tests/cases/gradients.py runs once through Caffe2 (one subprocess for the
module); placer's kernel must give the same outputs on numpy and through the cupy
stand-in (numpy restricted to the names cupy has), and keep to cupy's rules on the strict
stand-in (tests/cupy_standin.py). Cases that name a ``torch`` reference are also checked
against torch autograd on the raw inputs.
"""
from __future__ import annotations

import json
import textwrap
from functools import lru_cache

import numpy as np
import pytest

from caffe2_oracle import run_caffe2
from cases.gradients import CASES as GRADIENT_CASES, FORWARD_CASES
from cases.oracle_runner import assert_close, case_args, case_inputs, run_in_caffe2
from conftest import CupyNames, require_cupy, require_torch
from cupy_standin import check_gpu_kernel, run_strict
from placer.errors import PlacerError
from placer.ops import registry
from placer.types import Args, TensorType

CASES = GRADIENT_CASES + FORWARD_CASES
IDS = [c["id"] for c in CASES]


@lru_cache(maxsize=1)
def oracle():
    return run_in_caffe2(CASES)


def run_kernel(case, xp=np):
    inputs = case_inputs(case)
    outs = registry.get(case["op"]).kernel(xp, inputs, case_args(case))
    return inputs, [np.asarray(o) for o in outs]


@pytest.mark.caffe2
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_matches_caffe2(case):
    results, errors = oracle()
    assert case["id"] not in errors, f"Caffe2 refused the case: {errors.get(case['id'])}"
    _, outs = run_kernel(case)
    want = results[case["id"]]
    assert len(outs) == len(want)
    for k, (got, ref) in enumerate(zip(outs, want)):
        assert str(got.dtype) == str(ref.dtype), (k, got.dtype, ref.dtype)
        assert_close(got, ref, case, f"{case['id']} output {k}")


@pytest.mark.gpu
@pytest.mark.caffe2
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cupy_kernel_matches_caffe2(case):
    import cupy
    results, errors = oracle()
    assert case["id"] not in errors, errors.get(case["id"])
    inputs = case_inputs(case)
    if case.get("mutex"):
        inputs = [np.zeros((), np.uint8) if x is None else x for x in inputs]
    outs = registry.get(case["op"]).kernel(cupy, [cupy.asarray(x) for x in inputs], case_args(case))
    for k, (got, ref) in enumerate(zip(outs, results[case["id"]])):
        assert_close(cupy.asnumpy(got), ref, case, f"{case['id']} output {k} on the GPU")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernel_uses_only_names_cupy_has(case):
    cupy = pytest.importorskip("cupy")
    _, outs = run_kernel(case, CupyNames(np, cupy))
    _, want = run_kernel(case)
    for got, ref in zip(outs, want):
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gpu_kernels_keep_to_cupy_rules(case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    opdef = registry.get(case["op"])
    if "gpu" not in opdef.devices:
        pytest.skip("CPU-only op: the planner never places it on a GPU")
    check_gpu_kernel(opdef, case_inputs(case), case_args(case))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_infer_agrees_with_kernel_and_inputs_stay_unchanged(case):
    inputs = case_inputs(case)
    before = [x.copy() for x in inputs]
    opdef = registry.get(case["op"])
    opdef.check_arity(len(inputs), case["id"])
    outs = opdef.kernel(np, inputs, case_args(case))
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in inputs], case_args(case))
    assert len(outs) == case["n_outputs"]
    for got, t in zip(outs, types):
        if t is not None:
            assert (tuple(got.shape), str(got.dtype)) == (t.shape, t.dtype)
    for x, was in zip(inputs, before):
        np.testing.assert_array_equal(x, was)
        assert not any(np.shares_memory(x, o) for o in outs)
    known = [t for t in types if t is not None]
    features = opdef.cost([TensorType(x.shape, str(x.dtype)) for x in inputs], known, case_args(case))
    assert features.bytes_written + features.bytes_read > 0


# ---------------------------------------------------------------- torch autograd
def _grads(torch, fn, leaves, dy):
    """d(sum(fn(leaves) * dy)) / d(leaves) with torch autograd."""
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in leaves]
    out = fn(*ts)
    (out * torch.tensor(dy, dtype=torch.float64)).sum().backward()
    return [t.grad.numpy() for t in ts]


def _conv_args(case):
    a = case["args"]
    pads = a.get("pads") or [a.get("pad", 0)] * 4
    return dict(stride=a.get("stride", 1), dilation=a.get("dilation", 1), groups=a.get("group", 1)), pads


def torch_reference(case, inputs):
    """What torch autograd says the op's outputs are (float64, compared at float32 tolerance)."""
    torch = require_torch()
    f = torch.nn.functional
    name, a = case["torch"], case["args"]
    if name == "fc":
        x, w, dy = inputs
        axis = a.get("axis", 1)
        lead = x.shape[:axis]
        dx, dw = _grads(torch, lambda x_, w_: x_.reshape(int(np.prod(lead)), -1) @ w_.T, [x, w],
                        dy.reshape(-1, w.shape[0]))
        return [dw, dy.reshape(-1, w.shape[0]).sum(0), dx.reshape(x.shape)]
    if name in ("add", "sub", "mul", "div"):
        dc, x, y = inputs[:3]
        if a.get("broadcast"):   # the old rule: B aligned to the end of A
            y_view = lambda t: t.reshape((1,) * (x.ndim - y.ndim) + y.shape)
        else:
            y_view = lambda t: t
        op = {"add": lambda p, q: p + y_view(q), "sub": lambda p, q: p - y_view(q),
              "mul": lambda p, q: p * y_view(q), "div": lambda p, q: p / y_view(q)}[name]
        return _grads(torch, op, [x, y], dc)
    if name == "swl":
        x, label = inputs[0], inputs[1]
        weight = inputs[2] if len(inputs) == 5 else np.ones(x.shape[0], np.float32)
        dl = float(inputs[-1])

        def loss(x_):
            ce = f.cross_entropy(x_, torch.tensor(label).long(), reduction="none")
            w = torch.tensor(weight, dtype=torch.float64)
            return (ce * w).sum() / w.sum() * a.get("scale", 1.0)
        return _grads(torch, loss, [x], dl)
    if name == "sxe":
        dy, x, t = inputs
        loss = lambda x_: f.binary_cross_entropy_with_logits(
            x_, torch.tensor(t, dtype=torch.float64), reduction="none").mean(-1)
        return _grads(torch, loss, [x], dy)
    if name == "conv":
        x, w, dy = inputs
        kw, pads = _conv_args(case)
        fn = lambda x_, w_: f.conv2d(f.pad(x_, (pads[1], pads[3], pads[0], pads[2])), w_, **kw)
        dx, dw = _grads(torch, fn, [x, w], dy)
        return [dw, dy.sum(axis=(0, 2, 3)), dx]
    if name in ("maxpool", "avgpool"):
        x, _, dy = inputs
        k, s, p = a["kernel"], a.get("stride", 1), a.get("pad", 0)
        fn = (lambda x_: f.max_pool2d(x_, k, s, p)) if name == "maxpool" else \
            (lambda x_: f.avg_pool2d(x_, k, s, p, count_include_pad=bool(a.get("count_include_pad", 0))))
        return _grads(torch, fn, [x], dy)
    if name == "bn":
        x, scale, dy = inputs[:3]
        fn = lambda x_, s_: f.batch_norm(x_, None, None, s_, None, training=True, eps=a.get("epsilon", 1e-5))
        dx, ds = _grads(torch, fn, [x, scale], dy)
        return [dx, ds, dy.sum(axis=(0, 2, 3))]
    if name == "lrn":
        x, _, dy = inputs
        fn = lambda x_: f.local_response_norm(x_, a["size"], a["alpha"], a["beta"], a.get("bias", 1.0))
        return _grads(torch, fn, [x], dy)
    raise ValueError(name)


TORCH_CASES = [c for c in CASES if "torch" in c]


@pytest.mark.torch
@pytest.mark.parametrize("case", TORCH_CASES, ids=[c["id"] for c in TORCH_CASES])
def test_kernel_matches_torch_autograd(case):
    inputs, outs = run_kernel(case)
    want = torch_reference(case, inputs)
    for k, (got, ref) in enumerate(zip(outs, want)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=f"{case['id']} output {k}")


# ---------------------------------------------------------------- costs
def features(op, shapes, args=None):
    args = Args(args or {})
    types = [TensorType(s) for s in shapes]
    opdef = registry.get(op)
    return opdef.cost(types, opdef.infer(types, args), args)


def test_fc_gradient_costs_twice_the_forward():
    fwd = features("FC", [(64, 9216), (4096, 9216), (4096,)])
    grad = features("FCGradient", [(64, 9216), (4096, 9216), (64, 4096)])
    assert grad.macs == 2 * fwd.macs == 2 * 64 * 9216 * 4096
    assert grad.flops == 2 * grad.macs + 64 * 4096
    no_dx = registry.get("FCGradient").cost(
        [TensorType((64, 9216)), TensorType((4096, 9216)), TensorType((64, 4096))],
        [TensorType((4096, 9216)), TensorType((4096,))], Args({}))
    assert no_dx.macs == fwd.macs


def test_conv_gradient_costs_twice_the_forward():
    args = {"kernel": 3, "pad": 1}
    fwd = features("Conv", [(8, 64, 56, 56), (128, 64, 3, 3), (128,)], args)
    grad = features("ConvGradient", [(8, 64, 56, 56), (128, 64, 3, 3), (8, 128, 56, 56)], args)
    assert grad.macs == 2 * fwd.macs == 2 * 8 * 128 * 56 * 56 * 64 * 9
    assert grad.flops == 2 * grad.macs + 8 * 128 * 56 * 56
    no_dx = features("ConvGradient", [(8, 64, 56, 56), (128, 64, 3, 3), (8, 128, 56, 56)],
                     {**args, "no_gradient_to_input": 1})
    assert no_dx.macs == fwd.macs


def test_sparse_gradient_costs_scale_with_rows_looked_up():
    one = registry.get("SparseLengthsIndicesInGradientSumGradient")
    types = lambda k: [TensorType((32, 64)), TensorType((32,), "int32"), TensorType((k,), "int64")]
    a, b = (one.cost(types(k), one.infer(types(k), Args({})), Args({})) for k in (100, 400))
    assert b.bytes_written == 4 * a.bytes_written == 4 * 100 * 64 * 4


def test_pool_and_bn_gradient_costs():
    f = features("MaxPoolGradient", [(2, 3, 8, 8), (2, 3, 4, 4), (2, 3, 4, 4)], {"kernel": 2, "stride": 2})
    assert f.flops == 2 * 2 * 3 * 4 * 4 * 4
    assert f.bytes_written == 4 * 2 * 3 * 8 * 8
    bn = features("SpatialBNGradient", [(2, 3, 4, 4), (3,), (2, 3, 4, 4), (3,), (3,)])
    assert bn.flops == 8 * 96 and bn.bytes_written == 4 * (96 + 3 + 3)


# ---------------------------------------------------------------- completeness
TRAINING_FAMILIES = {"gradients_dense", "gradients_activation", "gradients_loss", "gradients_spatial",
                     "gradients_sparse", "gradients_segment", "gradients_tensor", "optimizers", "learning_rate"}
# Gradient op types Caffe2 writes for registered forward ops that placer does not have yet.
NOT_YET = {"NormalizeGradient",   # placer's Normalize is the SSD fork's layer, not Caffe2's op
           # forward ops added for ONNX input (ops/reduce.py) whose gradient ops are not written yet
           "ReduceMeanGradient", "ReduceSumGradient", "ReduceMaxGradient", "ReduceMinGradient",
           "ReduceL1Gradient", "ReduceL2Gradient", "HardSigmoidGradient", "ErfGradient"}
# Forward ops whose gradient maker needs particular outputs or arguments to run.
# (inputs, outputs, arguments); SpatialBN's running mean and var are written in place.
MAKER_SHAPES = {"SoftmaxWithLoss": (2, 2, {}), "SpatialBN": (5, 5, {"is_test": 0}),
                "Dropout": (1, 2, {"is_test": 0}), "Cast": (1, 1, {"to": 1, "from_type": 1}),
                "LRN": (1, 2, {"size": 3}), "Concat": (3, 2, {}), "Split": (1, 2, {"axis": 1}),
                "Reshape": (1, 2, {"shape": [2, -1]}), "Conv": (3, 1, {"kernel": 3}),
                "ConvTranspose": (3, 1, {"kernel": 3})}


def _oracle_gradient_types(forward_types):
    script = """
        spec, out = json.loads(SPEC), {}
        for t in spec["types"]:
            s = workspace.C.OpSchema.get(t)
            if s is None:
                continue
            n_in = min(s.max_input, 6) if s.max_input < 100 else max(s.min_input, 1)
            n_out = min(s.max_output, 6) if s.max_output < 100 else max(s.min_output, 1)
            n_in, n_out, args = spec["shapes"].get(t, [n_in, n_out, {}])
            outs = ["o%d" % k for k in range(n_out)]
            if t == "SpatialBN":
                outs[1:3] = ["i3", "i4"]
            op = core.CreateOperator(t, ["i%d" % k for k in range(n_in)], outs, **args)
            try:
                ops, _ = core.GradientRegistry.GetGradientForOp(op, ["o%d_grad" % k for k in range(n_out)])
                out[t] = [g.type for g in ops]
            except Exception:
                out[t] = None        # no gradient (NO_GRADIENT / SHOULD_NOT_DO_GRADIENT)
        save_json(out)
    """
    spec = json.dumps({"types": forward_types, "shapes": MAKER_SHAPES})
    return run_caffe2(f"SPEC = {json.dumps(spec)}\n" + textwrap.dedent(script))[1]


@pytest.mark.caffe2
def test_every_gradient_op_caffe2_writes_for_a_registered_op_is_registered():
    forward = [t for t in registry.all_types()     # (asking for AtomicIter's gradient crashes Caffe2)
               if registry.get(t).kernel.__module__.rsplit(".", 1)[-1] not in TRAINING_FAMILIES]
    written = _oracle_gradient_types(forward)
    needed = {g for ops in written.values() if ops for g in ops}
    missing = sorted(needed - set(registry.all_types()) - NOT_YET)
    assert not missing, f"Caffe2 writes these gradient ops for registered forward ops: {missing}"
    assert NOT_YET <= needed                   # the list shrinks as ops are added
    assert {"ConvGradient", "FCGradient", "SpatialBNGradient", "DropoutGrad", "AddGradient",
            "SparseLengthsIndicesInGradientSumGradient", "SoftmaxWithLossGradient"} <= needed


def test_every_training_op_has_a_conformance_case():
    from cases.optimizers import CASES as OPT, LR_CASES
    ours = {t for t in registry.all_types()
            if registry.get(t).kernel.__module__.rsplit(".", 1)[-1] in TRAINING_FAMILIES}
    covered = {c["op"] for c in CASES + OPT + LR_CASES} | {"CreateMutex"}   # made by the AtomicIter case
    assert ours - covered == set(), sorted(ours - covered)


# ---------------------------------------------------------------- bad values, on both paths
BAD_VALUES = [
    ("SortedSegmentRangeMeanGradient", [np.ones((3, 2), np.float32), np.ones((3, 2), np.float32),
                                        np.ones((3, 2), np.float32), np.array([0, 2, 1], np.int32)], "must be sorted"),
    ("SortedSegmentRangeLogMeanExpGradient", [np.ones((3, 2), np.float32), np.ones((2, 2), np.float32),
                                              np.ones((2, 2), np.float32), np.array([0, 1, 2], np.int64)],
     r"must lie in 0\.\.1"),
    ("SparseLengthsIndicesInGradientSumGradient", [np.ones((2, 3), np.float32), np.array([2, 2], np.int32),
                                                   np.array([0, 1, 2], np.int64)], "sum to 4"),
    ("LengthsIndicesInGradientMeanGradient", [np.ones((2, 3), np.float32), np.array([4, -1], np.int32),
                                              np.ones((3, 3), np.float32)], "negative length"),
    ("SparseToDense", [np.array([0, 5], np.int64), np.ones((2, 2), np.float32), np.ones((5, 2), np.float32)],
     "index 5 is out of range for 5 rows"),
    ("BatchGatherGradient", [np.ones((2, 3), np.float32), np.array([3], np.int64), np.ones((2, 1), np.float32)],
     "index 3 is out of range"),
]


@pytest.mark.parametrize("op_type,inputs,words", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_index_values_are_input_errors_on_both_paths(op_type, inputs, words):
    """The checks that read values back (once) refuse what Caffe2's kernels assume away."""
    kernel = registry.get(op_type).kernel
    with pytest.raises(PlacerError, match=words):
        kernel(np, inputs, Args(op=f"#9 {op_type}"))
    require_cupy()
    with pytest.raises(PlacerError, match=words):
        run_strict(kernel, inputs, Args(op=f"#9 {op_type}"))
