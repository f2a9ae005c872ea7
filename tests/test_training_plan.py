"""The training placement rules (``placer.training.placement``) against brute force.

Small train nets are built by hand (forward, gradient and optimizer ops as Caffe2 names
them). For every placement on one CPU and one or two GPUs, the serial cost and the memory
per device that the planner's cost arrays give are compared with a reference computed
here by plain loops over the ops from the rules themselves (state on the device of its
writers, a copy per step for every other device that reads it, a gradient copied once to
the state's device, sparse gradients as rows, in-place writes adding no memory); the
planner's plan is compared with the best placement the loops find.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from placer.examples.builder import NetBuilder, make_op
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import compose_machine
from placer.partition.problem import memory_use, serial_cost
from placer.partition.schedule import Simulator
from placer.planning.planner import PlanOptions, plan
from placer.hardware.profiles import load_device_profile
from placer.shapes import infer, require_complete
from placer.training.placement import state_groups, state_writers
from placer.types import TensorType

HOST = load_device_profile("host-ci-2core", "cpu")
T4 = load_device_profile("t4-pcie3", "gpu")


def machine(gpus: int):
    return compose_machine(HOST, T4, gpus=gpus)


def dense_net():
    """FC -> in-place Relu -> SoftmaxWithLoss, its gradients, MomentumSGDUpdate on the
    weight and the bias, and a decay of the weight in place after its update (a second
    writer of the same state)."""
    b = NetBuilder("dense_train")
    b.input("x", (256, 512))
    b.input("label", (256,), "int32")
    b.param("w", (64, 512), "XavierFill")
    b.param("bias", (64,), "ConstantFill", value=0.0)
    b.param("lr", (1,), "ConstantFill", value=-0.1)
    for p in ("w", "bias"):
        b.init.op.append(make_op("ConstantFill", [p], [f"{p}_momentum"], value=0.0))
    b.op("FC", ["x", "w", "bias"], "h")
    b.op("Relu", ["h"], "h")
    b.op("SoftmaxWithLoss", ["h", "label"], ["prob", "loss"])
    b.op("ConstantFill", ["loss"], "loss_grad", value=1.0)
    b.op("SoftmaxWithLossGradient", ["h", "label", "prob", "loss_grad"], "h_grad")
    b.op("ReluGradient", ["h", "h_grad"], "h_grad")
    b.op("FCGradient", ["x", "w", "h_grad"], ["w_grad", "bias_grad"])
    for p in ("w", "bias"):
        b.op("MomentumSGDUpdate", [f"{p}_grad", f"{p}_momentum", "lr", p], [f"{p}_grad", f"{p}_momentum", p],
             momentum=0.9)
    b.op("Scale", ["w"], "w", scale=0.999)
    b.output("loss")
    return b


def sparse_net():
    """An embedding table read by SparseLengthsSum, an FC and a softmax loss; the table
    trained by SparseAdagrad on its GradientSlice, the FC by Adagrad."""
    b = NetBuilder("sparse_train")
    b.input("ids", (2048,), "int64")
    b.input("lengths", (256,), "int32")
    b.input("label", (256,), "int32")
    b.param("emb", (200_000, 64), "UniformFill", min=-0.01, max=0.01)
    b.param("w", (32, 64), "XavierFill")
    b.param("bias", (32,), "ConstantFill", value=0.0)
    b.param("lr", (1,), "ConstantFill", value=-0.05)
    for p in ("emb", "w", "bias"):
        b.init.op.append(make_op("ConstantFill", [p], [f"{p}_squared_sum"], value=0.0))
    b.op("SparseLengthsSum", ["emb", "ids", "lengths"], "e")
    b.op("FC", ["e", "w", "bias"], "z")
    b.op("SoftmaxWithLoss", ["z", "label"], ["prob", "loss"])
    b.op("ConstantFill", ["loss"], "loss_grad", value=1.0)
    b.op("SoftmaxWithLossGradient", ["z", "label", "prob", "loss_grad"], "z_grad")
    b.op("FCGradient", ["e", "w", "z_grad"], ["w_grad", "bias_grad", "e_grad"])
    b.op("SparseLengthsIndicesInGradientSumGradient", ["e_grad", "lengths", "ids"], "emb_grad_values")
    b.op("SparseAdagrad", ["emb", "emb_squared_sum", "ids", "emb_grad_values", "lr"], ["emb", "emb_squared_sum"],
         epsilon=1e-4)
    for p in ("w", "bias"):
        b.op("Adagrad", [p, f"{p}_squared_sum", f"{p}_grad", "lr"], [p, f"{p}_squared_sum"], epsilon=1e-4)
    b.output("loss")
    return b


def typed(builder):
    net = net_from_netdef(builder.predict, builder.init, path=builder.predict.name)
    shapes = {n: TensorType(s, dt) for n, (dt, s) in builder.value_info.items()}
    return require_complete(infer(net, shapes))


# ---------------------------------------------------------------- the reference, by loops

def colocated(net, dev) -> bool:
    """Rule 1 (writers of a state blob on one device) and the in-place rule (an op that
    overwrites a blob made by an earlier op runs where that op ran, unless the op writes
    state and the blob is not state)."""
    params = set(net.params)
    for writers in state_writers(net).values():
        if len({dev[i] for i in writers}) > 1:
            return False
    writes_state = {op.index for op in net.ops if set(op.outputs) & params}
    made_by = {}
    for op in net.ops:
        for name in set(op.outputs) & set(op.inputs):
            if name in made_by and (op.index not in writes_state or name in params):
                if dev[op.index] != dev[made_by[name]]:
                    return False
        for name in op.outputs:
            made_by[name] = op.index
    return True


def reference_seconds(net, t, m, op_s, dev, host=0) -> float:
    """One step's serial time: op times + every copy the rules call for."""
    params, state = set(net.params), set(state_writers(net))
    nbytes = {name: tt.nbytes for name, tt in t.blobs.items() if tt is not None}
    home = {name: dev[ops[0]] for name, ops in state_writers(net).items()}
    held = {}   # blob -> (source device, devices holding the current version)
    for name in state:
        held[name] = (home[name], {home[name]})       # the previous step's value, at home
    for name in net.data_inputs:
        held[name] = (host, {host})
    seconds = float(sum(op_s[i, dev[i]] for i in range(len(net.ops))))
    for op in net.ops:
        d = dev[op.index]
        for name in dict.fromkeys(op.inputs):
            if name in params and name not in state:
                continue                                  # made by the init net where read
            src, where = held[name]
            if d not in where:
                seconds += m.copy_time(nbytes[name], src, d)
                where.add(d)
        for name in op.outputs:
            held[name] = (d, {d})
    for name in net.external_outputs:
        src, where = held[name]
        if host not in where:
            seconds += m.copy_time(nbytes[name], src, host)
    return seconds


def reference_memory(net, t, k, dev) -> np.ndarray:
    """Bytes per device: init-net blobs read there before any write (state copies
    included, for the whole step; versions of state written in the step live in the
    state's buffer) + the peak of live versions of the other blobs: from the maker's step
    (or the first reader there) to the last reader on each device (an in-place op reads
    the version it overwrites); an in-place output nobody reads adds nothing; another
    unread output lives during its op's step."""
    n, params = len(net.ops), set(net.params)
    out = np.zeros(k)
    written, read_on = set(), set()
    for op in net.ops:
        read_on |= {(name, dev[op.index]) for name in op.inputs if name in params and name not in written}
        written |= set(op.outputs) & params
    for name, d in read_on:
        out[d] += t.blobs[name].nbytes
    versions = []                    # [name, maker, {device: [first, last]}, read, in place]
    current = {}
    for name in net.data_inputs:
        current[name] = [name, -1, {}, False, False]
        versions.append(current[name])
    for op in net.ops:
        i, d = op.index, dev[op.index]
        for name in dict.fromkeys(op.inputs):
            if name in params:
                continue
            v = current[name]
            v[2].setdefault(d, [i, i])[1] = i
            v[3] = True
        for name in dict.fromkeys(op.outputs):
            if name not in params:
                current[name] = [name, i, {d: [i, i]}, False, name in op.inputs]
                versions.append(current[name])
    live = np.zeros((k, n))
    for name, maker, spans, read, inplace in versions:
        if maker >= 0 and inplace and not read:
            continue
        for d, (a, b) in spans.items():
            live[d, a:b + 1] += t.blobs[name].nbytes
    return out + live.max(axis=1)


def all_placements(n, k):
    return [np.array(p) for p in itertools.product(range(k), repeat=n)]


@pytest.fixture(scope="module", params=[("dense", 1), ("dense", 2), ("sparse", 1)],
                ids=["dense-1gpu", "dense-2gpu", "sparse-1gpu"])
def case(request):
    name, gpus = request.param
    tn = typed(dense_net() if name == "dense" else sparse_net())
    m = machine(gpus)
    result = plan(tn, m, PlanOptions(method="milp"))
    return tn, m, result


def test_every_placement_costs_what_the_rules_say(case):
    tn, m, result = case
    arr, net = result.arrays, tn.net
    assert arr.allowed.all()      # every op here has a kernel on every device
    feasible = 0
    for dev in all_placements(arr.n_ops, arr.k):
        ok = colocated(net, dev)
        comp = arr.component
        assert ok == all(len(set(dev[comp == c])) == 1 for c in np.unique(comp))
        if not ok:
            continue
        feasible += 1
        want = reference_seconds(net, tn, m, arr.op_s, dev)
        assert serial_cost(arr, dev).total_s == pytest.approx(want, rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(memory_use(arr, dev), reference_memory(net, tn, arr.k, dev), rtol=1e-12)
    assert feasible == arr.k ** len(np.unique(arr.component))


def test_the_plan_is_the_best_placement(case):
    tn, m, result = case
    arr = result.arrays
    best = min(reference_seconds(tn.net, tn, m, arr.op_s, dev)
               for dev in all_placements(arr.n_ops, arr.k) if colocated(tn.net, dev))
    assert result.plan.optimal
    assert result.plan.total_s == pytest.approx(best, rel=1e-9)
    auto = plan(tn, m, PlanOptions())
    assert auto.plan.total_s == pytest.approx(best, rel=1e-9)


def test_state_and_its_writers_form_the_groups():
    net = typed(dense_net()).net
    assert state_writers(net) == {"w_momentum": [7], "w": [7, 9], "bias_momentum": [8], "bias": [8]}
    assert state_groups(net) == [{7, 9}]
    sparse = typed(sparse_net()).net
    assert state_writers(sparse) == {"emb": [7], "emb_squared_sum": [7], "w": [8], "w_squared_sum": [8],
                                     "bias": [9], "bias_squared_sum": [9]}
    assert state_groups(sparse) == []


def _copies(result, dev) -> dict:
    """(tensor, src, dst) -> bytes of every copy a placement needs, as a plan lists them."""
    from placer.partition.explain import make_plan
    from placer.training.placement import state_copy_bytes, step_costs
    p = make_plan(result.arrays, np.asarray(dev), "test")
    state_copy_bytes(step_costs(result.typed, result.costs)[1], result.arrays.t_names, p)
    return {(c.tensor, c.src, c.dst): c.nbytes for c in p.copies}


def test_a_weight_read_on_the_gpu_is_copied_every_step_and_its_gradient_once():
    tn = typed(dense_net())
    result = plan(tn, machine(1), PlanOptions(method="milp"))
    # forward and backward on the GPU, the updates (and the decay) on the CPU
    dev = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    copies = _copies(result, dev)
    w_bytes = 64 * 512 * 4
    assert copies[("w", "cpu", "cuda:0")] == w_bytes           # state: a copy per step
    assert copies[("bias", "cpu", "cuda:0")] == 64 * 4
    assert copies[("w_grad", "cuda:0", "cpu")] == w_bytes      # dense gradient, once
    assert copies[("x", "cpu", "cuda:0")] == 256 * 512 * 4
    assert copies[("label", "cpu", "cuda:0")] == 256 * 4
    assert len(copies) == 7    # + bias_grad d2h, + loss back to the host


def test_a_sparse_gradient_crosses_as_rows_not_as_the_table():
    tn = typed(sparse_net())
    result = plan(tn, machine(1), PlanOptions(method="milp"))
    # the table, its lookup and its update on the CPU; everything else on the GPU
    dev = [0, 1, 1, 1, 1, 1, 1, 0, 1, 1]
    copies = _copies(result, dev)
    assert copies[("emb_grad_values", "cuda:0", "cpu")] == 2048 * 64 * 4   # lookups x width
    assert not any(name == "emb" for name, _, _ in copies)
    # the lookup away from its table would copy the whole table every step
    away = _copies(result, [1, 1, 1, 1, 1, 1, 1, 0, 1, 1])
    assert away[("emb", "cpu", "cuda:0")] == 200_000 * 64 * 4


def test_a_gpu_too_small_for_the_table_and_its_state_keeps_them_on_the_cpu():
    tn = typed(sparse_net())
    m = machine(1)
    table = 200_000 * 64 * 4
    result = plan(tn, m, PlanOptions(method="milp", gpu_mem_bytes=1.5 * table, reserve=0.0))
    arr = result.arrays
    fits = [dev for dev in all_placements(arr.n_ops, arr.k)
            if colocated(tn.net, dev) and reference_memory(tn.net, tn, arr.k, dev)[1] <= 1.5 * table]
    best = min(fits, key=lambda dev: reference_seconds(tn.net, tn, m, arr.op_s, dev))
    assert result.plan.total_s == pytest.approx(reference_seconds(tn.net, tn, m, arr.op_s, best), rel=1e-9)
    p = result.plan
    assert p.device_of(7) == "cpu" and p.device_of(0) == "cpu"   # SparseAdagrad and its lookup


def test_the_simulator_starts_state_copies_at_time_zero(case):
    tn, m, result = case
    arr = result.arrays
    sim = Simulator(arr)
    dev = np.ones(arr.n_ops, np.int64)
    updates = [i for i, op in enumerate(tn.net.ops) if "Update" in op.type or "Adagrad" in op.type]
    dev[updates] = 0
    if "Scale" in [op.type for op in tn.net.ops]:
        dev[[op.index for op in tn.net.ops if op.type == "Scale"]] = 0
    makespan, events = sim.run(dev, record=True)
    assert np.isfinite(makespan)
    starts = {e["op"]: e["start_s"] for e in events if e["kind"] == "op"}
    state = [e for e in events if e["kind"] == "copy" and e["tensor"] in tn.net.params]
    assert state and all(e["src"] == "cpu" and e["dst"] != "cpu" for e in state)
    # issued at time 0 with the host-fed inputs, never after the update that makes them
    assert all(e["op"] is None for e in state)
    assert max(e["end_s"] for e in state) < min(starts[i] for i in updates)
    # every placement has a finite makespan no shorter than its longest device's busy time
    for dev in all_placements(arr.n_ops, arr.k)[:: max(1, arr.k ** arr.n_ops // 300)]:
        busy = np.bincount(dev, weights=arr.op_s[np.arange(arr.n_ops), dev], minlength=arr.k)
        assert busy.max() - 1e-12 <= sim.score(dev) < np.inf


def test_a_sparse_update_on_the_cpu_overlaps_the_gpu_updates():
    """The async step: the table's SparseAdagrad runs on the CPU while the GPU updates
    the FC, so the simulated step is shorter than the serial one by that overlap."""
    tn = typed(sparse_net())
    result = plan(tn, machine(1), PlanOptions(method="milp"))
    arr = result.arrays
    dev = np.array([0, 1, 1, 1, 1, 1, 1, 0, 1, 1])
    makespan, events = Simulator(arr).run(dev, record=True)
    ops = {e["op"]: e for e in events if e["kind"] == "op"}
    table_update, fc_updates = ops[7], (ops[8], ops[9])
    assert table_update["lane"] == "cpu" and all(u["lane"] == "cuda:0" for u in fc_updates)
    assert any(u["start_s"] < table_update["end_s"] and table_update["start_s"] < u["end_s"] for u in fc_updates)
    overlap = sum(min(u["end_s"], table_update["end_s"]) - max(u["start_s"], table_update["start_s"])
                  for u in fc_updates if u["start_s"] < table_update["end_s"])
    assert makespan <= serial_cost(arr, dev).total_s - overlap + 1e-12
