"""Profile files: validation errors name the file and the field; shipped profiles load
with a source for every figure; save/load round trips."""
from __future__ import annotations

import json

import pytest

from placer.errors import ProfileError
from placer.hardware.profiles import (DEFAULT_CPU_PROFILE, DEFAULT_GPU_PROFILE, default_profiles,
                              find_profile, shipped_profile_names, shipped_profiles_dir)
from placer.hardware.device_profile import (SOURCED_FIGURES, OpTiming, load_profile, op_key,
                                     profile_to_dict, save_profile)
from placer.types import TensorType

GiB = 2 ** 30


def _valid() -> dict:
    return {"schema_version": 1, "name": "t", "devices": [{
        "kind": "cpu", "name": "test cpu",
        "source": {"kind": "measured", "host": "box", "date": "2026-01-01"},
        "peak_flops": {"float32": 1e11}, "memory_bandwidth_bytes_per_s": 1e10,
        "memory_capacity_bytes": 8e9, "launch_overhead_s": 1e-6,
        "ops": [{"type": "Relu", "inputs": [{"shape": [2, 3], "dtype": "float32"}], "args": {},
                 "samples": 5, "median_s": 1e-5, "iqr_s": 1e-6, "flops": 6, "bytes": 48}]}]}


def _write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _error(tmp_path, data) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert str(path) in str(e.value)
    return str(e.value)


def test_valid_profile_loads(tmp_path):
    prof = load_profile(_write(tmp_path, _valid()))
    cpu = prof.device("cpu")
    assert cpu.peak("float32") == 1e11 and cpu.peak("float16") == 1e11  # falls back to float32
    (timing,) = cpu.ops.values()
    assert timing.median_s == 1e-5 and timing.inputs == (TensorType((2, 3)),)
    with pytest.raises(ProfileError, match="no 'gpu' device"):
        prof.device("gpu")


def test_wrong_version_names_field(tmp_path):
    data = _valid()
    data["schema_version"] = 7
    msg = _error(tmp_path, data)
    assert "schema_version" in msg and "7" in msg


def test_missing_field_names_it(tmp_path):
    data = _valid()
    del data["devices"][0]["memory_bandwidth_bytes_per_s"]
    assert "devices[0].memory_bandwidth_bytes_per_s" in _error(tmp_path, data)
    data = _valid()
    del data["devices"][0]["source"]["date"]
    assert "devices[0].source.date" in _error(tmp_path, data)


def test_negative_time_names_it(tmp_path):
    data = _valid()
    data["devices"][0]["ops"][0]["median_s"] = -1e-3
    msg = _error(tmp_path, data)
    assert "devices[0].ops[0].median_s" in msg and "-0.001" in msg


def test_wrong_kinds_name_the_field(tmp_path):
    data = _valid()
    data["devices"][0]["peak_flops"]["float32"] = "fast"
    assert "devices[0].peak_flops.float32" in _error(tmp_path, data)
    data = _valid()
    data["devices"][0]["kind"] = "tpu"
    assert "devices[0].kind" in _error(tmp_path, data)
    data = _valid()
    data["devices"][0]["ops"][0]["inputs"][0]["shape"] = [2, -3]
    assert "devices[0].ops[0].inputs[0].shape" in _error(tmp_path, data)


@pytest.mark.parametrize("garbage", ["not json {", "[1, 2, 3]", "\x00\x01binary", ""])
def test_garbage_is_a_profile_error(tmp_path, garbage):
    _error(tmp_path, garbage)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "absent.json")


def test_datasheet_figure_without_origin(tmp_path):
    data = _valid()
    data["devices"][0]["source"] = {"kind": "datasheet", "figures": {
        "peak_flops": "vendor", "memory_bandwidth_bytes_per_s": "vendor",
        "memory_capacity_bytes": "vendor"}}
    assert "devices[0].source.figures.launch_overhead_s" in _error(tmp_path, data)


def test_save_load_round_trip(tmp_path):
    prof = load_profile(_write(tmp_path, _valid()))
    extra = OpTiming("FC", (TensorType((4, 8)), TensorType((16, 8)), TensorType((16,))),
                     {"axis": 1}, 7, 2e-5, 3e-6, 1024.0, 900.0)
    prof.device("cpu").ops[extra.key] = extra
    out = save_profile(prof, tmp_path / "sub" / "out.json")
    again = load_profile(out)
    assert profile_to_dict(again) == profile_to_dict(prof)
    assert again.device("cpu").ops[extra.key].samples == 7
    assert not list((tmp_path / "sub").glob("*.tmp"))


def test_op_key_ignores_cost_neutral_args_and_orders_args():
    t = [TensorType((1, 3, 8, 8)), TensorType((4, 3, 3, 3))]
    a = op_key("Conv", t, {"kernel": 3, "pad": 1, "ws_nbytes_limit": 1 << 20})
    b = op_key("Conv", t, {"pad": 1, "kernel": 3})
    assert a == b
    assert a != op_key("Conv", t, {"pad": 0, "kernel": 3})
    assert a != op_key("Conv", [TensorType((2, 3, 8, 8)), t[1]], {"pad": 1, "kernel": 3})


# ------------------------------------------------------------------------ shipped

SHIPPED_GPUS = ["v100-16gb-pcie3", "t4-pcie3", "a100-40gb-pcie4", "h100-pcie5", "h200-141gb-pcie5"]


def test_all_shipped_profiles_are_there():
    names = shipped_profile_names()
    for name in SHIPPED_GPUS + [DEFAULT_CPU_PROFILE]:
        assert name in names
    assert DEFAULT_GPU_PROFILE in SHIPPED_GPUS
    assert (shipped_profiles_dir() / "README.md").exists()


@pytest.mark.parametrize("name", shipped_profile_names())
def test_shipped_profile_loads_with_sources(name):
    prof = load_profile(find_profile(name))
    assert prof.name == name
    for dev in prof.devices.values():
        assert dev.source["kind"] == "datasheet"
        raw = profile_to_dict(prof)["devices"][0]
        for fig in SOURCED_FIGURES:
            if fig in raw:
                assert len(dev.source["figures"][fig]) > 10, (name, fig)
        if dev.kind == "gpu":
            assert set(dev.link) == {"h2d", "d2h"}
            for mems in dev.link.values():
                assert mems["pageable"].bytes_per_s < mems["pinned"].bytes_per_s


@pytest.mark.parametrize("name,fp32,capacity_gib,pinned", [
    ("v100-16gb-pcie3", 14e12, 16, 12e9), ("t4-pcie3", 8.1e12, 16, 12e9),
    ("a100-40gb-pcie4", 19.5e12, 40, 25e9), ("h100-pcie5", 51e12, 80, 50e9),
    ("h200-141gb-pcie5", 67e12, 141, 50e9)])
def test_shipped_gpu_figures(name, fp32, capacity_gib, pinned):
    gpu = load_profile(find_profile(name)).device("gpu")
    assert gpu.peak_flops["float32"] == fp32
    assert gpu.peak_flops["float16"] > fp32
    assert gpu.memory_capacity_bytes == capacity_gib * GiB
    assert gpu.link["h2d"]["pinned"].bytes_per_s == pinned


def test_default_pair_and_overrides(tmp_path):
    cpu, gpu = default_profiles()
    assert cpu.kind == "cpu" and cpu.peak_flops["float32"] == 188e9  # DESIGN.md, 2 threads
    assert gpu.kind == "gpu" and gpu.memory_capacity_bytes == 16 * GiB
    _, gpu = default_profiles(gpu="h200-141gb-pcie5")
    assert gpu.memory_capacity_bytes == 141 * GiB
    combined = _valid()
    combined["devices"].append(profile_to_dict(load_profile(find_profile("t4-pcie3")))["devices"][0])
    cpu, gpu = default_profiles(combined=_write(tmp_path, combined, "pair.json"))
    assert cpu.name == "test cpu" and gpu.name == "NVIDIA T4 16 GB"
    with pytest.raises(ProfileError, match="not found"):
        default_profiles(gpu="no-such-gpu")


@pytest.mark.parametrize("text, words", [
    (b"\x80\x81 not utf-8", "not UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"schema_version": ' + b"9" * 5000 + b"}", "not a JSON profile"),  # past Python's int digit limit
    (b'{"schema_version": 1, "name": "t", "devices": [', "not a JSON profile"),  # truncated
])
def test_unreadable_json_is_a_profile_error(tmp_path, text, words):
    path = tmp_path / "p.json"
    path.write_bytes(text)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert words in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("field, value, words", [
    ("memory_bandwidth_bytes_per_s", 10 ** 400, "bytes per second (1000 to 1e+15)"),   # too large for a float
    ("memory_bandwidth_bytes_per_s", float("nan"), "bytes per second (1000 to 1e+15)"),
    ("memory_bandwidth_bytes_per_s", -1.0, "bytes per second (1000 to 1e+15)"),
    ("memory_bandwidth_bytes_per_s", 1e-300, "bytes per second (1000 to 1e+15)"),  # priced every copy forever
    ("launch_overhead_s", float("inf"), "seconds (0 to 1)"),
    ("launch_overhead_s", 1e308, "seconds (0 to 1)"),
    ("peak_flops", {"float32": 5e-324}, "FLOP/s (1e+06 to 1e+18)"),                # divided by zero
])
def test_absurd_figures_name_the_field(tmp_path, field, value, words):
    data = _valid()
    data["devices"][0][field] = value
    message = _error(tmp_path, json.dumps(data, allow_nan=True))
    assert f"devices[0].{field}" in message and words in message


def test_op_timing_inputs_need_a_dtype_and_an_addressable_shape(tmp_path):
    data = _valid()
    data["devices"][0]["ops"][0]["inputs"][0]["dtype"] = "nonsense"
    assert "devices[0].ops[0].inputs[0].dtype" in _error(tmp_path, data)
    data = _valid()
    data["devices"][0]["ops"][0]["inputs"][0]["shape"] = [2 ** 62, 2 ** 62]
    assert "more than int64 can count" in _error(tmp_path, data)
def test_timing_method_and_fit_quality_round_trip(tmp_path):
    data = _valid()
    data["devices"][0]["ops"][0]["method"] = "in-network"
    data["devices"][0]["fits"] = {
        "old": {"overhead_s": 1e-6, "compute_efficiency": 0.5, "memory_efficiency": 0.5, "points": 3,
                "median_abs_pct_error": 4.0},
        "new": {"overhead_s": 1e-6, "compute_efficiency": 0.5, "memory_efficiency": 0.5, "points": 9,
                "median_abs_pct_error": 40.0, "p90_abs_pct_error": 90.0, "spread_pct": 12.5, "covered": False}}
    prof = load_profile(_write(tmp_path, data))
    cpu = prof.device("cpu")
    assert next(iter(cpu.ops.values())).method == "in-network"
    old, new = cpu.fits["old"], cpu.fits["new"]
    assert old.covered is True and old.p90_abs_pct_error is None and old.spread_pct is None
    assert new.covered is False and new.p90_abs_pct_error == 90.0 and new.spread_pct == 12.5
    again = load_profile(save_profile(prof, tmp_path / "again.json"))
    assert profile_to_dict(again) == profile_to_dict(prof)


def test_entries_written_before_the_method_field_read_as_isolated(tmp_path):
    (timing,) = load_profile(_write(tmp_path, _valid())).device("cpu").ops.values()
    assert timing.method == "isolated"
    assert timing.spread == pytest.approx(1e-6 / 1e-5)          # iqr / median


def test_unknown_timing_method_names_the_field(tmp_path):
    data = _valid()
    data["devices"][0]["ops"][0]["method"] = "guessed"
    msg = _error(tmp_path, data)
    assert "devices[0].ops[0].method" in msg and "in-network" in msg


def test_fit_covered_must_be_true_or_false(tmp_path):
    data = _valid()
    data["devices"][0]["fits"] = {"conv": {"overhead_s": 1e-6, "compute_efficiency": 0.5, "memory_efficiency": 0.5,
                                           "points": 3, "median_abs_pct_error": 4.0, "covered": "yes"}}
    assert "devices[0].fits.conv.covered" in _error(tmp_path, data)
