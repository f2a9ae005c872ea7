"""The data-parallel and sharding planner: how many GPUs, which tables where, what a step costs.

``plan_sharding(source, machine, ...)`` weighs, for a train net (``sharding.net``):

- one GPU, and data parallelism over k of the machine's GPUs (k = 1, 2, 4, ... and all of
  them, those the batch divides), the dense part replicated at the per-replica batch,
  each dense gradient all-reduced over the k (``placer.hardware.collectives``) while the backward
  pass goes on, the optimizer on every replica;
- per embedding table every layout of ``sharding.cost`` (data-parallel, table-wise,
  row-wise over all ranks or one host's, column-wise; in GPU memory, in host memory read
  over PCIe with or without a GPU cache of hot rows, or on the host CPU with its update);
- memory per GPU (dense parameters, gradients, optimizer state and activations of a
  replica + the shards) within its usable capacity, host memory within ``--host-mem``.

For each k the step model (``sharding.step``) is minimised by local search from the best
of several starts (the baselines among them) and then by the exact MILP within its time
limit, cut off at the heuristic's step (``sharding.search``); k is chosen by seconds per
sample (the step over the global batch: the shortest step when the global batch is
fixed, the highest throughput when each GPU's batch is). The baselines beside the plan,
scored by the same model: pure data parallelism over all GPUs (if it fits), every table
in host memory, and TorchRec's greedy planner re-implemented (``torchrec_greedy``) over
all GPUs. Since each baseline is a start of the search over all GPUs, the plan is never
worse than any of them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from placer.errors import InfeasiblePlanError
from placer.hardware.machine import Machine
from placer.sharding.cost import ShardEstimator, ShardSettings
from placer.sharding.net import train_view
from placer.sharding.search import (Choice, Search, balanced_start, milp_assignment, multi_start,
                                              table_wise_on_one, torchrec_greedy, uniform)
from placer.sharding.source import ShardingSource
from placer.sharding.types import DATA_PARALLEL, HBM, HOST, ROW_WISE, TABLE_WISE, ShardingPlan
from placer.units import fmt_bytes, fmt_time

BASELINES = {"data_parallel": "pure data parallelism (every table on every GPU)",
             "host": "every table in host memory, lookups on the host CPU",
             "torchrec": "TorchRec's greedy planner (re-implemented), placer's estimates"}


@dataclass
class Degree:
    """Everything planned for one data-parallel degree k."""

    k: int
    search: Search
    plan: ShardingPlan
    baselines: dict[str, ShardingPlan] = field(default_factory=dict)
    assignment: list[Choice] | None = None


@dataclass
class ShardingResult:
    plan: ShardingPlan
    degrees: list[ShardingPlan]
    baselines: dict[str, ShardingPlan]
    differences: list[str]
    machine: Machine
    name: str
    settings: ShardSettings
    seconds: float
    search: Search | None = None            # of the chosen degree
    notes: list[str] = field(default_factory=list)
    precision: str = "fp32"                 # the GPU math it was priced in (what ran)


def default_degrees(gpus: int, global_batch: int | None) -> list[int]:
    ks = sorted({2 ** i for i in range(int(math.log2(max(gpus, 1))) + 1)} | {gpus})
    return [k for k in ks if k >= 1 and (global_batch is None or global_batch % k == 0)]


def plan_sharding(source: ShardingSource, machine: Machine, global_batch: int | None = None, per_gpu_batch: int | None = None,
                  settings: ShardSettings = ShardSettings(), degrees: list[int] | None = None,
                  time_limit_s: float = 8.0, search_s: float = 1.5, budget_s: float | None = None,
                  precision: str | None = None) -> ShardingResult:
    """The plan (module docstring). Exactly one of ``global_batch`` (strong scaling) and
    ``per_gpu_batch`` (weak scaling) is given; ``source`` is a train net at any batch
    (``typed_at_batch(b)``: ``placer.sharding.source``).
    ``budget_s``: the MILP gets at most what is left of it after the degrees' searches.
    ``precision``: the GPU math the step is priced in (``placer.costs.precision``; None: the net's)."""
    start = time.monotonic()
    gpus = machine.gpus
    if not gpus:
        raise InfeasiblePlanError(f"machine {machine.name} has no GPU to shard over",
                                  hint="give --machine or --gpu-profile with --gpus")
    ks = degrees or default_degrees(len(gpus), global_batch)
    bad = [k for k in ks if not 1 <= k <= len(gpus) or (global_batch is not None and global_batch % k)]
    if bad:
        raise InfeasiblePlanError(f"data-parallel degree(s) {bad}: the machine has {len(gpus)} GPUs"
                                  + (f" and the global batch {global_batch} must split evenly" if global_batch else ""))
    done = [_degree(source, machine, k, global_batch or per_gpu_batch * k, settings, search_s, k == max(ks),
                    precision) for k in ks]
    feasible = [d for d in done if math.isfinite(d.plan.total_s)]
    if not feasible:
        raise InfeasiblePlanError("no layout fits on any data-parallel degree: " +
                                  "; ".join(f"k={d.k}: {d.plan.notes[-1]}" for d in done),
                                  hint="add GPUs, allow host kernels (--kernels), or raise --host-mem")
    best = min(feasible, key=lambda d: (d.plan.total_s / d.plan.global_batch, d.k))
    if budget_s is not None:
        time_limit_s = min(time_limit_s, max(1.0, budget_s - (time.monotonic() - start)))
    _refine(best, time_limit_s)
    widest = done[-1]
    baselines = dict(widest.baselines)
    tr = baselines.get("torchrec")
    differences = explain_differences(best, widest, tr) if tr is not None and math.isfinite(tr.total_s) else []
    return ShardingResult(best.plan, [d.plan for d in done], baselines, differences, machine, source.name, settings,
                          time.monotonic() - start, best.search, precision=best.search.est.view.precision)


def _degree(source: ShardingSource, machine: Machine, k: int, global_batch: int, settings: ShardSettings, search_s: float,
            widest: bool, precision: str | None = None) -> Degree:
    """Baselines, starts and local search over the first k GPUs."""
    ranks = tuple(machine.gpus[:k])
    view = train_view(source.typed_at_batch(global_batch // k), machine, precision=precision)
    est = ShardEstimator(view, machine, ranks, global_batch, settings)
    search = Search(est)
    starts: dict[str, list[Choice] | None] = {
        "data_parallel": uniform(search, DATA_PARALLEL, HBM) if k > 1 else table_wise_on_one(search),
        "host": uniform(search, TABLE_WISE, HOST) if HOST in settings.kernels else None,
        "torchrec": torchrec_greedy(search),
        "balanced": balanced_start(search),
        "row_wise": uniform(search, ROW_WISE, HBM),
    }
    for sharding in settings.sharding_types:
        starts[f"balanced {sharding}"] = balanced_start(search, sharding)
    scored = {name: (a, search.score(a)) for name, a in starts.items() if a is not None}
    first = min(scored.values(), key=lambda x: x[1])
    degree = Degree(k, search, ShardingPlan(ranks, global_batch, []))
    if math.isfinite(first[1]):
        assignment, step = multi_start(search, [a for a, _ in scored.values()], search_s)
        degree.assignment = assignment
        degree.plan = make_plan(search, assignment, "local search from the best of several starts")
    else:
        device, need, usable = search.overflow(first[0])
        degree.plan.notes.append(f"needs {fmt_bytes(need)} on {device}, {fmt_bytes(usable)} usable "
                                 f"({fmt_bytes(need - usable)} do not fit)")
    if widest:
        for name in BASELINES:
            degree.baselines[name] = _baseline(search, name, starts.get(name), ranks, global_batch)
    return degree


def _baseline(search: Search, name: str, assignment, ranks, global_batch) -> ShardingPlan:
    if assignment is None:
        plan = ShardingPlan(ranks, global_batch, [], method=BASELINES[name])
        plan.notes.append("no proposal of TorchRec's greedy fits the GPUs" if name == "torchrec"
                          else "not available with these kernels")
        return plan
    if math.isfinite(search.score(assignment)):
        return make_plan(search, assignment, BASELINES[name])
    device, need, usable = search.overflow(assignment)
    plan = ShardingPlan(ranks, global_batch, [], method=BASELINES[name])
    plan.notes.append(f"needs {fmt_bytes(need)} on {device}, {fmt_bytes(usable)} usable "
                      f"({fmt_bytes(need - usable)} do not fit)")
    return plan


def _refine(degree: Degree, time_limit_s: float) -> None:
    """The MILP on the chosen degree, cut off at the local search's step."""
    if degree.assignment is None or time_limit_s <= 0:
        return
    search = degree.search
    res = milp_assignment(search, degree.plan.total_s, time_limit_s)
    method = degree.plan.method
    if res.assignment is not None and res.step_s is not None and res.step_s < degree.plan.total_s - 1e-12:
        degree.assignment = res.assignment
        method = "MILP (HiGHS) below the local search's step"
    plan = make_plan(search, degree.assignment, method)
    plan.optimal = res.optimal or (res.status == "infeasible")   # infeasible under the cutoff: the cutoff is optimal
    plan.bound_s = plan.total_s if plan.optimal else res.bound_s
    plan.notes.append(f"MILP: {res.status} in {res.seconds:.1f} s"
                      + (f"; bound {fmt_time(plan.bound_s)}" if plan.bound_s is not None else ""))
    degree.plan = plan


def make_plan(search: Search, assignment: list[Choice], method: str) -> ShardingPlan:
    est = search.est
    load = search.total(assignment)
    step = search.model.evaluate(load)
    options = [est.option(search.layouts[t][c.layout], c.positions) for t, c in enumerate(assignment)]
    return ShardingPlan(est.ranks, est.G, options, step, method, search.model.stats(load, step))


def explain_differences(best: Degree, widest: Degree, torchrec: ShardingPlan, limit: int = 5) -> list[str]:
    """Why the plan is not TorchRec's: its degree, and per table that differs (on the same
    degree) what TorchRec's choice for that table alone would add to the step."""
    out = []
    names = best.search.est.machine.names
    if best.k != widest.k:
        out.append(f"the plan uses {best.k} of the {widest.k} GPUs (TorchRec shards over all of them): "
                   f"{fmt_time(best.plan.total_s)} per step of {best.plan.global_batch} vs "
                   f"{fmt_time(torchrec.total_s)} per step of {torchrec.global_batch}")
        return out
    search = best.search
    ours = best.assignment
    theirs = _assignment_of(search, torchrec)
    rows = []
    for t, (a, b) in enumerate(zip(ours, theirs)):
        if b is None or a == b:
            continue
        trial = list(ours)
        trial[t] = b
        base = search.model.evaluate(search.total(ours), path=False)
        step = search.score(trial)
        what = "does not fit" if not math.isfinite(step) else f"+{fmt_time(step - base.total_s)}"
        grown = _grown_phase(search, ours, trial) if math.isfinite(step) else ""
        rows.append((step - base.total_s, f"{search.est.tables[t].name}: "
                     f"{best.plan.options[t].describe(names)} instead of {torchrec.options[t].describe(names)} "
                     f"(TorchRec's choice alone: {what}{grown})"))
    rows.sort(key=lambda r: -r[0])
    out += [r[1] for r in rows[:limit]]
    if len(rows) > limit:
        out.append(f"... and {len(rows) - limit} more tables placed differently")
    if rows:
        out.append("TorchRec rates a plan by its busiest rank's summed shard perf; placer's step adds the dense "
                   "part, overlaps the all-reduces with the backward pass and weighs the host CPU")
    else:
        out.append("none: the plan lays every table out as TorchRec's greedy does")
    return out


def _grown_phase(search: Search, ours, trial) -> str:
    a = search.model.evaluate(search.total(ours), path=False).phases
    b = search.model.evaluate(search.total(trial), path=False).phases
    name, delta = max(((k, b[k] - a[k]) for k in a if k != "dense_start_s"), key=lambda kv: kv[1])
    return f"; {name.removesuffix('_s').replace('_', ' ')} +{fmt_time(delta)}" if delta > 0 else ""


def _assignment_of(search: Search, plan: ShardingPlan) -> list[Choice | None]:
    """A plan's options as choices of ``search`` (None where a layout has no match)."""
    est = search.est
    pos = {r: p for p, r in enumerate(est.ranks)}
    out = []
    for t, opt in enumerate(plan.options):
        match = None
        for i, lay in enumerate(search.layouts[t]):
            if lay.sharding_type != opt.sharding_type or lay.kernel != opt.kernel:
                continue
            if lay.shards and lay.shards == len(opt.shards):
                match = Choice(i, tuple(sorted(pos[s.rank] for s in opt.shards)))
            elif not lay.shards and tuple(est.ranks[p] for p in lay.group) == tuple(opt.group):
                match = Choice(i)
            if match:
                break
        out.append(match)
    return out
