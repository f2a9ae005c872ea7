"""`placer profile`: measure a device into a profile file (ops of a net, the host, the link)."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from placer import arguments
from placer.commands.common import add_feed_argument, add_net_arguments, load_typed_net
from placer.costs.model import FIT_VERSION, CostModel
from placer.errors import DeviceError, InputError, ShapeError
from placer.fileio import atomic_write_text, reading_to_update, refuse_overwrite
from placer.hardware.constants import FIT_MAX_MEDIAN_ERROR_PCT
from placer.hardware.device_profile import DeviceProfile, Profile, save_profile
from placer.hardware.machine import load_machine
from placer.hardware.profiles import (DEFAULT_CPU_PROFILE, DEFAULT_GPU_PROFILE, find_profile, load_profile,
                                      shipped_profile_names)
from placer.profiling import calibration, collective_bench, link
from placer.profiling.bench import get_device, profile_net
from placer.profiling.host import host_description, measure_host
from placer.profiling.in_network import InNetworkUnavailable, profile_in_network
from placer.progress import Progress
from placer.runtime.devices import import_cupy
from placer.runtime.footprint import profile_footprint, require_memory
from placer.runtime.threads import get_blas_threads, set_blas_threads
from placer.shapes import missing_summary
from placer.units import fmt_rate, fmt_time

DESCRIPTION = """\
Four measurements, each written (merged) into the profile file given with -o:

  placer profile NET [--init-net INIT] [--input NAME=...] --device cpu|cuda:0 -o FILE
      runs the whole net with the runtime's executor (--warmup untimed runs, then
      --repeats timed runs) and records each op's time where it really runs: after its
      producer, on the inputs the previous op left, allocating its outputs -- what
      `placer run` sees. Ops with the same type, input shapes and cost-relevant
      arguments share one entry (median and interquartile range of all their samples).
      --isolated times each distinct op alone instead (--warmup calls, then --repeats
      samples or --budget seconds per op; warm caches, so usually faster than in a run).
      Every entry says how it was timed. Per-family roofline fits of the device are
      refreshed from all its measured entries and stored in the file, with their
      quality (median and p90 error, run-to-run spread, and whether one roofline covers
      the family at all); the fits are printed.
  placer profile --calibrate --device cpu|cuda:0 -o FILE
      runs a built-in sweep net (depthwise, grouped, 1x1 and dense convs, FCs at several
      row counts, embedding lookups over table sizes, elementwise, normalisation and
      pooling ops over sizes) in-network at batch 1 and 4, so that every common family
      has fitted points even where the nets you profiled have none (placer/profiling/
      calibration.py; its shapes are off the usual ones, so your nets' ops stay priced
      from what was measured on them).
  placer profile --host -o FILE
      GEMM FLOP/s, streaming bandwidth and per-call overhead of this CPU.
  placer profile --link --device cuda:0 -o FILE
      host->GPU and GPU->host copy times for 4 KiB .. 1 GiB (powers of 4), pinned and
      pageable, between CUDA events; a fitted latency and bandwidth per curve.
  placer profile --collectives [--collective-gpus 0,1,...] [--machine NAME|FILE] -o FILE
      NCCL all-reduce, all-gather, reduce-scatter, broadcast and all-to-all over the GPUs
      (all visible by default) through cupy's NCCL bindings, 4 KiB .. 1 GiB, as nccl-tests
      times them (algbw, busbw); a fitted latency and bus bandwidth per collective; with
      --machine, the cost model's times for that machine beside them. FILE is a
      collectives measurement (JSON), written whole.

If FILE exists, new figures replace old ones for the same device and the same op keys;
everything else in it is kept. A new GPU device starts from the shipped datasheet
profile named by --base (default: guessed from the GPU's name, else '""" + DEFAULT_GPU_PROFILE + """').

examples:
  placer profile resnet50_predict_net.pbtxt --init-net resnet50_init_net.pb \\
      --input data=8,3,224,224 --device cpu -o profiles/myhost.json
  placer profile --host -o profiles/myhost.json
  placer profile --calibrate --threads 1 -o profiles/myhost.json
  placer profile --link --device cuda:0 -o profiles/mygpu.json
  placer profile --collectives --machine 8x-a100-40gb-nvswitch -o collectives.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_arguments(parser)
    for action in parser._actions:  # NET is optional here: --host and --link need none
        if action.dest == "net":
            action.nargs, action.required, action.default = "?", False, None
    add_feed_argument(parser)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (default: cpu)")
    parser.add_argument("--host", action="store_true", help="characterise this CPU")
    parser.add_argument("--calibrate", action="store_true",
                        help="time the built-in sweep net (every common op family over a range of sizes)")
    parser.add_argument("--threads", type=arguments.count(1, arguments.MAX_THREADS), metavar="N",
                        help="BLAS threads for CPU kernels: profile with the count you will run with")
    parser.add_argument("--link", action="store_true",
                        help="measure host<->GPU copy curves; with several GPUs also GPU<->GPU ones "
                             "(and whether P2P is on), into a machine profile (--machine-out)")
    parser.add_argument("--machine-out", metavar="FILE",
                        help="--link with several GPUs: the machine profile to write "
                             "(default: OUTPUT's name with -machine.json)")
    parser.add_argument("--repeats", type=arguments.count(1), default=10,
                        help="timed runs of the net (with --isolated: samples per op) (default 10)")
    parser.add_argument("--warmup", type=arguments.count(0), default=2,
                        help="untimed runs (with --isolated: calls per op) first (default 2)")
    parser.add_argument("--isolated", action="store_true",
                        help="time each distinct op alone instead of in a run of the whole net")
    parser.add_argument("--collectives", action="store_true", help="measure NCCL collectives over several GPUs")
    parser.add_argument("--collective-gpus", metavar="0,1,...",
                        help="GPUs the collectives run over (default: every visible GPU)")
    parser.add_argument("--machine", metavar="NAME|FILE",
                        help="machine profile whose cost model the collectives are set against")
    parser.add_argument("--budget", type=arguments.seconds, default=0.5, metavar="S",
                        help="--isolated: stop sampling an op after S seconds, keeping >= 3 samples (default 0.5)")
    parser.add_argument("--base", metavar="NAME|FILE",
                        help=f"datasheet profile a new GPU device starts from ({', '.join(shipped_profile_names())})")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="profile file to write or merge into")


def run(args: argparse.Namespace) -> int:
    modes = sum(bool(x) for x in (args.net, args.host, args.link, args.calibrate, args.collectives))
    if modes != 1:
        raise InputError("give exactly one of NET, --calibrate, --host, --link or --collectives",
                         hint="e.g. placer profile net.pbtxt --device cpu -o prof.json")
    refuse_overwrite(args.output, args.net, getattr(args, "init_net", None))
    if args.collectives:
        return _write_collectives(args)
    _set_threads(args.threads)
    kind = _device_kind(args.device)
    if args.link and kind != "gpu":
        raise DeviceError("--link measures a GPU's link: give --device cuda:N")
    if args.host and kind != "cpu":
        raise InputError("--host characterises the CPU: drop --device or use --device cpu")
    profile = _existing(args.output)
    peers = None
    if args.host:
        _merge_host(profile)
    elif args.link:
        _merge_link(profile, args)
        peers = _measure_peers(args)
    else:
        _merge_ops(profile, args, kind)
    save_profile(profile, args.output)
    print(f"wrote {args.output}")
    if peers is not None:
        _write_machine(profile, args, *peers)
    return 0


def _set_threads(threads: int | None) -> None:
    """--threads: the BLAS thread count the ops are timed with (as `placer run --threads`)."""
    if threads is None:
        return
    if not set_blas_threads(threads):
        print("placer: warning: could not set the BLAS thread count here; "
              f"set OPENBLAS_NUM_THREADS={threads} before starting", file=sys.stderr)


def _device_kind(name: str) -> str:
    if name == "cpu":
        return "cpu"
    if name.startswith("cuda"):
        return "gpu"
    raise InputError(f"--device {name}: expected cpu or cuda:N")


def _existing(path: str) -> Profile:
    if Path(path).exists():
        with reading_to_update(path):
            return load_profile(path)
    return Profile(name=Path(path).stem, devices={}, description="measured by placer profile")


def _merge_host(profile: Profile) -> None:
    new = measure_host()
    old = profile.devices.get("cpu")
    if old is not None:
        new.ops, new.fits = old.ops, old.fits
    profile.devices["cpu"] = new
    print(f"host: {new.peak_flops['float32'] / 1e9:.0f} GFLOP/s float32 GEMM, "
          f"{fmt_rate(new.memory_bandwidth_bytes_per_s)} streaming, "
          f"{fmt_time(new.launch_overhead_s)} per call")


def _gpu_device(profile: Profile, args: argparse.Namespace) -> DeviceProfile:
    """The file's GPU device, else one started from a datasheet profile."""
    if "gpu" in profile.devices:
        return profile.devices["gpu"]
    device = get_device(args.device)  # DeviceError without a GPU
    name = device.cupy.cuda.runtime.getDeviceProperties(device.index)["name"].decode()
    base = args.base or _guess_base(name)
    dev = load_profile(find_profile(base)).device("gpu")
    dev.name = name
    dev.source = {"kind": "measured", "host": _host(), "date": _today(),
                  "datasheet_figures_from": base}
    dev.memory_capacity_bytes = float(device.cupy.cuda.runtime.getDeviceProperties(device.index)["totalGlobalMem"])
    profile.devices["gpu"] = dev
    return dev


def _require_gpu(what: str) -> None:
    """A DeviceError that says what to use instead when no GPU is visible."""
    try:
        import_cupy()
    except DeviceError as e:
        raise DeviceError(f"{what} needs a CUDA GPU: {e.message.split(':')[0]}",
                          hint="the shipped GPU profiles carry datasheet figures, "
                               "e.g. placer plan --gpu-profile a100-40gb-pcie4") from None


def _guess_base(gpu_name: str) -> str:
    lowered = gpu_name.lower()
    for key, base in (("h200", "h200-141gb-pcie5"), ("h100", "h100-pcie5"), ("a100", "a100-40gb-pcie4"),
                      ("t4", "t4-pcie3"), ("v100", "v100-16gb-pcie3"), ("p100", "p100-16gb-pcie3")):
        if key in lowered:
            return base
    return DEFAULT_GPU_PROFILE


def _merge_link(profile: Profile, args: argparse.Namespace) -> None:
    _require_gpu("--link")
    dev = _gpu_device(profile, args)
    index = int(args.device.split(":", 1)[1]) if ":" in args.device else 0
    bar = Progress(len(link.SIZES) * 4, "link", quiet=args.quiet)
    try:
        dev.link = link.measure_link(index, progress=bar)
    finally:
        bar.close()
    for direction, mems in dev.link.items():
        for mem, c in mems.items():
            print(f"{direction} {mem}: latency {fmt_time(c.latency_s)}, {fmt_rate(c.bytes_per_s)}")


def _measure_peers(args: argparse.Namespace):
    """With two or more visible GPUs: (their cupy numbers, the GPU->GPU curves); else None."""
    count = int(import_cupy().cuda.runtime.getDeviceCount())
    if count < 2:
        if args.machine_out:
            raise DeviceError(f"--machine-out: {count} GPU visible; GPU->GPU copies need two or more")
        return None
    gpus = list(range(count))
    bar = Progress(len(link.SIZES) * count * (count - 1), "GPU->GPU", quiet=args.quiet)
    try:
        curves = link.measure_peers(gpus, progress=bar)
    finally:
        bar.close()
    for c in curves:
        print(f"cuda:{c['src']} -> cuda:{c['dst']}: {'P2P' if c['p2p'] else 'staged (no P2P)'}, "
              f"latency {fmt_time(c['latency_s'])}, {fmt_rate(c['bytes_per_s'])}")
    return gpus, curves


def _write_machine(profile: Profile, args: argparse.Namespace, gpus: list[int], curves: list) -> None:
    """The machine profile of this host's GPUs with their measured GPU->GPU curves, its GPU
    (and host, when the file has one) the profile just written."""
    out = Path(args.output)
    target = Path(args.machine_out) if args.machine_out else out.with_name(f"{out.stem}-machine.json")
    refuse_overwrite(str(target), args.output)
    # load_machine looks a reference up as <folder of the machine file>/<ref>.json first
    ref = out.stem if out.suffix == ".json" and out.resolve().parent == target.resolve().parent \
        else str(out.resolve())
    host = ref if "cpu" in profile.devices else DEFAULT_CPU_PROFILE
    doc = link.machine_profile(f"{out.stem}-{len(gpus)}gpu", host, ref, curves, len(gpus), _host())
    atomic_write_text(target, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {target} (load it with --machine {target})")


def _merge_ops(profile: Profile, args: argparse.Namespace, kind: str) -> None:
    if kind == "gpu":
        _require_gpu(f"--device {args.device}")
    nets = _nets_to_time(args)
    for typed in nets:   # before any array is made
        require_memory(*profile_footprint(typed), hint="give smaller shapes with --input")
    if kind == "gpu":
        dev = _gpu_device(profile, args)
    else:
        dev = profile.devices.get("cpu")
        if dev is None:
            dev = profile.devices["cpu"] = measure_host()
    for typed in nets:
        result = _time_ops(typed, args)
        dev.ops.update(result.timings)
        method = next(iter(result.timings.values())).method if result.timings else "isolated"
        print(f"{typed.net.name or args.net}: timed {result.ops_timed} distinct ops of {len(typed.net.ops)} "
              f"{method} ({len(dev.ops)} entries in the profile)")
        for label, why in list(result.skipped.items())[:20]:
            print(f"  not timed: {label}: {why}", file=sys.stderr)
        if len(result.skipped) > 20:
            print(f"  ... and {len(result.skipped) - 20} more not timed", file=sys.stderr)
    dev.source = {**dev.source, "kind": "measured", "host": dev.source.get("host", _host()),
                  "date": _today()}
    if kind == "cpu":
        dev.source["blas_threads"] = get_blas_threads()  # op times depend on it: say which
    dev.fits = {}  # refit from every entry the device now has
    model = CostModel(dev if kind == "cpu" else None, dev if kind == "gpu" else None)
    dev.fits = model.fits(kind)
    dev.fits_digest = dev.fit_inputs_digest(FIT_VERSION)
    print(format_fit_report(model.fit_report(kind)))
    uncovered = [g for g, f in sorted(dev.fits.items()) if not f.covered]
    if uncovered:
        print(f"note: one roofline does not cover {', '.join(uncovered)} (median fit error above "
              f"{FIT_MAX_MEDIAN_ERROR_PCT:g}%): ops priced from these fits are labelled 'poor-fit'; "
              "profile the nets you plan for to measure them")


def _nets_to_time(args: argparse.Namespace) -> list:
    """The calibration sweep (--calibrate), else NET; a NET none of whose ops has a
    shape is refused, one with some missing shapes is timed where it can be."""
    if args.calibrate:
        return calibration.typed_nets()
    typed = load_typed_net(args)
    if typed.missing:
        if all(any(t is None for t in ins) for ins in typed.op_inputs):
            raise ShapeError(f"{args.net}: no op could be timed: {missing_summary(typed)}")
        print(f"warning: {missing_summary(typed)}; ops that need them are not timed, "
              "the others are timed alone (the net cannot run whole)", file=sys.stderr)
    return [typed]


def _time_ops(typed, args: argparse.Namespace):
    """In-network timing, else (--isolated, or a net that cannot run whole: missing
    shapes, ops without a kernel, an init net without values) op by op."""
    if not args.isolated and not typed.missing:  # missing shapes: warned about by the caller
        try:
            return profile_in_network(typed, args.device, iterations=args.repeats, warmup=args.warmup,
                                      progress=not args.quiet)
        except InNetworkUnavailable as e:
            print(f"warning: cannot time {args.net or typed.net.name} in a whole run ({e.message}); "
                  "timing each op alone instead (entries marked 'isolated')", file=sys.stderr)
    return profile_net(typed, args.device, repeats=args.repeats, warmup=args.warmup,
                       budget_s=args.budget, progress=not args.quiet)


def format_fit_report(report) -> str:
    """The fit table as ``placer profile`` prints it: errors and spread in percent."""
    shown = report.rename(columns={"median_abs_pct_error": "median err %", "p90_abs_pct_error": "p90 err %",
                                   "spread_pct": "spread %", "half_efficiency_rows": "M0"})
    return shown.to_string(index=False, float_format=lambda v: f"{v:.3g}")


def _host() -> str:
    return host_description()


def _today() -> str:
    return _dt.date.today().isoformat()


def _write_collectives(args: argparse.Namespace) -> int:
    """``--collectives``: measure, set beside the machine's model when given, write."""
    if Path(args.output).exists():
        collective_bench.load_measurements(args.output)      # a ProfileError unless it is a collectives file
    machine = None
    if args.machine:
        machine = load_machine(args.machine)
    gpus = _gpu_list(args.collective_gpus)
    _require_gpu("--collectives")
    bar = Progress(len(collective_bench.KINDS) * len(collective_bench.SIZES), "collectives", quiet=args.quiet)
    try:
        measured = collective_bench.measure_collectives(gpus, repeats=args.repeats, progress=bar)
    finally:
        bar.close()
    measured.host, measured.date = _host(), _today()
    if machine is not None:
        measured.model = collective_bench.compare(measured, machine)
    collective_bench.save_measurements(measured, args.output)
    print(f"{len(measured.gpus)} GPUs ({', '.join(dict.fromkeys(measured.gpu_names))}), "
          f"NCCL {measured.nccl_version}")
    largest = {p.kind: p for p in measured.points}
    model = {r["kind"]: r for r in measured.model}
    for kind, fit in measured.fits.items():
        line = (f"{kind}: latency {fmt_time(fit['latency_s'])}, bus {fmt_rate(fit['bus_bytes_per_s'])}; "
                f"busbw {fmt_rate(largest[kind].busbw_bytes_per_s)} at the largest size")
        if kind in model:
            line += f" (model: {fmt_rate(model[kind]['model_busbw'])})"
        print(line)
    print(f"wrote {args.output}")
    return 0


def _gpu_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(t.removeprefix("cuda:")) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--collective-gpus {text}: expected GPU numbers, e.g. 0,1,2,3") from None
