"""The plan document (``placer plan --json``, docs/PLAN_JSON.md, either version): the
fields the report reads (``placer.report.doc.read_plan``), with their types. Open at every
level: fields the report does not read are free, and kept.

A number is finite, but a baseline's costs may be ``Infinity`` (``Cost``): a baseline
that cannot run at all; plans written before the plan JSON became strict JSON carry it.
"""
from __future__ import annotations

from typing import Annotated, Union

from pydantic import ConfigDict, Field, Strict, Tag

from placer.documents import BY_JSON_TYPE, Boolean, Integer, Open, Real

Str = Annotated[str, Strict()]
Num = Annotated[Real | None, Field(description="a finite number or null")]
Cost = Annotated[Annotated[float, Strict(), Field(ge=0)] | None,
                 Field(description="a number of seconds >= 0, Infinity or null")]
Names = Annotated[list[Str], Field(description="a list of names")]
Indices = Annotated[list[Integer], Field(description="a list of op indices")]
Text = Annotated[Str | None, Field(description="a string or null")]
ByDevice = dict[str, Num] | None
# the devices an op is pinned to: one name or several
Pinned = Annotated[Union[Annotated[Str, Tag("string")], Annotated[list[Str], Tag("array")]], BY_JSON_TYPE]


class ProfileRef(Open):
    """The profile a device kind was priced with."""

    name: Text = None
    source: Text = None


class MachineDeviceInfo(Open):
    """A device of the plan's machine."""

    name: Str | None = None
    kind: Text = None


class MachineInfo(Open):
    """The machine the plan is for."""

    name: Text = None
    description: Text = None
    devices: list[MachineDeviceInfo] | None = None


class OpInfo(Open):
    """An op of the plan: where it runs, its predicted time per device, why."""

    index: Integer | None = None
    name: Text = None
    type: Text = None
    device: Str | None = None
    device_kind: Text = None
    time_s: ByDevice = None
    source: dict[str, Text] | None = None
    reason: Text = None
    flops: Num = None
    param_bytes: Num = None
    output_bytes: Num = None
    outputs: Names | None = None
    pinned: Pinned | None = None
    # version-1 plans (one CPU and one GPU) priced each op per kind; version 2 gives
    # time_s per device, for any number of devices
    copies_in: Names | None = None
    copies_out: Names | None = None
    cpu_s: Num = None
    gpu_s: Num = None
    cpu_source: Text = None
    gpu_source: Text = None


class TensorInfo(Open):
    """A tensor: its producer, consumers and size."""

    name: Text = None
    producer: Integer | None = None
    consumers: Indices | None = None
    bytes: Num = None
    external_output: Boolean | None = None


class CopyInfo(Open):
    """A copy of a tensor between two devices."""

    src: Str | None = None
    dst: Str | None = None
    direction: Text = None
    bytes: Num = None
    time_s: Num = None
    producer: Integer | None = None
    consumers: Indices | None = None


class Baseline(Open):
    """A baseline placement's cost (all on the CPU, greedy, ...)."""

    total_s: Cost = None
    compute_s: Cost = None
    copy_s: Cost = None
    makespan_s: Cost = None
    feasible: Boolean | None = None
    label: Text = None
    gpu_ops: Num = None
    gpu_memory_bytes: Num = None
    devices_used: Names | None = None
    why_infeasible: Text = None
    note: Text = None


class GpuMemory(Open):
    """The busiest GPU's memory figures (version 1's ``gpu_memory``)."""

    __pydantic_extra__: dict[str, Num] = Field(init=False)   # type: ignore[assignment]
    device: Text = None


class LinkBytes(Open):
    """Bytes copied over one link."""

    src: Str | None = None
    dst: Str | None = None
    bytes: Num = None
    copies: Num = None
    time_s: Num = None


class Event(Open):
    """An event of a schedule: an op or a copy on a lane, from start_s to end_s."""

    lane: Str | None = None
    kind: Text = None
    name: Text = None
    type: Text = None
    op: Integer | None = None
    bytes: Num = None
    start_s: Annotated[Real, Field(description="a finite number or null")]
    end_s: Annotated[Real, Field(description="a finite number or null")]


class Schedule(Open):
    """A schedule of the plan (serial, or the makespan simulator's)."""

    makespan_s: Num = None
    events: list[Event] | None = None


class PlanDocument(Open):
    """What ``placer plan --json`` prints (docs/PLAN_JSON.md)."""

    model_config = ConfigDict(title="placer plan document")
    DESCRIPTION = "a JSON object (what placer plan --json prints)"
    schema_version: Integer | None = None
    net: Text = None
    path: Text = None
    objective: Text = None
    method: Text = None
    solver: Text = None
    total_s: Num = None
    compute_s: Num = None
    copy_s: Num = None
    gap: Num = None
    optimal: Boolean | None = None
    optimality: Text = None
    outputs_on_host: Boolean | None = None
    notes: list[Str] | None = None
    devices: Names | None = None
    profiles: dict[str, ProfileRef] | None = None
    machine: MachineInfo | None = None
    ops: Annotated[list[OpInfo], Field(description="a list of op objects")]
    tensors: list[TensorInfo] | None = None
    copies: list[CopyInfo] | None = None
    baselines: dict[str, Baseline] | None = None
    memory: dict[str, dict[str, Num]] | None = None
    gpu_memory: GpuMemory | None = None
    memory_timeline: dict[str, list[Num]] | None = None
    link_bytes: list[LinkBytes] | None = None
    pcie_bytes: ByDevice = None
    schedules: dict[str, Schedule] | None = None


__all__ = ["PlanDocument", "OpInfo", "TensorInfo", "CopyInfo", "Baseline", "Event", "Schedule"]
