"""Every JSON document placer reads goes through ``read_model`` (or ``read_document``
then ``check_model``, for a reader that looks at a document's ``kind`` first): device,
machine and cluster profiles, cluster manifests, run records, plan documents,
``value_info.json`` and collectives measurements. Each document is a pydantic model in
this package, the shared base of the stages: ``documents.profiles`` (device, machine,
cluster), ``documents.manifest``, ``documents.run_record``, ``documents.plan``,
``documents.value_info``, ``documents.collectives``; they import nothing of placer but
this module (and ``placer.errors`` / ``placer.fileio`` through it).

One reader, four steps, each failure one line naming the file (a ``PlacerError`` of the
kind the caller gives, so exit code 2):

1. the file: a regular file of at most ``max_bytes`` (checked with ``stat`` before it is
   read whole: a 40 GiB file named by mistake is refused, not loaded), readable;
2. the text: UTF-8;
3. the JSON: the decoder's errors, integers past Python's digit limit, and nesting too
   deep for the decoder (it recurses per level: ``[`` x 100000 is a ``RecursionError``);
   ``NaN``, ``Infinity`` and numbers too large for a float (``1e400``) are kept as
   ``NonFinite`` values, so that the model refuses them at their field;
4. the model: ``Model.model_validate``; the first error (the one nearest the top of the
   document) is reported as ``file: field 'devices[2].peak_flops': expected <what>,
   found <value>``. ``<what>`` is the ``description`` of the failing field in the model's
   JSON Schema (``Field(description=...)``, a model's ``DESCRIPTION``), or of the nearest
   part above it, so a model says in its own words what a field must be. A missing key
   is ``field 'x': missing``; a key a closed document (``Closed``) does not know is named
   with the keys it knows. A NaN or Infinity in a free-form part (an op's arguments) is
   refused after the model.

The field types (``FLOPS``, ``BYTES_PER_S``, ..., ``COUNT``, ``TEXT``) are strict: a JSON
string "3" is no number, ``true`` and ``2.0`` are no integer, an integer is a number; every
number is finite and every integer fits int64 (what Caffe2 and numpy count in).

Why pydantic models: the stages get typed attributes (``doc.devices[0].peak_flops``)
rather than dict lookups that fail far from the file; a document's fields are written
once, in the model, and its JSON Schema is generated from it, so the schema a person
reads cannot drift from what placer checks (``python -c "import json; from
placer.documents.profiles import MachineDocument; print(json.dumps(
MachineDocument.model_json_schema(), indent=1))"``); and pydantic checks in Rust. A
3000-op plan (2.9 MiB, ``tests/report_cases.synthetic_plan``) is checked in 0.16-0.36 s
(0.06-0.12 s per MiB): pydantic's 0.10-0.16 s and the walk for a NaN in the free-form
fields; jsonschema, checking in Python, took 1.0-2.2 s (0.35-0.75 s per MiB), on the same
2-core host under the same load. ``read_plan`` whole: 0.2-0.45 s, was 1.1-2.2 s.
Profiles and machine files take milliseconds. What a model cannot say (one field naming
another, a datasheet figure needing its origin, a shape too large for int64) stays in the
readers, after the model; the readers build placer's own records (``Profile``,
``Machine``, ``RunRecord``) from the model's attributes.
"""
from __future__ import annotations

import json
import math
import os
import stat
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Strict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from placer.errors import PlacerError
from placer.fileio import note_read

MiB = 2 ** 20
# The largest document read by default. Profiles and manifests are kilobytes to a few
# MiB; a measured profile of a 100k-op net is ~30 MiB (~300 B an entry). Decoding takes
# about 10x the file's size in memory, so 256 MiB is a document no run of placer writes.
MAX_DOCUMENT_BYTES = 256 * MiB
# ``placer plan --json`` of a 100k-op net is ~100 MiB (~1 KiB an op with its tensors,
# copies and schedule events); 1 GiB leaves room for 10x that.
MAX_PLAN_BYTES = 1024 * MiB
LARGEST_FLOAT = sys.float_info.max
MakeError = Callable[..., PlacerError]   # (message, hint=None) -> the exception to raise
INT64 = 2 ** 63
M = TypeVar("M", bound=BaseModel)


class NonFinite:
    """A JSON number that is no finite float: ``NaN``, ``Infinity``, ``-Infinity`` or a
    literal past the float range (``1e400``). Not a ``numbers.Number``, so a schema's
    ``"type": "number"`` refuses it at its field."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _finite_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else NonFinite(text)


def read_document(path: str | os.PathLike, what: str, error: MakeError = PlacerError, hint: str | None = None,
                  max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """The decoded JSON document at ``path`` (steps 1-3 of the module docstring): for a
    reader that looks at the document (its ``kind``) before it checks it with
    ``check_model``. ``what`` names it in messages ("machine profile"), ``error`` makes the
    exception (a PlacerError class, or any ``(message, hint=)`` callable), ``hint`` says
    what to try. The path is noted as read: no output of the command may replace it
    (``fileio.note_read``)."""
    note_read(path)
    return parse_document(_read_bytes(Path(path), what, error, hint, max_bytes), str(path), what, error, hint)


def read_model(path: str | os.PathLike, model: type[M], what: str, error: MakeError = PlacerError,
               hint: str | None = None, max_bytes: int = MAX_DOCUMENT_BYTES) -> M:
    """The JSON document at ``path`` as a ``model``: the four steps of the module docstring."""
    return check_model(read_document(path, what, error, hint, max_bytes), model, str(path), error, hint)


def read_kind(path: str | os.PathLike, model: type[M], kind: str, what: str, error: MakeError = PlacerError,
              hint: str | None = None) -> M:
    """A document that says what it is in its ``kind`` field (machine and cluster profiles):
    one of another kind is refused by name (``hint``: where that kind goes) before the model."""
    data = read_document(path, what, error)
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise error(f"{path}: not a {what} (expected \"kind\": \"{kind}\")", hint=hint)
    return check_model(data, model, str(path), error)


def _read_bytes(path: Path, what: str, error: MakeError, hint: str | None, max_bytes: int) -> bytes:
    """The file's bytes; a regular file's size is checked before it is read, a pipe
    (``<(placer plan --json ...)``) is read to one byte past the cap."""
    too_big = f"more than the {max_bytes / MiB:,.0f} MiB placer reads; is it the right file?"
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{path}: cannot read the {what}: it is a folder, not a file", hint=hint)
        if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
            raise error(f"{path}: the {what} is {st.st_size / MiB:,.0f} MiB, {too_big}", hint=hint)
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}", hint=hint) from None
    if len(data) > max_bytes:
        raise error(f"{path}: the {what} is {too_big}", hint=hint)
    return data


def parse_document(data: bytes, where: str, what: str, error: MakeError = PlacerError,
                   hint: str | None = None) -> Any:
    """Decoded JSON, with ``NonFinite`` for NaN, Infinity and out-of-range floats."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not a JSON {what}: the file is not UTF-8 text (byte {e.start})", hint=hint) from None
    if not text.strip():
        raise error(f"{where}: not a JSON {what}: the file is empty", hint=hint)
    try:
        return json.loads(text, parse_constant=NonFinite, parse_float=_finite_float)
    except RecursionError:  # the decoder recurses per level of nesting
        raise error(f"{where}: not a JSON {what}: nested too deeply to read", hint=hint) from None
    except ValueError as e:  # JSONDecodeError, and integers past Python's digit limit
        why = str(e).splitlines()[0]
        if "integer string conversion" in why:
            why = "a number of more digits than Python reads (4300)"
        raise error(f"{where}: not a JSON {what}: {why}", hint=hint) from None


def check_model(data: Any, model: type[M], where: str, error: MakeError = PlacerError,
                hint: str | None = None) -> M:
    """``data`` as a ``model``; else raise ``error`` naming the first field the model
    refuses, then the first NaN / Infinity it left untyped (an op argument, a free-form
    note)."""
    try:
        doc = model.model_validate(data)
    except ValidationError as e:
        raise error(f"{where}: {describe_error(e, model)}", hint=hint) from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to check", hint=hint) from None
    found = _first_non_finite(data)
    if found is not None:
        at, value = found
        raise error(f"{where}: field '{at}': expected a finite number, found {value}", hint=hint)
    return doc


# --------------------------------------------------------------------- messages

def field_path(parts) -> str:
    """``["devices", 2, "peak_flops"]`` -> ``devices[2].peak_flops``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def describe_error(err: ValidationError, model: type[BaseModel]) -> str:
    """One line for the first of pydantic's errors (the one nearest the top of the
    document): the field, what was expected, what was found."""
    schema = json_schema(model)
    found = [(_walk(schema, e["loc"]), e) for e in err.errors(include_url=False)]
    (nodes, path), first = min(found, key=lambda f: len(f[0][1]) - (f[1]["type"] in _KEYED))
    kind, value = first["type"], first["input"]
    if kind in ("union_tag_not_found", "union_tag_invalid") and isinstance(value, dict):
        key = first["ctx"]["discriminator"].strip("'")      # an object's tag field (its ``kind``)
        nodes, path = _walk(schema, (*first["loc"], key))
        kind, value = ("missing" if key not in value else kind), value.get(key)
    if kind == "missing" and path and isinstance(path[-1], int):   # a list too short for its items
        nodes, path = nodes[:-1], path[:-1]
        kind = "too_short"                                         # (the list is what is wrong)
    if kind == "missing":
        return f"field '{field_path(path)}': missing"
    if kind == "extra_forbidden":
        known = sorted(nodes[-2].get("properties", {})) if len(nodes) > 1 else []
        return f"field '{field_path(path)}': not a key placer knows here (known: {', '.join(known)})"
    expected = next((n["description"] for n in reversed(nodes) if n.get("description")), None)
    expected = expected or _default_expectation(first, nodes[-1])
    where = f"field '{field_path(path)}': " if path else ""
    return f"{where}expected {expected}, found {shown(value)}"


_KEYED = ("missing", "extra_forbidden")   # errors whose path names the key, one below the object
_JSON_TYPES = {dict: "object", list: "array", tuple: "array", str: "string", bool: "boolean", int: "integer",
               float: "number"}


@lru_cache(maxsize=None)
def json_schema(model: type[BaseModel]) -> dict:
    """The model's JSON Schema (what ``placer.documents`` publishes), made once."""
    return model.model_json_schema()


def _walk(schema: dict, loc) -> tuple[list[dict], list]:
    """The schema nodes along a pydantic error's ``loc``, and the loc as a document path
    (a tagged union's tag, a model's or a JSON type's, is no key of the document)."""
    defs = schema.get("$defs", {})

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
        return node

    def optional(node: dict) -> dict:   # X | None: X
        members = [resolve(m) for m in node.get("anyOf", ())]
        given = [m for m in members if m.get("type") != "null"]
        return given[0] if len(given) == 1 and len(members) == 2 else node

    node = resolve(schema)
    nodes, path = [node], []
    for part in loc:
        node = optional(node)
        members = [resolve(m) for m in node.get("oneOf") or node.get("anyOf") or ()]
        if members and isinstance(part, str):
            mapping = node.get("discriminator", {}).get("mapping", {})
            tagged = ([resolve({"$ref": mapping[part]})] if part in mapping
                      else [m for m in members if m.get("type") == part])
            if tagged:
                node = tagged[0]
                nodes.append(node)
                continue
        if members and isinstance(part, str):   # a key of a union's members: the first that has it
            node = next((m for m in members if part in m.get("properties", ())), node)
        path.append(part)
        if isinstance(part, int):
            prefix = node.get("prefixItems") or []
            nxt = prefix[part] if part < len(prefix) else node.get("items")
        else:
            nxt = node.get("properties", {}).get(part, node.get("additionalProperties"))
        node = resolve(nxt) if isinstance(nxt, dict) else {}
        nodes.append(node)
    if optional(node) is not node:   # the field's own description may be its type's
        nodes.append(optional(node))
    return nodes, path


def _default_expectation(err: ErrorDetails, node: dict) -> str:
    """What a field without a description must be, from its schema node."""
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    names = {"float_type": "a number", "int_type": "an integer", "string_type": "a string", "list_type": "a list",
             "tuple_type": "a list", "dict_type": "an object", "model_type": "an object",
             "model_attributes_type": "an object", "bool_type": "true or false", "none_required": "null"}
    if err["type"] in names:
        return names[err["type"]]
    bounds = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
              "less_than": ("lt", "<"), "too_short": ("min_length", "length >="),
              "too_long": ("max_length", "length <=")}
    if err["type"] in bounds:
        key, sign = bounds[err["type"]]
        return f"a value {sign} {err.get('ctx', {}).get(key)}"
    return str(err["msg"]).split("\n")[0][:120]


def shown(value: Any) -> str:
    """A value as a message shows it: short, on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a JSON object" if value else "an empty object"
    if isinstance(value, list):
        return "a JSON list" if value else "an empty list"
    if isinstance(value, int) and abs(value) >= 10 ** 18:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return f"{value!r:.60}"


def _first_non_finite(data: Any) -> tuple[str, str] | None:
    """(path, text) of the first NonFinite value in document order, walked without
    recursion (a document can be as deep as the decoder allows): a quick pass says whether
    there is one, a second finds the first one's path."""
    nodes = [data]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
        elif isinstance(node, NonFinite):
            break
    else:
        return None
    stack: list[tuple[Any, list]] = [(data, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, NonFinite):
            return field_path(path), node.text
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in reversed(list(enumerate(node))))
    return None




# --------------------------------------------------------------------- models

def _schema_description(schema: dict[str, Any], model: type) -> None:
    """A model's own ``DESCRIPTION`` (what an object there must be, as an error message
    says it) rather than its docstring, which is written for programmers."""
    schema.pop("description", None)
    said = getattr(model, "DESCRIPTION", None)
    if said:
        schema["description"] = said


class Open(BaseModel):
    """An object of a document that may carry keys placer does not read (kept, as
    ``model_extra``): a later version's fields, a person's notes."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_schema_description, defer_build=True)
    DESCRIPTION: ClassVar[str | None] = None


class Closed(BaseModel):
    """An object of a document a person writes whose every key placer reads: one it does
    not know is a typo (a misspelt ``peer_links`` would drop the NVLink topology) and is
    refused, naming the keys it knows."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_schema_description, defer_build=True)
    DESCRIPTION: ClassVar[str | None] = None


def json_type(value: Any) -> str:
    """The JSON type of a decoded value ("object", "array", "string", ...): the tag of a
    union of members of different types (``BY_JSON_TYPE``); a model, when the document is
    written back (``model_dump``), is the object it was read from."""
    return "object" if isinstance(value, BaseModel) else _JSON_TYPES.get(type(value), "other")


# The discriminator of a union whose members are of different JSON types, each tagged with
# its type (``Annotated[X, Tag("object")]``): a value is checked as the member of its type
# alone, so its errors are that member's, at their own fields.
BY_JSON_TYPE = Discriminator(json_type, custom_error_type="wrong_json_type",
                             custom_error_message="a value of a JSON type the field does not take")


def _not_null(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("null", "null where a value is needed")
    return value


def given(kind: Any) -> BeforeValidator:
    """An optional key that is not null: ``Annotated[X | None, given(X)] = None`` is None
    when the key is absent, and an X when it is written (null is refused, and the JSON
    Schema says X)."""
    return BeforeValidator(_not_null, json_schema_input_type=kind)


def number(description: str, minimum: float = 0.0, positive: bool = False) -> FieldInfo:
    """A finite number of at least ``minimum`` (above it, with ``positive``)."""
    if positive:
        return Field(gt=minimum, le=LARGEST_FLOAT, description=description)
    return Field(ge=minimum, le=LARGEST_FLOAT, description=description)


def within(description: str, low: float, high: float) -> FieldInfo:
    """A number from ``low`` to ``high``: a hardware figure outside any real machine's
    range (a peak of 5e-324 FLOP/s, a launch overhead of 1e308 s) is a typo, and prices
    every op as zero or forever."""
    return Field(ge=low, le=high, description=f"{description} ({low:g} to {high:g})")


# A JSON number, finite (NaN, Infinity and 1e400 are refused at their field); an integer
# is a number, a string "3" is not.
Real = Annotated[float, Strict(), Field(allow_inf_nan=False)]
# A JSON integer (not 2.0, not true), as placer writes counts and dimensions, that fits
# int64 (what Caffe2 and numpy count in: 10**400 bytes is no count).
Integer = Annotated[int, Strict(), Field(ge=-INT64, lt=INT64)]
NonNegativeInt = Annotated[Integer, Field(ge=0)]
def _whole(value: Any) -> Any:
    """``1.0`` as 1: a version is compared by value (JSON Schema's ``const``, which the
    schemas before the models checked it with), never ``true``."""
    return int(value) if type(value) is float and value.is_integer() and abs(value) < INT64 else value


# ``"schema_version": 1`` (or ``1.0``), the version of a document this placer reads
# (not ``true``)
VERSION_1 = Annotated[int, BeforeValidator(_whole), Strict(),
                      Field(ge=1, le=1, json_schema_extra={"const": 1})]
Boolean = Annotated[bool, Strict()]
FLAG = Annotated[Boolean, Field(description="true or false")]
# The ranges of real hardware, generously: anything outside is refused at its field.
FLOPS = Annotated[Real, within("FLOP/s", 1e6, 1e18)]
BYTES_PER_S = Annotated[Real, within("bytes per second", 1e3, 1e15)]
CAPACITY_BYTES = Annotated[Real, within("bytes", 1e6, 1e16)]
OVERHEAD_S = Annotated[Real, within("seconds", 0.0, 1.0)]
LATENCY_S = Annotated[Real, within("seconds", 0.0, 10.0)]
POSITIVE = Annotated[Real, number("a positive finite number", positive=True)]
NON_NEGATIVE = Annotated[Real, number("a non-negative finite number")]
COUNT = Annotated[Integer, Field(ge=1, description="a positive integer")]
TEXT = Annotated[str, Strict(), Field(description="a string")]


__all__ = ["read_document", "read_model", "parse_document", "check_model", "describe_error", "field_path", "shown",
           "json_schema", "NonFinite", "Open", "Closed", "given", "json_type", "BY_JSON_TYPE", "number", "within",
           "Real", "Integer", "NonNegativeInt", "VERSION_1", "Boolean", "FLAG", "FLOPS", "BYTES_PER_S",
           "CAPACITY_BYTES", "OVERHEAD_S", "LATENCY_S", "POSITIVE", "NON_NEGATIVE", "COUNT", "TEXT",
           "MAX_DOCUMENT_BYTES", "MAX_PLAN_BYTES"]
