"""Chrome traces of predicted schedules and measured runs, and the validator that holds
them to the trace event format."""
from __future__ import annotations

import copy
import json

import pytest
from report_cases import hand_plan, run_record, synthetic_plan

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
    trace = build_trace(plan, schedule=schedule)
    assert validate_trace(trace) == []
    events = plan["schedules"][schedule]["events"]
    assert len(spans(trace)) == len(events)
    copies = [e for e in spans(trace) if e["cat"] == "copy"]
    assert len(copies) == sum(e["kind"] == "copy" for e in events) > 0
    assert all(e["tid"] in (2, 3) for e in copies)     # H2D / D2H threads of the GPU process


def test_predicted_trace_of_the_hand_plan_in_microseconds():
    plan = hand_plan()
    trace = build_trace(plan)
    assert validate_trace(trace) == []
    procs = names_of(trace, "process_name")
    assert sorted(procs.values()) == ["predicted (serial schedule): CPU", "predicted (serial schedule): GPU"]
    threads = set(names_of(trace, "thread_name").values())
    assert threads == {"CPU ops", "GPU stream", "H2D copies (PCIe)", "D2H copies (PCIe)"}
    by_name = {e["name"]: e for e in spans(trace)}
    # the host-fed input goes first: 50 us of H2D, then conv1 (0.2 ms on the GPU)
    assert by_name["copy data"]["ts"] == 0 and by_name["copy data"]["dur"] == pytest.approx(50.0)
    assert by_name["copy data"]["args"] == {"type": "copy h2d", "tensor": "data", "bytes": 602112}
    assert by_name["conv1"]["ts"] == pytest.approx(50.0) and by_name["conv1"]["dur"] == pytest.approx(200.0)
    assert by_name["conv1"]["args"]["type"] == "Conv"
    gpu_pid = next(p for (p, _), n in procs.items() if n.endswith("GPU"))
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
    assert {e["tid"] for e in copies} == {2, 3}
    assert any("emulated GPU: CPU timings" in n for n in names_of(trace, "process_name").values())


def test_predicted_and_measured_share_a_file_in_separate_processes(tmp_path):
    plan = synthetic_plan(120)
    out = tmp_path / "trace.json"
    write_trace(plan, out, run=run_record(plan))
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    procs = names_of(trace, "process_name")
    assert len(procs) == 4 and len(set(procs.values())) == 4
    pred = {e["pid"] for e in predicted_events(plan) if e["ph"] == "X"}
    meas = {e["pid"] for e in measured_events(run_record(plan)) if e["ph"] == "X"}
    assert pred and meas and not pred & meas


def test_a_run_alone_as_placer_run_writes_it(tmp_path):
    out = tmp_path / "run_trace.json"
    write_trace(None, out, run=run_record(hand_plan(), emulated=False))
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    assert sorted(names_of(trace, "process_name").values()) == ["measured: CPU", "measured: GPU [cuda:0]"]
    assert len(spans(trace)) == 6


def test_plan_without_schedules_gives_no_predicted_events():
    plan = {k: v for k, v in hand_plan().items() if k != "schedules"}
    assert predicted_events(plan) == []
    assert validate_trace(build_trace(plan)) == []


# --- the validator catches what it promises to -------------------------------------


@pytest.fixture
def good():
    return build_trace(hand_plan())


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
