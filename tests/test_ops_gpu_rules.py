"""GPU kernels against cupy's rules, on the strict stand-in (tests/cupy_standin.py).

The per-family test modules run every conformance case through ``check_gpu_kernel``; this
module checks that no GPU op is left out, runs the ops whose cases live elsewhere (random
fills, training-mode Dropout, EnforceFinite), checks the segment reductions where cupy's
own primitives would lose precision or read the whole table, and checks the stand-in
itself: each rule must fail loudly, or the per-family tests prove nothing.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import test_cluster
import test_collectives_ops
import test_ops_data
import test_ops_dense
import test_ops_detection
import test_ops_control
import test_ops_detection_boxes
import test_ops_detection_proposals
import test_ops_gradients
import test_ops_half
import test_ops_layout
import test_ops_logical
import test_ops_optimizers
import test_ops_resize
import test_ops_roi
import test_ops_spatial
import test_ops_transformer
import test_ops_reduce
from conftest import require_cupy
from cupy_standin import CupyRuleError, StrictCupy, check_gpu_kernel, run_strict
from placer.ops import registry
from placer.types import Args


@pytest.fixture(autouse=True)
def _cupy_api():
    require_cupy()


# Ops with GPU kernels whose cases live in this module, not in a family's case list.
EXTRA_CASES = [
    ("XavierFill", [], {"shape": [16, 8]}),
    ("MSRAFill", [], {"shape": [4, 2, 3, 3]}),
    ("GaussianFill", [], {"shape": [50], "mean": 1.0, "std": 2.0}),
    ("UniformFill", [], {"shape": [7, 3], "min": -1.0, "max": 2.0}),
    ("UniformIntFill", [], {"shape": [20], "min": 0, "max": 5}),
    ("EnforceFinite", [np.ones((3, 4), np.float32)], {}),
    ("SortedSegmentRangeMean", [np.arange(24, dtype=np.float32).reshape(8, 3),
                                np.array([0, 0, 2, 2, 2, 3, 5, 5], np.int64)], {}),
]


def covered_op_types() -> set[str]:
    """Op types some strict-run case exercises, over every family's case list."""
    ops = {c["op"] for c in test_ops_data.CASES + test_ops_dense.CASES + test_ops_spatial.CASES
           + test_ops_gradients.CASES + test_ops_optimizers.ALL}
    ops |= {c[0] for c in test_ops_detection.KERNEL_CASES} | {c[0] for c in test_ops_resize.CASES}
    ops |= {c[0] for c in test_ops_detection_proposals.KERNEL_CASES}
    ops |= {c[0] for c in test_ops_control.KERNEL_CASES} | {"If"}    # If runs its branch's kernels
    ops |= {c[0] for c in test_ops_roi.KERNEL_CASES} | {c[0] for c in test_ops_detection_boxes.KERNEL_CASES}
    ops |= {c[0] for c in test_ops_transformer.KERNEL_CASES} | {c[0] for c in test_ops_reduce.KERNEL_CASES}
    ops |= {c[0] for c in test_ops_half.KERNEL_CASES + test_ops_layout.KERNEL_CASES + test_ops_logical.KERNEL_CASES}
    ops |= set(test_collectives_ops.STRICT_CHECKED + test_collectives_ops.GLOO_CHECKED)
    ops |= {"CreateCommonWorld", "CloneCommonWorld"}     # host blobs only (test_collectives_ops)
    ops |= set(test_cluster.STRICT_CHECKED)             # SendTensor, ReceiveTensor
    return ops | {c[0] for c in EXTRA_CASES} | {"Dropout"}


def test_every_gpu_op_runs_on_the_strict_stand_in():
    """A new op registered for the GPU needs a case that runs through ``check_gpu_kernel``
    (add it to its family's case list, or to EXTRA_CASES)."""
    gpu_ops = {t for t in registry.all_types() if "gpu" in registry.get(t).devices}
    assert gpu_ops - covered_op_types() == set()


@pytest.mark.parametrize("op_type,inputs,args", EXTRA_CASES, ids=[c[0] for c in EXTRA_CASES])
def test_other_gpu_kernels_keep_to_cupy_rules(op_type, inputs, args):
    check_gpu_kernel(registry.get(op_type), inputs, Args(args, op=f"#1 {op_type}", seed=5))


# -- Dropout in training: one generator per op, float32 draws on the device --------------------

def test_dropout_draws_float32_from_one_generator_per_op():
    kernel = registry.get("Dropout").kernel
    x = np.ones((64, 32), np.float32)
    xp = StrictCupy()
    args = Args({"ratio": 0.3}, op="#2 Dropout", seed=11)
    first = kernel(xp, [xp.wrap(x)], args)[1]._a.copy()
    second = kernel(xp, [xp.wrap(x)], args)[1]._a.copy()
    assert xp.ledger.draws == ["float32", "float32"]
    assert not np.array_equal(first, second)          # the generator advanced: a new mask
    again = kernel(xp, [xp.wrap(x)], Args({"ratio": 0.3}, op="#2 Dropout", seed=11))[1]._a
    np.testing.assert_array_equal(again, first)       # same seed, new op: same first mask
    assert abs(first.mean() - 0.7) < 0.03


def test_dropout_training_on_the_stand_in_matches_its_declared_launches():
    run = run_strict(registry.get("Dropout").kernel, [np.ones((8, 8), np.float32)],
                     Args({"ratio": 0.5}, op="#2 Dropout", seed=3))
    y, mask = run.outputs
    np.testing.assert_array_equal(y, np.where(mask, 2.0, 0.0).astype(np.float32))
    assert run.syncs == [] and run.launches == registry.get("Dropout").launch_count([], Args({}))


# -- segment reductions on the GPU path -----------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_segment_sums_keep_float32_precision_over_a_million_rows(dtype):
    """Per-segment sums, not differences of a running sum over all rows (cupy's
    add.reduceat, which the stand-in reproduces): 125k segments of 8 positive values."""
    rng = np.random.default_rng(zlib.crc32(dtype.encode()))
    data = rng.uniform(0, 1, (1_000_000, 2)).astype(dtype)
    lengths = np.full(125_000, 8, np.int32)
    run = run_strict(registry.get("LengthsSum").kernel, [data, lengths], Args(op="#3 LengthsSum"))
    want = data.astype(np.float64).reshape(125_000, 8, 2).sum(axis=1)
    rel = np.abs(run.outputs[0] - want) / want
    assert run.outputs[0].dtype == np.float32 and rel.max() < 1e-5


def test_the_stand_in_reproduces_cupys_reduceat_error():
    """Proof that the test above can fail: add.reduceat on the stand-in loses ~1e-2."""
    xp = StrictCupy()
    data = np.random.default_rng(0).uniform(0, 1, (1_000_000, 1)).astype(np.float32)
    starts = np.arange(0, 1_000_000, 8)
    got = xp.add.reduceat(xp.wrap(data), xp.wrap(starts), axis=0)._a
    want = data.astype(np.float64).reshape(-1, 8, 1).sum(axis=1)
    assert (np.abs(got - want) / want).max() > 1e-3


@pytest.mark.parametrize("op_type", ["SparseLengthsSum", "SparseLengthsMean", "SparseLengthsWeightedSum"])
def test_lookups_make_no_array_as_large_as_the_table(op_type):
    """The GPU path reads the looked-up rows only: no copy, no transposition of the table."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((200_000, 16)).astype(np.float32)
    indices = rng.integers(0, 200_000, 256).astype(np.int64)
    lengths = np.full(32, 8, np.int32)
    inputs = [table, indices, lengths]
    if op_type == "SparseLengthsWeightedSum":
        inputs.insert(1, rng.standard_normal(256).astype(np.float32))
    run = check_gpu_kernel(registry.get(op_type), inputs, Args(op=f"#4 {op_type}"))
    assert run.largest <= 256 * 16


def test_sorted_segment_ranges_read_the_device_once_and_refuse_unsorted_ids():
    kernel = registry.get("SortedSegmentRangeLogMeanExp").kernel
    data = np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32)
    run = run_strict(kernel, [data, np.array([0, 0, 1, 3, 3, 3], np.int32)], Args(op="#5 s"))
    assert len(run.syncs) == 1 and run.outputs[0].shape == (4, 3)
    assert not run.outputs[0][2].any()            # id 2 has no rows
    with pytest.raises(Exception, match="must be sorted"):
        run_strict(kernel, [data, np.array([0, 2, 1, 3, 3, 3], np.int32)], Args(op="#5 s"))


# -- the stand-in's rules fail loudly ------------------------------------------------------

@pytest.fixture
def xp():
    return StrictCupy()


def test_ufunc_methods_cupy_lacks_are_refused(xp):
    x = xp.wrap(np.arange(6.0).reshape(3, 2))
    idx = xp.wrap(np.array([0, 2]))
    with pytest.raises(CupyRuleError, match="maximum.reduceat"):
        xp.maximum.reduceat(x, idx, axis=0)
    with pytest.raises(CupyRuleError, match="maximum.reduce "):
        xp.maximum.reduce(x, axis=0)
    with pytest.raises(CupyRuleError, match="accumulate"):
        xp.maximum.accumulate(x, axis=0)
    with pytest.raises(CupyRuleError, match="multiply.at"):
        xp.multiply.at(x, idx, x[:2])
    with pytest.raises(CupyRuleError, match="float16"):
        xp.maximum.at(x.astype(xp.float16), idx, x[:2].astype(xp.float16))
    with pytest.raises(CupyRuleError, match="int64"):
        xp.add.at(xp.wrap(np.zeros(3, np.int64)), idx, xp.wrap(np.ones(2, np.int64)))
    xp.add.at(x, idx, x[:2])                   # cupy has these
    xp.add.reduce(x, axis=0)
    xp.add.reduceat(x, idx, axis=0)


def test_keywords_cupy_does_not_take_are_refused(xp):
    x = xp.wrap(np.arange(4.0))
    with pytest.raises(CupyRuleError, match="where"):
        xp.add(x, x, where=x > 1)
    with pytest.raises(CupyRuleError, match="clip"):
        xp.clip(x, min=0.0, max=1.0)           # numpy 2 spelling; cupy's is a_min, a_max
    with pytest.raises(CupyRuleError, match="max"):
        x.max(initial=0.0)
    with pytest.raises(CupyRuleError, match="sum"):
        xp.sum(x, where=x > 1)
    xp.clip(x, 0.0, 1.0)


@pytest.mark.parametrize("convert", [
    lambda x: x.item(), lambda x: float(x), lambda x: int(x), lambda x: bool(x > 0),
    lambda x: np.asarray(x), lambda x: list(iter(x)), lambda x: f"{x}", lambda x: range(x),
    lambda x: np.sum(x),
], ids=["item", "float", "int", "bool", "np.asarray", "iter", "format", "index", "numpy-func"])
def test_implicit_host_conversions_are_refused(xp, convert):
    with pytest.raises(CupyRuleError):
        convert(xp.wrap(np.array(3)))


def test_host_arrays_in_device_functions_are_refused(xp):
    x = xp.wrap(np.arange(3.0))
    with pytest.raises(CupyRuleError, match="host"):
        x + np.ones(3)
    with pytest.raises(CupyRuleError, match="host"):
        xp.concatenate([x, np.ones(3)])
    xp.asarray(np.ones(3))                     # moving host data to the device is fine


def test_syncs_and_launches_are_counted(xp):
    x = xp.wrap(np.arange(12.0).reshape(3, 4))
    xp.ledger.reset()
    x.reshape(4, 3), x[1:], x.T                # views: no launch
    assert xp.ledger.launches == 0
    y = x + 1
    y += x
    x.sum(), x.copy(), xp.take(x, xp.wrap(np.array([0])), axis=0), xp.zeros(3), xp.empty(3)
    assert xp.ledger.launches == 6 and xp.ledger.syncs == []
    x.tolist(), x[x > 3], xp.bincount(xp.wrap(np.array([1, 2]))), xp.where(x > 3)
    assert xp.ledger.syncs == ["tolist", "boolean mask indexing", "bincount", "where"]


def test_names_cupy_lacks_are_refused(xp):
    with pytest.raises(AttributeError, match="cupy has no"):
        xp.ediff1d_not_there
    with pytest.raises(AttributeError, match="cupy.ndarray has no"):
        xp.wrap(np.ones(2)).setflags
    with pytest.raises(CupyRuleError, match="global generator"):
        xp.random.random_sample(3)
    with pytest.raises(AttributeError, match="no method 'normal'"):
        xp.random.default_rng(0).normal(size=3)   # cupy's Generator has no normal()
