"""A collectives measurement file (``placer profile --collectives``,
``placer.profiling.collective_bench``): NCCL collective times on one set of GPUs. Open."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from placer.documents import NON_NEGATIVE, TEXT, VERSION_1, Integer, NonNegativeInt, Open

MEASUREMENTS_KIND = "collectives"   # the file's ``kind``
MEASUREMENTS_VERSION = 1


class Point(Open):
    """One timed collective of one size."""

    kind: TEXT
    nbytes: Annotated[NonNegativeInt, Field(description="bytes (0 or more)")]
    time_s: NON_NEGATIVE
    algbw_bytes_per_s: NON_NEGATIVE
    busbw_bytes_per_s: NON_NEGATIVE


class Measurements(Open):
    """A collectives measurement file."""

    model_config = ConfigDict(title="placer collectives measurements")
    DESCRIPTION = "a JSON object"
    kind: Literal["collectives"]
    schema_version: VERSION_1
    gpus: Annotated[list[NonNegativeInt], Field(description="a list of GPU numbers")]
    gpu_names: list[TEXT]
    nccl_version: Integer
    points: list[Point]
    fits: dict[str, dict[str, Any]] = {}
    model: list[dict[str, Any]] = []
    host: TEXT = ""
    date: TEXT = ""


__all__ = ["MEASUREMENTS_KIND", "MEASUREMENTS_VERSION", "Measurements", "Point"]
