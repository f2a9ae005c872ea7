"""placer.profiling.link without a GPU: the line fit, the comparison with a profile's
curves, and bench/link_vs_profile.py on a profile holding synthetic measured points.
(Measuring the curves needs a GPU: tests/test_profile_cli.py, marked gpu.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placer.hardware.profiles import find_profile, load_profile
from placer.profiling.link import SIZES, compare_link, fit_line
from placer.hardware.device_profile import LinkCurve, save_profile

ROOT = Path(__file__).resolve().parents[1]


def line_points(latency_s: float, bytes_per_s: float) -> list[tuple[int, float]]:
    return [(n, latency_s + n / bytes_per_s) for n in SIZES]


def test_fit_recovers_an_exact_line():
    latency, bandwidth = fit_line(line_points(7e-6, 41e9))
    assert latency == pytest.approx(7e-6, rel=1e-6)
    assert bandwidth == pytest.approx(41e9, rel=1e-6)


def test_sizes_run_from_4_kib_to_1_gib_in_powers_of_4():
    assert SIZES[0] == 4 * 1024 and SIZES[-1] == 2 ** 30
    assert all(b == 4 * a for a, b in zip(SIZES, SIZES[1:]))


def test_comparison_is_measured_over_the_reference_line_at_each_size():
    measured = {"h2d": {"pinned": LinkCurve(8e-6, 40e9, line_points(8e-6, 40e9))}, "d2h": {}}
    reference = {"h2d": {"pinned": LinkCurve(10e-6, 50e9), "pageable": LinkCurve(10e-6, 25e9)},
                 "d2h": {"pinned": LinkCurve(10e-6, 50e9)}}
    records = compare_link(measured, reference)
    assert [(r["direction"], r["memory"]) for r in records] == [("h2d", "pinned")]  # only curves in both
    points = records[0]["points"]
    assert [p["nbytes"] for p in points] == SIZES
    for p in points:
        n = p["nbytes"]
        assert p["ratio"] == pytest.approx((8e-6 + n / 40e9) / (10e-6 + n / 50e9), rel=1e-9)
    # small copies: 0.8x (latency-bound); 1 GiB: 1.25x (the rate: 50 / 40)
    assert points[0]["ratio"] == pytest.approx(0.8, abs=0.01)
    assert points[-1]["ratio"] == pytest.approx(1.25, abs=0.01)
    assert records[0]["reference"] == {"latency_s": 10e-6, "bytes_per_s": 50e9}


def test_link_vs_profile_script_prints_and_writes_every_curve(tmp_path):
    profile = load_profile(find_profile("h200-141gb-pcie5"))
    gpu = profile.device("gpu")
    gpu.link = {d: {m: LinkCurve(5e-6, 20e9, line_points(5e-6, 20e9)) for m in ("pinned", "pageable")}
                for d in ("h2d", "d2h")}
    measured = tmp_path / "measured.json"
    save_profile(profile, measured)
    out = tmp_path / "compare.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "link_vs_profile.py"), str(measured),
                           "--reference", "h200-141gb-pcie5", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "h2d pinned  : latency 5 µs (profile 10 µs), 20 GB/s (profile 50 GB/s)" in proc.stdout
    assert "d2h pageable: latency 5 µs (profile 10 µs), 20 GB/s (profile 25 GB/s)" in proc.stdout
    doc = json.loads(out.read_text())
    assert len(doc["curves"]) == 4
    last = doc["curves"][0]["points"][-1]   # h2d pinned, 1 GiB: (5 us + 2^30/20e9) / (10 us + 2^30/50e9)
    assert last["ratio"] == pytest.approx((5e-6 + 2 ** 30 / 20e9) / (10e-6 + 2 ** 30 / 50e9), rel=1e-9)


def test_link_vs_profile_refuses_a_profile_without_measured_points(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "link_vs_profile.py"),
                           str(find_profile("h200-141gb-pcie5"))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "holds no measured link points" in proc.stderr and "Traceback" not in proc.stderr


# -- GPU -> GPU curves into a machine profile (placer profile --link on several GPUs) ------

def _fake_peers(n: int, staged: set):
    """p2p and copy-time functions of a pretend host: direct pairs at 10 us + 40 GB/s,
    staged ones (no P2P) at 25 us + 9 GB/s."""
    def p2p(a, b):
        return (a, b) not in staged

    def copy_s(a, b, size):
        return 25e-6 + size / 9e9 if (a, b) in staged else 10e-6 + size / 40e9
    return p2p, copy_s


def test_peer_curves_fit_each_ordered_pair_and_say_whether_p2p_is_on():
    from placer.profiling.link import peer_curves
    p2p, copy_s = _fake_peers(3, staged={(0, 2), (2, 0)})
    curves = peer_curves([0, 1, 2], SIZES, p2p, copy_s)
    assert [(c["src"], c["dst"]) for c in curves] == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    for c in curves:
        slow = (c["src"], c["dst"]) in {(0, 2), (2, 0)}
        assert c["p2p"] is not slow
        assert c["latency_s"] == pytest.approx(25e-6 if slow else 10e-6, rel=1e-6)
        assert c["bytes_per_s"] == pytest.approx(9e9 if slow else 40e9, rel=1e-6)
        assert len(c["points"]) == len(SIZES)


def test_measured_peer_curves_make_a_machine_profile_placer_loads(tmp_path):
    """The machine file `placer profile --link` writes beside the GPU profile loads with
    --machine: every pair's link is the measured curve, named as measured."""
    from placer.hardware.machine import load_machine
    from placer.profiling.link import machine_profile, peer_curves
    gpu = load_profile(find_profile("t4-pcie3"))
    gpu.name = "mygpu"
    save_profile(gpu, tmp_path / "mygpu.json")
    p2p, copy_s = _fake_peers(2, staged={(1, 0)})
    doc = machine_profile("mygpu-2gpu", "host-ci-2core", "mygpu", peer_curves([0, 1], SIZES, p2p, copy_s), 2,
                          "testhost")
    assert doc["peer_default"] == "staged"          # one pair had no P2P
    (tmp_path / "mygpu-machine.json").write_text(json.dumps(doc))
    machine = load_machine(tmp_path / "mygpu-machine.json")
    assert machine.names == ("cpu", "cuda:0", "cuda:1")
    for (a, b), (lat, bw) in {(1, 2): (10e-6, 40e9), (2, 1): (25e-6, 9e9)}.items():
        link = machine.link(a, b)
        assert link.source == "measured by placer profile --link"
        assert len(link.hops) == 1 and link.hops[0].curve.latency_s == pytest.approx(lat, rel=1e-6)
        assert link.hops[0].curve.bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert machine.copy_time(2**30, 1, 2) < machine.copy_time(2**30, 2, 1)


@pytest.mark.gpu
def test_measure_peers_on_every_pair_of_real_gpus():
    import cupy
    from placer.profiling.link import measure_peers
    n = cupy.cuda.runtime.getDeviceCount()
    if n < 2:
        pytest.skip(f"{n} GPU visible: GPU->GPU copies need two")
    curves = measure_peers(list(range(n)), sizes=[4096, 2**20, 2**24], repeats=3)
    assert len(curves) == n * (n - 1)
    assert all(c["bytes_per_s"] > 1e9 and c["latency_s"] >= 0 for c in curves)


def test_profile_link_on_several_gpus_writes_a_machine_file_that_loads(tmp_path, monkeypatch, capsys):
    """The command's own path, with the GPU measurements replaced by fixed curves (no GPU
    here): the device profile is written, then OUTPUT-machine.json beside it naming that
    profile for its GPUs, and --machine loads it with the measured links."""
    from placer import cli
    from placer.commands import profile as command
    from placer.hardware.machine import load_machine
    from placer.profiling.link import peer_curves

    def fake_link(profile, args):
        gpu = load_profile(find_profile("t4-pcie3")).device("gpu")
        profile.devices["gpu"] = gpu
    p2p, copy_s = _fake_peers(3, staged=set())
    monkeypatch.setattr(command, "_merge_link", fake_link)
    monkeypatch.setattr(command, "_measure_peers", lambda args: ([0, 1, 2], peer_curves([0, 1, 2], SIZES, p2p, copy_s)))
    out = tmp_path / "mygpu.json"
    assert cli.main(["profile", "--link", "--device", "cuda:0", "-o", str(out)]) == 0
    machine_file = tmp_path / "mygpu-machine.json"
    assert f"wrote {machine_file}" in capsys.readouterr().out
    doc = json.loads(machine_file.read_text())
    assert doc["gpus"] == [{"profile": "mygpu", "count": 3}] and doc["peer_default"] == "pcie-p2p"
    machine = load_machine(machine_file)
    assert machine.names == ("cpu", "cuda:0", "cuda:1", "cuda:2")
    assert machine.link(1, 3).source == "measured by placer profile --link"
    assert machine.devices[1].profile.name == load_profile(out).device("gpu").name
    # a machine file elsewhere names the profile by its absolute path
    other = tmp_path / "elsewhere" / "m.json"
    other.parent.mkdir()
    assert cli.main(["profile", "--link", "--device", "cuda:0", "-o", str(out), "--machine-out", str(other)]) == 0
    assert json.loads(other.read_text())["gpus"][0]["profile"] == str(out.resolve())
    assert load_machine(other).names == machine.names
