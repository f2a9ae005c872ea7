"""Caffe2 NetDef files: read (text or binary, sniffed), write (atomic), and turn into a ``Net``.

Parsing is protobuf's own (``text_format`` and the binary codec) over the message classes
of ``caffe2_pb``; nothing here tokenises protobuf except one rename: the 2016-2018 name
``cuda_gpu_id`` of DeviceOption field 2 is rewritten to ``device_id`` (same number) before
the text parser sees it, so old files load and are written back with the current name.

Nesting: a NetDef can hold NetDefs (``If``/``While``/``RecurrentNetwork`` arguments ``n``
and ``nets``), each level three protobuf messages deep (NetDef, OperatorDef, Argument).
protobuf's binary decoder, like Caffe2's own reader, stops at 100 message levels, i.e. 33
levels of nested nets; text files are held to the same bound (``MAX_MESSAGE_DEPTH``), so
that every net placer accepts can also be written binary and read back by Caffe2, and no
walk over a loaded net can run out of stack. Deeper files are a NetParseError saying so.

Device convention: an op whose ``device_option`` is present counts as placed by the file,
even when the option is empty (``device_option {}`` is CPU, device_type 0, explicitly);
an op without one takes the net-level ``device_option``; with neither, ``Op.device`` is
None (not annotated).
"""
from __future__ import annotations

import os
import re
import stat
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from placer.errors import NetParseError, PlacerError, excerpt
from placer.fileio import atomic_write_bytes, atomic_write_text, note_read
from placer.formats.caffe2_pb import Argument, NetDef, OperatorDef
from placer.memory import available_bytes, format_bytes
from placer.ops import registry
from placer.types import DATA_TYPE_TO_DTYPE, Args, Device, Net, Op, TensorType

# device_type numbers that are GPUs (PROTO_CUDA, PROTO_HIP); every other type runs on the host.
GPU_DEVICE_TYPES = {1, 6}

# A quoted string or a comment (left alone), or the old field name followed by ':' or '{'.
_OLD_DEVICE_ID = re.compile(
    r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*|\bcuda_gpu_id\b(?=\s*[:{])')
_TEXT_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")
# protobuf's default decoding depth (upb's and C++'s CodedInputStream): 100 message levels.
MAX_MESSAGE_DEPTH = 100
NESTED_NET_LEVELS = (MAX_MESSAGE_DEPTH - 1) // 3  # NetDef > OperatorDef > Argument > NetDef ...
# Where an Argument's `n` / `nets` field may start (a literal first: the scan is fast).
_NESTED_NET_FIELD = re.compile(r"n(?:ets)?\s*[:{<]")
_ERROR_PREFIX = re.compile(r"^\d+:\d+ : ")
# protobuf counts a message's bytes in a signed 32-bit int: no message (and no file that
# Caffe2's reader takes) is larger.
MAX_PROTO_BYTES = 2**31 - 1
# Peak memory of loading a file, per byte of it: the smallest figure measured (placer
# inspect / load_net, peak RSS less the interpreter's) over the kinds of net, so that only
# files that cannot fit are refused. Binary: 2.5 for an init net of GivenTensorFill values
# (10 MB: the bytes, the decoded message, the arrays), 7 to 20 for op-heavy predict nets
# (5 MB of ResNet-50 ops: 20, the Op records included). Text: 6.2 for GivenTensorFill values
# (46 MB), 10 to 11 for predict nets (1 and 10 MB).
PARSE_BYTES_PER_FILE_BYTE = {"binary": 2.5, "text": 6}


# ---------------------------------------------------------------- reading and writing

def read_file_bytes(path: str | os.PathLike, hint: str = "check the path") -> bytes:
    """The bytes of a net (or weights) file, or a NetParseError saying why it cannot be read:
    missing, not a regular file, or too large to parse here (``check_net_file``)."""
    p = Path(path)
    note_read(p)
    try:
        check_net_file(p, hint)
        with open(p, "rb") as f:
            return f.read()
    except OSError as e:
        raise NetParseError(str(path), f"cannot read: {e.strerror or e}", hint=hint) from e


def check_net_file(path: Path, hint: str) -> None:
    """Refuse, before reading a byte, a net or weights file that cannot be parsed here.

    protobuf parses a message whole, from memory (no streaming), so the file must be a
    regular file (a device such as /dev/zero, a FIFO or a socket has no end to read to),
    under protobuf's 2 GiB message limit, and its size times the memory parsing takes per
    byte (``PARSE_BYTES_PER_FILE_BYTE``, text or binary by its first bytes) must fit in
    what the machine has."""
    size = _regular_file_size(path, hint)
    if size > MAX_PROTO_BYTES:
        raise NetParseError(str(path), f"{format_bytes(size)}: over protobuf's message limit of "
                                       f"{format_bytes(MAX_PROTO_BYTES)} (Caffe2 reads no larger file)",
                            hint="is this the net? a NetDef or .caffemodel that large cannot be written")
    with open(path, "rb") as f:
        kind = "text" if looks_textual(f.read(65536), whole=False) else "binary"
    factor = PARSE_BYTES_PER_FILE_BYTE[kind]
    have, where = available_bytes()
    if have is not None and size * factor > have:
        raise NetParseError(str(path), f"{format_bytes(size)} of {kind} protobuf: parsing it takes about "
                                       f"{format_bytes(size * factor)} ({factor}x), this machine has "
                                       f"{format_bytes(have)} available ({where})",
                            hint="free memory, or give a smaller file" + (
                                "; the binary form (.pb) of a net needs less" if kind == "text" else ""))


def _regular_file_size(path: Path, hint: str) -> int:
    if not path.exists():
        raise NetParseError(str(path), "no such file: cannot read it", hint=hint)
    info = path.stat()
    if stat.S_ISDIR(info.st_mode):
        raise NetParseError(str(path), "is a directory, not a file", hint=hint)
    if not stat.S_ISREG(info.st_mode):
        raise NetParseError(str(path), f"is {_file_kind(info.st_mode)}, not a regular file: a net is "
                                       "read whole from a file", hint="save it to a file and give that path")
    return info.st_size


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
    return next((what for test, what in kinds if test(mode)), "not a file")


def looks_textual(data: bytes, whole: bool = True) -> bool:
    """True when the bytes are UTF-8 text without control characters (a text format);
    ``whole=False`` for the first bytes of a file (a character may be cut at their end)."""
    if _TEXT_CONTROL.search(data[:65536]):
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return not whole and e.start >= len(data) - 3  # a UTF-8 character is 4 bytes at most
    return True




def read_netdef(path: str | os.PathLike) -> tuple[object, str]:
    """``(NetDef, "caffe2-text" | "caffe2-binary")``; the encoding is sniffed from the content.

    Files named ``.pbtxt`` that hold binary NetDefs exist in the wild (and the other way
    round), so the suffix is never trusted.
    """
    data = read_file_bytes(path)
    if not data.strip():
        raise NetParseError(str(path), "empty file, not a net",
                            hint="a Caffe2 NetDef has at least one field")
    if looks_textual(data):
        try:
            return parse_text(data.decode("utf-8"), str(path)), "caffe2-text"
        except NetParseError:
            netdef = _try_binary(data)  # printable bytes can still be a binary NetDef
            if netdef is not None:
                return netdef, "caffe2-binary"
            raise
    return parse_binary(data, str(path)), "caffe2-binary"


def load_netdef(path: str | os.PathLike):
    """A NetDef from a text (.pbtxt) or binary (.pb) file, whichever the content is."""
    return read_netdef(path)[0]


def parse_text(text: str, path: str = "<text>"):
    """Parse a text NetDef; syntax errors carry file:line:column."""
    text = text.lstrip("\ufeff")  # a UTF-8 byte-order mark some editors write
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        raise NetParseError(path, "looks like JSON, not a Caffe2 NetDef or Caffe prototxt", 1, 1)
    netdef = NetDef()
    try:
        text_format.Parse(rename_old_fields(text), netdef)
    except RecursionError:  # the text parser recurses per message level
        raise _too_deep(path) from None
    except text_format.ParseError as e:
        message = excerpt(_ERROR_PREFIX.sub("", str(e)), 120)  # protobuf quotes the token: any length
        hint = None
        if re.search(r"^\s*layers?\s*[{:]", text, re.M):
            hint = "this looks like a Caffe prototxt: load it with placer.formats.load_net"
        raise NetParseError(path, f"not a valid Caffe2 NetDef: {message}",
                            e.GetLine(), e.GetColumn(), hint) from e
    if _mentions_nested_nets(text) and message_depth(netdef) > MAX_MESSAGE_DEPTH:
        raise _too_deep(path)
    return netdef


def _mentions_nested_nets(text: str) -> bool:
    """Whether the text has an ``n`` or ``nets`` field (a word of its own), so that the
    depth walk runs only on nets with nested nets (~2% of the parse time otherwise)."""
    for m in _NESTED_NET_FIELD.finditer(text):
        before = text[m.start() - 1] if m.start() else " "
        if not (before.isalnum() or before == "_"):
            return True
    return False


def _too_deep(path: str) -> NetParseError:
    return NetParseError(path, f"nets nested more than {NESTED_NET_LEVELS} levels deep (over "
                               f"{MAX_MESSAGE_DEPTH} protobuf message levels): placer, like protobuf's "
                               "decoder and Caffe2, reads no deeper",
                         hint="flatten the nested If/While/RecurrentNetwork nets")


def message_depth(netdef) -> int:
    """Message levels of a NetDef (1 without nested nets, 4 with one level, ...), walked
    with an explicit stack: how deep the nets go must not decide whether the walk fits."""
    deepest, stack = 1, [(netdef, 1)]
    while stack:
        net, depth = stack.pop()
        deepest = max(deepest, depth)
        for op in net.op:
            for arg in op.arg:
                if arg.HasField("n"):
                    stack.append((arg.n, depth + 3))
                stack.extend((sub, depth + 3) for sub in arg.nets)
    return deepest


def rename_old_fields(text: str) -> str:
    """Rewrite the field name ``cuda_gpu_id`` to ``device_id`` (padded, so columns stay)."""
    if "cuda_gpu_id" not in text:
        return text
    return _OLD_DEVICE_ID.sub(
        lambda m: "device_id  " if m.group(0) == "cuda_gpu_id" else m.group(0), text)


def _try_binary(data: bytes):
    netdef = NetDef()
    try:
        netdef.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return None
    return netdef if _plausible_netdef(netdef) else None


def _exceeds_decode_depth(data: bytes) -> bool:
    """True when the binary decoder stopped at its nesting limit (upb says MaxDepth)."""
    try:
        NetDef().ParseFromString(data)
    except DecodeError as e:
        return "depth" in str(e).lower()
    return False


def _plausible_netdef(netdef) -> bool:
    """Bytes that happen to decode (an image, a caffemodel) are not a net: check the shape."""
    from google.protobuf import unknown_fields
    if len(unknown_fields.UnknownFieldSet(netdef)):
        return False
    if not netdef.ListFields():
        return False
    return all(op.type for op in netdef.op)


def parse_binary(data: bytes, path: str = "<bytes>"):
    """Parse a binary NetDef, refusing bytes that decode but are clearly not a net."""
    netdef = _try_binary(data)
    if netdef is None:
        if _exceeds_decode_depth(data):
            raise _too_deep(path)
        hint = ("a .caffemodel holds Caffe weights: pass it with --weights beside the prototxt"
                if str(path).endswith(".caffemodel") else
                "expected a Caffe2 NetDef (.pb/.pbtxt) or a Caffe .prototxt")
        raise NetParseError(path, "not a net: the bytes are not a binary Caffe2 NetDef", hint=hint)
    return netdef


def save_netdef(netdef, path: str | os.PathLike, binary: bool | None = None) -> Path:
    """Write a NetDef atomically; binary when ``binary`` or, if None, when the suffix is .pb."""
    if binary is None:
        binary = Path(path).suffix == ".pb"
    if not binary and has_unknown_fields(netdef):
        raise PlacerError(f"{path}: the net carries fields this schema does not name (a newer "
                          "Caffe2?); the text format would drop them",
                          hint="write it as binary (.pb) to keep them")
    if binary:
        return atomic_write_bytes(path, netdef.SerializeToString())
    return atomic_write_text(path, netdef_text(netdef))


def has_unknown_fields(message) -> bool:
    """True when ``message`` or any message inside it kept fields the schema does not name.

    Every unknown field takes at least one byte on the wire, so a copy with the unknown
    fields discarded (all in protobuf's C code) is smaller exactly when there were some."""
    bare = type(message)()
    bare.CopyFrom(message)
    bare.DiscardUnknownFields()
    return bare.ByteSize() != message.ByteSize()


def netdef_text(netdef) -> str:
    """``text_format.MessageToString(netdef)``: the same text, about ten times faster on big nets.

    text_format prints in Python (about 25 us an op); upb prints in C (``str(message)``)
    the same text except for escapes (upb writes ``\\001`` where text_format writes the
    byte raw) and for floats, doubles and enums (upb prints float 1.0 as ``1``). So each
    message (the whole net, else each op, else each argument) whose C text is ASCII, has
    no escape and no double or enum field is taken from upb, its float arguments
    (``f``, ``floats``) reprinted as text_format prints them; text_format prints the rest."""
    return text_format.MessageToString(netdef, message_formatter=_text_from_upb)


def _text_from_upb(message, indent: int, as_one_line: bool) -> str | None:
    """upb's text of ``message`` where it equals text_format's (see ``netdef_text``), laid
    out at ``indent``; None lets text_format print it."""
    if as_one_line:
        return None
    text = str(message)
    if not text or not text.isascii() or "\\" in text or _UPB_DIFFERS.search(text):
        return None
    if _FLOAT_LINE.search(text):
        text = _floats_as_text_format(message, text)
        if text is None:
            return None
    text = text.rstrip("\n")
    return text.replace("\n", "\n" + " " * indent) if indent else text


def _floats_as_text_format(message, text: str) -> str | None:
    """``text`` with each float argument line holding text_format's rendering of the value,
    taken from the message in print order (a net's ops' arguments, then its own); None
    for a message that holds arguments elsewhere (nested nets are printed apart)."""
    if isinstance(message, NetDef):
        args = [a for op in message.op for a in op.arg] + list(message.arg)
    elif isinstance(message, OperatorDef):
        args = message.arg
    elif isinstance(message, Argument):
        args = [message]
    else:
        return None
    values = [v for a in args for v in ([a.f] if a.HasField("f") else []) + list(a.floats)]
    lines = _FLOAT_LINE.findall(text)
    if len(lines) != len(values):
        return None
    rendered = iter([_float_text(v) for v in values])
    return _FLOAT_LINE.sub(lambda m: f"{m.group(1)}: {next(rendered)}", text)


_FLOAT_TEXT: dict[str, str] = {}


def _float_text(value: float) -> str:
    """How text_format prints a float argument of this value (asked once per value)."""
    key = repr(value)  # -0.0 and 0.0 are equal keys; their reprs are not
    if key not in _FLOAT_TEXT:
        _FLOAT_TEXT[key] = text_format.MessageToString(Argument(f=value)).strip()[len("f: "):]
    return _FLOAT_TEXT[key]


def _fields_printed_differently() -> set[str]:
    """Names of the double and enum fields of every message a NetDef can hold, and of the
    messages an argument can hold (whose float fields are not the argument's own)."""
    from google.protobuf.descriptor import FieldDescriptor as F
    names: set[str] = set()
    seen: set[str] = set()
    todo = [NetDef.DESCRIPTOR]
    while todo:
        message = todo.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        for field in message.fields:
            nested_in_argument = message.name == "Argument" and field.message_type is not None
            if field.cpp_type in (F.CPPTYPE_DOUBLE, F.CPPTYPE_ENUM) or nested_in_argument:
                names.add(field.name)
            elif field.cpp_type == F.CPPTYPE_FLOAT and message.name != "Argument":
                names.add(field.name)
            if field.message_type is not None:
                todo.append(field.message_type)
    return names


# A line of upb's text that prints one of those fields, as a value or a message (strings
# never hold a raw newline); and a float argument line.
_UPB_DIFFERS = re.compile(r"^ *(?:%s)(?::| \{)" % "|".join(sorted(_fields_printed_differently())), re.M)
_FLOAT_LINE = re.compile(r"^( *(?:f|floats)): .*$", re.M)


# ---------------------------------------------------------------- decoding ops

def decode_value(arg):
    """The python value of one Argument: the field that is set, decoded; None if none is."""
    if arg.HasField("f"):
        return float(repr_float32(arg.f))
    if arg.HasField("i"):
        return int(arg.i)
    if arg.HasField("s"):
        return _decode_bytes(arg.s)
    if arg.HasField("n"):
        return arg.n
    if arg.HasField("t"):
        return arg.t
    if len(arg.floats):
        return list(arg.floats)
    if len(arg.ints):
        return list(arg.ints)
    if len(arg.strings):
        return [_decode_bytes(s) for s in arg.strings]
    if len(arg.nets):
        return list(arg.nets)
    if len(arg.tensors):
        return list(arg.tensors)
    if len(arg.qtensors):
        return list(arg.qtensors)
    return None


def repr_float32(x: float) -> str:
    """Shortest text of a float32 value (0.1f prints as 0.1, not 0.10000000149...)."""
    import numpy as np
    return str(np.float32(x))


def _decode_bytes(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def decode_args(op_proto, label: str = "?", seed: int = 0) -> Args:
    """An OperatorDef's arguments as ``Args`` (nested nets stay NetDef messages); ``n_outputs``
    is the number of outputs the op declares."""
    return Args({a.name: decode_value(a) for a in op_proto.arg}, op=label, seed=seed,
                n_outputs=len(op_proto.output))


def decode_device(option) -> Device:
    """A DeviceOption as a ``Device``: CUDA/HIP -> gpu<device_id>, everything else cpu."""
    if option.device_type in GPU_DEVICE_TYPES:
        return Device("gpu", int(option.device_id))
    return Device("cpu", 0)


_NO_ARGS = Args()  # stands in until an op's own arguments are decoded (they need its label)


def op_from_proto(index: int, proto, default_option=None) -> Op:
    option = proto.device_option if proto.HasField("device_option") else default_option
    op = Op(index=index, type=proto.type, inputs=tuple(proto.input), outputs=tuple(proto.output),
            args=_NO_ARGS, name=proto.name, engine=proto.engine,
            device=decode_device(option) if option is not None else None,
            control_inputs=tuple(proto.control_input), proto=proto)
    seed = int(option.random_seed) if option is not None and option.HasField("random_seed") else 0
    op.args = decode_args(proto, op.label, seed)
    return op


# ---------------------------------------------------------------- parameters from an init net

# Fill op type -> dtype of what it writes ("arg" = the op's `dtype` argument, float by default).
FILL_DTYPES = {
    "GivenTensorFill": "float32", "GivenTensorDoubleFill": "float64",
    "GivenTensorFp16Fill": "float16", "GivenTensorBoolFill": "bool",
    "GivenTensorIntFill": "int32", "GivenTensorInt16Fill": "int16",
    "GivenTensorInt64Fill": "int64", "GivenTensorStringFill": "object",
    "GivenTensorByteStringToUInt8Fill": "uint8",
    "Int8GivenTensorFill": "uint8", "Int8GivenIntTensorFill": "int32",
    "ConstantFill": "arg", "XavierFill": "float32", "MSRAFill": "float32",
    "GaussianFill": "float32", "UniformFill": "float32", "UniformIntFill": "int32",
    "RangeFill": "float32", "LengthsRangeFill": "int32", "DiagonalFill": "arg",
}


def fill_output_type(proto) -> TensorType | None:
    """The type a fill op writes, from its `shape` (+`extra_shape`) or number of `values`.

    None when the op is not a fill op or its shape comes from an input (`input_as_shape`).
    """
    dtype = FILL_DTYPES.get(proto.type)
    if dtype is None or len(proto.input):
        return None
    args = {a.name: a for a in proto.arg}
    if dtype == "arg":
        dtype = DATA_TYPE_TO_DTYPE.get(args["dtype"].i, "float32") if "dtype" in args else "float32"
    elif proto.type == "GivenTensorFill" and "dtype" in args:
        dtype = DATA_TYPE_TO_DTYPE.get(args["dtype"].i, "float32")
    if "shape" in args:
        shape = list(args["shape"].ints)
    elif "values" in args:
        values = args["values"]
        if proto.type in ("GivenTensorByteStringToUInt8Fill", "Int8GivenTensorFill"):
            shape = [sum(len(s) for s in values.strings) + len(values.s)]
        else:
            shape = [len(values.floats) or len(values.ints) or len(values.strings)]
    else:
        shape = []  # no shape argument: Caffe2 fills a scalar
    if "extra_shape" in args:
        shape += list(args["extra_shape"].ints)
    return _tensor_type(tuple(shape), dtype)


@lru_cache(maxsize=4096)
def _tensor_type(shape: tuple[int, ...], dtype: str) -> TensorType:
    """One shared (immutable) TensorType per shape and dtype: an init net fills thousands
    of parameters of a few shapes."""
    return TensorType(shape, dtype)


# Init-net ops that make a handle rather than a tensor (Caffe2's optimizers make the
# iteration counter's mutex this way): typed as a one-byte scalar so that the ops that
# read it (AtomicIter) have every input typed.
INIT_HANDLES = {"CreateMutex": TensorType((), "uint8")}


# The casts a mixed-precision init net applies to a filled blob (Caffe2's
# PseudoFP16Initializer: a float32 master filled, then FloatToHalf to the parameter); the
# dtype each writes is its registry entry's.
INIT_CASTS = frozenset({"FloatToHalf", "HalfToFloat", "FloatToBFloat16", "BFloat16ToFloat"})


def cast_of_filled_type(proto, known: dict[str, TensorType]) -> TensorType | None:
    """The type a cast of a blob the init net filled writes (the cast's own inference)."""
    if proto.type not in INIT_CASTS or len(proto.input) != 1 or proto.input[0] not in known:
        return None
    try:
        return registry.get(proto.type).infer([known[proto.input[0]]], Args({}, op=proto.type))[0]
    except PlacerError:      # a cast of the wrong dtype: left out, shape inference names it
        return None


def fill_like_input_type(proto, known: dict[str, TensorType]) -> TensorType | None:
    """The type a fill op writes when its shape is that of its one input (Caffe2's
    ``ConstantFill([param])``, how optimizers make their state): the input's shape
    (+`extra_shape`), the fill's dtype. None unless the input's type is ``known``."""
    dtype = FILL_DTYPES.get(proto.type)
    args = {a.name: a for a in proto.arg}
    if dtype is None or len(proto.input) != 1 or proto.input[0] not in known:
        return None
    if ("input_as_shape" in args and args["input_as_shape"].i) or "shape" in args:
        return None
    if dtype == "arg":
        dtype = DATA_TYPE_TO_DTYPE.get(args["dtype"].i, "float32") if "dtype" in args else "float32"
    extra = tuple(args["extra_shape"].ints) if "extra_shape" in args else ()
    return TensorType(known[proto.input[0]].shape + extra, dtype)


def params_from_init(init_netdef) -> dict[str, TensorType]:
    """Types of the blobs the init net fills (with a shape, or shaped like a blob it
    filled before) and of the handles it creates; a blob it makes another way is left out."""
    params: dict[str, TensorType] = {}
    for proto in init_netdef.op:
        t = (fill_output_type(proto) or fill_like_input_type(proto, params)
             or cast_of_filled_type(proto, params) or INIT_HANDLES.get(proto.type))
        if t is not None:
            for out in proto.output:
                params[out] = t
    return params


# ---------------------------------------------------------------- building the Net

def net_from_netdef(netdef, init_netdef=None, path: str = "", init_path: str = "",
                    source_format: str = "", fed: Iterable[str] = ()) -> Net:
    """A ``Net`` from a predict NetDef (and its init net), after structural checks.

    ``fed`` names blobs the user supplies (``--input``): one that an op reads but that no
    op makes and external_input does not list becomes an external input instead of an error.
    """
    default = netdef.device_option if netdef.HasField("device_option") else None
    ops = [op_from_proto(i, p, default) for i, p in enumerate(netdef.op)]
    params = params_from_init(init_netdef) if init_netdef is not None else {}
    init_outputs = {o for p in init_netdef.op for o in p.output} if init_netdef is not None else set()
    net = Net(name=netdef.name, ops=ops, external_inputs=list(netdef.external_input),
              external_outputs=list(netdef.external_output), params=params, proto=netdef,
              init_proto=init_netdef, path=str(path), init_path=str(init_path or ""),
              source_format=source_format,
              default_device=decode_device(default) if default is not None else None)
    produced = {o for op in ops for o in op.outputs} | init_outputs | set(net.external_inputs)
    read = {b for op in ops for b in op.inputs}
    net.external_inputs += [b for b in dict.fromkeys(fed) if b in read and b not in produced]
    check_structure(net, init_outputs, path or "<net>")
    return net


def check_structure(net: Net, init_outputs: set[str], path: str) -> None:
    """Every op input exists when the op runs: made by an earlier op, an external input, or
    the init net. A NetDef runs in order, so reading a blob that only a later op makes is a
    cycle (or a misordered net) and reading one that nothing makes is a dangling input."""
    available = set(net.external_inputs) | set(net.params) | init_outputs
    producer: dict[str, int] = {}
    for op in net.ops:
        for out in op.outputs:
            producer.setdefault(out, op.index)
    for op in net.ops:
        for blob in op.inputs:
            if not blob or blob in available:
                continue
            later = producer.get(blob)
            if later is not None and later >= op.index:
                maker = net.ops[later]
                raise NetParseError(
                    path, f"op {op.label} reads blob '{blob}' before it is produced: only "
                          f"op {maker.label}, later in the net, makes it (a cycle, or ops out of order)",
                    hint="reorder the ops so that every blob is made before it is read")
            raise NetParseError(
                path, f"op {op.label} reads blob '{blob}', which no earlier op makes and "
                      "external_input does not list",
                hint=f"add it to external_input, give --init-net INIT if an init net fills it, "
                     f"or give its shape with --input {blob}=d0,d1,...")
        available.update(op.outputs)


def load_caffe2_net(path, init_path=None, fed: Iterable[str] = ()) -> Net:
    """Read a Caffe2 predict net (and optional init net) into a ``Net``; ``fed`` as in
    ``net_from_netdef``."""
    netdef, fmt = read_netdef(path)
    init = read_netdef(init_path)[0] if init_path else None
    return net_from_netdef(netdef, init, str(path), str(init_path or ""), fmt, fed)
