"""Shared test set-up: the corpus location, markers that skip cleanly, CI strictness.

Tests over ../shared/nets skip where it is absent (a user's clone) but fail under CI=true.
A test that opens a file under ../shared without first asking ``corpus_dir()`` (or the
``corpus`` fixture) fails, here and in CI: on a clone without ../shared it would fail
instead of skipping (see ``_audit_open``).
GPU tests skip without a visible GPU. Torch-reference tests skip without torch, except
under CI=true, where torch is a test dependency and its absence is a failure.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "nets"
IN_CI = os.environ.get("CI", "").lower() == "true"


def corpus_dir() -> Path:
    """The corpus folder, or a skip (a failure under CI=true) when it is absent."""
    if not CORPUS.is_dir():
        if IN_CI:
            pytest.fail(f"CI=true but the net corpus {CORPUS} is missing")
        pytest.skip(f"net corpus {CORPUS} not found (it sits beside the checkout in CI)")
    _GUARD["asked"] = True
    return CORPUS


# The guard on ../shared: while a test runs (setup, call, teardown), an audit hook notes
# the first file it opens under ../shared before corpus_dir() was asked in that test.
# Reads at collection time (parametrising over corpus files that exist) are not guarded:
# they give no cases where the corpus is absent, and no failures.
_SHARED_PREFIX = os.path.join(os.path.abspath(ROOT.parent / "shared"), "")
_GUARD: dict = {"test": None, "asked": False, "opened": None}


def _audit_open(event: str, args: tuple) -> None:
    if event != "open" or _GUARD["test"] is None or _GUARD["asked"] or _GUARD["opened"]:
        return
    path = args[0] if args else None
    if isinstance(path, (str, bytes, os.PathLike)):
        try:
            full = os.path.abspath(os.fsdecode(path))
        except (TypeError, ValueError, OSError):
            return
        if full.startswith(_SHARED_PREFIX):
            _GUARD["opened"] = full


sys.addaudithook(_audit_open)


def _under_shared(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_under_shared(v) for v in value)
    if isinstance(value, (str, os.PathLike)):
        return os.path.abspath(os.fspath(value)).startswith(_SHARED_PREFIX)
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # A case parametrised on a corpus file exists only where that file does (corpus_files).
    params = getattr(getattr(item, "callspec", None), "params", {})
    _GUARD.update(test=item.nodeid, asked=any(_under_shared(v) for v in params.values()), opened=None)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    opened, _GUARD["test"] = _GUARD["opened"], None
    if opened:
        pytest.fail(f"{item.nodeid} opened {opened} without asking conftest.corpus_dir() first: on a clone "
                    f"without ../shared it would fail instead of skipping; call corpus_dir() (or take the "
                    f"`corpus` fixture) before reading the corpus", pytrace=False)


def corpus_files(sub: str, *suffixes: str) -> list[Path]:
    """Corpus files for parametrisation (empty when the corpus is absent)."""
    base = CORPUS / sub
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if not suffixes or p.suffix in suffixes)


def gpu_available() -> bool:
    try:
        import cupy
        return bool(cupy.is_available())
    except Exception:
        return False


def require_torch():
    """Import torch, or skip (fail under CI=true)."""
    try:
        import torch
        return torch
    except ImportError:
        if IN_CI:
            pytest.fail("CI=true but torch (the independent reference) is not installed")
        pytest.skip("torch not installed: pip install -e .[test]")


def require_cupy():
    """Import cupy (for its names and signatures; no GPU needed), or skip (fail under
    CI=true, where cupy is a test dependency and the strict stand-in must run)."""
    try:
        import cupy
        return cupy
    except ImportError:
        if IN_CI:
            pytest.fail("CI=true but cupy (the stand-in's source of cupy's API) is not installed")
        pytest.skip("cupy not installed: pip install -e .[test]")


class CupyNames:
    """numpy restricted to the names cupy also has: a kernel that reaches for a numpy-only
    function fails here, on machines without a GPU (kernels are written once for both).

    Names only. Kernels of GPU ops are held to cupy's full rules (signatures, ufunc
    methods, no implicit host reads, launch counts) by ``cupy_standin.check_gpu_kernel``
    (tests/cupy_standin.py); run a new op's conformance cases through that."""

    def __init__(self, np_module, cp_module):
        self._np, self._cp = np_module, cp_module

    def __getattr__(self, name):
        if not hasattr(self._cp, name):
            raise AttributeError(f"cupy has no '{name}': the kernel would fail on the GPU")
        value = getattr(self._np, name)
        return CupyNames(value, getattr(self._cp, name)) if isinstance(value, types.ModuleType) else value


@pytest.fixture
def corpus() -> Path:
    return corpus_dir()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU visible (cupy.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
