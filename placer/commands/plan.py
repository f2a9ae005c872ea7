"""`placer plan`: the best CPU/GPU placement of a net, explained, and the placed net."""
from __future__ import annotations

import argparse
import gc
import json
import sys
from contextlib import contextmanager
from pathlib import Path

from placer import arguments
from placer.commands.common import StageClock, add_feed_argument, add_net_arguments, load_typed_net
from placer.costs.graph import write_graph
from placer.costs.precision import PRECISION_HELP, PRECISIONS
from placer.documents.plan import OpInfo, PlanDocument
from placer.errors import PlacerError
from placer.fileio import atomic_write_text, check_output_dir, refuse_outputs
from placer.formats.caffe2 import save_netdef
from placer.hardware.cluster import add_cluster_argument
from placer.hardware.machine import add_machine_arguments, machine_from_args
from placer.hardware.profiles import add_profile_arguments
from placer.partition import METHODS, partition, stability
from placer.planning.cluster_plan import cluster_plan_from_args, host_summary
from placer.planning.planner import PlanOptions, plan
from placer.planning.view import json_text, plan_json
from placer.report.doc import as_plan, link_rows, memory_rows, or_default
from placer.report.html import write_report
from placer.report.trace import write_trace
from placer.rewrite.manifest import MANIFEST, OUTPUT_KIND, write_plan_dir
from placer.rewrite.netdef import place
from placer.types import DTYPE_TO_DATA_TYPE, display_name
from placer.units import fmt_bytes, fmt_time

DESCRIPTION = """\
Prices every op on the CPU and on every GPU of the machine (device profiles: measured op
times where the profile has them, else a fitted or datasheet roofline), then places each
op so that the sum of op times plus copies is smallest: on the CPU and one GPU an exact
s-t minimum cut; on more GPUs alpha-expansion (each move an exact min-cut) checked by a
MILP where it finishes; within each GPU's memory by Lagrangian relaxation + repair, with
the MILP's optimality gap. Prints a per-op table with the reason for each decision and
the totals against all-CPU, one GPU, greedy, a pipeline split, Baechi's m-TOPO/m-ETF,
your own placement (if the file has device options) and a lower bound.

How sure the plan is: the plan is re-solved --stability-draws times (default 8, seeded)
with every measured op time moved within its measured spread (the profile's IQR per
entry, or per fit for fitted estimates; datasheet times do not move), and the ops whose
device flips are listed ("placement stable under measured noise: 3 of 120 ops flip in 2
of 8 draws"). The JSON carries the summary as "stability" ({draws, flipping_ops,
flipped_draws, summary, seconds}) and per op "stability": {"flips": k, "draws": n,
"moves_to": the device it moved to most often, or null}. Ops priced from a fit that does
not cover its group (source "poor-fit") are named in a note.

examples:
  placer plan net.pbtxt --init-net init.pbtxt --input data=1,3,224,224
  placer plan dlrm.pbtxt --gpu-profile a100-40gb-pcie4 -o placed.pbtxt
  placer plan net.pbtxt --machine 4x-v100-sxm2-nvlink --pin 'emb*=cpu' --pin 'fc*=cuda:1'
  placer plan net.pbtxt --gpu-profile t4-pcie3 --gpus 2 --json > plan.json
  placer plan net.pbtxt --cluster local-2hosts -o outdir/   (one net per host; placer run outdir/ --ray)
"""

MAX_ROWS = 200


def add_arguments(p) -> None:
    add_net_arguments(p)
    add_feed_argument(p)
    add_profile_arguments(p)
    add_machine_arguments(p)
    add_cluster_argument(p)
    g = p.add_argument_group("placement")
    g.add_argument("--method", choices=[m for m in METHODS if m not in ("all_cpu", "all_gpu")],
                   default="auto", help="partitioner (default: auto = mincut on the CPU and one GPU, "
                                        "exact; expansion on more GPUs)")
    g.add_argument("--gpu-mem", type=arguments.size, metavar="SIZE", help="memory of each GPU, e.g. 16GiB or 40GB "
                   "(default: each GPU profile's capacity)")
    g.add_argument("--gpu-reserve", type=arguments.reserve, metavar="PCT", default="10%",
                   help="part of GPU memory kept free (default: 10%%)")
    g.add_argument("--pin", metavar="GLOB=DEVICE", action="append", default=[],
                   help="pin ops whose name, type or output blob matches GLOB to DEVICE: cpu, gpu "
                        "(any GPU) or a device such as cuda:1; repeatable, a later --pin wins")
    g.add_argument("--keep-existing", action="store_true",
                   help="pin every op that already has a device_option")
    g.add_argument("--outputs-on-host", action=argparse.BooleanOptionalAction, default=True,
                   help="external outputs come back to the host, paying their D2H copy (default: on)")
    g.add_argument("--time-limit", type=arguments.seconds, default=10.0, metavar="S",
                   help="seconds for the MILP / local search (default: 10)")
    g.add_argument("--unknown-op-cost", type=arguments.seconds, default=0.0, metavar="S",
                   help="CPU seconds charged to an op type placer does not know (default: 0)")
    g.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    g.add_argument("--allow-gpu-only-in-placer", action="store_true", dest="placer_kernels",
                   help="let ops that only placer's runtime has GPU kernels for (in detection nets: "
                        "BBoxTransform, BoxWithNMSLimit) run on a GPU, and ops Caffe2 runs on a GPU "
                        "only (FP16MomentumSGDUpdate) on the CPU; the placed net then runs in "
                        "placer run, not in Caffe2 (default: only where Caffe2 has a kernel)")
    g.add_argument("--stability-draws", type=arguments.count(0), default=8, metavar="N",
                   help="re-solve N times with op costs moved within their measured spread and flag ops "
                        "whose device flips (default: 8; 0: off)")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--output", metavar="PLACED.pbtxt", help="write the placed predict net")
    o.add_argument("--init-out", metavar="PLACED_INIT.pbtxt", help="write the placed init net")
    o.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    o.add_argument("--plan-out", metavar="PLAN.json", help="also write the plan JSON to a file")
    o.add_argument("--graph-out", metavar="GRAPH.graphml", help="write the cost graph (GraphML)")
    o.add_argument("--all", action="store_true", help=f"print every op (default: at most {MAX_ROWS} rows)")
    o.add_argument("--timings", action="store_true", help="print the seconds each stage took on stderr")
    _add_report_arguments(o)


def _add_report_arguments(o) -> None:
    o.add_argument("--report", metavar="OUT.html", help="write the self-contained HTML report")
    o.add_argument("--trace", metavar="OUT.json", help="write the predicted timeline as a Chrome trace")


def run(args) -> int:
    with _no_cycle_collection():
        return _run(args)


@contextmanager
def _no_cycle_collection():
    """Python's cycle collector off while planning: a plan makes millions of small objects
    (ops, rows, records) and almost no reference cycles, and the collector would walk them
    all again each time they grow by a quarter: about a quarter of the CPU time of a
    100k-op plan, for no memory back (reference counting frees what the plan drops)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run(args) -> int:
    _check_outputs(args)
    clock = StageClock()
    typed = load_typed_net(args, complete=True, clock=clock)
    if args.init_out and typed.net.init_proto is None:  # before anything is written
        raise PlacerError("--init-out: the net has no init net to place", hint="give --init-net")
    machine = None if args.cluster else machine_from_args(args)
    _check_outputs(args)  # again: against every file read (the init net, value_info.json found beside NET)
    options = PlanOptions(method=args.method, gpu_mem_bytes=args.gpu_mem,
                          reserve=args.gpu_reserve, pins=tuple(args.pin),
                          keep_existing=args.keep_existing, outputs_on_host=args.outputs_on_host,
                          time_limit_s=args.time_limit, unknown_op_cost_s=args.unknown_op_cost,
                          precision=args.precision, placer_kernels=args.placer_kernels)
    result = (cluster_plan_from_args(args, typed, options) if args.cluster
              else plan(typed, machine, options, clock=clock))
    machine = result.machine
    with clock("json"):
        doc = plan_json(result, _profiles(machine))
    with clock("stability"):
        _add_confidence(doc, result, args.stability_draws)
    if args.cluster:
        doc["hosts"] = host_summary(machine, result.plan.memory_bytes, result.plan.placement)
    # the typed plan, made once, for the printed table, --report and --trace (not --json)
    wants_typed = not args.json or getattr(args, "report", None) or getattr(args, "trace", None)
    typed_doc = as_plan(doc) if wants_typed else None
    written = _write_outputs(args, result, doc, typed_doc, clock)
    with clock("print"):
        if args.json:
            print(json_text(doc))
        else:
            print_plan(typed_doc, all_rows=args.all)
            for h in doc["hosts"] if args.cluster else []:
                print(f"host {h['host']}: {h['ops']} ops, {fmt_bytes(h['memory_bytes'])} of memory "
                      f"(CPU {fmt_bytes(h['cpu_memory_bytes'])}, GPUs {fmt_bytes(h['gpu_memory_bytes'])})")
            for what, path in written:
                print(f"wrote {what}: {path}")
    if args.timings:
        clock.print()
    return 0


def _add_confidence(doc: dict, result, draws: int) -> None:
    """How sure the plan is: the stability check (placer.partition.stability) and a note
    naming estimates from fits that do not cover their group."""
    o = result.options

    def solve(arrays):
        return partition(arrays, o.method, time_limit=o.time_limit_s).placement
    spreads = stability.op_spreads(result.typed, result.costs.model, range(result.machine.k))
    checked = stability.check(result.arrays, solve, result.plan.placement, spreads, draws=draws,
                              devices=result.arrays.devices)
    stability.add_to_plan_json(doc, checked)
    sources = result.costs.op_source
    poor = (sources == "poor-fit").any(axis=1)
    if poor.any():
        types = sorted({doc["ops"][i]["type"] for i in map(int, poor.nonzero()[0])})
        doc["notes"].append(f"{int(poor.sum())} op(s) priced from fits that do not cover their group (poor-fit: "
                            f"{', '.join(types)}); profile this net to measure them")


def _check_outputs(args) -> None:
    """No output replaces an input file (named, or read so far), and no two outputs share
    a path; a cluster plan's -o is a folder that may receive it (``fileio.OutputDir``)."""
    beside = None if args.cluster or not args.output else _value_info_path(args.output, args.net)
    outputs = {"-o": None if args.cluster else args.output, "--init-out": args.init_out,
               "-o's value_info.json": beside,
               "--plan-out": args.plan_out, "--graph-out": args.graph_out,
               "--report": getattr(args, "report", None), "--trace": getattr(args, "trace", None)}
    refuse_outputs(outputs, args.net, args.init_net, args.weights)
    if args.cluster and args.output:
        check_output_dir(args.output, "-o", OUTPUT_KIND, MANIFEST, args.net, args.init_net, args.weights)


def _profiles(machine) -> dict:
    """The host's and the first GPU's profile (version 1 of the plan JSON), and every GPU's."""
    out = {"cpu": {"name": machine.devices[0].profile.name, "source": _source(machine.devices[0].profile)}}
    for dev in machine.devices[1:]:
        out.setdefault("gpu", {"name": dev.profile.name, "source": _source(dev.profile)})
        out[dev.name] = {"name": dev.profile.name, "source": _source(dev.profile)}
    return out


def _source(profile) -> str:
    src = profile.source or {}
    return str(src.get("kind", "")) + (f" ({src['host']})" if src.get("host") else "")


def _write_outputs(args, result, doc, typed, clock) -> list[tuple[str, str]]:
    written = _write_placed(args, result, doc, clock)
    if args.graph_out:
        with clock("graph-out"):
            write_graph(result.graph, args.graph_out)
        written.append(("cost graph", args.graph_out))
    if args.plan_out:
        with clock("plan-out"):
            atomic_write_text(args.plan_out, json_text(doc) + "\n")
        written.append(("plan JSON", args.plan_out))
    if getattr(args, "report", None):
        with clock("report"):
            write_report(typed, None, args.report)
        written.append(("report", args.report))
    if getattr(args, "trace", None):
        with clock("report"):
            write_trace(typed, args.trace)
        written.append(("predicted trace", args.trace))
    return written


def _write_placed(args, result, doc, clock) -> list[tuple[str, str]]:
    """The placed nets (on a cluster, -o is the directory of every worker's nets)."""
    written = []
    if args.cluster and args.output:
        with clock("write"):
            written += write_plan_dir(args.output, result, doc, outputs_on_host=args.outputs_on_host)
    elif args.output or args.init_out:
        net = result.typed.net
        with clock("rewrite"):
            placed = place(net, result.plan.placement, result.machine, outputs_on_host=args.outputs_on_host)
        with clock("write"):
            if args.output:
                save_netdef(placed.predict, args.output)
                written.append(("placed net", args.output))
                info = _write_value_info(result.typed, args.output, args.net)
                if info:
                    written.append(("input shapes", info))
            if args.init_out:
                save_netdef(placed.init, args.init_out)
                written.append(("placed init net", args.init_out))
    return written


def _write_value_info(typed, placed_path: str, net_path: str) -> str | None:
    """Input shapes beside the placed net (``<stem>.value_info.json``, as the model zoo
    ships them), so that ``placer run placed.pbtxt`` needs no --input. A value_info the
    input net was read with (a placed net with the input's stem) is left as it is."""
    shapes = {b: typed.blobs.get(b) for b in typed.net.data_inputs}
    shapes = {b: [DTYPE_TO_DATA_TYPE.get(t.dtype, 1), list(t.shape)] for b, t in shapes.items() if t is not None}
    path = _value_info_path(placed_path, net_path)
    if not shapes or path is None:
        return None
    atomic_write_text(path, json.dumps(shapes, indent=1) + "\n")
    return str(path)


def _value_info_path(placed_path: str, net_path: str) -> str | None:
    """``<stem>.value_info.json`` beside the placed net, or None where that is the file
    the input net's shapes were read from."""
    path = Path(placed_path)
    if not path.name or path.is_dir():  # no file name: writing -o fails first, saying so
        return None
    path = path.with_name(path.stem + ".value_info.json")
    src = Path(net_path)
    if path.exists() and path.resolve() in {p.resolve() for p in (
            src.with_name(src.stem + ".value_info.json"), src.with_name("value_info.json"))}:
        return None
    return str(path)


def print_plan(doc: PlanDocument, all_rows: bool = False, out=None) -> None:
    """The plan as the command prints it: the per-op table, then the totals, baselines,
    memory, copies, notes and stability."""
    import pandas as pd
    out = out or sys.stdout  # looked up now: a redirected stdout is not the one at import time
    ops, devices = doc.ops, doc.devices
    rows = []
    columns = _time_columns(devices, ops)
    for o in ops:
        row = {"#": o.index, "op": display_name(o.name, o.outputs)[:28], "type": o.type, "device": o.device}
        row.update({f"{d} ms": o.time_s[d] * 1e3 for d in columns})
        row.update({"copies in/out": f"{len(o.copies_in)}/{len(o.copies_out)}", "why": o.reason})
        rows.append(row)
    shown = rows
    if not all_rows and len(rows) > MAX_ROWS:
        spread = [max(o.time_s.values()) - min(o.time_s.values()) for o in ops]
        shown = [rows[i] for i in sorted(sorted(range(len(rows)), key=lambda i: -spread[i])[:MAX_ROWS])]
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.max_colwidth", 60,
                           "display.float_format", "{:.4g}".format):
        print(pd.DataFrame(shown).to_string(index=False), file=out)
    if len(shown) < len(rows):
        print(f"({len(rows) - len(shown)} more ops with smaller differences between devices not shown; "
              f"--all or --json)", file=out)
    counts = {d: 0 for d in devices}
    for o in ops:
        counts[o.device] += 1
    where = ", ".join(f"{n} on {d}" for d, n in counts.items() if n)
    print(f"\nnet {doc.net or doc.path}: {len(ops)} ops, {where}; machine: {doc.machine.description}"
          + (f"; precision: {doc.precision}" if doc.precision else "")
          + "".join(f" ({note})" for note in doc.precision_notes or []), file=out)
    total = doc.total_s
    print(f"plan ({doc.solver}): {fmt_time(total)}  (compute {fmt_time(doc.compute_s)}, "
          f"copies {fmt_time(doc.copy_s)}) -- {doc.optimality}", file=out)
    ms = doc.schedules["makespan"].makespan_s
    for name, b in doc.baselines.items():
        line = f"  {b.label:<52} {fmt_time(b.total_s):>10}"
        if name != "lower_bound" and total > 0:
            line += f"  ({b.total_s / total:.2f}x the plan)"
        if "makespan_s" in b.model_fields_set and ms > 0:
            line += f"; overlapped {fmt_time(b.makespan_s)} ({b.makespan_s / ms:.2f}x the plan's)"
        if not or_default(b.feasible, True):
            line += f"  INFEASIBLE: {b.why_infeasible}"
        if b.note:
            line += f"  note: {b.note}"
        print(line, file=out)
    if "existing" in doc.baselines:
        print(f"your placement: {fmt_time(doc.baselines['existing'].total_s)}, ours: {fmt_time(total)}",
              file=out)
    for m in memory_rows(doc):
        if m["usable_bytes"] is None and not m["used_bytes"]:
            continue
        limit = (f" of {fmt_bytes(m['usable_bytes'])} usable (capacity {fmt_bytes(m['capacity_bytes'])} "
                 f"less the reserve)" if m["usable_bytes"] is not None else "")
        print(f"memory {m['device']}: {fmt_bytes(m['used_bytes'])} used{limit}; "
              f"parameters {fmt_bytes(m['param_bytes'])}", file=out)
    links = ", ".join(f"{fmt_bytes(x['bytes'])} {x['link']}" for x in link_rows(doc)) or "none"
    print(f"copies per run: {links}, in {len(doc.copies)} copies", file=out)
    print(f"with devices and copies overlapped (async executor): {fmt_time(ms)}", file=out)
    for note in doc.notes or []:
        print(f"note: {note}", file=out)
    if doc.stability is not None:
        print(doc.stability.summary, file=out)
        flipping = [o for o in ops if o.stability is not None and o.stability.flips]
        for o in sorted(flipping, key=lambda o: -o.stability.flips)[:10]:
            print(f"  flips: #{o.index} {display_name(o.name, o.outputs)} ({o.type}, on {o.device}): "
                  f"to {o.stability.moves_to} in {o.stability.flips} of {o.stability.draws} draws", file=out)
        if len(flipping) > 10:
            print(f"  ... and {len(flipping) - 10} more (see the plan JSON's per-op 'stability')", file=out)


def _time_columns(devices: list[str], ops: list[OpInfo]) -> list[str]:
    """Devices whose time column says something: the host and each distinct GPU profile
    (identical GPUs share one column, headed by the first of them)."""
    seen: dict[tuple, str] = {}
    for d in devices:
        key = tuple(o.time_s[d] for o in ops[:200]) + (d == devices[0],)
        seen.setdefault(key, d)
    return list(seen.values())
