"""CudaDevice's pinned staging on a stand-in for cupy whose host-to-device copies run late.

cupy's ``ndarray.set`` queues cudaMemcpyAsync and returns; the DMA reads the pinned source
when the GPU gets to it, and a pinned block dropped meanwhile goes back to cupy's pool,
which hands the same memory to the next request of its size. ``AsyncCupy`` models exactly
that: pinned memory is a few physical slots reused once their last array is gone; a copy
from a slot is queued and reads the slot when an event or the stream is synchronised.
A staging scheme that rewrites or drops a buffer before its copy ran delivers the wrong
values here, as it would on a GPU.
"""
from __future__ import annotations

import ctypes
import sys
import types
import weakref

import numpy as np
import pytest

from placer.runtime.devices import CudaDevice, PinnedStaging


class AsyncCupy:
    """Just enough cupy for CudaDevice, with asynchronous host-to-device copies."""

    def __init__(self):
        fake = self
        self.slots: list[tuple[np.ndarray, weakref.ref | None]] = []   # physical memory, owner
        self.queue: list = []                                           # copies not yet run
        self.done = 0                                                   # copies run so far

        class ndarray(np.ndarray):
            device = None

            def __array_finalize__(self, obj):
                self.device = types.SimpleNamespace(id=0)

            def set(self, arr, stream=None):
                slot = fake.slot_of(arr)
                if slot is None:                       # pageable: the driver copies at once
                    np.copyto(self.view(np.ndarray), arr)
                    return
                fake.queue.append((self.view(np.ndarray), slot, arr.dtype, arr.shape))

            def get(self, stream=None, out=None):
                fake.run_until(len(fake.queue) + fake.done)
                np.copyto(out, self.view(np.ndarray))
                return out

        class Event:
            def record(self):
                self.mark = fake.done + len(fake.queue)

            def synchronize(self):
                fake.run_until(self.mark)

        class Device:
            def __init__(self, index):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def use(self):
                pass

        self.ndarray = ndarray
        stream = types.SimpleNamespace(synchronize=lambda: fake.run_until(fake.done + len(fake.queue)))
        self.cuda = types.SimpleNamespace(
            Event=Event, Device=Device, get_current_stream=lambda: stream,
            alloc_pinned_memory=self.alloc_pinned_memory,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))

    def is_available(self):
        return True

    def empty(self, shape, dtype):
        return np.zeros(shape, dtype).view(self.ndarray)

    def alloc_pinned_memory(self, nbytes: int):
        """A pointer (a ctypes array) to a free physical slot of that size, as cupy's pinned
        pool reuses a block once nothing refers to it; else to a new slot."""
        for i, (memory, owner) in enumerate(self.slots):
            if memory.size == nbytes and (owner is None or owner() is None):
                break
        else:
            self.slots.append((np.frombuffer(bytearray(nbytes), np.uint8), None))
            i = len(self.slots) - 1
        pointer = (ctypes.c_uint8 * nbytes).from_buffer(self.slots[i][0].base)
        self.slots[i] = (self.slots[i][0], weakref.ref(pointer))
        return pointer

    def slot_of(self, arr: np.ndarray) -> int | None:
        address = arr.__array_interface__["data"][0]
        for i, (memory, _) in enumerate(self.slots):
            start = memory.__array_interface__["data"][0]
            if start <= address < start + memory.size:
                return i
        return None

    def run_until(self, mark: int) -> None:
        while self.done < mark and self.queue:
            dst, slot, dtype, shape = self.queue.pop(0)
            count = int(np.prod(shape))
            np.copyto(dst, np.frombuffer(self.slots[slot][0], dtype=dtype, count=count).reshape(shape))
            self.done += 1

    def pinned_bytes_held(self) -> int:
        return sum(m.size for m, owner in self.slots if owner is not None and owner() is not None)


@pytest.fixture
def device(monkeypatch):
    fake = AsyncCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return CudaDevice(0), fake


def _finish(fake, arrays):
    fake.run_until(fake.done + len(fake.queue))
    return [np.asarray(a.view(np.ndarray)) for a in arrays]


@pytest.mark.parametrize("key", [None, "feed"])
def test_a_staging_buffer_is_not_rewritten_before_its_copy_ran(device, key):
    """Two feeds of one shape, back to back: the second must not overwrite the first's
    source while its copy is still queued (the GPU reads pinned memory when it gets there)."""
    gpu, fake = device
    a, b = np.full((64, 32), 1.0, np.float32), np.full((64, 32), 2.0, np.float32)
    first, second = gpu.to_device(a, key=key), gpu.to_device(b, key=key)
    got_first, got_second = _finish(fake, [first, second])
    np.testing.assert_array_equal(got_first, a)
    np.testing.assert_array_equal(got_second, b)


def test_a_staging_buffer_dropped_from_the_cache_is_not_reused_before_its_copy_ran(device):
    """A buffer over the budget (or evicted) goes back to the pool only after its copy."""
    gpu, fake = device
    gpu.staging = PinnedStaging(fake, budget_bytes=1024)
    a, b = np.full(4096, 3.0, np.float32), np.full(4096, 4.0, np.float32)   # 16 KiB each
    first, second = gpu.to_device(a, key="x"), gpu.to_device(b, key="y")
    got = _finish(fake, [first, second])
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], b)


def test_staging_memory_stays_within_its_budget(device):
    """Keyed buffers are reused per key and the least recently used go past the budget;
    every copy still delivers its own values."""
    gpu, fake = device
    gpu.staging = PinnedStaging(fake, budget_bytes=64 * 1024)
    outs, wants = [], []
    for i in range(40):                                      # 40 keys x 8 KiB = 320 KiB
        x = np.full(2048, float(i), np.float32)
        outs.append(gpu.to_device(x, key=("feed", i)))
        wants.append(x)
        assert gpu.staging.nbytes <= 64 * 1024
    for got, want in zip(_finish(fake, outs), wants):
        np.testing.assert_array_equal(got, want)
    assert gpu.staging.nbytes <= 64 * 1024
    # a key used again reuses its buffer (no new pinned memory) and waits for its last copy
    held = fake.pinned_bytes_held()
    again = gpu.to_device(np.full(2048, 99.0, np.float32), key=("feed", 39))
    assert fake.pinned_bytes_held() == held
    np.testing.assert_array_equal(_finish(fake, [again])[0], 99.0)


def test_device_to_host_without_a_key_returns_arrays_of_their_own(device):
    gpu, fake = device
    x, y = gpu.to_device(np.ones(8, np.float32)), gpu.to_device(np.zeros(8, np.float32))
    hx, hy = gpu.to_host(x), gpu.to_host(y)
    assert not np.shares_memory(hx, hy)
    np.testing.assert_array_equal(hx, 1.0)
    np.testing.assert_array_equal(hy, 0.0)
