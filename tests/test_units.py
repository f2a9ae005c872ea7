"""placer.units: one way to write bytes, rates and times, and the command line and the
report both use it (the same figure reads the same in both)."""
from __future__ import annotations

import math
import re

import pytest

from placer import cli
from placer.examples import path as example_path
from placer.units import byte_unit, fmt_bytes, fmt_rate, fmt_time, time_unit

GiB = 2 ** 30


@pytest.mark.parametrize("nbytes,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (4000, "3.91 KiB"),                 # 4000 / 1024 = 3.906
    (1000 * 1024, "1000 KiB"),          # three digits and more: whole units, no exponent
    (2 ** 20 / 1e6 * 1e6, "1 MiB"),     # 1048575.9999...: float noise is not 1024 KiB
    (16 * GiB, "16 GiB"),               # a "16 GB" V100
    (141 * GiB, "141 GiB"),             # an H200
    (96.2e9, "89.6 GiB"),               # 96.2e9 / 2**30 = 89.59
    (5 * 2 ** 40, "5 TiB"), (-2048, "-2 KiB"),
    (None, "n/a"), (math.nan, "n/a"), (math.inf, "n/a"),
])
def test_bytes_are_binary_with_three_digits(nbytes, text):
    assert fmt_bytes(nbytes) == text


@pytest.mark.parametrize("rate,text", [
    (12e9, "12 GB/s"), (15.75e9, "15.8 GB/s"), (500e6, "500 MB/s"), (3.35e12, "3.35 TB/s"),
    (100, "100 B/s"), (None, "n/a"),
])
def test_rates_are_decimal(rate, text):
    assert fmt_rate(rate) == text


@pytest.mark.parametrize("seconds,text", [
    (1.234, "1.23 s"), (125.4, "125 s"), (0.0123, "12.3 ms"), (6.504e-4, "650 µs"),
    (4.56e-5, "45.6 µs"), (2e-9, "2 ns"), (0, "0 s"), (-0.002, "-2 ms"),
    (math.inf, "∞"), (-math.inf, "-∞"), (math.nan, "n/a"), (None, "n/a"),
])
def test_times(seconds, text):
    assert fmt_time(seconds) == text


def test_axis_units_follow_the_same_ladders():
    assert time_unit(0.5) == ("ms", 1e-3) and time_unit(3.0) == ("s", 1.0)
    assert time_unit(2e-7) == ("ns", 1e-9)
    assert byte_unit(3e9) == ("GiB", GiB) and byte_unit(512) == ("B", 1.0)


def test_plan_and_report_print_gpu_memory_alike(capsys, tmp_path):
    """The V100 profile's 16 GiB capacity reads "16 GiB" on stdout and in the report."""
    report = tmp_path / "r.html"
    rc = cli.main(["plan", str(example_path("resnet_small")), "--gpu-profile", "v100-16gb-pcie3",
                   "--report", str(report)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("GPU memory:"))
    # 90% of 16 GiB is usable by default
    assert re.search(r"used of 14\.4 GiB usable \(capacity 16 GiB less the reserve\)", line), line
    page = re.sub(r"\s+", " ", report.read_text())
    assert "used of 16 GiB (14.4 GiB usable after the reserve)" in page
    assert " GB" not in line and " MB" not in line and " KB" not in line
