"""Net files in, ``Net`` out: ``load_net`` picks the reader from the file's content.

- Caffe2 NetDef, text or binary (``formats.caffe2``), with an optional init net (found
  beside the predict net under a conventional name when not given) and input shapes from
  a model-zoo ``value_info.json`` beside it;
- Caffe prototxt, ``layer {}`` / ``layers {}`` (``formats.caffe``), with optional
  ``.caffemodel`` weights.

The suffix is never trusted (binary NetDefs named ``.pbtxt`` exist); the content decides.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from placer.errors import NetParseError, PlacerError
from placer.types import DATA_TYPE_TO_DTYPE, Net, TensorType

# A Caffe NetParameter at top level: layers, or the deprecated input dims.
_CAFFE_TOP = re.compile(rb"^\s*(layers?|input_dim|input_shape)\s*[:{]", re.M)
_CAFFE2_TOP = re.compile(rb"^\s*(op|external_input|external_output)\s*[:{]", re.M)


def sniff_format(data: bytes) -> str:
    """"caffe-prototxt", "caffe2-text" or "caffe2-binary" (a guess; the parser decides)."""
    from placer.formats.caffe2 import looks_textual
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
    from placer.formats import caffe2
    data = caffe2.read_file_bytes(path)
    fmt = sniff_format(data)
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
    net = caffe2.load_caffe2_net(path, init_path, fed=input_shapes or ())
    net.input_shapes.update(read_value_info(path))
    return net


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


def read_value_info(path: str | os.PathLike) -> dict[str, TensorType]:
    """Input shapes from a Caffe2 model-zoo ``value_info.json`` beside the net
    (``<stem>.value_info.json`` first, then ``value_info.json``): ``{blob: [data_type, shape]}``
    with TensorProto.DataType numbers."""
    p = Path(path)
    for candidate in (p.with_name(p.stem + ".value_info.json"), p.with_name("value_info.json")):
        if not candidate.is_file():
            continue
        try:
            raw = json.loads(candidate.read_text())
            return {name: TensorType(tuple(int(d) for d in shape), DATA_TYPE_TO_DTYPE[int(dt)])
                    for name, (dt, shape) in raw.items()}
        except (ValueError, TypeError, KeyError) as e:
            raise NetParseError(str(candidate), f"not a value_info.json ({{blob: [data_type, shape]}}): {e}") from None
    return {}


def _load_caffe(path, phase, weights, input_shapes) -> Net:
    from placer.formats.caffe import load_caffe_net
    if input_shapes:
        return load_caffe_net(str(path), phase=phase, weights=weights, input_shapes=input_shapes)
    return load_caffe_net(str(path), phase=phase, weights=weights)


def _check_init_net(init_path) -> None:
    from placer.formats.caffe2 import read_file_bytes
    if sniff_format(read_file_bytes(init_path)) == "caffe-prototxt":
        raise NetParseError(str(init_path), "the init net is a Caffe prototxt, not a Caffe2 NetDef",
                            hint="--init-net takes the Caffe2 init_net.pb(txt) that fills the parameters")
