"""Net files in, ``Net`` out: ``load_net`` picks the reader from the file's content.

- Caffe2 NetDef, text or binary (``formats.caffe2``), with an optional init net (found
  beside the predict net under a conventional name when not given) and input shapes from
  a model-zoo ``value_info.json`` beside it;
- Caffe prototxt, ``layer {}`` / ``layers {}`` (read by ``formats.caffe``, converted to
  Caffe2 by ``formats.convert``), with optional ``.caffemodel`` weights;
- ONNX ModelProto (``formats.onnx``, converted to Caffe2 the way Caffe2's ONNX backend did).

The suffix is never trusted (binary NetDefs named ``.pbtxt`` exist); the content decides.

``value_info.json`` (the model zoo's ``{blob: [TensorProto data type, shape]}``) is read and
written here (``placer convert`` writes one beside the nets it makes), with the one rule for
a shape any file may give: no negative dimension, fewer than 2^63 elements (``shape_problem``).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from placer.documents import read_model
from placer.documents.value_info import ValueInfo
from placer.errors import NetParseError, PlacerError, ShapeError
from placer.fileio import atomic_write_text
from placer.formats.caffe2 import load_caffe2_net, looks_textual, read_file_bytes
from placer.formats.convert import load_caffe_net
from placer.formats.onnx import load_onnx_net, looks_like_onnx
from placer.types import DATA_TYPE_TO_DTYPE, DTYPE_TO_DATA_TYPE, Net, TensorType, shape_problem

# A Caffe NetParameter at top level: layers, or the deprecated input dims.
_CAFFE_TOP = re.compile(rb"^\s*(layers?|input_dim|input_shape)\s*[:{]", re.M)
_CAFFE2_TOP = re.compile(rb"^\s*(op|external_input|external_output)\s*[:{]", re.M)


def sniff_format(data: bytes) -> str:
    """"caffe-prototxt", "caffe2-text", "caffe2-binary" or "onnx" (a guess; the parser decides)."""
    if looks_like_onnx(data):
        return "onnx"
    if not looks_textual(data):
        return "caffe2-binary"
    head = data[:1 << 20]
    if _CAFFE_TOP.search(head) and not _CAFFE2_TOP.search(head):
        return "caffe-prototxt"
    return "caffe2-text"


def load_net(path: str | os.PathLike, init_path: str | os.PathLike | None = None,
             phase: str = "test", weights: str | os.PathLike | None = None,
             input_shapes: dict | None = None) -> Net:
    """Load a predict net whatever its format.

    ``init_path`` is the Caffe2 init net that fills the parameters; ``phase`` and
    ``weights`` apply to Caffe prototxt files (include/exclude rules, ``.caffemodel``).
    ``input_shapes`` (the user's ``--input``) lets a Caffe file whose input sizes are open
    get its parameter shapes (they follow from the input channels); for a Caffe2 net only
    their names count here (a blob the user feeds need not be listed in external_input;
    ``shapes.infer`` takes the shapes).
    """
    data = read_file_bytes(path)
    fmt = "onnx" if looks_like_onnx(data, path) else sniff_format(data)
    if fmt == "onnx":
        if init_path or weights:
            raise PlacerError(f"{path}: --init-net and --weights apply to Caffe2 and Caffe nets; an ONNX "
                              "model holds its weights (initializers)",
                              hint="drop the option, or convert first: placer convert model.onnx -o DIR")
        return load_onnx_net(path, input_shapes, data)
    if fmt == "caffe-prototxt":
        if init_path:
            raise PlacerError(f"{path}: --init-net applies to Caffe2 nets; this is a Caffe prototxt",
                              hint="give Caffe weights with --weights x.caffemodel")
        return _load_caffe(path, phase, weights, input_shapes)
    if weights:
        raise PlacerError(f"{path}: --weights applies to Caffe prototxt files; this is a Caffe2 NetDef",
                          hint="give the Caffe2 init net with --init-net")
    if init_path is None:
        init_path = find_init_net(path)
    if init_path is not None:
        _check_init_net(init_path)
    net = load_caffe2_net(path, init_path, fed=input_shapes or ())
    _check_text_fields(net)
    _check_param_shapes(net)
    net.input_shapes.update(read_value_info(path))
    return net


def _check_param_shapes(net: Net) -> None:
    """A fill op's shape that no tensor can have (negative, past int64) is named here, not
    in a numpy error when the init net runs."""
    for name, t in net.params.items():
        problem = shape_problem(t.shape)
        if problem:
            raise NetParseError(net.init_path or net.path, f"the init net's fill of '{name}': {problem}",
                                hint="fix the fill op's shape argument")


def _check_text_fields(net: Net) -> None:
    """protobuf hands back a string field whose bytes are not UTF-8 as ``bytes`` (a damaged
    binary file): name the op and the field rather than let a ``bytes`` op type or blob name
    travel on."""
    where = {"external_input": net.external_inputs, "external_output": net.external_outputs,
             "init net output": list(net.params)}
    for what, names in where.items():
        if any(type(n) is not str for n in names):
            bad = next(n for n in names if type(n) is not str)
            raise NetParseError(net.path, f"{what} {bad!r} is not UTF-8 text", hint=_DAMAGED)
    for op in net.ops:
        for what, value in (("type", op.type), ("name", op.name), ("engine", op.engine),
                            *(("input", b) for b in op.inputs), *(("output", b) for b in op.outputs)):
            if type(value) is not str:
                raise NetParseError(net.path, f"op #{op.index}: {what} {value!r} is not UTF-8 text",
                                    hint=_DAMAGED)


_DAMAGED = "the file looks damaged; re-export it from Caffe2"


def companion_init_paths(path: str | os.PathLike) -> list[Path]:
    """Where an init net beside a predict net is looked for, in order:
    ``predict_net.pbtxt`` -> ``init_net.pbtxt``; ``X_predict.pb`` -> ``X_init.pb``;
    ``X_predict_net.pbtxt`` -> ``X_init_net.pbtxt``; ``X.pbtxt`` -> ``X_init.pbtxt``
    (each also with the other suffix, .pb / .pbtxt)."""
    p = Path(path)
    stems = []
    if "predict" in p.stem:
        stems.append(p.stem.replace("predict", "init"))
    stems.append(p.stem + "_init")
    suffixes = dict.fromkeys([p.suffix, ".pbtxt", ".pb"])
    return [p.with_name(stem + suffix) for stem in stems for suffix in suffixes if suffix]


def find_init_net(path: str | os.PathLike) -> str | None:
    """The init net that sits beside a predict net under a conventional name, if any."""
    for candidate in companion_init_paths(path):
        if candidate.is_file() and candidate.resolve() != Path(path).resolve():
            return str(candidate)
    return None


VALUE_INFO = "value_info.json"


def value_info_paths(path: str | os.PathLike) -> list[Path]:
    """Where the input shapes of a net are looked for: ``<stem>.value_info.json``, then
    the model zoo's ``value_info.json`` in the same folder."""
    p = Path(path)
    return [p.with_name(p.stem + ".value_info.json"), p.with_name(VALUE_INFO)]


def read_value_info(path: str | os.PathLike) -> dict[str, TensorType]:
    """Input shapes from a Caffe2 model-zoo ``value_info.json`` beside the net (see
    ``value_info_paths``): ``{blob: [data_type, shape]}`` with TensorProto.DataType numbers.
    Anything else (dimensions that are negative, not integers, or too many elements to
    address) is a NetParseError naming the file and the blob."""
    for candidate in value_info_paths(path):
        if candidate.exists():  # a folder of that name is refused, not passed over
            def error(message: str, hint: str | None = None) -> NetParseError:
                return NetParseError(str(candidate), message.removeprefix(f"{candidate}: "), hint=hint)
            return parse_value_info(read_model(candidate, ValueInfo, "value_info.json", error), str(candidate))
    return {}


def parse_value_info(doc: ValueInfo, where: str) -> dict[str, TensorType]:
    """Shapes from a checked value_info document."""
    shapes = {}
    for name, (data_type, dims) in doc.root.items():
        dtype = DATA_TYPE_TO_DTYPE.get(data_type)
        if dtype is None:
            raise NetParseError(where, f"blob '{name}': unknown TensorProto data type {data_type} "
                                       f"(known: {', '.join(f'{k} {v}' for k, v in DATA_TYPE_TO_DTYPE.items())})")
        shapes[name] = TensorType(check_dims(dims, f"{where}: blob '{name}'"), dtype)
    return shapes


def value_info_json(shapes: dict[str, TensorType]) -> str:
    """``{blob: [data_type, shape]}`` as the Caffe2 model zoo writes it, a blob a line."""
    rows = [f" {json.dumps(name)}: {json.dumps([DTYPE_TO_DATA_TYPE[t.dtype], list(t.shape)])}"
            for name, t in shapes.items()]
    return "{\n" + ",\n".join(rows) + ("\n}\n" if rows else "}\n")


def save_value_info(shapes: dict[str, TensorType], path: str | os.PathLike) -> Path:
    return atomic_write_text(path, value_info_json(shapes))


def check_dims(dims, where: str) -> tuple[int, ...]:
    """``dims`` as a shape, or a ShapeError when one is negative or the element count does
    not fit in int64 (what Caffe2 and numpy index with)."""
    dims = tuple(int(d) for d in dims)
    problem = shape_problem(dims)
    if problem:
        raise ShapeError(f"{where}: {problem}", hint="dimensions are sizes of 0 or more, with under 2^63 elements in all")
    return dims


def _load_caffe(path, phase, weights, input_shapes) -> Net:
    if input_shapes:
        return load_caffe_net(str(path), phase=phase, weights=weights, input_shapes=input_shapes)
    return load_caffe_net(str(path), phase=phase, weights=weights)


def _check_init_net(init_path) -> None:
    if sniff_format(read_file_bytes(init_path)) == "caffe-prototxt":
        raise NetParseError(str(init_path), "the init net is a Caffe prototxt, not a Caffe2 NetDef",
                            hint="--init-net takes the Caffe2 init_net.pb(txt) that fills the parameters")
