"""`placer shard`: data parallelism and embedding-table sharding for a train net."""
from __future__ import annotations

import json
import math
import sys

from placer import arguments
from placer.commands.common import parse_input_specs
from placer.commands.shard_manifest import SHARDING_MANIFEST
from placer.costs.precision import PRECISION_HELP, PRECISIONS
from placer.errors import InputError
from placer.examples import dlrm
from placer.fileio import OutputDir, atomic_write_text, refuse_outputs
from placer.formats import load_net
from placer.formats.caffe2 import params_from_init
from placer.hardware.cluster import add_cluster_argument, load_cluster
from placer.hardware.machine import add_machine_arguments, machine_from_args
from placer.hardware.profiles import add_profile_arguments
from placer.planning.view import finite_json
from placer.sharding.cost import ShardSettings
from placer.sharding.net import DlrmTrainNet, ScaledTrainNet, init_blobs
from placer.sharding.plan import BASELINES, plan_sharding
from placer.sharding.step import imbalance
from placer.sharding.tables import layout_of_option
from placer.sharding.train_net import sharded
from placer.sharding.types import KERNELS, SHARDING_TYPES
from placer.training.files import check_output_dir, save_train_nets
from placer.training.recipe import OPTIMIZERS
from placer.types import DTYPE_TO_DATA_TYPE
from placer.units import fmt_bytes, fmt_time

DESCRIPTION = """\
Plans a training step of a train net (placer train-net's, or Caffe2's) or of a DLRM
configuration over the GPUs of a machine: how many GPUs take part (data parallelism over
k of them, the dense part replicated at the per-replica batch, its gradients all-reduced
while the backward pass goes on), and for every embedding table its layout:
  table_wise      whole on one GPU            row_wise     rows split over the GPUs
  column_wise     columns split over GPUs     data_parallel  on every GPU
with its kernel: in GPU memory (hbm), in host memory read over PCIe (uvm) or with a GPU
cache of hot rows (uvm_caching, --uvm-cache-hit-rate), or on the host CPU with its
sparse update (host). Memory per GPU counts the dense parameters, gradients, optimizer
state and activations of a replica plus the shards; what does not fit is reported with
the bytes that do not.

The step is priced by placer's cost model (the ops of each shard re-typed for it) and
collectives from the machine's links, then minimised: local search from several starts,
then a MILP of the same step (HiGHS, --time-limit) that proves the optimum or reports the
gap. Beside the plan: pure data parallelism, every table in host memory, and TorchRec's
greedy planner re-implemented, all scored by the same model; where the plan differs from
TorchRec's, the output says what TorchRec's choice would cost.

Prints per table its layout, devices, bytes per device, lookup and all-to-all seconds;
per GPU memory, compute, comms and imbalance; the step's critical path; --json for the
same as JSON.

examples:
  placer shard --dlrm criteo-1tb --global-batch 16384 --machine 8x-a100-40gb-nvswitch
  placer shard --dlrm criteo-1tb --global-batch 65536 --gpu-profile v100-16gb-sxm2 --gpus 8 --gpu-link nvlink2
  placer shard --dlrm criteo-1tb --global-batch 2048 --gpu-profile a100-40gb-sxm4 --uvm-cache-hit-rate 0.9
  placer shard --dlrm criteo-1tb --global-batch 32768 --cluster 2x-dgx-a100-200g
  placer shard train/train_net.pbtxt --init-net train/train_init_net.pbtxt --machine 4x-v100-sxm2-nvlink
"""

DLRM_CONFIGS = ("criteo-1tb", "small", "40gb")


def add_arguments(p) -> None:
    p.add_argument("net", metavar="NET", nargs="?", help="the train net (Caffe2 NetDef); or give --dlrm")
    p.add_argument("--init-net", metavar="INIT", dest="init_net", help="its init net (parameters, optimizer state)")
    p.add_argument("--input", metavar="NAME=d0,d1,...[:dtype]", dest="inputs", action="append", default=[],
                   help="shape of a fed blob the file does not give, at the global batch; repeatable")
    p.add_argument("--dlrm", choices=DLRM_CONFIGS, help="plan a DLRM configuration instead of a file "
                   "(criteo-1tb: MLPerf's 26 tables of dimension 128, 89.5 GiB)")
    p.add_argument("--optimizer", default="rowwise-adagrad", metavar="NAME",
                   help="optimizer of --dlrm's train net (placer train-net's names; default rowwise-adagrad)")
    add_profile_arguments(p)
    add_machine_arguments(p)
    add_cluster_argument(p)
    g = p.add_argument_group("sharding")
    batch = g.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=arguments.count(1), metavar="G",
                       help="samples per step over all GPUs (default: the net's batch)")
    batch.add_argument("--batch-per-gpu", type=arguments.count(1), metavar="B",
                       help="samples per GPU per step (weak scaling: k GPUs train k*B per step)")
    g.add_argument("--degrees", metavar="K,K,...", help="data-parallel degrees to weigh (default 1, 2, 4, ... and all)")
    g.add_argument("--gpu-mem", type=arguments.size, metavar="SIZE", help="memory of each GPU (default: its profile's)")
    g.add_argument("--gpu-reserve", type=arguments.reserve, metavar="PCT", default="10%", help="GPU memory kept free (default 10%%)")
    g.add_argument("--host-mem", type=arguments.size, metavar="SIZE", help="host memory for tables (default: not limited)")
    g.add_argument("--uvm-cache-hit-rate", type=arguments.share, metavar="H",
                   help="share of uvm_caching lookups served from the GPU cache (default 0.2, TorchRec's "
                        "assumption: the cache ratio)")
    g.add_argument("--uvm-cache-ratio", type=arguments.share, metavar="R", help="share of a uvm_caching table's rows the GPU "
                   "cache holds (default 0.2, TorchRec's UVM_CACHING_RATIO)")
    g.add_argument("--kernels", metavar="K,K", help="kernels allowed: hbm, uvm, uvm_caching, host (default: all)")
    g.add_argument("--sharding-types", metavar="T,T", help="sharding types allowed: data_parallel, table_wise, "
                   "row_wise, column_wise (default: all)")
    g.add_argument("--precision", choices=PRECISIONS, default=None, help=PRECISION_HELP)
    g.add_argument("--time-limit", type=arguments.seconds, metavar="S",
                   help="seconds for the MILP (default: 8, or what is left of 25 s of planning)")
    g.add_argument("--search-time", type=arguments.seconds, default=1.5, metavar="S",
                   help="seconds of local search per degree (default 1.5)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    o.add_argument("--plan-out", metavar="PLAN.json", help="also write the JSON to a file")
    o.add_argument("-o", "--output", metavar="OUTDIR", help="write the sharded train net, its init net, the fed "
                   "blobs' shapes and sharding.json (each table's layout as written, notes) into OUTDIR; uvm and "
                   "uvm_caching tables are written as host tables (Caffe2 has no unified memory); run it with "
                   "placer run OUTDIR/train_net.pbtxt --init-net OUTDIR/train_init_net.pbtxt --emulate-gpus K)")


def run(args) -> int:
    settings = _settings(args)
    refuse_outputs({"--plan-out": args.plan_out}, args.net, args.init_net)
    if args.output:
        OutputDir(check_output_dir(args.output), "-o", OUTPUT_KIND, SHARDING_MANIFEST, (args.net, args.init_net))
    source = _source(args)
    machine = _machine(args)
    refuse_outputs({"--plan-out": args.plan_out})  # again: against every file read
    folder = OutputDir(args.output, "-o", OUTPUT_KIND, SHARDING_MANIFEST) if args.output else None
    global_batch, per_gpu = args.global_batch, args.batch_per_gpu
    if global_batch is None and per_gpu is None:
        global_batch = source.batch
    degrees = _degrees(args.degrees)
    limit = {"time_limit_s": 8.0, "budget_s": 25.0} if args.time_limit is None else {"time_limit_s": args.time_limit}
    result = plan_sharding(source, machine, global_batch=global_batch, per_gpu_batch=per_gpu, settings=settings,
                           degrees=degrees, search_s=args.search_time, precision=args.precision, **limit)
    doc = result_json(result)
    written, notes = write_sharded_net(result, source, folder) if folder else ([], [])
    text = json.dumps(finite_json(doc), indent=1, allow_nan=False)  # strict JSON: an infinite cost is null
    if args.plan_out:
        atomic_write_text(args.plan_out, text + "\n")
        written.append(args.plan_out)
    if args.json:
        print(text)
    else:
        print_result(doc)
        for path in written:
            print(f"wrote {path}")
    for note in notes:
        print(f"placer: note: {note}", file=sys.stderr if args.json else sys.stdout)
    return 0


def source_fed(typed) -> set:
    return set(typed.net.data_inputs) - init_blobs(typed.net)


OUTPUT_KIND = "shard"   # sharding.json's placer_output field


def write_sharded_net(result, source, folder: OutputDir) -> tuple[list, list]:
    """The plan's sharded train net (``placer.sharding.train_net``), init net, the shapes of
    the blobs each GPU (and the host) is fed, and ``sharding.json`` (every table's layout
    as written, its blobs and devices, the notes) into ``folder``. Returns the paths
    written and the notes (uvm tables written as host tables, ...)."""
    plan = result.plan
    typed = source.typed_at_batch(plan.global_batch)
    shapes = params_from_init(typed.net.init_proto)
    layouts, planned = {}, {}
    for o in plan.options:
        layout = layout_of_option(o, list(plan.ranks), shapes[o.table].shape)
        planned[o.table] = o.describe(result.machine.names)
        if layout is not None:
            layouts[o.table] = layout
    n = len(plan.ranks)
    nets = sharded(typed.net.proto, typed.net.init_proto, layouts, n, plan.global_batch)
    with folder:
        written = [folder.shown(p) for p in save_train_nets(folder.tmp, nets.train, nets.init)]
        info = folder.path("train_net.value_info.json")
        atomic_write_text(info, json.dumps(_fed_shapes(nets, typed, n), indent=1) + "\n")
        written.append(folder.shown(info))
        folder.write_manifest(_manifest(nets, planned, [result.machine.names[r] for r in plan.ranks]))
    return [str(p) for p in written] + [str(folder.given / SHARDING_MANIFEST)], nets.notes


def _fed_shapes(nets, typed, n: int) -> dict:
    """Fed blob -> [data type, dims]: a sharded table's lookup inputs at the global batch,
    the rest at each GPU's share of it."""
    shapes = {}
    whole = {b for names in nets.table_inputs.values() for b in names}
    fed = source_fed(typed)
    for blob in nets.train.external_input:
        scope, _, one = blob.partition("/")
        t = typed.blobs.get(one) if scope.startswith(("gpu_", "cpu_")) else None
        if t is None or one not in fed:
            continue
        dims = list(t.shape) if blob in whole or not t.ndim else [t.shape[0] // n] + list(t.shape[1:])
        shapes[blob] = [DTYPE_TO_DATA_TYPE[t.dtype], dims]
    return shapes


def _manifest(nets, planned: dict, gpus: list) -> dict:
    """``sharding.json``: what ``-o`` wrote for each table (``placer run`` prints its notes)."""
    def where(device: int) -> str:
        return "cpu" if device < 0 else f"gpu_{device}"
    tables = {}
    for table, text in planned.items():
        layout = nets.layouts.get(table)
        entry = {"planned": text, "written": layout.kind if layout else "data_parallel"}
        if layout is not None:
            entry["shards"] = [{"blob": blob, "device": where(s.device), "rows": list(s.rows), "cols": list(s.cols)}
                               for blob, s in nets.shards[table]]
            if layout.note:
                entry["note"] = layout.note
        tables[table] = entry
    return {"schema": "placer.sharding", "version": 1, "gpus": {f"gpu_{i}": g for i, g in enumerate(gpus)},
            "tables": tables, "fed": nets.table_inputs, "notes": nets.notes}


def _machine(args):
    """``--cluster`` (several hosts), else the machine the other options describe."""
    if getattr(args, "cluster", None):
        if args.machine or args.gpu_profile or args.gpus is not None:
            raise InputError("--cluster already names the hosts and GPUs; drop --machine / --gpu-profile / --gpus")
        return load_cluster(args.cluster)
    return machine_from_args(args)


def _settings(args):
    kw = {"reserve": args.gpu_reserve, "gpu_mem_bytes": args.gpu_mem}
    if args.host_mem is not None:
        kw["host_mem_bytes"] = args.host_mem
    for name in ("uvm_cache_hit_rate", "uvm_cache_ratio"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    for option, name, known in (("--kernels", "kernels", KERNELS), ("--sharding-types", "sharding_types", SHARDING_TYPES)):
        text = getattr(args, name)
        if text:
            values = tuple(v.strip() for v in text.split(",") if v.strip())
            unknown = [v for v in values if v not in known]
            if unknown or not values:
                raise InputError(f"{option} {text}: unknown {unknown or 'empty list'}", hint=f"use {', '.join(known)}")
            kw[name] = values
    return ShardSettings(**kw)


def _degrees(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"--degrees {text}: expected numbers of GPUs like 1,2,4,8") from None
    if not ks:
        raise InputError(f"--degrees {text}: give at least one number of GPUs")
    if ks[0] < 1:
        raise InputError(f"--degrees {text}: {ks[0]} is not a number of GPUs; each degree must be 1 or more")
    return ks


def _source(args):
    if args.dlrm and args.net:
        raise InputError("give a train net or --dlrm, not both")
    if args.dlrm:
        if args.optimizer not in OPTIMIZERS:
            raise InputError(f"--optimizer {args.optimizer}: unknown", hint=f"use one of {', '.join(OPTIMIZERS)}")
        config = {"criteo-1tb": dlrm.criteo_1tb, "small": dlrm.small, "40gb": dlrm.tables_40gb}[args.dlrm]()
        return DlrmTrainNet(config, args.optimizer)
    if not args.net:
        raise InputError("give a train net (NET) or --dlrm CONFIG", hint="e.g. placer shard --dlrm criteo-1tb")
    net = load_net(args.net, init_path=args.init_net, input_shapes=parse_input_specs(args.inputs))
    if net.init_proto is None:
        raise InputError(f"{args.net}: a train net needs its init net (parameters and optimizer state)",
                         hint="give --init-net")
    return ScaledTrainNet(net, parse_input_specs(args.inputs))


# ------------------------------------------------------------------ JSON

def result_json(result) -> dict:
    plan, names = result.plan, result.machine.names
    tables = {t.name: t for t in result.search.est.tables} if result.search else {}
    return {
        "version": 1, "net": result.name, "machine": {"name": result.machine.name,
                                                      "description": result.machine.describe()},
        "precision": result.precision,
        "global_batch": plan.global_batch, "gpus": [names[r] for r in plan.ranks],
        "per_replica_batch": plan.per_replica_batch, "step_s": plan.total_s,
        "samples_per_s": plan.global_batch / plan.total_s, "method": plan.method,
        "optimal": plan.optimal, "bound_s": plan.bound_s, "gap": plan.gap,
        "settings": {k: v for k, v in vars(result.settings).items()},
        "degrees": [_plan_summary(p, names, result.degrees[0]) for p in result.degrees],
        "tables": [_table_row(o, tables.get(o.table), names) for o in plan.options],
        "ranks": [{"device": s.device, "memory_bytes": s.memory_bytes, "capacity_bytes": _finite(s.capacity_bytes),
                   "compute_s": s.compute_s, "comms_s": s.comms_s, "lookup_s": s.lookup_s} for s in plan.stats],
        "imbalance": imbalance(plan.stats),
        "phases": plan.step.phases,
        "critical_path": [{"phase": s.phase, "device": s.device, "start_s": s.start_s, "seconds": s.seconds}
                          for s in plan.step.critical_path],
        "baselines": {name: _plan_summary(b, names, None) for name, b in result.baselines.items()},
        "differences_from_torchrec": result.differences,
        "notes": plan.notes, "planning_s": result.seconds,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _plan_summary(p, names, one) -> dict:
    out = {"gpus": len(p.ranks), "devices": [names[r] for r in p.ranks], "global_batch": p.global_batch,
           "method": p.method, "feasible": math.isfinite(p.total_s),
           "step_s": p.total_s if math.isfinite(p.total_s) else None, "notes": p.notes}
    if math.isfinite(p.total_s):
        out["samples_per_s"] = p.global_batch / p.total_s
        if one is not None and math.isfinite(one.total_s) and len(one.ranks):
            single = one.global_batch / one.total_s / len(one.ranks)
            out["scaling_efficiency"] = out["samples_per_s"] / (single * len(p.ranks))
    return out


def _table_row(o, table, names) -> dict:
    per_device: dict[str, float] = {}
    for s in o.shards:
        key = names[s.rank]
        per_device[key] = per_device.get(key, 0.0) + s.storage.hbm_bytes + s.storage.ddr_bytes
    if o.host >= 0 and o.kernel != "host":
        per_device = {**{k: v for k, v in ((names[s.rank], s.storage.hbm_bytes) for s in o.shards)},
                      names[o.host]: sum(s.storage.ddr_bytes for s in o.shards)}
    perf = o.perf
    return {"table": o.table, "rows": table.rows if table else None, "dim": table.dim if table else None,
            "bytes": table.nbytes if table else None, "sharding": o.sharding_type, "kernel": o.kernel,
            "layout": o.describe(names), "devices": list(dict.fromkeys(names[s.rank] for s in o.shards)),
            "bytes_per_device": per_device, "lookup_s": perf.compute_s, "comms_s": perf.comms_s,
            "lookup_forward_s": perf.fwd_compute_s, "lookup_backward_s": perf.bwd_compute_s,
            "alltoall_s": perf.comms_s}


# ------------------------------------------------------------------ tables on stdout

def print_result(doc: dict, out=None) -> None:
    import pandas as pd
    out = out or sys.stdout
    print(f"net {doc['net']}: {len(doc['tables'])} embedding tables; machine: {doc['machine']['description']}; "
          f"precision: {doc['precision']}", file=out)
    print(f"global batch {doc['global_batch']} over {len(doc['gpus'])} GPU(s) ({doc['per_replica_batch']} per GPU); "
          f"step {fmt_time(doc['step_s'])}, {doc['samples_per_s']:,.0f} samples/s; {_optimality(doc)}", file=out)
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.max_colwidth", 60):
        print("\ndata-parallel degree (each with its best tables' layout):", file=out)
        print(pd.DataFrame([{"GPUs": d["gpus"], "batch": d["global_batch"], "step": fmt_time(d["step_s"]),
                             "samples/s": f"{d['samples_per_s']:,.0f}" if d["feasible"] else "-",
                             "efficiency": f"{d['scaling_efficiency']:.0%}" if "scaling_efficiency" in d else "-",
                             "note": "; ".join(d["notes"]) if not d["feasible"] else ""}
                            for d in doc["degrees"]]).to_string(index=False), file=out)
        print("\ntables:", file=out)
        print(pd.DataFrame([{"table": t["table"], "rows": t["rows"], "dim": t["dim"], "sharding": t["sharding"],
                             "kernel": t["kernel"], "devices": _devices_text(t["devices"]),
                             "bytes/device": _bytes_text(t["bytes_per_device"]),
                             "lookup fwd+bwd": fmt_time(t["lookup_s"]), "all-to-all": fmt_time(t["alltoall_s"])}
                            for t in doc["tables"]]).to_string(index=False), file=out)
        print("\nper device:", file=out)
        gpu_totals = [r["compute_s"] + r["comms_s"] for r in doc["ranks"] if r["capacity_bytes"] is not None]
        mean = sum(gpu_totals) / len(gpu_totals) if gpu_totals else 0.0
        print(pd.DataFrame([{"device": r["device"], "memory": fmt_bytes(r["memory_bytes"]),
                             "usable": fmt_bytes(r["capacity_bytes"]) if r["capacity_bytes"] is not None else "-",
                             "compute": fmt_time(r["compute_s"]), "of which lookups": fmt_time(r["lookup_s"]),
                             "comms": fmt_time(r["comms_s"]),
                             "imbalance": f"{(r['compute_s'] + r['comms_s']) / mean - 1:+.1%}"
                             if mean and r["capacity_bytes"] is not None else "-"}
                            for r in doc["ranks"]]).to_string(index=False), file=out)
    print(f"imbalance (busiest GPU over the mean): {doc['imbalance']:.1%}", file=out)
    print("\ncritical path:", file=out)
    for s in doc["critical_path"]:
        print(f"  {fmt_time(s['start_s']):>9} + {fmt_time(s['seconds']):>9}  {s['phase']} ({s['device']})", file=out)
    print(f"  = {fmt_time(doc['step_s'])}", file=out)
    print("\nbaselines (placer's cost model):", file=out)
    per_sample = doc["step_s"] / doc["global_batch"]
    for name, b in doc["baselines"].items():
        label = f"  {BASELINES.get(name, name)} over {b['gpus']} GPU(s)"
        if b["feasible"]:
            ratio = b["step_s"] / b["global_batch"] / per_sample
            print(f"{label:<82} {fmt_time(b['step_s']):>9}  ({ratio:.2f}x the plan)", file=out)
        else:
            print(f"{label:<82}  INFEASIBLE: {'; '.join(b['notes'])}", file=out)
    if doc["differences_from_torchrec"]:
        print("\nwhere the plan differs from TorchRec's greedy:", file=out)
        for line in doc["differences_from_torchrec"]:
            print(f"  {line}", file=out)
    for note in doc["notes"]:
        print(f"note: {note}", file=out)
    print(f"planned in {doc['planning_s']:.1f} s", file=out)


def _optimality(doc: dict) -> str:
    if doc["optimal"]:
        return "optimal for placer's step model (MILP)"
    if doc["gap"] is not None:
        return f"within {doc['gap']:.1%} of the optimum (MILP bound {fmt_time(doc['bound_s'])})"
    return "no bound (MILP skipped)"


def _devices_text(devices: list[str]) -> str:
    return devices[0] if len(devices) == 1 else f"{devices[0]} .. {devices[-1]} ({len(devices)})"


def _bytes_text(per_device: dict) -> str:
    values = list(per_device.values())
    if not values:
        return "-"
    if len(set(round(v) for v in values)) == 1:
        return fmt_bytes(values[0]) + (f" x{len(values)}" if len(values) > 1 else "")
    return ", ".join(f"{d}: {fmt_bytes(v)}" for d, v in per_device.items())

