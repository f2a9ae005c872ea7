"""The HTML report: one self-contained page from a plan (a ``documents.plan.PlanDocument``)
and, after a run, a run record dict.

Self-contained means it opens with no network and no other file: charts are SVG inlined
as ``data:`` URIs in ``<img>`` tags (so the browser reports their decoded size), the
stylesheet and the small table-sorting script are inline. A part the plan does not carry
(an older plan without schedules or memory timeline) is shown as "not available" with
the reason, never as a failure of the whole page.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from placer import units
from placer.documents.plan import PlanDocument
from placer.fileio import atomic_write_text
from placer.report import doc, graph, plots, tables

if TYPE_CHECKING:  # jinja2, an optional heavy dependency, is imported when a page is rendered
    import jinja2

TEMPLATES = Path(__file__).with_name("templates")
SECTIONS = ("summary", "placement", "costs", "timeline", "memory", "links", "ops", "measured")


def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2")),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["t"] = units.fmt_time
    env.filters["b"] = units.fmt_bytes
    env.filters["pct"] = lambda v, digits=1: "n/a" if v is None else f"{v:.{digits}f}%"
    env.filters["v"] = _sort_value
    return env


def _sort_value(value) -> str:
    """A number JavaScript's parseFloat reads, for sorting: missing sorts first, inf last."""
    if value is None or value != value:
        return "-1e308"
    return repr(float(max(min(value, 1e308), -1e308)))


def _image(title: str, build) -> dict:
    """An <img>-ready chart, or the reason it could not be drawn from this plan."""
    try:
        result = build()
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return {"title": title, "missing": f"could not be drawn from this plan ({type(e).__name__}: {e})"}
    if result is None:
        return {"title": title, "missing": "not available in this plan"}
    if isinstance(result, str) and not result.lstrip().startswith("<"):
        return {"title": title, "missing": result}
    svg, note = result if isinstance(result, tuple) else (result, "")
    return {"title": title, "uri": plots.data_uri(svg), "note": note}


def _svg(fig_builder):
    return lambda: plots.to_svg(fig_builder())


def render(plan: PlanDocument, run: dict | None = None) -> str:
    """The report page as a string (see the module docstring)."""
    top, n_costed = tables.top_savers(plan)
    devices, kinds = doc.plan_devices(plan), doc.device_kinds(plan)
    colors = plots.device_colors(devices, kinds)
    columns = doc.time_columns(plan)
    timeline = doc.memory_timelines(plan)
    schedules = plan.schedules
    limits = {m["device"]: (m["capacity_bytes"], m["usable_bytes"]) for m in doc.memory_rows(plan)}
    images = {
        "baselines": _image("Plan vs baselines", _svg(lambda: plots.fig_baselines(plan))),
        "placement": _image("Placement on the graph", lambda: _placement(plan)),
        "costs": _image("Per-op cost", (lambda: None) if not top else
                        _svg(lambda: plots.fig_cost_bars(top, n_costed, columns, colors))),
        "timeline": _image("Predicted timeline", (lambda: None) if not schedules else
                           _svg(lambda: plots.fig_gantt(schedules, devices, kinds))),
        "memory": _image("Memory on each device", (lambda: None) if not timeline else
                         _svg(lambda: plots.fig_memory(timeline, limits, colors))),
        "links": _image("Copies per link", lambda: _links(plan)),
    }
    measured = _measured(plan, run) if run is not None else None
    summary = tables.summary(plan)
    html = _environment().get_template("report.html.j2").render(
        plan=plan, s=summary, baselines=tables.baseline_rows(plan), images=images,
        top_shown=len(top), n_costed=n_costed, columns=columns, colors=colors,
        empty_devices=[d for d in devices if not any(v for v in timeline.get(d) or [])],
        rows=tables.op_rows(plan, measured and {p["index"]: p["measured_s"] for p in measured["pairs"]}, columns),
        n_ops=len(plan.ops), max_rows=tables.MAX_TABLE_ROWS,
        measured=measured, run=run, sections=SECTIONS)
    return html


def _placement(plan: PlanDocument):
    if not plan.ops:
        return None
    return graph.placement_svg(plan) or (
        f"not drawn for {len(plan.ops)} ops (more than {graph.MAX_DRAWN_OPS} cannot be read "
        "as a picture); the per-op table below has every op's device")


def _links(plan: PlanDocument):
    fig = plots.fig_links(plan)
    return "no tensor is copied between devices in this plan" if fig is None else plots.to_svg(fig)


def write_report(plan: PlanDocument, run: dict | None, path: str | os.PathLike) -> None:
    """Render the report of ``plan`` (and ``run``, a RunRecord dict, or None) to ``path``,
    atomically (what ``placer plan --report`` and ``placer report`` call)."""
    atomic_write_text(path, render(plan, run))


def _measured(plan: PlanDocument, run: dict) -> dict:
    pairs = tables.match_run(plan, run)
    emulated = bool(run.get("emulated"))
    return {"pairs": pairs, "stats": tables.error_stats(pairs), "totals": tables.run_totals(plan, run),
            "families": tables.family_errors(pairs),
            "emulated": emulated, "n_run_ops": len(run.get("ops") or []),
            "scatter": _image("Predicted vs measured per op", (lambda: None) if not pairs else
                              _svg(lambda: plots.fig_pred_vs_measured(pairs, emulated)))}
