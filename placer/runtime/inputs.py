"""Random inputs that a net can actually run on (``placer run --random-inputs SEED``).

Floats are standard normal. Integer blobs get values that are valid for the op that
reads them, decided from that op's type and the input's position:

- indices (``Gather``, ``BatchGather``, ``SparseLengths*`` and their ``Fused8BitRowwise``
  forms): uniform in ``[0, rows)`` where rows is the size of the DATA input along the
  gathered axis (axis 0; axis 1 for ``BatchGather``);
- lengths (``SparseLengths*``, ``Lengths{Sum,Mean,Max}``, ``LengthsToSegmentIds``,
  ``LengthsPartition``...):
  non-negative, summing to the number of indices (or DATA rows for ``Lengths*``), cut at
  random points so that empty segments occur;
- labels (``SoftmaxWithLoss``, ``LabelCrossEntropy``, ``Accuracy``...): uniform in
  ``[0, classes)``, classes being the last dimension of the scores;
- any other integer blob: uniform in ``[0, 10)``; bool: fair coin.

A blob in one of those roles whose declared dtype is a float (``--input`` defaults to
float32) is made int64 for indices and int32 for lengths and labels, as Caffe2 expects.

``npz_types`` gives the types of an .npz's arrays from its headers alone: ``placer run
--inputs`` (and ``plan`` / ``profile --inputs``) infer shapes at them; ``fed_type`` refuses
an array whose dtype the net does not read (an int32 image for a float32 input) rather
than cast it.

Training feeds a batch per step: ``NpzBatches`` (one .npz per step, cycled; a folder
gives its files in name order) or ``RandomBatches`` (step k drawn from (seed, k)).
"""
from __future__ import annotations

import math
import os
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from placer.errors import InputError
from placer.fileio import note_read
from placer.ops.registry import copy_types
from placer.runtime.footprint import Footprint, require_memory
from placer.types import Net, TensorType

_SLS = {"SparseLengthsSum", "SparseLengthsMean", "SparseLengthsMax", "SparseLengthsSumFused8BitRowwise",
        "SparseLengthsMeanFused8BitRowwise", "SparseLengthsSumFused4BitRowwise"}
_SLWS = {"SparseLengthsWeightedSum", "SparseLengthsWeightedMean", "SparseLengthsWeightedSumFused8BitRowwise",
         "SparseLengthsWeightedSumFused4BitRowwise"}
_LENGTHS = {"LengthsSum", "LengthsMean", "LengthsMax", "LengthsWeightedSum"}
_LABELS = {"SoftmaxWithLoss", "LabelCrossEntropy", "Accuracy", "CrossEntropy"}

# role of input position -> ("index", data position, axis) | ("lengths", counted position, axis)
# | ("label", scores position, -1)
ROLES: dict[str, dict[int, tuple]] = {
    **{t: {1: ("index", 0, 0), 2: ("lengths", 1, 0)} for t in _SLS},
    **{t: {2: ("index", 0, 0), 3: ("lengths", 2, 0)} for t in _SLWS},
    **{t: {1: ("lengths", 0, 0)} for t in _LENGTHS},
    "LengthsToSegmentIds": {},
    "LengthsPartition": {0: ("lengths", 1, 0)},     # a row-wise table's routing: LENGTHS count the KEYS
    "Gather": {1: ("index", 0, 0)},
    "BatchGather": {1: ("index", 0, 1)},
    **{t: {1: ("label", 0, -1)} for t in _LABELS},
    # a detection net's im_info (N, 3): the image's height and width (the feature map the
    # proposals come from, times 1 / spatial_scale), scale 1
    "GenerateProposals": {2: ("image_info", 0, 2)},
}
_ROLE_DTYPE = {"index": "int64", "lengths": "int32", "label": "int32"}


def roles(net: Net) -> dict[str, tuple]:
    """Every blob read in a known role -> (role, op, position) of its first such reader:
    one pass over the ops (a look-up per fed blob would be quadratic: a Sum of 20k fed
    inputs took minutes)."""
    found: dict[str, tuple] = {}
    for op in net.ops:
        for pos, role in ROLES.get(op.type, {}).items():
            if pos < len(op.inputs):
                found.setdefault(op.inputs[pos], (role, op, pos))
    return found


def through_copies(net: Net) -> Net:
    """``net`` with every op reading the blob its input was copied from (the unplaced
    net's readers), so that an index or a length is drawn for the op that uses it: in a
    placed net a fed blob's first reader is its copy to a GPU."""
    copies = copy_types()
    source: dict[str, str] = {}
    ops = []
    for op in net.ops:
        inputs = tuple(source.get(b, b) for b in op.inputs) if source else tuple(op.inputs)
        if op.type in copies and len(op.inputs) == 1 and len(op.outputs) == 1:
            source[op.outputs[0]] = inputs[0]
        ops.append(op if inputs == tuple(op.inputs) else replace(op, inputs=inputs))
    return replace(net, ops=ops) if source else net


def fed_type(net: Net, name: str, fed: TensorType, declared: TensorType | None, source: str) -> TensorType:
    """The type an array fed from ``source`` gives blob ``name``: its shape, and its dtype
    where the net reads that dtype, else an InputError (the array is never cast, so a run
    computes in the dtype the net declares or not at all).

    A blob read as indices, lengths or labels (``ROLES``) takes any integer dtype. Any other
    blob takes the dtype its file declares: value_info.json beside a Caffe2 net, float32
    for a Caffe net's inputs (Caffe's blobs are float; its labels are read as labels).
    """
    dtype = np.dtype(fed.dtype)
    (kind, *_), reader, _ = roles(through_copies(net)).get(name, ((None,), None, None))
    where = f"{source}: array '{name}' is {fed.dtype}"
    if dtype.kind not in "biuf":
        raise InputError(f"{where}, not a Caffe2 tensor type", hint=f"save '{name}' as float32 or an integer type")
    if kind in _ROLE_DTYPE:
        if dtype.kind not in "iu":
            raise InputError(f"{where}, but op {reader.label} reads it as {kind}s",
                             hint=f"save '{name}' as {_ROLE_DTYPE[kind]}")
        return fed
    want = "float32" if net.source_format == "caffe-prototxt" else (declared.dtype if declared else None)
    if want is not None and str(dtype) != want:
        raise InputError(f"{where}; the net reads it as {want} (it is not cast)",
                         hint=f"save it as {want}, e.g. np.savez(path, {name}=array.astype(np.{want}))")
    return fed


def random_inputs(net: Net, types: Mapping[str, TensorType | None], names: list[str],
                  seed: int | tuple[int, ...] = 0) -> dict[str, np.ndarray]:
    """Arrays for ``names`` at their ``types``; index-like blobs valid for their readers
    (followed through copy ops, so that a placed net gets the values its unplaced net
    would). ``seed`` is an int or a sequence of ints (numpy's SeedSequence entropy)."""
    net = through_copies(net)
    rng = np.random.default_rng(seed)
    # a table's rows bound the indices that read it; an unknown type (a train net whose
    # update op could not be typed) does not hide the table's shape from the init net
    types = {**net.params, **{k: v for k, v in types.items() if v is not None}}
    missing = [n for n in names if types.get(n) is None]
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        hint = "give --input NAME=d0,d1,..[:dtype] for each"
        if net.init_proto is None and len(missing) > 1:
            hint = "give --init-net INIT (the init net that fills the parameters), or " + hint
        raise InputError(f"cannot make random inputs: no shape for {shown}", hint=hint)
    out: dict[str, np.ndarray] = {}
    pending = []
    reader_roles = roles(net)
    for name in names:
        found = reader_roles.get(name)
        if found and found[0][0] == "lengths":
            pending.append((name, found))  # after the indices they count
        else:
            out[name] = _make(rng, net, types, name, found, out)
    for name, found in pending:
        out[name] = _make(rng, net, types, name, found, out)
    return out


def _make(rng, net, types, name, found, made) -> np.ndarray:
    t = types[name]
    dtype = np.dtype(t.dtype)
    if found is None:
        if dtype.kind == "f":
            return rng.standard_normal(t.shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, t.shape).astype(bool)
        return rng.integers(0, 10, t.shape).astype(dtype)
    (role, ref, axis), op, _ = found
    if role == "image_info":
        return _image_info(t, op, _shape(types, op.inputs[ref], op, name))
    if dtype.kind not in "iu":
        dtype = np.dtype(_ROLE_DTYPE[role])
    ref_name = op.inputs[ref]
    ref_shape = made[ref_name].shape if ref_name in made else _shape(types, ref_name, op, name)
    if role == "lengths":
        total = ref_shape[axis] if ref_shape else 1
        return _split(rng, total, t.size).reshape(t.shape).astype(dtype)
    bound = ref_shape[axis] if len(ref_shape) > abs(axis) - (axis < 0) else 1
    return rng.integers(0, max(1, bound), t.shape).astype(dtype)


def _image_info(t: TensorType, op, feature_shape: tuple) -> np.ndarray:
    """Rows of (height, width, 1.0): the image size the proposals' feature map implies."""
    scale = float(op.args.get("spatial_scale", 1.0 / 16)) or 1.0
    h, w = (feature_shape[2], feature_shape[3]) if len(feature_shape) == 4 else (1, 1)
    row = np.array([round(h / scale), round(w / scale), 1.0])
    return np.broadcast_to(row, t.shape).astype(t.dtype)  # (N, 3): GenerateProposals checks it


def _shape(types, ref_name, op, name) -> tuple:
    ref = types.get(ref_name)
    if ref is None:
        raise InputError(f"cannot make random values for '{name}': op {op.label} reads it against "
                         f"'{ref_name}', whose shape is unknown", hint=f"give --input {ref_name}=...")
    return ref.shape


def _split(rng, total: int, parts: int) -> np.ndarray:
    """``parts`` non-negative integers summing to ``total`` (random cut points)."""
    if parts == 0:
        return np.zeros(0, dtype=np.int64)
    cuts = np.sort(rng.integers(0, total + 1, parts - 1))
    return np.diff(np.concatenate([[0], cuts, [total]]))


# -- batches: one per step ---------------------------------------------------------------

def npz_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The .npz files named by ``paths`` in order; a folder gives its .npz files in name order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.suffix == ".npz" and f.is_file())
            if not found:
                raise InputError(f"{p}: the folder holds no .npz file",
                                 hint="one .npz per step, keyed by blob name (numpy.savez)")
            files.extend(found)
        else:
            files.append(p)
    for f in files:
        note_read(f)
    return files


NPZ_HINT = "give an .npz written by numpy.savez, keyed by blob name"
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def npz_headers(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Key -> (shape, dtype) of every array of an .npz, from the .npy headers alone (a
    header can claim any shape: nothing is allocated here)."""
    found = {}
    try:
        if not Path(path).is_file():  # a FIFO or a device has no end for zipfile to seek to
            what = "is a directory" if Path(path).is_dir() else "is not a regular file"
            raise InputError(f"{path}: {what if Path(path).exists() else 'no such file'}", hint=NPZ_HINT)
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = _NPY_HEADER_READERS.get(version)
                    if read_header is None:
                        raise ValueError(f"member {info.filename}: .npy format {version} is not read here")
                    shape, _, dtype = read_header(f)
                found[info.filename.removesuffix(".npy")] = (tuple(shape), dtype)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read input arrays ({e})", hint=NPZ_HINT) from e
    return found


def npz_bytes(path: str | os.PathLike) -> int:
    """Bytes of the arrays an .npz declares."""
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in npz_headers(path).values())


def npz_types(path: str | os.PathLike) -> dict[str, TensorType]:
    """The types of an .npz's arrays (see ``npz_headers``), keyed by blob name."""
    return {k: TensorType(shape, str(dtype)) for k, (shape, dtype) in npz_headers(path).items()}


class NpzBatches:
    """Step k reads ``files[k % len(files)]`` with ``read`` (a single file is read once)."""

    def __init__(self, files: Sequence[Path], read: Callable[[Path], dict[str, np.ndarray]]):
        self.files, self.read = list(files), read
        self._loaded: tuple[Path, dict] | None = None

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        path = self.files[step % len(self.files)]
        if self._loaded is None or self._loaded[0] != path:
            self._loaded = (path, self.read(path))
        return self._loaded[1]


class RandomBatches:
    """Step k's batch is ``random_inputs`` drawn from the seed sequence (seed, k): each step
    a new batch, the same ones on every run with the same seed."""

    def __init__(self, net: Net, types: Mapping[str, TensorType | None], names: list[str], seed: int):
        self.net, self.types, self.names, self.seed = net, types, names, seed
        self._last: tuple[int, dict] | None = None

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        if self._last is None or self._last[0] != step:
            self._last = (step, random_inputs(self.net, self.types, self.names, seed=(self.seed, step)))
        return self._last[1]


def read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz, after its headers say they fit in memory (a header can claim
    any shape; numpy allocates the whole array before reading a byte of it)."""
    require_npz_fits(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read input arrays ({e})", hint=NPZ_HINT) from e


def require_npz_fits(path) -> None:
    """Refuse an .npz whose headers claim more memory than this machine has."""
    require_memory(Footprint((("arrays", npz_bytes(path)),)), f"reading {path}", hint="feed smaller arrays")
