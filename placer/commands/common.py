"""Arguments every command that reads a net shares, and the one call that loads it typed."""
from __future__ import annotations

import argparse
import re
import sys
import time
from contextlib import contextmanager, nullcontext

import numpy as np

from placer import arguments
from placer.errors import InputError, ShapeError
from placer.formats import load_net, value_info_paths
from placer.rewrite.netdef import inject_copies
from placer.runtime.inputs import fed_type, npz_files, npz_types
from placer.shapes import infer, require_complete
from placer.types import MAX_ELEMENTS, shape_problem
from placer.types import DTYPE_TO_DATA_TYPE, TensorType, TypedNet

INPUT_FORMAT = "NAME=d0,d1,...[:dtype]"
# Caffe2 TensorProto data types a fed blob can have (string tensors are not fed from here).
TENSOR_DTYPES = tuple(d for d in DTYPE_TO_DATA_TYPE if d != "object")
# 2^63 - 1 has 19 digits: a longer dimension cannot be a Caffe2 size.
MAX_DIM_DIGITS = len(str(2**63 - 1))
_DTYPE_SUFFIX = re.compile(r"^(?P<dims>.*?)(?::(?P<dtype>[A-Za-z][A-Za-z0-9_]*))?$")


def add_net_arguments(parser: argparse.ArgumentParser) -> None:
    """NET, --init-net, --input (repeatable), --phase, --weights."""
    parser.add_argument("net", metavar="NET",
                        help="the predict net: Caffe2 NetDef (.pbtxt text or .pb binary, "
                             "sniffed from the content), Caffe .prototxt, or ONNX model (.onnx)")
    parser.add_argument("--init-net", metavar="INIT", dest="init_net",
                        help="Caffe2 init net that fills the parameters (gives their shapes)")
    parser.add_argument("--input", metavar=INPUT_FORMAT, dest="inputs", action="append",
                        default=[],
                        help="shape (and dtype, default float32) of a blob the file does not "
                             "give, e.g. --input data=1,3,224,224; repeatable")
    parser.add_argument("--phase", choices=("test", "train"), default="test",
                        help="Caffe include/exclude phase to keep (default: test)")
    parser.add_argument("--weights", metavar="X.caffemodel",
                        help="Caffe weights for a .prototxt net")
    parser.add_argument("--proposals", type=arguments.count(1), metavar="N",
                        help="price N region proposals (rows over the batch) where a detection net's "
                             "count depends on the data (default: the bound its arguments allow, "
                             "e.g. post_nms_topN per image)")
    parser.add_argument("--detections", type=arguments.count(1), metavar="N",
                        help="price N detections (rows over the batch) out of BoxWithNMSLimit "
                             "(default: the bound, detections_per_im per image)")


# The op types whose own outputs --proposals and --detections cut (shapes.infer ``counts``).
PROPOSAL_OPS = ("GenerateProposals", "CollectAndDistributeFpnRpnProposals", "CollectRpnProposals",
                "DistributeFpnProposals")
DETECTION_OPS = ("BoxWithNMSLimit",)


def data_dependent_counts(args: argparse.Namespace) -> dict[str, int]:
    """``shapes.infer``'s ``counts`` from --proposals and --detections."""
    counts: dict[str, int] = {}
    for option, types in (("proposals", PROPOSAL_OPS), ("detections", DETECTION_OPS)):
        n = getattr(args, option, None)
        if n is not None:
            counts.update(dict.fromkeys(types, int(n)))
    return counts


def image_info_shape(net, shapes: dict[str, TensorType]) -> dict[str, TensorType]:
    """A detection net's ``im_info`` (N, 3: height, width, scale) from its 4-D ``data``
    input when neither the user nor the file gives it (``--input im_info=...`` wins)."""
    data = shapes.get("data", net.input_shapes.get("data"))
    if ("im_info" in net.data_inputs and "im_info" not in shapes and "im_info" not in net.input_shapes
            and data is not None and data.ndim == 4):
        return {"im_info": TensorType((data.shape[0], 3), "float32")}
    return {}


def parse_input_spec(spec: str) -> tuple[str, TensorType]:
    """``"data=1,3,224,224:float32"`` -> ``("data", TensorType((1, 3, 224, 224), "float32"))``.

    An empty dimension list (``"step="``) is a scalar.
    """
    name, eq, rest = spec.partition("=")
    name = name.strip()
    if not eq or not name:
        raise InputError(f"--input '{spec}': expected {INPUT_FORMAT}, e.g. data=1,3,224,224")
    m = _DTYPE_SUFFIX.match(rest.strip())
    dims_text, dtype = m.group("dims"), m.group("dtype") or "float32"
    dtype = _tensor_dtype(spec, dtype)
    dims = []
    for d in (x.strip() for x in dims_text.split(",")) if dims_text.strip() else ():
        if not (d.isascii() and d.isdigit()):
            raise InputError(f"--input '{spec}': dimension '{d}' is not a non-negative integer "
                             f"(expected {INPUT_FORMAT}, e.g. data=1,3,224,224)")
        if len(d.lstrip("0")) > MAX_DIM_DIGITS:  # read before int(): Python refuses 4300+ digits
            raise InputError(f"--input {name}=...: dimension {d[:12]}... ({len(d)} digits) is larger than "
                             "int64 can count (2^63 - 1)", hint="give the blob's real size")
        dims.append(int(d))
    problem = shape_problem(dims)
    if problem:
        raise InputError(f"--input '{spec}': {problem}")
    return name, TensorType(tuple(dims), dtype)


def _tensor_dtype(spec: str, name: str) -> str:
    """A numpy dtype name that is also a Caffe2 TensorProto type (no complex, dates, text)."""
    try:
        dtype = str(np.dtype(name))
    except TypeError:
        raise InputError(f"--input '{spec}': unknown dtype '{name}' "
                         f"(use a numpy name: {', '.join(TENSOR_DTYPES)})") from None
    if dtype not in TENSOR_DTYPES:
        raise InputError(f"--input '{spec}': dtype '{name}' is not a Caffe2 tensor type "
                         f"(use one of {', '.join(TENSOR_DTYPES)})")
    return dtype


def parse_input_specs(specs: list[str]) -> dict[str, TensorType]:
    shapes: dict[str, TensorType] = {}
    for spec in specs or ():
        name, t = parse_input_spec(spec)
        shapes[name] = t
    return shapes


class StageClock:
    """Wall and CPU seconds per named stage of a command: ``with clock("parse"): ...``; a
    stage entered twice adds up. ``--timings`` prints them (stage by stage, then the
    total); on a busy host the CPU seconds are the steadier figure."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}  # stage -> [wall s, cpu s]

    @contextmanager
    def __call__(self, stage: str):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            spent = self.seconds.setdefault(stage, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu

    def print(self, out=None) -> None:
        out = out or sys.stderr
        rows = [*self.seconds.items(), ("total", [sum(s[k] for s in self.seconds.values()) for k in (0, 1)])]
        for stage, (wall, cpu) in rows:
            print(f"timing: {stage:<10} {wall:8.3f} s wall {cpu:8.3f} s cpu", file=out)


def add_feed_argument(parser: argparse.ArgumentParser) -> None:
    """--inputs X.npz for commands that only need the shapes of what will be fed."""
    parser.add_argument("--inputs", metavar="X.npz", dest="inputs_npz",
                        help="take the input shapes from the arrays of this .npz (as placer run "
                             "--inputs feeds them; only the headers are read); --input wins")


def load_typed_net(args: argparse.Namespace, complete: bool = False,
                   clock=lambda stage: nullcontext()) -> TypedNet:
    """Load ``args.net`` (with init net / weights / phase) and infer its shapes with the
    user's shapes: ``--input``, then the arrays of ``--inputs`` (the first .npz). A name
    that is no blob of the net is an error. With ``args.inject_copies`` (``placer run
    --inject-copies``) the net gets the copies its own device options need first
    (``placer.rewrite.netdef.inject_copies``).

    The shapes a file declares (value_info.json beside a Caffe2 net) are defaults, as in
    Caffe and Caffe2: shapes given here replace them, with a note on stderr (none with
    ``--quiet``), and every other blob is inferred again from them (batch, and spatial
    size where the net allows). A shape the net cannot run at (a channel count or rank
    that contradicts the weights) is a ShapeError naming the blob, both shapes and the op.

    With ``complete``, a blob some op needs but whose shape is unknown is a ShapeError
    naming the blobs and the options that supply them; otherwise the gaps are left in
    ``TypedNet.missing`` (``inspect`` lists them). ``clock`` times the "parse" and
    "shapes" stages (see ``StageClock``).
    """
    shapes = parse_input_specs(getattr(args, "inputs", []))
    fed, fed_from = _fed_types(args)
    with clock("parse"):
        net = load_net(args.net, init_path=getattr(args, "init_net", None),
                       phase=getattr(args, "phase", "test"), weights=getattr(args, "weights", None),
                       input_shapes={**fed, **shapes})
        if getattr(args, "inject_copies", False):
            net = inject_copies(net)
    if net.source_format == "onnx":  # the model declares its inputs' dtypes; --input gives sizes
        shapes = {n: TensorType(t.shape, net.input_shapes[n].dtype) if n in net.input_shapes else t
                  for n, t in shapes.items()}
    known = set(net.external_inputs) | set(net.params) | set(net.input_shapes)
    known.update(b for op in net.ops for b in (*op.inputs, *op.outputs))
    for name in shapes:
        if name not in known:
            some = ", ".join(net.data_inputs[:5]) or "none"
            raise InputError(f"--input {name}=...: the net has no blob '{name}' "
                             f"(its external inputs include: {some})")
    given_by = dict.fromkeys(shapes, "--input")
    for name, t in fed.items():  # arrays the net does not read are not fed (placer run ignores them)
        if name in known and name not in net.params and name not in shapes:
            shapes[name] = fed_type(net, name, t, net.input_shapes.get(name), fed_from)
            given_by[name] = fed_from
    changed = _changed_shapes(net, shapes, given_by)
    shapes.update(image_info_shape(net, shapes))
    with clock("shapes"):
        typed = _infer_at(net, shapes, changed, data_dependent_counts(args))
    if changed and not getattr(args, "quiet", False):
        print(f"placer: note: {changed}; the net's shapes are inferred from the given ones", file=sys.stderr)
    return require_complete(typed) if complete else typed


def _infer_at(net, shapes: dict[str, TensorType], changed: str, counts: dict[str, int] | None = None) -> TypedNet:
    """``infer`` at the given shapes; a ShapeError there names the shapes that changed."""
    try:
        typed = infer(net, shapes, counts)
    except ShapeError as e:
        if not changed:
            raise
        # the op's own reason, without the input types shapes.infer adds to it (they follow
        # from the shapes named first)
        reason = e.__cause__.message if isinstance(e.__cause__, ShapeError) else e.message
        raise ShapeError(f"{changed} cannot run: {reason}", e.hint or (
            "the weights fix all but the batch (and, where the net allows, the spatial size)")) from e
    _refuse_impossible_blobs(typed)
    return typed


def _fed_types(args: argparse.Namespace) -> tuple[dict[str, TensorType], str | None]:
    """The types of the arrays ``--inputs`` feeds (the first .npz of several), and its path."""
    given = getattr(args, "inputs_npz", None)
    if not given:
        return {}, None
    first = npz_files([given] if isinstance(given, str) else given)[0]
    return npz_types(first), str(first)


def _changed_shapes(net, shapes: dict[str, TensorType], given_by: dict[str, str]) -> str:
    """"'data' 4x1x28x28 from x.npz (value_info.json declares 64x1x28x28)" for each given
    shape that is not the declared one; empty when none differs."""
    dims = lambda t: "x".join(map(str, t.shape)) or "scalar"  # noqa: E731
    changed = [f"'{name}' {dims(t)} from {given_by[name]}" for name, t in shapes.items()
               if (declared := net.input_shapes.get(name)) is not None and declared.shape != t.shape]
    if not changed:
        return ""
    declared = ", ".join(dims(net.input_shapes[n]) for n, t in shapes.items()
                         if n in net.input_shapes and net.input_shapes[n].shape != t.shape)
    return f"{', '.join(changed)} ({_declared_by(net)} declares {declared})"


def _declared_by(net) -> str:
    """The file a net's input shapes come from: its value_info.json, else the net file."""
    if net.source_format.startswith("caffe2"):
        found = next((p for p in value_info_paths(net.path) if p.is_file()), None)
        if found is not None:
            return str(found)
    return str(net.path)


def _refuse_impossible_blobs(typed: TypedNet) -> None:
    """A blob with more elements than int64 counts cannot exist in Caffe2 (or numpy): name it
    and the op that makes it, rather than price or run it."""
    makers = {out: op for op in typed.net.ops for out in op.outputs}
    for name, t in typed.blobs.items():
        if t is not None and t.size > MAX_ELEMENTS:
            made = f" (made by op {makers[name].label})" if name in makers else ""
            raise ShapeError(f"{typed.net.path}: blob '{name}'{made}: {shape_problem(t.shape)}",
                             hint="give smaller shapes with --input, or fix the net's shapes")
