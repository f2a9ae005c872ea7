"""A NetDef being extended the way ``caffe2.python.core.Net`` extends one.

Three habits of Caffe2's Python net matter for the nets it writes, so this keeps them:
an op created under a device scope carries a copy of that ``DeviceOption``; an input that
no op of the net writes and that is not yet an external input is appended to
``external_input`` when the op is added; ``defined(blob)`` is "some op writes it, or it is
an external input" (Caffe2's ``BlobIsDefined``).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from placer.formats import caffe2_pb as pb
from placer.training.gradient_registry import make_op

CPU, CUDA, HIP = 0, 1, 6
GPU_DEVICE_TYPES = (CUDA, HIP)


class DeviceScope:
    """The stack of device scopes shared by a train net and its init net."""

    def __init__(self):
        self.current = None  # a DeviceOption, or None outside any scope

    @contextlib.contextmanager
    def __call__(self, option) -> Iterator[None]:
        """Enter ``option`` as Caffe2's ``scope.DeviceScope`` does: the node name and the
        extra_info of the enclosing scope are inherited, extra_info is kept sorted."""
        new = pb.DeviceOption()
        new.CopyFrom(option)
        old = self.current
        if old is not None and old.HasField("node_name") and not new.HasField("node_name"):
            new.node_name = old.node_name
        if old is not None:
            new.extra_info.extend(old.extra_info)
        infos = sorted(new.extra_info)
        del new.extra_info[:]
        new.extra_info.extend(infos)
        self.current = new
        try:
            yield
        finally:
            self.current = old


def device_option(device_type: int = CPU, device_id: int = 0, extra_info: Sequence[str] = ()):
    """``core.DeviceOption(device_type, device_id, extra_info=...)``: both numbers set."""
    option = pb.DeviceOption(device_type=device_type, device_id=device_id)
    option.extra_info.extend(extra_info)
    return option


class NetBuilder:
    """A NetDef plus the lookup tables ``core.Net`` keeps for it."""

    def __init__(self, netdef, scope: DeviceScope):
        self.proto = netdef
        self.scope = scope
        self._outputs = {b for op in netdef.op for b in op.output}
        self._external = set(netdef.external_input)

    def defined(self, blob: str) -> bool:
        return blob in self._outputs or blob in self._external

    def add(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | str,
            args: Sequence[tuple] = (), engine: str | None = None, **kwargs) -> str | tuple:
        """Append an op (``net.<Type>(inputs, outputs, **args)``); returns its output(s)."""
        outputs = [outputs] if isinstance(outputs, str) else list(outputs)
        op = make_op(op_type, inputs, outputs, args=args, **kwargs)
        if self.scope.current is not None:
            op.device_option.CopyFrom(self.scope.current)
        if engine is not None:
            op.engine = engine
        self.append(op)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def append(self, op) -> None:
        """Append a made OperatorDef, with the external-input bookkeeping of ``add``."""
        for blob in op.input:
            if not self.defined(blob):
                self.proto.external_input.append(blob)
                self._external.add(blob)
        self.proto.op.append(op)
        self._outputs.update(op.output)


def blob_devices(netdef) -> dict:
    """Caffe2's ``InferBlobDevices``: each blob -> the device option of the last op writing it
    (an empty option, the CPU, for an op without one)."""
    return {blob: op.device_option for op in netdef.op for blob in op.output}


def is_gpu(option) -> bool:
    return option is not None and option.device_type in GPU_DEVICE_TYPES
