"""Plans of training steps: the answers reports/TRAINING.md gives, recomputed.

    python bench/training_plans.py [--corpus ../shared/nets] [-o reports/TRAINING.md]

For each train net and each GPU profile (T4, V100, A100; the host is the shipped
``host-ci-2core`` profile, every GPU figure from the GPU kernel model of the shipped
profile, fitted to DeepBench's published kernel times), the plan of one step
against all-CPU and all-GPU, in the serial objective (Caffe2's ``simple`` executor) and
overlapped (the makespan simulator: devices and copy lanes at once, Caffe2's ``async``
executors), with what the plan leaves on the CPU and why:

- LeNet at batch 64 and AlexNet at batch 256: the corpus's Caffe train_val prototxts
  converted with their Caffe solvers (BVLC's ``lenet_solver.prototxt`` and
  ``bvlc_alexnet/solver.prototxt``: SGD with momentum 0.9, weight decay 5e-4);
- the small DLRM (bundled ``dlrm_small_train``: Adagrad, SparseAdagrad on its 26 tables);
- word2vec (bundled ``word2vec_train``, 10M x 300 table, and the same at 2M rows);
- the MLPerf DLRM terabyte configuration (``dlrm_criteo_1tb_train``: RowWiseSparseAdagrad)
  on one A100 40 GB and one V100 16 GB.

Planning only: nothing here runs a net, so the figures do not depend on this host's load.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.examples import DATA  # noqa: E402
from placer.hardware.machine import compose_machine  # noqa: E402
from placer.partition.problem import memory_use  # noqa: E402
from placer.partition.schedule import Simulator  # noqa: E402
from placer.planning.planner import PlanOptions, plan  # noqa: E402
from placer.hardware.profiles import load_device_profile  # noqa: E402
from placer.types import DATA_TYPE_TO_DTYPE, TensorType  # noqa: E402
from placer.units import fmt_bytes, fmt_time  # noqa: E402

GPUS = {"T4": "t4-pcie3", "V100": "v100-16gb-pcie3", "A100": "a100-40gb-pcie4"}
HOST = "host-ci-2core"
LENET_SOLVER = ('base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\n'
                'power: 0.75\nmax_iter: 10000\nsolver_mode: GPU\n')
ALEXNET_SOLVER = ('base_lr: 0.01\nlr_policy: "step"\ngamma: 0.1\nstepsize: 100000\nmax_iter: 450000\n'
                  'momentum: 0.9\nweight_decay: 0.0005\nsolver_mode: GPU\n')


def machine(gpu: str):
    return compose_machine(load_device_profile(HOST, "cpu"), load_device_profile(gpu, "gpu"))


def typed_train_net(train: Path, init: Path, shapes: dict):
    from placer.formats import load_net
    from placer.shapes import infer, require_complete
    return require_complete(infer(load_net(train, init_path=init, input_shapes=shapes), shapes))


def bundled(stem: str):
    spec = json.loads((DATA / f"{stem}.value_info.json").read_text())
    shapes = {k: TensorType(tuple(s), DATA_TYPE_TO_DTYPE[t]) for k, (t, s) in spec.items()}
    return typed_train_net(DATA / f"{stem}.pbtxt", DATA / f"{stem}_init.pbtxt", shapes)


def caffe_train_net(corpus: Path, prototxt: str, solver: str, data_shape: tuple, tmp: Path):
    from placer.cli import main
    (tmp / "solver.prototxt").write_text(solver)
    out = tmp / Path(prototxt).stem
    args = ["convert", str(corpus / "caffe" / prototxt), "--solver", str(tmp / "solver.prototxt"),
            "--input", "data=" + ",".join(map(str, data_shape)), "--input", f"label={data_shape[0]}:int32",
            "-o", str(out)]
    if main(args) != 0:
        raise SystemExit(f"convert failed: {' '.join(args)}")
    shapes = {"data": TensorType(data_shape), "label": TensorType((data_shape[0],), "int32")}
    return typed_train_net(out / "train_net.pbtxt", out / "train_init_net.pbtxt", shapes)


def word2vec_net(rows: int, tmp: Path):
    from placer.examples import train_nets, word2vec
    cfg = word2vec.Word2VecConfig(rows=rows)
    paths = train_nets.save(train_nets.TrainNets(*word2vec.train_nets(cfg)), tmp, f"word2vec_{rows}")
    spec = json.loads(paths["value_info"].read_text())
    shapes = {k: TensorType(tuple(s), DATA_TYPE_TO_DTYPE[t]) for k, (t, s) in spec.items()}
    return typed_train_net(paths["predict"], paths["init"], shapes)


def summarise(typed, gpu_name: str) -> dict:
    """One plan against all-CPU and all-GPU, serial and overlapped; the embedding tables
    (parameters read by SparseLengthsSum) with their devices and the op times around them."""
    t0 = time.perf_counter()
    r = plan(typed, machine(GPUS[gpu_name]))
    planning_s = time.perf_counter() - t0
    arr, p, net = r.arrays, r.plan, typed.net
    sim = Simulator(arr)
    gpu = int(np.flatnonzero(np.array(arr.device_kinds) == "gpu")[0])
    overlapped = plan(typed, machine(GPUS[gpu_name]), PlanOptions(method="makespan"))
    out = {"gpu": gpu_name, "ops": arr.n_ops, "plan_s": p.total_s,
           "plan_overlap_s": min(r.makespan["makespan_s"], overlapped.makespan["makespan_s"]),
           "plan_copy_bytes": p.copy_bytes(), "plan_memory": memory_use(arr, p.placement).tolist(),
           "usable": arr.capacity.tolist(), "method": p.method, "optimal": p.optimal, "planning_s": planning_s,
           "on_cpu": [], "tables": [], "notes": p.notes}
    for name in ("all_cpu", "all_gpu"):
        b = r.baselines[name]
        mem = memory_use(arr, b.placement)
        out[name] = {"s": b.total_s, "overlap_s": sim.score(b.placement), "memory": mem.tolist(),
                     "fits": bool((mem <= arr.capacity * (1 + 1e-12)).all())}
    for i in np.flatnonzero(p.placement != gpu).tolist():
        op = net.ops[i]
        out["on_cpu"].append({"op": i, "type": op.type, "name": op.name or op.outputs[0],
                              "why": p.reasons.get(i, "")})
    for op in net.ops:
        if op.type in ("SparseLengthsSum", "SparseLengthsWeightedSum", "SparseLengthsMean"):
            table = op.inputs[0]
            update = next(u for u in net.ops if table in u.outputs)
            state = [b for b in update.outputs if b != table and b in net.params]
            out["tables"].append({
                "table": table, "rows": typed.blobs[table].shape[0], "bytes": typed.blobs[table].nbytes,
                "state_bytes": sum(typed.blobs[b].nbytes for b in state), "update": update.type,
                "device": p.device_of(update.index), "lookup_device": p.device_of(op.index),
                "lookup_s": arr.op_s[op.index].tolist(), "update_s": arr.op_s[update.index].tolist(),
                "table_copy_s": float(r.machine.copy_time(typed.blobs[table].nbytes, 0, gpu))})
    return out


def one_launch_per_gpu_op():
    """A context in which every GPU op costs one launch overhead (Caffe2's fused CUDA
    kernels) instead of one per kernel placer's own cupy kernel launches."""
    from contextlib import contextmanager

    from placer.costs import gpu_ops
    from placer.costs.model import CostModel

    @contextmanager
    def patched():
        # both places a GPU op's launch count enters: the roofline's fixed cost, and the
        # kernel model's memory-bound ops (CostModel calls gpu_ops.registry_launches)
        original = CostModel.__dict__["_fixed_cost_s"]   # the staticmethod itself
        original_launches = gpu_ops.registry_launches
        CostModel._fixed_cost_s = staticmethod(lambda prof, op_type, inputs, args: prof.launch_overhead_s)
        gpu_ops.registry_launches = lambda op_type, inputs, args: 1
        try:
            yield
        finally:
            CostModel._fixed_cost_s = original
            gpu_ops.registry_launches = original_launches
    return patched()


def fmt_row(model: str, s: dict, one: dict | None) -> str:
    cpu, gpu = s["all_cpu"], s["all_gpu"]
    gpu_s = fmt_time(gpu["s"]) + ("" if gpu["fits"] else f" (needs {fmt_bytes(gpu['memory'][1])})")
    if gpu["fits"]:
        gain = f"{gpu['s'] / s['plan_s']:.3f}x / {gpu['overlap_s'] / s['plan_overlap_s']:.3f}x"
    else:
        gain = "all-GPU does not fit"
    if one is not None and one["all_gpu"]["fits"]:
        gain1 = f"{one['all_gpu']['s'] / one['plan_s']:.3f}x / {one['all_gpu']['overlap_s'] / one['plan_overlap_s']:.3f}x"
    else:
        gain1 = "-"
    return (f"| {model} | {s['gpu']} | {fmt_time(s['plan_s'])} / {fmt_time(s['plan_overlap_s'])} | "
            f"{fmt_time(cpu['s'])} | {gpu_s} / {fmt_time(gpu['overlap_s'])} | {gain} | {gain1} | "
            f"{len(s['on_cpu'])} of {s['ops']} | {fmt_bytes(s['plan_copy_bytes'])} |")


def cpu_ops_text(s: dict, limit: int = 6) -> str:
    types: dict[str, int] = {}
    for o in s["on_cpu"]:
        types[o["type"]] = types.get(o["type"], 0) + 1
    return ", ".join(f"{t} x{n}" for t, n in sorted(types.items(), key=lambda kv: -kv[1])[:limit]) or "none"


MAIN_MODELS = ("LeNet b64", "AlexNet b256", "DLRM small (SparseAdagrad)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared" / "nets"))
    ap.add_argument("-o", "--output", default=str(ROOT / "reports" / "TRAINING.md"))
    ap.add_argument("--json", default=None, help="also write every figure as JSON here")
    args = ap.parse_args(argv)
    corpus = Path(args.corpus)
    results: dict[str, list] = {}
    one_launch: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nets = {
            "LeNet b64": lambda: caffe_train_net(corpus, "mnist_lenet_train_test.prototxt", LENET_SOLVER,
                                                 (64, 1, 28, 28), tmp),
            "AlexNet b256": lambda: caffe_train_net(corpus, "bvlc_alexnet_train_val.prototxt", ALEXNET_SOLVER,
                                                    (256, 3, 227, 227), tmp),
            "DLRM small (SparseAdagrad)": lambda: bundled("dlrm_small_train"),
            "word2vec 10M x 300": lambda: bundled("word2vec_train"),
            "word2vec 2M x 300": lambda: word2vec_net(2_000_000, tmp),
        }
        for model, make in nets.items():
            typed = make()
            results[model] = [summarise(typed, g) for g in GPUS]
            if model in MAIN_MODELS:
                with one_launch_per_gpu_op():
                    one_launch[model] = [summarise(typed, g) for g in GPUS]
            print(f"{model}: planned on {', '.join(GPUS)}", file=sys.stderr)
        tb = bundled("dlrm_criteo_1tb_train")
        results["DLRM Criteo 1TB (RowWiseSparseAdagrad)"] = [summarise(tb, g) for g in ("V100", "A100")]
    text = report(results, one_launch)
    from placer.fileio import atomic_write_text
    old = Path(args.output).read_text() if Path(args.output).exists() else ""
    marker = "<!-- offload table: bench/offload_table.py -->"
    if marker in old:          # bench/offload_table.py's section is kept as it was
        text = text.rstrip("\n") + "\n\n" + marker + old.split(marker, 1)[1]
    atomic_write_text(args.output, text)
    if args.json:
        atomic_write_text(args.json, json.dumps({"plans": results, "one_launch_per_gpu_op": one_launch},
                                                indent=1, default=float))
    print(text)
    return 0


def report(results: dict, one_launch: dict) -> str:
    lines = ["# Training: plans of one step", "",
             "Generated by `python bench/training_plans.py` (planning only, so the figures do not depend "
             f"on this host's load; host profile `{HOST}`, GPU times from the GPU kernel model (source "
             "`kernel-model`: constants fitted to DeepBench's published kernel times, memory-bound ops at "
             "the measured device bandwidth) of the shipped profiles "
             + ", ".join(f"{k} `{v}`" for k, v in GPUS.items()) + "). Serial: Caffe2's `simple` executor, "
             "the sum of op times and copies; the plan is the serial optimum. Overlapped: the makespan "
             "simulator (every device and copy lane at once, Caffe2's async executors); the plan is the "
             "makespan objective's (`--method makespan`: HEFT, list scheduling, the serial plan and "
             "everything on one GPU as starts, then local search). GPU op times count one launch overhead (5 us) per "
             "kernel that placer's own GPU kernel launches (MomentumSGDUpdate: 6); the column 'one launch "
             "per GPU op' re-plans with one launch per op, as Caffe2's fused CUDA kernels launch.", "",
             "## The plan against all-CPU and all-GPU", "",
             "| model | GPU | plan: serial / overlapped | all-CPU | all-GPU: serial / overlapped | "
             "all-GPU / plan | same, one launch per GPU op | ops on the CPU | copied per step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, rows in results.items():
        for i, s in enumerate(rows):
            lines.append(fmt_row(model, s, one_launch.get(model, [None] * len(rows))[i]))
    lines += ["", "## What it says about \"a CPU/GPU mix never pays in training\"", ""] + verdict(results, one_launch)
    lines += ["", "## Embedding tables: where they and their updates live", ""]
    for model, rows in results.items():
        for s in rows:
            if s["tables"]:
                lines += table_lines(model, s)
    lines += ["", "## What the plans leave on the CPU, and the planner's reason", ""]
    for model, rows in results.items():
        for s in rows:
            mem = ", ".join(f"{d} {fmt_bytes(m)}" for d, m in zip(("cpu", "cuda:0"), s["plan_memory"]))
            lines.append(f"- **{model} on {s['gpu']}** (memory: {mem}): {cpu_ops_text(s)}")
            seen = set()
            for o in s["on_cpu"]:
                if o["why"] and o["why"] not in seen and len(seen) < 3:
                    seen.add(o["why"])
                    lines.append(f"  - {o['type']} `{o['name']}`: {o['why']}")
    return "\n".join(lines) + "\n"


def verdict(results: dict, one_launch: dict) -> list[str]:
    """The answer, from the figures above."""
    out = []
    fits = [(m, s) for m in MAIN_MODELS for s in results[m] if s["all_gpu"]["fits"]]
    gains = [s["all_gpu"]["s"] / s["plan_s"] for _, s in fits]
    gains_o = [s["all_gpu"]["overlap_s"] / s["plan_overlap_s"] for _, s in fits]
    ones = [o["all_gpu"]["s"] / o["plan_s"] for m in MAIN_MODELS for o in one_launch[m]]
    ones_o = [o["all_gpu"]["overlap_s"] / o["plan_overlap_s"] for m in MAIN_MODELS for o in one_launch[m]]
    best_o = max((s["all_gpu"]["overlap_s"] / s["plan_overlap_s"], m, s["gpu"]) for m, s in fits)
    out.append(f"- **When the whole model fits on the GPU** (LeNet, AlexNet, the small DLRM on every GPU here), "
               f"the best serial mix beats all-GPU by {min(gains):.3f}x-{max(gains):.3f}x, and only by moving "
               f"tiny ops (bias and small-table updates, the loss, the iteration counter) whose GPU time is "
               f"launch overhead: placer's own GPU kernels launch several kernels each (a MomentumSGDUpdate, "
               f"6 x 5 us). With one launch per op, as Caffe2's fused CUDA kernels launch, the serial plan IS "
               f"all-GPU ({min(ones):.3f}x-{max(ones):.3f}x). So under Caffe2's `simple` executor the saying "
               "holds for dense nets: every weight is state the backward pass and the update both need, the "
               "activations it keeps are the largest blobs of the step, and any op moved to the CPU pays a copy "
               "of them plus a copy of its weights every step (the state changes every step). "
               f"**Overlapped** (async executors) the mix gains {min(gains_o):.3f}x-{max(gains_o):.3f}x, most on "
               f"{best_o[1]} on {best_o[2]} ({best_o[0]:.2f}x), where the CPU runs ops beside the GPU instead of "
               f"after it; with one launch per op that gain shrinks to {min(ones_o):.3f}x-{max(ones_o):.3f}x, so "
               "most of it is the launch overhead of placer's own multi-kernel GPU ops, hidden behind CPU work. "
               + heavy_ops_text(results))
    nofit = [(m, s) for m, rows in results.items() for s in rows if not s["all_gpu"]["fits"]]
    if nofit:
        parts = [f"{m} on {s['gpu']} (all-GPU needs {fmt_bytes(s['all_gpu']['memory'][1])}, "
                 f"{fmt_bytes(s['usable'][1])} usable): plan {fmt_time(s['plan_s'])}, "
                 f"{s['all_cpu']['s'] / s['plan_s']:.0f}x faster than all-CPU" for m, s in nofit]
        out.append("- **When the model does not fit** -- the parameters plus their optimizer state (Adagrad's "
                   "squared sums double a table; RowWise keeps one float per row) plus the activations -- the "
                   "mix is the only way to train on that GPU, and it pays a lot against all-CPU: "
                   + "; ".join(parts) + ". The plan keeps each table with its lookup and its sparse update "
                   "(a lookup away from its table would copy the whole table every step), so only rows cross "
                   "PCIe: the looked-up sums one way, the gradient rows (lookups x width) the other.")
    return out


HEAVY = ("Conv", "ConvGradient", "FC", "FCGradient")


def heavy_ops_text(results: dict) -> str:
    """Whether any plan of the dense models puts a Conv / FC or its gradient on the CPU."""
    moved = sorted({f"{m} on {s['gpu']}" for m in MAIN_MODELS for s in results[m]
                    if any(o["type"] in HEAVY for o in s["on_cpu"])})
    if not moved:
        return "No plan puts a Conv, an FC or their gradients on the CPU."
    return "Plans that put a Conv, an FC or their gradients on the CPU: " + ", ".join(moved) + "."


def table_lines(model: str, s: dict) -> list[str]:
    """Where the tables of one plan live, with the figures that decide it."""
    tables = s["tables"]
    on_gpu = [t for t in tables if t["device"] != "cpu"]
    together = all(t["device"] == t["lookup_device"] for t in tables)
    state = sum(t["state_bytes"] for t in tables)
    need = sum(t["bytes"] + t["state_bytes"] for t in tables)
    out = [f"- **{model} on {s['gpu']}**: {len(on_gpu)} of {len(tables)} tables (and their "
           f"{tables[0]['update']}) on the GPU; tables {fmt_bytes(need - state)} + optimizer state "
           f"{fmt_bytes(state)} = {fmt_bytes(need)}; GPU memory used {fmt_bytes(s['plan_memory'][1])} of "
           f"{fmt_bytes(s['usable'][1])} usable; every lookup "
           + ("sits with its table" if together else "does NOT sit with its table")
           + f"; step {fmt_time(s['plan_s'])} (all-CPU {fmt_time(s['all_cpu']['s'])})."]
    shown = [t for t in tables if t["device"] == "cpu"][:4]
    shown += [t for t in sorted(tables, key=lambda t: -t["bytes"]) if t["device"] != "cpu"][:max(1, 4 - len(shown))]
    for t in shown:
        cpu_s, gpu_s = t["lookup_s"][0] + t["update_s"][0], t["lookup_s"][1] + t["update_s"][1]
        out.append(f"  - `{t['table']}` ({t['rows']:,} rows, {fmt_bytes(t['bytes'])} + state "
                   f"{fmt_bytes(t['state_bytes'])}): on {t['device']}; lookup + update {fmt_time(cpu_s)} on the "
                   f"CPU, {fmt_time(gpu_s)} on the GPU; a lookup away from it would copy the table every step "
                   f"({fmt_time(t['table_copy_s'])} over PCIe)")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
