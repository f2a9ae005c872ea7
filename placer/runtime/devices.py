"""Where arrays live and ops run: ``cpu`` (numpy), ``cuda:N`` (cupy), ``emulated-cuda:N``.

A device is one small object: ``name``, ``xp`` (the array module its kernels get),
``to_device`` / ``to_host`` (copies, pinned host buffers on CUDA), ``sync`` and
``timer`` (perf_counter on the CPU, CUDA events on a GPU). ``holds(array)`` says whether
an array lives on it; the executor asks before every op, so a placed net that forgot a
copy fails with the op, the blob and both devices named.

``emulated-cuda:N`` checks a placed net on a machine without a GPU: its arrays are numpy
arrays viewed as ``EmulatedArray`` (zero-copy) carrying the device name; kernels get
plain numpy views, so no kernel knows about emulation. Its timings are CPU timings and
``timing_label`` says so wherever a time is shown.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

from placer.errors import DeviceError
from placer.types import Device

NO_GPU_HINT = "no CUDA GPU visible: use --emulate-gpu to check a placed net on the CPU"
# Page-locked staging memory one GPU keeps for its copies (least recently used goes first).
PINNED_STAGING_BUDGET_BYTES = 256 * 2 ** 20


class EmulatedArray(np.ndarray):
    """A numpy array tagged as living in an emulated GPU's memory (``device`` is its name)."""

    device: str = ""

    def __array_finalize__(self, obj: Any) -> None:
        self.device = getattr(obj, "device", "")


def location(array: Any) -> str:
    """The name of the device an array lives on: "cpu", "cuda:N" or "emulated-cuda:N"."""
    kind = type(array)
    if kind is np.ndarray:
        return "cpu"
    if kind is EmulatedArray:
        return array.device
    if isinstance(array, np.ndarray) or np.isscalar(array):
        return "cpu"
    dev = getattr(array, "device", None)  # cupy.ndarray.device is a cupy.cuda.Device
    return f"cuda:{dev.id}" if hasattr(dev, "id") else "cpu"


class CpuTimer:
    """Wall time of one op on the CPU (perf_counter)."""

    __slots__ = ("t0", "t1")

    def __init__(self):
        self.t0 = self.t1 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.t1 = time.perf_counter()

    def seconds(self) -> float:
        return self.t1 - self.t0


class CpuDevice:
    """The host: numpy arrays, perf_counter timing."""

    kind = "cpu"
    index = 0
    emulated = False

    def __init__(self):
        self.name = "cpu"
        self.xp = np
        self.timing_label = "cpu"

    def holds(self, array: Any) -> bool:
        return type(array) is np.ndarray or location(array) == "cpu"

    def adopt(self, array: Any) -> np.ndarray:
        """A kernel's output as an array of this device (numpy scalars become 0-d arrays)."""
        return array if type(array) is np.ndarray else np.asarray(array)

    def to_device(self, array: Any, key: Any = None) -> np.ndarray:
        """A copy: a fed or copied blob never aliases the caller's array or its source."""
        return np.array(array, copy=True, subok=False)

    def to_host(self, array: Any, key: Any = None) -> np.ndarray:
        return np.array(array, copy=True, subok=False)

    def sync(self) -> None:
        pass

    def activate(self) -> None:
        """Make this device current for the kernels that follow (a GPU's context)."""

    def timer(self) -> CpuTimer:
        return CpuTimer()


class EmulatedCudaDevice(CpuDevice):
    """A GPU checked on the CPU: numpy arrays tagged with this device's name."""

    kind = "gpu"
    emulated = True

    def __init__(self, index: int = 0):
        super().__init__()
        self.index = index
        self.name = f"emulated-cuda:{index}"
        self.timing_label = f"{self.name} (CPU timing)"

    def holds(self, array: Any) -> bool:
        return type(array) is EmulatedArray and array.device == self.name

    def adopt(self, array: Any) -> EmulatedArray:
        out = np.asarray(array).view(EmulatedArray)
        out.device = self.name
        return out

    def to_device(self, array: Any, key: Any = None) -> EmulatedArray:
        """A real copy (a transfer makes new memory on the target), tagged as ours."""
        return self.adopt(np.array(array, copy=True, subok=False))

    def to_host(self, array: Any, key: Any = None) -> np.ndarray:
        return np.array(array, copy=True, subok=False)


class CudaTimer:
    """GPU time of one op between two CUDA events on the current stream."""

    __slots__ = ("cupy", "begin", "end")

    def __init__(self, cupy: Any):
        self.cupy = cupy
        self.begin = cupy.cuda.Event()
        self.end = cupy.cuda.Event()

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> None:
        self.end.record()

    def seconds(self) -> float:
        self.end.synchronize()
        return self.cupy.cuda.get_elapsed_time(self.begin, self.end) / 1e3


class PinnedStaging:
    """Page-locked host buffers for one GPU's copies, reused per tag, bounded in bytes.

    Why the events: cupy's ``ndarray.set`` only queues the host-to-device copy
    (cudaMemcpyAsync on the current stream) and returns. Until that copy has run, its
    pinned source must be neither rewritten (the next feed of the same blob) nor handed
    back to cupy's pinned pool, which gives the block to the next request of that size.
    So every use records an event after its copy (``copied``); the next use of the buffer
    waits on it (by then long past, in a loop), and a buffer leaves the cache only after
    its event. Host-to-device copies without a key share one buffer per (shape, dtype);
    a device-to-host copy without a key gets a buffer of its own (it is the result).

    Bound: past ``budget_bytes`` the least recently used buffers go; a single copy larger
    than the budget gets a buffer of its own whose copy is waited for before it is dropped.
    """

    def __init__(self, cupy: Any, budget_bytes: int = PINNED_STAGING_BUDGET_BYTES):
        self.cupy = cupy
        self.budget_bytes = budget_bytes
        self.nbytes = 0
        self._buffers: OrderedDict[tuple, list] = OrderedDict()   # tag -> [array, event | None]

    def acquire(self, tag: tuple | None, shape: tuple, dtype: Any) -> np.ndarray:
        """A pinned array for ``tag``, free to write: its previous copy has finished.
        ``tag`` None: a buffer of its own, not kept."""
        entry = self._buffers.get(tag) if tag is not None else None
        if entry is not None:
            self._buffers.move_to_end(tag)
            self._wait(entry)
            return entry[0]
        array = self._allocate(shape, dtype)
        if tag is not None and array.nbytes <= self.budget_bytes:
            self._evict_until(self.budget_bytes - array.nbytes)
            self._buffers[tag] = [array, None]
            self.nbytes += array.nbytes
        return array

    def copied(self, tag: tuple | None, array: np.ndarray) -> None:
        """A copy reading or writing ``array`` was queued on the current stream."""
        event = self.cupy.cuda.Event()
        event.record()
        entry = self._buffers.get(tag) if tag is not None else None
        if entry is not None and entry[0] is array:
            entry[1] = event
        else:                  # not kept: its memory may return to the pool once we return
            event.synchronize()

    def _allocate(self, shape: tuple, dtype: Any) -> np.ndarray:
        count = int(np.prod(shape))
        mem = self.cupy.cuda.alloc_pinned_memory(max(1, count * np.dtype(dtype).itemsize))
        return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)

    def _evict_until(self, limit: int) -> None:
        while self._buffers and self.nbytes > limit:
            _, entry = self._buffers.popitem(last=False)
            self._wait(entry)
            self.nbytes -= entry[0].nbytes

    @staticmethod
    def _wait(entry: list) -> None:
        if entry[1] is not None:
            entry[1].synchronize()
            entry[1] = None


class CudaDevice:
    """A real GPU through cupy (imported here, lazily, so numpy-only installs work)."""

    kind = "gpu"
    emulated = False

    def __init__(self, index: int = 0):
        self.cupy = import_cupy()
        count = self.cupy.cuda.runtime.getDeviceCount()
        if index >= count:
            raise DeviceError(f"cuda:{index} asked for, but only {count} GPU(s) are visible",
                              hint="place ops on a GPU that exists, or use --emulate-gpu")
        self.index = index
        self.name = f"cuda:{index}"
        self.timing_label = self.name
        self.xp = self.cupy
        self.staging = PinnedStaging(self.cupy)

    def holds(self, array: Any) -> bool:
        return isinstance(array, self.cupy.ndarray) and array.device.id == self.index

    def adopt(self, array: Any) -> Any:
        return array if isinstance(array, self.cupy.ndarray) else self.cupy.asarray(array)

    @staticmethod
    def _tag(direction: str, key: Any, shape: tuple, dtype: Any) -> tuple:
        return (direction, key, tuple(shape), np.dtype(dtype).str)

    def to_device(self, array: Any, key: Any = None) -> Any:
        """Host -> this GPU through a pinned staging buffer (DMA, no pageable bounce)."""
        with self.cupy.cuda.Device(self.index):
            if isinstance(array, self.cupy.ndarray):  # GPU -> GPU (peer copy)
                return array.copy()
            host = np.asarray(array)
            tag = self._tag("h2d", key, host.shape, host.dtype)
            staging = self.staging.acquire(tag, host.shape, host.dtype)
            np.copyto(staging, host)
            out = self.cupy.empty(host.shape, dtype=host.dtype)
            out.set(staging)                 # queued, not done: see PinnedStaging
            self.staging.copied(tag, staging)
            return out

    def to_host(self, array: Any, key: Any = None) -> np.ndarray:
        """This GPU -> host into a pinned buffer; the caller copies it out before reuse."""
        if not isinstance(array, self.cupy.ndarray):
            return np.asarray(array)
        with self.cupy.cuda.Device(self.index):
            tag = self._tag("d2h", key, array.shape, array.dtype) if key is not None else None
            out = self.staging.acquire(tag, array.shape, array.dtype)
            array.get(out=out)
            self.cupy.cuda.get_current_stream().synchronize()
            return out

    def activate(self) -> None:
        self.cupy.cuda.Device(self.index).use()

    def sync(self) -> None:
        with self.cupy.cuda.Device(self.index):
            self.cupy.cuda.get_current_stream().synchronize()

    def timer(self) -> CudaTimer:
        with self.cupy.cuda.Device(self.index):
            return CudaTimer(self.cupy)


def import_cupy() -> Any:
    """cupy with a visible GPU, or a DeviceError that says what to do instead."""
    try:
        import cupy
    except ImportError as e:
        raise DeviceError(f"cupy is not installed ({e})",
                          hint=f"pip install 'placer[gpu]', or {NO_GPU_HINT.split(': ', 1)[1]}") from e
    try:
        available = bool(cupy.is_available())
    except Exception:  # a broken driver raises instead of answering False
        available = False
    if not available:
        raise DeviceError(NO_GPU_HINT)
    return cupy


class DeviceSet:
    """The devices one run uses, made on first use: Device("gpu", 1) -> cuda:1 or emulated."""

    def __init__(self, emulate_gpu: bool = False):
        self.emulate_gpu = emulate_gpu
        self.cpu = CpuDevice()
        self._gpus: dict[int, Any] = {}

    def get(self, device: Device | None) -> Any:
        if device is None or device.kind == "cpu":
            return self.cpu
        if device.index not in self._gpus:
            self._gpus[device.index] = (EmulatedCudaDevice(device.index) if self.emulate_gpu
                                        else CudaDevice(device.index))
        return self._gpus[device.index]

    def all(self) -> list:
        return [self.cpu] + [self._gpus[i] for i in sorted(self._gpus)]
