"""How placer writes quantities for people: the command line, the report and its plots
all format through these functions, so one figure reads the same everywhere.

- Byte amounts are binary: B, KiB, MiB, GiB, TiB (powers of 1024). GPU memory is built
  in powers of two and named in them whatever the label says (a "16 GB" V100 holds
  16 GiB), so a capacity prints as its product name and a table fits or not at a glance.
- Transfer rates are decimal: KB/s, MB/s, GB/s (powers of 1000), as PCIe and memory
  bandwidth are specified and as ``bandwidthTest`` and ``nvidia-smi`` report them.
- Times: s, ms, µs, ns.

Each figure keeps three significant digits (``15.5 GiB``, ``818 µs``); values of 100 or more
in their unit are rounded to whole units (``1000 KiB``, never ``1e+03 KiB``).
"""
from __future__ import annotations

import math

BYTE_UNITS = (("TiB", 2.0 ** 40), ("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20), ("KiB", 2.0 ** 10))
RATE_UNITS = (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3))
TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6))
NOT_AVAILABLE = "n/a"


def _digits(value: float) -> str:
    """Three significant digits without an exponent."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _scaled(value: float, ladder, base_unit: str) -> str:
    for unit, scale in ladder:
        if abs(value) >= scale * (1 - 1e-9):  # 2**20 computed as 1048575.9999... is 1 MiB
            return f"{_digits(value / scale)} {unit}"
    return f"{value:.0f} {base_unit}"


def fmt_bytes(nbytes: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``16 * 2**30`` -> ``16 GiB``; None or NaN -> ``n/a``."""
    if nbytes is None or not math.isfinite(nbytes):
        return NOT_AVAILABLE
    return _scaled(float(nbytes), BYTE_UNITS, "B")


def fmt_rate(bytes_per_s: float | None) -> str:
    """``12e9`` -> ``12 GB/s`` (decimal, see the module docstring)."""
    if bytes_per_s is None or not math.isfinite(bytes_per_s):
        return NOT_AVAILABLE
    return _scaled(float(bytes_per_s), RATE_UNITS, "B/s")


def fmt_time(seconds: float | None) -> str:
    """``0.0123`` -> ``12.3 ms``; ``4.56e-5`` -> ``45.6 µs``; infinities as ``∞``."""
    if seconds is None or math.isnan(seconds):
        return NOT_AVAILABLE
    if math.isinf(seconds):
        return "∞" if seconds > 0 else "-∞"
    if seconds == 0:
        return "0 s"
    for unit, scale in TIME_UNITS:
        if abs(seconds) >= scale:
            return f"{_digits(seconds / scale)} {unit}"
    return f"{_digits(seconds / 1e-9)} ns"


def time_unit(max_seconds: float) -> tuple[str, float]:
    """(unit, seconds per unit) for an axis or column whose largest value is ``max_seconds``."""
    for unit, scale in TIME_UNITS:
        if max_seconds >= scale:
            return unit, scale
    return "ns", 1e-9


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """(unit, bytes per unit) for an axis or column whose largest value is ``max_bytes``."""
    for unit, scale in BYTE_UNITS:
        if max_bytes >= scale:
            return unit, scale
    return "B", 1.0


__all__ = ["fmt_bytes", "fmt_rate", "fmt_time", "time_unit", "byte_unit"]
