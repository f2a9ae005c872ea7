"""How many threads numpy's BLAS uses, set at run time (``placer run --threads N``).

On a shared or small host a multi-threaded BLAS oversubscribes the cores and small GEMMs
slow down by two orders of magnitude (see reports/BENCHMARKS.md), so a run that is timed
should be able to pin the count. ``OPENBLAS_NUM_THREADS`` works only before numpy loads;
this finds the OpenBLAS library numpy has loaded and calls its setter (Linux; other
platforms and BLAS builds answer False, and the caller says what to do instead).
"""
from __future__ import annotations

import ctypes
import re

_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_", "openblas_get_num_threads")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")


def _loaded_openblas() -> list[str]:
    import numpy  # noqa: F401  (loads the BLAS)
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
    except OSError:
        return []
    return sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps)))


def set_blas_threads(count: int) -> bool:
    """Set the thread count of every loaded OpenBLAS; True when at least one took it."""
    done = False
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(int(count)))
                done = True
                break
    return done


def get_blas_threads() -> int | None:
    """The thread count of the first loaded OpenBLAS, or None when it cannot be read."""
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _GETTERS:
            getter = getattr(lib, name, None)
            if getter is not None:
                return int(getter())
    return None
