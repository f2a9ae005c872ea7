"""RunRecord as JSON: what ``placer run --record`` writes and the report reads back.

The file is plain JSON with a ``schema`` tag and version so that a reader can refuse a
file it does not understand; it is written atomically (``placer.fileio``).

Conventions: times are seconds (median over the timed runs; ``samples_s`` every sample up
to 256 runs, a uniform sample of 256 beyond, with ``count``, ``mean_s``, ``std_s``,
``min_s``, ``max_s`` over all of them: ``runtime.timing``); an op's
``device`` is the device it is placed on and timed on (a copy's GPU end, as Caffe2 places
copies); a copy's transfers are in ``links`` (source, target, bytes) and summed in
``copy_bytes`` / ``copy_direction``; ``timing_labels`` says how each device's times must
be read (an emulated GPU's are CPU times); ``conv_engines`` counts the convolution ops
by the engine that ran them (optional: absent in older files); ``peak_bytes`` counts live blobs (parameters,
fed inputs, activations until their last reader) per device, not allocator overhead.

Derived figures written beside them for readers without placer: ``total_s``,
``copy_bytes`` per direction, ``time_by_device_s`` and ``link_bytes`` per
"source->target" link. Files of version 1 written before ``links`` existed read back
with no links; those written before the running figures get them from their samples.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict

from placer.documents import check_model, read_document
from placer.documents.run_record import RUN_RECORD_SCHEMA, RUN_RECORD_VERSION, OpRunEntry, RunRecordDocument
from placer.errors import PlacerError, excerpt
from placer.fileio import atomic_write_text
from placer.runtime.timing import running
from placer.types import OpRun, RunRecord

def to_dict(record: RunRecord) -> dict:
    data = asdict(record)
    data["ops"] = [dict(o, samples_s=list(o["samples_s"]), links=[list(link) for link in o["links"]])
                   for o in data["ops"]]
    data["devices"] = list(record.devices)
    data["total_s"] = record.total_s
    data["copy_bytes"] = {d: record.copy_bytes(d) for d in ("h2d", "d2h", "d2d", "h2h")}
    data["time_by_device_s"] = record.time_by_device_s()
    data["link_bytes"] = record.link_bytes()
    return {"schema": RUN_RECORD_SCHEMA, "schema_version": RUN_RECORD_VERSION, **data}


HINT = "write it again with `placer run --record`"


def check_record(data, where: str = "run record", error: type = PlacerError) -> RunRecordDocument:
    """``data`` as a ``RunRecordDocument`` if it is a run record of this version, else an
    error naming the field."""
    if (not isinstance(data, dict) or data.get("schema") != RUN_RECORD_SCHEMA
            or data.get("schema_version") != RUN_RECORD_VERSION):
        found = (data.get("schema"), data.get("schema_version")) if isinstance(data, dict) else (None, None)
        raise error(f"{where}: not a placer run record of version {RUN_RECORD_VERSION} "
                    f"(schema {excerpt(repr(found[0]), 40)}, version {excerpt(repr(found[1]), 40)})", hint=HINT)
    return check_model(data, RunRecordDocument, where, error, HINT)


def from_dict(data: dict, where: str = "run record") -> RunRecord:
    return from_document(check_record(data, where))


def from_document(doc: RunRecordDocument) -> RunRecord:
    return RunRecord(net_name=doc.net_name, devices=tuple(doc.devices), ops=tuple(_op_run(o) for o in doc.ops),
                     peak_bytes=dict(doc.peak_bytes), emulated=doc.emulated, iterations=doc.iterations,
                     warmup=doc.warmup, timing_labels=dict(doc.timing_labels),
                     conv_engines=dict(doc.conv_engines))


def _op_run(o: OpRunEntry) -> OpRun:
    """An op of a record; one without the running figures (written before they were kept)
    gets them from its samples."""
    summary = running(o.samples_s).summary()

    def given(value, key: str):
        return summary[key] if value is None else value
    return OpRun(index=o.index, name=o.name, type=o.type, device=o.device, time_s=o.time_s,
                 samples_s=tuple(o.samples_s), copy_bytes=o.copy_bytes, copy_direction=o.copy_direction,
                 links=tuple(o.links), count=given(o.count, "count"), mean_s=given(o.mean_s, "mean_s"),
                 std_s=given(o.std_s, "std_s"), min_s=given(o.min_s, "min_s"), max_s=given(o.max_s, "max_s"))


def save(record: RunRecord, path: str | os.PathLike) -> None:
    atomic_write_text(path, json.dumps(to_dict(record), indent=1) + "\n")


def read_dict(path: str | os.PathLike, error: type = PlacerError) -> dict:
    """A run record file as the checked dict the report and trace read."""
    data = read_document(path, "run record", error, HINT)
    check_record(data, str(path), error)
    return data


def load(path: str | os.PathLike) -> RunRecord:
    return from_document(check_record(read_document(path, "run record", PlacerError, HINT), str(path)))
