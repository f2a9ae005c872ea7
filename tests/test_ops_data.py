"""Tests of the tensor, embedding, fill and copy op families.

Conformance: every case of tests/cases/data_ops.py runs on every available array module
(numpy always, cupy behind the ``gpu`` marker) and is compared with an independent
PyTorch CPU reference; its inferred types must match what the kernel produced. Then the
errors, the unknown-shape paths, the cost features and the random fills.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from cases.data_ops import CASES
from conftest import require_cupy, require_torch
from cupy_standin import check_gpu_kernel
from placer.errors import ArgumentError, ShapeError
from placer.ops import registry
from placer.types import Args, TensorType

DEVICES = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


# -- case plumbing ----------------------------------------------------------------------

def make_input(spec: dict, rng: np.random.Generator) -> np.ndarray:
    kind, dtype = spec["kind"], spec["dtype"]
    if kind == "randn":
        return rng.standard_normal(spec["shape"]).astype(dtype)
    if kind == "randint":
        return rng.integers(spec["low"], spec["high"], spec["shape"]).astype(dtype)
    if kind == "fused8bit":
        rows, dim = spec["shape"]
        scale_bias = np.stack([rng.uniform(0.01, 0.5, rows), rng.uniform(-2, 2, rows)], 1).astype(np.float32)
        values = rng.integers(0, 256, (rows, dim)).astype(np.uint8)
        return np.concatenate([values, scale_bias.view(np.uint8)], axis=1)
    return np.asarray(spec["values"], dtype=dtype)


def case_inputs(case: dict) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(case["id"].encode()))
    return [make_input(s, rng) for s in case["inputs"]]


def case_args(case: dict, seed: int = 0) -> Args:
    return Args(case["args"], op=f"#3 {case['op']} -> 'y'", seed=seed, n_outputs=case.get("n_outputs"))


def array_module(name: str):
    if name == "numpy":
        return np
    import cupy
    return cupy


def to_host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def type_of(x: np.ndarray) -> TensorType:
    return TensorType(x.shape, str(x.dtype))


# -- independent references (PyTorch CPU) --------------------------------------------------

def _axis(case, ndim_out):
    args = case["args"]
    if "axis" in args:
        return args["axis"] % ndim_out
    return 1 if args.get("order", "NCHW") == "NCHW" else 3


def ref_concat(torch, xs, case):
    if case["args"].get("add_axis"):
        out = torch.stack(xs, dim=_axis(case, xs[0].dim() + 1))
        return [out, torch.ones(len(xs), dtype=torch.int32)]
    ax = _axis(case, xs[0].dim())
    return [torch.cat(xs, dim=ax), torch.tensor([x.shape[ax] for x in xs], dtype=torch.int32)]


def ref_split(torch, xs, case):
    x, ax = xs[0], _axis(case, xs[0].dim())
    if case["args"].get("add_axis"):
        return list(torch.unbind(x, dim=ax))
    if len(xs) == 2:
        return list(torch.split(x, xs[1].tolist(), dim=ax))
    if "split" in case["args"]:
        return list(torch.split(x, case["args"]["split"], dim=ax))
    return list(torch.chunk(x, case["n_outputs"], dim=ax))


def ref_reshape(torch, xs, case):
    old_dtype = torch.int64 if len(xs) == 1 else xs[1].dtype
    return [torch.reshape(xs[0], case["target"]), torch.tensor(list(xs[0].shape), dtype=old_dtype)]


def ref_flatten(torch, xs, case):
    axis = case["args"].get("axis", 1)
    return [xs[0].reshape(math.prod(xs[0].shape[:axis]), -1)]


def ref_transpose(torch, xs, case):
    axes = case["args"].get("axes") or list(reversed(range(xs[0].dim())))
    return [xs[0].permute(*axes)]


def ref_squeeze(torch, xs, case):
    return [torch.squeeze(xs[0], dim=tuple(case["args"]["dims"]))]


def ref_expand_dims(torch, xs, case):
    x = xs[0]
    for d in sorted(case["args"]["dims"]):
        x = torch.unsqueeze(x, d)
    return [x]


def ref_gather(torch, xs, case):
    data, idx = xs[0], xs[1].long()
    ax = case["args"].get("axis", 0)
    picked = torch.index_select(data, ax, idx.reshape(-1))
    return [picked.reshape(data.shape[:ax] + idx.shape + data.shape[ax + 1:])]


def ref_channel_shuffle(torch, xs, case):
    g, x = case["args"]["group"], xs[0]
    if case["args"].get("order", "NCHW") == "NHWC":
        return [torch.nn.functional.channel_shuffle(x.permute(0, 3, 1, 2), g).permute(0, 2, 3, 1)]
    return [torch.nn.functional.channel_shuffle(x, g)]


def ref_tile(torch, xs, case):
    """tiles and axis from the extra inputs when given, else from the arguments."""
    tiles = int(xs[1][0]) if len(xs) > 1 else case["args"]["tiles"]
    axis = int(xs[2][0]) if len(xs) > 2 else case["args"].get("axis", 0)
    reps = [1] * xs[0].dim()
    reps[axis] = tiles
    return [xs[0].repeat(*reps)]


def _embedding_bag(torch, table, indices, lengths, mode, weights=None):
    """torch's embedding_bag over 2-D views; offsets are the starts of the bags."""
    flat = table.reshape(table.shape[0], -1)
    if flat.dtype == torch.float16:
        flat = flat.float()
        weights = None if weights is None else weights.float()
    offsets = torch.cumsum(lengths.long(), 0) - lengths.long()
    out = torch.nn.functional.embedding_bag(indices.long(), flat, offsets, mode=mode,
                                            per_sample_weights=weights)
    return out.reshape((lengths.shape[0],) + tuple(table.shape[1:]))


def _dequantized(torch, fused):
    """float rows of a fused 8-bit table, decoded with torch's own byte view."""
    scale_bias = fused[:, -8:].contiguous().view(torch.float32)
    return fused[:, :-8].float() * scale_bias[:, 0:1] + scale_bias[:, 1:2]


def ref_lengths(torch, xs, mode):
    data, lengths = xs
    return [_embedding_bag(torch, data, torch.arange(data.shape[0]), lengths, mode)]


def _segment_lengths(torch, case, xs):
    """LENGTHS as given, or counted from sorted SEGMENT_IDS (ids 0..last)."""
    if case["op"].startswith("Lengths"):
        return xs[1].long()
    ids = xs[1].long()
    return torch.bincount(ids, minlength=int(ids[-1]) + 1)


def ref_segment(torch, xs, case, reduce):
    """torch.segment_reduce, with 0 for an empty segment (Caffe2's convention)."""
    lengths = _segment_lengths(torch, case, xs)
    out = torch.segment_reduce(xs[0], reduce, lengths=lengths)
    out[lengths == 0] = 0
    return [out]


def ref_segment_logsumexp(torch, xs, case, mean=False):
    lengths = _segment_lengths(torch, case, xs)
    rows, start = [], 0
    for n in lengths.tolist():
        part = xs[0][start:start + n]
        rows.append(torch.zeros(xs[0].shape[1:]) if n == 0 else
                    torch.logsumexp(part, 0) - (math.log(n) if mean else 0.0))
        start += n
    return [torch.stack(rows)]


def ref_fill(torch, xs, case):
    """The fill's documented shape and value, built with torch."""
    args = case["args"]
    if case["op"] == "ConstantFill":
        if args.get("input_as_shape"):
            shape = xs[0].tolist()
        elif xs:
            shape = list(xs[0].shape) + args.get("extra_shape", [])
        else:
            shape = args["shape"]
        dtypes = {2: torch.int32, 5: torch.bool, 10: torch.int64, 1: torch.float32}
        value = args.get("value", 0.0)
        dtype = dtypes[args["dtype"]] if "dtype" in args else (
            torch.int64 if isinstance(value, int) else torch.float32)
        return [torch.full(shape, value, dtype=dtype)]
    values = args["values"]
    if case["op"] == "GivenTensorByteStringToUInt8Fill":
        t = torch.tensor(list(values[0]), dtype=torch.uint8)
    else:
        dtype = {"GivenTensorFill": torch.float32, "GivenTensorIntFill": torch.int32,
                 "GivenTensorInt64Fill": torch.int64, "GivenTensorDoubleFill": torch.float64,
                 "GivenTensorInt16Fill": torch.int16, "GivenTensorBoolFill": torch.bool}[case["op"]]
        dtype = {10: torch.int64}.get(args.get("dtype"), dtype)
        t = torch.tensor(values, dtype=dtype)
    return [t.reshape(args.get("shape", [len(values)]))]


REFERENCES = {
    "concat": ref_concat,
    "split": ref_split,
    "reshape": ref_reshape,
    "flatten": ref_flatten,
    "flatten_to_vec": lambda torch, xs, case: [torch.flatten(xs[0])],
    "transpose": ref_transpose,
    "resize_like": lambda torch, xs, case: [xs[0].reshape(xs[1].shape)],
    "ranges": lambda torch, xs, case: [torch.stack(
        [torch.cumsum(xs[0], 0) - xs[0], xs[0]], dim=1).to(torch.int32)],
    "squeeze": ref_squeeze,
    "expand_dims": ref_expand_dims,
    "slice": lambda torch, xs, case: [xs[0][case["index"]]],
    "gather": ref_gather,
    "batch_gather": lambda torch, xs, case: [xs[0][:, xs[1].long()]],
    "channel_shuffle": ref_channel_shuffle,
    "shape": lambda torch, xs, case: [torch.tensor(
        [xs[0].shape[a] for a in case["args"].get("axes", range(xs[0].dim()))], dtype=torch.int64)],
    "size": lambda torch, xs, case: [torch.tensor(xs[0].numel(), dtype=torch.int64)],
    "tile": ref_tile,
    "embedding_bag_sum": lambda torch, xs, case: [_embedding_bag(torch, xs[0], xs[1], xs[2], "sum")],
    "embedding_bag_mean": lambda torch, xs, case: [_embedding_bag(torch, xs[0], xs[1], xs[2], "mean")],
    "embedding_bag_weighted": lambda torch, xs, case: [
        _embedding_bag(torch, xs[0], xs[2], xs[3], "sum", weights=xs[1])],
    "fused_sum": lambda torch, xs, case: [
        _embedding_bag(torch, _dequantized(torch, xs[0]), xs[1], xs[2], "sum")],
    "fused_mean": lambda torch, xs, case: [
        _embedding_bag(torch, _dequantized(torch, xs[0]), xs[1], xs[2], "mean")],
    "fused_weighted": lambda torch, xs, case: [
        _embedding_bag(torch, _dequantized(torch, xs[0]), xs[2], xs[3], "sum", weights=xs[1])],
    "lengths_sum": lambda torch, xs, case: ref_lengths(torch, xs, "sum"),
    "lengths_mean": lambda torch, xs, case: ref_lengths(torch, xs, "mean"),
    "segment_sum": lambda torch, xs, case: ref_segment(torch, xs, case, "sum"),
    "segment_mean": lambda torch, xs, case: ref_segment(torch, xs, case, "mean"),
    "segment_max": lambda torch, xs, case: ref_segment(torch, xs, case, "max"),
    "segment_logsumexp": ref_segment_logsumexp,
    "segment_logmeanexp": lambda torch, xs, case: ref_segment_logsumexp(torch, xs, case, mean=True),
    "segment_ids": lambda torch, xs, case: [torch.repeat_interleave(
        torch.arange(xs[0].shape[0], dtype=torch.int32), xs[0].long())],
    "constant_fill": ref_fill,
    "given_fill": ref_fill,
    "identity": lambda torch, xs, case: [xs[0].clone()],
}


def reference(case: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    torch = require_torch()
    xs = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    return [r.numpy() for r in REFERENCES[case["ref"]](torch, xs, case)]


# -- conformance ------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_conformance(case, device):
    xp = array_module(device)
    inputs = case_inputs(case)
    opdef = registry.get(case["op"])
    args = case_args(case)
    outs = [to_host(o) for o in opdef.kernel(xp, [xp.asarray(x) for x in inputs], args)]
    expected = reference(case, inputs)
    assert len(outs) == len(expected)
    tol = case.get("tol", 2e-3 if any(x.dtype == np.float16 for x in inputs) else 1e-5)
    for got, want in zip(outs, expected):
        assert got.shape == want.shape, (got.shape, want.shape)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(got, want)
    # inference agrees with the kernel wherever it can know the type
    types = opdef.infer([type_of(x) for x in inputs], args)
    for t, got in zip(types, outs):
        if t is not None:
            assert t == type_of(got), (t, type_of(got))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_gpu_kernels_keep_to_cupy_rules(case):
    """On the strict cupy stand-in: cupy's names, signatures and ufunc methods, no implicit
    host reads, one explicit one at most, the CPU kernel's outputs, the declared launches."""
    require_cupy()
    opdef = registry.get(case["op"])
    if "gpu" not in opdef.devices:
        pytest.skip("CPU-only op: the planner never places it on a GPU")
    check_gpu_kernel(opdef, case_inputs(case), case_args(case))


@pytest.mark.parametrize("case", [c for c in CASES if c["inputs"]], ids=lambda c: c["id"])
def test_outputs_do_not_share_memory_with_inputs(case):
    """Except Alias, kernels return fresh arrays: a later in-place op must not change them."""
    inputs = case_inputs(case)
    outs = registry.get(case["op"]).kernel(np, inputs, case_args(case))
    shared = any(np.shares_memory(o, x) for o in outs for x in inputs)
    assert shared == (case["op"] == "Alias")


# -- inference: shapes, dtypes, unknowns ---------------------------------------------------

def infer(op_type: str, shapes, args=None, n_outputs=None, dtypes=None):
    types = [TensorType(s, (dtypes or {}).get(i, "float32")) for i, s in enumerate(shapes)]
    return registry.get(op_type).infer(types, Args(args or {}, op=f"#7 {op_type} 'x'", n_outputs=n_outputs))


def test_concat_split_info_and_dlrm_interaction_shapes():
    t, info = infer("Concat", [(512, 64)] * 27, {"axis": 1, "add_axis": 1})
    assert t == TensorType((512, 27, 64)) and info == TensorType((27,), "int32")
    assert infer("Flatten", [(512, 27, 27)], {"axis": 1}) == [TensorType((512, 729))]
    assert infer("BatchGather", [(512, 729), (351,)], dtypes={1: "int32"}) == [TensorType((512, 351))]


def test_reshape_old_shape_and_shape_input():
    assert infer("Reshape", [(2, 3, 4)], {"shape": [0, -1]}) == [
        TensorType((2, 12)), TensorType((3,), "int64")]
    out, old = infer("Reshape", [(2, 3, 4), (2,)], dtypes={1: "int64"})
    assert out is None and old == TensorType((3,), "int64")


@pytest.mark.parametrize("op_type,shapes,args,dtypes", [
    ("Slice", [(4, 4), (2,), (2,)], {}, {1: "int64", 2: "int64"}),
    ("Tile", [(4, 4), (1,)], {}, {1: "int64"}),
    ("ConstantFill", [(2,)], {"input_as_shape": 1}, {0: "int64"}),
    ("XavierFill", [(2,)], {"input_as_shape": 1}, {0: "int64"}),
    ("LengthsToSegmentIds", [(5,)], {}, {0: "int32"}),
    ("SortedSegmentRangeMax", [(5, 3), (5,)], {}, {1: "int32"}),
])
def test_value_dependent_shapes_are_unknown(op_type, shapes, args, dtypes):
    assert infer(op_type, shapes, args, dtypes=dtypes) == [None]


def test_split_needs_the_output_count_only_without_split_argument():
    assert infer("Split", [(4, 6)], {"axis": 1}, n_outputs=3) == [TensorType((4, 2))] * 3
    assert infer("Split", [(4, 6)], {"axis": 1}) == []  # count unknown: outputs left unknown
    assert infer("Split", [(4, 6)], {"axis": 1, "split": [1, 5]}) == [TensorType((4, 1)), TensorType((4, 5))]
    assert infer("Split", [(4, 6), (2,)], {"axis": 1}, n_outputs=2, dtypes={1: "int32"}) == []


def test_embedding_output_types():
    assert infer("SparseLengthsSum", [(1000, 64), (4096,), (512,)], dtypes={1: "int64", 2: "int32"}) == [
        TensorType((512, 64))]
    assert infer("SparseLengthsWeightedSum", [(10, 8), (6,), (6,), (3,)], dtypes={
        0: "float16", 2: "int32", 3: "int32"}) == [TensorType((3, 8), "float32")]
    assert infer("LengthsMean", [(10, 2, 3), (4,)], dtypes={1: "int32"}) == [TensorType((4, 2, 3))]


def test_fill_types():
    assert infer("ConstantFill", [], {"shape": [2, 3], "value": 1}) == [TensorType((2, 3), "int64")]
    assert infer("ConstantFill", [], {"shape": [2], "dtype": 10}) == [TensorType((2,), "int64")]
    assert infer("ConstantFill", [(4, 2)], {"extra_shape": [3]}) == [TensorType((4, 2, 3))]
    assert infer("GivenTensorFill", [], {"values": [1.0, 2.0, 3.0]}) == [TensorType((3,))]
    assert infer("GivenTensorInt64Fill", [], {"shape": [2, 1], "values": [4, 5]}) == [TensorType((2, 1), "int64")]
    assert infer("GivenTensorByteStringToUInt8Fill", [], {"values": [b"abc"]}) == [TensorType((3,), "uint8")]
    assert infer("MSRAFill", [], {"shape": [64, 3, 7, 7]}) == [TensorType((64, 3, 7, 7))]
    assert infer("UniformIntFill", [], {"shape": [5], "min": 0, "max": 3}) == [TensorType((5,), "int32")]


def test_shape_and_size_types():
    assert infer("Shape", [(2, 3, 4)]) == [TensorType((3,), "int64")]
    assert infer("Size", [(2, 3, 4)]) == [TensorType((), "int64")]


# -- errors name the op, the shapes and the misfit -------------------------------------------

@pytest.mark.parametrize("op_type,shapes,args,dtypes,words", [
    ("Concat", [(2, 3, 4), (2, 3, 5)], {"axis": 1}, {}, ["differ off axis 1", "2x3x4, 2x3x5"]),
    ("Concat", [(2, 3), (2, 4)], {"axis": 1, "add_axis": 1}, {}, ["equal shapes"]),
    ("Concat", [(2, 3), (2, 3)], {"axis": 2}, {}, ["axis 2 is out of range"]),
    ("Concat", [(2, 3), (2, 3)], {}, {1: "int64"}, ["dtype"]),
    ("Split", [(4, 6)], {"axis": 1, "split": [2, 2]}, {}, ["do not sum to dimension 6"]),
    ("Split", [(4, 7)], {"axis": 1}, {}, ["7 does not divide into 2"]),
    ("Reshape", [(2, 3, 4)], {"shape": [5, -1]}, {}, ["cannot infer the -1"]),
    ("Reshape", [(2, 3, 4)], {"shape": [-1, -1]}, {}, ["more than one -1"]),
    ("Reshape", [(2, 3, 4)], {"shape": [2, 3]}, {}, ["6 elements, input has 24"]),
    ("Transpose", [(2, 3, 4)], {"axes": [0, 0, 1]}, {}, ["not a permutation"]),
    ("Squeeze", [(2, 3)], {"dims": [1]}, {}, ["dimension 1 has size 3"]),
    ("Squeeze", [(2, 1)], {"dims": [2]}, {}, ["dimension 2 is beyond 2 dimensions"]),
    ("ExpandDims", [(2, 3)], {"dims": [4]}, {}, ["beyond"]),
    ("Slice", [(4, 4)], {"starts": [1, 1], "ends": [3, 3]}, {}, ["only one dimension"]),
    ("Slice", [(4, 4)], {"starts": [3], "ends": [1]}, {}, ["start 3, end 1"]),
    ("Flatten", [(2, 3)], {"axis": 3}, {}, ["axis 3 is out of range"]),
    ("Gather", [(4, 3), (5,)], {}, {}, ["int32 or int64"]),
    ("BatchGather", [(4,), (2,)], {}, {1: "int32"}, ["at least 2 dimensions"]),
    ("ChannelShuffle", [(1, 6, 2, 2)], {"group": 4}, {}, ["6 channels do not divide into 4 groups"]),
    ("SparseLengthsSum", [(10, 4), (5,), (2, 2)], {}, {1: "int32", 2: "int32"}, ["LENGTHS must be a 1-D"]),
    ("SparseLengthsWeightedSum", [(10, 4), (4,), (5,), (2,)], {}, {2: "int32", 3: "int32"},
     ["WEIGHTS", "as long as INDICES"]),
    ("GivenTensorFill", [], {"shape": [2, 2], "values": [1.0, 2.0]}, {}, ["holds 4 values", "has 2"]),
    ("XavierFill", [], {"shape": []}, {}, ["non-zero dimension 0"]),
    ("MSRAFill", [], {"shape": [8]}, {}, ["non-zero dimension 1"]),
])
def test_shape_errors_name_op_and_misfit(op_type, shapes, args, dtypes, words):
    with pytest.raises(ShapeError) as err:
        infer(op_type, shapes, args, n_outputs=2 if op_type == "Split" else None, dtypes=dtypes)
    message = str(err.value)
    assert f"#7 {op_type} 'x'" in message
    for w in words:
        assert w in message


@pytest.mark.parametrize("op_type,shapes,args", [
    ("Concat", [(2, 3)], {"axis": 1, "order": "NCHW"}),
    ("Reshape", [(2, 3), (2,)], {"shape": [3, 2]}),
    ("ConstantFill", [(2, 3)], {"shape": [3, 2]}),
    ("ConstantFill", [], {"extra_shape": [3]}),
    ("ConstantFill", [], {"shape": [1], "dtype": 4}),
    ("Gather", [(4, 3), (2,)], {"match_outer": 1}),
])
def test_argument_errors(op_type, shapes, args):
    dtypes = {1: "int64"}
    with pytest.raises(ArgumentError, match=f"#7 {op_type} 'x'"):
        infer(op_type, shapes, args, dtypes=dtypes)


def run_kernel(op_type, inputs, args=None, n_outputs=None):
    return registry.get(op_type).kernel(np, inputs, Args(args or {}, op=f"#9 {op_type} 'k'",
                                                         n_outputs=n_outputs))


@pytest.mark.parametrize("op_type,inputs,words", [
    ("SparseLengthsSum", [np.ones((5, 2), np.float32), np.array([0, 5], np.int64), np.array([2], np.int32)],
     ["index 5 is out of range for DATA of 5 rows"]),
    ("SparseLengthsSum", [np.ones((5, 2), np.float32), np.array([-1, 0], np.int32), np.array([2], np.int32)],
     ["index -1"]),
    ("SparseLengthsMean", [np.ones((5, 2), np.float32), np.array([0, 1, 2], np.int64), np.array([1, 1], np.int32)],
     ["LENGTHS sum to 2 but there are 3 INDICES"]),
    ("SparseLengthsWeightedSum", [np.ones((5, 2), np.float32), np.ones(2, np.float32),
                                  np.array([0, 1], np.int64), np.array([3, -1], np.int32)], ["negative length"]),
    ("LengthsSum", [np.ones((5, 2), np.float32), np.array([2, 2], np.int32)],
     ["LENGTHS sum to 4 but there are 5 DATA rows"]),
    ("SortedSegmentSum", [np.ones((3, 2), np.float32), np.array([0, 2, 1], np.int32)], ["must be sorted"]),
    ("Gather", [np.ones((4, 2), np.float32), np.array([1, 4], np.int32)], ["index 4 is out of range"]),
    ("Gather", [np.ones((4, 2), np.float32), np.array([-1], np.int64)], ["index -1 is out of range"]),
    ("BatchGather", [np.ones((4, 3), np.float32), np.array([3], np.int64)], ["index 3 is out of range"]),
])
def test_kernel_errors_name_the_op(op_type, inputs, words):
    with pytest.raises(ShapeError) as err:
        run_kernel(op_type, inputs)
    assert f"#9 {op_type} 'k'" in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_gather_wrap_indices_counts_negative_from_the_end():
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    out, = run_kernel("Gather", [data, np.array([-1, 0], np.int64)], {"wrap_indices": 1})
    np.testing.assert_array_equal(out, data[[3, 0]])


def test_split_kernel_without_count_or_sizes_is_a_clear_error():
    with pytest.raises(ArgumentError, match="number of outputs"):
        run_kernel("Split", [np.ones((2, 4), np.float32)], {"axis": 1})


# -- costs ------------------------------------------------------------------------------

def cost(op_type, types, args=None):
    opdef = registry.get(op_type)
    a = Args(args or {}, op="c")
    outs = [t for t in opdef.infer(types, a) if t is not None]
    return opdef.cost(types, outs, a)


def test_sparse_lengths_sum_reads_only_looked_up_rows():
    f = cost("SparseLengthsSum", [TensorType((1_000_000, 64)), TensorType((4096,), "int64"),
                                  TensorType((512,), "int32")])
    assert f.bytes_read == 4096 * 64 * 4 + 4096 * 8 + 512 * 4
    assert f.bytes_written == 512 * 64 * 4
    assert f.flops == 4096 * 64
    w = cost("SparseLengthsWeightedSum", [TensorType((1000, 8)), TensorType((10,)),
                                          TensorType((10,), "int32"), TensorType((4,), "int32")])
    assert w.flops == 2 * 10 * 8 and w.bytes_read == 10 * 8 * 4 + 10 * 4 + 10 * 4 + 4 * 4
    q = cost("SparseLengthsSumFused8BitRowwise", [TensorType((10_000, 72), "uint8"),
                                                  TensorType((100,), "int64"), TensorType((10,), "int32")])
    assert q.bytes_read == 100 * 72 + 100 * 8 + 10 * 4 and q.bytes_written == 10 * 64 * 4


def test_gather_and_fill_costs():
    g = cost("Gather", [TensorType((1_000_000, 16)), TensorType((100,), "int32")])
    assert g.bytes_read == 100 * 16 * 4 + 100 * 4 and g.bytes_written == 100 * 16 * 4 and g.flops == 0
    c = cost("ConstantFill", [], {"shape": [10, 10]})
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, 0, 400)
    x = cost("XavierFill", [], {"shape": [10, 10]})
    assert (x.flops, x.bytes_written) == (100, 400)
    assert cost("Alias", [TensorType((1000,))]).bytes_read == 0
    reshape = cost("Reshape", [TensorType((10, 10)), TensorType((2,), "int64")])  # output unknown
    assert reshape.bytes_read == reshape.bytes_written == 400
    split = cost("Split", [TensorType((10, 10))], {"axis": 1})  # output count unknown
    assert split.bytes_read == split.bytes_written == 400
    assert cost("Copy", [TensorType((1000,))]).bytes_written == 4000


# -- devices ----------------------------------------------------------------------------

def test_devices_follow_caffe2_kernels():
    both = frozenset({"cpu", "gpu"})
    assert registry.get("LengthsToSegmentIds").devices == frozenset({"cpu"})
    assert registry.get("LengthsToRanges").devices == frozenset({"cpu"})
    assert registry.get("SortedSegmentRangeMax").devices == frozenset({"cpu"})
    assert registry.get("SparseLengthsSumFused8BitRowwise").devices == frozenset({"cpu"})
    assert registry.get("SortedSegmentRangeLogMeanExp").devices == frozenset({"cpu", "gpu"})
    for op_type in ("SparseLengthsSum", "SparseLengthsMean", "SparseLengthsWeightedSum", "LengthsSum",
                    "Gather", "BatchGather", "Concat", "ConstantFill", "XavierFill", "CopyGPUToCPU"):
        assert registry.get(op_type).devices == both, op_type


RANDOM_FILLS = {"XavierFill", "MSRAFill", "GaussianFill", "UniformFill", "UniformIntFill"}


def test_every_op_of_the_families_has_conformance_cases():
    """Random fills are checked by statistics instead (below)."""
    families = {"placer.ops.tensor", "placer.ops.embedding", "placer.ops.fill", "placer.ops.copy"}
    ours = {t for t in registry.all_types() if registry.get(t).infer.__module__ in families}
    assert ours - RANDOM_FILLS - {c["op"] for c in CASES} == set()


def test_every_op_of_the_family_has_a_kernel_and_doc():
    families = {"placer.ops.tensor", "placer.ops.embedding", "placer.ops.fill", "placer.ops.copy"}
    ours = [registry.get(t) for t in registry.all_types()
            if registry.get(t).infer.__module__ in families]
    assert len(ours) >= 40
    assert all(d.kernel is not None and d.doc for d in ours)


# -- SparseLengthsSum: larger random checks of both reduction paths -------------------------

@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_sparse_lengths_sum_many_empty_segments(dtype):
    torch = require_torch()
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 4, 300).astype(np.int32)
    lengths[:5] = 0
    lengths[-5:] = 0
    table = rng.standard_normal((500, 16)).astype(dtype)
    indices = rng.integers(0, 500, int(lengths.sum())).astype(np.int32)
    out, = run_kernel("SparseLengthsSum", [table, indices, lengths])
    offsets = torch.from_numpy(np.cumsum(lengths) - lengths).long()
    want = torch.nn.functional.embedding_bag(torch.from_numpy(indices).long(),
                                             torch.from_numpy(table.astype(np.float32)), offsets, mode="sum")
    np.testing.assert_allclose(out, want.numpy(), rtol=2e-3, atol=2e-3)
    assert not out[lengths == 0].any()


# -- random fills -----------------------------------------------------------------------

def fill(op_type, args, seed):
    return run_kernel(op_type, [], args)[0] if seed is None else registry.get(op_type).kernel(
        np, [], Args(args, op="f", seed=seed))[0]


@pytest.mark.parametrize("op_type,args", [
    ("XavierFill", {"shape": [64, 32]}), ("MSRAFill", {"shape": [16, 8, 3, 3]}),
    ("GaussianFill", {"shape": [100], "mean": 1.0, "std": 2.0}), ("UniformFill", {"shape": [7, 3]}),
    ("UniformIntFill", {"shape": [50], "min": -2, "max": 2}),
])
def test_random_fills_are_reproducible_per_seed(op_type, args):
    a, b, c = fill(op_type, args, 11), fill(op_type, args, 11), fill(op_type, args, 12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == tuple(args["shape"])


def test_xavier_fill_is_uniform_within_sqrt_3_over_fan_in():
    w = fill("XavierFill", {"shape": [200, 50, 2]}, 1)  # fan_in = 100
    scale = math.sqrt(3 / 100)
    assert w.dtype == np.float32 and np.abs(w).max() <= scale
    assert np.abs(w).max() > 0.99 * scale
    assert abs(w.std() - scale / math.sqrt(3)) < 0.02 * scale


def test_msra_fill_is_normal_with_std_sqrt_2_over_fan_out():
    w = fill("MSRAFill", {"shape": [64, 32, 3, 3]}, 2)  # fan_out = 64 * 9
    std = math.sqrt(2 / (64 * 9))
    assert w.dtype == np.float32
    assert abs(w.std() - std) < 0.03 * std and abs(w.mean()) < 0.05 * std
    assert np.abs(w).max() > 3 * std  # a normal, not a uniform, distribution


def test_gaussian_uniform_and_int_fill_statistics():
    g = fill("GaussianFill", {"shape": [20000], "mean": 3.0, "std": 0.5}, 3)
    assert abs(g.mean() - 3.0) < 0.02 and abs(g.std() - 0.5) < 0.02
    u = fill("UniformFill", {"shape": [20000], "min": -2.0, "max": 6.0}, 4)
    assert u.min() >= -2.0 and u.max() < 6.0 and abs(u.mean() - 2.0) < 0.1
    i = fill("UniformIntFill", {"shape": [2000], "min": 3, "max": 5}, 5)
    assert i.dtype == np.int32 and set(np.unique(i)) == {3, 4, 5}


def test_random_fill_takes_shape_from_input():
    out, = registry.get("GaussianFill").kernel(np, [np.zeros((3, 2), np.float32)],
                                               Args({"extra_shape": [4]}, op="f", seed=1))
    assert out.shape == (3, 2, 4)


def test_byte_string_fill_keeps_non_utf8_bytes_and_utf8_text():
    out, = run_kernel("GivenTensorByteStringToUInt8Fill", [], {"values": [b"\xff\x00\xc3"]})
    np.testing.assert_array_equal(out, [255, 0, 195])
    out, = run_kernel("GivenTensorByteStringToUInt8Fill", [], {"values": ["é"]})
    np.testing.assert_array_equal(out, [0xC3, 0xA9])


def test_alias_returns_its_input_and_copy_a_new_array():
    x = np.arange(3.0)
    assert run_kernel("Alias", [x])[0] is x
    y, = run_kernel("Copy", [x])
    assert y is not x and np.array_equal(y, x)


# -- a corpus net made of these ops, end to end ---------------------------------------------

@pytest.mark.corpus
def test_glow_gather_net_infers_and_runs(corpus):
    """Shape -> Gather(shape, index from the init net) -> Reshape(data, gathered shape): the
    Reshape's output is unknown before running (its shape is a blob's values) and right after."""
    from placer import shapes
    from placer.formats import load_net
    from placer.runtime.executor import Executor
    path = corpus / "caffe2" / "glow_gather_const_fold.pbtxt"
    net = load_net(path, init_path=corpus / "caffe2" / "glow_gather_const_fold_init.pbtxt")
    typed = shapes.infer(net, {"data": TensorType((2, 3, 4, 5))})
    assert typed.blobs["shape_x"] == TensorType((4,), "int64")
    assert typed.blobs["gather_x"] == TensorType((4,), "int64")
    assert typed.blobs["result"] is None and "result" in typed.missing
    executor = Executor(net)
    executor.run_init()
    data = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    result = executor.run({"data": data})["result"]
    np.testing.assert_array_equal(result, data.reshape(2, 4, 5, 3))  # index [0, 2, 3, 1] of the dims


@pytest.mark.gpu
@pytest.mark.parametrize("op_type", sorted(RANDOM_FILLS))
def test_random_fills_give_the_same_values_on_the_gpu(op_type):
    import cupy
    args = Args({"shape": [8, 4], "min": 0, "max": 9}, op="f", seed=21)
    on_gpu, = registry.get(op_type).kernel(cupy, [], args)
    assert isinstance(on_gpu, cupy.ndarray)
    np.testing.assert_array_equal(on_gpu.get(), registry.get(op_type).kernel(np, [], args)[0])


@pytest.mark.corpus
def test_glow_fused_8bit_net_runs(corpus):
    """The init net's byte string decodes to a 3 x (2 + 8) table; the sums are checked
    against scale * value + bias decoded here with struct."""
    import struct
    from placer.formats import load_net
    from placer.runtime.executor import Executor
    path = corpus / "caffe2" / "glow_fused_rowwise_quantized_sparse_lengths_sum_predict_net.pbtxt"
    net = load_net(path, init_path=str(path).replace("predict", "init"))
    executor = Executor(net)
    params = executor.run_init()
    table = np.asarray(params["data"])
    assert table.shape == (3, 10) and table.dtype == np.uint8
    rows = [[q * struct.unpack("<f", bytes(r[2:6]))[0] + struct.unpack("<f", bytes(r[6:10]))[0]
             for q in r[:2]] for r in table.tolist()]
    result = executor.run({"indices": np.array([2, 0, 1, 2], np.int64),
                           "lengths": np.array([1, 3], np.int32)})["result"]
    want = [rows[2], [a + b + c for a, b, c in zip(rows[0], rows[1], rows[2])]]
    np.testing.assert_allclose(result, want, rtol=1e-6)
