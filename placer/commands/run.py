"""``placer run``: execute a (placed) net and time every op."""
from __future__ import annotations

import argparse
import io
import sys

import numpy as np

from placer import arguments
from placer.commands.common import add_net_arguments, load_typed_net
from placer.commands.run_ray import run_command
from placer.commands.shard_manifest import sharding_notes
from placer.errors import InputError
from placer.fileio import atomic_write_bytes, refuse_outputs
from placer.ops import cudnn_conv
from placer.ops.int8_base import Int8Tensor
from placer.progress import Progress
from placer.report.tables import run_table
from placer.report.trace import write_trace
from placer.runtime import record as run_record
from placer.runtime.devices import check_emulated_gpus
from placer.runtime.executor import Executor
from placer.runtime.footprint import Footprint, require_memory, run_footprint
from placer.runtime.inputs import NpzBatches, RandomBatches, npz_files, random_inputs, read_npz, require_npz_fits
from placer.runtime.state import loss_blobs, save_trained_init
from placer.runtime.threads import set_blas_threads
from placer.types import TensorType

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
that reads them (see placer/runtime/inputs.py). Fed arrays set the shapes: the net runs
at their batch (and spatial size, where its weights allow) whatever value_info.json
declares, with a note on stderr; a shape the weights contradict is refused.

A train net (one that updates what its init net makes: parameters, optimizer state, the
iteration counter) trains: every iteration is one step from the state the previous one
left, and the loss is printed every --print-every steps (the loss: --loss, by default the
blobs the backward pass is seeded from, <loss>_autogen_grad). Warm-up iterations train a
copy of the state that is then dropped, so the parameters after --iterations N are those
after exactly N steps. Each step gets its own batch: --inputs takes several .npz files or
a folder of them (used in name order, cycled), and --random-inputs SEED draws step k's
batch from (SEED, k). --save-init writes the trained state as an init net (GivenTensor
fills; .pb binary, else text).

  placer run placed.pbtxt --init-net init.pbtxt --input data=1,3,224,224 --emulate-gpu
  placer run placed4.pbtxt --init-net placed4_init.pbtxt --emulate-gpus 4
  placer run net.prototxt --iterations 10 --record run.json --outputs out.npz
  placer run train_net.pbtxt --init-net train_init_net.pbtxt --inputs batches/ \\
      --iterations 100 --print-every 10 --save-init trained_init.pb

A cluster plan (placer plan NET --cluster C -o OUTDIR) runs on Ray, one worker per host:
--ray alone starts a local Ray instance that stands in for the cluster; --ray auto joins
the running cluster (ray start --head / ray start --address=...). See README "Many hosts".

  placer run OUTDIR --ray --emulate-gpu --random-inputs 0 --outputs out.npz
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_net_arguments(parser)
    feed = parser.add_mutually_exclusive_group()
    feed.add_argument("--inputs", metavar="X.npz", dest="inputs_npz", nargs="+",
                      help="input arrays keyed by blob name; several files or a folder of .npz "
                           "files: one per step, in order, cycled")
    feed.add_argument("--random-inputs", metavar="SEED", type=arguments.count(0), default=None,
                      help="random inputs from this seed (default when --inputs is not given: 0); "
                           "on a train net, step k's batch is drawn from (SEED, k)")
    parser.add_argument("--iterations", type=arguments.count(1), default=1, metavar="N",
                        help="timed runs; each op's time is the median (default 1)")
    parser.add_argument("--warmup", type=arguments.count(0), default=1, metavar="N",
                        help="untimed runs first (default 1)")
    emulate = parser.add_mutually_exclusive_group()
    emulate.add_argument("--emulate-gpu", action="store_true",
                         help="run GPU ops on tagged numpy arrays, as many GPUs as the net names "
                              "(no GPU needed; CPU timings)")
    emulate.add_argument("--emulate-gpus", type=arguments.count(1), metavar="N",
                         help="emulate exactly N GPUs, cuda:0..N-1; an op placed beyond them is an error")
    parser.add_argument("--inject-copies", action="store_true",
                        help="insert the copies between devices the net's own device options need, as "
                             "Caffe2's core.InjectCrossDeviceCopies does (a net whose ops name devices "
                             "but that has no copy ops)")
    parser.add_argument("--seed", type=arguments.count(0), default=0, help="seed of random fills in the init net")
    parser.add_argument("--outputs", metavar="OUT.npz",
                        help="write the external outputs here (an Int8 output: its uint8 data, "
                             "NAME__scale, NAME__zero_point)")
    parser.add_argument("--record", metavar="RUN.json", help="write the RunRecord here")
    parser.add_argument("--trace", metavar="TRACE.json",
                        help="write the measured timeline as a Chrome trace (opens in Perfetto)")
    parser.add_argument("--threads", type=arguments.count(1, arguments.MAX_THREADS), metavar="N",
                        help="BLAS threads for CPU kernels (1 gives stable times on a shared host)")
    parser.add_argument("--loss", metavar="BLOB", action="append", default=None,
                        help="blob printed after each step (repeatable; default on a train net: "
                             "its loss, from the <loss>_autogen_grad seed)")
    parser.add_argument("--print-every", type=arguments.count(1), default=1, metavar="K",
                        help="print the loss every K steps (default 1)")
    parser.add_argument("--save-init", metavar="INIT.pb",
                        help="write the state after the run (trained parameters, optimizer state, "
                             "iteration counter) as an init net: .pb binary, else text")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table, no loss lines")
    ray = parser.add_argument_group("cluster plans (NET is the OUTDIR of placer plan --cluster)")
    ray.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                     help="run every worker as a Ray actor: no ADDRESS starts a local Ray instance, "
                          "'auto' joins the running cluster")
    ray.add_argument("--max-restarts", type=arguments.count(0), default=0, metavar="N",
                     help="with --ray: after a worker dies, start every worker again, up to N times (default 0)")


def run(args: argparse.Namespace) -> int:
    check_emulated_gpus(args.emulate_gpus)
    files = npz_files(args.inputs_npz) if args.inputs_npz else []
    for path in files:  # before their shapes type the net
        require_npz_fits(path)
    _check_outputs(args, files)
    if args.threads is not None:
        if not set_blas_threads(args.threads):
            print("placer: warning: could not set the BLAS thread count here; "
                  f"set OPENBLAS_NUM_THREADS={args.threads} before starting", file=sys.stderr)
    if args.ray is not None:
        if args.inject_copies:
            raise InputError("--inject-copies: a cluster plan has its copies already", hint="drop --inject-copies")
        return run_command(args)
    typed = load_typed_net(args)
    _check_outputs(args, files)  # again: against the init net and value_info.json found beside NET
    net = typed.net
    if not args.quiet:
        for note in sharding_notes(args.net):     # a net placer shard -o wrote: how it differs from the plan
            print(f"placer: note: {note}")
    init_netdef = _init_netdef(net) if args.save_init else None
    executor = Executor(net, emulate_gpu=args.emulate_gpu, emulate_gpus=args.emulate_gpus, seed=args.seed)
    _require_memory(typed, args)  # before the init net fills anything
    executor.run_init()
    trains = bool(executor.state_names)
    names = executor.expected_inputs()
    inputs = _batches(args, files, executor, typed, trains)
    executor.input_types.update({n: t for n in names if (t := typed.blobs.get(n)) is not None})
    if not files:
        first = inputs(0) if callable(inputs) else inputs
        executor.input_types.update({n: TensorType(a.shape, str(a.dtype)) for n, a in first.items()})
    watch = args.loss if args.loss is not None else (loss_blobs(net) if trains else [])
    if trains and not watch and not args.quiet:
        print("placer: note: no loss found (no <loss>_autogen_grad seed); give --loss BLOB to print one")
    total = (args.warmup + args.iterations) * len(net.ops)
    with Progress(total, "run", quiet=args.quiet) as bar:
        show = None if args.quiet or not watch else _loss_printer(bar, args.print_every, args.iterations)
        outputs = executor.run(inputs, iterations=args.iterations, warmup=args.warmup,
                               progress=lambda done, _total: bar.update(done), watch=watch, on_step=show)
    rec = executor.record
    if not args.quiet:
        print(run_table(rec))
        line = conv_engine_line(op.label for op in net.ops)
        if line:
            print(line)
        if trains:
            print(f"trained {args.iterations} step(s)"
                  + (f"; the {args.warmup} warm-up run(s) trained a copy of the state, then dropped"
                     if args.warmup else ""))
    if args.save_init:
        save_trained_init(args.save_init, init_netdef, executor.host_state())
        if not args.quiet:
            print(f"wrote {args.save_init}")
    if args.outputs:
        buf = io.BytesIO()
        np.savez(buf, **npz_arrays(outputs))
        atomic_write_bytes(args.outputs, buf.getvalue())
    if args.record:
        run_record.save(rec, args.record)
    if args.trace:
        write_trace(None, args.trace, run=run_record.to_dict(rec))
    return 0


def conv_engine_line(labels) -> str | None:
    """One line saying which engine ran the convolutions among the ops ``labels`` (None:
    no convolution ran), with the reasons for any fallback on a GPU and, when cuDNN is
    missing there, how to get it."""
    engines, reasons = cudnn_conv.engine_counts(labels)
    parts = []
    if engines[cudnn_conv.CUDNN] or engines[cudnn_conv.MATMUL]:
        part = (f"cuDNN (cupyx.cudnn) for {engines[cudnn_conv.CUDNN]} op(s), "
                f"matmul fallback for {engines[cudnn_conv.MATMUL]}")
        if reasons:
            part += " (" + "; ".join(f"{n}: {why}" for why, n in reasons.most_common(3)) + ")"
        if any(why.startswith(cudnn_conv.NO_CUDNN) for why in reasons):
            part += "; " + cudnn_conv.HOW_TO_GET
        parts.append(part)
    if engines[cudnn_conv.NUMPY]:
        parts.append(f"matmul decomposition (numpy) for {engines[cudnn_conv.NUMPY]} op(s)")
    return "convolutions: " + ", ".join(parts) if parts else None


def _check_outputs(args, files) -> None:
    """No output is an input (named, or read so far), no two outputs are one file."""
    refuse_outputs({"--outputs": args.outputs, "--record": args.record, "--trace": args.trace,
                    "--save-init": args.save_init}, args.net, args.init_net, *files)


def _batches(args, files, executor, typed, trains):
    """One batch for every step, or a batch per step (several files; random on a train net)."""
    if files:
        batches = NpzBatches(files, read_npz)
        return batches if len(files) > 1 else batches(0)
    seed = args.random_inputs or 0
    names = executor.expected_inputs()
    if trains:
        return RandomBatches(typed.net, typed.blobs, names, seed)
    return random_inputs(typed.net, typed.blobs, names, seed=seed)


def _loss_printer(bar: Progress, every: int, iterations: int):
    """``on_step`` that prints the watched blobs every ``every`` steps (and the last step)."""
    def show(step: int, values: dict) -> None:
        if step % every and step != iterations:
            return
        if bar.enabled:
            bar.stream.write("\r\x1b[K")
        shown = "  ".join(f"{name} {_scalar_text(v)}" for name, v in values.items())
        print(f"step {step}: {shown}", flush=True)
    return show


def _scalar_text(value: np.ndarray) -> str:
    return f"{float(value.reshape(-1)[0]):.6g}" if value.size == 1 else f"mean {float(value.mean()):.6g}"


def _init_netdef(net):
    if net.init_proto is None:
        raise InputError("--save-init needs the net's init net: give --init-net")
    return net.init_proto


def _require_memory(typed, args) -> None:
    """Refuse, with both figures, a run whose parameters, inputs and live activations do
    not fit in this machine's memory (see placer/runtime/footprint.py)."""
    net = typed.net
    # an emulated GPU's blobs are host memory too; a real GPU's are not
    on_host = None if args.emulate_gpu else {op.index for op in net.ops if op.device is None or not op.device.is_gpu}
    need = run_footprint(typed, net.data_inputs, random_inputs=not args.inputs_npz, host_only=on_host)
    if args.warmup and (on_host is None or on_host == {op.index for op in net.ops}):
        copy = _written_state_bytes(typed)  # a train net's warm-ups train a copy of its state
        need = Footprint(need.held + (("the warm-up's copy of the state", copy),), need.phases)
    require_memory(need, f"running {args.net}", hint="give smaller shapes with --input (a smaller batch)")


def _written_state_bytes(typed) -> int:
    """Bytes of the blobs the init net makes and the net writes (a train net's state)."""
    net = typed.net
    made = {o for op in net.init_proto.op for o in op.output} if net.init_proto is not None else set()
    written = {o for op in net.ops for o in op.outputs}
    return sum(typed.blobs[b].nbytes for b in made & written if typed.blobs.get(b) is not None)


def npz_arrays(outputs: dict) -> dict:
    """The arrays ``--outputs`` saves: a quantized (Int8) output as its uint8 data under its
    name, with ``<name>__scale`` (float32) and ``<name>__zero_point`` (int32) beside it."""
    arrays = {}
    for name, value in outputs.items():
        if isinstance(value, Int8Tensor):
            arrays[name] = np.asarray(value.data)
            arrays[f"{name}__scale"] = np.float32(value.scale)
            arrays[f"{name}__zero_point"] = np.int32(value.zero_point)
        else:
            arrays[name] = value
    return arrays
