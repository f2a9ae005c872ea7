"""``placer profile --collectives`` on a stand-in for cupy and NCCL (no GPU here).

The stand-in runs NCCL calls in simulated time: a grouped call of S bytes over n GPUs
takes ``latency + bytes per ring edge / B`` (the ring's law, with B and latency the test's
own figures), so the profiler's timing, its nccl-tests bookkeeping (algbw, busbw) and its
fit must give back B and the latency. The stand-in also checks what a real NCCL needs:
every rank's call inside one group, on a stream of that rank's GPU with that GPU current,
buffers of the sizes the collective takes.
"""
from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np
import pytest

import placer.commands.profile as profile_command
from placer.hardware.collectives import bus_bytes
from placer.errors import DeviceError, PlacerError
from placer.hardware.machine import load_machine
from placer.profiling.collective_bench import (KINDS, compare, load_measurements, measure_collectives,
                                          save_measurements)

BUS_BYTES_PER_S = 150e9
LATENCY_S = 25e-6


class SimulatedNccl:
    """cupy (just what the profiler uses) and cupy.cuda.nccl over ``count`` simulated GPUs."""

    def __init__(self, count: int = 4):
        sim = self
        self.count, self.current, self.clock, self.group, self.grouped = count, 0, 0.0, None, []
        self.pointers: dict[int, tuple[int, int]] = {}      # base pointer -> (device, float32 count)
        self.next_ptr = 1 << 20

        class Array:
            def __init__(self, n, fill):
                self.size, self.device = n, sim.current
                self.data = types.SimpleNamespace(ptr=sim.next_ptr)
                sim.pointers[sim.next_ptr] = (sim.current, n)
                sim.next_ptr += 4 * n + 4096

        class Stream:
            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                self.device, self.ptr = sim.current, 7000 + sim.current

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.device = sim.current

            def record(self, stream=None):
                assert stream.device == self.device == sim.current, "event and stream of other GPUs"
                self.t = sim.clock

            def synchronize(self):
                pass

        class Device:
            def __init__(self, index):
                self.index = index

            def __enter__(self):
                self.saved, sim.current = sim.current, self.index

            def __exit__(self, *exc):
                sim.current = self.saved

        self.ones = lambda n, dtype=None: Array(n, 1.0)
        self.empty = lambda n, dtype=None: Array(n, None)
        self.is_available = lambda: True
        self.cuda = types.SimpleNamespace(
            Device=Device, Stream=Stream, Event=Event,
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: count,
                                          getDeviceProperties=lambda i: {"name": b"Simulated GPU"}))
        self.nccl = types.SimpleNamespace(available=True, get_version=lambda: 21803,
                                          groupStart=self.group_start, groupEnd=self.group_end,
                                          NcclCommunicator=types.SimpleNamespace(initAll=self.init_all))
        self.inits: list[list[int]] = []

    def init_all(self, devices):
        self.inits.append(list(devices))
        return [Communicator(self, rank, d) for rank, d in enumerate(devices)]

    def group_start(self):
        assert self.group is None
        self.group = []

    def group_end(self):
        calls, self.group = self.group, None
        n = len({c["rank"] for c in calls})
        assert n == self.count, "every rank calls inside the group"
        kind = calls[0]["kind"]
        s = {"allreduce": calls[0]["count"] * 4, "broadcast": calls[0]["count"] * 4,
             "allgather": calls[0]["count"] * 4 * n, "reducescatter": calls[0]["count"] * 4 * n,
             "alltoall": sum(c["count"] for c in calls if c["rank"] == 0 and c["op"] == "send") * 4}[kind]
        self.grouped.append((kind, s))
        self.clock += LATENCY_S + bus_bytes(kind, s, n) / BUS_BYTES_PER_S

    def check_buffer(self, ptr: int, count: int, device: int) -> None:
        base = max(p for p in self.pointers if p <= ptr)
        owner, size = self.pointers[base]
        assert owner == device, "a buffer of another GPU"
        assert (ptr - base) // 4 + count <= size, "past the end of the buffer"


class Communicator:
    def __init__(self, sim: SimulatedNccl, rank: int, device: int):
        self.sim, self.rank, self.device = sim, rank, device

    def _call(self, kind, op, count, stream, *buffers):
        sim = self.sim
        assert sim.group is not None, "NCCL calls of one process go inside a group"
        assert sim.current == self.device and stream == 7000 + self.device, "the rank's own GPU and stream"
        for ptr, n in buffers:
            sim.check_buffer(ptr, n, self.device)
        sim.group.append({"kind": kind, "op": op, "rank": self.rank, "count": count})

    def allReduce(self, x, y, count, dtype, op, stream):
        assert dtype == 7 and op == 0
        self._call("allreduce", "allreduce", count, stream, (x, count), (y, count))

    def broadcast(self, x, y, count, dtype, root, stream):
        self._call("broadcast", "broadcast", count, stream, (x, count), (y, count))

    def allGather(self, x, y, count, dtype, stream):
        self._call("allgather", "allgather", count, stream, (x, count), (y, count * self.sim.count))

    def reduceScatter(self, x, y, recvcount, dtype, op, stream):
        self._call("reducescatter", "reducescatter", recvcount, stream, (x, recvcount * self.sim.count),
                   (y, recvcount))

    def send(self, x, count, dtype, peer, stream):
        self._call("alltoall", "send", count, stream, (x, count))

    def recv(self, y, count, dtype, peer, stream):
        self._call("alltoall", "recv", count, stream, (y, count))


@pytest.fixture
def sim(monkeypatch):
    s = SimulatedNccl(4)
    monkeypatch.setitem(sys.modules, "cupy", s)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", s.nccl)
    return s


SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 28]


def test_the_profiler_times_every_collective_and_fits_the_simulated_ring(sim):
    m = measure_collectives(sizes=SIZES, repeats=3, cupy=sim)
    assert sim.inits == [[0, 1, 2, 3]]                     # communicators made once
    assert [k for k, _ in sim.grouped[:4 * len(SIZES)]] == ["allreduce"] * 4 * len(SIZES)   # 1 + 3 runs
    assert {k for k, _ in sim.grouped} == set(KINDS)
    for p in m.points:
        want = LATENCY_S + bus_bytes(p.kind, p.nbytes, 4) / BUS_BYTES_PER_S
        assert p.time_s == pytest.approx(want, rel=1e-9)
        assert p.algbw_bytes_per_s == pytest.approx(p.nbytes / p.time_s)
    big = [p for p in m.points if p.nbytes == SIZES[-1]]
    for p in big:                                          # nccl-tests' busbw tends to the ring's B
        assert 0.97 * BUS_BYTES_PER_S < p.busbw_bytes_per_s < BUS_BYTES_PER_S
    for kind, fit in m.fits.items():
        assert fit["bus_bytes_per_s"] == pytest.approx(BUS_BYTES_PER_S, rel=1e-6), kind
        assert fit["latency_s"] == pytest.approx(LATENCY_S, rel=1e-4), kind


def test_measurements_round_trip_and_sit_beside_the_model(sim, tmp_path):
    m = measure_collectives(gpus=[0, 1, 2, 3], sizes=SIZES, kinds=("allreduce",), repeats=1, cupy=sim)
    machine = load_machine("4x-v100-sxm2-nvlink")
    rows = compare(m, machine)
    assert len(rows) == len(SIZES)
    last = rows[-1]
    # the model's ring on this machine: cuda 0-1-3-2, all NVLink (3.4 us a hop), 20 GB/s at
    # its bottleneck (the pairs with one NVLink)
    model_s = 8.4e-6 + 6 * 3.4e-6 + 1.5 * SIZES[-1] / 20e9
    assert last["model_s"] == pytest.approx(model_s, rel=1e-9)
    assert last["ratio"] == pytest.approx(last["measured_s"] / model_s)
    m.model = rows
    path = tmp_path / "c.json"
    save_measurements(m, str(path))
    back = load_measurements(str(path))
    assert back.points == m.points and back.fits == m.fits and back.model == rows
    assert json.loads(path.read_text())["kind"] == "collectives"


def run_profile(argv):
    parser = argparse.ArgumentParser()
    profile_command.add_arguments(parser)
    return profile_command.run(parser.parse_args(argv))


def test_the_command_writes_the_file_and_prints_each_collective(sim, tmp_path, capsys, monkeypatch):
    import placer.profiling.collective_bench as pc
    monkeypatch.setattr(pc, "SIZES", SIZES)
    out = tmp_path / "coll.json"
    assert run_profile(["--collectives", "--collective-gpus", "0,1,2,3", "--machine", "4x-v100-sxm2-nvlink",
                        "--repeats", "2", "--quiet", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 GPUs (Simulated GPU), NCCL 21803" in text
    for kind in KINDS:
        assert f"{kind}: latency 25" in text and "150 GB/s" in text
    data = load_measurements(str(out))
    assert len(data.points) == len(KINDS) * len(SIZES) and len(data.model) == len(data.points)
    assert data.date and data.host


def test_without_gpus_or_with_a_wrong_file_the_command_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)          # import cupy fails
    with pytest.raises(DeviceError) as e:
        run_profile(["--collectives", "-o", str(tmp_path / "c.json")])
    assert "\n" not in str(e.value) and "--collectives needs a CUDA GPU" in str(e.value)
    other = tmp_path / "device.json"
    other.write_text(json.dumps({"schema_version": 1, "kind": "device"}))
    with pytest.raises(PlacerError, match="not a collectives measurement file"):
        run_profile(["--collectives", "-o", str(other)])
    with pytest.raises(PlacerError, match="exactly one of NET, --calibrate, --host, --link or --collectives"):
        run_profile(["--collectives", "--host", "-o", str(tmp_path / "c.json")])


def test_one_gpu_is_refused(monkeypatch):
    s = SimulatedNccl(1)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", s.nccl)
    with pytest.raises(DeviceError, match="two or more distinct visible GPUs"):
        measure_collectives(cupy=s)


def test_nccl_missing_is_a_device_error(monkeypatch):
    s = SimulatedNccl(2)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", types.SimpleNamespace(available=False))
    with pytest.raises(DeviceError, match="no NCCL library"):
        measure_collectives(cupy=s)
    assert np.isfinite(BUS_BYTES_PER_S)
