"""A run record (``placer run --record``, ``placer.runtime.record``): what ran where and
how long it took. Open: a key a later version adds is kept, not refused. The derived
figures (``total_s``, ``copy_bytes``, ``time_by_device_s``, ``link_bytes``) are written for
other readers; placer recomputes them."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from placer.documents import FLAG, TEXT, VERSION_1, NonNegativeInt, Open, Real, given, number

RUN_RECORD_SCHEMA = "placer.run_record"   # the file's ``schema`` tag
RUN_RECORD_VERSION = 1

Seconds = Annotated[Real, number("a non-negative finite number of seconds")]
Bytes = Annotated[NonNegativeInt, Field(description="a non-negative integer number of bytes")]
Count = Annotated[NonNegativeInt, Field(description="a count of timed runs (0 or more)")]


class OpRunEntry(Open):
    """One op of the run: where it ran, its time and samples, the bytes it copied."""

    index: Annotated[NonNegativeInt, Field(description="an op index (0 or more)")]
    name: TEXT
    type: TEXT
    device: TEXT
    time_s: Seconds
    samples_s: list[Seconds] = []
    copy_bytes: Bytes = 0
    copy_direction: TEXT = ""
    count: Annotated[Count | None, given(Count)] = None
    mean_s: Annotated[Seconds | None, given(Seconds)] = None
    std_s: Annotated[Seconds | None, given(Seconds)] = None
    min_s: Annotated[Seconds | None, given(Seconds)] = None
    max_s: Annotated[Seconds | None, given(Seconds)] = None
    links: list[Annotated[tuple[TEXT, TEXT, Bytes], Field(description="[source, target, bytes]")]] = []


class RunRecordDocument(Open):
    """A run record file."""

    model_config = ConfigDict(title="placer run record", populate_by_name=True)
    DESCRIPTION = "a JSON object"
    schema_: Literal["placer.run_record"] = Field(alias="schema")
    schema_version: VERSION_1
    net_name: TEXT
    devices: Annotated[list[TEXT], Field(description="a list of device names")]
    ops: list[OpRunEntry]
    peak_bytes: dict[str, Bytes]
    emulated: FLAG
    iterations: Annotated[NonNegativeInt, Field(description="an integer >= 0")]
    warmup: Annotated[NonNegativeInt, Field(description="an integer >= 0")]
    timing_labels: dict[str, TEXT] = {}
    conv_engines: Annotated[dict[str, NonNegativeInt], Field(
        description="convolution ops per engine (cudnn, matmul, numpy)")] = {}


__all__ = ["RUN_RECORD_SCHEMA", "RUN_RECORD_VERSION", "RunRecordDocument", "OpRunEntry"]
