"""Every JSON document placer reads goes through ``read_document``: device, machine and
cluster profiles, cluster manifests, run records, plan documents and ``value_info.json``.

One reader, four steps, each failure one line naming the file (a ``PlacerError`` of the
kind the caller gives, so exit code 2):

1. the file: a regular file of at most ``max_bytes`` (checked with ``stat`` before it is
   read whole: a 40 GiB file named by mistake is refused, not loaded), readable;
2. the text: UTF-8;
3. the JSON: the decoder's errors, integers past Python's digit limit, and nesting too
   deep for the decoder (it recurses per level: ``[`` x 100000 is a ``RecursionError``);
   ``NaN``, ``Infinity`` and numbers too large for a float (``1e400``) are kept as
   ``NonFinite`` values, so that the schema refuses them at their field;
4. the schema: a JSON Schema (draft 2020-12) the caller declares, checked by
   ``jsonschema``; the first error by ``jsonschema.exceptions.best_match`` is reported as
   ``file: field 'devices[2].peak_flops': expected <what>, found <value>``. ``<what>`` is
   the ``description`` of the failing part of the schema, or of the nearest part above
   it, so a schema says in its own words what a field must be.

Why JSON Schema (with ``jsonschema``) rather than typed models (pydantic): the documents
are plain JSON files that users write by hand and share; a JSON Schema is itself a JSON
document, so the schemas here can be published beside the files they describe
(``json.dumps(MACHINE_SCHEMA)``) and checked by any other tool; errors come with the
JSON path of the field, which is what a person editing the file needs; and no class
hierarchy mirrors the files: the readers keep building placer's own records (``Profile``,
``Machine``, ``RunRecord``) from the checked data. What a schema cannot say (one field
naming another, a datasheet figure needing its origin, a shape too large for int64) stays
in the readers, after the schema.

Cost: jsonschema checks in Python, about 0.5-0.9 s per MiB of document on the 2-core host
(a 3000-op plan, 2.9 MiB: 2.5 s); profiles and machine files take milliseconds. The
report that reads a plan spends longer drawing it.
"""
from __future__ import annotations

import json
import math
import os
import stat
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

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


def read_document(path: str | os.PathLike, schema: dict | None, what: str, error: MakeError = PlacerError,
                  hint: str | None = None, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON document at ``path``, checked against ``schema`` (module docstring);
    ``what`` names it in messages ("machine profile"), ``error`` makes the exception (a
    PlacerError class, or any ``(message, hint=)`` callable), ``hint`` says what to try.
    The path is noted as read: no output of the command may replace it (``fileio.note_read``)."""
    note_read(path)
    data = parse_document(_read_bytes(Path(path), what, error, hint, max_bytes), str(path), what, error, hint)
    if schema is not None:
        check_document(data, schema, str(path), error, hint)
    return data


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


def check_document(data: Any, schema: dict, where: str, error: MakeError = PlacerError,
                   hint: str | None = None) -> None:
    """Raise ``error`` naming the first field of ``data`` that ``schema`` refuses, then the
    first NaN / Infinity the schema left untyped (an op argument, a free-form note)."""
    from jsonschema.exceptions import best_match
    try:
        found = best_match(_validator(_key(schema)).iter_errors(data))
    except RecursionError:
        raise error(f"{where}: nested too deeply to check", hint=hint) from None
    if found is not None:
        raise error(f"{where}: {describe_error(found, schema)}", hint=hint)
    found = _first_non_finite(data)
    if found is not None:
        at, value = found
        raise error(f"{where}: field '{at}': expected a finite number, found {value}", hint=hint)


# --------------------------------------------------------------------- messages

def field_path(parts) -> str:
    """``["devices", 2, "peak_flops"]`` -> ``devices[2].peak_flops``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def describe_error(err, schema: dict) -> str:
    """One line for a ``jsonschema`` error: the field, what was expected, what was found."""
    path = list(err.absolute_path)
    if err.validator == "required":
        missing = next((k for k in err.validator_value if k not in err.instance), "?")
        return f"field '{field_path([*path, missing])}': missing"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = list(err.schema.get("properties", {}))
        extra = next((k for k in err.instance if k not in known), "?")
        return f"field '{field_path([*path, extra])}': not a key placer knows here (known: {', '.join(known)})"
    expected = _description(schema, list(err.absolute_schema_path)) or _default_expectation(err)
    where = f"field '{field_path(path)}': " if path else ""
    return f"{where}expected {expected}, found {shown(err.instance)}"


def _description(schema: dict, schema_path: list) -> str | None:
    """The ``description`` nearest the failing keyword along its schema path."""
    found, node = schema.get("description"), schema
    for key in schema_path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
        if isinstance(node, dict) and node.get("description"):
            found = node["description"]
    return found


def _default_expectation(err) -> str:
    names = {"number": "a number", "integer": "an integer", "string": "a string", "array": "a list",
             "object": "an object", "boolean": "true or false", "null": "null"}
    v = err.validator_value
    if err.validator == "type":
        return " or ".join(names.get(t, t) for t in (v if isinstance(v, list) else [v]))
    if err.validator == "enum":
        return "one of " + ", ".join(map(str, v))
    if err.validator == "const":
        return json.dumps(v)
    return err.message.split("\n")[0][:120]


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
    recursion (a document can be as deep as the decoder allows)."""
    stack = [(data, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, NonFinite):
            return field_path(path), node.text
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in reversed(list(enumerate(node))))
    return None


# --------------------------------------------------------------------- schemas

def number(description: str, minimum: float = 0.0, positive: bool = False) -> dict:
    """A finite JSON number of at least ``minimum`` (above it, with ``positive``)."""
    bound = {"exclusiveMinimum": minimum} if positive else {"minimum": minimum}
    return {"type": "number", **bound, "maximum": LARGEST_FLOAT, "description": description}


def within(description: str, low: float, high: float) -> dict:
    """A JSON number from ``low`` to ``high``: a hardware figure outside any real machine's
    range (a peak of 5e-324 FLOP/s, a launch overhead of 1e308 s) is a typo, and prices
    every op as zero or forever."""
    return {"type": "number", "minimum": low, "maximum": high, "description": f"{description} ({low:g} to {high:g})"}


# The ranges of real hardware, generously: anything outside is refused at its field.
FLOPS = within("FLOP/s", 1e6, 1e18)
BYTES_PER_S = within("bytes per second", 1e3, 1e15)
CAPACITY_BYTES = within("bytes", 1e6, 1e16)
OVERHEAD_S = within("seconds", 0.0, 1.0)
LATENCY_S = within("seconds", 0.0, 10.0)
POSITIVE = number("a positive finite number", positive=True)
NON_NEGATIVE = number("a non-negative finite number")
COUNT = {"type": "integer", "minimum": 1, "description": "a positive integer"}
TEXT = {"type": "string", "description": "a string"}


def _key(schema: dict) -> str:
    return json.dumps(schema, sort_keys=True)


@lru_cache(maxsize=None)
def _validator(schema_json: str):
    """A draft 2020-12 validator whose ``integer`` is a JSON integer only (not 2.0, not
    true), as placer writes counts and dimensions, and one that fits int64 (what Caffe2
    and numpy count in: 10**400 bytes is no count). jsonschema is imported here, on the
    first document read, not by every command."""
    from jsonschema import Draft202012Validator, validators
    checker = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64)
    cls = validators.extend(Draft202012Validator, type_checker=checker)
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return cls(schema)


__all__ = ["read_document", "parse_document", "check_document", "describe_error", "field_path", "shown",
           "NonFinite", "number", "POSITIVE", "NON_NEGATIVE", "COUNT", "TEXT", "MAX_DOCUMENT_BYTES",
           "MAX_PLAN_BYTES"]
