"""The manifest of a cluster plan directory (``OUTDIR/manifest.json``, written and read by
``placer.rewrite.manifest``): what runs where. Open: the fields placer reads are typed,
the rest (``inputs``' shapes, each message's details) are free."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from placer.documents import VERSION_1, Integer, NonNegativeInt, Open, Real, given

MANIFEST_SCHEMA = "placer.cluster_manifest"   # the manifest's ``schema`` tag
MANIFEST_VERSION = 1

Text = Annotated[str, Field(strict=True)]
Names = Annotated[list[Text], Field(description="a list of names")]
FileName = Annotated[Text, Field(min_length=1, description="a file name inside OUTDIR")]
Seconds = Annotated[Annotated[Real, Field(ge=0)] | None,
                    Field(description="a non-negative finite number of seconds or null")]


class ClusterPart(Open):
    """The cluster the plan is for."""

    name: Text
    hosts: Names = []


class World(Open):
    """The common world the workers join."""

    size: Annotated[Integer, Field(ge=1)]
    blob: Text = ""
    engine: Text = ""


class Predicted(Open):
    """The plan's predicted step."""

    serial_s: Seconds = None
    makespan_s: Seconds = None


class Worker(Open):
    """One worker process: its rank, host, devices, nets and what the driver feeds it."""

    rank: NonNegativeInt
    host: Annotated[Text, Field(min_length=1)]
    devices: Names
    gpus: Annotated[NonNegativeInt, Field(description="a GPU count")]
    net: FileName
    init_net: FileName
    inputs: Names
    outputs: Names
    predicted_s: Seconds = None


class Manifest(Open):
    """manifest.json of a cluster plan directory."""

    model_config = ConfigDict(title="placer cluster manifest", populate_by_name=True)
    DESCRIPTION = "a JSON object"
    schema_: Literal["placer.cluster_manifest"] = Field(alias="schema")
    schema_version: VERSION_1
    net: Text
    cluster: ClusterPart
    world: World
    inputs: dict[str, Any] = {}
    outputs: Names = []
    placed_net: Annotated[FileName | None, given(FileName)] = None
    one_process_net: FileName
    one_process_gpus: NonNegativeInt = 0
    predicted: Predicted
    workers: Annotated[list[Worker], Field(min_length=1, description="a non-empty list of workers")]
    messages: list[dict[str, Any]] = []


__all__ = ["MANIFEST_SCHEMA", "MANIFEST_VERSION", "Manifest", "Worker"]
