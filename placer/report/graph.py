"""The placement drawn on the net's graph: ops in longest-path layers, coloured by device.

``placement_svg(plan)`` draws it with graphviz ``dot`` when it is installed and the net is
shallow and narrow enough not to need folding, else with matplotlib here
(``layered_layout`` wraps wide layers into rows and folds long nets into side-by-side
columns, ``fig_placement`` draws boxes and edges). An edge between ops on different
devices is a copied tensor, drawn in red with a diamond; a host-fed input copied to a
GPU and an output copied back to the host are marked with triangles.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from placer.documents.plan import OpInfo, PlanDocument
from placer.report.doc import copy_ends, device_kinds, or_default, plan_devices
from placer.report.plots import COLORS, device_colors, to_svg

if TYPE_CHECKING:  # matplotlib, an optional heavy dependency, is imported where the graph is drawn
    from matplotlib.figure import Figure

CELL_W, CELL_H = 1.1, 0.42        # inches per node cell: room for a 15-character label
BOX_W, BOX_H = 0.96, 0.24         # the node box inside its cell
MAX_ROW_NODES = 14                # a wider layer wraps onto more rows
ROWS_PER_COLUMN = 45              # a deeper net folds into side-by-side columns
MAX_LABELLED_OPS = 800            # past this, boxes without labels (the table names them)
MAX_DRAWN_OPS = 3000              # past this, no graph: megabytes of boxes nobody can read
DOT_MAX_OPS = 400


def graph_edges(plan: PlanDocument) -> tuple[list[tuple[int, int, bool]], set[int], set[int]]:
    """Producer -> consumer edges between op positions (copy=True where the devices differ),
    ops off the host that get a host-fed input by a copy, and ops whose output is copied
    back to the host."""
    ops = plan.ops
    pos = {or_default(o.index, k): k for k, o in enumerate(ops)}
    dev = [or_default(o.device, "cpu") for o in ops]
    host = plan_devices(plan)[0]
    copied = {(c.tensor, copy_ends(c)[1]) for c in plan.copies or []}
    edges, host_in, host_out = set(), set(), set()
    for t in plan.tensors or []:
        p = pos.get(t.producer) if t.producer is not None else None
        cons = [pos[c] for c in t.consumers or [] if c in pos]
        if p is None:
            if t.producer == -1:
                host_in.update(c for c in cons if dev[c] != host and (t.name, dev[c]) in copied)
            continue
        edges.update((p, c, dev[p] != dev[c]) for c in cons if c > p)
        if t.external_output and dev[p] != host and (t.name, host) in copied:
            host_out.add(p)
    return sorted(edges), host_in, host_out


def placement_title(plan: PlanDocument, edges) -> str:
    """``Placement of 31 ops: 3 on cuda:0, 24 on cuda:1, ...; 12 edges crossing devices``."""
    counts = {d: 0 for d in plan_devices(plan)}
    for o in plan.ops:
        if o.device is not None:
            counts[o.device] += 1
    total = sum(counts.values())
    where = ", ".join(f"{n} on {d}" for d, n in counts.items() if n)
    return (f"Placement of {total} op{'' if total == 1 else 's'}: {where}; "
            f"{sum(e[2] for e in edges)} edges crossing devices")


def _colors(plan: PlanDocument) -> dict[str, str]:
    return device_colors(plan_devices(plan), device_kinds(plan))


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


def fig_placement(plan: PlanDocument) -> Figure:
    """The net's ops in layers, coloured by device, copies between devices marked in red."""
    from matplotlib.collections import PatchCollection, PathCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.path import Path

    ops = plan.ops
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
    colors = _colors(plan)
    ax.add_collection(PatchCollection(boxes, zorder=3, edgecolor="white", linewidth=0.5,
                                      facecolor=[colors.get(o.device, COLORS["cpu"]) for o in ops]))
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
    title = placement_title(plan, edges)
    if not labelled:
        title += " (labels omitted at this size: see the per-op table)"
    fig.text(0.5, 1 - 0.28 / (h + band), title, ha="center", va="center", fontsize=10)
    used = [d for d in plan_devices(plan) if any(o.device == d for o in ops)]
    handles = [Patch(color=colors[d], label=f"op on {d}") for d in used] + [
        Line2D([], [], color="#9a9a9a", label="tensor, same device"),
        Line2D([], [], color=COLORS["h2d"], marker="D", markersize=4, label="tensor copied between devices"),
        Line2D([], [], color=COLORS["h2d"], marker="v", linestyle="none", label="input from / output to the host")]
    fig.legend(handles=handles, loc="center", bbox_to_anchor=(0.5, 1 - 0.72 / (h + band)),
               ncol=3 if max(w, 7.0) < 9 else 5, fontsize=7, frameon=False)
    return fig


def _node_label(op: OpInfo, width: int = 15) -> str:
    text = f"{or_default(op.index, '?')} {or_default(op.type, '?')}"
    return text if len(text) <= width else text[:width - 1] + "…"


def placement_svg(plan: PlanDocument) -> tuple[str, str] | None:
    """(SVG, how it was drawn): graphviz ``dot`` for small shallow nets when installed,
    else the folded matplotlib layout above; None for a net too big to draw legibly."""
    ops = plan.ops
    if len(ops) > MAX_DRAWN_OPS:
        return None
    edges, _, _ = graph_edges(plan)
    lay = layered_layout(len(ops), edges)
    folded = int(lay["col"].max(initial=0)) > 0
    widest = max(np.unique(lay["row"], return_counts=True)[1], default=0)
    # dot neither folds long nets nor wraps wide layers: use it only where neither is needed
    if 0 < len(ops) <= DOT_MAX_OPS and not folded and widest < MAX_ROW_NODES:
        svg = _dot_svg(plan, edges)
        if svg:
            return svg, "graphviz dot"
    return to_svg(fig_placement(plan)), "matplotlib, longest-path layers" + (
        ", folded into columns" if int(lay["col"].max(initial=0)) > 0 else "")


def _dot_svg(plan: PlanDocument, edges) -> str | None:
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if not dot:
        return None
    try:
        out = subprocess.run([dot, "-Tsvg"], input=dot_source(plan, edges), capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out if "<svg" in out else None


def dot_source(plan: PlanDocument, edges) -> str:
    """The graphviz input: a box per op filled with its device's colour, red edges for
    copies, and a legend row naming each device's colour."""
    ops, colors = plan.ops, _colors(plan)
    title = placement_title(plan, edges) + " (red edges: tensors copied between devices)"
    lines = ["digraph placement {", f'graph [label="{_quoted(title)}" labelloc=t fontname=Helvetica fontsize=11 '
             'nodesep=0.15 ranksep=0.3];', "node [shape=box style=filled fontcolor=white "
             "fontname=Helvetica fontsize=9 height=0.25];", "edge [color=\"#9a9a9a\" arrowsize=0.5];"]
    for k, o in enumerate(ops):
        lines.append(f'n{k} [label="{_quoted(_node_label(o, 24))}" '
                     f'fillcolor="{colors.get(o.device, COLORS["cpu"])}"];')
    for p, c, is_copy in edges:
        lines.append(f'n{p} -> n{c}' + (f' [color="{COLORS["h2d"]}" penwidth=2 label="copy" '
                                         f'fontcolor="{COLORS["h2d"]}" fontsize=8]' if is_copy else "") + ";")
    used = [d for d in plan_devices(plan) if any(o.device == d for o in ops)]
    lines.append('subgraph cluster_legend { label="devices" fontname=Helvetica fontsize=9 color="#dddddd";')
    lines += [f'legend{k} [label="{_quoted(d)}" fillcolor="{colors[d]}"];' for k, d in enumerate(used)]
    lines.append("}")
    lines.append("}")
    return "\n".join(lines)


def _quoted(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')
