"""Chrome traces of predicted schedules and measured runs, and the validator that holds
them to the trace event format."""
from __future__ import annotations

import copy
import json

import pytest
from report_cases import MAKESPAN_EVENTS, four_gpu_plan, four_gpu_run, hand_plan, run_record, synthetic_plan

from placer.ops.registry import copy_types
from placer.report.doc import as_plan
from placer.report.trace import (build_trace, measured_events, predicted_events, validate_trace,
                                 write_trace)


def spans(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def names_of(trace, kind):
    return {(e["pid"], e.get("tid")): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == kind}


@pytest.mark.parametrize("schedule", ["serial", "makespan"])
def test_predicted_trace_validates_and_keeps_every_event(schedule):
    plan = synthetic_plan(300)
    trace = build_trace(as_plan(plan), schedule=schedule)
    assert validate_trace(trace) == []
    events = plan["schedules"][schedule]["events"]
    assert len(spans(trace)) == len(events)
    copies = [e for e in spans(trace) if e["cat"] == "copy"]
    assert len(copies) == sum(e["kind"] == "copy" for e in events) > 0
    threads = names_of(trace, "thread_name")
    assert {threads[(e["pid"], e["tid"])] for e in copies} == {"H2D copies (PCIe)", "D2H copies (PCIe)"}


def test_predicted_trace_of_the_hand_plan_in_microseconds():
    plan = hand_plan()
    trace = build_trace(as_plan(plan))
    assert validate_trace(trace) == []
    procs = names_of(trace, "process_name")
    assert sorted(procs.values()) == ["predicted (serial schedule): copies", "predicted (serial schedule): cpu",
                                      "predicted (serial schedule): gpu"]
    threads = set(names_of(trace, "thread_name").values())
    assert threads == {"cpu ops", "gpu ops", "H2D copies (PCIe)", "D2H copies (PCIe)"}
    by_name = {e["name"]: e for e in spans(trace)}
    # the host-fed input goes first: 50 us of H2D, then conv1 (0.2 ms on the GPU)
    assert by_name["copy data"]["ts"] == 0 and by_name["copy data"]["dur"] == pytest.approx(50.0)
    assert by_name["copy data"]["args"] == {"type": "copy h2d", "tensor": "data", "bytes": 602112}
    assert by_name["conv1"]["ts"] == pytest.approx(50.0) and by_name["conv1"]["dur"] == pytest.approx(200.0)
    assert by_name["conv1"]["args"]["type"] == "Conv"
    gpu_pid = next(p for (p, _), n in procs.items() if n.endswith(": gpu"))
    assert by_name["conv1"]["pid"] == gpu_pid and by_name["fc"]["pid"] != gpu_pid


def test_measured_trace_lays_ops_end_to_end():
    plan = hand_plan()
    run = run_record(plan, emulated=True)
    trace = build_trace(run=run)
    assert validate_trace(trace) == []
    ev = spans(trace)
    assert [e["name"] for e in sorted(ev, key=lambda e: e["ts"])][:2] == ["#0 CopyCPUToGPU", "conv1"]
    assert len(ev) == len(run["ops"])
    end = max(e["ts"] + e["dur"] for e in ev)
    assert end == pytest.approx(sum(o["time_s"] for o in run["ops"]) * 1e6)
    copies = [e for e in ev if e["cat"] == "copy"]
    assert [e["args"]["bytes"] for e in copies] == [602112, 3211264]
    threads = names_of(trace, "thread_name")
    assert [threads[(e["pid"], e["tid"])] for e in copies] == ["H2D copies (PCIe)", "D2H copies (PCIe)"]
    assert any("emulated GPU: CPU timings" in n for n in names_of(trace, "process_name").values())


def test_measured_copies_without_links_are_told_by_their_type():
    """A record whose copies carry no link and no direction (version 1; a copy within one
    device) still puts every registered copy type on a copy lane, and nothing else."""
    run = run_record(hand_plan(), emulated=True)
    ops = [dict(o, links=[], copy_direction="", copy_bytes=0) for o in run["ops"]]
    types = sorted(copy_types())
    extra = [{"index": len(ops) + k, "name": "", "type": t, "device": "cpu", "time_s": 1e-4,
              "samples_s": [1e-4], "copy_bytes": 0, "copy_direction": ""} for k, t in enumerate(types + ["Alias"])]
    trace = build_trace(run=dict(run, ops=ops + extra))
    assert validate_trace(trace) == []
    cat = {e["args"]["op"]: e["cat"] for e in spans(trace)}
    assert [cat[o["index"]] for o in extra] == ["copy"] * len(types) + ["op"]
    assert [cat[o["index"]] for o in ops] == ["copy" if o["type"] in types else "op" for o in ops]
    assert "CopyFromCPUInput" in types and any(o["type"] == "CopyCPUToGPU" for o in ops)


def test_predicted_and_measured_share_a_file_in_separate_processes(tmp_path):
    plan = synthetic_plan(120)
    out = tmp_path / "trace.json"
    write_trace(as_plan(plan), out, run=run_record(plan))
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    procs = names_of(trace, "process_name")
    assert len(procs) == 6 and len(set(procs.values())) == 6      # cpu, gpu, copies: predicted and measured
    pred = {e["pid"] for e in spans(trace) if procs[(e["pid"], 0)].startswith("predicted")}
    meas = {e["pid"] for e in spans(trace) if procs[(e["pid"], 0)].startswith("measured")}
    assert pred and meas and not pred & meas
    assert len(spans(trace)) == len(plan["schedules"]["makespan"]["events"]) + len(run_record(plan)["ops"])
    assert len([e for e in measured_events(run_record(plan)) if e["ph"] == "X"]) == len(run_record(plan)["ops"])


def test_a_run_alone_as_placer_run_writes_it(tmp_path):
    out = tmp_path / "run_trace.json"
    write_trace(None, out, run=run_record(hand_plan(), emulated=False))
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    assert sorted(names_of(trace, "process_name").values()) == ["measured: copies", "measured: cpu",
                                                                "measured: cuda:0"]
    assert len(spans(trace)) == 6


def test_plan_without_schedules_gives_no_predicted_events():
    plan = {k: v for k, v in hand_plan().items() if k != "schedules"}
    assert predicted_events(as_plan(plan)) == []
    assert validate_trace(build_trace(as_plan(plan))) == []


# --- a CPU and four GPUs (plan document version 2) -----------------------------------


def lane_of(trace, event):
    """(process name, thread name) of an event."""
    return (names_of(trace, "process_name")[(event["pid"], 0)],
            names_of(trace, "thread_name")[(event["pid"], event["tid"])])


def test_four_gpu_makespan_trace_has_a_lane_per_device_and_per_copy_lane():
    plan = four_gpu_plan()
    trace = build_trace(as_plan(plan), schedule="makespan")
    assert validate_trace(trace) == []
    title = "predicted (makespan schedule)"
    assert sorted(names_of(trace, "process_name").values()) == sorted(
        [f"{title}: {d}" for d in ("cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3")] + [f"{title}: copies"])
    got = sorted((lane_of(trace, e), round(e["ts"], 6), round(e["dur"], 6)) for e in spans(trace))
    want = []
    for lane, what, a, b in MAKESPAN_EVENTS:   # the schedule's own lanes and µs, written by hand
        where = (f"{title}: {lane}", f"{lane} ops") if isinstance(what, int) else (f"{title}: copies", lane)
        want.append((where, float(a), float(b - a)))
    assert got == sorted(want)
    by_name = {}
    for e in spans(trace):
        by_name.setdefault(e["name"], []).append(e)
    # emb2 staged through the host: two hops on two lanes, named by the tensor, not its producer
    hops = sorted(by_name["copy emb2"], key=lambda e: e["ts"])
    assert [lane_of(trace, e)[1] for e in hops] == ["pcie[switch1]:d2h", "pcie[switch0]:h2d"]
    assert hops[0]["args"] == {"type": "copy cuda:2->cuda:1", "tensor": "emb2", "src": "cuda:2", "dst": "cuda:1",
                               "bytes": 1048576.0}
    assert [e["args"]["op"] for e in by_name["emb2"]] == [2]


def test_four_gpu_serial_trace_puts_copies_on_their_links():
    plan = four_gpu_plan()
    trace = build_trace(as_plan(plan), schedule="serial")
    assert validate_trace(trace) == []
    lanes = {lane_of(trace, e)[1] for e in spans(trace) if e["cat"] == "copy"}
    assert lanes == {"cpu->cuda:0", "cpu->cuda:1", "cpu->cuda:2", "cpu->cuda:3", "cuda:0->cuda:1", "cuda:2->cuda:1",
                     "cuda:3->cuda:1", "cuda:1->cpu"}
    end = max(e["ts"] + e["dur"] for e in spans(trace))
    assert end == pytest.approx(415.0)      # µs: the plan's serial total


def test_four_gpu_measured_trace_names_the_plans_devices_and_links(tmp_path):
    plan = four_gpu_plan()
    run = four_gpu_run(plan)
    out = tmp_path / "trace.json"
    write_trace(as_plan(plan), out, run=run)
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    measured = [e for e in spans(trace) if lane_of(trace, e)[0].startswith("measured")]
    assert len(measured) == len(run["ops"]) == 15
    copies = [lane_of(trace, e)[1] for e in sorted(measured, key=lambda e: e["ts"]) if e["cat"] == "copy"]
    assert copies == ["cpu->cuda:0", "cpu->cuda:1", "cpu->cuda:2", "cpu->cuda:3", "cuda:0->cuda:1",
                      "cuda:2->cuda:1", "cuda:3->cuda:1", "cuda:1->cpu"]
    fc = next(e for e in measured if e["name"] == "fc")
    assert lane_of(trace, fc) == ("measured (emulated GPU: CPU timings): cuda:1 [emulated-cuda:1 (CPU timing)]",
                                  "cuda:1 ops")
    predicted_pids = {e["pid"] for e in spans(trace) if e not in measured}
    assert predicted_pids and not predicted_pids & {e["pid"] for e in measured}
    alone = build_trace(run=run)    # placer run --trace: the run's own device names
    assert {lane_of(alone, e)[0] for e in spans(alone) if e["name"] == "fc"} == {
        "measured (emulated GPU: CPU timings): emulated-cuda:1 [emulated-cuda:1 (CPU timing)]"}


# --- the validator catches what it promises to -------------------------------------


@pytest.fixture
def good():
    return build_trace(as_plan(hand_plan()))


def _first_lane_pair(trace):
    ev = spans(trace)
    for a in ev:
        for b in ev:
            if a is not b and (a["pid"], a["tid"]) == (b["pid"], b["tid"]) and b["ts"] > a["ts"]:
                return a, b
    raise AssertionError("no lane with two events")


def test_validator_reports_overlapping_events(good):
    a, b = _first_lane_pair(good)
    b["ts"] = a["ts"] + a["dur"] / 2
    problems = validate_trace(good)
    assert len(problems) == 1 and "overlaps" in problems[0] and b["name"] in problems[0]


def test_validator_reports_time_going_back(good):
    bad = copy.deepcopy(good)
    a, b = _first_lane_pair(bad)
    b["ts"] = a["ts"] - 1.0
    assert any("not monotonic" in p for p in validate_trace(bad))


@pytest.mark.parametrize("field, value, words", [
    ("ts", None, "'ts' must be"), ("dur", -1.0, "'dur' must be"), ("pid", "1", "'pid' must"),
    ("tid", 1.5, "'tid' must"), ("ph", "Q", "unknown or missing phase"), ("name", "", "missing 'name'"),
    ("ts", float("nan"), "'ts' must be"),
])
def test_validator_reports_bad_fields(good, field, value, words):
    spans(good)[0][field] = value
    assert any(words in p for p in validate_trace(good))


def test_validator_reports_unnamed_processes_and_threads(good):
    good["traceEvents"] = [e for e in good["traceEvents"] if e["name"] != "thread_name"]
    assert any("no thread_name" in p for p in validate_trace(good))
    good["traceEvents"] = [e for e in good["traceEvents"] if e["name"] != "process_name"]
    assert any("no process_name" in p for p in validate_trace(good))
    assert validate_trace({"events": []}) == ["no 'traceEvents' list"]
