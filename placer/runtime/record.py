"""RunRecord as JSON: what ``placer run --record`` writes and the report reads back.

The file is plain JSON with a ``schema`` tag and version so that a reader can refuse a
file it does not understand; it is written atomically (``placer.fileio``).

Conventions: times are seconds (median over the timed runs; ``samples_s`` every sample up
to 256 runs, a uniform sample of 256 beyond, with ``count``, ``mean_s``, ``std_s``,
``min_s``, ``max_s`` over all of them: ``runtime.timing``); an op's
``device`` is the device it is placed on and timed on (a copy's GPU end, as Caffe2 places
copies); a copy's transfers are in ``links`` (source, target, bytes) and summed in
``copy_bytes`` / ``copy_direction``; ``timing_labels`` says how each device's times must
be read (an emulated GPU's are CPU times); ``peak_bytes`` counts live blobs (parameters,
fed inputs, activations until their last reader) per device, not allocator overhead.

Derived figures written beside them for readers without placer: ``total_s``,
``copy_bytes`` per direction, ``time_by_device_s`` and ``link_bytes`` per
"source->target" link. Files of version 1 written before ``links`` existed read back
with no links; those written before the running figures get them from their samples.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields

from placer.documents import TEXT, check_document, number, read_document
from placer.errors import PlacerError, excerpt
from placer.fileio import atomic_write_text
from placer.runtime.timing import running
from placer.types import OpRun, RunRecord

SCHEMA = "placer.run_record"
SCHEMA_VERSION = 1


def to_dict(record: RunRecord) -> dict:
    data = asdict(record)
    data["ops"] = [dict(o, samples_s=list(o["samples_s"]), links=[list(link) for link in o["links"]])
                   for o in data["ops"]]
    data["devices"] = list(record.devices)
    data["total_s"] = record.total_s
    data["copy_bytes"] = {d: record.copy_bytes(d) for d in ("h2d", "d2h", "d2d", "h2h")}
    data["time_by_device_s"] = record.time_by_device_s()
    data["link_bytes"] = record.link_bytes()
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **data}


_SECONDS = number("a non-negative finite number of seconds")
_BYTES = {"type": "integer", "minimum": 0, "description": "a non-negative integer number of bytes"}
# A run record file, as JSON Schema (placer.documents). The derived figures (total_s,
# copy_bytes, time_by_device_s, link_bytes) are written for other readers; placer
# recomputes them.
RUN_RECORD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "placer run record",
    "type": "object", "description": "a JSON object",
    "required": ["schema", "schema_version", "net_name", "devices", "ops", "peak_bytes", "emulated",
                 "iterations", "warmup"],
    "properties": {
        "schema": {"const": SCHEMA}, "schema_version": {"const": SCHEMA_VERSION},
        "net_name": TEXT, "devices": {"type": "array", "items": TEXT, "description": "a list of device names"},
        "ops": {"type": "array", "items": {
            "type": "object", "required": ["index", "name", "type", "device", "time_s"], "properties": {
                "index": {"type": "integer", "minimum": 0, "description": "an op index (0 or more)"},
                "name": TEXT, "type": TEXT, "device": TEXT, "time_s": _SECONDS,
                "samples_s": {"type": "array", "items": _SECONDS}, "copy_bytes": _BYTES, "copy_direction": TEXT,
                "count": {"type": "integer", "minimum": 0, "description": "a count of timed runs (0 or more)"},
                "mean_s": _SECONDS, "std_s": _SECONDS, "min_s": _SECONDS, "max_s": _SECONDS,
                "links": {"type": "array", "items": {
                    "type": "array", "minItems": 3, "maxItems": 3, "description": "[source, target, bytes]",
                    "prefixItems": [TEXT, TEXT, _BYTES]}}}}},
        "peak_bytes": {"type": "object", "additionalProperties": _BYTES},
        "emulated": {"type": "boolean", "description": "true or false"},
        "iterations": {"type": "integer", "minimum": 0, "description": "an integer >= 0"},
        "warmup": {"type": "integer", "minimum": 0, "description": "an integer >= 0"},
        "timing_labels": {"type": "object", "additionalProperties": TEXT}}}
HINT = "write it again with `placer run --record`"


def check_dict(data, where: str = "run record", error: type = PlacerError) -> dict:
    """``data`` if it is a run record of this version (``RUN_RECORD_SCHEMA``), else an error
    naming the field."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION:
        found = (data.get("schema"), data.get("schema_version")) if isinstance(data, dict) else (None, None)
        raise error(f"{where}: not a placer run record of version {SCHEMA_VERSION} "
                    f"(schema {excerpt(repr(found[0]), 40)}, version {excerpt(repr(found[1]), 40)})", hint=HINT)
    check_document(data, RUN_RECORD_SCHEMA, where, error, HINT)
    return data


def from_dict(data: dict, where: str = "run record") -> RunRecord:
    check_dict(data, where)
    known = {f.name for f in fields(OpRun)}    # a field a later version adds is left out
    # a record without the running figures (written before they were kept) gets them
    # from its samples
    ops = tuple(OpRun(**{**running(o.get("samples_s", ())).summary(), **{k: v for k, v in o.items() if k in known},
                         "samples_s": tuple(o.get("samples_s", ())),
                         "links": tuple((a, b, n) for a, b, n in o.get("links", ()))})
                for o in data["ops"])
    return RunRecord(net_name=data["net_name"], devices=tuple(data["devices"]), ops=ops,
                     peak_bytes=dict(data["peak_bytes"]), emulated=data["emulated"],
                     iterations=data["iterations"], warmup=data["warmup"],
                     timing_labels=dict(data.get("timing_labels", {})))


def save(record: RunRecord, path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps(to_dict(record), indent=1) + "\n")


def read_dict(path: str | os.PathLike, error: type = PlacerError) -> dict:
    """A run record file as the checked dict the report and trace read."""
    return check_dict(read_document(path, None, "run record", error, HINT), str(path), error)


def load(path: str | os.PathLike) -> RunRecord:
    return from_dict(read_dict(path), str(path))
