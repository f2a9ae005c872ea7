"""planner.plan through its Python API on the CPU + one GPU machine: invariants checked on
every plan (and a broken plan caught), colocation of in-place ops and parameter updates,
pins, the exact optimum against brute force, the serial timeline, and planned nets that
run like the CPU original."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from test_plan_cli import recompute

from placer.planning import planner
from placer.costs.model import annotate
from placer.errors import InfeasiblePlanError, PlacerError
from placer.examples.builder import NetBuilder
from placer.formats.caffe2 import net_from_netdef
from placer.hardware.machine import compose_machine
from placer.partition.check import PlanInvariantError
from placer.planning.planner import PlanOptions, plan
from placer.planning.view import plan_json, serial_schedule
from placer.hardware.profiles import default_profiles
from placer.rewrite.netdef import place
from placer.runtime.executor import Executor
from placer.shapes import infer
from placer.types import PlanCopy, TensorType

MACHINE = compose_machine(*default_profiles())     # the host and one GPU
CPU, GPU = MACHINE.index("cpu"), MACHINE.index("cuda:0")
DIRECTION = {("cpu", "cuda:0"): "h2d", ("cuda:0", "cpu"): "d2h"}


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
    return plan(typed, MACHINE, PlanOptions(**options))


def allowed(typed, specs=(), keep_existing=False):
    """The planner's restrictions: devices each op may take, and why."""
    return planner.allowed_devices(typed.net, annotate(typed, MACHINE), MACHINE, specs, keep_existing)


@pytest.fixture(scope="module")
def fan():
    return typed_net(fanout, FANOUT_SHAPES)


# -- invariants ---------------------------------------------------------------------------

def flip_first(p):
    placement = p.placement.copy()
    placement[0] = CPU if placement[0] == GPU else GPU
    return dataclasses.replace(p, placement=placement)


def drop_a_copy(p):
    assert p.copies
    return dataclasses.replace(p, copies=p.copies[1:])


def extra_copy(p):
    return dataclasses.replace(p, copies=p.copies + [PlanCopy("r", "cuda:0", "cpu", 1.0, 0.0, 1, (3,), "gpu", "cpu")])


def cheaper(p):
    return dataclasses.replace(p, cost=dataclasses.replace(p.cost, compute_s=p.cost.compute_s * 0.99))


def missing_op(p):
    return dataclasses.replace(p, placement=p.placement[:-1])


def split_inplace(p):
    placement = p.placement.copy()
    placement[5] = CPU if placement[4] == GPU else GPU   # relu_inplace away from fc2
    return dataclasses.replace(p, placement=placement)


@pytest.mark.parametrize("tamper", [flip_first, drop_a_copy, extra_copy, cheaper, missing_op, split_inplace])
def test_every_plan_is_checked_and_a_broken_one_is_caught(fan, monkeypatch, tamper):
    real = planner.partition
    monkeypatch.setattr(planner, "partition", lambda *a, **k: tamper(real(*a, **k)))
    with pytest.raises(PlanInvariantError):
        run_plan(fan)


def test_memory_over_capacity_is_caught(fan, monkeypatch):
    real = planner.partition

    def unlimited(arrays, method, **options):      # a partitioner that forgets the limits
        return real(dataclasses.replace(arrays, capacity=np.full(arrays.k, np.inf)), method, **options)
    monkeypatch.setattr(planner, "partition", unlimited)
    with pytest.raises(PlanInvariantError, match="exceeds capacity"):
        run_plan(fan, gpu_mem_bytes=100_000, reserve=0.0)   # w alone is 262 kB


# -- colocation, pins ------------------------------------------------------------------------

def test_inplace_op_follows_its_producer(fan):
    free = run_plan(fan)
    assert free.plan.placement[4] == free.plan.placement[5] == GPU
    pinned = run_plan(fan, pins=("relu_inplace=cpu",))
    assert pinned.plan.placement[4] == pinned.plan.placement[5] == CPU
    assert pinned.plan.reasons[5] == "pinned: --pin cpu"
    assert pinned.plan.reasons[4] == "colocated with an op pinned to cpu"
    with pytest.raises(InfeasiblePlanError, match="must share a device have no device in common"):
        run_plan(fan, pins=("relu_inplace=cpu", "fc2=gpu"))
    with pytest.raises(InfeasiblePlanError, match="must share a device have no device in common"):
        run_plan(fan, pins=("relu_inplace=cpu", "fc2=cuda:0"))


def test_the_ops_updating_a_parameter_share_its_device_and_readers_may_sit_elsewhere():
    def build(b):
        b.input("x", (64, 256))
        b.param("w", (256, 256), "XavierFill")
        b.op("Relu", ["w"], "w", name="clip_w")       # two updates of the parameter in place
        b.op("Sigmoid", ["w"], "w", name="squash_w")
        b.op("MatMul", ["x", "w"], "y", name="mm")    # a reader only
        b.output("y")
    typed = typed_net(build, {"x": (64, 256)})
    assert planner.parameter_groups(typed.net) == [{0, 1}]
    for device in ("cpu", "cuda:0"):
        r = run_plan(typed, pins=(f"squash_w={device}",))
        assert r.plan.device_of(0) == r.plan.device_of(1) == device
    # a reader pinned away from the state's device reads a copy of it (rule 2)
    r = run_plan(typed, pins=("squash_w=cuda:0", "mm=cpu"))
    assert [r.plan.device_of(i) for i in range(3)] == ["cuda:0", "cuda:0", "cpu"]
    assert [(c.tensor, c.src, c.dst) for c in r.plan.copies if c.tensor == "w"] == [("w", "cuda:0", "cpu")]


def only(*devices):
    """An allowed row: True on the named devices."""
    return [name in devices for name in MACHINE.names]


def test_pins_spec_errors_name_the_option(fan):
    for spec, words in (("fc1", "expected GLOB=DEVICE"), ("fc1=tpu", "has no device 'tpu'"),
                        ("=cpu", "expected GLOB=DEVICE"), ("zzz*=gpu", "no op name")):
        with pytest.raises(PlacerError, match=words) as e:
            allowed(fan, (spec,))
        assert f"--pin '{spec}'" in str(e.value)
    mask, why = allowed(fan, ("Relu=cpu",))            # an op type
    assert [i for i in range(7) if mask[i].tolist() == only("cpu")] == [1, 5, 6]
    assert why[1] == why[5] == why[6] == "pinned: --pin cpu"
    for spec in ("s=gpu", "s=cuda:0"):                 # an output blob; "gpu" is the only GPU
        mask, why = allowed(fan, (spec,))
        assert [i for i in range(7) if not mask[i].all()] == [2] and mask[2].tolist() == only("cuda:0")
    mask, _ = allowed(fan, ("Relu=cpu", "relu=gpu"))   # a later pin replaces an earlier one
    assert mask[1].tolist() == only("cuda:0") and mask[5].tolist() == only("cpu")


def test_ops_without_a_gpu_kernel_or_of_unknown_type_are_held_on_the_cpu():
    def build(b):
        b.input("lens", (4,), "int32")
        b.input("x", (8, 64))
        b.op("LengthsToRanges", ["lens"], "seg", name="segments")       # no GPU kernel
        b.op("MysteryOp", ["x"], "y", name="mystery")                   # unknown to placer
        b.op("Relu", ["x"], "r", name="relu")
        for out in ("seg", "y", "r"):
            b.output(out)
    nb = NetBuilder("t")
    build(nb)
    shapes = {"lens": TensorType((4,), "int32"), "x": TensorType((8, 64), "float32"),
              "y": TensorType((8, 64), "float32")}
    typed = infer(net_from_netdef(nb.predict, nb.init), shapes)
    mask, why = allowed(typed)
    assert mask.tolist() == [only("cpu"), only("cpu"), only("cpu", "cuda:0")]
    assert why == ["pinned: no GPU kernel", "pinned: unknown op type", ""]
    with pytest.raises(InfeasiblePlanError, match="'segments' is pinned to --pin cuda:0 but no GPU kernel"):
        allowed(typed, ("segments=cuda:0",))


def test_keep_existing_reads_device_options():
    def build(b):
        fanout(b)
        b.predict.op[1].device_option.device_type = 1
        b.predict.op[6].device_option.device_type = 0
    typed = typed_net(build, FANOUT_SHAPES)
    assert planner.existing_placement(typed.net, MACHINE).tolist() == [GPU if i == 1 else CPU for i in range(7)]
    mask, why = allowed(typed, keep_existing=True)
    assert [i for i in range(7) if not mask[i].all()] == [1, 6]
    assert mask[1].tolist() == only("cuda:0") and mask[6].tolist() == only("cpu")
    assert why[1] == "pinned: the file's cuda:0 (--keep-existing)"
    assert why[6] == "pinned: the file's cpu (--keep-existing)"
    r = run_plan(typed, keep_existing=True)
    assert r.plan.placement[1] == GPU and r.plan.placement[6] == CPU
    assert "existing" in r.baselines


# -- optimality and the serial timeline ------------------------------------------------------

def test_mincut_equals_brute_force_on_the_fanout_net(fan):
    """Every placement priced from the plan JSON alone, by test_plan_cli.recompute."""
    r = run_plan(fan)
    doc = plan_json(r)
    best = float("inf")
    for bits in itertools.product(["cpu", "cuda:0"], repeat=6):
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
    devices = {r.plan.device_of(i) for i in range(7)}
    placed = place(fan.net, r.plan.placement, MACHINE)
    directions = {DIRECTION[src, dst] for _, src, dst, _ in placed.copies}
    if pins:
        assert devices == {"cpu", "cuda:0"} and directions == {"h2d", "d2h"}
    assert sorted(c[:3] for c in placed.copies) == sorted((c.tensor, c.src, c.dst) for c in r.plan.copies)
    relu = next(op for op in placed.predict.op if op.name == "relu_inplace")
    assert relu.input[0] == relu.output[0] == ("u_gpu_0" if r.plan.placement[5] == GPU else "u")  # still in place
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
    placed = place(fan.net, r.plan.placement, MACHINE)
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
    placed = place(typed.net, r.plan.placement, MACHINE)
    init = [(op.type, list(op.output), op.device_option.device_type) for op in placed.init.op]
    assert init == [("GivenTensorInt16Fill", ["q"], 0), ("CopyCPUToGPU", ["q_gpu_0"], 1)]
    assert list(placed.predict.op[0].input) == ["q_gpu_0"] and "q_gpu_0" in placed.predict.external_input
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
    assert existing["gpu_ops"] == 2 and existing["devices_used"] == ["cuda:0"]
    assert "places 1 op(s) where this plan may not put them" in existing["note"]
    assert "MysteryOp" in existing["note"]
    assert "note" not in doc["baselines"]["all_cpu"]
