"""What this machine has: the memory a process can still allocate, and bytes as people read them.

The figure is the smallest of the limits that apply: ``MemAvailable`` in /proc/meminfo,
the cgroup's memory limit less its usage (v2, then v1), the address-space limit
(``RLIMIT_AS``) less the process's size; elsewhere the free physical pages (``sysconf``);
unknown (no check) when none can be read. Readers of files (``formats``) and the run's
memory pre-check (``runtime.footprint``) both ask it before allocating.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as 2^63 rounded to a page


def format_bytes(n: float) -> str:
    """Binary units, as numpy's MemoryError writes them (``7.28 TiB``)."""
    for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                       ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def available_bytes() -> tuple[int | None, str]:
    """(bytes this process can still allocate, where that figure comes from); (None, "")
    when no figure can be read."""
    found = [(n, where) for n, where in (_meminfo(), _cgroup(), _address_space()) if n is not None]
    if not found:
        found = [_sysconf()]
    found = [(n, where) for n, where in found if n is not None]
    return min(found) if found else (None, "")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo() -> tuple[int | None, str]:
    m = re.search(r"^MemAvailable:\s+(\d+) kB", _read("/proc/meminfo") or "", re.M)
    return (int(m.group(1)) * 1024, "MemAvailable in /proc/meminfo") if m else (None, "")


def _cgroup() -> tuple[int | None, str]:
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = (_read(limit_file) or "").strip(), (_read(usage_file) or "").strip()
        if limit.isdigit() and usage.isdigit() and int(limit) < _UNLIMITED:
            return max(0, int(limit) - int(usage)), f"cgroup limit {limit_file} less usage"
    return None, ""


def _address_space() -> tuple[int | None, str]:
    try:
        import resource
    except ImportError:
        return None, ""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None, ""
    m = re.search(r"^VmSize:\s+(\d+) kB", _read("/proc/self/status") or "", re.M)
    used = int(m.group(1)) * 1024 if m else 0
    return max(0, soft - used), "address-space limit (ulimit -v) less this process"


def _sysconf() -> tuple[int | None, str]:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory"
    except (ValueError, OSError, AttributeError):
        return None, ""
