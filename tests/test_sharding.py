"""The sharding planner's model: tables found in a train net, shards priced by the cost
model, the step formula on hand figures, the MILP against brute force, TorchRec's
partitioner rule, and the plan against its baselines."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from placer.costs.model import annotate
from placer.examples import dlrm
from placer.examples.dlrm import DlrmConfig
from placer.hardware.machine import compose_machine, load_machine
from placer.sharding.plan import plan_sharding
from placer.sharding.cost import Layout, Load, ShardEstimator, ShardSettings
from placer.sharding.net import DlrmTrainNet, find_tables, phases, train_view
from placer.sharding.search import Search, _partition, brute_force, milp_assignment
from placer.sharding.step import CommsQueue, StepModel
from placer.sharding.types import HBM, TABLE_WISE, UVM, UVM_CACHING, Perf, Storage
from placer.hardware.profiles import load_device_profile

# MLPerf DLRM Criteo Terabyte (DLRM_FACTS.md): table rows, bottom and top MLP widths
CRITEO_ROWS = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
               11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
BOTTOM, TOP = (13, 512, 256, 128), (479, 1024, 1024, 512, 256, 1)


@pytest.fixture(scope="module")
def terabyte():
    typed = DlrmTrainNet(dlrm.criteo_1tb()).typed_at_batch(2048)
    machine = load_machine("8x-a100-40gb-nvswitch")
    return typed, machine, train_view(typed, machine)


def test_the_terabyte_train_net_has_its_26_tables_each_with_lookup_gradient_and_update(terabyte):
    typed, _, view = terabyte
    tables = find_tables(typed, *phases(typed.net))
    assert [t.table.rows for t in tables] == list(CRITEO_ROWS)
    assert all(t.table.dim == 128 and t.table.pooling == 1 for t in tables)
    assert all(t.table.state_bytes_per_row == 4 for t in tables)   # RowWiseSparseAdagrad: one float per row
    assert [typed.net.ops[i].type for i in tables[0].ops] == [
        "SparseLengthsSum", "SparseLengthsIndicesInGradientSumGradient", "RowWiseSparseAdagrad"]
    weights = sum(CRITEO_ROWS) * 128 * 4
    assert weights / 2 ** 30 == pytest.approx(89.5, abs=0.05)     # the 89.5 GiB


def test_the_dense_part_is_the_mlps_with_their_adagrad_state_and_gradients(terabyte):
    _, _, view = terabyte
    layers = list(zip(BOTTOM[:-1], BOTTOM[1:])) + list(zip(TOP[:-1], TOP[1:]))
    params = sum(m * n + n for m, n in layers)
    dense = view.dense
    # weights + Adagrad's squared sums (float32); the interaction's 351 int32 indices, the
    # int64 iteration counter and its uint8 mutex
    assert dense.param_bytes == 2 * 4 * params + 351 * 4 + 8 + 1
    assert dense.gradient_bytes == 4 * params
    assert len(dense.gradients) == 2 * len(layers)
    ready = [float(g[2][1]) for g in dense.gradients]
    assert ready == sorted(ready) and ready[-1] <= dense.backward_s[1] + 1e-15
    assert 0 < dense.exchange_ready_s[1] < dense.backward_s[1]     # the pooled outputs' gradients come mid-way


@pytest.mark.parametrize("table", [0, 5, 9])
@pytest.mark.parametrize("device", [0, 1])
def test_a_shard_at_the_replica_batch_costs_what_the_cost_model_gives_the_nets_own_ops(terabyte, table, device):
    typed, machine, view = terabyte
    ops = view.tables[table]
    cost = ops.price(typed, view.model, device, ops.table.rows, ops.table.dim, 2048 * ops.table.pooling, 2048)
    want = annotate(typed, machine).op_s[ops.ops, device]
    assert cost.forward_s == pytest.approx(want[0], rel=1e-12)
    assert cost.backward_s == pytest.approx(want[1], rel=1e-12)
    assert cost.update_s == pytest.approx(want[2], rel=1e-12)


def test_uvm_reads_each_looked_up_row_over_pcie_at_a_tenth_of_the_link_rate(terabyte):
    typed, _, _ = terabyte
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("a100-40gb-sxm4", "gpu"))
    view = train_view(typed, machine)
    est = ShardEstimator(view, machine, tuple(machine.gpus), 2048, ShardSettings(uvm_cache_hit_rate=0.75))
    lay = {(x.sharding_type, x.kernel): x for x in est.layouts(0)}
    hbm, uvm, cached = lay[(TABLE_WISE, HBM)], lay[(TABLE_WISE, UVM)], lay[(TABLE_WISE, UVM_CACHING)]
    rows, row = CRITEO_ROWS[0], 128 * 4
    pcie = 25e9 * 0.1                              # a100-40gb-sxm4: PCIe 4 at 25 GB/s (its profile)
    assert uvm.per_shard.ef[0] - hbm.per_shard.ef[0] == pytest.approx(2048 * row / pcie, rel=1e-12)
    assert uvm.per_shard.eb[0] - hbm.per_shard.eb[0] == pytest.approx(2048 * (row + 4) * 2 / pcie, rel=1e-12)
    assert cached.per_shard.ef[0] - hbm.per_shard.ef[0] == pytest.approx(0.25 * 2048 * row / pcie, rel=1e-12)
    assert hbm.per_shard.hbm[0] - uvm.per_shard.hbm[0] == rows * (row + 4)   # rows and state in host memory
    assert cached.per_shard.hbm[0] - uvm.per_shard.hbm[0] == pytest.approx(0.2 * rows * row)
    assert uvm.fixed.ddr == rows * (row + 4)


@pytest.fixture(scope="module")
def small_model():
    cfg = DlrmConfig("t", (1000, 2000, 3000), dim=16, bottom=(13, 32, 16), top=(32, 1), batch=64)
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("v100-16gb-sxm2", "gpu"),
                              2, "nvlink2")
    view = train_view(DlrmTrainNet(cfg).typed_at_batch(256), machine)
    return ShardEstimator(view, machine, tuple(machine.gpus), 512)


def _hand_model(est) -> StepModel:
    model = StepModel(est)
    model.DF, model.DB, model.DO = np.array([1e-3, 1e-3]), np.array([2e-3, 2e-3]), np.array([0.5e-3, 0.5e-3])
    model.exchange_at = np.array([0.5e-3, 0.5e-3])
    model.queue = CommsQueue(exchange_ready_s=1.5e-3, before_finish_s=1.2e-3, after_s=0.4e-3, after_finish_s=2.2e-3,
                             allreduce_s=1.0e-3)
    model.h2d_lat, model.h2d_coef = np.array([1e-5, 1e-5]), np.array([1e-10, 1e-10])
    model.d2h_lat, model.d2h_coef = np.array([1e-5, 1e-5]), np.array([1e-10, 1e-10])
    est._a2a = (10e-6, 1e-9)
    return model


def _load(**kw) -> Load:
    load = Load.zeros(2)
    for k, v in kw.items():
        setattr(load, k, np.array(v, float) if isinstance(v, list) else v)
    return load


def test_the_step_on_hand_figures_gpu_path(small_model):
    model = _hand_model(small_model)
    step = model.evaluate(_load(ef=[2e-4, 1e-4], eb=[3e-4, 5e-4], send=[1e6, 0], idx=[1e5, 2e5], a2a_in=1.0,
                                a2a_out=1.0))
    # A_in = 10 us + 2e5 B * 1 ns = 210 us; A_of = A_ob = 10 us + 1e6 B * 1 ns = 1010 us
    # S = 210 + 200 + 1010 = 1420 us; T_ab = S + max(1200, 1500) + 1010 = 3930 us
    # C_end = max(3930 + 400, 1420 + 2200) = 4330 us; dense done = 1420 + 3000 = 4420 us
    # rank 1: max(4420, 3930) + 500 = 4920 us; max(4920, 4330) + 500 (optimizer) = 5420 us
    assert step.total_s == pytest.approx(5.42e-3, rel=1e-12)
    assert [p.phase for p in step.critical_path] == ["index all-to-all", "lookups forward", "pooled-output exchange",
                                                     "dense forward + backward", "lookups backward + update",
                                                     "dense optimizer"]
    assert step.critical_path[-2].device == "cuda:1"
    assert sum(p.seconds for p in step.critical_path) == pytest.approx(step.total_s, rel=1e-12)


def test_the_step_on_hand_figures_comms_and_host_paths(small_model):
    model = _hand_model(small_model)
    # a long backward exchange: the all-reduces after it end the dense part
    step = model.evaluate(_load(eb=[1e-4, 1e-4], send=[4e6, 0], a2a_out=1.0, ob_s=0.0))
    # S = 4010 us; T_ab = S + 1500 + 4010 = 9520 us; C_end = 9920 us; emb done 9620 us; + 500 = 10420 us
    assert step.total_s == pytest.approx(10.42e-3, rel=1e-12)
    assert step.critical_path[-2].phase == "gradient all-reduces queued after the exchange"
    # a gradient ready late with a long queue of all-reduces behind it
    model.queue = CommsQueue(exchange_ready_s=1.5e-3, before_finish_s=1.2e-3, after_s=2.5e-3, after_finish_s=9e-3,
                             allreduce_s=3e-3, after_ready_s=7e-3, after_tail_s=2e-3, after_tail_count=3)
    step = model.evaluate(_load(eb=[1e-4, 1e-4]))
    # S = 0: C_end = max(0 + 1500 + 0 + 2500, 0 + 9000) = 9000 us; dense done 3000 us; + 500 = 9500 us
    assert step.total_s == pytest.approx(9.5e-3, rel=1e-12)
    assert [(p.phase, p.seconds) for p in step.critical_path] == [
        ("dense forward + backward until a gradient is ready", pytest.approx(7e-3)),
        ("all-reduce of the last 3 gradient(s)", pytest.approx(2e-3)), ("dense optimizer", pytest.approx(0.5e-3))]
    # a slow host table: the dense part waits for its outputs, its update for their gradients
    step = model.evaluate(_load(cpu_f=20e-3, cpu_b=10e-3, host_w=64.0))
    # copies: 10 us + 256 samples * 64 B * 0.1 ns = 11.6384 us each way; S = 20 ms + 11.6384 us;
    # gradients back at S + 1 ms + 0.5 ms + 11.6384 us = 21.5232768 ms; + 10 ms of host update
    assert step.total_s == pytest.approx(31.5232768e-3, rel=1e-12)
    assert [p.phase for p in step.critical_path] == [
        "host lookups", "host -> GPU pooled outputs", "dense forward + backward to the embedding gradients",
        "GPU -> host gradients", "host backward + update"]
    assert sum(p.seconds for p in step.critical_path) == pytest.approx(step.total_s, rel=1e-12)



def _random_search(seed: int) -> Search:
    rng = np.random.default_rng(seed)
    host = load_device_profile("host-ci-2core", "cpu")
    gpu = load_device_profile(str(rng.choice(["v100-16gb-sxm2", "a100-40gb-sxm4", "t4-pcie3"])), "gpu")
    k = int(rng.integers(2, 4))
    machine = compose_machine(host, gpu, k, str(rng.choice(["nvlink2", "staged", "pcie-p2p"])))
    n = int(rng.integers(2, 4))
    rows = tuple(int(x) for x in np.exp(rng.uniform(np.log(1e3), np.log(3e6), n)))
    cfg = DlrmConfig("t", rows, dim=16, bottom=(13, 32, 16), top=(32, 1), batch=64,
                     lookups_per_sample=int(rng.integers(1, 4)))
    G = int(rng.choice([1024, 4096, 16384]))
    view = train_view(DlrmTrainNet(cfg).typed_at_batch(G // k), machine)
    tables = sum(t.table.nbytes for t in view.tables)
    limit = [None, 0.6, 0.3][seed % 3]
    mem = None if limit is None else (limit * tables + view.dense.memory_bytes) / 0.9
    return Search(ShardEstimator(view, machine, tuple(machine.gpus), G, ShardSettings(gpu_mem_bytes=mem)))


@pytest.mark.parametrize("seed", range(6))
def test_the_milp_finds_the_brute_force_optimum_of_the_step_model(seed):
    search = _random_search(seed)
    _, want = brute_force(search)
    got = milp_assignment(search, None, 60)
    assert got.optimal and got.step_s == pytest.approx(want, rel=1e-9)
    assert search.score(got.assignment) == pytest.approx(want, rel=1e-9)


def _stub(storage_bytes: list[float], capacity: float):
    """Three table-wise layouts of unit perf on two ranks with the given storage."""
    class Est:
        k = 2
        dense_bytes = 0.0
    est = Est()
    est.capacity = np.array([capacity, capacity])
    layouts = [[Layout(t, TABLE_WISE, HBM, 1, 1, 1, Load.zeros(2), Load.zeros(2), (), [Perf(1.0)] * 2,
                       [Storage(s)] * 2)] for t, s in enumerate(storage_bytes)]

    class S:
        pass
    s = S()
    s.est, s.layouts = est, layouts
    return s


def test_torchrecs_partitioner_places_the_largest_shard_first_on_the_least_loaded_rank_with_room():
    # GreedyPerfPartitioner: by storage 3, 2, 1; each on the rank of least perf so far
    # (ties: the lower rank): 3 -> rank 0, 2 -> rank 1, 1 -> rank 0
    placed, rating = _partition(_stub([2.0, 3.0, 1.0], 10.0), [0, 0, 0])
    assert [c.positions for c in placed] == [(1,), (0,), (0,)] and rating == 2.0
    # rank 0 full after the 3: the 1 goes to rank 1 although rank 0 ties on perf
    placed, _ = _partition(_stub([2.0, 3.0, 1.0], 3.5), [0, 0, 0])
    assert [c.positions for c in placed] == [(1,), (0,), (1,)]


MACHINES = [("v100-16gb-sxm2", 2, "nvlink2"), ("t4-pcie3", 4, "staged"), ("a100-40gb-sxm4", 4, "nvswitch-a100")]


@pytest.mark.parametrize("gpu,count,link", MACHINES)
def test_the_plan_fits_and_is_never_worse_than_a_baseline(gpu, count, link):
    rows = (3_000_000, 800_000, 50_000, 7_000, 120)
    cfg = DlrmConfig("t", rows, dim=64, bottom=(13, 128, 64), top=(128, 1), batch=64, lookups_per_sample=2)
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile(gpu, "gpu"), count, link)
    tables = sum(r * (64 * 4 + 4) for r in rows)
    settings = ShardSettings(gpu_mem_bytes=tables / 2)         # no GPU holds every table
    result = plan_sharding(DlrmTrainNet(cfg), machine, global_batch=4096, settings=settings, time_limit_s=5,
                           search_s=1)
    plan = result.plan
    for rank in plan.stats:
        assert rank.memory_bytes <= rank.capacity_bytes
    per_sample = plan.total_s / plan.global_batch
    feasible = [b for b in result.baselines.values() if math.isfinite(b.total_s)]
    assert feasible
    for b in feasible:
        assert per_sample <= b.total_s / b.global_batch * (1 + 1e-12), b.method
    assert not math.isfinite(result.baselines["data_parallel"].total_s)   # every table on every GPU: too big
    assert sum(p.seconds for p in plan.step.critical_path) == pytest.approx(plan.total_s, rel=1e-9)


def test_pure_data_parallelism_of_the_terabyte_tables_names_the_bytes_that_do_not_fit():
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("v100-16gb-sxm2", "gpu"),
                              8, "nvlink2")
    result = plan_sharding(DlrmTrainNet(dlrm.criteo_1tb()), machine, global_batch=16384, degrees=[8],
                           time_limit_s=0, search_s=0.5)
    note = result.baselines["data_parallel"].notes[0]
    m = re.fullmatch(r"needs ([\d.]+) GiB on cuda:0, ([\d.]+) GiB usable \(([\d.]+) GiB do not fit\)", note)
    assert m, note
    need, usable, over = map(float, m.groups())
    assert need > sum(CRITEO_ROWS) * (128 * 4 + 4) / 2 ** 30         # every table and its state on each GPU
    assert usable == pytest.approx(14.4, abs=0.05)                   # 16 GiB less 10%
    assert over == pytest.approx(need - usable, abs=0.06)
    assert all(s.memory_bytes <= s.capacity_bytes for s in result.plan.stats)


@pytest.mark.parametrize("seed", range(3))
def test_the_search_loops_step_is_the_full_evaluations(seed):
    """``StepModel.time`` (the inner loop's) equals ``evaluate`` on random assignments, host tables among them."""
    search = _random_search(seed)
    rng = np.random.default_rng(seed)
    for _ in range(50):
        assignment = [rng.choice(search.choices(t)) for t in range(len(search.layouts))]
        load = search.total(assignment)
        assert search.model.time(load) == pytest.approx(search.model.evaluate(load).total_s, rel=1e-12)


def test_where_the_plan_differs_from_torchrecs_the_output_says_what_its_choice_costs():
    """One A100 40 GB: TorchRec's greedy (re-implemented) caches the four largest tables in
    HBM over host memory; placer's plan weighs the host CPU's lookups against them."""
    machine = compose_machine(load_device_profile("host-ci-2core", "cpu"), load_device_profile("a100-40gb-sxm4", "gpu"))
    result = plan_sharding(DlrmTrainNet(dlrm.criteo_1tb()), machine, global_batch=2048, time_limit_s=5, search_s=0.5)
    torchrec = result.baselines["torchrec"]
    assert sorted(o.kernel for o in torchrec.options).count("uvm_caching") == 4
    assert result.plan.total_s < torchrec.total_s
    lines = result.differences
    assert lines and lines[-1].startswith("TorchRec rates a plan")
    for line in lines[:-1]:
        m = re.match(r"emb:::sls\d+_w: (.+) instead of (.+) \(TorchRec's choice alone: (.+)\)$", line)
        assert m and m.group(1) != m.group(2), line
        assert m.group(3) == "does not fit" or m.group(3).startswith("+")


def _scan_proposals(search, options):
    """TorchRec's GreedyProposer written as it reads (every table scanned for the largest
    storage each step), the reference for the heap in ``sharding.search._proposals``."""
    from placer.sharding.search import _score, _storage
    n = len(options)
    for use_depth in (True, False):
        ranked = [sorted(opts, key=lambda i, t=t: _score(search.layouts[t][i], use_depth))
                  for t, opts in enumerate(options)]
        index = [0] * n
        while True:
            yield [ranked[t][index[t]] for t in range(n)]
            largest, largest_storage = None, (0.0, 0.0, 0.0, 0.0)
            for t in range(n):
                if index[t] + 1 < len(ranked[t]):
                    st = _storage(search.layouts[t][ranked[t][index[t]]])
                    if st > largest_storage:
                        largest, largest_storage = t, st
            if largest is None:
                break
            index[largest] += 1


@pytest.mark.parametrize("seed", range(5))
def test_the_greedy_proposer_heap_proposes_what_the_scan_of_every_table_does(seed):
    """Random tables with 1-4 layouts each (storage with ties and zeros, 1-2 shards over
    four ranks): the same proposal sequence as the reference scan, and the partition of
    each one rated as before."""
    from placer.sharding.search import _LayoutKeys, _proposals
    rng = np.random.default_rng(seed)
    k, n = 4, int(rng.integers(5, 30))
    layouts = []
    for t in range(n):
        table = []
        for _ in range(int(rng.integers(1, 5))):
            size = float(rng.choice([0.0, 1.0, 2.0, 4.0, float(rng.integers(1, 100))]))
            table.append(Layout(t, TABLE_WISE, HBM, int(rng.integers(1, 3)), 1, 1, Load.zeros(k), Load.zeros(k), (),
                                [Perf(float(rng.integers(1, 4)))] * k, [Storage(size, float(rng.integers(0, 2)))] * k))
        layouts.append(table)
    search = _stub([1.0], 1e9)
    search.layouts = layouts
    search.est.k, search.est.capacity = k, np.full(k, 1e9)
    options = [list(range(len(table))) for table in layouts]
    keys = _LayoutKeys(search)
    want = [p for p, _ in zip(_scan_proposals(search, options), range(10_000))]
    got = [p for p, _ in zip(_proposals(search, options, keys), range(len(want)))]
    assert got == want and len(want) > n // 2
    for proposal in want[:50]:
        assert _partition(search, proposal, keys) == _partition(search, proposal)
