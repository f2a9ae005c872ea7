"""``placer convert``: a Caffe prototxt (and .caffemodel), or an ONNX model, to Caffe2
predict and init nets."""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from placer.commands.common import INPUT_FORMAT, parse_input_specs
from placer.errors import InputError, PlacerError
from placer.fileio import OutputDir
from placer.formats import VALUE_INFO, save_value_info
from placer.formats.caffe2 import read_file_bytes, save_netdef
from placer.formats.convert import convert_caffe
from placer.formats.onnx import convert_onnx, looks_like_onnx
from placer.training.solver import save_solver_nets, solver_nets_for_convert
from placer.units import fmt_bytes

DESCRIPTION = """\
Convert a Caffe net (V2 `layer`, V1 `layers` or V0 prototxt) to Caffe2 NetDefs the way
Caffe2's own translator mapped layers to ops, or an ONNX model the way Caffe2's ONNX
backend mapped nodes to ops, and write OUTDIR/predict_net.pbtxt and OUTDIR/init_net.pbtxt
(with --binary also the .pb files; an ONNX model's init net is always written as
init_net.pb, its initializers as GivenTensor*Fill ops). OUTDIR is written whole and moved
into place: it must be new, empty or a previous conversion (OUTDIR/manifest.json lists the
files placer wrote there).

The input shapes the file gives (an Input layer, input_shape, input_dim, a data layer's
parameters), completed or replaced by --input, go to OUTDIR/value_info.json in the
Caffe2 model-zoo form {"data": [1, [1, 3, 224, 224]]} (data type, shape), where placer
and Caffe2's model tools look for them: `placer plan OUTDIR/predict_net.pbtxt` then
needs no --input.

The init net fills every parameter: the .caffemodel values with --weights, else seeded
random fills chosen from each layer's filler. SSD's fork layers (PriorBox, Permute, ...)
and layers with no Caffe2 op (Python, ...) are kept as ops of their Caffe type; the
latter are listed.

An ONNX model's symbolic dimensions (a batch named N) take 1, or the size --input gives;
its constant subgraphs (Shape -> Gather -> Concat -> Reshape) are folded, so the NetDef has
static shapes, and value_info.json records the inputs' shapes and types.

example:
  placer convert deploy.prototxt --weights net.caffemodel -o converted/
  placer convert resnet50.onnx --input input=8,3,224,224 -o resnet50/
  placer convert train_val.prototxt --phase train --input data=32,3,224,224 -o out/
  placer convert train_val.prototxt --solver solver.prototxt --input data=32,3,227,227 -o out/
"""


# Above this many weight values the init net is written binary only: text costs about
# 21 bytes and 4 us per value (protobuf text_format, measured), binary 5 bytes and ~0.
TEXT_INIT_MAX_VALUES = 2_000_000
OUTPUT_KIND = "convert"   # OUTDIR/manifest.json's placer_output field


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("net", metavar="PROTOTXT|MODEL.onnx", help="Caffe net definition (.prototxt) or ONNX model")
    parser.add_argument("--weights", metavar="X.caffemodel",
                        help="trained weights; without it parameters get seeded random fills")
    parser.add_argument("--phase", choices=("test", "train"), default="test",
                        help="Caffe include/exclude phase to keep (default: test)")
    parser.add_argument("--input", metavar=INPUT_FORMAT, dest="inputs", action="append", default=[],
                        help="shape of an input the file leaves open (e.g. a Data layer's "
                             "channels), e.g. --input data=50,3,227,227; repeatable")
    parser.add_argument("-o", "--output", metavar="OUTDIR", required=True,
                        help="folder for predict_net.pbtxt and init_net.pbtxt")
    parser.add_argument("--binary", action="store_true",
                        help="also write predict_net.pb and init_net.pb")
    parser.add_argument("--solver", metavar="SOLVER.prototxt",
                        help="also write the Caffe2 train net of this Caffe solver (TRAIN phase): "
                             "train_net.pbtxt, train_init_net.pbtxt (update_net.pbtxt with iter_size > 1)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise PlacerError(f"{out}: -o takes a folder, and this is a file",
                          hint="give a folder name; it is created when missing")
    folder = OutputDir(out, "-o", OUTPUT_KIND, inputs=(args.net, args.weights, args.solver))
    user_shapes = parse_input_specs(args.inputs)
    data = read_file_bytes(args.net)
    if looks_like_onnx(data, args.net):
        return _run_onnx(args, folder, user_shapes, data)
    solver_nets = None
    if args.solver:
        solver_nets = solver_nets_for_convert(args.net, args.solver, out, args.weights,
                                              user_shapes, args.binary)
    result = convert_caffe(args.net, phase=args.phase, weights=args.weights, input_shapes=user_shapes)
    _check_input_names(args.net, user_shapes, result)
    values = sum(len(a.floats) for op in result.init.op for a in op.arg if a.name == "values")
    text_init = values <= TEXT_INIT_MAX_VALUES
    names = ["predict_net.pbtxt"]
    if text_init:
        names.append("init_net.pbtxt")
    else:
        result.notes.append(f"the init net holds {values:,} weight values: written binary only "
                            f"(as text it would take ~{fmt_bytes(values * 21)} and minutes)")
    if args.binary:
        names.append("predict_net.pb")
    if args.binary or not text_init:
        names.append("init_net.pb")
    written = []
    with folder:
        for name in names:
            netdef = result.predict if name.startswith("predict") else result.init
            written.append(folder.shown(save_netdef(netdef, folder.path(name), binary=name.endswith(".pb"))))
        if solver_nets is not None:
            written += map(folder.shown, save_solver_nets(solver_nets, folder.tmp, args.binary))
            result.notes += [f"train net ({args.solver}): {note}" for note in solver_nets.notes]
        written.append(folder.shown(save_value_info(result.input_shapes, folder.path(VALUE_INFO))))
        folder.write_manifest({"source": str(args.net), "weights": args.weights})
    _print_summary(args, result, written)
    return 0


def _run_onnx(args: argparse.Namespace, folder: OutputDir, user_shapes, data: bytes) -> int:
    for option, value in (("--weights", args.weights), ("--solver", args.solver),
                          ("--phase", None if args.phase == "test" else args.phase)):
        if value:
            raise PlacerError(f"{option} applies to Caffe nets; {args.net} is an ONNX model",
                              hint="an ONNX model carries its weights; convert it, then `placer train-net` "
                                   "makes a train net")
    result = convert_onnx(args.net, user_shapes, data)
    names = ["predict_net.pbtxt", "init_net.pb"] + (["predict_net.pb"] if args.binary else [])
    written = []
    with folder:
        for name in names:
            netdef = result.predict if name.startswith("predict") else result.init
            written.append(folder.shown(save_netdef(netdef, folder.path(name), binary=name.endswith(".pb"))))
        written.append(folder.shown(save_value_info(result.input_shapes, folder.path(VALUE_INFO))))
        folder.write_manifest({"source": str(args.net), "weights": None})
    ops = Counter(op.type for op in result.predict.op)
    print(f"converted {args.net} (ONNX opset {result.opset}, {result.node_count} nodes): "
          f"{len(result.predict.op)} ops, {len(result.param_shapes)} parameters (the model's initializers)")
    print("  ops: " + ", ".join(f"{t} {n}" for t, n in ops.most_common()))
    print("  input shapes: " + ", ".join(f"{b} {t}" for b, t in result.input_shapes.items()))
    for note in result.notes:
        print(f"  note: {note}")
    for path in written:
        print(f"wrote {path}")
    return 0


def _check_input_names(path, user_shapes, result) -> None:
    """An --input that names no external input of the converted net is a typo: say so."""
    inputs = [b for b in result.predict.external_input if b not in result.param_shapes]
    for name in user_shapes:
        if name not in inputs:
            raise InputError(f"--input {name}=...: {path} has no input blob '{name}' "
                             f"(its inputs: {', '.join(inputs[:8]) or 'none'})")


def _print_summary(args, result, written) -> None:
    ops = Counter(op.type for op in result.predict.op)
    source = f"values from {args.weights}" if args.weights else "seeded random fills"
    print(f"converted {args.net} (phase {args.phase}): {len(result.predict.op)} ops, "
          f"{len(result.param_shapes)} parameters ({source})")
    print("  ops: " + ", ".join(f"{t} {n}" for t, n in ops.most_common()))
    if result.input_shapes:
        print("  input shapes: " + ", ".join(f"{b} {t}" for b, t in result.input_shapes.items()))
    if result.unknown_layers:
        kinds = Counter(t for _, t in result.unknown_layers)
        print("  kept as unknown ops (no Caffe2 mapping): "
              + ", ".join(f"{t} {n}" for t, n in kinds.most_common()))
    for note in result.notes:
        print(f"  note: {note}")
    for path in written:
        print(f"wrote {path}")
