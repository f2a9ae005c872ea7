"""`placer plan` says how sure it is: the stability check under the profile's measured
spread (summary line, per-op flags in the JSON) and a note on estimates from fits that do
not cover their group."""
from __future__ import annotations

import json

import pytest

from placer import cli
from placer.examples.builder import NetBuilder
from placer.hardware.device_profile import DeviceProfile, OpTiming, Profile, save_profile
from placer.types import TensorType

FC_INPUTS = (TensorType((4, 8)), TensorType((16, 8)), TensorType((16,)))


def _net(tmp_path):
    b = NetBuilder("one_fc")
    x = b.input("data", (4, 8))
    w = b.param("w", (16, 8), "XavierFill")
    bias = b.param("b", (16,), "ConstantFill", value=0.0)
    b.output(b.op("FC", [x, w, bias], "y"))
    return b.save(tmp_path, "net")["predict"]


def _cpu_profile(path, entries) -> str:
    dev = DeviceProfile(kind="cpu", name="test host", source={"kind": "measured", "host": "h", "date": "d"},
                        peak_flops={"float32": 1e11}, memory_bandwidth_bytes_per_s=1e10,
                        memory_capacity_bytes=8e9, launch_overhead_s=1e-6, ops={t.key: t for t in entries})
    save_profile(Profile("test", {"cpu": dev}), path)
    return str(path)


def _plan(capsys, net, profile, *extra) -> dict:
    capsys.readouterr()
    rc = cli.main(["plan", str(net), "--cpu-profile", profile, "--gpu-profile", "v100-16gb-pcie3", "--json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def _fc(median_s, spread):
    return OpTiming("FC", FC_INPUTS, {}, 10, median_s, spread * median_s, 1024.0, 1100.0, "in-network")


def test_a_clear_plan_is_stable_and_a_tie_flips(tmp_path, capsys):
    net = _net(tmp_path)
    doc = _plan(capsys, net, _cpu_profile(tmp_path / "far.json", [_fc(1e-3, 0.01)]))
    (op,) = doc["ops"]
    assert op["device"] == "cuda:0" and op["stability"] == {"flips": 0, "draws": 8, "moves_to": None}
    assert doc["stability"]["summary"] == "placement stable under measured noise: no op of 1 flips in 8 draws"

    # the CPU time that ties with the GPU time plus the copies the GPU placement pays
    tie = op["gpu_s"] + sum(t["h2d_s"] for t in doc["tensors"] if t["name"] == "data") \
        + sum(t["d2h_s"] for t in doc["tensors"] if t["name"] == "y")
    doc = _plan(capsys, net, _cpu_profile(tmp_path / "tie.json", [_fc(tie * 1.01, 0.6)]), "--stability-draws", "16")
    (op,) = doc["ops"]
    assert op["cpu_source"] == "measured" and 0 < op["stability"]["flips"] < 16
    assert op["stability"]["moves_to"] in ("cpu", "cuda:0") and op["stability"]["moves_to"] != op["device"]
    assert doc["stability"]["summary"] == (f"placement stable under measured noise: 1 of 1 ops flip in "
                                           f"{op['stability']['flips']} of 16 draws")
    capsys.readouterr()       # the table run prints the same, and names the op that flips
    assert cli.main(["plan", str(net), "--cpu-profile", str(tmp_path / "tie.json"), "--gpu-profile",
                     "v100-16gb-pcie3", "--stability-draws", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert doc["stability"]["summary"] in lines
    assert (f"  flips: #0 y (FC, on {op['device']}): to {op['stability']['moves_to']} in "
            f"{op['stability']['flips']} of 16 draws") in lines


def test_the_summary_line_is_printed_and_the_check_can_be_off(tmp_path, capsys):
    net, prof = _net(tmp_path), _cpu_profile(tmp_path / "p.json", [_fc(1e-3, 0.01)])
    capsys.readouterr()
    assert cli.main(["plan", str(net), "--cpu-profile", prof]) == 0
    assert "placement stable under measured noise: no op of 1 flips in 8 draws" in capsys.readouterr().out.splitlines()
    doc = _plan(capsys, net, prof, "--stability-draws", "0")
    assert doc["stability"]["draws"] == 0 and doc["stability"]["summary"] == "placement stability not checked"
    with pytest.raises(SystemExit) as refused:
        cli.main(["plan", str(net), "--cpu-profile", prof, "--stability-draws", "-1"])
    assert refused.value.code == 2 and "argument --stability-draws: expected an integer >= 0" in capsys.readouterr().err


def test_estimates_from_a_fit_that_does_not_cover_its_group_are_noted(tmp_path, capsys):
    points = []
    for i, (m, k, n) in enumerate([(8, 256, 256), (64, 1024, 512), (4, 512, 1024), (256, 512, 1024),
                                   (16, 128, 64), (32, 2048, 2048)]):
        ins = (TensorType((m, k)), TensorType((n, k)), TensorType((n,)))
        flops, nbytes = 2.0 * m * k * n, 4.0 * (m * k + k * n + n + m * n)
        t = 1e-5 + flops / 5e10
        points.append(OpTiming("FC", ins, {}, 5, t * (5.0 if i % 2 else 1.0), 0.0, flops, nbytes))
    doc = _plan(capsys, _net(tmp_path), _cpu_profile(tmp_path / "poor.json", points))
    (op,) = doc["ops"]
    assert op["cpu_source"] == "poor-fit"
    assert any("1 op(s) priced from fits that do not cover their group (poor-fit: FC)" in n for n in doc["notes"])


def test_stability_is_reproducible(tmp_path, capsys):
    net = _net(tmp_path)
    first = _plan(capsys, net, _cpu_profile(tmp_path / "p.json", [_fc(3e-5, 0.8)]), "--stability-draws", "3")
    again = _plan(capsys, net, str(tmp_path / "p.json"), "--stability-draws", "3")
    assert first["ops"][0]["stability"] == again["ops"][0]["stability"]
