"""The HTML report: every section, one table row per op, inline images that decode as SVG,
no network references, missing plan parts said rather than crashed on, readable charts.
Plans of version 1 (the CPU and one GPU named ``gpu``: ``hand_plan``, ``synthetic_plan``)
and of version 2 (a CPU and four GPUs: ``four_gpu_plan``) alike."""
from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
from report_cases import four_gpu_plan, four_gpu_run, hand_plan, run_record, synthetic_plan

from placer import cli
from placer.report import doc, graph, plots, tables
from placer.report.doc import as_plan
from placer.report.html import render, write_report

SECTION_IDS = {"summary", "placement", "costs", "timeline", "memory", "links", "ops", "measured"}


class Page(HTMLParser):
    """Section ids, <img> sources, op-table rows and text per section of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.sections, self.images, self.op_rows, self.refs = [], [], 0, []
        self.text: dict[str, list[str]] = {}
        self._section = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("id")
            self.sections.append(self._section)
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag == "tr" and "op-row" in (a.get("class") or "").split():
            self.op_rows += 1
        for key in ("src", "href"):
            if key in a:
                self.refs.append(a[key])

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._section:
            self.text.setdefault(self._section, []).append(data)

    def section_text(self, sid: str) -> str:
        return " ".join(" ".join(self.text.get(sid, [])).split())


@pytest.fixture(scope="module")
def small_page():
    plan = hand_plan()
    return plan, Page(render(as_plan(plan), run_record(plan, emulated=True)))


@pytest.fixture(scope="module")
def big_page():
    plan = synthetic_plan(300)
    return plan, Page(render(as_plan(plan), run_record(plan, emulated=False)))


def decode_image(src: str) -> bytes:
    m = re.fullmatch(r"data:image/(svg\+xml|png);base64,([A-Za-z0-9+/=]+)", src)
    assert m, f"image is not an inline data URI: {src[:80]}"
    return base64.b64decode(m.group(2))


@pytest.mark.parametrize("which", ["small_page", "big_page"])
def test_every_section_one_row_per_op_and_images_decode(which, request):
    plan, page = request.getfixturevalue(which)
    assert SECTION_IDS <= set(page.sections)
    assert page.op_rows == len(plan["ops"])
    # baselines, placement, costs, timeline, memory, links, scatter
    assert len(page.images) == 7
    for src in page.images:
        root = ET.fromstring(decode_image(src))
        assert root.tag.endswith("svg")
        assert float(re.match(r"[\d.]+", root.get("width")).group()) > 50
        assert float(re.match(r"[\d.]+", root.get("height")).group()) > 50


@pytest.mark.parametrize("which", ["small_page", "big_page"])
def test_no_network_references(which, request):
    _, page = request.getfixturevalue(which)
    for ref in page.refs:
        assert ref.startswith(("data:", "#")), ref
    for src in page.images:
        svg = decode_image(src).decode()
        # namespaces and the DTD name a URL as plain text; no reference may load one
        assert not re.search(r"""(href|src)\s*=\s*["'](https?:)?//""", svg)
        assert "@import" not in svg


def test_summary_figures_of_the_hand_plan(small_page):
    _, page = small_page
    text = page.section_text("summary")
    # 4.41 ms all-CPU against 0.65 ms for the plan (0.33 ms of ops + 0.32 ms of copies)
    assert "650 µs" in text and "6.78x faster" in text
    assert "588 KiB" in text and "3.06 MiB" in text             # H2D, D2H bytes per run
    assert "optimal for the serial objective" in text
    assert "V100-16GB" in text and "ci-host" in text
    assert "the CPU and one GPU (a version-1 plan)" in text
    assert "6.77 MiB" in text and "13.4 GiB" in text          # GPU memory used, capacity (version 1)
    for label in ("all-CPU", "all-GPU", "greedy", "your placement", "lower bound"):
        assert label in text


def test_big_net_shows_top_40_and_says_so(big_page):
    _, page = big_page
    assert "40 ops with the largest time difference" in page.section_text("costs")
    assert "of 300" in page.section_text("costs")


def test_measured_section_labels_emulated_runs(small_page, big_page):
    assert "emulated GPU: CPU timings" in small_page[1].section_text("measured")
    assert "emulated" not in big_page[1].section_text("measured")
    assert "4 of 4 planned ops matched" in small_page[1].section_text("measured")
    assert "300 of 300 planned ops matched" in big_page[1].section_text("measured")


def test_old_plan_without_schedules_says_not_available():
    plan = {k: v for k, v in hand_plan().items()
            if k not in ("schedules", "memory_timeline", "tensors", "gpu_memory", "profiles")}
    page = Page(render(as_plan(plan)))
    assert SECTION_IDS <= set(page.sections)
    assert "not available" in page.section_text("timeline")
    assert "not available" in page.section_text("memory")
    assert "Memory per device: not available" in page.section_text("summary")
    assert "No run given" in page.section_text("measured")
    assert page.op_rows == 4


def test_error_statistics_by_hand():
    pairs = [{"predicted_s": p, "measured_s": m} for p, m in ((1, 1), (2, 1), (4, 5))]
    stats = tables.error_stats(pairs)   # errors 0%, 100%, 20%
    assert stats["n"] == 3
    assert stats["median_pct"] == pytest.approx(20.0)
    assert stats["p90_pct"] == pytest.approx(84.0)   # 20 + 0.8 * (100 - 20)


def test_errors_by_family_by_hand():
    pairs = [{"type": "Conv", "predicted_s": 9.0, "measured_s": 10.0, "source": "fitted"},
             {"type": "Conv", "predicted_s": 12.0, "measured_s": 10.0, "source": "measured"},
             {"type": "Relu", "predicted_s": 1.0, "measured_s": 2.0, "source": "poor-fit"},
             {"type": "Sum", "predicted_s": 3.0, "measured_s": 2.0, "source": "fitted"},
             {"type": "Relu", "predicted_s": None, "measured_s": 2.0, "source": ""}]   # not timed: left out
    conv, elementwise = tables.family_errors(pairs)
    assert conv == {"family": "conv", "ops": 2, "share_pct": pytest.approx(100 * 20 / 24),
                    "predicted_s": 21.0, "measured_s": 20.0, "sum_error_pct": pytest.approx(5.0),
                    "median_pct": pytest.approx(15.0), "sources": "fitted 1, measured 1"}
    assert elementwise["ops"] == 2 and elementwise["sum_error_pct"] == pytest.approx(0.0)
    assert elementwise["median_pct"] == pytest.approx(50.0) and elementwise["sources"] == "fitted 1, poor-fit 1"


def test_measured_section_shows_where_the_model_is_off_by_family(small_page):
    plan, page = small_page
    text = page.section_text("measured")
    assert "Where the model is off, by op family" in text
    families = {row["family"] for row in tables.family_errors(tables.match_run(as_plan(plan), run_record(plan, emulated=True)))}
    assert families and all(f in text for f in families)


def test_run_is_matched_past_inserted_copies():
    plan = hand_plan()
    run = run_record(plan, emulated=True)
    assert len(run["ops"]) == 6   # two copy ops inserted
    pairs = tables.match_run(as_plan(plan), run)
    assert [p["index"] for p in pairs] == [0, 1, 2, 3]
    assert [p["device"] for p in pairs] == ["gpu", "gpu", "cpu", "cpu"]
    # on an emulated GPU the ops ran on the CPU: their reference is the CPU prediction
    assert [p["predicted_s"] for p in pairs] == [4e-3, 3e-4, 1e-4, 1e-5]
    real = [o for o in run["ops"] if not o["copy_direction"]]
    assert [p["measured_s"] for p in pairs] == [o["time_s"] for o in real]
    on_gpu = tables.match_run(as_plan(plan), run_record(plan, emulated=False))
    assert [p["predicted_s"] for p in on_gpu] == [2e-4, 2e-5, 1e-4, 1e-5]


def test_charts_of_300_ops_have_no_overlapping_labels():
    plan = synthetic_plan(300)
    pairs = tables.match_run(as_plan(plan), run_record(plan))
    figs = {"baselines": plots.fig_baselines(as_plan(plan)),
            "costs": plots.fig_cost_bars(*tables.top_savers(as_plan(plan))),
            "timeline": plots.fig_gantt(as_plan(plan).schedules),
            "memory": plots.fig_memory(plan["memory_timeline"], 36e9),
            "links": plots.fig_links(as_plan(plan)),
            "placement": graph.fig_placement(as_plan(plan)),
            "scatter": plots.fig_pred_vs_measured(pairs, True)}
    for name, fig in figs.items():
        assert plots.text_overlaps(fig) == [], name
        if name != "placement":   # its title and legend are figure-level text
            assert fig.axes[0].get_title() and fig.axes[-1].get_xlabel(), name
            assert "(" in fig.axes[-1].get_xlabel(), f"{name}: axis label without a unit"


def test_overlap_check_finds_colliding_labels():
    from matplotlib.figure import Figure
    fig = Figure()
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another")
    assert plots.text_overlaps(fig) == [("one label", "another")]


def test_placement_layout_folds_a_long_chain():
    n = 300
    edges = [(i, i + 1, False) for i in range(n - 1)]
    lay = graph.layered_layout(n, edges)
    assert lay["col"].max() >= 5                       # folded into columns
    assert len({tuple(p) for p in np.round(lay["xy"], 6)}) == n   # no two ops on one spot
    assert (lay["xy"][:, 0] > 0).all() and (lay["xy"][:, 0] < lay["width"]).all()
    assert (lay["xy"][:, 1] < 0).all() and (lay["xy"][:, 1] > -lay["height"]).all()
    # within a column, a consumer sits below its producer
    same = lay["col"][:-1] == lay["col"][1:]
    assert (lay["xy"][1:, 1][same] < lay["xy"][:-1, 1][same]).all()


def test_graph_edges_mark_copies_and_host_transfers():
    edges, host_in, host_out = graph.graph_edges(as_plan(hand_plan()))
    assert edges == [(0, 1, False), (1, 2, True), (2, 3, False)]
    assert host_in == {0} and host_out == set()


def test_cli_writes_report_and_trace(tmp_path, capsys):
    plan, run = hand_plan(), run_record(hand_plan())
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "run.json").write_text(json.dumps(run))
    rc = cli.main(["report", str(tmp_path / "plan.json"), "--run", str(tmp_path / "run.json"),
                   "-o", str(tmp_path / "r.html"), "--trace", str(tmp_path / "t.json")])
    assert rc == 0
    assert Page((tmp_path / "r.html").read_text()).op_rows == 4
    (tmp_path / "plan4.json").write_text(json.dumps(four_gpu_plan()))
    (tmp_path / "run4.json").write_text(json.dumps(four_gpu_run(four_gpu_plan())))
    assert cli.main(["report", str(tmp_path / "plan4.json"), "--run", str(tmp_path / "run4.json"),
                     "-o", str(tmp_path / "r4.html"), "--trace", str(tmp_path / "t4.json")]) == 0
    assert Page((tmp_path / "r4.html").read_text()).op_rows == 7
    trace = json.loads((tmp_path / "t.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"conv1", "prob"}


def test_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "plan.json").write_text("{not json")
    rc = cli.main(["report", str(tmp_path / "plan.json"), "-o", str(tmp_path / "r.html")])
    assert rc == 2
    assert "plan.json: not a JSON plan: Expecting property name" in capsys.readouterr().err
    (tmp_path / "plan.json").write_text(json.dumps(hand_plan()))
    rc = cli.main(["report", str(tmp_path / "plan.json"), "-o", str(tmp_path / "plan.json")])
    assert rc == 2 and "refusing to overwrite" in capsys.readouterr().err
    (tmp_path / "run.json").write_text(json.dumps({"ops": []}))
    rc = cli.main(["report", str(tmp_path / "plan.json"), "--run", str(tmp_path / "run.json"),
                   "-o", str(tmp_path / "r.html")])
    assert rc == 2 and "not a placer run record" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_write_report_replaces_atomically(tmp_path):
    out = tmp_path / "sub" / "r.html"
    write_report(as_plan(hand_plan()), None, out)
    first = out.read_text()
    write_report(as_plan(synthetic_plan(40)), None, out)
    assert out.read_text() != first
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]   # no temporary left behind


def test_op_without_a_gpu_kernel_and_sparse_old_ops():
    plan = hand_plan()
    plan["ops"][3]["gpu_s"] = float("inf")       # no GPU kernel: infinite on the GPU
    plan["ops"].append({"index": 4, "type": "Unknown"})   # an op with almost nothing known
    page_text = render(as_plan(plan), run_record(hand_plan()))
    page = Page(page_text)
    assert page.op_rows == 5
    assert "∞" in page.section_text("ops")
    assert 'data-v="inf"' not in page_text and 'data-v="nan"' not in page_text
    top, n = tables.top_savers(as_plan(plan))
    assert n == 3 and 3 not in [o.index for o in top]


def test_placement_falls_back_to_matplotlib_without_graphviz(monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    svg, how = graph.placement_svg(as_plan(hand_plan()))
    assert how.startswith("matplotlib")
    assert ET.fromstring(svg).tag.endswith("svg")


def test_placement_by_graphviz_marks_the_copy():
    import shutil
    if not shutil.which("dot"):
        pytest.skip("graphviz dot not installed (the matplotlib drawing is used instead)")
    svg, how = graph.placement_svg(as_plan(hand_plan()))
    assert how == "graphviz dot"
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert svg.count(">copy<") == 1            # relu1 -> fc crosses devices
    assert "3 Softmax" in svg and plots.COLORS["gpu"] in svg


def test_a_long_net_is_folded_not_handed_to_graphviz():
    svg, how = graph.placement_svg(as_plan(synthetic_plan(300)))
    assert how == "matplotlib, longest-path layers, folded into columns"


def test_report_of_a_real_plan_from_placer_plan(tmp_path, capsys):
    """The bundled small DLRM example planned by `placer plan --json`, then reported."""
    from pathlib import Path

    from placer.report.trace import build_trace, validate_trace
    data = Path(__file__).resolve().parents[1] / "placer" / "examples" / "data"
    rc = cli.main(["plan", str(data / "dlrm_small.pbtxt"), "--init-net", str(data / "dlrm_small_init.pbtxt"),
                   "--pin", "*SparseLengthsSum*=cpu", "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    page = Page(render(as_plan(plan)))
    assert SECTION_IDS <= set(page.sections)
    assert page.op_rows == len(plan["ops"]) > 0
    assert len(page.images) == 6    # no run: no scatter
    for src in page.images:
        assert ET.fromstring(decode_image(src)).tag.endswith("svg")
    assert "not available" not in " ".join(page.section_text(s) for s in SECTION_IDS)
    assert any(o["device"] == "cpu" for o in plan["ops"]) and plan["copies"]
    for schedule in ("serial", "makespan"):
        assert validate_trace(build_trace(as_plan(plan), schedule=schedule)) == []


def test_gantt_merges_only_items_closer_than_its_resolution():
    ev = [(0.0, 1.0), (1.0, 2.0), (2.0005, 3.0), (5.0, 6.0)]
    assert plots._merged_spans(ev, 0.001) == [(0.0, 3.0), (5.0, 6.0)]
    assert plots._merged_spans(ev, 0.0) == [(0.0, 2.0), (2.0005, 3.0), (5.0, 6.0)]


def test_a_net_too_big_to_draw_says_so(monkeypatch):
    monkeypatch.setattr(graph, "MAX_DRAWN_OPS", 100)
    page = Page(render(as_plan(synthetic_plan(150))))
    assert "not drawn for 150 ops" in page.section_text("placement")
    assert page.op_rows == 150 and len(page.images) == 5


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["resnet50_ResNet-50-deploy.prototxt", "bvlc_googlenet_train_val.prototxt"])
def test_corpus_net_charts_have_no_overlapping_labels(name, corpus, capsys):
    assert cli.main(["plan", str(corpus / "caffe" / name), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["ops"]) > 150
    limits = {m["device"]: (m["capacity_bytes"], m["usable_bytes"]) for m in doc.memory_rows(as_plan(plan))}
    figs = {"baselines": plots.fig_baselines(as_plan(plan)), "costs": plots.fig_cost_bars(*tables.top_savers(as_plan(plan))),
            "timeline": plots.fig_gantt(as_plan(plan).schedules, plan["devices"]), "placement": graph.fig_placement(as_plan(plan)),
            "memory": plots.fig_memory(doc.memory_timelines(as_plan(plan)), limits), "links": plots.fig_links(as_plan(plan))}
    for key, fig in figs.items():
        assert plots.text_overlaps(fig) == [], key


def test_summary_says_how_much_overlap_saves():
    plan = synthetic_plan(60)
    serial = plan["schedules"]["serial"]["makespan_s"]
    overlapped = plan["schedules"]["makespan"]["makespan_s"]
    assert overlapped < serial
    text = Page(render(as_plan(plan))).section_text("summary")
    assert f"{100 * (serial - overlapped) / serial:.1f}% shorter" in text


def test_memory_chart_keeps_small_curves_readable():
    plan = hand_plan()   # a few MiB live against a 14.4 GB GPU
    fig = plots.fig_memory(plan["memory_timeline"], 14.4e9)
    ax = next(a for a in fig.axes if a.get_title() == "memory on gpu")
    assert ax.get_ylabel() == "live memory (MiB)"
    assert ax.get_ylim()[1] < 10          # scaled to the curves, not to the capacity
    assert any("far above the curve" in t.get_text() for t in ax.get_legend().get_texts())
    near = plots.fig_memory(plan["memory_timeline"], {"gpu": (8e6, None)}).axes[1]
    assert near.get_title() == "memory on gpu"
    assert near.get_ylim()[1] * 2**20 >= 8e6  # a limit close to the curves is drawn


# --- a CPU and four GPUs (plan document version 2) ----------------------------------


class Tables(HTMLParser):
    """Every <table> of a page by id: its rows as lists of cell texts (header rows too)."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._rows, self._cell = None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._rows = self.tables.setdefault(dict(attrs).get("id") or f"table{len(self.tables)}", [])
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def four_gpu_page():
    plan = four_gpu_plan()
    text = render(as_plan(plan), four_gpu_run(plan))
    return plan, Page(text), Tables(text).tables


def test_four_gpu_page_has_every_section_and_self_contained_images(four_gpu_page):
    plan, page, _ = four_gpu_page
    assert SECTION_IDS <= set(page.sections)
    assert page.op_rows == 7 and len(page.images) == 7
    for src in page.images:
        assert ET.fromstring(decode_image(src)).tag.endswith("svg")
    assert all(ref.startswith(("data:", "#")) for ref in page.refs)
    assert "not available" not in " ".join(page.section_text(s) for s in SECTION_IDS)


def test_plan_table_shows_each_ops_device_and_one_column_for_identical_gpus(four_gpu_page):
    _, _, tables_ = four_gpu_page
    header, *rows = tables_["op-table"]
    assert header == ["#", "op", "type", "device", "cpu time", "cuda:0-3 time", "saved vs the CPU", "times from",
                      "pinned", "measured", "reason"]
    assert [r[3] for r in rows] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:1", "cuda:1", "cuda:1"]
    assert rows[5][4:7] == ["3 ms", "60 µs", "2.94 ms"]              # FC: 3 ms on the CPU, 60 µs on a V100
    assert rows[0][7] == "cpu measured; cuda:0-3 roofline"


def test_a_different_gpu_gets_its_own_time_column():
    plan = four_gpu_plan(hetero=True)                                # cuda:3 three times slower
    header = Tables(render(as_plan(plan))).tables["op-table"][0]
    assert header[4:7] == ["cpu time", "cuda:0-2 time", "cuda:3 time"]
    cols = doc.time_columns(as_plan(plan))
    assert [c["devices"] for c in cols] == [["cpu"], ["cuda:0", "cuda:1", "cuda:2"], ["cuda:3"]]
    rows = tables.op_rows(as_plan(plan), columns=cols)
    assert rows[3]["times"] == pytest.approx([700e-6, 13e-6, 39e-6]) and rows[3]["time_s"] == pytest.approx(39e-6)
    summary = Page(render(as_plan(plan))).section_text("summary")
    assert "cuda:0-2 profile V100" in summary and "cuda:3 profile T4" in summary


def test_memory_per_device_table_and_one_chart_panel_per_device_holding_memory(four_gpu_page):
    plan, page, tables_ = four_gpu_page
    header, *rows = tables_["memory-table"]
    assert header[:6] == ["device", "used", "parameters", "peak activations", "capacity", "usable (less the reserve)"]
    assert [r[:6] for r in rows] == [
        ["cpu", "0 B", "0 B", "0 B", "no limit", "no limit"],
        ["cuda:0", "4 GiB", "4 GiB", "1 MiB", "16 GiB", "14.4 GiB"],
        ["cuda:1", "4.01 GiB", "4 GiB", "8 MiB", "16 GiB", "14.4 GiB"],
        ["cuda:2", "4 GiB", "4 GiB", "1 MiB", "16 GiB", "14.4 GiB"],
        ["cuda:3", "4 GiB", "4 GiB", "1 MiB", "16 GiB", "14.4 GiB"]]
    assert "Nothing is held on cpu in this plan" in page.section_text("memory")
    limits = {m["device"]: (m["capacity_bytes"], m["usable_bytes"]) for m in doc.memory_rows(as_plan(plan))}
    fig = plots.fig_memory(doc.memory_timelines(as_plan(plan)), limits)
    assert [ax.get_title() for ax in fig.axes] == [f"memory on cuda:{k}" for k in range(4)]
    for ax in fig.axes:   # 16 GiB capacity and 14.4 GiB usable drawn: within 8x of a 4 GiB curve
        assert sorted(line.get_ydata()[0] for line in ax.lines[1:]) == pytest.approx([14.4, 16.0])
        assert ax.get_ylabel() == "live memory (GiB)"
    assert plots.text_overlaps(fig) == []


def test_bytes_per_link_table_and_chart(four_gpu_page):
    plan, page, tables_ = four_gpu_page
    _, *rows = tables_["link-table"]
    assert rows == [["cpu -> cuda:0", "h2d", "1", "4 KiB", "10 µs"], ["cpu -> cuda:1", "h2d", "1", "4 KiB", "10 µs"],
                    ["cpu -> cuda:2", "h2d", "1", "4 KiB", "10 µs"], ["cpu -> cuda:3", "h2d", "1", "4 KiB", "10 µs"],
                    ["cuda:0 -> cuda:1", "d2d", "1", "1 MiB", "60 µs"], ["cuda:1 -> cpu", "d2h", "1", "1 KiB", "10 µs"],
                    ["cuda:2 -> cuda:1", "d2d", "1", "1 MiB", "120 µs"], ["cuda:3 -> cuda:1", "d2d", "1", "1 MiB", "60 µs"]]
    assert "GPU to GPU 3 MiB" in page.section_text("summary")
    fig = plots.fig_links(as_plan(plan))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [r[0] for r in rows]      # top to bottom
    assert [round(p.get_width(), 6) for p in ax.patches][4] == 1.0        # MiB on the axis: 1 MiB
    assert plots.text_overlaps(fig) == []
    assert plots.fig_links(as_plan({**plan, "link_bytes": [], "copies": []})) is None


def test_timeline_has_a_lane_per_device_and_per_copy_lane(four_gpu_page):
    plan = four_gpu_page[0]
    fig = plots.fig_gantt(as_plan(plan).schedules, plan["devices"])
    lanes = [[t.get_text() for t in ax.get_yticklabels()][::-1] for ax in fig.axes]
    devices = ["cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert lanes[0] == devices + ["cpu->cuda:0", "cpu->cuda:1", "cpu->cuda:2", "cpu->cuda:3", "cuda:0->cuda:1",
                                  "cuda:2->cuda:1", "cuda:3->cuda:1", "cuda:1->cpu"]
    # the makespan schedule: GPUs 0-1 and 2-3 behind one PCIe switch each; emb2 staged through the host
    assert lanes[1] == devices + ["pcie[switch0]:h2d", "pcie[switch1]:h2d", "cuda:0->cuda:1", "pcie[switch1]:d2h",
                                  "cuda:3->cuda:1", "pcie[switch0]:d2h"]
    assert [ax.get_title() for ax in fig.axes] == ["serial schedule: makespan 415 µs", "makespan schedule: makespan 226 µs"]
    assert plots.text_overlaps(fig) == []


def test_bars_of_a_lane_are_its_events():
    plan = four_gpu_plan()
    fig = plots.fig_gantt({"makespan": as_plan(plan).schedules["makespan"]}, plan["devices"])
    ax = fig.axes[0]
    rows = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    spans = {}
    for coll in ax.collections:
        for path in coll.get_paths():
            (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
            spans.setdefault(round((y0 + y1) / 2), []).append((round(x0, 6), round(x1, 6)))
    # two ids copies back to back (one bar, µs), then emb2's second hop
    assert sorted(spans[rows["pcie[switch0]:h2d"]]) == [(0.0, 20.0), (83.0, 143.0)]
    assert sorted(spans[rows["cuda:1"]]) == [(20.0, 33.0), (143.0, 216.0)]
    assert rows["cpu"] not in spans                                   # nothing on the host


def test_baselines_include_the_pipeline_split_and_baechi_with_feasibility(four_gpu_page):
    _, _, tables_ = four_gpu_page
    header, *rows = tables_["baselines"]
    assert header == ["placement", "devices", "predicted time (serial)", "compared with the plan", "note"]
    by_label = {r[0]: r for r in rows}
    assert by_label["this plan (auto, serial objective)"][1:3] == ["cuda:0-3", "415 µs"]
    assert by_label["pipeline split over the GPUs (balanced by compute)"][1:] == [
        "cuda:0, cuda:1", "610 µs (if it fitted)", "cannot run: does not fit", "needs 16 GiB on cuda:0; 14.4 GiB usable"]
    assert by_label["all on one GPU (CPU fallback)"][3] == "cannot run: does not fit"
    assert by_label["Baechi m-TOPO"][1:4] == ["cuda:0-3", "520 µs", "plan is 1.25x faster"]   # 520 / 415
    assert by_label["Baechi m-ETF"][1:4] == ["cuda:0-3", "450 µs", "plan is 1.08x faster"]
    fig = plots.fig_baselines(as_plan(four_gpu_plan()))
    assert fig.axes[0].get_xscale() == "log"            # all-CPU (11.6 ms) is 93x the bound
    assert plots.text_overlaps(fig) == []


def test_makespan_plans_compare_baselines_by_makespan():
    plan = four_gpu_plan()
    plan["objective"] = "makespan"
    for key, ms in (("all_cpu", 11.6e-3), ("m_topo", 452e-6), ("m_etf", 226e-6)):
        plan["baselines"][key]["makespan_s"] = ms
    text = render(as_plan(plan))
    header, *rows = Tables(text).tables["baselines"]
    assert header[3] == "overlapped makespan"
    by_key = {r[0]: r for r in rows}
    assert by_key["Baechi m-TOPO"][3:5] == ["452 µs", "plan is 2.00x faster"]     # 452 / 226 µs
    assert by_key["all on the CPU"][3:5] == ["11.6 ms", "plan is 51.33x faster"]
    assert "Predicted 226 µs per run with the devices and copies overlapped (415 µs" in \
        Page(text).section_text("summary")


def test_measured_run_per_device_times_and_per_link_bytes(four_gpu_page):
    plan, _, tables_ = four_gpu_page
    _, *devices = tables_["by-device"]
    # predicted: the GPU times of the ops there; measured (emulated): 1.5 x their CPU times
    assert devices == [["cpu", "0 s", "0 s", "0 B", "5 KiB"],
                       ["cuda:0", "13 µs", "1.05 ms", "4 GiB", "4 GiB"],
                       ["cuda:1", "86 µs", "5.64 ms", "4.01 GiB", "4 GiB"],
                       ["cuda:2", "13 µs", "1.05 ms", "4 GiB", "4 GiB"],
                       ["cuda:3", "13 µs", "1.05 ms", "4 GiB", "4 GiB"]]
    _, *links = tables_["by-link"]
    assert links[0] == ["cpu->cuda:0", "1 / 1", "4 KiB", "4 KiB", "10 µs", "20 µs"]
    assert links[6] == ["cuda:2->cuda:1", "1 / 1", "1 MiB", "1 MiB", "120 µs", "240 µs"]
    assert len(links) == 8
    pairs = tables.match_run(as_plan(plan), four_gpu_run(plan))
    assert [p["index"] for p in pairs] == list(range(7))
    assert [p["predicted_s"] for p in pairs] == [o["cpu_s"] for o in plan["ops"]]   # emulated: CPU times


def test_a_real_gpu_run_is_held_to_the_time_on_its_own_gpu():
    plan = four_gpu_plan(hetero=True)
    run = four_gpu_run(plan)
    for o in run["ops"]:
        o["device"] = o["device"].removeprefix("emulated-")
    run["emulated"] = False
    pairs = tables.match_run(as_plan(plan), run)
    assert [p["predicted_s"] for p in pairs] == pytest.approx([13e-6, 13e-6, 13e-6, 39e-6, 8e-6, 60e-6, 5e-6])


def test_placement_graph_colours_ops_by_device():
    plan = four_gpu_plan()
    edges, host_in, host_out = graph.graph_edges(as_plan(plan))
    assert sorted(e for e in edges if e[2]) == [(0, 4, True), (2, 4, True), (3, 4, True)]
    assert host_in == {0, 1, 2, 3} and host_out == {6}
    colors = plots.device_colors(plan["devices"], doc.device_kinds(as_plan(plan)))
    assert len(set(colors.values())) == 5
    src = graph.dot_source(as_plan(plan), edges)
    for d, n in (("cuda:0", 1), ("cuda:1", 4), ("cuda:2", 1), ("cuda:3", 1)):
        assert src.count(f'fillcolor="{colors[d]}"') == n + 1       # its ops and its legend entry
    assert "Placement of 7 ops: 1 on cuda:0, 4 on cuda:1, 1 on cuda:2, 1 on cuda:3; 3 edges crossing devices" in src
    fig = graph.fig_placement(as_plan(plan))
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {f"op on cuda:{k}" for k in range(4)}
    assert plots.text_overlaps(fig) == []


def test_cost_bars_draw_one_bar_per_time_column():
    plan = four_gpu_plan(hetero=True)
    top, n = tables.top_savers(as_plan(plan))
    assert n == 7 and top[0].name == "fc"          # 3 ms on the CPU, 60 µs on a V100: the widest spread
    fig = plots.fig_cost_bars(top, n, doc.time_columns(as_plan(plan)))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sorted(labels) == ["chosen device", "cpu time", "cuda:0-2 time", "cuda:3 time"]
    assert len(fig.axes[0].patches) == 3 * 7
    assert plots.text_overlaps(fig) == []


def test_a_plan_with_an_infinite_baseline_reads_and_infinity_elsewhere_is_refused(tmp_path, capsys):
    """A baseline that cannot run is priced Infinity in version-1 plans (``synthetic_plan``):
    the report reads it and draws the baseline as infeasible; Infinity or NaN in any other
    field is one line naming the field, and no report is written."""
    plan = synthetic_plan(30)
    assert plan["baselines"]["all_gpu"]["total_s"] == float("inf")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert "Infinity" in (tmp_path / "plan.json").read_text()
    assert cli.main(["report", str(tmp_path / "plan.json"), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").is_file()
    capsys.readouterr()
    plan["ops"][3]["cpu_s"] = float("nan")
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    assert cli.main(["report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "bad.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.json: field 'ops[3].cpu_s': expected a finite number or null, found NaN" in err
    assert not (tmp_path / "bad.html").exists()
