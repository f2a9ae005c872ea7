"""Protobuf message classes built from descriptors written in code.

A schema is a small table: for each message, its fields as
``(name, number, type, label[, default])``, where ``type`` is a scalar type name
(``string``, ``int32``, ``float``, ...) or the name of another message or enum of the same
file. The protobuf package builds real message classes from it, so text and binary
parsing, printing and unknown-field handling are protobuf's own (no hand-written parser).
"""
from __future__ import annotations

from typing import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64, "int32": _F.TYPE_INT32, "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "uint32": _F.TYPE_UINT32,
    "sint32": _F.TYPE_SINT32, "sint64": _F.TYPE_SINT64,
}
LABELS = {"optional": _F.LABEL_OPTIONAL, "repeated": _F.LABEL_REPEATED, "required": _F.LABEL_REQUIRED}

FieldSpec = tuple  # (name, number, type, label) or (name, number, type, label, default)


def build_file(filename: str, package: str,
               messages: dict[str, Iterable[FieldSpec]],
               enums: dict[str, dict[str, int]] | None = None,
               packed: frozenset[tuple[str, str]] = frozenset(),
               pool: descriptor_pool.DescriptorPool | None = None) -> dict[str, type]:
    """Build a proto2 file and return ``{message name: message class}``.

    ``packed`` lists ``(message, field)`` pairs declared ``[packed = true]``.
    Enum names are global in the file (as top-level enums); enum fields use them by name.
    An enum named ``"Message.Enum"`` is nested in that message (proto scopes enum value
    names like C++, so enums sharing a value name such as ``MAX`` must be nested).
    """
    enums = enums or {}
    fdp = descriptor_pb2.FileDescriptorProto(name=filename, package=package, syntax="proto2")
    top_enums = {n: v for n, v in enums.items() if "." not in n}
    for ename, values in top_enums.items():
        e = fdp.enum_type.add(name=ename)
        for vname, number in values.items():
            e.value.add(name=vname, number=number)
    for mname, fields in messages.items():
        m = fdp.message_type.add(name=mname)
        for ename, values in enums.items():
            if ename.rpartition(".")[0] == mname:
                e = m.enum_type.add(name=ename.rpartition(".")[2])
                for vname, number in values.items():
                    e.value.add(name=vname, number=number)
        for spec in fields:
            name, number, ftype, label = spec[:4]
            f = m.field.add(name=name, number=number, label=LABELS[label])
            if ftype in SCALARS:
                f.type = SCALARS[ftype]
            elif ftype in enums:
                f.type = _F.TYPE_ENUM
                f.type_name = f".{package}.{ftype}"
            elif ftype in messages:
                f.type = _F.TYPE_MESSAGE
                f.type_name = f".{package}.{ftype}"
            else:
                raise ValueError(f"{filename}: {mname}.{name}: unknown type {ftype!r}")
            if len(spec) > 4 and spec[4] is not None:
                default = spec[4]
                f.default_value = (("true" if default else "false") if isinstance(default, bool)
                                   else str(default))
            if (mname, name) in packed:
                f.options.packed = True
    pool = pool or descriptor_pool.DescriptorPool()
    file_desc = pool.Add(fdp)
    pool_file = pool.FindFileByName(filename)
    del file_desc
    return {name: message_factory.GetMessageClass(pool_file.message_types_by_name[name])
            for name in messages}
