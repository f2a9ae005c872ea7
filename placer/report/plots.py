"""The report's charts, drawn with matplotlib into standalone SVG.

Each ``fig_*`` function builds a ``matplotlib.figure.Figure`` (no pyplot, so no global
state and no display needed); ``to_svg`` serialises it with text kept as text (smaller,
searchable, rendered by the browser's own fonts). Figures are sized from their content
(one row per bar, one lane per device or copy lane, one panel per device) so labels
never have to shrink to collide; ``text_overlaps`` finds colliding labels and is what the
tests hold every chart to. Every chart of a report colours a device alike
(``device_colors``) and a copy by its direction. The placement graph is in
``placer.report.graph``.
"""
from __future__ import annotations

import base64
import io
import math
from typing import TYPE_CHECKING

import numpy as np

from placer.documents.plan import Event, OpInfo, PlanDocument, Schedule
from placer.report.doc import device_kind, direction, link_rows, op_time, or_default, time_columns
from placer.report.tables import baseline_rows, op_label
from placer.units import byte_unit, fmt_bytes, fmt_time, time_unit

if TYPE_CHECKING:  # matplotlib, an optional heavy dependency, is imported where a chart is drawn
    from matplotlib.figure import Figure
    from matplotlib.text import Text

COLORS = {"cpu": "#1f77b4", "gpu": "#2ca02c", "h2d": "#d62728", "d2h": "#9467bd", "d2d": "#8c6d31",
          "h2h": "#7f7f7f", "plan": "#ff7f0e", "base": "#7f7f7f"}
# GPUs in index order take these (cycled past eight); hosts (several on a cluster) the blues
GPU_COLORS = ("#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#006d2c", "#7b4173", "#637939")
HOST_COLORS = ("#1f77b4", "#3a5a80", "#6baed6")
SHARED_COLOR = "#5f6b5f"   # a time column shared by identical GPUs
LANE_LABELS = {"gpu": "GPU stream", "h2d": "H2D copies", "d2h": "D2H copies"}   # version-1 lanes
DIRECTION_LABELS = {"h2d": "host to GPU copy", "d2h": "GPU to host copy", "d2d": "GPU to GPU copy",
                    "h2h": "host to host copy"}
MAX_VECTOR_POINTS = 3000  # past this, dense marks are embedded as a bitmap to keep the page small
SHORT_BASELINES = {"plan": "this plan", "all_cpu": "all-CPU", "all_gpu": "one GPU+fallback", "greedy": "greedy",
                   "existing": "your placement", "pipeline": "pipeline split", "m_topo": "Baechi m-TOPO",
                   "m_etf": "Baechi m-ETF", "lower_bound": "lower bound"}


def device_colors(devices: list[str], kinds: dict[str, str]) -> dict[str, str]:
    """A colour per device, the same in every chart of a report: hosts blue, GPUs in
    index order from ``GPU_COLORS`` (a version-1 plan's ``gpu`` gets the first: green)."""
    out, hosts, gpus = {}, 0, 0
    for d in devices:
        if kinds.get(d, device_kind(d)) == "cpu":
            out[d], hosts = HOST_COLORS[hosts % len(HOST_COLORS)], hosts + 1
        else:
            out[d], gpus = GPU_COLORS[gpus % len(GPU_COLORS)], gpus + 1
    return out


def to_svg(fig: Figure) -> str:
    """The figure as one SVG document (no external references, no timestamp)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "placer"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


def data_uri(svg: str) -> str:
    """``data:image/svg+xml;base64,...`` for an <img src>, so the page needs no files."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def text_overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty labels whose drawn boxes intersect (tick labels inside
    the axis range, titles, axis labels, legend entries, annotations)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [t for t in _visible_texts(fig) if t.get_text().strip()]
    boxes = np.array([tuple(t.get_window_extent(renderer).extents) for t in texts]).reshape(-1, 4)
    pairs = []
    shrink = 0.5  # pixels: touching glyph boxes are not an overlap a reader notices
    for i in range(len(texts)):
        a = boxes[i]
        hit = ((boxes[i + 1:, 0] < a[2] - shrink) & (boxes[i + 1:, 2] > a[0] + shrink)
               & (boxes[i + 1:, 1] < a[3] - shrink) & (boxes[i + 1:, 3] > a[1] + shrink))
        pairs += [(texts[i].get_text(), texts[i + 1 + j].get_text()) for j in np.flatnonzero(hit)]
    return pairs


def _visible_texts(fig: Figure) -> list[Text]:
    out = list(fig.texts)
    for legend in fig.legends:
        out += list(legend.get_texts()) + [legend.get_title()]
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        out += list(ax.texts)
        legend = ax.get_legend()
        if legend is not None:
            out += list(legend.get_texts()) + [legend.get_title()]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for ticks in (axis.get_major_ticks(), axis.get_minor_ticks()):
                for tick in ticks:
                    loc = tick.get_loc()
                    if loc is not None and lo - 1e-12 <= loc <= hi + 1e-12:
                        out += [lb for lb in (tick.label1, tick.label2) if lb.get_visible()]
    return [t for t in out if t.get_visible()]


# --- summary -------------------------------------------------------------------------


def fig_baselines(plan: PlanDocument) -> Figure:
    """Horizontal bars: the plan and each baseline's predicted serial time, and beside it
    the overlapped makespan where the plan has them (makespan objective); a baseline that
    does not fit some device's memory is hatched and says so, one with no time is named."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = baseline_rows(plan)
    spans = any(r["makespan_s"] is not None for r in rows)
    finite = [v for r in rows for v in (r["total_s"], r["makespan_s"]) if v is not None and math.isfinite(v)]
    unit, scale = time_unit(max(finite, default=1.0))
    # one slow baseline (all-CPU) would flatten the rest to the axis: then a log scale
    log = bool(finite) and min(finite) > 0 and max(finite) / min(finite) > BASELINE_LOG_SPAN
    left = min(finite, default=1.0) / scale / 3 if log else 0.0
    row_in = 0.7 if spans else 0.45
    fig = Figure(figsize=(7.5, row_in * len(rows) + 1.3))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    bars = (("total_s", 0.0, 0.6),) if not spans else (("total_s", 0.2, 0.38), ("makespan_s", -0.2, 0.38))
    for yi, r in zip(y, rows):
        if r["total_s"] is None or not math.isfinite(r["total_s"]):
            ax.text(left, yi, "  infeasible / not computed", va="center", fontsize=8, color="#555")
            continue
        color = COLORS["plan" if r["key"] == "plan" else "base"]
        for key, dy, height in bars:
            value = r[key]
            if value is None:
                continue
            ax.barh(yi + dy, value / scale - left, left=left, height=height, color=color if r["feasible"] else "white",
                    edgecolor=color, hatch=None if r["feasible"] else "///", alpha=1.0 if key == "total_s" else 0.55)
            ax.text(value / scale, yi + dy, f" {value / scale:.3g}" + ("" if r["feasible"] else " (does not fit)"),
                    va="center", fontsize=7 if spans else 8)
    ax.set_yticks(y, [SHORT_BASELINES.get(r["key"], r["key"]) for r in rows])
    ax.set_xlabel(f"predicted time per run ({unit}{', log scale' if log else ''})")
    ax.set_title("Plan vs baselines" + (": serial time (upper bar), overlapped makespan (lower)" if spans
                                       else " (serial objective)"), fontsize=10)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left, max(finite) / scale * 4)
    else:
        ax.set_xlim(0, max(finite, default=1.0) / scale * 1.35)
    handles = [Patch(color=COLORS["plan"], label="this plan"), Patch(color=COLORS["base"], label="baseline")]
    if not all(r["feasible"] for r in rows):
        handles.append(Patch(facecolor="white", edgecolor=COLORS["base"], hatch="///",
                             label="does not fit device memory"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


BASELINE_LOG_SPAN = 30.0   # slowest / fastest bar past which the time axis is logarithmic


# --- per-op cost bars ----------------------------------------------------------------


def fig_cost_bars(ops: list[OpInfo], total: int, columns: list[dict] | None = None,
                  colors: dict[str, str] | None = None) -> Figure:
    """Each op's time on every device column (already sorted by spread; identical GPUs
    share a column), the chosen device marked."""
    from matplotlib.figure import Figure

    columns = columns or time_columns(PlanDocument(ops=ops))
    colors = colors or device_colors([c["device"] for c in columns], {c["device"]: c["kind"] for c in columns})
    # a column shared by identical GPUs is not any one of them: a neutral colour
    shade = {c["device"]: colors.get(c["device"], COLORS["gpu"]) if len(c["devices"]) == 1 else SHARED_COLOR
             for c in columns}
    k = max(len(columns), 1)
    row_in = max(0.34, 0.13 * k + 0.08)
    n = max(len(ops), 1)
    fig = Figure(figsize=(8.5, row_in * n + 1.6))
    ax = fig.add_subplot()
    table = np.array([[op_time(o, c["device"], c["kind"]) for c in columns] for o in ops], float).reshape(len(ops), k)
    shown = table[np.isfinite(table) & (table > 0)]
    unit, scale = time_unit(float(shown.max()) if shown.size else 1.0)
    y = np.arange(len(ops))[::-1]
    height = 0.8 / k
    offsets = (np.arange(k)[::-1] - (k - 1) / 2) * height
    for j, c in enumerate(columns):
        ax.barh(y + offsets[j], np.where(np.isfinite(table[:, j]), table[:, j], 0.0) / scale, height=height * 0.95,
                color=shade[c["device"]], label=f"{c['label']} time")
    chosen = [next((j for j, c in enumerate(columns) if o.device in c["devices"]), None) for o in ops]
    marked = [(table[i, j] / scale, y[i] + offsets[j]) for i, j in enumerate(chosen)
              if j is not None and np.isfinite(table[i, j])]
    if marked:
        ax.plot(*np.array(marked).T, linestyle="none", marker="D", markersize=5, color="black",
                label="chosen device")
    if shown.size and shown.max() / shown.min() > 100:
        ax.set_xscale("log")
    ax.set_yticks(y, [op_label(o) for o in ops], fontsize=7)
    ax.set_xlabel(f"predicted time ({unit}{', log scale' if ax.get_xscale() == 'log' else ''})")
    what = f"top {len(ops)} of {total} ops" if total > len(ops) else f"all {total} ops"
    ax.set_title(f"Per-op cost on each device, sorted by the spread of its times ({what})", fontsize=10)
    ax.set_ylim(-0.8, len(ops) - 0.2)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6 / (row_in * n + 1.6) - 0.04),
              ncol=min(k + 1, 4), fontsize=8)
    return fig


# --- timeline ------------------------------------------------------------------------


def event_direction(ev: Event) -> str:
    """A copy event's direction: from its devices (version 2), else its version-1 lane."""
    if ev.src and ev.dst:
        return direction(ev.src, ev.dst)
    return ev.lane if ev.lane in ("h2d", "d2h") else "h2d"


def schedule_lanes(events: list[Event], devices: list[str]) -> tuple[list[str], list[str]]:
    """(device lanes, copy lanes) of one schedule: every device of the plan, then each
    lane a copy ran on (a link, a PCIe switch's engine, a version-1 ``h2d``), in the
    order they first appear."""
    ops = list(devices) + [e.lane for e in events if e.kind != "copy" and e.lane not in devices]
    copies = [or_default(e.lane, "") for e in events if e.kind == "copy"]
    return list(dict.fromkeys(ops)), list(dict.fromkeys(copies))


def fig_gantt(schedules: dict[str, Schedule], devices: list[str] | None = None,
              kinds: dict[str, str] | None = None) -> Figure:
    """One Gantt chart per schedule (serial, makespan): a lane per device (its ops, in
    the device's colour) and a lane per copy lane (copies coloured by direction)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = [k for k in ("serial", "makespan") if k in schedules] + \
            [k for k in schedules if k not in ("serial", "makespan")]
    events = {k: schedules[k].events or [] for k in names}
    devices = list(devices or dict.fromkeys(e.lane for k in names for e in events[k] if e.kind != "copy"))
    kinds = kinds or {d: device_kind(d) for d in devices}
    colors = device_colors(devices, kinds)
    lanes = {k: schedule_lanes(events[k], devices) for k in names}
    counts = [max(len(a) + len(b), 1) for a, b in lanes.values()]
    ends = [e.end_s for k in names for e in events[k]]
    unit, scale = time_unit(max(ends, default=1.0))
    height = 0.3 * sum(counts) + 0.75 * len(names) + 0.9
    fig = Figure(figsize=(10, height))
    fig.subplots_adjust(top=1 - 0.4 / height, bottom=0.55 / height, hspace=0.75 * len(names) / sum(counts))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": counts})[:, 0]
    used = set()
    for ax, name in zip(axes, names):
        dev_lanes, copy_lanes = lanes[name]
        order = dev_lanes + copy_lanes
        span_s = max((e.end_s for e in events[name]), default=0.0)
        groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for e in events[name]:
            color = (COLORS[event_direction(e)] if e.kind == "copy"
                     else colors.get(e.lane, COLORS["cpu"]))
            used.add(event_direction(e) if e.kind == "copy" else "op")
            groups.setdefault((or_default(e.lane, ""), color), []).append((e.start_s, e.end_s))
        for (lane, color), evs in groups.items():
            row = len(order) - 1 - order.index(lane)
            least = span_s / GANTT_MIN_WIDTH   # a copy of a few bytes still shows
            spans = [(a / scale, max(b - a, least) / scale) for a, b in _merged_spans(evs, span_s / GANTT_RESOLUTION)]
            ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=color, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(order)), [LANE_LABELS.get(lane, lane) for lane in order[::-1]], fontsize=8)
        ax.set_ylim(-0.6, max(len(order), 1) - 0.4)
        ms = schedules[name].makespan_s
        ax.set_title(f"{name} schedule: makespan {fmt_time(ms)}" if ms is not None else f"{name} schedule",
                     fontsize=10)
    axes[-1].set_xlabel(f"predicted time from the start of a run ({unit})")
    handles = [Patch(color=colors[d], label=f"op on {d}") for d in devices][:8] if "op" in used else []
    handles += [Patch(color=COLORS[d], label=DIRECTION_LABELS[d]) for d in ("h2d", "d2h", "d2d", "h2h") if d in used]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(handles), 4) or 1,
               fontsize=8, frameon=False)
    return fig


GANTT_RESOLUTION = 4000   # items closer than 1/4000 of the timeline are drawn as one bar
GANTT_MIN_WIDTH = 600     # and every bar is at least 1/600 of the timeline wide


def _merged_spans(spans: list[tuple[float, float]], gap_s: float) -> list[tuple[float, float]]:
    """The lane's items' (start, end), neighbours closer than ``gap_s`` merged: far below
    what the chart can show apart, and it keeps a net of 100k ops a drawable size."""
    out: list[list[float]] = []
    for start, end in sorted(spans, key=lambda span: span[0]):
        if out and start - out[-1][1] <= gap_s:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


# --- memory and links ----------------------------------------------------------------


def fig_memory(timeline: dict, limits: dict | float | None = None, colors: dict[str, str] | None = None) -> Figure:
    """One plot per device that holds anything: its live bytes (parameters plus live
    activations) after each op step, with its capacity and the part of it plans may use
    (capacity less the reserve). ``limits``: device -> (capacity, usable), or one
    capacity for every GPU. A limit far above the curve would flatten it to the axis, so
    it is then named in the legend instead of drawn."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    curves = {d: np.asarray(v or [], float) for d, v in timeline.items()}
    shown = [d for d, v in curves.items() if len(v) and v.max() > 0] or list(curves)[:1]
    if not isinstance(limits, dict):
        limits = {d: (limits, None) for d in curves if device_kind(d) == "gpu"}
    colors = colors or device_colors(list(curves), {d: device_kind(d) for d in curves})
    panel_in = 2.1
    fig = Figure(figsize=(10, panel_in * len(shown) + 0.9))
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    for ax, dev in zip(axes, shown):
        capacity, usable = (tuple(limits.get(dev) or ()) + (None, None))[:2]
        _memory_panel(ax, dev, curves[dev], capacity, usable, colors.get(dev, COLORS["cpu"]))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("op index (net order)")
    return fig


def _memory_panel(ax, dev: str, vals: np.ndarray, capacity, usable, color: str) -> None:
    from matplotlib.lines import Line2D

    data_peak = max(float(vals.max()) if len(vals) else 0.0, 1.0)
    limits = [(capacity, "capacity", "--", COLORS["h2d"]),
              (usable if usable != capacity else None, "usable, less reserve", ":", COLORS["d2h"])]
    drawn = [lim for lim in limits if lim[0] and lim[0] <= MEMORY_LIMIT_SPAN * data_peak]
    unit, scale = byte_unit(max([data_peak] + [lim[0] for lim in drawn]))
    if len(vals):
        ax.step(np.arange(len(vals)), vals / scale, where="post", color=color,
                label=f"live bytes (peak {fmt_bytes(vals.max())})")
    for value, label, style, lcolor in limits:
        if not value:
            continue
        text = f"{label} ({fmt_bytes(value)})"
        if (value, label, style, lcolor) in drawn:
            ax.axhline(value / scale, color=lcolor, linestyle=style, label=text)
        else:
            ax.add_line(Line2D([], [], color=lcolor, linestyle=style, label=text + ", far above the curve"))
    ax.set_ylabel(f"live memory ({unit})", fontsize=8)
    ax.set_title(f"memory on {dev}", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


MEMORY_LIMIT_SPAN = 8.0   # draw a memory limit when it is at most this many times the peak


def fig_links(plan: PlanDocument) -> Figure | None:
    """Bytes copied per run over each link (source -> destination), coloured by direction,
    each bar labelled with its copies and predicted time; None when nothing is copied."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = [r for r in link_rows(plan) if r["bytes"]]
    if not rows:
        return None
    unit, scale = byte_unit(max(r["bytes"] for r in rows))
    fig = Figure(figsize=(8.5, 0.34 * len(rows) + 1.3))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows):
        ax.barh(yi, r["bytes"] / scale, height=0.6, color=COLORS[r["direction"]])
        ax.text(r["bytes"] / scale, yi, f" {fmt_bytes(r['bytes'])} in {r['copies']} "
                f"cop{'y' if r['copies'] == 1 else 'ies'}, {fmt_time(r['time_s'])}", va="center", fontsize=8)
    ax.set_yticks(y, [f"{r['src']} -> {r['dst']}" for r in rows], fontsize=8)
    ax.set_xlim(0, max(r["bytes"] for r in rows) / scale * 1.6)
    ax.set_xlabel(f"bytes copied per run ({unit})")
    ax.set_title("Copies per run on each link (source -> destination)", fontsize=10)
    present = list(dict.fromkeys(r["direction"] for r in rows))
    ax.legend(handles=[Patch(color=COLORS[d], label=DIRECTION_LABELS[d]) for d in present],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


# --- predicted vs measured -----------------------------------------------------------


def fig_pred_vs_measured(pairs: list[dict], emulated: bool) -> Figure:
    """Log-log scatter of per-op predicted vs measured time with the y = x line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 6))
    ax = fig.add_subplot()
    pts = [p for p in pairs if all(isinstance(p[k], (int, float)) and 0 < p[k] < math.inf
                                   for k in ("predicted_s", "measured_s"))]
    vals = [v for p in pts for v in (p["predicted_s"], p["measured_s"])]
    unit, scale = time_unit(max(vals, default=1.0))
    for dev in ("cpu", "gpu"):
        sel = [p for p in pts if p["device"] == dev]
        if sel:
            label = ("GPU-placed ops, run on the CPU (emulated), vs predicted CPU time"
                     if dev == "gpu" and emulated else f"{dev.upper()} ops")
            ax.scatter([p["predicted_s"] / scale for p in sel], [p["measured_s"] / scale for p in sel],
                       s=14, alpha=0.75, color=COLORS[dev], label=label,
                       rasterized=len(pts) > MAX_VECTOR_POINTS)   # an inline PNG inside the SVG
    lo, hi = (min(vals) / scale / 2, max(vals) / scale * 2) if vals else (1e-3, 1.0)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x (perfect prediction)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"predicted time per op ({unit}, log scale)")
    ax.set_ylabel(f"measured time per op ({unit}, log scale)")
    ax.set_title("Predicted vs measured per op" + (" — emulated GPU: CPU timings" if emulated else ""),
                 fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8)   # off the points
    return fig
