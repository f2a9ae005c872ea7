"""The in-place protocol and host inputs of training runs.

- Every optimizer kernel, given ``args.inplace``, updates its state inputs in place and
  returns them, with the same bits as its out-of-place form (whose values the optimizer
  conformance tests check against real Caffe2), on numpy and with cupy's names only.
- A sparse update in place allocates memory for the looked-up rows, not for the table.
- The executor grants in place only for arrays a blob owns: an ``Alias`` of the table
  keeps it out of place, with the same results.
- Inputs read from host memory (the iteration counter of Adam and LearningRate) may sit on
  the CPU when the op runs on a GPU, and must.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cases.optimizers import CASES
from cases.oracle_runner import case_args, case_inputs
from conftest import require_cupy
from cupy_standin import DeviceArray, assert_same_outputs, run_strict
from placer.errors import DeviceError
from placer.examples.builder import make_op
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.runtime.executor import Executor
from placer.types import Args
from training_models import choice, model
from placer.training.recipe import make_train_nets

INPLACE_CASES = [c for c in CASES if any(c.get("inplace", {}).get(i) == j
                                         for i, j in registry.get(c["op"]).inplace)]


def inplace_positions(case) -> frozenset:
    return frozenset(i for i, j in registry.get(case["op"]).inplace if case.get("inplace", {}).get(i) == j)


def run_case(case, xp, inplace: frozenset):
    inputs = [registry.get("CreateMutex").kernel(np, [], Args({}))[0] if x is None else x
              for x in case_inputs(case)]
    base = case_args(case)
    args = Args(dict(base), op=base.op, seed=base.seed, n_outputs=base.n_outputs, inplace=inplace)
    return inputs, registry.get(case["op"]).kernel(xp, inputs, args)


def test_every_enforced_pair_is_declared_in_place():
    from placer.ops.optimizers import ENFORCED_INPLACE
    for op_type, pairs in ENFORCED_INPLACE.items():
        if op_type not in ("Iter", "AtomicIter"):   # an 8-byte counter: nothing to save
            assert set(pairs) <= set(registry.get(op_type).inplace), op_type
    assert len(INPLACE_CASES) >= 12


@pytest.mark.parametrize("case", INPLACE_CASES, ids=[c["id"] for c in INPLACE_CASES])
def test_in_place_kernel_gives_the_same_bits_and_returns_its_inputs(case):
    _, want = run_case(case, np, frozenset())
    positions = inplace_positions(case)
    inputs, got = run_case(case, np, positions)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"output {k}")
    for i, j in registry.get(case["op"]).inplace:
        if i in positions:
            assert got[j] is inputs[i], f"output {j} is not input {i} updated in place"


@pytest.mark.parametrize("case", INPLACE_CASES, ids=[c["id"] for c in INPLACE_CASES])
def test_in_place_kernel_keeps_to_cupy_rules_and_launches_no_more(case):
    """On the strict cupy stand-in (tests/cupy_standin.py), with the counter a host array
    as a GPU runs it: the same outputs, at most one device read, and no more launches than
    out of place (in place skips the copies of the parameter and its state)."""
    require_cupy()
    opdef = registry.get(case["op"])
    if "gpu" not in opdef.devices:
        pytest.skip("CPU-only op: the planner never places it on a GPU")

    def kernel(xp, inputs, args):
        return opdef.kernel(xp, [x._a if i in opdef.host_inputs and isinstance(x, DeviceArray) else x
                                 for i, x in enumerate(inputs)], args)

    base = case_args(case)
    granted = Args(dict(base), op=base.op, seed=base.seed, n_outputs=base.n_outputs,
                   inplace=inplace_positions(case))
    in_place = run_strict(kernel, case_inputs(case), granted)
    assert_same_outputs(in_place.outputs, run_case(case, np, frozenset())[1])
    assert len(in_place.syncs) <= 1, in_place.syncs
    assert in_place.launches <= run_strict(kernel, case_inputs(case), base).launches


@pytest.mark.gpu
@pytest.mark.parametrize("case", INPLACE_CASES, ids=[c["id"] for c in INPLACE_CASES])
def test_in_place_kernel_on_cupy_updates_its_device_arrays(case):
    import cupy
    _, want = run_case(case, np, frozenset())
    positions = inplace_positions(case)
    inputs = [cupy.asarray(x) for x in case_inputs(case)]
    base = case_args(case)
    args = Args(dict(base), op=base.op, seed=base.seed, n_outputs=base.n_outputs, inplace=positions)
    got = registry.get(case["op"]).kernel(cupy, inputs, args)
    for k, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(cupy.asnumpy(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=f"output {k}")
    for i, j in registry.get(case["op"]).inplace:
        if i in positions:
            assert got[j] is inputs[i]


@pytest.mark.parametrize("op_type", ["SparseAdagrad", "RowWiseSparseAdagrad", "SparseAdam",
                                     "SparseMomentumSGDUpdate", "ScatterWeightedSum"])
def test_sparse_update_in_place_allocates_rows_not_the_table(op_type):
    rows, dim, k = 100_000, 16, 64                      # a 6.4 MB table, 64 looked-up rows
    rng = np.random.default_rng(0)
    p = rng.standard_normal((rows, dim)).astype(np.float32)
    g = rng.standard_normal((k, dim)).astype(np.float32)
    idx = rng.integers(0, rows, k).astype(np.int64)
    lr, it = np.array([-0.1], np.float32), np.array([3], np.int64)
    per_row = np.ones(rows, np.float32)
    inputs, inplace = {
        "SparseAdagrad": ([p, np.ones_like(p), idx, g, lr], {0, 1}),
        "RowWiseSparseAdagrad": ([p, per_row, idx, g, lr], {0, 1}),
        "SparseAdam": ([p, np.zeros_like(p), np.ones_like(p), idx, g, lr, it], {0, 1, 2}),
        "SparseMomentumSGDUpdate": ([g, np.zeros_like(p), lr, p, idx], {1, 3}),
        "ScatterWeightedSum": ([p, np.array([1.0], np.float32), idx, g, lr], {0}),
    }[op_type]
    kernel = registry.get(op_type).kernel

    def peak_bytes(allowed):
        tracemalloc.start()
        kernel(np, inputs, Args({}, op=op_type, n_outputs=3, inplace=frozenset(allowed)))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    assert peak_bytes(()) >= p.nbytes                   # out of place: a new table
    assert peak_bytes(inplace) < p.nbytes // 20         # in place: the rows only


# ---------------------------------------------------------------- the executor's grants
def dlrm_executor(alias_table: bool = False) -> tuple[Executor, str]:
    m = model("dlrm")
    made = make_train_nets(m.net(), [m.loss], choice("rowwise-adagrad"))
    table = "emb:::sls0_w"
    if alias_table:    # a blob that shares the table's memory, alive to the end of the run
        made.train.op.insert(0, make_op("Alias", [table], ["table_view"]))
        made.train.external_output.append("table_view")
    ex = Executor(net_from_netdef(made.train, made.init))
    ex.run_init()
    return ex, table


def dlrm_batch():
    from training_models import batches
    return batches(model("dlrm"), 1)[0]


def test_executor_updates_owned_state_in_place():
    ex, table = dlrm_executor()
    before_table, before_w = ex.params[table], ex.params["bot:::fc0_w"]
    start = before_table.copy()
    ex.run(dlrm_batch(), iterations=2, warmup=1)
    assert ex.params[table] is before_table and ex.params["bot:::fc0_w"] is before_w
    assert not np.array_equal(before_table, start)       # trained, in that very array
    steps = [s for s in ex.steps if s.op.type == "RowWiseSparseAdagrad"]
    assert steps and all(s.args.inplace == {0, 1} for s in steps)


def test_a_table_another_blob_aliases_is_updated_out_of_place_with_the_same_result():
    ex, table = dlrm_executor(alias_table=True)
    plain, _ = dlrm_executor()
    before = ex.params[table]
    start = before.copy()
    for e in (ex, plain):
        e.run(dlrm_batch(), iterations=2, warmup=1)
    assert ex.params[table] is not before
    np.testing.assert_array_equal(before, start)          # the aliased array was not written
    for name, value in plain.host_state().items():
        if name != "iteration_mutex":
            np.testing.assert_array_equal(ex.host_state()[name], value, err_msg=name)
    granted = [s.args.inplace for s in ex.steps if s.op.type == "RowWiseSparseAdagrad" and table in s.inputs]
    assert granted == [frozenset({1})]                    # its moment is still owned


def test_a_fed_array_is_never_written():
    ex, _ = dlrm_executor()
    batch = dlrm_batch()
    copies = {k: v.copy() for k, v in batch.items()}
    ex.run(batch, iterations=2, warmup=0)
    for k, v in batch.items():
        np.testing.assert_array_equal(v, copies[k])


# ---------------------------------------------------------------- host inputs
def adam_on_gpu(counter_on_gpu: bool = False, gpu: tuple | None = (1, 0)):
    """AtomicIter on the CPU; LearningRate and Adam on GPU 0, reading the counter from host
    memory (as Caffe2's CUDA kernels do). ``counter_on_gpu``: the init net makes the counter
    on the GPU instead (and no AtomicIter, which is CPU only, touches it). ``gpu=None``: the
    same net with no device options, all on the CPU."""
    init = pb.NetDef(name="init")
    rng = np.random.default_rng(3)
    for name, value in (("p", rng.standard_normal(5)), ("m1", np.zeros(5)), ("m2", np.zeros(5))):
        init.op.append(make_op("GivenTensorFill", [], [name], shape=[5], values=[float(v) for v in value],
                               device=gpu))
    init.op.append(make_op("ConstantFill", [], ["iter"], shape=[1], value=0, dtype=10,
                           device=gpu if counter_on_gpu else None))
    init.op.append(make_op("CreateMutex", [], ["mutex"]))
    train = pb.NetDef(name="adam", external_input=["p", "m1", "m2", "iter", "mutex", "g"])
    if not counter_on_gpu:
        train.op.append(make_op("AtomicIter", ["mutex", "iter"], ["iter"]))
    train.op.extend([make_op("LearningRate", ["iter"], ["lr"], device=gpu, base_lr=-0.01, policy="fixed"),
                     make_op("Adam", ["p", "m1", "m2", "g", "lr", "iter"], ["p", "m1", "m2"], device=gpu)])
    return net_from_netdef(train, init)


def test_adam_and_learning_rate_on_a_gpu_read_the_counter_from_the_host():
    g = {"g": np.linspace(-1, 1, 5).astype(np.float32)}
    placed = Executor(adam_on_gpu(), emulate_gpu=True)
    cpu = Executor(adam_on_gpu(gpu=None))
    for ex in (placed, cpu):
        ex.run_init()
        ex.run(g, iterations=3, warmup=0)
    assert type(placed.params["iter"]) is np.ndarray and placed.params["p"].device == "emulated-cuda:0"
    for name in ("p", "m1", "m2", "iter"):
        np.testing.assert_array_equal(placed.host_state()[name], cpu.host_state()[name], err_msg=name)
    assert placed.host_state()["iter"].tolist() == [3]
    assert {s.device.name for s in placed.steps} == {"cpu", "emulated-cuda:0"}


@pytest.mark.gpu
def test_on_a_real_gpu_adam_reads_the_counter_from_host_memory():
    g = {"g": np.linspace(-1, 1, 5).astype(np.float32)}
    gpu, cpu = Executor(adam_on_gpu()), Executor(adam_on_gpu(gpu=None))
    for ex in (gpu, cpu):
        ex.run_init()
        ex.run(g, iterations=3, warmup=1)
    assert type(gpu.params["iter"]) is np.ndarray and gpu.params["p"].device.id == 0
    for name in ("p", "m1", "m2", "iter"):
        np.testing.assert_allclose(gpu.host_state()[name], cpu.host_state()[name], rtol=1e-6, err_msg=name)


def test_a_counter_in_gpu_memory_is_refused_by_name():
    ex = Executor(adam_on_gpu(counter_on_gpu=True), emulate_gpu=True)
    ex.run_init()
    with pytest.raises(DeviceError, match="reads its input 'iter' from host memory"):
        ex.run({"g": np.zeros(5, np.float32)}, warmup=0)
