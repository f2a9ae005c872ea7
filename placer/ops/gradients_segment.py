"""Gradient ops of the segment reductions over sorted segment ids and lengths.

What torch 1.8.1's ``AddGradientOperators`` writes (forward op -> gradient op):
- SortedSegmentSum / Mean (DATA, SEGMENT_IDS) -> SortedSegment{Sum,Mean}Gradient(dY,
  SEGMENT_IDS) -> dDATA: row i gets dY[id_i] (divided by the segment's size for Mean).
- SortedSegmentRange{Sum,Mean,Max,LogSumExp,LogMeanExp} (DATA, SEGMENT_IDS) ->
  SortedSegmentRange*Gradient(DATA, Y, dY, SEGMENT_IDS) -> dDATA: row i gets
  dY[id_i] times 1 (Sum), 1/size (Mean), [DATA_i == Y[id_i]] (Max), exp(DATA_i - Y[id_i])
  (LogSumExp) or exp(DATA_i - Y[id_i]) / size (LogMeanExp).
- LengthsMax (DATA, LENGTHS) -> LengthsMaxWithMainInputAndForwardOutputGradient(Y, dY,
  LENGTHS, DATA) -> dDATA: row i gets dY of its segment where DATA_i equals the max.
Kernels gather per-row values with ``take`` (no scatter: every row has one segment); a
segment's size is the run length of its id among the sorted ids (two binary searches, no
``bincount``, which reads the device back on cupy). One host read per kernel checks that
the ids are sorted and lie in 0..segments-1, as Caffe2's kernels assume.
Costs: one or two flops per element of dDATA; dDATA written once, the inputs read once.
GPU launches (counted on the strict cupy stand-in): the ids' check and read (7), the segment
sizes (4), the dY gather and the divide; LogMeanExp's Y gather, exp and product add 4.
Devices: as their forward ops in placer/ops/embedding.py (Caffe2 had CUDA kernels for the
SortedSegmentRange Mean and LogMeanExp gradients only; LengthsMax's gradient is CPU only
here, like the other lengths-max ops whose CUDA support was not confirmed).
"""
from __future__ import annotations

from placer.errors import InputError
from placer.ops.elementwise import shape_error
from placer.ops.gradients_sparse import segment_of_positions
from placer.ops.registry import OpDef, io_bytes, register
from placer.ops.segments import id_counts
from placer.types import OpFeatures, TensorType

CPU_ONLY = frozenset({"cpu"})


def _cost(inputs, outputs, args) -> OpFeatures:
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(2 * outputs[0].size), bytes_read=read, bytes_written=written)


def _row_sizes(xp, flat, dtype):
    """The size of each row's segment (sorted ids: the run length of its id)."""
    return id_counts(xp, flat, presorted=True).astype(dtype)


def _ids(xp, ids, n_segments: int, args):
    """Flat int64 ids, checked sorted and within 0..n_segments-1 (one host read)."""
    flat = ids.reshape(-1).astype(xp.int64)
    if flat.size:
        unsorted = (flat[1:] < flat[:-1]).any().astype(xp.int64)
        first, last, bad = xp.stack([flat[0], flat[-1], unsorted]).tolist()
        if bad:
            raise InputError(f"op {args.op}: SEGMENT_IDS must be sorted (non-decreasing)")
        if first < 0 or last >= n_segments:
            raise InputError(f"op {args.op}: segment ids must lie in 0..{n_segments - 1}")
    return flat


def _broadcast_rows(v, ndim: int):
    return v.reshape((-1,) + (1,) * (ndim - 1))


# ---------------------------------------------------------------- SortedSegment{Sum,Mean}
def _sorted_grad_infer(inputs, args):
    dy, ids = inputs
    if ids.ndim != 1 or dy.ndim < 1:
        raise shape_error(args, "SEGMENT_IDS must be a vector and dY have a segment dimension",
                          (0, "dY", dy), (1, "SEGMENT_IDS", ids))
    return [TensorType(ids.shape + dy.shape[1:], dy.dtype)]


def _sorted_grad_kernel(mean: bool):
    def kernel(xp, inputs, args):
        dy, ids = inputs
        flat = _ids(xp, ids, dy.shape[0], args)
        rows = xp.take(dy, flat, axis=0)
        if mean:
            rows = rows / _broadcast_rows(_row_sizes(xp, flat, dy.dtype), dy.ndim)
        return (rows.astype(dy.dtype, copy=False),)
    return kernel


for _name, _mean in (("SortedSegmentSumGradient", False), ("SortedSegmentMeanGradient", True)):
    register(OpDef(_name, _sorted_grad_infer, _sorted_grad_kernel(_mean), cost=_cost, devices=CPU_ONLY,
                   min_inputs=2, max_inputs=2, doc="(dY, SEGMENT_IDS) -> dDATA: dY of each row's segment"
                   + (" / segment size" if _mean else "")))


# ---------------------------------------------------------------- SortedSegmentRange*
def _range_grad_infer(inputs, args):
    data, y, dy, ids = inputs
    if y.shape != dy.shape or ids.shape != data.shape[:1] or y.shape[1:] != data.shape[1:]:
        raise shape_error(args, "Y and dY must be (segments,) + DATA's row shape and SEGMENT_IDS one per row",
                          (0, "DATA", data), (1, "Y", y), (2, "dY", dy), (3, "SEGMENT_IDS", ids))
    return [TensorType(data.shape, dy.dtype)]


def _range_grad_kernel(reduction: str):
    def kernel(xp, inputs, args):
        data, y, dy, ids = inputs
        flat = _ids(xp, ids, dy.shape[0], args)
        g = xp.take(dy, flat, axis=0)
        if reduction == "Sum":
            return (g.astype(dy.dtype, copy=True),)
        sizes = _broadcast_rows(_row_sizes(xp, flat, dy.dtype), data.ndim)
        if reduction == "Mean":
            return ((g / sizes).astype(dy.dtype, copy=False),)
        top = xp.take(y, flat, axis=0)
        if reduction == "Max":
            return ((g * (data == top)).astype(dy.dtype, copy=False),)
        share = g * xp.exp(data - top)
        if reduction == "LogMeanExp":
            share = share / sizes
        return (share.astype(dy.dtype, copy=False),)
    return kernel


for _reduction, _gpu in (("Sum", False), ("Mean", True), ("Max", False), ("LogSumExp", False),
                         ("LogMeanExp", True)):
    register(OpDef(f"SortedSegmentRange{_reduction}Gradient", _range_grad_infer, _range_grad_kernel(_reduction),
                   cost=_cost, devices=frozenset({"cpu", "gpu"}) if _gpu else CPU_ONLY, min_inputs=4, max_inputs=4,
                   launches={"Mean": 13, "LogMeanExp": 17}.get(_reduction, 1),
                   doc=f"(DATA, Y, dY, SEGMENT_IDS) -> dDATA of SortedSegmentRange{_reduction}"))


# ---------------------------------------------------------------- LengthsMax
def _lengths_max_grad_infer(inputs, args):
    y, dy, lengths, data = inputs
    if y.shape != dy.shape or y.shape[:1] != lengths.shape or y.shape[1:] != data.shape[1:]:
        raise shape_error(args, "Y and dY need one row per segment, shaped like DATA's rows",
                          (0, "Y", y), (1, "dY", dy), (2, "LENGTHS", lengths), (3, "DATA", data))
    return [TensorType(data.shape, dy.dtype)]


def _lengths_max_grad_kernel(xp, inputs, args):
    y, dy, lengths, data = inputs
    seg = segment_of_positions(xp, lengths, data.shape[0], args)
    g = xp.take(dy, seg, axis=0) * (data == xp.take(y, seg, axis=0))
    return (g.astype(dy.dtype, copy=False),)


register(OpDef("LengthsMaxWithMainInputAndForwardOutputGradient", _lengths_max_grad_infer,
               _lengths_max_grad_kernel, cost=_cost, devices=CPU_ONLY, min_inputs=4, max_inputs=4,
               doc="(Y, dY, LENGTHS, DATA) -> dDATA of LengthsMax: dY where DATA equals its segment's max"))
