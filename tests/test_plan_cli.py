"""`placer plan` end to end: the JSON anyone can recompute, reasons, options, errors, the
placed net file. Nets are built here with NetBuilder and saved beside a value_info.json.

The helpers at the top (``cli_plan``, ``plan_doc``, ``recompute``) are shared with the
other plan tests.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from google.protobuf import text_format

from placer import cli
from placer.examples.builder import NetBuilder
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import load_netdef

COPY_TYPES = ("CopyCPUToGPU", "CopyGPUToCPU")


# -- helpers ---------------------------------------------------------------------------

def cli_plan(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def strict_json(text: str) -> dict:
    """JSON as any parser reads it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"{name} in the plan JSON")
    return json.loads(text, parse_constant=refuse)


def plan_doc(capsys, *argv) -> dict:
    rc, out, err = cli_plan(capsys, *argv, "--json")
    assert rc == 0, err
    return strict_json(out)


def recompute(doc: dict, outputs_on_host: bool | None = None) -> dict:
    """The plan's serial cost from the JSON alone: each op's time on its device
    (``time_s``), and the copies the placement needs, each tensor once per device that
    reads it away from where it is made (parameters, producer -2, are never copied; the
    host reads external outputs). A copy between the host and the first GPU takes the
    tensor's ``h2d_s`` / ``d2h_s``; any other, the document's own copy entry's time."""
    if outputs_on_host is None:
        outputs_on_host = doc.get("outputs_on_host", True)
    dev = {o["index"]: o["device"] for o in doc["ops"]}
    compute = sum(o["time_s"][o["device"]] for o in doc["ops"])
    host = doc["devices"][0]
    first_gpu = next((d["name"] for d in doc["machine"]["devices"] if d["kind"] == "gpu"), None)
    given = {(c["tensor"], c["src"], c["dst"]): c for c in doc["copies"]}
    copy_s, links, copies = 0.0, {}, set()
    for t in doc["tensors"]:
        p = t["producer"]
        if p == -2:
            continue
        where = host if p == -1 else dev[p]
        readers = {dev[c] for c in t["consumers"] if c != p}
        if t["external_output"] and outputs_on_host:
            readers.add(host)
        for dst in sorted(readers - {where}):
            key = (t["name"], where, dst)
            copies.add(key)
            if {where, dst} == {host, first_gpu}:
                copy_s += t["h2d_s"] if where == host else t["d2h_s"]
            else:
                copy_s += given[key]["time_s"]
            links[(where, dst)] = links.get((where, dst), 0.0) + t["bytes"]
    kind = {d["name"]: d["kind"] for d in doc["machine"]["devices"]}
    nbytes = {"h2d": 0.0, "d2h": 0.0, "d2d": 0.0}
    for (a, b), n in links.items():
        nbytes[{("cpu", "gpu"): "h2d", ("gpu", "cpu"): "d2h", ("gpu", "gpu"): "d2d"}[(kind[a], kind[b])]] += n
    return {"total_s": compute + copy_s, "compute_s": compute, "copy_s": copy_s, "pcie_bytes": nbytes,
            "copies": copies, "link_bytes": links}


def assert_consistent(doc: dict, outputs_on_host: bool | None = None) -> dict:
    """The JSON's totals, copies, bytes per link and direction equal the recomputation;
    every device's memory fits."""
    mine = recompute(doc, outputs_on_host)
    assert doc["total_s"] == pytest.approx(mine["total_s"], rel=1e-9, abs=1e-15)
    assert doc["compute_s"] + doc["copy_s"] == pytest.approx(mine["total_s"], rel=1e-9, abs=1e-15)
    assert {(c["tensor"], c["src"], c["dst"]) for c in doc["copies"]} == mine["copies"]
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert all(c["bytes"] == tensors[c["tensor"]]["bytes"] for c in doc["copies"])
    for d in ("h2d", "d2h", "d2d"):
        assert doc["pcie_bytes"][d] == pytest.approx(mine["pcie_bytes"][d], rel=1e-12)
    assert {(x["src"], x["dst"]): x["bytes"] for x in doc["link_bytes"]} == pytest.approx(mine["link_bytes"], rel=1e-12)
    for m in doc["memory"].values():
        if m["usable_bytes"] is not None:
            assert m["used_bytes"] <= m["usable_bytes"] * (1 + 1e-12)
    return mine


def by_name(doc: dict) -> dict:
    return {o["name"]: o for o in doc["ops"]}


def mixed_net(folder: Path, devices: dict | None = None, value_info: bool = True) -> dict:
    """An MLP the GPU wins (fc1, relu1, fc2, prob; w1 shared by both FCs), a tiny side
    branch whose copies cost more than the GPU saves (side_relu), and an op with no GPU
    kernel (segments). ``devices`` maps op name -> (device_type, device_id)."""
    devices = devices or {}
    b = NetBuilder("mixed")
    b.input("x", (256, 1024))
    b.input("side", (1000,))
    b.input("lengths", (4,), "int32")
    b.param("w1", (1024, 1024), "XavierFill")
    b.param("b1", (1024,), "ConstantFill", value=0.1)
    for kind, ins, out, name in (("FC", ["x", "w1", "b1"], "h1", "fc1"), ("Relu", ["h1"], "r1", "relu1"),
                                 ("FC", ["r1", "w1", "b1"], "h2", "fc2"), ("Sigmoid", ["h2"], "prob", "prob"),
                                 ("Relu", ["side"], "side_out", "side_relu"),
                                 ("LengthsToRanges", ["lengths"], "seg", "segments")):
        b.op(kind, ins, out, name=name, device=devices.get(name))
    for out in ("prob", "side_out", "seg"):
        b.output(out)
    paths = b.save(folder, "mixed")
    if not value_info:
        paths.pop("value_info").unlink()
    return paths


@pytest.fixture
def mixed(tmp_path) -> dict:
    return mixed_net(tmp_path)


def plan_mixed(capsys, paths, *extra) -> dict:
    return plan_doc(capsys, paths["predict"], "--init-net", paths["init"], *extra)


# -- the JSON and the reasons ------------------------------------------------------------

def test_json_layout_recomputes_to_the_reported_total(capsys, mixed):
    doc = plan_mixed(capsys, mixed)
    for key in ("schema_version", "objective", "method", "solver", "total_s", "optimal", "gap", "ops", "tensors",
                "baselines", "gpu_memory", "pcie_bytes", "machine", "devices", "memory", "link_bytes"):
        assert key in doc
    assert doc["schema_version"] == 2 and doc["devices"] == ["cpu", "cuda:0"]
    assert doc["objective"] == "serial" and doc["method"] == "auto" and doc["solver"].startswith("mincut")
    assert doc["optimal"] is True and doc["gap"] == 0.0
    assert [o["index"] for o in doc["ops"]] == list(range(6))
    for o in doc["ops"]:   # version-1 fields are still there: cpu_s, gpu_s (the first GPU's)
        assert set(o) >= {"index", "name", "type", "device", "device_kind", "time_s", "cpu_s", "gpu_s", "reason"}
        assert o["device"] in ("cpu", "cuda:0") and o["reason"]
        assert o["time_s"] == {"cpu": o["cpu_s"], "cuda:0": o["gpu_s"]}
        assert o["device_kind"] == ("cpu" if o["device"] == "cpu" else "gpu")
    for t in doc["tensors"]:
        assert set(t) >= {"name", "producer", "consumers", "bytes", "h2d_s", "d2h_s", "external_output"}
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert tensors["w1"]["producer"] == -2 and tensors["w1"]["consumers"] == [0, 2]
    assert tensors["w1"]["bytes"] == 1024 * 1024 * 4
    assert tensors["x"]["producer"] == -1 and tensors["x"]["bytes"] == 256 * 1024 * 4
    assert tensors["prob"]["external_output"] and tensors["prob"]["producer"] == 3
    mine = assert_consistent(doc)
    assert mine["copy_s"] > 0                      # x goes up, prob comes back
    assert {"all_cpu", "all_gpu", "greedy", "pipeline", "m_topo", "m_etf", "lower_bound"} <= set(doc["baselines"])
    assert "existing" not in doc["baselines"]
    # the exact optimum is never worse than a baseline, never better than the bound
    for name in ("all_cpu", "all_gpu", "greedy", "pipeline", "m_topo", "m_etf"):
        assert doc["total_s"] <= doc["baselines"][name]["total_s"] * (1 + 1e-9)
        assert doc["baselines"][name]["feasible"] is True
    assert doc["total_s"] >= doc["baselines"]["lower_bound"]["total_s"] * (1 - 1e-9)
    # w1 read by two GPU ops is on the GPU once
    assert doc["gpu_memory"]["param_bytes"] == pytest.approx((1024 * 1024 + 1024) * 4)


def test_reasons_say_why(capsys, mixed):
    ops = by_name(plan_mixed(capsys, mixed))
    for name in ("fc1", "fc2"):
        o = ops[name]
        assert o["device"] == "cuda:0"
        m = re.fullmatch(r"cuda:0 ([0-9.]+)x faster than cpu", o["reason"])
        assert m, o["reason"]
        assert float(m.group(1)) == pytest.approx(o["cpu_s"] / o["gpu_s"], rel=0.06)
    seg = ops["segments"]
    assert seg["device"] == "cpu" and seg["reason"] == "pinned: no GPU kernel" and seg["pinned"] == "cpu"
    side = ops["side_relu"]
    # alone the GPU is faster, but copying 'side' up and 'side_out' back costs more
    assert side["gpu_s"] < side["cpu_s"] and side["device"] == "cpu"
    assert re.fullmatch(r"cpu: copy of '(side|side_out)' costs more than cuda:0 saves", side["reason"])


def test_table_output_names_baselines_memory_and_pcie(capsys, mixed):
    rc, out, err = cli_plan(capsys, mixed["predict"], "--init-net", mixed["init"])
    assert rc == 0, err
    assert "pinned: no GPU kernel" in out and "optimal for the serial objective" in out
    for label in ("all on the CPU", "all on one GPU", "pipeline split", "Baechi m-TOPO", "Baechi m-ETF", "lower bound"):
        assert label in out
    assert "memory cuda:0: 6 MiB used of 14.4 GiB usable" in out       # w1 + b1 (4 MiB) and activations
    assert "copies per run: 1 MiB cpu->cuda:0, 1 MiB cuda:0->cpu, in 2 copies" in out   # x up, prob back
    assert "your placement" not in out


# -- options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("glob, op, device", [("fc1=cpu", "fc1", "cpu"), ("h2=cpu", "fc2", "cpu"),
                                              ("Sigmoid=cpu", "prob", "cpu"), ("side_*=gpu", "side_relu", "cuda:0"),
                                              ("side_*=cuda:0", "side_relu", "cuda:0")])
def test_pin_matches_op_names_output_blobs_and_types(capsys, mixed, glob, op, device):
    free = plan_mixed(capsys, mixed)
    doc = plan_mixed(capsys, mixed, "--pin", glob)
    o = by_name(doc)[op]
    assert o["device"] == device != by_name(free)[op]["device"]
    assert o["reason"] == f"pinned: --pin {glob.rsplit('=', 1)[1]}" and o["pinned"] == device
    assert_consistent(doc)
    assert doc["total_s"] > free["total_s"]        # the free plan was optimal


def test_keep_existing_pins_the_files_placement_and_scores_it(capsys, tmp_path):
    paths = mixed_net(tmp_path, devices={"fc1": (0, 0), "relu1": (1, 0), "side_relu": (1, 0)})
    free = plan_mixed(capsys, paths)
    kept = plan_mixed(capsys, paths, "--keep-existing")
    assert by_name(free)["fc1"]["device"] == "cuda:0" and by_name(free)["side_relu"]["device"] == "cpu"
    assert by_name(kept)["fc1"]["device"] == "cpu"
    assert by_name(kept)["relu1"]["device"] == "cuda:0" and by_name(kept)["side_relu"]["device"] == "cuda:0"
    assert by_name(kept)["relu1"]["reason"] == "pinned: the file's cuda:0 (--keep-existing)"
    assert_consistent(kept)
    # the existing placement: ops without a device_option run on the CPU, as Caffe2 does
    existing = {o["index"]: "cpu" for o in free["ops"]}
    existing.update({1: "cuda:0", 4: "cuda:0"})
    scored = recompute({**free, "ops": [{**o, "device": existing[o["index"]]} for o in free["ops"]]})
    assert free["baselines"]["existing"]["total_s"] == pytest.approx(scored["total_s"], rel=1e-9)
    assert free["total_s"] < free["baselines"]["existing"]["total_s"]
    rc, out, _ = cli_plan(capsys, paths["predict"], "--init-net", paths["init"])
    line = [x for x in out.splitlines() if x.startswith("your placement:")]
    assert rc == 0 and len(line) == 1 and ", ours: " in line[0]


def test_gpu_mem_and_reserve(capsys, mixed):
    doc = plan_mixed(capsys, mixed, "--gpu-mem", "1GiB")
    assert doc["gpu_memory"]["capacity_bytes"] == 2 ** 30
    assert doc["gpu_memory"]["usable_bytes"] == pytest.approx(0.9 * 2 ** 30)
    assert plan_mixed(capsys, mixed, "--gpu-mem", "16gib")["gpu_memory"]["capacity_bytes"] == 16 * 2 ** 30
    none = plan_mixed(capsys, mixed, "--gpu-mem", "0")        # no GPU memory: nothing on the GPU
    assert none["gpu_memory"]["capacity_bytes"] == 0 and {o["device"] for o in none["ops"]} == {"cpu"}
    assert none["memory"]["cuda:0"] == {"used_bytes": 0.0, "param_bytes": 0.0, "peak_activation_bytes": 0.0,
                                        "capacity_bytes": 0.0, "usable_bytes": 0.0}
    doc = plan_mixed(capsys, mixed, "--gpu-mem", "2GB", "--gpu-reserve", "25%")
    assert doc["gpu_memory"]["usable_bytes"] == pytest.approx(1.5e9)
    # 4 MB of GPU memory cannot hold w1 (4.2 MB): both FCs go to the CPU, and say why
    doc = plan_mixed(capsys, mixed, "--gpu-mem", "4MB", "--gpu-reserve", "0")
    ops = by_name(doc)
    assert ops["fc1"]["device"] == ops["fc2"]["device"] == "cpu"
    assert any("fit" in ops[n]["reason"] for n in ("fc1", "fc2")), [ops[n]["reason"] for n in ops]
    assert not doc["baselines"]["all_gpu"]["feasible"]
    assert doc["baselines"]["all_gpu"]["why_infeasible"] == "needs 6 MiB on cuda:0; 3.81 MiB usable"
    assert_consistent(doc)


def test_methods_agree_where_they_should(capsys, mixed):
    mincut = plan_mixed(capsys, mixed)
    milp = plan_mixed(capsys, mixed, "--method", "milp")
    greedy = plan_mixed(capsys, mixed, "--method", "greedy")
    span = plan_mixed(capsys, mixed, "--method", "makespan")
    for doc in (milp, greedy, span):
        assert_consistent(doc)
    assert milp["method"] == "milp" and milp["total_s"] == pytest.approx(mincut["total_s"], rel=1e-9)
    assert greedy["total_s"] == pytest.approx(greedy["baselines"]["greedy"]["total_s"], rel=1e-12)
    assert span["objective"] == "makespan"
    ms = lambda d: d["schedules"]["makespan"]["makespan_s"]  # noqa: E731
    assert ms(span) <= ms(mincut) * (1 + 1e-9)
    # the makespan plan says how it compares with the serial (min-cut) plan's own overlapped schedule
    m = re.search(r"serial plan ([0-9.e+-]+) s", " ".join(span["notes"]))
    assert m and float(m.group(1)) == pytest.approx(ms(mincut), rel=1e-5)
    assert all(b["makespan_s"] > 0 for k, b in span["baselines"].items() if k != "lower_bound")
    assert "makespan_s" not in mincut["baselines"]["all_cpu"]


def test_outputs_left_on_the_gpu_pay_no_copy_back(capsys, tmp_path):
    paths = mixed_net(tmp_path)
    on_host = plan_mixed(capsys, paths)
    out = tmp_path / "placed.pbtxt"
    doc = plan_mixed(capsys, paths, "--no-outputs-on-host", "-o", out)
    assert on_host["outputs_on_host"] is True and doc["outputs_on_host"] is False
    assert ("prob", "d2h") in {(c["tensor"], c["direction"]) for c in on_host["copies"]}
    assert ("prob", "d2h") not in {(c["tensor"], c["direction"]) for c in doc["copies"]}
    assert_consistent(doc, outputs_on_host=False)
    assert doc["total_s"] < on_host["total_s"]
    placed = load_netdef(out)
    prob = next(op for op in placed.op if op.name == "prob")
    assert list(prob.output) == ["prob"] and prob.device_option.device_type == 1
    assert not any(op.type == "CopyGPUToCPU" and "prob" in op.output for op in placed.op)


def test_unknown_op_type_is_planned_on_the_cpu(capsys, tmp_path):
    b = NetBuilder("unk")
    b.input("x", (256, 1024))
    b.op("Relu", ["x"], "a", name="relu")
    b.op("MyCustomOp", ["a"], "c", name="custom")
    b.op("Sigmoid", ["c"], "d", name="sigmoid")
    b.output("d")
    paths = b.save(tmp_path, "unk")
    err = one_line_error(capsys, paths["predict"])
    assert "'c'" in err and "--input" in err          # its output's shape cannot be inferred
    doc = plan_doc(capsys, paths["predict"], "--input", "c=256,1024", "--unknown-op-cost", "0.002")
    custom = by_name(doc)["custom"]
    assert custom["device"] == "cpu" and custom["reason"] == "pinned: unknown op type"
    assert custom["cpu_s"] == pytest.approx(0.002)
    assert_consistent(doc)


def test_keep_existing_gpu_op_without_gpu_kernel_is_an_error(capsys, tmp_path):
    paths = mixed_net(tmp_path, devices={"segments": (1, 0)})
    err = one_line_error(capsys, paths["predict"], "--init-net", paths["init"], "--keep-existing")
    assert "segments" in err and "LengthsToRanges" in err and "cuda:0" in err and "no GPU kernel" in err


def test_keep_existing_error_says_the_pin_came_from_the_file(capsys, tmp_path):
    paths = mixed_net(tmp_path, devices={"segments": (1, 0)})
    err = one_line_error(capsys, paths["predict"], "--init-net", paths["init"], "--keep-existing")
    assert "--keep-existing" in err or "the file's" in err


# -- errors ---------------------------------------------------------------------------------

def one_line_error(capsys, *argv) -> str:
    rc, out, err = cli_plan(capsys, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placer: error: "), err
    return lines[0]


def test_infeasible_pin_names_the_ops_and_bytes_over(capsys, mixed):
    err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"], "--pin", "fc1=gpu",
                         "--gpu-mem", "1MB", "--gpu-reserve", "0")
    assert "fc1" in err and "over" in err and "MiB" in err


def test_unknown_shapes_say_what_to_add(capsys, tmp_path):
    paths = mixed_net(tmp_path, value_info=False)
    init = paths["init"].rename(tmp_path / "weights.pbtxt")   # not found beside the net by name
    err = one_line_error(capsys, paths["predict"])       # no init net, no input shapes
    assert "--init-net" in err and "--input" in err and "'w1'" in err
    err = one_line_error(capsys, paths["predict"], "--init-net", init)
    assert "'x'" in err and "--input NAME=" in err


@pytest.mark.parametrize("option, value, words", [
    ("--pin", "fc1", "GLOB=DEVICE"), ("--pin", "fc1=tpu", "no device 'tpu' (devices: cpu, cuda:0)"),
    ("--pin", "fc1=cuda:1", "no device 'cuda:1'"), ("--pin", "nothing*=cpu", "no op name")])
def test_bad_option_values(capsys, mixed, option, value, words):
    err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"], option, value)
    assert words in err and value in err


@pytest.mark.parametrize("option, value, words", [
    ("--gpu-mem", "lots", "16GiB"), ("--gpu-mem", "1.2.3GB", "16GiB"), ("--gpu-mem", "e", "16GiB"),
    ("--gpu-mem", "16XB", "16GiB"), ("--gpu-mem", "1e400", "16GiB"), ("--time-limit", "-1", ">= 0"),
    ("--unknown-op-cost", "nan", ">= 0"), ("--gpu-reserve", "150%", "below 100%"), ("--gpu-reserve", "x", "10%"),
    ("--stability-draws", "-1", ">= 0")])
def test_bad_option_values_are_refused_by_argparse_naming_the_option(capsys, mixed, option, value, words):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", str(mixed["predict"]), "--init-net", str(mixed["init"]), option, value])
    err = capsys.readouterr().err.splitlines()[-1]
    assert e.value.code == 2 and f"argument {option}: expected" in err and words in err and repr(value) in err


# -- the placed net file --------------------------------------------------------------------

def test_placed_net_keeps_the_users_file_and_adds_devices_and_copies(capsys, tmp_path):
    paths = mixed_net(tmp_path)
    out, init_out = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pbtxt"
    doc = plan_mixed(capsys, paths, "--pin", "relu1=cpu", "-o", out, "--init-out", init_out)
    dev = {o["name"]: o["device"] for o in doc["ops"]}
    assert dev["relu1"] == "cpu" and dev["fc1"] == dev["fc2"] == "cuda:0"
    orig, placed = load_netdef(paths["predict"]), load_netdef(out)
    users = [op for op in placed.op if op.type not in COPY_TYPES]
    assert [op.type for op in users] == [op.type for op in orig.op]
    for a, b in zip(orig.op, users):
        want = (1, 0) if dev[a.name] == "cuda:0" else (0, 0)
        assert b.HasField("device_option")
        assert (b.device_option.device_type, b.device_option.device_id) == want
        a2, b2 = pb.OperatorDef(), pb.OperatorDef()
        a2.CopyFrom(a), b2.CopyFrom(b)
        for m in (a2, b2):
            del m.input[:], m.output[:]
            m.ClearField("device_option")
        assert a2 == b2                      # name, type, arguments unchanged
    copies = [(op.type, op.input[0], op.output[0]) for op in placed.op if op.type in COPY_TYPES]
    assert ("CopyCPUToGPU", "x", "x_gpu_0") in copies
    assert ("CopyGPUToCPU", "h1", "h1_cpu") in copies and ("CopyCPUToGPU", "r1", "r1_gpu_0") in copies
    assert ("CopyGPUToCPU", "prob_gpu_0", "prob") in copies     # output back under its own name
    assert {(c[1].removesuffix("_gpu_0"), "d2h" if c[0] == "CopyGPUToCPU" else "h2d") for c in copies} == \
        {(c["tensor"], c["direction"]) for c in doc["copies"]}
    assert {(c["src"], c["dst"]) for c in doc["copies"]} == {("cpu", "cuda:0"), ("cuda:0", "cpu")}
    assert all(op.device_option.device_type == 1 for op in placed.op if op.type in COPY_TYPES)
    # non-op fields: unchanged (a parameter used on both devices would add '<w>_gpu_0' inputs)
    a, b = pb.NetDef(), pb.NetDef()
    a.CopyFrom(orig), b.CopyFrom(placed)
    del a.op[:], b.op[:]
    assert a == b
    init = load_netdef(init_out)
    assert {op.output[0]: op.device_option.device_type for op in init.op} == {"w1": 1, "b1": 1}
    assert text_format.MessageToString(load_netdef(paths["predict"])) == Path(paths["predict"]).read_text()


def test_outputs_never_overwrite_inputs(capsys, mixed, tmp_path):
    info = Path(mixed["value_info"])
    info.write_text(json.dumps(json.loads(info.read_text()), indent=4))   # the user's own layout
    before = {k: Path(p).read_bytes() for k, p in mixed.items()}
    err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"], "-o", mixed["predict"])
    assert "refusing to overwrite" in err
    err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"],
                         "-o", Path(mixed["predict"]).parent / "p.pbtxt", "--init-out", mixed["init"])
    assert "refusing to overwrite" in err
    for option in ("--trace", "--plan-out", "--report"):
        err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"], option, mixed["init"])
        assert "refusing to overwrite" in err
    placed = Path(mixed["predict"]).parent / "placed.pbtxt"
    err = one_line_error(capsys, mixed["predict"], "--init-net", mixed["init"], "-o", placed, "--init-out", placed)
    assert "the same file as -o" in err and not placed.exists()
    alone = mixed_net(tmp_path / "alone")                   # a net without an init net
    alone["init"].unlink()
    err = one_line_error(capsys, alone["predict"], "--input", "w1=1024,1024", "--input", "b1=1024",
                         "-o", tmp_path / "alone.pbtxt", "--init-out", tmp_path / "alone_init.pbtxt")
    assert "--init-out" in err and not (tmp_path / "alone.pbtxt").exists()
    # a placed net with the input's stem must not replace the input's value_info.json
    rc, _, err = cli_plan(capsys, mixed["predict"], "--init-net", mixed["init"],
                          "-o", Path(mixed["predict"]).with_suffix(".pb"))
    assert rc == 0, err
    assert {k: Path(p).read_bytes() for k, p in mixed.items()} == before


def test_placer_run_emulated_gives_the_cpu_outputs(capsys, tmp_path):
    """The documented round trip: plan -o, then `placer run --emulate-gpu` on the placed
    net (its input shapes come from the value_info.json written beside it)."""
    import numpy as np
    paths = mixed_net(tmp_path)
    outs = {}
    for ext in ("pbtxt", "pb"):
        placed, init = tmp_path / f"placed.{ext}", tmp_path / f"placed_init.{ext}"
        doc = plan_mixed(capsys, paths, "--pin", "relu1=cpu", "-o", placed, "--init-out", init)
        assert {c["direction"] for c in doc["copies"]} == {"h2d", "d2h"}
        assert (tmp_path / "placed.value_info.json").exists()
        outs[ext] = tmp_path / f"out_{ext}.npz"
        assert cli.main(["run", str(placed), "--init-net", str(init), "--emulate-gpu", "--quiet",
                         "--random-inputs", "3", "--outputs", str(outs[ext])]) == 0
    assert load_netdef(tmp_path / "placed.pb") == load_netdef(tmp_path / "placed.pbtxt")
    ref = tmp_path / "ref.npz"
    assert cli.main(["run", str(paths["predict"]), "--init-net", str(paths["init"]), "--quiet",
                     "--random-inputs", "3", "--outputs", str(ref)]) == 0
    with np.load(ref) as want:
        assert set(want.files) == {"prob", "side_out", "seg"}
        for path in outs.values():
            with np.load(path) as got:
                assert set(got.files) == set(want.files)
                for k in want.files:
                    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_parameter_read_on_both_devices_is_copied_once_by_the_init_net(capsys, tmp_path):
    paths = mixed_net(tmp_path)
    out, init_out = tmp_path / "placed.pbtxt", tmp_path / "placed_init.pbtxt"
    doc = plan_mixed(capsys, paths, "--pin", "fc2=cpu", "-o", out, "--init-out", init_out)
    assert by_name(doc)["fc1"]["device"] == "cuda:0" and by_name(doc)["fc2"]["device"] == "cpu"
    assert not {"w1", "b1"} & {c["tensor"] for c in doc["copies"]}     # no per-run copy
    orig, placed, init = load_netdef(paths["predict"]), load_netdef(out), load_netdef(init_out)
    assert list(placed.external_input) == list(orig.external_input) + ["w1_gpu_0", "b1_gpu_0"]
    assert [(op.type, op.output[0], op.device_option.device_type) for op in init.op] == [
        ("XavierFill", "w1", 0), ("CopyCPUToGPU", "w1_gpu_0", 1),
        ("ConstantFill", "b1", 0), ("CopyCPUToGPU", "b1_gpu_0", 1)]
    fc1 = next(op for op in placed.op if op.name == "fc1")
    fc2 = next(op for op in placed.op if op.name == "fc2")
    assert list(fc1.input) == ["x_gpu_0", "w1_gpu_0", "b1_gpu_0"] and list(fc2.input)[1:] == ["w1", "b1"]
    assert doc["gpu_memory"]["param_bytes"] == pytest.approx((1024 * 1024 + 1024) * 4)


def test_long_nets_print_the_ops_that_matter_most_unless_all(capsys, tmp_path):
    b = NetBuilder("chain")
    b.input("x", (64, 64))
    prev = "x"
    for i in range(230):
        prev = b.op("Relu" if i % 2 else "Sigmoid", [prev], f"a{i}", name=f"op{i}")
    b.output(prev)
    paths = b.save(tmp_path, "chain")
    rc, short, _ = cli_plan(capsys, paths["predict"])
    rc_all, full, _ = cli_plan(capsys, paths["predict"], "--all")
    assert rc == rc_all == 0
    rows = lambda text: [x for x in text.splitlines() if re.match(r"\s*\d+\s+op\d+\s", x)]  # noqa: E731
    assert len(rows(short)) == 200 and len(rows(full)) == 230
    assert "(30 more ops with smaller differences between devices not shown; --all or --json)" in short


# -- several GPUs ---------------------------------------------------------------------------

def test_pins_name_devices_on_two_gpus_and_the_gpu_to_gpu_copy_is_staged(capsys, tmp_path):
    paths = mixed_net(tmp_path)
    out = tmp_path / "placed.pbtxt"
    doc = plan_mixed(capsys, paths, "--machine", "2x-t4-pcie3", "--pin", "fc1=cuda:0", "--pin", "fc2=cuda:1",
                     "-o", out)
    assert doc["devices"] == ["cpu", "cuda:0", "cuda:1"] and doc["machine"]["name"] == "2x-t4-pcie3"
    ops = by_name(doc)
    assert ops["fc1"]["device"] == "cuda:0" and ops["fc2"]["device"] == "cuda:1"
    assert ops["fc2"]["pinned"] == "cuda:1" and ops["fc2"]["reason"] == "pinned: --pin cuda:1"
    mine = assert_consistent(doc)
    # relu1 sits on one of the two GPUs: exactly one 1 MiB activation (256 x 1024 floats) crosses
    gpu_to_gpu = [c for c in doc["copies"] if c["direction"] == "d2d"]
    assert len(gpu_to_gpu) == 1 and gpu_to_gpu[0]["bytes"] == 2 ** 20 == mine["pcie_bytes"]["d2d"]
    c = gpu_to_gpu[0]
    t = next(t for t in doc["tensors"] if t["name"] == c["tensor"])
    # no peer access on this machine: the copy goes down to the host and up again (two identical T4s)
    assert c["time_s"] == pytest.approx(t["d2h_s"] + t["h2d_s"], rel=1e-12)
    # as Caffe2 writes it: a Copy under the destination GPU's device option
    placed = load_netdef(out)
    copy = next(op for op in placed.op if op.type == "Copy")
    assert (copy.device_option.device_type, copy.device_option.device_id) == (1, int(c["dst"][-1]))
    assert copy.input[0].startswith(c["tensor"]) and copy.output[0] == f"{c['tensor']}_gpu_{c['dst'][-1]}"


def test_gpus_and_gpu_link_compose_a_machine(capsys, mixed):
    doc = plan_mixed(capsys, mixed, "--gpu-profile", "v100-16gb-sxm2", "--gpus", "4", "--gpu-link", "nvlink2",
                     "--pin", "fc1=cuda:2", "--pin", "fc2=cuda:3")
    assert doc["devices"] == ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [m["capacity_bytes"] for m in doc["memory"].values()] == [None] + [16 * 2 ** 30] * 4
    assert_consistent(doc)
    d2d = [c for c in doc["copies"] if c["direction"] == "d2d"]
    assert len(d2d) == 1 and (d2d[0]["src"], d2d[0]["dst"]) in {("cuda:2", "cuda:3"), ("cuda:3", "cuda:2")}
    # NVLink: far faster than down to the host and up again
    t = next(t for t in doc["tensors"] if t["name"] == d2d[0]["tensor"])
    assert d2d[0]["time_s"] < 0.5 * (t["d2h_s"] + t["h2d_s"])


def test_timings_name_every_stage_on_stderr_and_leave_stdout_alone(capsys, mixed, tmp_path):
    args = (mixed["predict"], "--init-net", mixed["init"], "-o", tmp_path / "placed.pbtxt",
            "--plan-out", tmp_path / "plan.json")
    rc, out, err = cli_plan(capsys, *args)
    rc_timed, out_timed, err_timed = cli_plan(capsys, *args, "--timings")
    assert rc == rc_timed == 0 and out == out_timed and "timing" not in err
    rows = re.findall(r"^timing: (\S+) +([\d.]+) s wall +([\d.]+) s cpu$", err_timed, re.M)
    assert [r[0] for r in rows] == ["parse", "shapes", "costs", "graph", "partition", "check", "baselines",
                                    "makespan", "json", "stability", "rewrite", "write", "plan-out", "print", "total"]
    wall = {stage: float(w) for stage, w, _ in rows}
    assert wall["total"] == pytest.approx(sum(w for s, w in wall.items() if s != "total"), abs=0.01)


def test_plan_json_text_is_the_document_one_record_a_line(capsys, mixed, tmp_path):
    """The written plan parses to the document (the json module is the oracle), with each
    op, tensor and copy on a line of its own, and --json prints the same text."""
    from placer.planning.view import json_text
    rc, out, err = cli_plan(capsys, mixed["predict"], "--init-net", mixed["init"], "--gpus", "2", "--json",
                            "--plan-out", tmp_path / "plan.json")
    assert rc == 0, err
    doc = strict_json(out)
    written = (tmp_path / "plan.json").read_text()
    assert strict_json(written) == doc and written == json_text(doc) + "\n" == out
    lines = written.splitlines()
    for record in doc["ops"] + doc["tensors"] + doc["copies"]:
        assert sum(line.strip().rstrip(",") == json.dumps(record) for line in lines) == 1
    assert lines[0] == "{" and lines[1].startswith(' "schema_version": ') and lines[-1] == "}"
    assert len(lines) < 400  # records whole, not a field a line
