"""Op family 'embedding': segment reductions over lengths, the heart of DLRM-style nets.

SparseLengthsSum / Mean / WeightedSum (DATA, [WEIGHTS,] INDICES, LENGTHS): for each
segment s, reduce the rows DATA[INDICES[j]] for the LENGTHS[s] consecutive j of that
segment. LengthsSum / LengthsMean (DATA, LENGTHS) do the same over DATA's own rows.
LengthsToSegmentIds (LENGTHS) gives the segment number of every position, LengthsToRanges
(LENGTHS) the (offset, length) of every segment. LengthsMax and the SortedSegment* ops
(DATA, SEGMENT_IDS) reduce consecutive rows too, with max and log-sum-exp among the reductions.
SparseLengths*Fused8BitRowwise read uint8 tables whose rows end in a float32 scale and bias.

How the reduction runs (no Python loop over segments, no host read of the data): on
the CPU a float32/float64 lookup sum is the product of a sparse (segments x rows) matrix
with the table, in CSR form with ``indptr = [0, cumsum(LENGTHS)]``, column indices =
INDICES and values = 1 (or the weights); scipy.sparse reads only the looked-up rows and
gives zeros for empty segments by construction. Everywhere else the looked-up rows are
gathered (``take``) and reduced per segment by ``placer.ops.segments``: ``reduceat`` on
numpy, a scatter-add (or scatter-max) on cupy. cuSPARSE is not used on the GPU: a CSR
product there syncs, sorts and copies the whole table to column-major order on every
call (time and memory follow the table, not the lookups). float16 tables are reduced
in float32.

Caffe2 facts kept: LENGTHS are summed and must equal len(INDICES) (else an error naming
the op); a mean (or max) over an empty segment is 0; float16 tables give float32 outputs.
Devices: SparseLengths{Sum,Mean,WeightedSum}, Lengths{Sum,Mean,Max} and
SortedSegmentRange{Mean,LogMeanExp} had CUDA kernels in Caffe2; LengthsToSegmentIds,
LengthsToRanges, the other SortedSegment* ops and the Fused8BitRowwise ops were CPU only,
so they are registered for the CPU only and the planner pins them there.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

from placer.errors import ShapeError
from placer.ops.registry import OpDef, register
from placer.ops.segments import (accumulation_dtype, offsets, on_host, segment_ids, segment_sum,
                                 segment_max as max_of_segments)
from placer.types import Args, OpFeatures, TensorType, shape_str

FLOAT_DTYPES = ("float16", "float32", "float64")
INDEX_DTYPES = ("int32", "int64")


def _fail(args: Args, op_type: str, inputs: Sequence[TensorType], what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


def _out_dtype(dtype: str) -> str:
    return "float32" if dtype == "float16" else dtype


# -- inference --------------------------------------------------------------------------

def _infer_segments(op_type: str, data: TensorType, lengths: TensorType, inputs,
                    args: Args, indices: TensorType | None = None,
                    weights: TensorType | None = None) -> list[TensorType]:
    if data.dtype not in FLOAT_DTYPES or data.ndim < 1:
        raise _fail(args, op_type, inputs, f"DATA must be a float tensor of 1+ dimensions, "
                                           f"found {data}")
    if lengths.ndim != 1 or lengths.dtype not in INDEX_DTYPES:
        raise _fail(args, op_type, inputs, f"LENGTHS must be a 1-D int32/int64 vector, found {lengths}")
    if indices is not None and (indices.ndim != 1 or indices.dtype not in INDEX_DTYPES):
        raise _fail(args, op_type, inputs, f"INDICES must be a 1-D int32/int64 vector, found {indices}")
    if weights is not None and (weights.ndim != 1 or weights.shape != indices.shape):
        raise _fail(args, op_type, inputs, f"WEIGHTS {weights} must be a vector as long as "
                                           f"INDICES {indices}")
    return [TensorType(lengths.shape + data.shape[1:], _out_dtype(data.dtype))]


def infer_sparse_lengths(op_type: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        data, indices, lengths = inputs
        return _infer_segments(op_type, data, lengths, inputs, args, indices=indices)
    return infer


def infer_sparse_lengths_weighted(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    data, weights, indices, lengths = inputs
    return _infer_segments("SparseLengthsWeightedSum", data, lengths, inputs, args,
                           indices=indices, weights=weights)


def infer_lengths(op_type: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        data, lengths = inputs
        return _infer_segments(op_type, data, lengths, inputs, args)
    return infer


def infer_lengths_to_segment_ids(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    lengths = inputs[0]
    if lengths.ndim != 1 or lengths.dtype not in INDEX_DTYPES:
        raise _fail(args, "LengthsToSegmentIds", inputs, "LENGTHS must be a 1-D int32/int64 vector")
    return [None]  # its length is sum(LENGTHS): known only from the values


# -- kernels ----------------------------------------------------------------------------

def _checked(xp, op_type: str, args: Args, lengths, n: int | None, indices=None, rows: int = 0) -> int:
    """One host round trip: LENGTHS non-negative and summing to n (any sum when n is
    None), INDICES within rows. Returns the sum of LENGTHS."""
    probes = [lengths.sum(dtype=xp.int64)]
    if lengths.size:
        probes.append(lengths.min())
    if indices is not None and indices.size:
        probes += [indices.min(), indices.max()]
    values = xp.stack(probes).tolist()   # stacked as int64 (the sum's dtype wins)
    total = values[0]
    if lengths.size and values[1] < 0:
        raise ShapeError(f"op {args.op}: {op_type} LENGTHS has a negative length ({values[1]})")
    if n is not None and total != n:
        what = "INDICES" if indices is not None else "DATA rows"
        raise ShapeError(f"op {args.op}: {op_type} LENGTHS sum to {total} but there are {n} {what}")
    if indices is not None and indices.size and (values[-2] < 0 or values[-1] >= rows):
        bad = values[-2] if values[-2] < 0 else values[-1]
        raise ShapeError(f"op {args.op}: {op_type} index {bad} is out of range for DATA of {rows} rows")
    return total


def segment_reduce(xp, data, lengths, indices=None, weights=None, mean: bool = False):
    """Per segment, the (weighted) sum or mean of rows ``data[indices]`` (or of ``data``'s
    own rows when ``indices`` is None); output shape ``(len(lengths),) + data.shape[1:]``.
    Inputs must already be checked (``_checked``)."""
    n_seg = lengths.shape[0]
    flat = data.reshape(data.shape[0], prod(data.shape[1:]))  # no -1: no rows
    out_dtype = accumulation_dtype(xp, data.dtype)
    if on_host(xp) and data.dtype in (xp.float32, xp.float64):
        out = _csr_product(flat, lengths, indices, weights)
    else:
        out = segment_sum(xp, _looked_up(xp, flat, indices, weights), lengths)
    if mean:
        out = out / xp.maximum(lengths, 1).astype(out_dtype)[:, None]
    return out.reshape((n_seg,) + data.shape[1:])


def _looked_up(xp, flat, indices, weights):
    """The rows a reduction reads (in the accumulation dtype), weighted when asked."""
    rows = flat if indices is None else xp.take(flat, indices, axis=0)
    if weights is None:
        return rows
    acc = accumulation_dtype(xp, flat.dtype)
    return rows.astype(acc, copy=False) * weights.astype(acc, copy=False)[:, None]


def _csr_product(flat, lengths, indices, weights):
    """numpy only: scipy's CSR (segments x rows) @ table reads just the looked-up rows."""
    import scipy.sparse   # here, not at the top: most nets never import it

    n = flat.shape[0] if indices is None else indices.shape[0]
    cols = np.arange(n) if indices is None else indices
    vals = np.ones(n, dtype=flat.dtype) if weights is None else weights.astype(flat.dtype, copy=False)
    matrix = scipy.sparse.csr_array((vals, cols, offsets(np, lengths)), shape=(lengths.shape[0], flat.shape[0]))
    return np.asarray(matrix @ flat)


def sparse_lengths_kernel(op_type: str, mean: bool = False):
    def kernel(xp, inputs, args: Args) -> tuple:
        data, indices, lengths = inputs
        _checked(xp, op_type, args, lengths, indices.shape[0], indices, data.shape[0])
        return (segment_reduce(xp, data, lengths, indices, mean=mean),)
    return kernel


def kernel_sparse_lengths_weighted(xp, inputs, args: Args) -> tuple:
    data, weights, indices, lengths = inputs
    _checked(xp, "SparseLengthsWeightedSum", args, lengths, indices.shape[0], indices, data.shape[0])
    return (segment_reduce(xp, data, lengths, indices, weights=weights),)


def lengths_kernel(op_type: str, mean: bool = False):
    def kernel(xp, inputs, args: Args) -> tuple:
        data, lengths = inputs
        _checked(xp, op_type, args, lengths, data.shape[0])
        return (segment_reduce(xp, data, lengths, mean=mean),)
    return kernel


def kernel_lengths_to_segment_ids(xp, inputs, args: Args) -> tuple:
    """Position p belongs to the number of segment ends <= p (empty segments get no ids)."""
    lengths = inputs[0]
    total = _checked(xp, "LengthsToSegmentIds", args, lengths, None)
    return (segment_ids(xp, lengths, total).astype(xp.int32),)


def infer_lengths_to_ranges(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    lengths = inputs[0]
    if lengths.ndim != 1 or lengths.dtype not in INDEX_DTYPES:
        raise _fail(args, "LengthsToRanges", inputs, "LENGTHS must be a 1-D int32/int64 vector")
    return [TensorType(lengths.shape + (2,), "int32")]


def kernel_lengths_to_ranges(xp, inputs, args: Args) -> tuple:
    """Row s is [offset of segment s, its length]."""
    lengths = inputs[0].astype(xp.int32)
    offsets = xp.cumsum(lengths) - lengths
    return (xp.stack([offsets, lengths], axis=1).astype(xp.int32),)


# -- 8-bit rowwise-quantized tables (fused storage) ---------------------------------------

def infer_fused_8bit(op_type: str, weighted: bool = False):
    """DATA is uint8 (rows, D + 8): D quantized values, then float32 scale and bias."""
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
        data, lengths = inputs[0], inputs[-1]
        indices, weights = inputs[-2], (inputs[1] if weighted else None)
        if data.dtype != "uint8" or data.ndim != 2 or data.shape[1] <= 8:
            raise _fail(args, op_type, inputs, f"DATA must be uint8 of shape (rows, D + 8), found {data}")
        _infer_segments(op_type, TensorType(data.shape, "float32"), lengths, inputs, args,
                        indices=indices, weights=weights)
        return [TensorType((lengths.shape[0], data.shape[1] - 8), "float32")]
    return infer


def dequantized_rows(xp, data, indices):
    """float32 rows data[indices]: value * scale + bias, scale and bias read from the
    last 8 bytes of each row."""
    rows = xp.take(data, indices, axis=0)
    scale_bias = xp.ascontiguousarray(rows[:, -8:]).view(xp.float32)
    return rows[:, :-8].astype(xp.float32) * scale_bias[:, :1] + scale_bias[:, 1:]


def fused_8bit_kernel(op_type: str, weighted: bool = False, mean: bool = False):
    def kernel(xp, inputs, args: Args) -> tuple:
        data, indices, lengths = inputs[0], inputs[-2], inputs[-1]
        _checked(xp, op_type, args, lengths, indices.shape[0], indices, data.shape[0])
        rows = dequantized_rows(xp, data, indices)
        weights = inputs[1] if weighted else None
        return (segment_reduce(xp, rows, lengths, weights=weights, mean=mean),)
    return kernel


def fused_8bit_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType], args: Args) -> OpFeatures:
    """Reads the looked-up rows (bytes, scale, bias); a multiply-add to dequantize and an
    add to reduce each value."""
    data, indices = inputs[0], inputs[-2]
    side = sum(t.nbytes for t in inputs[1:])
    looked_up = indices.shape[0] * (data.shape[1] - 8)
    return OpFeatures(flops=float(3 * looked_up), bytes_read=float(indices.shape[0] * data.shape[1] + side),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


# -- segment ids instead of lengths (SortedSegment*) and max-like reductions ---------------

def infer_sorted_segment(op_type: str):
    def infer(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
        data, ids = inputs
        _infer_segments(op_type, data, TensorType(ids.shape[:1], ids.dtype), inputs, args)
        if ids.shape != data.shape[:1]:
            raise _fail(args, op_type, inputs, "SEGMENT_IDS must be a vector as long as DATA's first dimension")
        return [None]  # the number of segments is the last id + 1, known only from the values
    return infer


def ids_to_lengths(xp, ids, op_type: str, args: Args):
    """Lengths of segments 0..last id from sorted SEGMENT_IDS (an error when unsorted).

    One host round trip reads the first and last id (the output's row count) and whether
    the ids are sorted; the lengths are differences of binary searches, on the device."""
    if ids.size == 0:
        return xp.zeros(0, dtype=xp.int64)
    ids = ids.astype(xp.int64, copy=False)
    unsorted = (ids[1:] < ids[:-1]).any().astype(xp.int64)
    first, last, bad = xp.stack([ids[0], ids[-1], unsorted]).tolist()
    if bad:
        raise ShapeError(f"op {args.op}: {op_type} SEGMENT_IDS must be sorted (non-decreasing)")
    if first < 0:
        raise ShapeError(f"op {args.op}: {op_type} SEGMENT_IDS has a negative id ({first})")
    ends = xp.searchsorted(ids, xp.arange(last + 1, dtype=xp.int64), side="right")
    return ends - xp.concatenate([xp.zeros(1, dtype=xp.int64), ends[:-1]])


def segment_max(xp, data, lengths):
    """Per-segment maximum of consecutive rows; 0 for an empty segment."""
    out = max_of_segments(xp, data.reshape(data.shape[0], prod(data.shape[1:])), lengths)
    return out.reshape((lengths.shape[0],) + data.shape[1:])


def segment_log_sum_exp(xp, data, lengths, mean: bool = False):
    """log(sum(exp(rows))) per segment, shifted by the segment max for stability
    (minus log(length) for LogMeanExp); 0 for an empty segment."""
    top = segment_max(xp, data, lengths)
    row_ids = segment_ids(xp, lengths, data.shape[0])
    shifted = xp.exp(data.astype(top.dtype) - xp.take(top, row_ids, axis=0))
    total = segment_reduce(xp, shifted, lengths)  # >= 1 where the segment has rows
    nonempty = (lengths > 0).reshape((-1,) + (1,) * (data.ndim - 1))
    out = xp.log(xp.where(nonempty, total, 1)) + top
    if mean:
        out = out - xp.log(xp.maximum(lengths, 1).astype(top.dtype)).reshape(nonempty.shape)
    return xp.where(nonempty, out, xp.zeros((), dtype=out.dtype))


REDUCTIONS = {
    "Sum": lambda xp, data, lengths: segment_reduce(xp, data, lengths),
    "Mean": lambda xp, data, lengths: segment_reduce(xp, data, lengths, mean=True),
    "Max": segment_max,
    "LogSumExp": segment_log_sum_exp,
    "LogMeanExp": lambda xp, data, lengths: segment_log_sum_exp(xp, data, lengths, mean=True),
}


def sorted_segment_kernel(op_type: str, reduction: str):
    def kernel(xp, inputs, args: Args) -> tuple:
        data, ids = inputs
        lengths = ids_to_lengths(xp, ids, op_type, args)
        return (REDUCTIONS[reduction](xp, data, lengths),)
    return kernel


def kernel_lengths_max(xp, inputs, args: Args) -> tuple:
    data, lengths = inputs
    _checked(xp, "LengthsMax", args, lengths, data.shape[0])
    return (segment_max(xp, data, lengths),)


# -- costs ------------------------------------------------------------------------------

def sparse_lengths_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType],
                        args: Args) -> OpFeatures:
    """Reads only the looked-up rows (not the table), the indices, lengths and weights;
    one add per looked-up element (a multiply-add with weights)."""
    data, indices = inputs[0], inputs[-2]
    row_elems = data.size // data.shape[0] if data.shape[0] else 0
    looked_up = indices.shape[0] * row_elems
    weighted = len(inputs) == 4
    side = sum(t.nbytes for t in inputs[1:])
    written = sum(t.nbytes for t in outputs)
    return OpFeatures(flops=float(looked_up * (2 if weighted else 1)),
                      bytes_read=float(looked_up * data.itemsize + side),
                      bytes_written=float(written))


def lengths_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType], args: Args) -> OpFeatures:
    data, lengths = inputs
    return OpFeatures(flops=float(data.size), bytes_read=float(data.nbytes + lengths.nbytes),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


def segment_ids_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(bytes_read=float(inputs[0].nbytes),
                      bytes_written=float(sum(t.nbytes for t in outputs)))


register(OpDef("SparseLengthsSum", infer_sparse_lengths("SparseLengthsSum"),
               sparse_lengths_kernel("SparseLengthsSum"), sparse_lengths_cost,
               min_inputs=3, max_inputs=3, launches=11,
               doc="(DATA, INDICES, LENGTHS) -> per-segment sum of the looked-up rows."))
register(OpDef("SparseLengthsMean", infer_sparse_lengths("SparseLengthsMean"),
               sparse_lengths_kernel("SparseLengthsMean", mean=True), sparse_lengths_cost,
               min_inputs=3, max_inputs=3, launches=14,
               doc="(DATA, INDICES, LENGTHS) -> per-segment mean (0 for an empty segment)."))
register(OpDef("SparseLengthsWeightedSum", infer_sparse_lengths_weighted,
               kernel_sparse_lengths_weighted, sparse_lengths_cost, min_inputs=4, max_inputs=4, launches=12,
               doc="(DATA, WEIGHTS, INDICES, LENGTHS) -> per-segment weighted sum."))
register(OpDef("LengthsSum", infer_lengths("LengthsSum"), lengths_kernel("LengthsSum"),
               lengths_cost, min_inputs=2, max_inputs=2, launches=8,
               doc="(DATA, LENGTHS) -> sums of consecutive row segments."))
register(OpDef("LengthsMean", infer_lengths("LengthsMean"), lengths_kernel("LengthsMean", mean=True),
               lengths_cost, min_inputs=2, max_inputs=2, launches=11,
               doc="(DATA, LENGTHS) -> means of consecutive row segments (0 when empty)."))
register(OpDef("LengthsToSegmentIds", infer_lengths_to_segment_ids, kernel_lengths_to_segment_ids,
               segment_ids_cost, devices=frozenset({"cpu"}), min_inputs=1, max_inputs=1,
               doc="LENGTHS -> int32 segment id of every position (length sum(LENGTHS), known "
                   "only when run). CPU only: Caffe2 had no CUDA kernel for it."))
register(OpDef("LengthsToRanges", infer_lengths_to_ranges, kernel_lengths_to_ranges, segment_ids_cost,
               devices=frozenset({"cpu"}), min_inputs=1, max_inputs=1,
               doc="LENGTHS -> int32 (offset, length) rows. CPU only, as in Caffe2."))
register(OpDef("LengthsMax", infer_lengths("LengthsMax"), kernel_lengths_max, lengths_cost,
               min_inputs=2, max_inputs=2, launches=11,
               doc="(DATA, LENGTHS) -> maxima of consecutive row segments (0 when empty)."))
# SortedSegment*: (DATA, SEGMENT_IDS sorted) -> one row per id 0..last; only the Range
# Mean and LogMeanExp variants had CUDA kernels in Caffe2 (their launch counts below).
_SORTED_SEGMENT_LAUNCHES = {"Mean": 20, "LogMeanExp": 42}
for _name, _reduction, _gpu in [
        ("SortedSegmentSum", "Sum", False), ("SortedSegmentMean", "Mean", False),
        ("SortedSegmentRangeSum", "Sum", False), ("SortedSegmentRangeMean", "Mean", True),
        ("SortedSegmentRangeMax", "Max", False), ("SortedSegmentRangeLogSumExp", "LogSumExp", False),
        ("SortedSegmentRangeLogMeanExp", "LogMeanExp", True)]:
    register(OpDef(_name, infer_sorted_segment(_name), sorted_segment_kernel(_name, _reduction),
                   lengths_cost, devices=frozenset({"cpu", "gpu"} if _gpu else {"cpu"}),
                   min_inputs=2, max_inputs=2, launches=_SORTED_SEGMENT_LAUNCHES.get(_reduction, 1),
                   doc=f"{_reduction} over the rows of each segment id (sorted ids; output rows = "
                       f"last id + 1, known only when run; empty ids give 0)."))
# Fused 8-bit rowwise tables: CPU only in Caffe2 (no CUDA kernels were registered).
for _name, _weighted, _mean in [("SparseLengthsSumFused8BitRowwise", False, False),
                                ("SparseLengthsWeightedSumFused8BitRowwise", True, False),
                                ("SparseLengthsMeanFused8BitRowwise", False, True)]:
    register(OpDef(_name, infer_fused_8bit(_name, _weighted), fused_8bit_kernel(_name, _weighted, _mean),
                   fused_8bit_cost, devices=frozenset({"cpu"}), min_inputs=4 if _weighted else 3,
                   max_inputs=4 if _weighted else 3,
                   doc="SparseLengths* over a uint8 table whose rows end in float32 scale and bias."))
