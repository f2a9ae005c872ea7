"""`placer demo` as a user runs it: once (``--quick``) into a temporary folder, then every
file it promises is checked against the others: the printed summary against the plan
JSON and run records, the outputs against each other, the traces against the trace
format, the reports for every section; the several-GPU part (a net no single GPU holds,
two towers on two GPUs, the placed two-GPU net on emulated GPUs) against its plans."""
from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from placer import cli
from placer.commands import demo
from placer.formats.caffe2 import load_netdef
from placer.hardware.profiles import load_profile
from placer.report.html import SECTIONS
from placer.report.trace import validate_trace

NETS = demo.RUNNABLE
GPUS = [g.split("-")[0] for g in demo.FULL_SIZE_GPUS]
SPLIT, TOWERS = demo.SPLIT_NET, demo.TOWERS_NET
NUM = r"([0-9.]+(?:e[+-]?\d+)?)"


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(["demo", "-o", str(out), "--quick", "--quiet"])
    text = stdout.getvalue()
    return {"out": out, "status": status, "stdout": text, "stderr": stderr.getvalue(),
            "summary": text.split("summary:\n", 1)[1].splitlines() if "summary:\n" in text else []}


def load(path):
    return json.loads(path.read_text())


def test_exits_zero_and_writes_every_file(done):
    assert done["status"] == 0, done["stdout"]
    assert done["stderr"] == "", "--quiet printed progress"
    out = done["out"]
    for net in NETS:
        for name in ("plan.json", "plan.txt", "placed_predict.pbtxt", "placed_init.pbtxt", "inputs.npz",
                     "outputs_cpu.npz", "outputs_placed.npz", "run_cpu.json", "run_placed.json",
                     "report.html", "trace_predicted.json", "trace_measured.json"):
            assert (out / net / name).stat().st_size > 0, f"{net}/{name}"
    for gpu in GPUS:
        assert (out / demo.FULL_SIZE / f"plan-{gpu}.json").stat().st_size > 0
        assert (out / demo.FULL_SIZE / f"report-{gpu}.html").stat().st_size > 0
    for name in ("plan.json", "plan.txt", "report.html"):
        assert (out / SPLIT / name).stat().st_size > 0, f"{SPLIT}/{name}"
    for name in ("plan-makespan.json", "plan-makespan.txt", "plan-serial.json", "plan-serial.txt",
                 "placed_predict.pbtxt", "placed_init.pbtxt", "inputs.npz", "outputs_cpu.npz", "outputs_placed.npz",
                 "run_cpu.json", "run_placed.json", "report.html", "trace_predicted.json", "trace_measured.json"):
        assert (out / TOWERS / name).stat().st_size > 0, f"{TOWERS}/{name}"
    assert (out / "profiles" / "cpu-measured.json").exists()
    assert not list(out.rglob(".*.tmp")) and not list(out.rglob(".cpu-measured*")), "temporary files left"
    assert str(out) in done["stdout"]
    # commands.sh names one command per step: 2 profiles, 2 + 3 + 1 + 2 plans, 4 + 2 runs
    lines = (out / "commands.sh").read_text().splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("placer ")].count("run") == 6
    assert sum(ln.startswith("placer plan ") for ln in lines) == 8
    assert sum(f"--machine {demo.SPLIT_MACHINE}" in ln for ln in lines) == 1
    assert sum(f"--machine {demo.TOWERS_MACHINE}" in ln for ln in lines) == 2
    assert sum("--emulate-gpus 2" in ln for ln in lines) == 1


def test_cpu_profile_is_measured_and_used_by_every_plan(done):
    out = done["out"]
    cpu = load_profile(out / "profiles" / "cpu-measured.json").device("cpu")
    assert cpu.source["kind"] == "measured" and cpu.ops, "no op timings measured"
    assert {t.type for t in cpu.ops.values()} >= {"FC", "SparseLengthsSum", "Conv", "SpatialBN"}
    for net in NETS:
        ops = load(out / net / "plan.json")["ops"]
        assert {o["cpu_source"] for o in ops} == {"measured"}, net  # every op of a profiled net
    for gpu in GPUS:  # the full-size net has other shapes: fitted from the measured entries
        plan = load(out / demo.FULL_SIZE / f"plan-{gpu}.json")    # (poor-fit: a fit that does not
        assert {o["cpu_source"] for o in plan["ops"]} <= {"measured", "fitted", "poor-fit"}  # cover its points)
        assert plan["profiles"]["cpu"]["source"].startswith("measured")


class Sections(HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.ids, self.op_rows = set(), 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("section", "table"):
            self.ids.add(a.get("id"))
        if tag == "tr" and "op-row" in (a.get("class") or "").split():
            self.op_rows += 1


def test_reports_have_every_section_and_the_run(done):
    out = done["out"]
    for net in NETS:
        page = Sections((out / net / "report.html").read_text())
        assert set(SECTIONS) <= page.ids, net
        assert "whole-net" in page.ids, f"{net}: the report does not compare with the run"
        assert page.op_rows == len(load(out / net / "plan.json")["ops"])
    for gpu in GPUS:  # planning only: every section, the measured one saying there is no run
        text = (out / demo.FULL_SIZE / f"report-{gpu}.html").read_text()
        assert set(SECTIONS) <= Sections(text).ids and "No run given" in text
    text = (out / SPLIT / "report.html").read_text()
    assert set(SECTIONS) <= Sections(text).ids and "No run given" in text
    assert {"memory-table", "link-table"} <= Sections(text).ids
    page = Sections((out / TOWERS / "report.html").read_text())
    assert set(SECTIONS) | {"whole-net", "by-device", "by-link", "memory-table", "link-table"} <= page.ids
    assert page.op_rows == len(load(out / TOWERS / "plan-makespan.json")["ops"])


def test_traces_validate(done):
    for net in NETS + (TOWERS,):
        predicted = load(done["out"] / net / "trace_predicted.json")
        measured = load(done["out"] / net / "trace_measured.json")
        assert validate_trace(predicted) == [] and validate_trace(measured) == []
        plan = load(done["out"] / net / ("plan-makespan.json" if net == TOWERS else "plan.json"))
        run = load(done["out"] / net / "run_placed.json")
        events = lambda t: [e for e in (t["traceEvents"] if isinstance(t, dict) else t) if e.get("ph") == "X"]
        assert len(events(measured)) == len(run["ops"])  # one event per op run, copies included
        assert len(events(predicted)) == len(plan["schedules"][plan["objective"]]["events"])


def test_placed_net_ran_on_the_emulated_gpu_and_matched_the_cpu_run(done):
    for net in NETS:
        d = done["out"] / net
        with np.load(d / "outputs_cpu.npz") as a, np.load(d / "outputs_placed.npz") as b:
            assert sorted(a.files) == sorted(b.files) and a.files
            for k in a.files:
                np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
        run, plan = load(d / "run_placed.json"), load(d / "plan.json")
        assert run["emulated"] and not load(d / "run_cpu.json")["emulated"]
        gpu_ran = sum(1 for o in run["ops"] if "cuda" in o["device"] and not o["copy_direction"])
        assert gpu_ran == sum(o["device_kind"] == "gpu" for o in plan["ops"]) > 0
        placed = load_netdef(str(d / "placed_predict.pbtxt"))
        assert any(op.type == "CopyCPUToGPU" for op in placed.op)
        assert all(op.HasField("device_option") for op in placed.op)


def close(printed: str, value: float, unit: float = 1e-3) -> bool:
    """A figure printed to 3 significant digits equals the JSON value."""
    return float(printed) * unit == pytest.approx(value, rel=6e-3)


def test_summary_lines_hold_the_written_figures(done):
    out, lines = done["out"], done["summary"]
    assert len(lines) == 7, done["stdout"]
    assert [ln.strip() for ln in lines] == (out / "summary.txt").read_text().splitlines()
    line_re = re.compile(rf"(\w+): plan {NUM} ms vs all-CPU {NUM} ms vs all-GPU {NUM} ms predicted on (.+?) "
                         rf"\(all-CPU measured here: {NUM} ms\); (\d+)/(\d+) ops on the GPU; outputs match")
    for line, net in zip(lines, NETS):
        m = line_re.search(line)
        assert m and m.group(1) == net, line
        plan, run = load(out / net / "plan.json"), load(out / net / "run_cpu.json")
        assert close(m.group(2), plan["total_s"])
        assert close(m.group(3), plan["baselines"]["all_cpu"]["total_s"])
        assert close(m.group(4), plan["baselines"]["all_gpu"]["total_s"])
        assert all(word in plan["profiles"]["gpu"]["name"] for word in m.group(5).split())
        assert close(m.group(6), run["total_s"])
        assert int(m.group(7)) == sum(o["device_kind"] == "gpu" for o in plan["ops"])
        assert int(m.group(8)) == len(plan["ops"])
        # the plan is never worse than either single-device baseline
        assert plan["total_s"] <= min(plan["baselines"]["all_cpu"]["total_s"],
                                      plan["baselines"]["all_gpu"]["total_s"]) * (1 + 1e-9)


def test_placed_two_gpu_net_ran_on_two_emulated_gpus_and_matched_the_cpu_run(done):
    d = done["out"] / TOWERS
    with np.load(d / "outputs_cpu.npz") as a, np.load(d / "outputs_placed.npz") as b, np.load(d / "inputs.npz") as x:
        assert sorted(a.files) == sorted(b.files) and a.files
        for k in a.files:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
        assert x["data"].shape == demo.TOWERS_RUN_SHAPE
    plan, run = load(d / "plan-makespan.json"), load(d / "run_placed.json")
    assert run["devices"] == ["cpu", "emulated-cuda:0", "emulated-cuda:1"] and run["emulated"]
    ran = {}
    for o in run["ops"]:
        if not o["copy_direction"]:
            ran.setdefault(o["device"].removeprefix("emulated-"), []).append(o["index"])
    planned = {}
    for o in plan["ops"]:
        planned.setdefault(o["device"], []).append(o["index"])
    assert {k: len(v) for k, v in ran.items()} == {k: len(v) for k, v in planned.items()}
    # the copies the plan predicts are the ones the run made, link by link
    assert {f"{x['src']}->{x['dst']}" for x in plan["link_bytes"]} == \
        {k.replace("emulated-", "") for k in run["link_bytes"]}
    placed = load_netdef(str(d / "placed_predict.pbtxt"))
    assert {op.device_option.device_id for op in placed.op if op.device_option.device_type == 1} == {0, 1}
    # Caffe2's copy ops, one per copy of the plan: GPU to GPU is a Copy under the destination GPU
    kinds = {"h2d": "CopyCPUToGPU", "d2h": "CopyGPUToCPU", "d2d": "Copy"}
    for direction, op_type in kinds.items():
        assert sum(op.type == op_type for op in placed.op) == \
            sum(c["direction"] == direction for c in plan["copies"]), op_type


def test_split_line_holds_the_plan_of_the_net_no_gpu_holds(done):
    out, line = done["out"], done["summary"][3]
    plan = load(out / SPLIT / "plan.json")
    m = re.search(rf"{SPLIT} on {demo.SPLIT_MACHINE} \(planning only, ([0-9.]+) GiB of parameters, datasheet profiles\): "
                  rf"tables per device (.+?); plan {NUM} ms vs all-CPU {NUM} ms; all on one GPU does not fit "
                  r"\(needs ([0-9.]+) GiB on cuda:0; ([0-9.]+) GiB usable\)", line)
    assert m, line
    params = sum(t["bytes"] for t in plan["tensors"] if t["producer"] == -2)
    assert float(m.group(1)) == pytest.approx(params / 2**30, abs=0.06) and params > 40e9   # ten 8M-row tables
    tables = [o for o in plan["ops"] if o["type"] == "SparseLengthsSum"]
    per = dict(part.split() for part in m.group(2).split(", "))
    assert per == {d: str(sum(o["device"] == d for o in tables)) for d in per} and sum(map(int, per.values())) == 10
    assert len(per) >= 3 and "cpu" not in per       # 38 GiB of tables over at least three 14.4 GiB GPUs
    assert close(m.group(3), plan["total_s"]) and close(m.group(4), plan["baselines"]["all_cpu"]["total_s"])
    assert plan["total_s"] < plan["baselines"]["all_cpu"]["total_s"]
    assert not plan["baselines"]["all_gpu"]["feasible"] and float(m.group(6)) == pytest.approx(0.9 * 16, abs=0.05)
    for mem in plan["memory"].values():
        assert mem["usable_bytes"] is None or mem["used_bytes"] <= mem["usable_bytes"]


def test_towers_line_one_tower_per_gpu_under_makespan(done):
    out, line = done["out"], done["summary"][4]
    m = re.search(rf"{TOWERS} on {demo.TOWERS_MACHINE} \(datasheet profiles\): makespan plan {NUM} ms overlapped "
                  rf"\(left on (\S+), right on (\S+)\) vs serial plan {NUM} ms \(left on (\S+), right on (\S+)\); "
                  r"placed net on 2 emulated GPUs at data 1x3x16x16: outputs match", line)
    assert m, line
    span, serial = load(out / TOWERS / "plan-makespan.json"), load(out / TOWERS / "plan-serial.json")
    assert {m.group(2), m.group(3)} == {"cuda:0", "cuda:1"}              # one tower per GPU
    assert m.group(5) == m.group(6) and m.group(5).startswith("cuda:")   # serial: both on one GPU
    assert close(m.group(1), span["schedules"]["makespan"]["makespan_s"])
    assert close(m.group(4), serial["schedules"]["makespan"]["makespan_s"])
    # two equal towers side by side: the overlapped run takes about half the serial plan's
    assert span["schedules"]["makespan"]["makespan_s"] < 0.55 * serial["schedules"]["makespan"]["makespan_s"]
    towers = [sum(o["time_s"][o["device"]] for o in span["ops"] if (o["outputs"] or [""])[0].startswith(side))
              for side in ("left_", "right_")]
    assert span["schedules"]["makespan"]["makespan_s"] >= max(towers)


def test_full_size_dlrm_answer_changes_with_gpu_memory(done):
    out, line = done["out"], done["summary"][2]
    parts = re.findall(rf"([A-Z]\d+ \d+ GB): (\d+)/(\d+) tables on the GPU, plan {NUM} ms \(all-GPU (fits|does not fit)\)",
                       line)
    assert len(parts) == len(GPUS), line
    on_gpu = []
    for (label, n_gpu, n_tables, total, fits), gpu in zip(parts, GPUS):
        plan = load(out / demo.FULL_SIZE / f"plan-{gpu}.json")
        tables = [o for o in plan["ops"] if o["type"] == "SparseLengthsSum"]
        assert int(n_tables) == len(tables) == 26
        assert int(n_gpu) == sum(o["device_kind"] == "gpu" for o in tables)
        assert close(total, plan["total_s"])
        assert (fits == "fits") == plan["baselines"]["all_gpu"]["feasible"]
        assert plan["gpu_memory"]["used_bytes"] <= plan["gpu_memory"]["usable_bytes"]
        on_gpu.append(int(n_gpu))
    # 16 GB and 40 GB keep the tables that do not fit on the CPU; 141 GB holds all 96 GB of them
    assert on_gpu[0] < 26 and on_gpu[1] < 26 and on_gpu[0] <= on_gpu[1] and on_gpu[2] == 26
    assert parts[0][4] == parts[1][4] == "does not fit" and parts[2][4] == "fits"


def test_profile_line(done):
    line = done["summary"][5]
    m = re.search(rf"CPU profile: (\d+) op timings, {NUM} GFLOP/s GEMM, {NUM} GB/s streaming", line)
    cpu = load_profile(done["out"] / "profiles" / "cpu-measured.json").device("cpu")
    assert m and int(m.group(1)) == len(cpu.ops)
    assert float(m.group(2)) == pytest.approx(cpu.peak_flops["float32"] / 1e9, abs=0.51)
    # the path it names is where the file is now, not the folder it was written in
    assert line.endswith(f"({done['out'] / 'profiles' / 'cpu-measured.json'})"), line


def test_compare_flags_a_difference_and_a_missing_output():
    a = {"y": np.array([1.0, 2.0], np.float32)}
    assert demo.compare(a, {"y": a["y"].copy()}) == (True, 0.0)
    ok, diff = demo.compare(a, {"y": np.array([1.0, 2.5], np.float32)})
    assert not ok and diff == pytest.approx(0.5)
    assert demo.compare(a, {"z": a["y"]})[0] is False


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "report.html"
    target.write_text("mine")
    assert cli.main(["demo", "-o", str(target), "--quiet"]) == 2
    assert "is a file" in capsys.readouterr().err and target.read_text() == "mine"


def test_mismatch_exits_one_loudly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "RUNNABLE", ("resnet_small",))
    monkeypatch.setattr(demo, "FULL_SIZE_GPUS", ())
    monkeypatch.setattr(demo.Demo, "several_gpus", lambda self: None)
    monkeypatch.setattr(demo, "compare", lambda want, got: (False, 0.25))
    status = cli.main(["demo", "-o", str(tmp_path), "--quick"])
    captured = capsys.readouterr()
    assert status == 1
    assert "FAILED" in captured.err and "resnet_small" in captured.err
    assert re.search(r"^\[ *[0-9.]+s\] running resnet_small", captured.err, re.M), "no progress lines"
    assert "outputs DIFFER (max diff 0.25)" in captured.out


@pytest.mark.browser
def test_demo_report_renders_in_chromium(done, tmp_path):
    from test_report_browser import Dom, browse, console_lines
    page = done["out"] / "dlrm_small" / "report.html"
    res = browse(page, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = Dom(res.stdout)
    assert set(SECTIONS) <= dom.sections
    assert dom.op_rows == len(load(done["out"] / "dlrm_small" / "plan.json")["ops"])
    assert dom.body.get("data-images-ok") == "yes"
    assert console_lines(res.stderr) == []
