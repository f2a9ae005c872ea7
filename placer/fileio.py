"""Output files that never cost the user a file placer did not write.

- Atomic writes: a file is written to a temporary file beside its target, then renamed;
  a crash midway leaves the previous file (or none), never a half-written one. A target
  that exists and is no regular file (a FIFO, /dev/null, /dev/stdout) is opened and
  written, never renamed over; a symbolic link is written through (the file it names
  gets the new content, the link stays).
- One command at a time (``command_scope``, entered by ``placer.cli.main``): every file a
  loader reads is noted (``note_read``), and no output may be one of them, whatever path
  names it (symbolic links, hard links, ``./x`` and ``x`` are the same file). Within a
  scope that stages, the outputs of a command are written to their temporaries as it goes
  and renamed into place together when it succeeds: a command that fails or is
  interrupted leaves every output as it was; two outputs on one path are refused.
- Folders (``OutputDir``): written whole into a temporary folder beside the target and
  moved into place only when the target is absent, empty, or holds only the files of a
  previous placer output of the same kind (its manifest's ``placer_output`` field and
  ``files`` list), never a folder of other files, one holding an input, or the working folder.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

from placer.errors import PlacerError

# The manifest field that marks a folder as placer's output, and the kind of output.
OUTPUT_MARK = "placer_output"
# Signals held off while a command's outputs are renamed into place.
_HELD = tuple(s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


class _Command:
    """What one command has read and what it has staged for writing."""

    def __init__(self, stage: bool):
        self.stage = stage
        self.reads: dict[str, tuple | None] = {}   # real path -> (st_dev, st_ino)
        self.updating: set[str] = set()            # being read to be rewritten (a profile merged into)
        self.files: list[tuple[str, Path, Path | None, bytes | None]] = []  # (shown, target, temp, data)
        self.dirs: list[tuple[Path, Path]] = []    # (temp folder, target)
        # Every temporary file or folder made so far and not yet renamed into place,
        # noted the moment it exists (signals held), so that an interrupt at any point
        # (between writes, while a folder is being committed) leaves none behind.
        self.temps: set[Path] = set()
        # Folders made for an output (``-o new/dir/plan.json``), outermost first: a command
        # that fails or is interrupted removes those still empty.
        self.made_dirs: list[Path] = []

    def read_by(self, path: Path) -> str | None:
        """The input ``path`` is (a path this command read), or None."""
        real, ident = _identity(path)
        for name, other in self.reads.items():
            if name == real or (ident is not None and other == ident):
                return name
        return None

    def staged_as(self, real: str) -> str | None:
        for shown, target, _, _ in self.files:
            if str(target) == real:
                return shown
        return None

    def commit(self) -> None:
        """FIFOs and devices first (opening one may wait for a reader: a signal still
        interrupts), then every rename at once, with signals held off until done."""
        for _, target, tmp, data in self.files:
            if tmp is None:
                _write_special(target, data)
        with _signals_held():
            for _, target, tmp, _ in self.files:
                if tmp is not None:
                    os.replace(tmp, target)
            for tmp, out in self.dirs:
                _replace_dir(tmp, out)
            self.temps.clear()
        self.files, self.dirs, self.made_dirs = [], [], []

    def discard(self) -> None:
        for _, _, tmp, _ in self.files:
            if tmp is not None and os.path.lexists(tmp):
                os.unlink(tmp)
        for tmp, _ in self.dirs:
            shutil.rmtree(tmp, ignore_errors=True)
        for tmp in self.temps:
            _remove(tmp)
        for folder in reversed(self.made_dirs):
            try:
                folder.rmdir()          # only when empty: never a file of the user's
            except OSError:
                pass
        self.files, self.dirs, self.temps, self.made_dirs = [], [], set(), []


_current: _Command | None = None


@contextmanager
def command_scope(stage: bool = True):
    """One command's reads and writes (module docstring). ``stage=False``: outputs are
    renamed into place as they are written (a command that reads its own outputs back)."""
    global _current
    outer, _current = _current, _Command(stage)
    try:
        yield _current
        try:
            _current.commit()
        except OSError as e:
            raise PlacerError(f"{e.filename}: cannot write: {e.strerror or e}",
                              hint="give an output path in a folder you can write to") from e
    finally:
        with _signals_held():
            _current.discard()
        _current = outer


def note_read(path: str | os.PathLike | None) -> None:
    """Record that the running command reads ``path`` (no output may replace it)."""
    if _current is not None and path:
        real, ident = _identity(Path(path))
        if real not in _current.updating:
            _current.reads[real] = ident


@contextmanager
def reading_to_update(path: str | os.PathLike):
    """What is read of ``path`` here is read to be rewritten (``placer profile -o``
    merges into its output): it does not count as an input."""
    if _current is None:
        yield
        return
    real = _identity(Path(path))[0]
    _current.updating.add(real)
    try:
        yield
    finally:
        _current.updating.discard(real)


def _identity(path: Path) -> tuple[str, tuple | None]:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return real, None
    return real, (st.st_dev, st.st_ino)


def refuse_input(path: str | os.PathLike, option: str = "") -> None:
    """Raise if ``path`` is a file the running command has read."""
    if _current is None:
        return
    found = _current.read_by(Path(path))
    if found is not None:
        what = f"{option} {path}" if option else str(path)
        same = "" if found == os.path.abspath(path) else f" ({found})"
        raise PlacerError(f"{what}: refusing to overwrite an input of this command{same}",
                          hint="choose another output path")


def refuse_outputs(outputs: dict[str, str | os.PathLike | None], *inputs: str | os.PathLike | None) -> None:
    """Before any work: no output (option -> path) is an input (read so far, or named in
    ``inputs``), and no two outputs are one file."""
    seen: dict[tuple, str] = {}
    named = [_identity(Path(p)) for p in inputs if p]
    for option, out in outputs.items():
        if not out:
            continue
        real, ident = _identity(Path(out))
        if any(real == r or (ident is not None and ident == i) for r, i in named):
            raise PlacerError(f"{option} {out}: refusing to overwrite an input file".lstrip(),
                              hint="choose another output path")
        refuse_input(out, option)
        for key in (real, ident):
            if key is not None and key in seen:
                raise PlacerError(f"{option} {out}: the same file as {seen[key]}",
                                  hint="give each output its own path")
        seen.update({key: option for key in (real, ident) if key is not None})


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; a path that cannot be written (a folder, a
    parent that is a file, no permission, a read-only or full disk) is a PlacerError, and
    so is an input of the running command."""
    path = Path(path)
    refuse_input(path)
    try:
        return _atomic_write(path, data)
    except OSError as e:
        raise PlacerError(f"{path}: cannot write: {e.strerror or e}",
                          hint="give an output path in a folder you can write to") from e


def _atomic_write(path: Path, data: bytes) -> Path:
    if path.is_dir():
        raise IsADirectoryError(21, "is a folder, not a file name")
    target = Path(os.path.realpath(path))
    staged = _current is not None and _current.stage
    if staged and _current.staged_as(str(target)) is not None:
        raise PlacerError(f"{path}: two outputs of this command are this one file "
                          f"(also {_current.staged_as(str(target))})", hint="give each output its own path")
    if target.exists() and not target.is_file():   # a FIFO, a device: written, never replaced
        if staged:
            _current.files.append((str(path), target, None, data))
        else:
            _write_special(target, data)
        return path
    make_parents(target.parent)
    with _signals_held():   # an interrupt lands after the temporary is noted, never between
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        _note_temp(Path(tmp))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        if staged:
            _current.files.append((str(path), target, Path(tmp), None))
        else:
            with _signals_held():
                os.replace(tmp, target)
                _forget_temp(Path(tmp))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def make_parents(folder: Path) -> None:
    """``folder`` and the folders above it that are missing, each noted by the command as
    it is made (``_Command.made_dirs``)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for made in reversed(missing):
        with _signals_held():
            try:
                made.mkdir()
            except FileExistsError:     # made meanwhile by someone else: not ours to remove
                continue
            if _current is not None:
                _current.made_dirs.append(made)


def _note_temp(tmp: Path) -> None:
    if _current is not None:
        _current.temps.add(tmp)


def _forget_temp(tmp: Path) -> None:
    if _current is not None:
        _current.temps.discard(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _write_special(target: Path, data: bytes) -> None:
    with open(target, "wb") as f:
        f.write(data)


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
    """Raise if ``output`` is one of the input files (named here, or read so far)."""
    refuse_outputs({"": output}, *inputs)


# ---------------------------------------------------------------- folders

def check_output_dir(outdir: str | os.PathLike, option: str, kind: str, manifest: str,
                     *inputs: str | os.PathLike | None) -> Path:
    """``outdir`` as an absolute path, when it may receive a placer output of ``kind``:
    absent, empty, or holding exactly a previous output of that kind (``manifest``'s
    ``placer_output`` field is ``kind`` and every file there is one its ``files`` lists),
    and holding no input of the running command (read so far, or named in ``inputs``).
    Otherwise a PlacerError."""
    for path in inputs:
        note_read(path)
    out = Path(os.path.abspath(outdir))
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise PlacerError(f"{option} {outdir}: exists and is not a folder", hint="give a new or empty folder")
    cwd = Path(os.getcwd())
    if out.exists() and (out == cwd or out in cwd.parents):
        raise PlacerError(f"{option} {outdir}: is the working folder (or holds it); it cannot be replaced",
                          hint="give a new subfolder, e.g. -o out")
    if not out.exists():
        return out
    _refuse_reads_under(out, f"{option} {outdir}")
    if any(out.iterdir()) and not _previous_output(out, kind, manifest):
        raise PlacerError(f"{option} {outdir}: the folder holds files that are not a previous "
                          f"`{kind}` output of placer", hint="give a new or empty folder")
    return out


def _refuse_reads_under(out: Path, what: str) -> None:
    for name in (_current.reads if _current is not None else ()):
        if Path(name) == out or out in Path(name).parents:
            raise PlacerError(f"{what}: refusing to overwrite an input: the folder holds {name}, which this "
                              "command reads", hint="give another output folder")


def _previous_output(out: Path, kind: str, manifest: str) -> bool:
    """``out`` holds only files its manifest says placer wrote there, as output of ``kind``
    (the manifest is read first: a folder without one is not walked)."""
    try:
        doc = json.loads((out / manifest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get(OUTPUT_MARK) != kind or not isinstance(doc.get("files"), list):
        return False
    listed = {*map(str, doc["files"]), manifest}
    listed |= {str(d) for name in listed for d in Path(name).parents if str(d) != "."}   # their folders
    return all(str(p.relative_to(out)) in listed for p in out.rglob("*"))


class OutputDir:
    """A folder output of ``kind``, checked now (``check_output_dir``) and written into a
    temporary folder beside it::

        d = OutputDir(args.output, "-o", "convert")      # before any work
        with d:
            save(d.path("predict_net.pbtxt")); ...
            d.write_manifest({...})                      # placer_output + files, then the fields given
        print(d.shown(path))                            # the path the file has once moved

    Leaving the ``with`` block moves the folder into place (``commit_dir``); an error
    there removes it.
    """

    def __init__(self, outdir: str | os.PathLike, option: str, kind: str, manifest: str = "manifest.json",
                 inputs: tuple = ()):
        self.kind, self.manifest, self.option = kind, manifest, option
        self.out = check_output_dir(outdir, option, kind, manifest, *inputs)
        self.given = Path(outdir)      # as the user wrote it, for messages
        self.tmp: Path | None = None
        self.files: list[str] = []

    def __enter__(self) -> "OutputDir":
        try:
            make_parents(self.out.parent)
            with _signals_held():   # noted the moment it exists (``_Command.temps``)
                self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent))
                _note_temp(self.tmp)
        except OSError as e:
            raise PlacerError(f"{self.option} {self.given}: cannot write: {e.strerror or e}",
                              hint="give a folder in a place you can write to") from e
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is None:
            commit_dir(self.tmp, self.out)   # removes the folder if it fails or is interrupted
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
            _forget_temp(self.tmp)

    def path(self, name: str) -> Path:
        """Where the file ``name`` (relative to the folder) is written now."""
        self.files.append(name)
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def shown(self, path: str | os.PathLike) -> Path:
        """The final path of a file written at ``path`` (under the temporary folder; it is
        listed in the manifest)."""
        name = Path(path).relative_to(self.tmp)
        self.files.append(str(name))
        return self.given / name

    def write_manifest(self, doc: dict | None = None) -> dict:
        doc = {OUTPUT_MARK: self.kind, "files": sorted(set(self.files)), **(doc or {})}
        atomic_write_text(self.tmp / self.manifest, json.dumps(doc, indent=1) + "\n")
        return doc


def commit_dir(tmp: Path, out: Path) -> None:
    """Move the folder ``tmp`` into place as ``out`` (now, or with the command's other
    outputs when they are staged); ``tmp`` is removed on failure."""
    try:
        _refuse_reads_under(out, str(out))
    except BaseException:   # refused, or a signal arrived: the folder goes
        shutil.rmtree(tmp, ignore_errors=True)
        _forget_temp(tmp)
        raise
    if _current is not None and _current.stage:
        _current.dirs.append((tmp, out))
        return
    try:
        with _signals_held():
            _replace_dir(tmp, out)
            _forget_temp(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PlacerError(f"{out}: cannot write: {e.strerror or e}", hint="give a folder you can write to") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(new: Path, out: Path) -> None:
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.rename(out, old / out.name)
        os.rename(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, out)


@contextmanager
def _signals_held():
    """SIGINT, SIGTERM, SIGHUP wait until the renames are done (then arrive)."""
    try:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    except (AttributeError, ValueError, OSError):
        held = None
    try:
        yield
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

