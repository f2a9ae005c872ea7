"""Build Caffe2 NetDefs in code: the bundled examples and the tests use it.

``NetBuilder`` appends OperatorDefs with python-valued arguments encoded the way Caffe2's
``core.CreateOperator`` encodes them (int -> ``i``, float -> ``f``, str -> ``s``, list of
ints -> ``ints``, list of floats -> ``floats``, list of str -> ``strings``), and keeps an
init net of fill ops beside the predict net.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from placer.fileio import atomic_write_text
from placer.formats import caffe2_pb as pb
from placer.types import DTYPE_TO_DATA_TYPE


def make_arg(name: str, value: Any) -> pb.Argument:
    arg = pb.Argument(name=name)
    if isinstance(value, bool):
        arg.i = int(value)
    elif isinstance(value, int):
        arg.i = value
    elif isinstance(value, float):
        arg.f = value
    elif isinstance(value, str):
        arg.s = value.encode()
    elif isinstance(value, bytes):
        arg.s = value
    elif isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, (int,)) and not isinstance(v, bool) for v in items):
            arg.ints.extend(items)
        elif all(isinstance(v, (int, float)) for v in items):
            arg.floats.extend(float(v) for v in items)
        elif all(isinstance(v, str) for v in items):
            arg.strings.extend(v.encode() for v in items)
        else:
            raise TypeError(f"argument {name}: mixed list {value!r}")
    else:
        raise TypeError(f"argument {name}: cannot encode {type(value).__name__}")
    return arg


def make_op(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str = "",
            device: tuple[int, int] | None = None, **args: Any) -> pb.OperatorDef:
    op = pb.OperatorDef(type=op_type, input=list(inputs), output=list(outputs))
    if name:
        op.name = name
    for key, value in args.items():
        op.arg.append(make_arg(key, value))
    if device is not None:
        op.device_option.device_type, op.device_option.device_id = device
    return op


class NetBuilder:
    """A predict net and its init net, grown op by op."""

    def __init__(self, name: str):
        self.predict = pb.NetDef(name=name)
        self.init = pb.NetDef(name=f"{name}_init")
        self.value_info: dict[str, tuple[str, list[int]]] = {}

    def op(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str, **args: Any) -> str:
        outs = [outputs] if isinstance(outputs, str) else list(outputs)
        self.predict.op.append(make_op(op_type, inputs, outs, **args))
        return outs[0]

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        """An external input fed at run time; its shape goes to value_info.json."""
        self.predict.external_input.append(name)
        self.value_info[name] = (dtype, [int(d) for d in shape])
        return name

    def param(self, name: str, shape: Sequence[int], fill: str = "XavierFill", **args: Any) -> str:
        """A parameter made by the init net's fill op and listed as an external input."""
        self.init.op.append(make_op(fill, [], [name], shape=[int(d) for d in shape], **args))
        self.init.external_output.append(name)
        self.predict.external_input.append(name)
        return name

    def output(self, name: str) -> str:
        self.predict.external_output.append(name)
        return name

    def value_info_json(self) -> str:
        """Caffe2 model-zoo style ``value_info.json``: {blob: [data_type, shape]}."""
        return json.dumps({k: [DTYPE_TO_DATA_TYPE[dt], shape] for k, (dt, shape) in self.value_info.items()},
                          indent=1)

    def save(self, folder: str | Path, stem: str) -> dict[str, Path]:
        """Write ``<stem>.pbtxt``, ``<stem>_init.pbtxt`` and ``<stem>.value_info.json``."""
        from google.protobuf import text_format
        folder = Path(folder)
        paths = {"predict": folder / f"{stem}.pbtxt", "init": folder / f"{stem}_init.pbtxt",
                 "value_info": folder / f"{stem}.value_info.json"}
        atomic_write_text(paths["predict"], text_format.MessageToString(self.predict))
        atomic_write_text(paths["init"], text_format.MessageToString(self.init))
        atomic_write_text(paths["value_info"], self.value_info_json() + "\n")
        return paths
