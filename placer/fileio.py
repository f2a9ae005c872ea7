"""Atomic output files: write to a temporary file beside the target, then rename.

A crash midway leaves the previous file (or none), never a half-written one; an input
file is never overwritten (``refuse_overwrite``).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from placer.errors import PlacerError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; a path that cannot be written (a folder, a
    parent that is a file, no permission, a read-only or full disk) is a PlacerError."""
    path = Path(path)
    try:
        return _atomic_write(path, data)
    except OSError as e:
        raise PlacerError(f"{path}: cannot write: {e.strerror or e}",
                          hint="give an output path in a folder you can write to") from e


def _atomic_write(path: Path, data: bytes) -> Path:
    if path.is_dir():
        raise IsADirectoryError(21, "is a folder, not a file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _mode_for(path: Path) -> int:
    """Keep an existing file's mode; a new file gets the usual 0666 less the umask."""
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def refuse_overwrite(output: str | os.PathLike, *inputs: str | os.PathLike | None) -> None:
    """Raise if ``output`` is one of the input files."""
    out = Path(output).resolve()
    for inp in inputs:
        if inp and Path(inp).exists() and Path(inp).resolve() == out:
            raise PlacerError(f"{output}: refusing to overwrite an input file",
                              hint="choose another output path with -o")
