"""Optimizer ops and LearningRate against real Caffe2's own operators, plus costs.

Every case of tests/cases/optimizers.py runs once through Caffe2 (one subprocess for the
module), in place where Caffe2 requires it; placer's kernel must give the same arrays on
numpy and through the cupy stand-in, and keep to cupy's rules on the strict stand-in
(tests/cupy_standin.py). Momentum SGD and Adagrad are also checked against torch.optim,
which states the same updates in other terms.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest

from caffe2_oracle import run_caffe2
from cases.optimizers import CASES, LR_CASES
from cases.oracle_runner import assert_close, case_args, case_inputs, run_in_caffe2
from conftest import CupyNames, require_cupy, require_torch
from cupy_standin import DeviceArray, StrictCupy, check_gpu_kernel, run_strict
from placer.errors import ArgumentError, InputError
from placer.ops import registry
from placer.ops.optimizers import ENFORCED_INPLACE, INDICES_AT, round_launches
from placer.types import Args, TensorType

ALL = CASES + LR_CASES
IDS = [c["id"] for c in ALL]


@lru_cache(maxsize=1)
def oracle():
    return run_in_caffe2(ALL)


def run_kernel(case, xp=np):
    inputs = case_inputs(case)
    if case.get("mutex"):
        inputs = [registry.get("CreateMutex").kernel(xp, [], Args({}))[0] if x is None else x for x in inputs]
    outs = registry.get(case["op"]).kernel(xp, inputs, case_args(case))
    return inputs, [np.asarray(o) for o in outs]


@pytest.mark.caffe2
@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_kernel_matches_caffe2(case):
    results, errors = oracle()
    assert case["id"] not in errors, f"Caffe2 refused the case: {errors.get(case['id'])}"
    _, outs = run_kernel(case)
    want = results[case["id"]]
    assert len(outs) == len(want)
    for k, (got, ref) in enumerate(zip(outs, want)):
        assert (got.shape, str(got.dtype)) == (ref.shape, str(ref.dtype)), (k, got.shape, ref.shape)
        assert_close(got, ref, case, f"{case['id']} output {k}")


@pytest.mark.gpu
@pytest.mark.caffe2
@pytest.mark.parametrize("case", ALL, ids=IDS)
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


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_kernel_uses_only_names_cupy_has(case):
    cupy = pytest.importorskip("cupy")
    _, outs = run_kernel(case, CupyNames(np, cupy))
    _, want = run_kernel(case)
    for got, ref in zip(outs, want):
        np.testing.assert_array_equal(got, ref)


def as_run_on_a_gpu(opdef, case):
    """``opdef`` as a GPU runs it: the inputs Caffe2 reads from host memory whatever the
    device (``OpDef.host_inputs``: iteration counters) reach the kernel as host arrays, and its
    launches are the declared count (unique indices: one round) plus one round's launches
    for every further time the most repeated index is listed."""
    host = opdef.host_inputs

    def kernel(xp, inputs, args):
        return opdef.kernel(xp, [x._a if i in host and isinstance(x, DeviceArray) else x   # the host copy
                                 for i, x in enumerate(inputs)], args)
    extra = 0
    if opdef.type in INDICES_AT:
        repeats = Counter(case_inputs(case)[INDICES_AT[opdef.type]].reshape(-1).tolist())
        extra = (max(repeats.values()) - 1) * round_launches(opdef.type, case_args(case))
    return replace(opdef, kernel=kernel, launches=lambda inputs, args: opdef.launch_count(inputs, args) + extra)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_gpu_kernels_keep_to_cupy_rules(case):
    """On the strict cupy stand-in (tests/cupy_standin.py): see ``check_gpu_kernel``."""
    require_cupy()
    opdef = registry.get(case["op"])
    if "gpu" not in opdef.devices:
        pytest.skip("CPU-only op: the planner never places it on a GPU")
    check_gpu_kernel(as_run_on_a_gpu(opdef, case), case_inputs(case), case_args(case))


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_infer_cost_and_fresh_outputs(case):
    inputs, _ = run_kernel(case)
    before = [x.copy() for x in inputs]
    opdef = registry.get(case["op"])
    opdef.check_arity(len(inputs), case["id"])
    outs = opdef.kernel(np, inputs, case_args(case))
    types = opdef.infer([TensorType(x.shape, str(x.dtype)) for x in inputs], case_args(case))
    assert len(outs) == len(types) == case["n_outputs"]
    for got, t in zip(outs, types):
        assert (tuple(got.shape), str(got.dtype)) == (t.shape, t.dtype)
    for x, was in zip(inputs, before):          # in place is the executor's job, not the kernel's
        np.testing.assert_array_equal(x, was)
        assert not any(np.shares_memory(x, o) for o in outs)
    assert opdef.cost([TensorType(x.shape, str(x.dtype)) for x in inputs], types, case_args(case)).bytes_written > 0


@pytest.mark.caffe2
def test_inplace_pairs_are_the_ones_caffe2_enforces():
    _, enforced = run_caffe2("""
        out = {}
        for t in %r:
            s = workspace.C.OpSchema.get(t)
            out[t] = [[i, o] for i in range(min(s.max_input, 8)) for o in range(min(s.max_output, 8))
                      if s.inplace_enforced(i, o)]
        save_json(out)
    """ % sorted(ENFORCED_INPLACE))
    assert {t: [list(p) for p in pairs] for t, pairs in ENFORCED_INPLACE.items()} == enforced
    for case in CASES:                          # and every case runs in Caffe2 that way
        for i, o in ENFORCED_INPLACE.get(case["op"], ()):
            assert case["inplace"].get(i) == o, case["id"]


# ---------------------------------------------------------------- torch.optim
def test_momentum_sgd_matches_torch_sgd():
    torch = require_torch()
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(7).astype(np.float32) for _ in range(3))
    lr, mu = 0.1, 0.9
    for nesterov in (False, True):
        _, new_m, new_p = registry.get("MomentumSGDUpdate").kernel(
            np, [g, m, np.array([lr], np.float32), p], Args({"momentum": mu, "nesterov": int(nesterov)}))
        param = torch.nn.Parameter(torch.tensor(p, dtype=torch.float64))
        opt = torch.optim.SGD([param], lr=lr, momentum=mu, nesterov=nesterov)
        opt.state[param]["momentum_buffer"] = torch.tensor(m / lr, dtype=torch.float64)
        param.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        np.testing.assert_allclose(new_p, param.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_m, opt.state[param]["momentum_buffer"].numpy() * lr, rtol=1e-5, atol=1e-6)


def test_adagrad_matches_torch_adagrad():
    torch = require_torch()
    rng = np.random.default_rng(1)
    p, g = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    h = rng.uniform(0, 1, 6).astype(np.float32)
    new_p, new_h = registry.get("Adagrad").kernel(np, [p, h, g, np.array([-0.1], np.float32)],
                                                  Args({"epsilon": 1e-6}, n_outputs=2))
    param = torch.nn.Parameter(torch.tensor(p, dtype=torch.float64))
    opt = torch.optim.Adagrad([param], lr=0.1, eps=1e-6)
    opt.state[param]["sum"] = torch.tensor(h, dtype=torch.float64)
    param.grad = torch.tensor(g, dtype=torch.float64)
    opt.step()
    np.testing.assert_allclose(new_p, param.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_h, opt.state[param]["sum"].numpy(), rtol=1e-5)


# ---------------------------------------------------------------- behaviour and errors
def test_learning_rate_is_a_0d_float32_and_unknown_policy_is_an_argument_error():
    lr = registry.get("LearningRate")
    assert lr.infer([TensorType((1,), "int64")], Args({"base_lr": 0.1, "policy": "fixed"})) == [TensorType((), "float32")]
    with pytest.raises(ArgumentError, match="multistep"):
        lr.infer([TensorType((1,), "int64")], Args({"base_lr": 0.1, "policy": "multistep"}, op="#3 LearningRate"))


def test_mutex_and_counters_live_on_the_cpu():
    for op in ("CreateMutex", "AtomicIter", "Iter", "RowWiseSparseAdam"):
        assert registry.get(op).devices == {"cpu"}, op
    for op in ("Adam", "SparseAdagrad", "MomentumSGDUpdate", "WeightedSum", "LearningRate", "ScatterWeightedSum"):
        assert registry.get(op).devices == {"cpu", "gpu"}, op


# ---------------------------------------------------------------- costs
def _cost(op, shapes, dtypes, args=None):
    types = [TensorType(s, d) for s, d in zip(shapes, dtypes)]
    opdef = registry.get(op)
    args = Args(args or {}, n_outputs=None)
    return opdef.cost(types, opdef.infer(types, args), args)


def test_sparse_update_bytes_scale_with_rows_touched_not_table_size():
    def sparse_adagrad(rows_in_table, k):
        return _cost("SparseAdagrad", [(rows_in_table, 64), (rows_in_table, 64), (k,), (k, 64), (1,)],
                     ["float32", "float32", "int64", "float32", "float32"])
    small, big_table, more_rows = sparse_adagrad(1000, 100), sparse_adagrad(1_000_000, 100), sparse_adagrad(1000, 400)
    assert small.bytes_read == big_table.bytes_read and small.bytes_written == big_table.bytes_written
    assert small.bytes_written == 100 * 64 * 4 * 2                  # param and moment rows
    assert small.bytes_read == 100 * 64 * 4 * 3 + 100 * 8 + 4       # grad, param, moment rows, indices, lr
    assert more_rows.bytes_written == 4 * small.bytes_written
    rowwise = _cost("RowWiseSparseAdagrad", [(1000, 64), (1000,), (100,), (100, 64), (1,)],
                    ["float32", "float32", "int64", "float32", "float32"])
    assert rowwise.bytes_written == 100 * 64 * 4 + 100 * 4


def test_dense_update_costs():
    adam = _cost("Adam", [(1000,)] * 4 + [(1,), (1,)], ["float32"] * 5 + ["int64"])
    assert adam.flops == 10 * 1000 and adam.bytes_written == 3 * 4000
    assert adam.bytes_read == 4 * 4000 + 4 + 8
    ws = _cost("WeightedSum", [(10,), (1,), (10,), (1,)], ["float32"] * 4)
    assert ws.flops == 30 and ws.bytes_written == 40


# ---------------------------------------------------------------- the scatter helpers (brute force)
def test_checked_rounds_sums_by_id_and_row_adds_match_python_loops():
    from placer.ops.scatter import checked_rounds
    from placer.ops.segments import add_rows_at, id_counts, sum_by_id
    rng = np.random.default_rng(3)
    for trial in range(20):
        idx = rng.integers(0, 7, rng.integers(0, 30)).astype(np.int64 if trial % 2 else np.int32)
        lo, hi, rounds = checked_rounds(np, idx)
        seen: dict = {}
        want: list = []
        for pos, v in enumerate(idx.tolist()):          # k-th time v appears -> round k
            k = seen.get(v, 0)
            seen[v] = k + 1
            want += [[] for _ in range(k + 1 - len(want))]
            want[k].append(pos)
        assert [r.tolist() for r in rounds] == want
        assert (lo, hi) == ((min(idx.tolist()), max(idx.tolist())) if idx.size else (0, -1))
        assert id_counts(np, idx).tolist() == [seen[v] for v in idx.tolist()]
        rows = rng.standard_normal((idx.size, 3))
        sums = np.zeros((7, 3))
        for pos, v in enumerate(idx.tolist()):
            sums[v] += rows[pos]
        np.testing.assert_allclose(sum_by_id(np, rows, idx, 7), sums, rtol=1e-12, atol=1e-12)
        table = rng.standard_normal((7, 3))
        np.testing.assert_allclose(add_rows_at(np, table, idx, rows), table + sums, rtol=1e-12, atol=1e-12)


def test_checked_rounds_read_the_device_once():
    """Range and rounds come back in one read, on the strict stand-in as on numpy."""
    require_cupy()
    from placer.ops.scatter import checked_rounds
    idx = np.array([4, 1, 4, 0, 4, 1], np.int64)
    xp = StrictCupy()
    lo, hi, rounds = checked_rounds(xp, xp.wrap(idx))
    assert (lo, hi) == (0, 4) and xp.ledger.syncs == ["get"]
    assert [r.get().tolist() for r in rounds] == [[0, 1, 3], [2, 5], [4]]


@pytest.mark.parametrize("op_type,inputs", [
    ("SparseAdagrad", [np.ones((6, 2), np.float32), np.ones((6, 2), np.float32), np.array([1, 6, 1], np.int64),
                       np.ones((3, 2), np.float32), np.array([-0.1], np.float32)]),
    ("SparseMomentumSGDUpdate", [np.ones((2, 2), np.float32), np.ones((6, 2), np.float32),
                                 np.array([0.1], np.float32), np.ones((6, 2), np.float32), np.array([6, 0], np.int32)]),
    ("ScatterWeightedSum", [np.ones((6, 2), np.float32), np.array([1.0], np.float32), np.array([6], np.int64),
                            np.ones((1, 2), np.float32), np.array([0.5], np.float32)]),
], ids=["SparseAdagrad", "SparseMomentumSGDUpdate", "ScatterWeightedSum"])
def test_sparse_updates_refuse_an_index_past_the_table_on_both_paths(op_type, inputs):
    kernel = registry.get(op_type).kernel
    with pytest.raises(InputError, match=f"#4 {op_type}: {op_type} index 6 is out of range for a parameter of 6 rows"):
        kernel(np, inputs, Args(op=f"#4 {op_type}"))
    require_cupy()
    with pytest.raises(InputError, match="index 6 is out of range"):
        run_strict(kernel, inputs, Args(op=f"#4 {op_type}"))
