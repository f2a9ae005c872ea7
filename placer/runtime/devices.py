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
from typing import Any

import numpy as np

from placer.errors import DeviceError
from placer.types import Device

NO_GPU_HINT = "no CUDA GPU visible: use --emulate-gpu to check a placed net on the CPU"


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
        self._pinned: dict[Any, np.ndarray] = {}

    def holds(self, array: Any) -> bool:
        return isinstance(array, self.cupy.ndarray) and array.device.id == self.index

    def adopt(self, array: Any) -> Any:
        return array if isinstance(array, self.cupy.ndarray) else self.cupy.asarray(array)

    def _pinned_buffer(self, key: Any, shape: tuple, dtype: Any) -> np.ndarray:
        """A page-locked host array, reused per (key, shape, dtype) so a loop allocates once."""
        tag = (key, tuple(shape), np.dtype(dtype).str)
        buf = self._pinned.get(tag) if key is not None else None
        if buf is None:
            nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
            mem = self.cupy.cuda.alloc_pinned_memory(nbytes)
            buf = np.frombuffer(mem, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
            if key is not None:
                self._pinned[tag] = buf
        return buf

    def to_device(self, array: Any, key: Any = None) -> Any:
        """Host -> this GPU through a pinned staging buffer (DMA, no pageable bounce)."""
        with self.cupy.cuda.Device(self.index):
            if isinstance(array, self.cupy.ndarray):  # GPU -> GPU (peer copy)
                return array.copy()
            host = np.asarray(array)
            staging = self._pinned_buffer(("h2d", key), host.shape, host.dtype)
            np.copyto(staging, host)
            out = self.cupy.empty(host.shape, dtype=host.dtype)
            out.set(staging)
            return out

    def to_host(self, array: Any, key: Any = None) -> np.ndarray:
        """This GPU -> host into a pinned buffer; the caller copies it out before reuse."""
        if not isinstance(array, self.cupy.ndarray):
            return np.asarray(array)
        with self.cupy.cuda.Device(self.index):
            out = self._pinned_buffer(("d2h", key), array.shape, array.dtype)
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
