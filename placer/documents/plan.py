"""The plan document (``placer plan --json``, docs/PLAN_JSON.md, either version): the
fields the report and ``placer plan``'s table read, with their types. The report reads a
plan only as this model: from a file (``placer.report.doc.read_plan``) or from the dict
``placer.planning.view.plan_json`` builds (``placer.report.doc.as_plan``). Open at every
level: fields nothing reads are free, and kept; every field read is declared here, and an
absent one is None.

A number read from a file is finite, but a baseline's costs may be ``Infinity``
(``Cost``): a baseline that cannot run at all; plans written before the plan JSON became
strict JSON carry it. A plan built in memory may hold inf where its JSON text writes null
(``Number``). An integer stays an int (``bytes``, ``copies``), so that what the report
prints of it is what the plan says.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, Strict, Tag, ValidatorFunctionWrapHandler, WrapValidator

from placer.documents import BY_JSON_TYPE, Boolean, Integer, Open, given


def _keep_int(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A number as it was given: an integer (``bytes``, ``copies``) stays an int, so that
    the report formats it as the plan wrote it; a float is checked as a float."""
    checked = handler(value)
    return value if type(value) is int else checked


# A JSON number: an int stays an int, a float a float. A plan read from a file has no
# NaN or Infinity here (the reader gives them as ``NonFinite``, which is no float); a plan
# built in memory (``placer plan --report``) may carry inf (no kernel on a device), which
# its JSON text writes as null.
Number = Annotated[float, Strict(), WrapValidator(_keep_int)]
Str = Annotated[str, Strict()]
Num = Annotated[Number | None, Field(description="a finite number or null")]
Cost = Annotated[Annotated[Number, Field(ge=0)] | None,
                 Field(description="a number of seconds >= 0, Infinity or null")]
Names = Annotated[list[Str], Field(description="a list of names")]
Indices = Annotated[list[Integer], Field(description="a list of op indices")]
Text = Annotated[Str | None, Field(description="a string or null")]
ByDevice = dict[str, Num] | None
# keys that may be absent (None) but not null
OptStr = Annotated[Str | None, given(Str)]
OptInt = Annotated[Integer | None, given(Integer)]
OptBool = Annotated[Boolean | None, given(Boolean)]
OptNames = Annotated[Names | None, given(Names)]
OptIndices = Annotated[Indices | None, given(Indices)]
# the devices an op is pinned to: one name or several
Pinned = Annotated[Union[Annotated[Str, Tag("string")], Annotated[list[Str], Tag("array")]], BY_JSON_TYPE]


class ProfileRef(Open):
    """The profile a device kind was priced with."""

    name: Text = None
    source: Text = None
    path: Text = None


class MachineDeviceInfo(Open):
    """A device of the plan's machine."""

    name: OptStr = None
    kind: Text = None


class MachineInfo(Open):
    """The machine the plan is for."""

    name: Text = None
    description: Text = None
    devices: Annotated[list[MachineDeviceInfo] | None, given(list[MachineDeviceInfo])] = None


class OpInfo(Open):
    """An op of the plan: where it runs, its predicted time per device, why."""

    index: OptInt = None
    name: Text = None
    type: Text = None
    device: OptStr = None
    device_kind: Text = None
    time_s: ByDevice = None
    source: dict[str, Text] | None = None
    # what the GPU kernel model assumed (cuDNN algorithm and pass, cuBLAS GEMM, math): one
    # text when every GPU priced it alike, else GPU -> text
    gpu_kernel: Text | dict[str, Text] | None = None
    reason: Text = None
    flops: Num = None
    param_bytes: Num = None
    output_bytes: Num = None
    outputs: OptNames = None
    pinned: Pinned | None = None
    # version-1 plans (one CPU and one GPU) priced each op per kind; version 2 gives
    # time_s per device, for any number of devices
    copies_in: OptNames = None
    copies_out: OptNames = None
    cpu_s: Num = None
    gpu_s: Num = None
    cpu_source: Text = None
    gpu_source: Text = None
    stability: OpStability | None = None


class OpStability(Open):
    """How often the op moved device when its times were redrawn (the stability check)."""

    flips: OptInt = None
    draws: OptInt = None
    moves_to: Text = None


class Stability(Open):
    """The stability check: the plan re-solved with redrawn op times."""

    draws: OptInt = None
    flipping_ops: OptInt = None
    flipped_draws: OptInt = None
    summary: Text = None
    seconds: Num = None


class TensorInfo(Open):
    """A tensor: its producer, consumers and size."""

    name: Text = None
    producer: OptInt = None
    consumers: OptIndices = None
    bytes: Num = None
    external_output: OptBool = None


class CopyInfo(Open):
    """A copy of a tensor between two devices."""

    tensor: Text = None
    src: OptStr = None
    dst: OptStr = None
    direction: Text = None
    bytes: Num = None
    time_s: Num = None
    producer: OptInt = None
    consumers: OptIndices = None


class Baseline(Open):
    """A baseline placement's cost (all on the CPU, greedy, ...)."""

    total_s: Cost = None
    compute_s: Cost = None
    copy_s: Cost = None
    makespan_s: Cost = None
    feasible: OptBool = None
    label: Text = None
    gpu_ops: Num = None
    gpu_memory_bytes: Num = None
    devices_used: OptNames = None
    why_infeasible: Text = None
    note: Text = None
    reason: Text = None


class Memory(Open):
    """A device's memory figures, in bytes (``usable_bytes``: what plans may use, None: no
    limit)."""

    __pydantic_extra__: dict[str, Num] = Field(init=False)   # type: ignore[assignment]
    used_bytes: Num = None
    param_bytes: Num = None
    peak_activation_bytes: Num = None
    capacity_bytes: Num = None
    usable_bytes: Num = None


class GpuMemory(Memory):
    """The busiest GPU's memory figures (version 1's ``gpu_memory``)."""

    device: Text = None


class LinkBytes(Open):
    """Bytes copied over one link."""

    src: OptStr = None
    dst: OptStr = None
    bytes: Num = None
    copies: Num = None
    time_s: Num = None


class Event(Open):
    """An event of a schedule: an op or a copy on a lane, from start_s to end_s."""

    lane: OptStr = None
    kind: Text = None
    src: Text = None
    dst: Text = None
    tensor: Text = None
    name: Text = None
    type: Text = None
    op: Integer | None = None
    bytes: Num = None
    start_s: Annotated[Number, Field(description="a finite number or null")]
    end_s: Annotated[Number, Field(description="a finite number or null")]


class Schedule(Open):
    """A schedule of the plan (serial, or the makespan simulator's)."""

    makespan_s: Num = None
    events: Annotated[list[Event] | None, given(list[Event])] = None


# The math GPU work was priced in (``placer.costs.precision.PRECISIONS``, which a test keeps
# equal to these; the documents import no stage); absent in plans written before it.
Precision = Annotated[Literal["fp32", "tf32", "fp16", "bf16", "amp"] | None,
                      Field(description="one of fp32, tf32, fp16, bf16, amp, or null")]


class PlanDocument(Open):
    """What ``placer plan --json`` prints (docs/PLAN_JSON.md)."""

    model_config = ConfigDict(title="placer plan document")
    DESCRIPTION = "a JSON object (what placer plan --json prints)"
    schema_version: OptInt = None
    net: Text = None
    path: Text = None
    objective: Text = None
    method: Text = None
    solver: Text = None
    precision: Precision = None
    # GPUs without the math the precision asks for, and what their work was priced in
    precision_notes: list[str] | None = None
    total_s: Num = None
    compute_s: Num = None
    copy_s: Num = None
    gap: Num = None
    optimal: Boolean | None = None
    optimality: Text = None
    outputs_on_host: OptBool = None
    notes: Annotated[list[Str] | None, given(list[Str])] = None
    # blobs whose size depends on the data, priced at their bound: {blob: {shape, bound}}
    bounded_blobs: dict[str, dict] | None = Field(
        None, description="blob -> {shape: the bound priced, bound: which op argument sets it}")
    devices: OptNames = None
    profiles: Annotated[dict[str, ProfileRef] | None, given(dict[str, ProfileRef])] = None
    machine: Annotated[MachineInfo | None, given(MachineInfo)] = None
    ops: Annotated[list[OpInfo], Field(description="a list of op objects")]
    tensors: Annotated[list[TensorInfo] | None, given(list[TensorInfo])] = None
    copies: Annotated[list[CopyInfo] | None, given(list[CopyInfo])] = None
    baselines: Annotated[dict[str, Baseline] | None, given(dict[str, Baseline])] = None
    memory: Annotated[dict[str, Memory] | None, given(dict[str, Memory])] = None
    gpu_memory: GpuMemory | None = None
    memory_timeline: Annotated[dict[str, list[Num]] | None, given(dict[str, list[Num]])] = None
    link_bytes: Annotated[list[LinkBytes] | None, given(list[LinkBytes])] = None
    pcie_bytes: ByDevice = None
    schedules: Annotated[dict[str, Schedule] | None, given(dict[str, Schedule])] = None
    stability: Stability | None = None


__all__ = ["PlanDocument", "OpInfo", "OpStability", "Stability", "TensorInfo", "CopyInfo", "Baseline", "Memory",
           "GpuMemory", "LinkBytes", "Event", "Schedule", "Number"]
