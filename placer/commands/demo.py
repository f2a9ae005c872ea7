"""`placer demo`: the whole job on the bundled nets, with no options and no GPU.

The demo is the worked example a user would type, run by calling the commands
themselves (``placer profile``, ``placer plan``, ``placer run``) with the arguments
listed in ``OUT/commands.sh``, so that what it shows is what those commands do:

1. time every distinct op of the two runnable bundled nets on this CPU, into one
   measured profile (host GEMM/bandwidth/call overhead plus the op entries, so ops not
   timed fall back to the fitted roofline);
2. plan both against the default GPU profile, and the full-size DLRM (planning only) on
   three GPUs of growing memory, where the answer changes;
3. write the placed nets and run them with the GPU emulated, run the originals on the
   CPU, and stop with exit code 1 unless the outputs agree;
4. write the reports and the predicted and measured Chrome traces;
5. several GPUs, with the shipped machine profiles as they are (datasheet figures): plan
   a 41 GB DLRM (``dlrm_40gb``, planning only) on four 16 GB V100s, where no single GPU
   holds it, and a two-tower CNN on two T4s under the makespan objective (one tower per
   GPU) and the serial one (both on one GPU); run the placed two-GPU net on two emulated
   GPUs, at a small image so that it stays quick, against the original on the CPU;
6. print where the files are and a seven-line summary.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer import examples
from placer.commands import plan as plan_module
from placer.commands import profile as profile_module
from placer.commands import run as run_module
from placer.documents.plan import OpInfo, PlanDocument
from placer.errors import InputError
from placer.fileio import OutputDir, atomic_write_bytes, atomic_write_text
from placer.formats import load_net
from placer.hardware.profiles import DEFAULT_GPU_PROFILE, load_profile
from placer.report.doc import or_default, read_plan
from placer.report.html import write_report
from placer.report.trace import write_trace
from placer.runtime.inputs import random_inputs
from placer.shapes import infer
from placer.types import TensorType, display_name
from placer.units import fmt_bytes, fmt_rate

DESCRIPTION = """\
Runs the whole job on nets that ship with placer, with no GPU:
- profiles this CPU on a small DLRM-style recommender and a small ResNet-style CNN;
- plans both against the default GPU profile (""" + DEFAULT_GPU_PROFILE + """);
- runs the placed nets with the GPU emulated and checks that their outputs equal the
  all-CPU run (exit status 1 if they do not);
- plans the full-size MLPerf Criteo 1TB DLRM (about 96 GB of embedding tables, planning
  only) on a V100 16 GB, an A100 40 GB and an H200, where the answer changes;
- several GPUs: plans a 41 GB DLRM on four V100 16 GB (4x-v100-sxm2-nvlink: it must be
  split) and a two-tower CNN on two T4s (2x-t4-pcie3) with the makespan objective (one
  tower per GPU) and the serial one, and runs the placed two-GPU net on two emulated GPUs;
- writes HTML reports, plan JSON, run records and Chrome traces, and prints a summary.

OUT/commands.sh lists the placer commands the demo ran, to repeat any step by hand.

  placer demo                 # writes reports/demo/
  placer demo -o /tmp/demo --quick --quiet
"""

# The subcommands read back what they write (plan.json, the placed nets): each output is
# renamed into place as it is written, inside the demo's own temporary folder.
STAGE_OUTPUTS = False
OUTPUT_KIND = "demo"   # OUT/manifest.json's placer_output field
RUNNABLE = ("dlrm_small", "resnet_small")
FULL_SIZE = "dlrm_criteo_1tb"
FULL_SIZE_GPUS = ("v100-16gb-pcie3", "a100-40gb-pcie4", "h200-141gb-pcie5")
SPLIT_NET, SPLIT_MACHINE = "dlrm_40gb", "4x-v100-sxm2-nvlink"     # does not fit one GPU
TOWERS_NET, TOWERS_MACHINE = "two_tower", "2x-t4-pcie3"          # one tower per GPU under makespan
TOWERS_RUN_SHAPE = (1, 3, 16, 16)   # the run's image: the planned 32x3x56x56 takes minutes on two cores
RTOL, ATOL = 1e-4, 1e-5  # emulation runs the same numpy kernels: any real mismatch is far larger
COMMANDS = {"profile": profile_module, "plan": plan_module, "run": run_module}   # the ones the demo runs


@dataclass(frozen=True)
class Effort:
    """How hard each step measures: op samples, run iterations, solver seconds."""

    repeats: int
    warmup: int
    budget_s: float
    iterations: int
    time_limit_s: float


EFFORT = {"full": Effort(repeats=7, warmup=2, budget_s=0.2, iterations=5, time_limit_s=5.0),
          "quick": Effort(repeats=3, warmup=1, budget_s=0.03, iterations=2, time_limit_s=2.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="DIR", default="reports/demo",
                        help="folder for everything the demo writes (default: reports/demo)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer timing samples and runs (for tests; figures are noisier)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise InputError(f"-o {args.output}: is a file; the demo writes a folder of files",
                         hint="give a folder, e.g. -o reports/demo")
    folder = OutputDir(args.output, "-o", OUTPUT_KIND)
    with folder:
        demo = Demo(folder.tmp, EFFORT["quick" if args.quick else "full"], quiet=args.quiet, final=folder.given)
        status = demo.main()
        for path in folder.tmp.rglob("*"):
            if path.is_file():
                folder.shown(path)
        folder.write_manifest({"quick": args.quick})
    return status


class Demo:
    """The five steps, each writing under ``out``; ``commands`` logs what was run. ``final``:
    where ``out`` is moved once done (``placer.fileio.OutputDir``), the folder messages name."""

    def __init__(self, out: Path, effort: Effort, quiet: bool = False, final: Path | None = None):
        self.out, self.effort, self.quiet = out, effort, quiet
        self.final = final or out
        self.commands: list[str] = []
        self.written: list[Path] = []
        self.start = time.monotonic()

    def shown(self, text: str) -> str:
        """``text`` with the folder being written named as the final one."""
        return text.replace(str(self.out), str(self.final))

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.start:5.1f}s] {self.shown(text)}", file=sys.stderr, flush=True)

    def main(self) -> int:
        cpu_profile = self.profile_cpu()
        results = {name: self.plan_and_run(name, cpu_profile) for name in RUNNABLE}
        full_size = {gpu: self.plan_full_size(gpu, cpu_profile) for gpu in FULL_SIZE_GPUS}
        several = self.several_gpus()
        self.save_text(self.out / "commands.sh", "#!/bin/sh\n# what `placer demo` ran\nset -e\n"
                       + "\n".join(self.commands) + "\n")
        lines = [self.shown(line) for line in      # the paths it names are the final ones
                 summary_lines(results, full_size, cpu_profile, time.monotonic() - self.start, several)]
        self.save_text(self.out / "summary.txt", "\n".join(lines) + "\n")
        self.print_files()
        print("summary:")
        for line in lines:
            print("  " + line)
        mismatched = [n for n, r in results.items() if not r["match"]]
        if several and not several["run"]["match"]:
            mismatched.append(TOWERS_NET)
        if mismatched:
            print(f"placer demo: FAILED: the placed net's outputs differ from the all-CPU run for "
                  f"{', '.join(mismatched)} (see {self.final}/<net>/outputs_*.npz)", file=sys.stderr)
            return 1
        return 0

    def print_files(self) -> None:
        names = "{" + ",".join(RUNNABLE) + "}"
        gpus = "{" + ",".join(g.split("-")[0] for g in FULL_SIZE_GPUS) + "}"
        print(f"placer demo wrote {len(set(self.written))} files under {self.final}/")
        for what, where in (
                ("reports", f"{names}/report.html, {FULL_SIZE}/report-{gpus}.html (open in a browser)"),
                ("traces", f"{names}/trace_{{predicted,measured}}.json (open in https://ui.perfetto.dev)"),
                ("placed nets", f"{names}/placed_{{predict,init}}.pbtxt, plan.json, plan.txt, run_*.json"),
                ("several GPUs", f"{SPLIT_NET}/report.html, {TOWERS_NET}/report.html (makespan plan and its run), "
                                 f"{TOWERS_NET}/plan-{{makespan,serial}}.json"),
                ("CPU profile", "profiles/cpu-measured.json; the commands run: commands.sh")):
            print(f"  {what:<12} {where}")

    # -- 1. the CPU profile -------------------------------------------------------------

    def profile_cpu(self) -> Path:
        """Measure into a scratch file, then move it in place: a rerun starts afresh
        instead of merging into the last run's profile."""
        final = self.out / "profiles" / "cpu-measured.json"
        scratch = final.with_name(".cpu-measured.partial.json")
        scratch.parent.mkdir(parents=True, exist_ok=True)
        scratch.unlink(missing_ok=True)
        e, log = self.effort, io.StringIO()
        for name in RUNNABLE:
            self.say(f"profiling this CPU on {name} (every distinct op at its real shapes)")
            argv = [str(examples.path(name)), "--device", "cpu", "--repeats", str(e.repeats),
                    "--warmup", str(e.warmup), "--budget", str(e.budget_s), *(["--quiet"] if self.quiet else [])]
            self.command("profile", argv + ["-o", str(scratch)], log, shown=argv + ["-o", str(final)])
        scratch.replace(final)
        self.written.append(final)
        self.save_text(final.with_name("profile.txt"), log.getvalue())
        return final

    # -- 2-4. plan, place, run, compare, report -------------------------------------------

    def plan_and_run(self, name: str, cpu_profile: Path) -> dict:
        d = self.out / name
        d.mkdir(parents=True, exist_ok=True)
        net_path = examples.path(name)
        self.say(f"planning {name} against {DEFAULT_GPU_PROFILE}")
        self.plan(net_path, cpu_profile, ["--gpu-profile", DEFAULT_GPU_PROFILE], d / "plan.json", d / "plan.txt",
                  ["-o", str(d / "placed_predict.pbtxt"), "--init-out", str(d / "placed_init.pbtxt")])
        plan = read_plan(d / "plan.json")
        self.written += [d / "placed_predict.pbtxt", d / "placed_init.pbtxt"]
        self.save_bytes(d / "inputs.npz", _npz(random_feed(net_path)))
        self.say(f"running {name}: placed net with the GPU emulated, and the original on the CPU")
        placed = self.run_net(d / "placed_predict.pbtxt", d, "placed", ["--emulate-gpu"])
        original = self.run_net(net_path, d, "cpu", [])
        match, diff = compare(original["outputs"], placed["outputs"])
        self.say(f"{name}: outputs {'match' if match else 'DIFFER'} (largest difference {diff:.3g})")
        self.report(plan, placed["record"], d / "report.html", d / "trace_predicted.json",
                    d / "trace_measured.json")
        return {"plan": plan, "match": match, "max_diff": diff, "run": placed["record"],
                "cpu_run": original["record"]}

    def plan_full_size(self, gpu: str, cpu_profile: Path) -> PlanDocument:
        d = self.out / FULL_SIZE
        d.mkdir(parents=True, exist_ok=True)
        self.say(f"planning {FULL_SIZE} (planning only) against {gpu}")
        stem = gpu.split("-")[0]
        self.plan(examples.path(FULL_SIZE), cpu_profile, ["--gpu-profile", gpu], d / f"plan-{stem}.json",
                  d / f"plan-{stem}.txt",
                  ["--report", str(d / f"report-{stem}.html")])
        self.written.append(d / f"report-{stem}.html")
        return read_plan(d / f"plan-{stem}.json")

    def plan(self, net: Path, cpu_profile: Path | None, target: list, plan_out: Path, table: Path,
             extra: list) -> None:
        """``placer plan ... --plan-out plan.json > plan.txt``: run with ``--json`` (its
        table goes to the real stdout whatever is redirected), the table printed from the
        JSON by the command's own ``print_plan``. ``target``: the GPU options
        (``--gpu-profile NAME`` or ``--machine NAME``); no ``cpu_profile``: the machine's own."""
        host = ["--cpu-profile", str(cpu_profile)] if cpu_profile else []
        argv = [str(net), *host, *target,
                "--time-limit", str(self.effort.time_limit_s), "--plan-out", str(plan_out), *extra]
        self.command("plan", argv + ["--json"], io.StringIO(), shown=argv + [">", str(table)])
        self.written.append(plan_out)
        text = io.StringIO()
        plan_module.print_plan(read_plan(plan_out), out=text)
        self.save_text(table, text.getvalue())

    # -- 5. several GPUs ------------------------------------------------------------------

    def several_gpus(self) -> dict:
        """The split that memory forces, and the one overlap pays for (module docstring).
        Planned with the shipped machine profiles as they are (datasheet figures, the host
        included), so that the figures are the ones README.md quotes, on any host."""
        d = self.out / SPLIT_NET
        d.mkdir(parents=True, exist_ok=True)
        self.say(f"planning {SPLIT_NET} (planning only) on {SPLIT_MACHINE}")
        self.plan(examples.path(SPLIT_NET), None, ["--machine", SPLIT_MACHINE], d / "plan.json",
                  d / "plan.txt", ["--report", str(d / "report.html")])
        self.written.append(d / "report.html")
        split = read_plan(d / "plan.json")
        d = self.out / TOWERS_NET
        d.mkdir(parents=True, exist_ok=True)
        net_path, target = examples.path(TOWERS_NET), ["--machine", TOWERS_MACHINE]
        self.say(f"planning {TOWERS_NET} on {TOWERS_MACHINE}: makespan and serial objectives")
        self.plan(net_path, None, target + ["--method", "makespan"], d / "plan-makespan.json",
                  d / "plan-makespan.txt",
                  ["-o", str(d / "placed_predict.pbtxt"), "--init-out", str(d / "placed_init.pbtxt")])
        self.plan(net_path, None, target, d / "plan-serial.json", d / "plan-serial.txt", [])
        self.written += [d / "placed_predict.pbtxt", d / "placed_init.pbtxt"]
        towers = {k: read_plan(d / f"plan-{k}.json") for k in ("makespan", "serial")}
        shape = {"data": TensorType(TOWERS_RUN_SHAPE)}
        self.save_bytes(d / "inputs.npz", _npz(random_feed(net_path, shapes=shape)))
        gpus = sum(dev.kind == "gpu" for dev in towers["makespan"].machine.devices)
        self.say(f"running {TOWERS_NET}: placed net on {gpus} emulated GPUs, and the original on the CPU")
        at = ["--input", "data=" + ",".join(map(str, TOWERS_RUN_SHAPE))]
        placed = self.run_net(d / "placed_predict.pbtxt", d, "placed", ["--emulate-gpus", str(gpus), *at])
        original = self.run_net(net_path, d, "cpu", at)
        match, diff = compare(original["outputs"], placed["outputs"])
        self.say(f"{TOWERS_NET}: outputs {'match' if match else 'DIFFER'} (largest difference {diff:.3g})")
        self.report(towers["makespan"], placed["record"], d / "report.html", d / "trace_predicted.json",
                    d / "trace_measured.json")
        return {"split": split, "towers": towers, "gpus": gpus,
                "run": {"match": match, "max_diff": diff, "record": placed["record"]}}

    def run_net(self, net: Path, d: Path, tag: str, extra: list) -> dict:
        e, log = self.effort, io.StringIO()
        outputs, record = d / f"outputs_{tag}.npz", d / f"run_{tag}.json"
        init = ["--init-net", str(d / "placed_init.pbtxt")] if tag == "placed" else []
        self.command("run", [str(net), *init, "--inputs", str(d / "inputs.npz"), *extra,
                             "--iterations", str(e.iterations), "--warmup", "1",
                             "--outputs", str(outputs), "--record", str(record),
                             *(["--quiet"] if self.quiet else [])], log)
        self.written += [outputs, record]
        self.save_text(d / f"run_{tag}.txt", log.getvalue())
        with np.load(outputs) as data:
            arrays = {k: data[k] for k in data.files}
        return {"outputs": arrays, "record": json.loads(record.read_text())}

    def report(self, plan: PlanDocument, run_dict: dict, html: Path, predicted: Path, measured: Path) -> None:
        self.say(f"writing {html}")
        write_report(plan, run_dict, html)
        write_trace(plan, predicted)
        write_trace(None, measured, run=run_dict)
        self.written += [html, predicted, measured]

    # -- plumbing -------------------------------------------------------------------------

    def command(self, name: str, argv: list[str], log: io.StringIO, shown: list[str] | None = None) -> None:
        """Run ``placer NAME ARGV`` through the command's own parser; its stdout goes to
        ``log`` (saved beside the outputs); its exit status must be 0. ``shown`` is the
        command as written to commands.sh, when it differs from what ran."""
        module = COMMANDS[name]
        parser = argparse.ArgumentParser(prog=f"placer {name}")
        module.add_arguments(parser)
        args = parser.parse_args(argv)
        line = self.shown(f"placer {name} " + " ".join(a if a == ">" else shlex.quote(a) for a in (shown or argv)))
        self.commands.append(line)
        print("$ " + line, file=log)
        with contextlib.redirect_stdout(log):
            status = module.run(args)
        if status:
            raise SystemExit(f"placer demo: `placer {name}` exited with status {status}")

    def save_text(self, path: Path, text: str) -> None:
        atomic_write_text(path, text)
        self.written.append(path)

    def save_bytes(self, path: Path, data: bytes) -> None:
        atomic_write_bytes(path, data)
        self.written.append(path)


def random_feed(net_path: Path, seed: int = 0, shapes: dict | None = None) -> dict[str, np.ndarray]:
    """Inputs made from the original net (where index and lengths blobs have their
    readers' roles), fed unchanged to both runs; ``shapes`` replaces input shapes."""
    net = load_net(str(net_path))
    return random_inputs(net, infer(net, shapes).blobs, net.data_inputs, seed=seed)


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def compare(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[bool, float]:
    """(every output present and allclose, largest absolute difference)."""
    if set(expected) != set(got):
        return False, float("inf")
    worst, ok = 0.0, True
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape:
            return False, float("inf")
        if want.size:
            worst = max(worst, float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64)))))
        ok = ok and bool(np.allclose(have, want, rtol=RTOL, atol=ATOL))
    return ok, worst


# ---------------------------------------------------------------------------- summary

def summary_lines(results: dict, full_size: dict, cpu_profile: Path, elapsed_s: float,
                  several: dict | None = None) -> list[str]:
    """Seven lines: one per runnable net, the full-size DLRM on three GPUs, the DLRM that
    must be split over four GPUs, the two towers on two GPUs, the profile, the time."""
    lines = [net_line(name, r) for name, r in results.items()]
    lines.append(full_size_line(full_size))
    if several:
        lines += [split_line(several["split"]), towers_line(several)]
    lines.append(profile_line(cpu_profile))
    matched = all(r["match"] for r in results.values()) and (not several or several["run"]["match"])
    lines.append(f"demo took {elapsed_s:.1f} s; outputs of the placed nets "
                 f"{'equal' if matched else 'DIFFER from'} the all-CPU runs (rtol {RTOL:g}, atol {ATOL:g})")
    return lines


def _on_gpu(ops: list[OpInfo]) -> int:
    """Ops placed on a GPU (any of them)."""
    return sum(or_default(o.device_kind, "gpu" if o.device != "cpu" else "cpu") == "gpu" for o in ops)


def net_line(name: str, r: dict) -> str:
    p, b = r["plan"], r["plan"].baselines
    return (f"{name}: plan {ms(p.total_s)} vs all-CPU {ms(b['all_cpu'].total_s)} vs all-GPU "
            f"{ms(b['all_gpu'].total_s)} predicted on {_gpu_label(p)} (all-CPU measured here: "
            f"{ms(r['cpu_run']['total_s'])}); {_on_gpu(p.ops)}/{len(p.ops)} ops on the GPU; outputs "
            f"{'match' if r['match'] else 'DIFFER'} (max diff {r['max_diff']:.2g})")


def full_size_line(plans: dict[str, PlanDocument]) -> str:
    """Per GPU: embedding tables placed on it, the plan's time, whether all-GPU fits."""
    parts = []
    for p in plans.values():
        tables = [o for o in p.ops if o.type.startswith("SparseLengths")]
        fits = "fits" if or_default(p.baselines["all_gpu"].feasible, True) else "does not fit"
        parts.append(f"{_gpu_label(p)}: {_on_gpu(tables)}/{len(tables)} tables on the GPU, plan {ms(p.total_s)} "
                     f"(all-GPU {fits})")
    return f"{FULL_SIZE} (planning only): " + "; ".join(parts)


def split_line(p: PlanDocument) -> str:
    """The net no one GPU holds: embedding tables per device, the plan against all-CPU,
    and why all on one GPU cannot run."""
    tables = [o for o in p.ops if o.type.startswith("SparseLengths")]
    per = {d: sum(o.device == d for o in tables) for d in p.devices}
    params = sum(t.bytes for t in p.tensors if t.producer == -2)
    one = p.baselines["all_gpu"]
    fits = "fits" if or_default(one.feasible, True) else f"does not fit ({or_default(one.why_infeasible, '')})"
    return (f"{SPLIT_NET} on {SPLIT_MACHINE} (planning only, {fmt_bytes(params)} of parameters, datasheet "
            f"profiles): tables per device "
            + ", ".join(f"{d} {n}" for d, n in per.items() if n)
            + f"; plan {ms(p.total_s)} vs all-CPU {ms(p.baselines['all_cpu'].total_s)}; all on one GPU {fits}")


def towers_line(several: dict) -> str:
    """Where each tower went under each objective, the overlapped makespans, the run."""
    span, serial, run = several["towers"]["makespan"], several["towers"]["serial"], several["run"]

    def towers(p: PlanDocument) -> str:
        name = [display_name(o.name, o.outputs) for o in p.ops]
        return ", ".join(f"{side} on " + "/".join(sorted({o.device for o, n in zip(p.ops, name)
                                                          if n.startswith(side + "_")}))
                         for side in ("left", "right"))

    shape = "x".join(map(str, TOWERS_RUN_SHAPE))
    return (f"{TOWERS_NET} on {TOWERS_MACHINE} (datasheet profiles): makespan plan {ms(span.schedules['makespan'].makespan_s)} "
            f"overlapped ({towers(span)}) vs serial plan {ms(serial.schedules['makespan'].makespan_s)} "
            f"({towers(serial)}); placed net on {several['gpus']} emulated GPUs at data {shape}: outputs "
            f"{'match' if run['match'] else 'DIFFER'} (max diff {run['max_diff']:.2g})")


def ms(seconds: float) -> str:
    """Milliseconds to 3 significant figures (whole ones from 1000 on): one unit, so the
    figures compare at a glance."""
    value = seconds * 1e3
    return f"{value:.0f} ms" if abs(value) >= 1000 else f"{value:.3g} ms"


def profile_line(path: Path) -> str:
    cpu = load_profile(path).device("cpu")
    return (f"CPU profile: {len(cpu.ops)} op timings, {cpu.peak_flops['float32'] / 1e9:.0f} GFLOP/s GEMM, "
            f"{fmt_rate(cpu.memory_bandwidth_bytes_per_s)} streaming ({path})")


def _gpu_label(plan: PlanDocument) -> str:
    gpu = (plan.profiles or {}).get("gpu")
    name = or_default(gpu.name, "GPU") if gpu is not None else "GPU"
    return name.replace("NVIDIA ", "").replace(" PCIe", "")
