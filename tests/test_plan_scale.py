"""`placer plan` does work linear in the size of the net: counted, not timed.

The command once scanned every op for every parameter (15 s at 10k ops, 145 s at 30k).
These tests run the whole command (read, shapes, costs, graph, partition, check,
baselines, JSON, placed net and init net written) on nets of about 3k and 12k ops with a
weight and a bias per layer, on the CPU + one GPU and on an eight-GPU NVSwitch machine
(alpha-expansion, k-device baselines and explanations), and count the lines of placer's own code that each function
executes (``sys.settrace``). At 4x the ops a linear function executes about 4x the lines
(n log n: about 4.7x), a quadratic one 16x. Counting is exact on a busy host, where
timing is not; the wall-clock figures are bench/plan_cli_scale.py's job.

Work done inside C (numpy, protobuf) is not counted: a scan of a protobuf list per op
would pass here, so such scans are written as set lookups (see placer/rewrite/netdef.py).
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from placer import cli
from placer.examples.builder import NetBuilder

pytestmark = pytest.mark.slow

PLACER = str(Path(cli.__file__).resolve().parent)
GROWTH = 4            # the big net has GROWTH times the layers of the small one
LINEAR_SLACK = 1.25   # n log n from 3k to 12k ops is 4.7x, within 1.25 x 4
FLOOR_LINES = 2_000   # functions doing a fixed amount of work may wobble this much


def fc_net(layers: int) -> NetBuilder:
    """FC -> Relu (in place) -> Sum (residual add), one weight and one bias per FC."""
    b = NetBuilder(f"fc{layers}")
    x = b.input("data", (32, 64))
    for i in range(layers):
        w = b.param(f"fc{i}_w", (64, 64), "XavierFill")
        bias = b.param(f"fc{i}_b", (64,), "ConstantFill", value=0.0)
        h = b.op("FC", [x, w, bias], f"fc{i}")
        h = b.op("Relu", [h], h)
        x = b.op("Sum", [h, x], f"res{i}")
    b.output(x)
    return b


def mixed_net(blocks: int) -> NetBuilder:
    """Embedding tables (SparseLengthsSum, on the CPU for want of a GPU kernel's inputs
    fed from the host) feeding MLPs, a parameter shared by two FCs, a conv block with a
    SpatialBN: crossings, in-place chains, copies and twins of parameters in every block."""
    b = NetBuilder(f"mixed{blocks}")
    total = None
    for k in range(blocks):
        table = b.param(f"t{k}", (1000, 16), "UniformFill", min=-0.1, max=0.1)
        idx, lengths = b.input(f"i{k}", (128,), "int64"), b.input(f"l{k}", (64,), "int32")
        e = b.op("SparseLengthsSum", [table, idx, lengths], f"e{k}")
        w = b.param(f"w{k}", (16, 16), "XavierFill")
        bias = b.param(f"b{k}", (16,), "ConstantFill", value=0.1)
        h = b.op("FC", [e, w, bias], f"h{k}")
        h = b.op("Relu", [h], h)
        h = b.op("FC", [h, w, bias], f"g{k}")  # the same weight again
        img = b.op("Reshape", [h], [f"img{k}", f"img{k}_shape"], shape=[64, 16, 1, 1])
        cw = b.param(f"cw{k}", (16, 16, 1, 1), "MSRAFill")
        c = b.op("Conv", [img, cw], f"c{k}", kernel=1)
        bn = [b.param(f"bn{k}_{p}", (16,), "ConstantFill", value=v) for p, v in (("s", 1.0), ("b", 0.0),
                                                                                  ("m", 0.0), ("v", 1.0))]
        c = b.op("SpatialBN", [c, *bn], f"bn{k}", is_test=1, epsilon=1e-5)
        y = b.op("Flatten", [c], f"y{k}")
        total = y if total is None else b.op("Sum", [total, y], f"acc{k}")
    b.output(total)
    return b


def lines_per_function(run, root: str = PLACER) -> Counter:
    """Lines of the code under ``root`` (placer's) each function executes while ``run()``
    runs, by function (comprehensions count with the function they are written in)."""
    counts: Counter = Counter()

    def in_frame(frame, event, arg):
        if event == "line":
            counts[frame.f_code] += 1
        return in_frame

    def on_call(frame, event, arg):
        return in_frame if frame.f_code.co_filename.startswith(root) else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        run()
    finally:
        sys.settrace(previous)
    by_function: Counter = Counter()
    for code, n in counts.items():
        where = Path(code.co_filename).relative_to(root).as_posix()
        by_function[f"{where}::{code.co_qualname.split('.<locals>')[0]}"] += n
    return by_function


def plan_lines(tmp_path: Path, builder: NetBuilder, options: list[str], capsys) -> Counter:
    """Lines per function of ``placer plan`` on the net, with every output written."""
    tmp_path.mkdir()
    net, init = tmp_path / "net.pb", tmp_path / "net_init.pb"
    net.write_bytes(builder.predict.SerializeToString())
    init.write_bytes(builder.init.SerializeToString())
    (tmp_path / "net.value_info.json").write_text(builder.value_info_json())
    argv = ["plan", str(net), "--init-net", str(init), "-o", str(tmp_path / "placed.pbtxt"),
            "--init-out", str(tmp_path / "placed_init.pbtxt"), "--plan-out", str(tmp_path / "plan.json"),
            *options]
    outcome = []
    counts = lines_per_function(lambda: outcome.append(cli.main(argv)))
    out, err = capsys.readouterr()
    assert outcome == [0], err
    return counts


def super_linear(small: Counter, big: Counter) -> dict[str, tuple[int, int]]:
    """Functions whose lines grew faster than the net (with slack), with both counts."""
    return {f: (small.get(f, 0), n) for f, n in big.items()
            if n > LINEAR_SLACK * GROWTH * small.get(f, 0) + FLOOR_LINES}


# the MILP that checks alpha-expansion runs only on nets small enough for its time limit
# (milp.vars_within): on at the small net, skipped at the big one; a time-limited solver,
# not part of the path whose growth is measured here
EIGHT_GPUS = ["--machine", "8x-a100-40gb-nvswitch", "--time-limit", "0"]


@pytest.mark.parametrize("make, unit, options", [
    (fc_net, 1000, ["--input", "data=32,64", "--pin", "res*7=cpu"]),  # 3k and 12k ops
    (mixed_net, 300, ["--pin", "acc*7=cpu"]),                           # 3.3k and 13k ops
    (fc_net, 1000, ["--input", "data=32,64", "--pin", "res*7=cuda:3", *EIGHT_GPUS]),
    (mixed_net, 300, ["--pin", "acc*7=cpu", "--pin", "h1*=cuda:5", *EIGHT_GPUS]),
], ids=["fc-relu-sum", "sls-fc-conv", "fc-relu-sum-8-gpus", "sls-fc-conv-8-gpus"])
def test_plan_work_grows_linearly_with_the_net(tmp_path, capsys, make, unit, options):
    small = plan_lines(tmp_path / "small", make(unit), options, capsys)
    big = plan_lines(tmp_path / "big", make(GROWTH * unit), options, capsys)
    assert not super_linear(small, big), (
        "placer code whose work grows faster than the net (lines at the small and the big net): "
        + ", ".join(f"{f} {a:,} -> {b:,}" for f, (a, b) in super_linear(small, big).items()))
    total_small, total_big = sum(small.values()), sum(big.values())
    assert total_big <= LINEAR_SLACK * GROWTH * total_small
    assert total_big >= 0.8 * GROWTH * total_small  # the count sees the work that grows


def test_the_counter_catches_a_quadratic_function():
    """The measure itself: a loop over ops inside a loop over parameters is flagged, and
    code outside the root is not counted."""
    def quadratic(n):
        return lambda: [sum(1 for j in range(n) if j == i) for i in range(n)]

    here = str(Path(__file__).resolve().parent)
    small, big = (lines_per_function(quadratic(n), root=here) for n in (100, 400))
    assert list(super_linear(small, big)) == ["test_plan_scale.py::test_the_counter_catches_a_quadratic_function"]
    assert not lines_per_function(quadratic(100))  # this file is not placer's


def test_prices_and_spreads_once_per_signature_equal_them_op_by_op():
    """annotate and stability.op_spreads compute each op signature once; every op's
    prices, sources, kernels, features and spreads must equal the cost model's answer
    for that op alone, on a machine of a measured host, a V100 and two T4s. FCs of two
    widths repeat (one with a measured entry and spread on the host), Conv/SpatialBN
    blocks repeat with one of another channel count."""
    import dataclasses

    import numpy as np

    from placer.costs.model import annotate
    from placer.formats.caffe2 import net_from_netdef
    from placer.hardware.machine import build_machine
    from placer.partition.stability import op_spreads
    from placer.hardware.profiles import default_profiles, load_device_profile
    from placer.hardware.device_profile import OpTiming
    from placer.shapes import infer
    from placer.types import TensorType

    b = NetBuilder("sig")
    x = b.input("data", (8, 64))
    for i in range(12):
        width = 64 if i % 3 else 32
        w = b.param(f"w{i}", (width, 64), "XavierFill")
        bias = b.param(f"b{i}", (width,), "ConstantFill", value=0.0)
        h = b.op("FC", [x, w, bias], f"fc{i}")
        h = b.op("Relu", [h], h)
        x = b.op("FC", [h, b.param(f"u{i}", (64, width), "XavierFill"), b.param(f"c{i}", (64,), "ConstantFill")],
                 f"up{i}")
    img = b.op("Reshape", [x], ["img", "img_shape"], shape=[8, 64, 1, 1])
    for i in range(4):
        channels = 64 if i < 3 else 32
        cw = b.param(f"cw{i}", (channels, 64, 1, 1), "MSRAFill")
        y = b.op("Conv", [img, cw], f"conv{i}", kernel=1)
        bn = [b.param(f"bn{i}_{p}", (channels,), "ConstantFill", value=1.0) for p in "sbmv"]
        b.output(b.op("SpatialBN", [y, *bn], f"bn{i}", is_test=1, epsilon=1e-5))
    typed = infer(net_from_netdef(b.predict, b.init), {"data": TensorType((8, 64), "float32")})
    measured = [OpTiming("FC", typed.op_inputs[i], dict(typed.net.ops[i].args), 10, 3e-5, spread * 3e-5, 0.0, 0.0)
                for i, spread in ((0, 0.2), (2, 0.5))]   # fc0 (32 wide) and up0
    cpu, v100 = default_profiles()
    cpu = dataclasses.replace(cpu, ops={m.key: m for m in measured})
    t4 = load_device_profile("t4-pcie3", "gpu")
    machine = build_machine("mixed", cpu, [v100, t4, t4])
    costs = annotate(typed, machine)
    model = costs.model
    spreads = op_spreads(typed, model, range(machine.k))
    assert costs.op_source[0, 0] == costs.op_source[2, 0] == "measured"
    assert (spreads[0, 0], spreads[2, 0]) == (0.2, 0.5) and spreads[3, 0] not in (0.0, 0.2, 0.5)  # fc1: fitted
    for op, feats in zip(typed.net.ops, typed.features):
        i, ins = op.index, list(typed.op_inputs[op.index])
        for d in range(machine.k):
            assert (costs.op_s[i, d], costs.op_source[i, d]) == model.op_time(op.type, ins, op.args, feats, d)
            assert spreads[i, d] == model.op_spread(op.type, ins, op.args, feats, d)
        row = costs.ops.iloc[i]
        assert (row["flops"], row["macs"], row["param_bytes"]) == (feats.flops, feats.macs, feats.param_bytes)
        outs = sum(t.nbytes for t in typed.op_outputs[i] if t is not None)
        assert row["output_bytes"] == outs and row["type"] == op.type and row["name"] == op.name
        assert costs.kernels[i].tolist() == [True] * machine.k
    assert len({tuple(r) for r in costs.op_s.tolist()}) < len(typed.net.ops) / 3   # signatures repeat
    assert np.unique(costs.op_s[:, 2]).size > np.unique(costs.op_s[:, 1]).size - 1  # the T4 has its own column


@pytest.mark.parametrize("seed", range(12))
def test_the_milp_size_check_never_overestimates(seed):
    """A net too big for the MILP is skipped before it is built, on a lower bound of its
    variables: the bound must never exceed what the program really builds (else a net
    the MILP could solve would be skipped)."""
    import numpy as np

    from placer.partition import milp
    from placer.partition.synthetic import random_arrays
    rng = np.random.default_rng(seed)
    arr = random_arrays(int(rng.integers(3, 60)), seed=seed, gpus=int(rng.integers(1, 5)), hetero=bool(seed % 2))
    if seed % 3:
        arr.capacity = np.array([np.inf] + [1e8] * (arr.k - 1))
    prog = milp._Program()
    xi = milp._placement_rows(arr, prog, 1.0)
    milp._copy_rows(arr, prog, xi, 1.0)
    assert 0.25 * prog.n_vars < milp._least_variables(arr) <= prog.n_vars
    skipped = milp.milp_partition(arr, time_limit=1.0, max_vars=milp._least_variables(arr) - 1)
    assert skipped["status"] == "skipped" and skipped["x"] is None
