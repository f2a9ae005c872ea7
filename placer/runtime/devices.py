"""Where arrays live and ops run: ``cpu`` (numpy), ``cuda:N`` (cupy), ``emulated-cuda:N``.

A device is one small object: ``name``, ``xp`` (the array module its kernels get),
``to_device`` / ``to_host`` (copies, pinned host buffers on CUDA), ``sync`` and
``timer`` (perf_counter on the CPU, CUDA events on a GPU). ``holds(array)`` says whether
an array lives on it; the executor asks before every op, so a placed net that forgot a
copy fails with the op, the blob and both devices named.

Several GPUs (``DeviceSet``): a blob moves between devices only through ``DeviceSet.copy``
(host copy, H2D or D2H through pinned memory, GPU -> GPU as a peer copy where cupy can
enable peer access between the two, else staged through pinned host memory). On real
GPUs each device queues its kernels and copies on a stream of its own, and a peer copy
orders itself against the source's stream with events (``CudaDevice.copy_from_peer``).

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

from placer.documents.profiles import MAX_GPUS_PER_MACHINE
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


def device_name(device: Device | None) -> str:
    """How a placement reads to people: "cpu", or "cuda:N" for the NetDef's device_id N."""
    return "cpu" if device is None or not device.is_gpu else f"cuda:{device.index}"


def location(array: Any) -> str:
    """The name of the device an array lives on: "cpu", "cuda:N" or "emulated-cuda:N"."""
    kind = type(array)
    if kind is np.ndarray:
        return "cpu"
    if kind is EmulatedArray:
        return array.device
    dev = getattr(array, "device", None)  # cupy.ndarray.device is a cupy.cuda.Device; numpy's a str
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

    def copy_from_peer(self, array: Any, source: Any) -> EmulatedArray:
        """A GPU -> GPU copy from another emulated GPU: new memory, tagged as ours."""
        return self.to_device(array)


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
    stream: Any = None  # this GPU's own stream, once use_own_stream() made it

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

    def use_own_stream(self) -> None:
        """Queue everything this GPU does on a stream of its own (non-blocking: it does not
        wait for the legacy default stream). cupy keeps one current stream per device, so
        once made current here it is the stream of every kernel, copy and event timer run
        while this GPU is the current device, and GPUs do not serialise on one stream."""
        with self.cupy.cuda.Device(self.index):
            self.stream = self.cupy.cuda.Stream(non_blocking=True)
            self.stream.use()

    def copy_from_peer(self, array: Any, source: "CudaDevice") -> Any:
        """GPU -> GPU: ``array`` (on ``source``) copied into this GPU's memory.

        cupy's ``ndarray.copy()`` under this device allocates here and queues
        cudaMemcpyAsync(cudaMemcpyDefault) on this device's current stream, enabling peer
        access between the two GPUs itself when deviceCanAccessPeer allows (so this never
        calls deviceEnablePeerAccess: cupy's own call would then fail as already enabled).
        It copies contiguous arrays only, hence the ascontiguousarray on the source. Two
        events order the streams: this GPU waits for the source's queued work (the array
        may still be being written), and the source waits for the copy before anything it
        queues later (the array's memory may be reused once the executor frees it)."""
        cuda = self.cupy.cuda
        with cuda.Device(source.index):
            array = self.cupy.ascontiguousarray(array)
            written = source.stream.record(cuda.Event(disable_timing=True))
        with cuda.Device(self.index):
            self.stream.wait_event(written)
            out = array.copy()
            read = self.stream.record(cuda.Event(disable_timing=True))
        with cuda.Device(source.index):
            source.stream.wait_event(read)
        return out


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


def check_emulated_gpus(count: int | None) -> None:
    """Refuse ``--emulate-gpus`` below one or above what placer models in one machine
    (``documents.profiles.MAX_GPUS_PER_MACHINE``, the cap on ``--gpus``): every emulated GPU is made
    up front, and a record lists each."""
    if count is None:
        return
    if count < 1:
        raise DeviceError(f"--emulate-gpus {count}: emulate at least one GPU")
    if count > MAX_GPUS_PER_MACHINE:
        raise DeviceError(f"--emulate-gpus {count}: placer models at most {MAX_GPUS_PER_MACHINE} "
                          "GPUs in one machine", hint="emulate fewer GPUs; more than one machine is a cluster plan (placer plan --cluster)")


class DeviceSet:
    """The devices one run uses: the host, and GPUs made on first use from a ``Device``.

    ``emulate_gpus`` N: exactly N emulated GPUs ``emulated-cuda:0..N-1``, all made up front
    (a record lists each, idle or not); a GPU index beyond them is a DeviceError naming it.
    ``emulate_gpu`` alone: as many emulated GPUs as the net names. Neither: real GPUs
    through cupy, each with a stream of its own. ``copy`` is the one way a blob moves
    between two of them.
    """

    def __init__(self, emulate_gpu: bool = False, emulate_gpus: int | None = None):
        check_emulated_gpus(emulate_gpus)
        self.emulate_gpu = emulate_gpu or emulate_gpus is not None
        self.gpu_count = emulate_gpus
        self.cpu = CpuDevice()
        self._gpus: dict[int, Any] = {}
        self._named: dict[str, Any] = {"cpu": self.cpu}
        self._peer: dict[tuple[int, int], bool] = {}
        for index in range(emulate_gpus or 0):
            self._make_gpu(index)

    def get(self, device: Device | None) -> Any:
        if device is None or device.kind == "cpu":
            return self.cpu
        gpu = self._gpus.get(device.index)
        return gpu if gpu is not None else self._make_gpu(device.index)

    def _make_gpu(self, index: int) -> Any:
        if self.gpu_count is not None and index >= self.gpu_count:
            last = self.gpu_count - 1
            raise DeviceError(f"only {self.gpu_count} GPU(s) are emulated "
                              f"(cuda:0{f'..cuda:{last}' if last else ''})",
                              hint=f"run with --emulate-gpus {index + 1}, or place the op on one of those")
        if self.emulate_gpu:
            gpu = EmulatedCudaDevice(index)
        else:
            gpu = CudaDevice(index)
            gpu.use_own_stream()
        self._gpus[index] = gpu
        self._named[gpu.name] = gpu
        return gpu

    def named(self, name: str) -> Any:
        """The device of a ``location()`` name: "cpu", "cuda:N" or "emulated-cuda:N"."""
        device = self._named.get(name)
        if device is None:
            device = self.get(Device("gpu", int(name.rpartition(":")[2])))
        return device

    def all(self) -> list:
        return [self.cpu] + [self._gpus[i] for i in sorted(self._gpus)]

    def copy(self, array: Any, source: Any, target: Any, key: Any = None) -> Any:
        """``array`` (on ``source``) as new memory on ``target``, both devices of this set.

        To the host: the source's ``to_host`` (from a GPU, a pinned buffer reused per
        ``key`` on the next run). From the host, or within one device: the target's
        ``to_device`` (pinned staging on a GPU). GPU -> GPU: a peer copy where the two can
        reach each other (deviceCanAccessPeer, asked once per pair; always, emulated), else
        staged through pinned host memory: D2H into the source's pinned buffer, then H2D
        through the target's (one host memcpy between them, so that each GPU's staging
        keeps its own rules for when a buffer may be reused)."""
        if target.kind == "cpu":
            return target.adopt(source.to_host(array, key=key))
        if source.kind == "cpu" or source is target:
            return target.to_device(array, key=key)
        if self._can_access_peer(source, target):
            return target.copy_from_peer(array, source)
        return target.to_device(source.to_host(array, key=key), key=key)

    def _can_access_peer(self, source: Any, target: Any) -> bool:
        if target.emulated:
            return True
        pair = (source.index, target.index)
        if pair not in self._peer:   # the pair cupy checks (and enables) before a peer copy
            self._peer[pair] = bool(target.cupy.cuda.runtime.deviceCanAccessPeer(*pair))
        return self._peer[pair]
