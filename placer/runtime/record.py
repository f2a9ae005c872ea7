"""RunRecord as JSON: what ``placer run --record`` writes and the report reads back.

The file is plain JSON with a ``schema`` tag and version so that a reader can refuse a
file it does not understand; it is written atomically (``placer.fileio``).

Conventions: times are seconds (median over the timed runs, every sample kept); an op's
``device`` is the device it is placed on and timed on (a copy's GPU end, as Caffe2 places
copies); a copy's transfers are in ``links`` (source, target, bytes) and summed in
``copy_bytes`` / ``copy_direction``; ``timing_labels`` says how each device's times must
be read (an emulated GPU's are CPU times); ``peak_bytes`` counts live blobs (parameters,
fed inputs, activations until their last reader) per device, not allocator overhead.

Derived figures written beside them for readers without placer: ``total_s``,
``copy_bytes`` per direction, ``time_by_device_s`` and ``link_bytes`` per
"source->target" link. Files of version 1 written before ``links`` existed read back
with no links.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict

from placer.errors import PlacerError
from placer.fileio import atomic_write_text, note_read
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


def from_dict(data: dict, where: str = "run record") -> RunRecord:
    if data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION:
        raise PlacerError(f"{where}: not a placer run record of version {SCHEMA_VERSION} "
                          f"(schema {data.get('schema')!r}, version {data.get('schema_version')!r})",
                          hint="write it again with `placer run --record`")
    try:
        ops = tuple(OpRun(**{**o, "samples_s": tuple(o.get("samples_s", ())),
                             "links": tuple((str(a), str(b), int(n)) for a, b, n in o.get("links", ()))})
                    for o in data["ops"])
        return RunRecord(net_name=data["net_name"], devices=tuple(data["devices"]), ops=ops,
                         peak_bytes={k: int(v) for k, v in data["peak_bytes"].items()},
                         emulated=bool(data["emulated"]), iterations=int(data["iterations"]),
                         warmup=int(data["warmup"]), timing_labels=dict(data.get("timing_labels", {})))
    except (KeyError, TypeError, ValueError) as e:
        raise PlacerError(f"{where}: malformed run record ({e!r})") from e


def save(record: RunRecord, path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps(to_dict(record), indent=1) + "\n")


def load(path: str | os.PathLike) -> RunRecord:
    note_read(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise PlacerError(f"{path}: cannot read run record ({e})") from e
    return from_dict(data, str(path))
