"""``placer run``: execute a (placed) net and time every op."""
from __future__ import annotations

import argparse
import io
import math
import sys
import zipfile

import numpy as np

from placer.commands.common import add_net_arguments, load_typed_net
from placer.errors import InputError
from placer.fileio import atomic_write_bytes, refuse_overwrite
from placer.progress import Progress
from placer.runtime import record as run_record
from placer.runtime.executor import Executor
from placer.runtime.footprint import Footprint, require_memory, run_footprint
from placer.runtime.inputs import random_inputs
from placer.runtime.threads import set_blas_threads
from placer.types import RunRecord, TensorType
from placer.units import fmt_bytes

HELP = "run a net on numpy (CPU) / cupy (GPU) and time every op"
DESCRIPTION = """\
Run a Caffe2 or Caffe net, placed or not, and time every op.

Each op runs on the device its device_option names (no annotation: the CPU; device_id N
of a CUDA option: cuda:N); copy ops move blobs between devices (GPU to GPU as a peer copy
where the two GPUs can reach each other, else through pinned host memory). Without a GPU,
--emulate-gpu runs GPU ops on numpy arrays tagged as the memory of their GPU, as many
GPUs as the net names; --emulate-gpus N emulates exactly N (cuda:0..N-1) and refuses an
op placed beyond them. A blob handed to an op on the wrong device is an error naming the
op, the blob and both devices, which checks a placed net's structure (emulated times are
CPU times and are labelled so).

The table ends with the time and peak memory of each device and the bytes copied over
each link (source -> target).

Inputs come from --inputs x.npz (keyed by blob name) or --random-inputs SEED (the
default, seed 0): floats standard normal, indices, lengths and labels valid for the op
that reads them (see placer/runtime/inputs.py).

  placer run placed.pbtxt --init-net init.pbtxt --input data=1,3,224,224 --emulate-gpu
  placer run placed4.pbtxt --init-net placed4_init.pbtxt --emulate-gpus 4
  placer run net.prototxt --iterations 10 --record run.json --outputs out.npz
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_arguments(parser)
    feed = parser.add_mutually_exclusive_group()
    feed.add_argument("--inputs", metavar="X.npz", dest="inputs_npz",
                      help="input arrays keyed by blob name")
    feed.add_argument("--random-inputs", metavar="SEED", type=int, default=None,
                      help="random inputs from this seed (default when --inputs is not given: 0)")
    parser.add_argument("--iterations", type=int, default=1, metavar="N",
                        help="timed runs; each op's time is the median (default 1)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="untimed runs first (default 1)")
    emulate = parser.add_mutually_exclusive_group()
    emulate.add_argument("--emulate-gpu", action="store_true",
                         help="run GPU ops on tagged numpy arrays, as many GPUs as the net names "
                              "(no GPU needed; CPU timings)")
    emulate.add_argument("--emulate-gpus", type=int, metavar="N",
                         help="emulate exactly N GPUs, cuda:0..N-1; an op placed beyond them is an error")
    parser.add_argument("--seed", type=int, default=0, help="seed of random fills in the init net")
    parser.add_argument("--outputs", metavar="OUT.npz", help="write the external outputs here")
    parser.add_argument("--record", metavar="RUN.json", help="write the RunRecord here")
    parser.add_argument("--trace", metavar="TRACE.json",
                        help="write the measured timeline as a Chrome trace (opens in Perfetto)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="BLAS threads for CPU kernels (1 gives stable times on a shared host)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no table")


def run(args: argparse.Namespace) -> int:
    if args.iterations < 1 or args.warmup < 0:
        raise InputError("--iterations must be >= 1 and --warmup >= 0")
    if args.emulate_gpus is not None and args.emulate_gpus < 1:
        raise InputError(f"--emulate-gpus {args.emulate_gpus}: emulate at least one GPU")
    for out in (args.outputs, args.record, args.trace):
        if out:
            refuse_overwrite(out, args.net, args.init_net, args.inputs_npz)
    if args.threads is not None:
        if args.threads < 1:
            raise InputError("--threads must be >= 1")
        if not set_blas_threads(args.threads):
            print("placer: warning: could not set the BLAS thread count here; "
                  f"set OPENBLAS_NUM_THREADS={args.threads} before starting", file=sys.stderr)
    if args.random_inputs is not None and args.random_inputs < 0:
        raise InputError(f"--random-inputs {args.random_inputs}: the seed must be >= 0")
    typed = load_typed_net(args)
    net = typed.net
    executor = Executor(net, emulate_gpu=args.emulate_gpu, emulate_gpus=args.emulate_gpus, seed=args.seed)
    _require_memory(typed, args)  # before the init net fills anything
    executor.run_init()
    names = executor.expected_inputs()
    inputs = _read_npz(args.inputs_npz) if args.inputs_npz else random_inputs(
        net, typed.blobs, names, seed=args.random_inputs or 0)
    executor.input_types.update({n: t for n in names if (t := typed.blobs.get(n)) is not None})
    if not args.inputs_npz:
        executor.input_types.update({n: TensorType(a.shape, str(a.dtype)) for n, a in inputs.items()})
    total = (args.warmup + args.iterations) * len(net.ops)
    with Progress(total, "run", quiet=args.quiet) as bar:
        outputs = executor.run(inputs, iterations=args.iterations, warmup=args.warmup,
                               progress=lambda done, _total: bar.update(done))
    rec = executor.record
    if not args.quiet:
        print(format_table(rec))
    if args.outputs:
        buf = io.BytesIO()
        np.savez(buf, **outputs)
        atomic_write_bytes(args.outputs, buf.getvalue())
    if args.record:
        run_record.save(rec, args.record)
    if args.trace:
        from placer.report.trace import write_trace
        write_trace(None, args.trace, run=run_record.to_dict(rec))
    return 0


def _require_memory(typed, args) -> None:
    """Refuse, with both figures, a run whose parameters, inputs and live activations do
    not fit in this machine's memory (see placer/runtime/footprint.py)."""
    net = typed.net
    # an emulated GPU's blobs are host memory too; a real GPU's are not
    on_host = None if args.emulate_gpu else {op.index for op in net.ops if op.device is None or not op.device.is_gpu}
    need = run_footprint(typed, net.data_inputs, random_inputs=not args.inputs_npz, host_only=on_host)
    require_memory(need, f"running {args.net}", hint="give smaller shapes with --input (a smaller batch)")


NPZ_HINT = "give an .npz written by numpy.savez, keyed by blob name"
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz, after its headers say they fit in memory (a header can claim
    any shape; numpy allocates the whole array before reading a byte of it)."""
    declared = _npz_bytes(path)
    require_memory(Footprint((("arrays", declared),)), f"reading {path}", hint="feed smaller arrays")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read input arrays ({e})", hint=NPZ_HINT) from e


def _npz_bytes(path: str) -> int:
    """Bytes of the arrays an .npz declares, from the .npy headers alone."""
    total = 0
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = _NPY_HEADER_READERS.get(version)
                    if read_header is None:
                        raise ValueError(f"member {info.filename}: .npy format {version} is not read here")
                    shape, _, dtype = read_header(f)
                    total += math.prod(shape) * dtype.itemsize
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read input arrays ({e})", hint=NPZ_HINT) from e
    return total


def format_table(rec: RunRecord) -> str:
    """Per-op times, then per device its time and peak memory, per link its bytes."""
    rows = [f"{'#':>4}  {'op':<28} {'type':<20} {'device':<16} {'ms':>9}  copy"]
    for o in rec.ops:
        copy = f"{o.copy_bytes:,} B {o.copy_direction}" if o.copy_direction else ""
        rows.append(f"{o.index:>4}  {(o.name or '-')[:28]:<28} {o.type[:20]:<20} {o.device:<16} "
                    f"{o.time_s * 1e3:>9.3f}  {copy}")
    rows.append(f"total {rec.total_s * 1e3:.3f} ms (median of {rec.iterations} run(s) "
                f"after {rec.warmup} warm-up) over {len(rec.ops)} ops")
    times = rec.time_by_device_s()
    for dev in rec.devices:
        rows.append(f"  {rec.timing_labels.get(dev, dev)}: {times.get(dev, 0.0) * 1e3:.3f} ms, "
                    f"peak {fmt_bytes(rec.peak_bytes.get(dev, 0))}")
    for direction in ("h2d", "d2h", "d2d"):
        if rec.copy_bytes(direction):
            rows.append(f"  copies {direction}: {rec.copy_bytes(direction):,} B")
    rows += _link_rows(rec)
    if rec.emulated:
        rows.append("  GPU emulated on the CPU: times are CPU times (a structure check, not a speed figure)")
    return "\n".join(rows)


def _link_rows(rec: RunRecord) -> list[str]:
    """One row per link and direction: copies, bytes, and the time of the copies that used
    only that link (an op moving over several links is counted in bytes, not in time)."""
    links: dict[tuple[str, str], list] = {}
    for o in rec.ops:
        for src, dst, nbytes in o.links:
            row = links.setdefault((src, dst), [0, 0, 0.0])
            row[0] += 1
            row[1] += nbytes
            row[2] += o.time_s if len(o.links) == 1 else 0.0
    return [f"  link {src} -> {dst}: {n} cop{'y' if n == 1 else 'ies'}, {fmt_bytes(nbytes)}, {t * 1e3:.3f} ms"
            for (src, dst), (n, nbytes, t) in sorted(links.items())]
