"""``placer report``: the HTML report (and a Chrome trace) of a saved plan, after a run too.

``placer.report.html.write_report(plan, run, path)`` and
``placer.report.trace.write_trace(plan, path, run=None)`` are what ``placer plan
--report/--trace`` and ``placer run --trace`` call with the dicts they already hold.
"""
from __future__ import annotations

import argparse

from placer.costs.precision import PRECISIONS
from placer.errors import InputError
from placer.fileio import refuse_outputs
from placer.report.doc import read_plan
from placer.report.html import write_report
from placer.report.trace import write_trace
from placer.runtime import record as run_record

DESCRIPTION = """\
Turn a plan (`placer plan --json > plan.json`) into one self-contained HTML page: the plan
against every baseline, the placement drawn on the net's graph, per-op costs, the predicted
timeline, memory on each device, a sortable per-op table with the reason for each decision,
and, with --run (`placer run --record run.json`), predicted against measured times.
The header names the precision the plan was priced in (placer plan --precision), as the
plan records it; --precision names it for a plan written before plans recorded it, and is
refused where the plan says otherwise (a report draws the plan's prices; it cannot re-price).
--trace writes the timelines in the Chrome trace event format (open in Perfetto or
chrome://tracing): the predicted schedule, and the measured run when --run is given.

  placer report plan.json -o report.html
  placer report plan.json --run run.json -o report.html --trace trace.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="what `placer plan --json` printed")
    parser.add_argument("--run", metavar="RUN.json", help="a run record from `placer run --record`")
    parser.add_argument("-o", "--output", metavar="OUT.html", required=True, help="the report to write")
    parser.add_argument("--trace", metavar="OUT.json", help="also write a Chrome trace here")
    parser.add_argument("--schedule", choices=("serial", "makespan"), default=None,
                        help="the predicted schedule in the trace (default: the plan's objective)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="the precision the plan was made with (default: the plan's own; needed only for "
                             "a plan written before plans recorded it, refused where the plan names another)")


def run(args: argparse.Namespace) -> int:
    refuse_outputs({"-o": args.output, "--trace": args.trace}, args.plan, args.run)
    plan = with_precision(read_plan(args.plan), args.precision, args.plan)
    run_dict = run_record.read_dict(args.run, InputError) if args.run else None
    write_report(plan, run_dict, args.output)
    print(f"report: {args.output}")
    if args.trace:
        write_trace(plan, args.trace, run=run_dict, schedule=args.schedule)
        print(f"trace: {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def with_precision(plan, precision: str | None, path: str):
    """The plan with the precision it was priced in: its own; ``precision`` where it
    records none (a plan written before the field); an error where the two differ, since
    the report shows the plan's prices and has no net to price again."""
    if precision is None or plan.precision == precision:
        return plan
    if plan.precision is not None:
        raise InputError(f"{path}: the plan was priced in {plan.precision}, not {precision}; a report "
                         f"shows the plan's own prices",
                         hint=f"plan again: placer plan NET --precision {precision} --plan-out PLAN.json")
    return plan.model_copy(update={"precision": precision})
