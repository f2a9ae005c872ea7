"""planner.plan through its Python API: invariants checked on every plan (and a broken
plan caught), colocation of in-place ops and parameter updates, the exact optimum against
brute force, the serial timeline, and planned nets that run like the CPU original."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_plan_cli import recompute

from placer import planner
from placer.examples.builder import NetBuilder
from placer.errors import InfeasiblePlanError
from placer.formats.caffe2 import net_from_netdef
from placer.partition.check import PlanInvariantError
from placer.planner import PlanOptions, plan
from placer.planview import plan_json, serial_schedule
from placer.profiling import default_profiles
from placer.rewrite import place
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import CPU, GPU0, PlanCopy, TensorType

PROFILES = default_profiles()


def typed_net(build, shapes):
    b = NetBuilder("t")
    build(b)
    net = net_from_netdef(b.predict, b.init)
    return infer(net, {k: TensorType(v, "float32") for k, v in shapes.items()})


def fanout(b):
    """x -> FC(h) read by Relu, Sigmoid and Sum (fan-out); w shared by two FCs; an
    in-place Relu on the last FC's output; a tiny side branch."""
    b.input("x", (64, 256))
    b.input("side", (100,))
    b.param("w", (256, 256), "XavierFill")
    b.param("bias", (256,), "ConstantFill", value=0.1)
    b.op("FC", ["x", "w", "bias"], "h", name="fc1")
    b.op("Relu", ["h"], "r", name="relu")
    b.op("Sigmoid", ["h"], "s", name="sigmoid")
    b.op("Sum", ["r", "s", "h"], "t", name="sum")
    b.op("FC", ["t", "w", "bias"], "u", name="fc2")
    b.op("Relu", ["u"], "u", name="relu_inplace")
    b.op("Relu", ["side"], "side_out", name="side_relu")
    for out in ("u", "s", "side_out"):
        b.output(out)


FANOUT_SHAPES = {"x": (64, 256), "side": (100,)}


def run_plan(typed, **options):
    return plan(typed, *PROFILES, PlanOptions(**options))


@pytest.fixture(scope="module")
def fan():
    return typed_net(fanout, FANOUT_SHAPES)


# -- invariants ---------------------------------------------------------------------------

def flip_first(p):
    placement = dict(p.placement)
    placement[0] = CPU if placement[0].is_gpu else GPU0
    return dataclasses.replace(p, placement=placement)


def drop_a_copy(p):
    assert p.copies
    return dataclasses.replace(p, copies=p.copies[1:])


def extra_copy(p):
    return dataclasses.replace(p, copies=p.copies + [PlanCopy("r", "d2h", 1.0, 0.0, 1, (3,))])


def cheaper(p):
    return dataclasses.replace(p, cost=dataclasses.replace(p.cost, compute_s=p.cost.compute_s * 0.99))


def missing_op(p):
    placement = dict(p.placement)
    placement.pop(len(placement) - 1)
    return dataclasses.replace(p, placement=placement)


def split_inplace(p):
    placement = dict(p.placement)
    placement[5] = CPU if placement[4].is_gpu else GPU0   # relu_inplace away from fc2
    return dataclasses.replace(p, placement=placement)


@pytest.mark.parametrize("tamper", [flip_first, drop_a_copy, extra_copy, cheaper, missing_op, split_inplace])
def test_every_plan_is_checked_and_a_broken_one_is_caught(fan, monkeypatch, tamper):
    real = planner.partition
    monkeypatch.setattr(planner, "partition", lambda *a, **k: tamper(real(*a, **k)))
    with pytest.raises(PlanInvariantError):
        run_plan(fan)


def test_memory_over_capacity_is_caught(fan, monkeypatch):
    real = planner.partition

    def unlimited(graph, method, capacity_bytes, reserve, time_limit):
        return real(graph, method, capacity_bytes=None, reserve=reserve, time_limit=time_limit)
    monkeypatch.setattr(planner, "partition", unlimited)
    with pytest.raises(PlanInvariantError, match="exceeds capacity"):
        run_plan(fan, gpu_mem_bytes=100_000, reserve=0.0)   # w alone is 262 kB


# -- colocation, pins ------------------------------------------------------------------------

def test_inplace_op_follows_its_producer(fan):
    free = run_plan(fan)
    assert free.plan.placement[4] == free.plan.placement[5] == GPU0
    pinned = run_plan(fan, pins=("relu_inplace=cpu",))
    assert pinned.plan.placement[4] == pinned.plan.placement[5] == CPU
    assert pinned.plan.reasons[5] == "pinned: --pin cpu"
    assert pinned.plan.reasons[4] == "colocated with an op pinned to cpu"
    with pytest.raises(InfeasiblePlanError, match="must share a device"):
        run_plan(fan, pins=("relu_inplace=cpu", "fc2=gpu"))


def test_a_parameter_and_the_op_updating_it_share_a_device():
    def build(b):
        b.input("x", (64, 256))
        b.param("w", (256, 256), "XavierFill")
        b.op("Relu", ["w"], "w", name="clip_w")       # updates the parameter in place
        b.op("MatMul", ["x", "w"], "y", name="mm")
        b.output("y")
    typed = typed_net(build, {"x": (64, 256)})
    assert planner.parameter_groups(typed.net) == [{0, 1}]
    for device in ("cpu", "gpu"):
        r = run_plan(typed, pins=(f"mm={device}",))
        assert r.plan.placement[0].kind == r.plan.placement[1].kind == device


def test_pins_spec_errors_name_the_option():
    typed = typed_net(fanout, FANOUT_SHAPES)
    for spec, words in (("fc1", "GLOB=cpu"), ("fc1=tpu", "GLOB=cpu"), ("=cpu", "GLOB=cpu"),
                        ("zzz*=gpu", "no op name")):
        with pytest.raises(Exception, match=words):
            planner.resolve_pins(typed.net, (spec,), False)
    assert planner.resolve_pins(typed.net, ("Relu=cpu",), False) == {1: "cpu", 5: "cpu", 6: "cpu"}
    assert planner.resolve_pins(typed.net, ("s=gpu",), False) == {2: "gpu"}   # output blob


def test_keep_existing_reads_device_options():
    def build(b):
        fanout(b)
        b.predict.op[1].device_option.device_type = 1
        b.predict.op[6].device_option.device_type = 0
    typed = typed_net(build, FANOUT_SHAPES)
    assert planner.existing_placement(typed.net) == {i: "gpu" if i == 1 else "cpu" for i in range(7)}
    assert planner.resolve_pins(typed.net, (), True) == {1: "gpu", 6: "cpu"}
    r = run_plan(typed, keep_existing=True)
    assert r.plan.placement[1] == GPU0 and r.plan.placement[6] == CPU
    assert "existing" in r.baselines


# -- optimality and the serial timeline ------------------------------------------------------

def test_mincut_equals_brute_force_on_the_fanout_net(fan):
    """Every placement priced from the plan JSON alone, by test_plan_cli.recompute."""
    r = run_plan(fan)
    doc = plan_json(r)
    best = float("inf")
    for bits in itertools.product(["cpu", "gpu"], repeat=6):
        dev = bits[:5] + bits[4:]                  # relu_inplace (5) shares fc2's (4) device
        ops = [{**o, "device": dev[o["index"]]} for o in doc["ops"]]
        best = min(best, recompute({**doc, "ops": ops})["total_s"])
    assert r.plan.cost.total_s == pytest.approx(best, rel=1e-9)
    assert r.plan.optimal


def test_serial_timeline_length_is_the_serial_objective(fan):
    for pins in ((), ("relu=cpu", "side_relu=gpu")):
        r = run_plan(fan, pins=pins)
        sched = serial_schedule(r)
        assert sched["makespan_s"] == pytest.approx(r.plan.cost.total_s, rel=1e-9)
        copies = [e for e in sched["events"] if e["kind"] == "copy"]
        assert len(copies) == len(r.plan.copies)
        doc = plan_json(r)
        assert max(doc["memory_timeline"]["gpu"]) == pytest.approx(doc["gpu_memory"]["used_bytes"])
        assert r.makespan["makespan_s"] <= sched["makespan_s"] * (1 + 1e-9)   # overlap never hurts


# -- planned nets run like the original ---------------------------------------------------------

@pytest.mark.parametrize("pins", [(), ("relu=cpu", "sum=cpu"), ("fc1=cpu", "sigmoid=cpu", "side_relu=gpu"),
                                  ("h=gpu", "Relu=cpu")])
def test_planned_fanout_net_runs_like_the_cpu_original(fan, pins):
    r = run_plan(fan, pins=pins)
    devices = {r.plan.placement[i].kind for i in range(7)}
    placed = place(fan.net, [r.plan.placement[i] for i in range(7)])
    directions = {d for _, d, _ in placed.copies}
    if pins:
        assert devices == {"cpu", "gpu"} and directions == {"h2d", "d2h"}
    assert len(placed.copies) == len(r.plan.copies)
    relu = next(op for op in placed.predict.op if op.name == "relu_inplace")
    assert relu.input[0] == relu.output[0] == ("u_gpu0" if r.plan.placement[5].is_gpu else "u")  # still in place
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((64, 256)).astype(np.float32),
              "side": rng.standard_normal(100).astype(np.float32)}
    ref = Executor(fan.net).run(inputs)
    got = Executor(net_from_netdef(placed.predict, placed.init), emulate_gpu=True).run(inputs)
    assert set(got) == set(ref) == {"u", "s", "side_out"}
    for k in ref:
        np.testing.assert_allclose(np.asarray(got[k]), ref[k], rtol=1e-5, atol=1e-6)


def test_the_emulated_run_catches_a_missing_copy(fan):
    """The comparison above can fail: a placed net without one of its copies is refused."""
    from placer.errors import DeviceError
    r = run_plan(fan, pins=("relu=cpu", "sum=cpu"))
    placed = place(fan.net, [r.plan.placement[i] for i in range(7)])
    k = next(i for i, op in enumerate(placed.predict.op) if op.type == "CopyGPUToCPU")
    src, dst = placed.predict.op[k].input[0], placed.predict.op[k].output[0]
    del placed.predict.op[k]
    for op in placed.predict.op:             # readers take the GPU blob directly
        op.input[:] = [src if b == dst else b for b in op.input]
    inputs = {"x": np.zeros((64, 256), np.float32), "side": np.zeros(100, np.float32)}
    with pytest.raises(DeviceError):
        Executor(net_from_netdef(placed.predict, placed.init), emulate_gpu=True).run(inputs)


def test_a_parameter_whose_fill_has_no_gpu_kernel_is_made_on_the_cpu_and_copied_once():
    def build(b):
        b.input("x", (4, 3))
        b.param("q", (4, 3), "GivenTensorInt16Fill", values=list(range(-6, 6)))
        b.op("Cast", ["q"], "qf", name="cast", to=1)
        b.op("Add", ["x", "qf"], "y", name="add")
        b.output("y")
    typed = typed_net(build, {"x": (4, 3)})
    r = run_plan(typed, pins=("cast=gpu",))
    placed = place(typed.net, [r.plan.placement[i] for i in range(2)])
    init = [(op.type, list(op.output), op.device_option.device_type) for op in placed.init.op]
    assert init == [("GivenTensorInt16Fill", ["q"], 0), ("CopyCPUToGPU", ["q_gpu0"], 1)]
    assert list(placed.predict.op[0].input) == ["q_gpu0"] and "q_gpu0" in placed.predict.external_input
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = Executor(net_from_netdef(placed.predict, placed.init), emulate_gpu=True).run({"x": x})
    np.testing.assert_array_equal(np.asarray(got["y"]), x + np.arange(-6, 6).reshape(4, 3))


def test_a_net_with_unknown_shapes_is_refused_not_priced_at_zero():
    from placer.errors import ShapeError
    typed = typed_net(fanout, {"x": (64, 256)})          # no shape for 'side'
    with pytest.raises(ShapeError, match="'side'"):
        run_plan(typed)


def test_a_file_placement_with_unknown_ops_on_the_gpu_is_flagged():
    """An op type placer does not know is pinned to the CPU; the file's own placement that
    puts it on the GPU can look cheaper, and the JSON says why."""
    def build(b):
        b.input("x", (8, 64))
        b.param("w", (64, 64), "XavierFill")
        b.param("bias", (64,), "ConstantFill", value=0.0)
        b.op("FC", ["x", "w", "bias"], "h", device=(1, 0))
        b.op("MysteryOp", ["h"], "y", device=(1, 0))
        b.output("y")
    typed = typed_net(build, {"x": (8, 64), "y": (8, 64)})
    doc = plan_json(run_plan(typed))
    existing = doc["baselines"]["existing"]
    assert doc["ops"][1]["device"] == "cpu" and doc["ops"][1]["pinned"] == "cpu"
    assert existing["gpu_ops"] == 2
    assert "places 1 op(s) on the GPU" in existing["note"] and "MysteryOp" in existing["note"]
    assert "note" not in doc["baselines"]["all_cpu"]


def _random_layers(rng, n_ops: int) -> NetBuilder:
    """Ops reading random earlier blobs and parameters, some writing a parameter or their
    own input in place: every shape the colocation rules meet."""
    b = NetBuilder("r")
    blobs = [b.input("x", (4, 4))]
    params = [b.param(f"p{k}", (4, 4), "XavierFill") for k in range(6)]
    for i in range(n_ops):
        ins = [blobs[j] for j in rng.integers(0, len(blobs), rng.integers(1, 3))]
        ins += [params[j] for j in rng.integers(0, len(params), rng.integers(0, 3))]
        roll = rng.random()
        out = (params[rng.integers(len(params))] if roll < 0.15 else ins[0] if roll < 0.35 else f"b{i}")
        b.op("Sum", ins, out)
        blobs.append(out)
    return b


@pytest.mark.parametrize("seed", range(5))
def test_colocation_groups_equal_their_definitions_by_brute_force(seed):
    """parameter_groups and inplace_pairs, built from one index, against a scan of every
    op for every parameter and blob (the definitions, written out)."""
    rng = np.random.default_rng(seed)
    b = _random_layers(rng, 60)
    net = net_from_netdef(b.predict, b.init)
    expected = []
    for p in net.params:
        writers = {op.index for op in net.ops if p in op.outputs}
        if writers:
            expected.append(writers | {op.index for op in net.ops if p in op.inputs})
    assert planner.parameter_groups(net) == expected and expected
    pairs = set()
    for op in net.ops:
        for name in set(op.inputs) & set(op.outputs):
            earlier = [o.index for o in net.ops[:op.index] if name in o.outputs]
            if earlier:
                pairs.add((op.index, earlier[-1]))
    assert set(planner.inplace_pairs(net)) == pairs and pairs


def test_plan_json_text_is_the_same_document_one_record_a_line(fan):
    """The written plan parses to the document (the json module is the oracle), with
    each op, tensor and event on a line of its own."""
    import json

    from placer.planview import json_text
    doc = plan_json(run_plan(fan))
    text = json_text(doc)
    assert json.loads(text) == json.loads(json.dumps(doc))
    lines = text.splitlines()
    for op in doc["ops"]:
        assert sum(line.strip().rstrip(",") == json.dumps(op) for line in lines) == 1
    assert lines[0] == "{" and lines[1].startswith(' "net": ') and lines[-1] == "}"
    assert len(lines) < 200  # records whole, not a field a line
