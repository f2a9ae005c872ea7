"""The report's charts, drawn with matplotlib into standalone SVG.

Each ``fig_*`` function builds a ``matplotlib.figure.Figure`` (no pyplot, so no global
state and no display needed); ``to_svg`` serialises it with text kept as text (smaller,
searchable, rendered by the browser's own fonts). Figures are sized from their content
(one row per bar, one cell per graph node) so labels never have to shrink to collide;
``text_overlaps`` finds colliding labels and is what the tests hold every chart to.
The placement graph (``layered_layout``, ``fig_placement``) is drawn by graphviz ``dot``
when it is installed and the net is shallow enough not to need folding, else here.
"""
from __future__ import annotations

import base64
import io
import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.text import Text

from placer.report.tables import baseline_rows, op_label
from placer.units import byte_unit, fmt_bytes, fmt_time, time_unit

COLORS = {"cpu": "#1f77b4", "gpu": "#2ca02c", "h2d": "#d62728", "d2h": "#9467bd",
          "plan": "#ff7f0e", "base": "#7f7f7f"}
LANES = ("cpu", "gpu", "h2d", "d2h")
LANE_LABELS = {"cpu": "CPU", "gpu": "GPU stream", "h2d": "H2D copies", "d2h": "D2H copies"}
MAX_VECTOR_POINTS = 3000  # past this, dense marks are embedded as a bitmap to keep the page small
SHORT_BASELINES = {"plan": "this plan", "all_cpu": "all-CPU", "all_gpu": "all-GPU+fallback", "greedy": "greedy",
                   "existing": "your placement", "lower_bound": "lower bound"}


def to_svg(fig: Figure) -> str:
    """The figure as one SVG document (no external references, no timestamp)."""
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


def fig_baselines(plan: dict) -> Figure:
    """Horizontal bars: the plan and each baseline's predicted time; a baseline that does
    not fit the GPU memory is hatched and says so, one with no time is named."""
    rows = baseline_rows(plan)
    finite = [r["total_s"] for r in rows if r["total_s"] is not None and math.isfinite(r["total_s"])]
    unit, scale = time_unit(max(finite, default=1.0))
    fig = Figure(figsize=(7.5, 0.45 * len(rows) + 1.3))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows):
        total = r["total_s"]
        if total is None or not math.isfinite(total):
            ax.text(0, yi, "  infeasible / not computed", va="center", fontsize=8, color="#555")
            continue
        color = COLORS["plan" if r["key"] == "plan" else "base"]
        ax.barh(yi, total / scale, height=0.6, color=color if r["feasible"] else "white",
                edgecolor=color, hatch=None if r["feasible"] else "///")
        ax.text(total / scale, yi, f" {total / scale:.3g}" + ("" if r["feasible"] else " (does not fit)"),
                va="center", fontsize=8)
    ax.set_yticks(y, [SHORT_BASELINES.get(r["key"], r["key"]) for r in rows])
    ax.set_xlabel(f"predicted time per run ({unit})")
    ax.set_title("Plan vs baselines (serial objective)")
    ax.set_xlim(0, max(finite, default=1.0) / scale * 1.35)
    handles = [Patch(color=COLORS["plan"], label="this plan"), Patch(color=COLORS["base"], label="baseline")]
    if not all(r["feasible"] for r in rows):
        handles.append(Patch(facecolor="white", edgecolor=COLORS["base"], hatch="///",
                             label="does not fit GPU memory"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


# --- per-op cost bars ----------------------------------------------------------------


def fig_cost_bars(ops: list[dict], total: int) -> Figure:
    """CPU and GPU time per op (already sorted by time saved); the chosen device marked."""
    n = max(len(ops), 1)
    fig = Figure(figsize=(8.5, 0.34 * n + 1.6))
    ax = fig.add_subplot()
    times = [t for o in ops for t in (o["cpu_s"], o["gpu_s"]) if t and t > 0]
    unit, scale = time_unit(max(times, default=1.0))
    y = np.arange(len(ops))[::-1]
    cpu = np.array([o["cpu_s"] for o in ops], float) / scale
    gpu = np.array([o["gpu_s"] for o in ops], float) / scale
    ax.barh(y + 0.2, cpu, height=0.38, color=COLORS["cpu"], label="CPU time")
    ax.barh(y - 0.2, gpu, height=0.38, color=COLORS["gpu"], label="GPU time")
    chosen_x = np.where([o.get("device") == "gpu" for o in ops], gpu, cpu)
    chosen_y = np.where([o.get("device") == "gpu" for o in ops], y - 0.2, y + 0.2)
    ax.plot(chosen_x, chosen_y, linestyle="none", marker="D", markersize=5, color="black",
            label="chosen device")
    if times and max(times) / min(times) > 100:
        ax.set_xscale("log")
    ax.set_yticks(y, [op_label(o) for o in ops], fontsize=7)
    ax.set_xlabel(f"predicted time ({unit}{', log scale' if ax.get_xscale() == 'log' else ''})")
    shown = f"top {len(ops)} of {total} ops" if total > len(ops) else f"all {total} ops"
    ax.set_title(f"Per-op cost, CPU vs GPU, sorted by time saved ({shown})")
    ax.set_ylim(-0.8, len(ops) - 0.2)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6 / (0.34 * n + 1.6) - 0.04),
              ncol=3, fontsize=8)
    return fig


# --- timeline ------------------------------------------------------------------------


def fig_gantt(schedules: dict) -> Figure:
    """One Gantt chart per schedule (serial, makespan): CPU, GPU stream, H2D, D2H lanes."""
    names = [k for k in ("serial", "makespan") if k in schedules] + \
            [k for k in schedules if k not in ("serial", "makespan")]
    ends = [e["end_s"] for k in names for e in schedules[k].get("events", [])]
    unit, scale = time_unit(max(ends, default=1.0))
    fig = Figure(figsize=(10, 2.3 * len(names) + 0.9))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        sched = schedules[name]
        span_s = max((e["end_s"] for e in sched.get("events", [])), default=0.0)
        for k, lane in enumerate(LANES):
            ev = [e for e in sched.get("events", []) if e.get("lane") == lane]
            spans = [(a / scale, (b - a) / scale) for a, b in _merged_spans(ev, span_s / GANTT_RESOLUTION)]
            ax.broken_barh(spans, (len(LANES) - 1 - k - 0.35, 0.7), facecolors=COLORS[lane],
                           edgecolor="white", linewidth=0.3, label=LANE_LABELS[lane])
        ax.set_yticks(range(len(LANES)), [LANE_LABELS[lane] for lane in LANES[::-1]], fontsize=8)
        ax.set_ylim(-0.6, len(LANES) - 0.4)
        ms = sched.get("makespan_s")
        ax.set_title(f"{name} schedule: makespan {fmt_time(ms)}" if ms is not None
                     else f"{name} schedule", fontsize=10)
    axes[-1].set_xlabel(f"predicted time from the start of a run ({unit})")
    axes[0].legend(handles=[Patch(color=COLORS[lane], label=LANE_LABELS[lane]) for lane in LANES],
                   loc="lower center", bbox_to_anchor=(0.5, 1.18), ncol=4, fontsize=8)
    return fig


GANTT_RESOLUTION = 4000   # items closer than 1/4000 of the timeline are drawn as one bar


def _merged_spans(events: list[dict], gap_s: float) -> list[tuple[float, float]]:
    """(start, end) of the lane's items, neighbours closer than ``gap_s`` merged: far below
    what the chart can show apart, and it keeps a net of 100k ops a drawable size."""
    out: list[list[float]] = []
    for e in sorted(events, key=lambda e: e["start_s"]):
        if out and e["start_s"] - out[-1][1] <= gap_s:
            out[-1][1] = max(out[-1][1], e["end_s"])
        else:
            out.append([e["start_s"], e["end_s"]])
    return [(a, b) for a, b in out]


# --- memory --------------------------------------------------------------------------


def fig_memory(timeline: dict, capacity: float | None, usable: float | None = None) -> Figure:
    """Live bytes on each device after each op, with the GPU's capacity and the part of it
    plans may use (capacity less the reserve). A limit far above the curves would flatten
    them to the axis, so it is then named in the legend instead of drawn."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    data_peak = max([max(v, default=0) for v in timeline.values()] + [1.0])
    limits = [(capacity, "GPU capacity", "--", COLORS["h2d"]),
              (usable if usable != capacity else None, "GPU usable, less reserve", ":", COLORS["d2h"])]
    drawn = [lim for lim in limits if lim[0] and lim[0] <= MEMORY_LIMIT_SPAN * data_peak]
    unit, scale = byte_unit(max([data_peak] + [lim[0] for lim in drawn]))
    fig = Figure(figsize=(10, 3.6))
    ax = fig.add_subplot()
    for dev in ("cpu", "gpu"):
        vals = np.asarray(timeline.get(dev) or [], float)
        if len(vals):
            ax.step(np.arange(len(vals)), vals / scale, where="post", color=COLORS[dev],
                    label=f"{dev.upper()} live bytes (peak {fmt_bytes(vals.max())})")
    for value, label, style, color in limits:
        if not value:
            continue
        text = f"{label} ({fmt_bytes(value)})"
        if (value, label, style, color) in drawn:
            ax.axhline(value / scale, color=color, linestyle=style, label=text)
        else:
            ax.add_line(Line2D([], [], color=color, linestyle=style, label=text + ", far above the curves"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("op index (net order)")
    ax.set_ylabel(f"live memory ({unit})")
    ax.set_title("Memory on each device over the op sequence")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


MEMORY_LIMIT_SPAN = 8.0   # draw a memory limit when it is at most this many times the peak


# --- predicted vs measured -----------------------------------------------------------


def fig_pred_vs_measured(pairs: list[dict], emulated: bool) -> Figure:
    """Log-log scatter of per-op predicted vs measured time with the y = x line."""
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


# --- placement on the graph ----------------------------------------------------------

CELL_W, CELL_H = 1.1, 0.42        # inches per node cell: room for a 15-character label
BOX_W, BOX_H = 0.96, 0.24         # the node box inside its cell
MAX_ROW_NODES = 14                # a wider layer wraps onto more rows
ROWS_PER_COLUMN = 45              # a deeper net folds into side-by-side columns
MAX_LABELLED_OPS = 800            # past this, boxes without labels (the table names them)
MAX_DRAWN_OPS = 3000              # past this, no graph: megabytes of boxes nobody can read
DOT_MAX_OPS = 400


def graph_edges(plan: dict) -> tuple[list[tuple[int, int, bool]], set[int], set[int]]:
    """Producer -> consumer edges between op positions (copy=True where the devices differ),
    ops that get a host-fed input over H2D, and ops whose output goes back to the host."""
    ops = plan.get("ops") or []
    pos = {o.get("index", k): k for k, o in enumerate(ops)}
    dev = [o.get("device", "cpu") for o in ops]
    copied = {(c.get("tensor"), c.get("direction")) for c in plan.get("copies") or []}
    edges, host_in, host_out = set(), set(), set()
    for t in plan.get("tensors") or []:
        p = pos.get(t.get("producer"))
        cons = [pos[c] for c in t.get("consumers") or [] if c in pos]
        if p is None:
            if t.get("producer") == -1 and (t.get("name"), "h2d") in copied:
                host_in.update(c for c in cons if dev[c] == "gpu")
            continue
        edges.update((p, c, dev[p] != dev[c]) for c in cons if c > p)
        if t.get("external_output") and dev[p] == "gpu" and (t.get("name"), "d2h") in copied:
            host_out.add(p)
    return sorted(edges), host_in, host_out


def layered_layout(n: int, edges: list[tuple[int, int, bool]]) -> dict:
    """Longest-path layers, wide layers wrapped into rows, rows folded into columns.

    Returns ``xy`` (n x 2, inches, y downward negative), ``row`` and ``col`` per op, and
    the drawing's ``width`` and ``height`` in inches.
    """
    layer = np.zeros(n, int)
    for p, c, _ in sorted(edges, key=lambda e: e[1]):
        layer[c] = max(layer[c], layer[p] + 1)
    rows: list[list[int]] = []
    for lay in range(int(layer.max()) + 1 if n else 0):
        members = np.flatnonzero(layer == lay).tolist()
        rows += [members[i:i + MAX_ROW_NODES] for i in range(0, len(members), MAX_ROW_NODES)]
    n_cols = max(1, math.ceil(len(rows) / ROWS_PER_COLUMN))
    per_col = max(1, math.ceil(len(rows) / n_cols))
    widths = [max((len(r) for r in rows[c * per_col:(c + 1) * per_col]), default=1) * CELL_W
              for c in range(n_cols)]
    x0 = np.concatenate([[0.0], np.cumsum([w + 0.5 * CELL_W for w in widths])])
    xy, row_of, col_of = np.zeros((n, 2)), np.zeros(n, int), np.zeros(n, int)
    for r, members in enumerate(rows):
        c = r // per_col
        left = x0[c] + (widths[c] - len(members) * CELL_W) / 2
        for k, i in enumerate(members):
            xy[i] = (left + (k + 0.5) * CELL_W, -((r % per_col) + 0.5) * CELL_H)
            row_of[i], col_of[i] = r, c
    return {"xy": xy, "row": row_of, "col": col_of, "width": float(x0[-1] - 0.5 * CELL_W) if n else CELL_W,
            "height": min(len(rows), per_col) * CELL_H if rows else CELL_H}


def fig_placement(plan: dict) -> Figure:
    """The net's ops in layers, coloured by device, PCIe copies marked in red."""
    from matplotlib.collections import PatchCollection, PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.path import Path

    ops = plan.get("ops") or []
    n = len(ops)
    edges, host_in, host_out = graph_edges(plan)
    lay = layered_layout(n, edges)
    xy, w, h = lay["xy"], lay["width"], lay["height"]
    band = 1.1
    fig = Figure(figsize=(max(w, 7.0) + 0.2, h + band))
    ax = fig.add_axes((0, 0, 1, h / (h + band)))
    ax.set_xlim(-0.1, max(w, 7.0) + 0.1)
    ax.set_ylim(-h - 0.05, 0.05)
    ax.axis("off")
    plain, copies, marks = [], [], []
    for p, c, is_copy in edges:
        (x1, y1), (x2, y2) = xy[p] - (0, BOX_H / 2), xy[c] + (0, BOX_H / 2)
        span = lay["row"][c] - lay["row"][p]
        if lay["col"][p] != lay["col"][c]:   # folded: stubs out of and into the columns
            stub = 0.4 * (CELL_H - BOX_H)
            path = Path([(x1, y1), (x1, y1 - stub), (x2, y2 + stub), (x2, y2)],
                        [Path.MOVETO, Path.LINETO, Path.MOVETO, Path.LINETO])
            mid = (x2, y2 + stub / 2)
        elif span > 1:   # bow out so that it does not hide behind a chain
            bow = 0.35 * CELL_W * min(span, 4) ** 0.5
            ctrl = ((x1 + x2) / 2 + bow, (y1 + y2) / 2)
            path = Path([(x1, y1), ctrl, (x2, y2)], [Path.MOVETO, Path.CURVE3, Path.CURVE3])
            mid = (0.25 * x1 + 0.5 * ctrl[0] + 0.25 * x2, 0.25 * y1 + 0.5 * ctrl[1] + 0.25 * y2)
        else:
            path = Path([(x1, y1), (x2, y2)])
            mid = ((x1 + x2) / 2, (y1 + y2) / 2)
        (copies if is_copy else plain).append(path)
        if is_copy:
            marks.append(mid)
    ax.add_collection(PathCollection(plain, facecolor="none", edgecolor="#9a9a9a", linewidth=0.6,
                                     alpha=0.7, zorder=1))
    ax.add_collection(PathCollection(copies, facecolor="none", edgecolor=COLORS["h2d"],
                                     linewidth=1.4, zorder=2))
    boxes = [Rectangle((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H) for x, y in xy]
    ax.add_collection(PatchCollection(boxes, zorder=3, edgecolor="white", linewidth=0.5,
                                      facecolor=[COLORS["gpu" if o.get("device") == "gpu" else "cpu"]
                                                 for o in ops]))
    if marks:
        ax.plot(*np.array(marks).T, linestyle="none", marker="D", markersize=4,
                color=COLORS["h2d"], zorder=4)
    for group, dy, marker in ((host_in, BOX_H / 2, "v"), (host_out, -BOX_H / 2, "v")):
        if group:
            pts = np.array([xy[i] + (0, dy) for i in sorted(group)])
            ax.plot(*pts.T, linestyle="none", marker=marker, markersize=5, color=COLORS["h2d"], zorder=4)
    labelled = n <= MAX_LABELLED_OPS
    if labelled:
        for o, (x, y) in zip(ops, xy):
            ax.text(x, y, _node_label(o), ha="center", va="center", fontsize=6, color="white", zorder=5)
    gpu = sum(o.get("device") == "gpu" for o in ops)
    title = (f"Placement: {n - gpu} ops on the CPU, {gpu} on the GPU, "
             f"{sum(e[2] for e in edges)} edges crossing devices")
    if not labelled:
        title += " (labels omitted at this size: see the per-op table)"
    fig.text(0.5, 1 - 0.28 / (h + band), title, ha="center", va="center", fontsize=10)
    handles = [Patch(color=COLORS["cpu"], label="CPU op"), Patch(color=COLORS["gpu"], label="GPU op"),
               Line2D([], [], color="#9a9a9a", label="tensor, same device"),
               Line2D([], [], color=COLORS["h2d"], marker="D", markersize=4, label="tensor copied over PCIe"),
               Line2D([], [], color=COLORS["h2d"], marker="v", linestyle="none",
                      label="input from / output to the host")]
    fig.legend(handles=handles, loc="center", bbox_to_anchor=(0.5, 1 - 0.72 / (h + band)),
               ncol=3 if max(w, 7.0) < 9 else 5, fontsize=7, frameon=False)
    return fig


def _node_label(op: dict, width: int = 15) -> str:
    text = f"{op.get('index', '?')} {op.get('type', '?')}"
    return text if len(text) <= width else text[:width - 1] + "…"


def placement_svg(plan: dict) -> tuple[str, str] | None:
    """(SVG, how it was drawn): graphviz ``dot`` for small shallow nets when installed,
    else the folded matplotlib layout above; None for a net too big to draw legibly."""
    ops = plan.get("ops") or []
    if len(ops) > MAX_DRAWN_OPS:
        return None
    edges, _, _ = graph_edges(plan)
    lay = layered_layout(len(ops), edges)
    folded = int(lay["col"].max(initial=0)) > 0
    widest = max(np.unique(lay["row"], return_counts=True)[1], default=0)
    # dot neither folds long nets nor wraps wide layers: use it only where neither is needed
    if 0 < len(ops) <= DOT_MAX_OPS and not folded and widest < MAX_ROW_NODES:
        svg = _dot_svg(ops, edges)
        if svg:
            return svg, "graphviz dot"
    return to_svg(fig_placement(plan)), "matplotlib, longest-path layers" + (
        ", folded into columns" if int(lay["col"].max(initial=0)) > 0 else "")


def _dot_svg(ops: list[dict], edges) -> str | None:
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if not dot:
        return None
    gpu = sum(o.get("device") == "gpu" for o in ops)
    title = (f"Placement: {len(ops) - gpu} ops on the CPU (blue), {gpu} on the GPU (green); "
             f"{sum(e[2] for e in edges)} red edges: tensors copied over PCIe")
    lines = ["digraph placement {", f'graph [label="{title}" labelloc=t fontname=Helvetica fontsize=11 '
             'nodesep=0.15 ranksep=0.3];', "node [shape=box style=filled fontcolor=white "
             "fontname=Helvetica fontsize=9 height=0.25];", "edge [color=\"#9a9a9a\" arrowsize=0.5];"]
    for k, o in enumerate(ops):
        color = COLORS["gpu" if o.get("device") == "gpu" else "cpu"]
        label = _node_label(o, 24).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'n{k} [label="{label}" fillcolor="{color}"];')
    for p, c, is_copy in edges:
        lines.append(f'n{p} -> n{c}' + (f' [color="{COLORS["h2d"]}" penwidth=2 label="copy" '
                                         f'fontcolor="{COLORS["h2d"]}" fontsize=8]' if is_copy else "") + ";")
    lines.append("}")
    try:
        out = subprocess.run([dot, "-Tsvg"], input="\n".join(lines), capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out if "<svg" in out else None
