"""`placer plan` end to end on generated nets of 1k to 1M ops: time per stage, total, peak RSS.

bench/plan_scale.py times the partitioners on prebuilt arrays; this one runs the real
command line, parse included, on nets shaped like real ones, each in a fresh process:

    placer plan NET --init-net INIT --input ... -o placed.pbtxt --init-out placed_init.pbtxt \
        --plan-out plan.json --timings

Net kinds (predict net + init net, written as text .pbtxt and binary .pb):
  fc      layers of FC -> Relu (in place) -> Sum (residual add), one weight (XavierFill)
          and one bias (ConstantFill) per FC; input data=32,64; 3 ops and 2 parameters a layer
  resnet  basic blocks of Conv -> SpatialBN -> Relu (in place), Conv -> SpatialBN, Sum,
          Relu (in place), a global AveragePool and an FC at the end; 16 channels at 14x14,
          batch 8; 7 ops and 10 parameters a block
  dlrm    towers of four SparseLengthsSum tables (UniformFill, 2k-20k rows of 16) and a
          dense input -> Concat -> FC -> Relu -> FC -> Relu -> Sum into a running total;
          10 ops, 8 parameters and 9 fed inputs a tower

    python bench/plan_cli_scale.py                          # fc nets, 1k..1M, text and binary
    python bench/plan_cli_scale.py --cpu                    # stages in CPU seconds (busy hosts)
    python bench/plan_cli_scale.py --kind resnet --kind dlrm --sizes 1000 10000 100000
    python bench/plan_cli_scale.py --machine 8x-a100-40gb-nvswitch --sizes 100000 1000000
                                                            # the same command on a k-device machine
    python bench/plan_cli_scale.py --option=--gpu-mem=20MB  # any further `placer plan` option
    python bench/plan_cli_scale.py --profile 30000          # cProfile of one run: top functions
    python bench/plan_cli_scale.py --dir /big/disk          # where nets are generated (reused)

The per-stage times come from ``placer plan --timings`` (stderr); "pb parse" is protobuf's
own parse of the two files (text or binary), timed alone in another fresh process; peak
RSS is the child's ru_maxrss (os.wait4).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000, 10_000, 30_000, 100_000, 1_000_000)
INPUTS = {"fc": ["data=32,64"], "resnet": ["data=8,16,14,14"], "dlrm": []}  # dlrm: in value_info


# ---------------------------------------------------------------- nets

def build(kind: str, n_ops: int):
    """A NetBuilder holding about ``n_ops`` ops of ``kind`` (module docstring)."""
    sys.path.insert(0, str(ROOT))
    from placer.examples.builder import NetBuilder
    b = NetBuilder(f"{kind}_{n_ops}")
    {"fc": _fc_layers, "resnet": _resnet_blocks, "dlrm": _dlrm_towers}[kind](b, n_ops)
    return b


def _fc_layers(b, n_ops: int, width: int = 64) -> None:
    x = b.input("data", (32, width))
    for i in range(max(1, n_ops // 3)):
        w = b.param(f"fc{i}_w", (width, width), "XavierFill")
        bias = b.param(f"fc{i}_b", (width,), "ConstantFill", value=0.0)
        h = b.op("FC", [x, w, bias], f"fc{i}")
        h = b.op("Relu", [h], h)
        x = b.op("Sum", [h, x], f"res{i}")
    b.output(x)


def _conv_bn(b, name: str, x: str, channels: int, relu: bool) -> str:
    w = b.param(f"{name}_w", (channels, channels, 3, 3), "MSRAFill")
    y = b.op("Conv", [x, w], name, kernel=3, pad=1)
    bn = [b.param(f"{name}_bn_{p}", (channels,), "ConstantFill", value=v)
          for p, v in (("s", 1.0), ("b", 0.0), ("rm", 0.0), ("riv", 1.0))]
    y = b.op("SpatialBN", [y, *bn], f"{name}_bn", is_test=1, epsilon=1e-5)
    return b.op("Relu", [y], y) if relu else y


def _resnet_blocks(b, n_ops: int, channels: int = 16, classes: int = 10) -> None:
    x = b.input("data", (8, channels, 14, 14))
    for k in range(max(1, (n_ops - 2) // 7)):
        y = _conv_bn(b, f"b{k}_a", x, channels, relu=True)
        y = _conv_bn(b, f"b{k}_b", y, channels, relu=False)
        s = b.op("Sum", [y, x], f"b{k}_sum")
        x = b.op("Relu", [s], s)
    x = b.op("AveragePool", [x], "pool", global_pooling=1)
    w = b.param("pred_w", (classes, channels), "XavierFill")
    bias = b.param("pred_b", (classes,), "ConstantFill", value=0.0)
    b.output(b.op("FC", [x, w, bias], "pred"))


def _dlrm_towers(b, n_ops: int, tables: int = 4, dim: int = 16, batch: int = 64) -> None:
    import numpy as np
    rows = np.random.default_rng(0).integers(2_000, 20_000, size=tables * max(1, n_ops // 10))
    total = None
    for k in range(max(1, n_ops // 10)):
        embs = []
        for t in range(tables):
            table = b.param(f"t{k}_{t}_w", (int(rows[k * tables + t]), dim), "UniformFill", min=-0.01, max=0.01)
            idx = b.input(f"t{k}_{t}_i", (batch * 2,), "int64")
            lengths = b.input(f"t{k}_{t}_l", (batch,), "int32")
            embs.append(b.op("SparseLengthsSum", [table, idx, lengths], f"t{k}_{t}_e"))
        dense = b.input(f"d{k}", (batch, dim))
        x = b.op("Concat", [*embs, dense], [f"c{k}", f"c{k}_info"], axis=1)
        width = dim * (tables + 1)
        for j, out in enumerate((64, dim)):
            w = b.param(f"m{k}_{j}_w", (out, width), "XavierFill")
            bias = b.param(f"m{k}_{j}_b", (out,), "ConstantFill", value=0.0)
            x = b.op("FC", [x, w, bias], f"m{k}_{j}")
            x = b.op("Relu", [x], x)
            width = out
        total = x if total is None else b.op("Sum", [total, x], f"acc{k}")
    b.output(total)


def generate(kind: str, n_ops: int, folder: Path) -> dict[str, Path]:
    """Write the net of ``kind`` and ``n_ops`` into ``folder`` (text, binary, value_info),
    unless it is there already."""
    from google.protobuf import text_format
    stem = folder / f"{kind}_{n_ops}"
    paths = {"text": (stem.with_suffix(".pbtxt"), folder / f"{kind}_{n_ops}_init.pbtxt"),
             "binary": (stem.with_suffix(".pb"), folder / f"{kind}_{n_ops}_init.pb")}
    if all(p.exists() for pair in paths.values() for p in pair):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    b = build(kind, n_ops)
    for net, (text_path, bin_path) in ((b.predict, (paths["text"][0], paths["binary"][0])),
                                       (b.init, (paths["text"][1], paths["binary"][1]))):
        bin_path.write_bytes(net.SerializeToString())
        text_path.write_text(text_format.MessageToString(net))
    if not INPUTS[kind]:  # fed inputs that --input does not give (dlrm: thousands of them)
        Path(str(stem) + ".value_info.json").write_text(b.value_info_json())
    return paths


# ---------------------------------------------------------------- runs

def run_child(cmd: list[str], cwd: Path, log: Path) -> tuple[int, str, float, float, float]:
    """(returncode, stderr, wall s, CPU s, peak RSS MB) of one fresh process; stdout goes to ``log``."""
    t0 = time.perf_counter()
    with open(log, "w") as out, open(log.with_suffix(".err"), "w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(proc.pid, 0)  # reaped here: the child's own ru_maxrss
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        return proc.returncode, err.read(), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def plan_command(paths: tuple[Path, Path], kind: str, out: Path, machine: str | None = None,
                 options: list[str] | None = None) -> list[str]:
    net, init = paths
    cmd = [sys.executable, str(ROOT / "cli.py"), "plan", str(net), "--init-net", str(init),
           "-o", str(out / "placed.pbtxt"), "--init-out", str(out / "placed_init.pbtxt"),
           "--plan-out", str(out / "plan.json"), "--timings"]
    for spec in INPUTS[kind]:
        cmd += ["--input", spec]
    if machine:
        cmd += ["--machine", machine]
    return cmd + list(options or [])


_TIMING = re.compile(r"^timing: +(\S+) +([\d.]+) s wall +([\d.]+) s cpu", re.M)


def stage_times(stderr: str, which: int = 0) -> dict[str, float]:
    """Stage -> wall seconds (``which`` 0) or CPU seconds (1) from ``--timings``."""
    return {m[0]: float(m[1 + which]) for m in _TIMING.findall(stderr)}


def protobuf_parse_s(paths: tuple[Path, Path], cpu: bool = False) -> float:
    """Wall (or CPU) seconds protobuf alone takes to read the two files, in a fresh process."""
    clock = "process_time" if cpu else "perf_counter"
    code = ("import sys,time;sys.path.insert(0,sys.argv[1]);from placer.formats.caffe2 import read_netdef;"
            f"t=time.{clock}();[read_netdef(p) for p in sys.argv[2:]];print(time.{clock}()-t)")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT), *map(str, paths)],
                       capture_output=True, text=True)
    return float(r.stdout) if r.returncode == 0 else float("nan")


STAGES = ("parse", "shapes", "costs", "graph", "partition", "check", "baselines", "makespan",
          "json", "stability", "rewrite", "write", "plan-out", "print")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", action="append", choices=sorted(INPUTS), help="net kind (repeatable; default fc)")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--encoding", action="append", choices=("text", "binary"),
                    help="net file encoding (repeatable; default both)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/placer-cli-scale"), help="where nets are generated")
    ap.add_argument("--cpu", action="store_true", help="stage columns in CPU seconds (steadier on a busy host)")
    ap.add_argument("--machine", help="placer plan --machine NAME|FILE (default: the CPU + one GPU)")
    ap.add_argument("--option", action="append", default=[], metavar="OPT",
                    help="a further placer plan option, e.g. --option=--gpu-mem=20MB (repeatable)")
    ap.add_argument("--profile", type=int, metavar="N", help="cProfile one run of a net of N ops instead")
    args = ap.parse_args(argv)
    if args.profile:
        return profile(args.kind[0] if args.kind else "fc", args.profile, args.dir,
                       (args.encoding or ["binary"])[0], args.machine, args.option)
    which = 1 if args.cpu else 0
    print(f"{'CPU' if args.cpu else 'wall'} seconds; 'start' is the rest of the run (interpreter, imports, "
          "profiles, exit); 'pb parse': protobuf alone on the same files, in another process")
    print(f"{'kind':>6} {'ops':>9} {'enc':>6} {'pb parse':>8} " + " ".join(f"{s:>9}" for s in STAGES)
          + f" {'start':>6} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}", flush=True)
    for kind in args.kind or ["fc"]:
        for n in args.sizes:
            paths = generate(kind, n, args.dir)
            for enc in args.encoding or ["text", "binary"]:
                out = args.dir / f"out_{kind}_{n}_{enc}"
                out.mkdir(parents=True, exist_ok=True)
                pb_s = protobuf_parse_s(paths[enc], cpu=args.cpu)
                cmd = plan_command(paths[enc], kind, out, args.machine, args.option)
                rc, err, wall, cpu, rss = run_child(cmd, ROOT, out / "stdout.txt")
                if rc:
                    print(f"{kind:>6} {n:>9} {enc:>6} failed: {err.strip().splitlines()[-1:]}", flush=True)
                    continue
                t = stage_times(err, which)
                rest = (cpu if args.cpu else wall) - t.get("total", 0.0)
                print(f"{kind:>6} {n:>9} {enc:>6} {pb_s:>8.2f} "
                      + " ".join(f"{t.get(s, float('nan')):>9.2f}" for s in STAGES)
                      + f" {rest:>6.2f} {wall:>8.2f} {cpu:>8.2f} {rss:>8.0f}", flush=True)


def profile(kind: str, n: int, folder: Path, encoding: str = "binary", machine: str | None = None,
            options: list[str] | None = None, top: int = 40) -> None:
    """cProfile one run in this process; print the functions with the most own time, then
    the most time with what they call."""
    import cProfile
    import pstats
    sys.path.insert(0, str(ROOT))
    from placer.cli import main as cli_main
    paths = generate(kind, n, folder)
    out = folder / f"profile_{kind}_{n}"
    out.mkdir(parents=True, exist_ok=True)
    argv = plan_command(paths[encoding], kind, out, machine, options)[2:]
    prof = cProfile.Profile(time.process_time)  # CPU seconds: steadier on a busy host
    saved = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        prof.runcall(cli_main, argv)
    finally:
        sys.stdout = saved
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main()
