"""Gradient ops of the embedding family and the sparse ops train nets use around them.

What torch 1.8.1's ``AddGradientOperators`` writes:
- SparseLengthsSum / Mean (DATA, INDICES, LENGTHS) ->
  SparseLengthsIndicesInGradient{Sum,Mean}Gradient(dY, LENGTHS, INDICES) -> DATA_grad_values,
  one row per index (row j = dY of j's segment, divided by the segment's length for Mean);
  DATA's gradient is the GradientSlice (INDICES, DATA_grad_values).
- SparseLengthsWeightedSum (DATA, WEIGHTS, INDICES, LENGTHS) ->
  SparseLengthsIndicesInGradientWeightedSumGradient(WEIGHTS, dY, LENGTHS, INDICES): row j
  times WEIGHTS[j].
- LengthsSum / LengthsMean (DATA, LENGTHS) -> LengthsIndicesInGradient{Sum,Mean}Gradient(
  dY, LENGTHS, DATA) -> dDATA (the third input only gives the row count).
- Gather (DATA, INDICES): no op (GradientSlice(INDICES, dY)); with dense_gradient=1,
  SparseToDense(INDICES, dY, DATA) -> dDATA.
Ops around them: SparseToDense(indices, values[, like]) sums the value rows into a dense
tensor of like.shape[0] rows (else max index + 1, known only when run); Unique(indices) ->
(sorted distinct indices, int32 position of each index among them), as the CPU kernel
does; UnsortedSegmentSum(DATA, SEGMENT_IDS) -> per-id row sums (``num_segments`` rows, else
max id + 1); CopyOnDeviceLike(X, like) -> a copy of X (Copy's gradient);
LengthsPartition(LENGTHS, KEYS, X_1..) -> per partition p of K (outputs / inputs) the
per-segment counts of the keys k with k mod K = p, those keys (``pack_first_input``:
divided by K) and the matching rows of every X, outputs ordered by partition
(partition_ops.h; CPU only): how a table whose rows are split over devices routes its
lookups.

Sums by index go through ``placer/ops/segments.py`` (``sum_by_id``: a CSR product on numpy,
a scatter-add on cupy); each kernel reads the device back once at most (LENGTHS' sum and
minimum together; the smallest and largest index together). Costs: the
gradient expansions read dY, the lengths and the indices and write one row per index;
SparseToDense writes the whole dense output; Unique sorts (n log2 n compares). GPU
launches (``launches``) are counted on the strict cupy stand-in: the expansions' segment
search and host read take 7, a gather, and two more for a divide or a weight.
Devices: SparseLengthsIndicesInGradient*, LengthsIndicesInGradient*, SparseToDense
(sparse_to_dense_op.cu), Unique (unique_ops.cu) and CopyOnDeviceLike have CUDA kernels;
UnsortedSegmentSum is registered for the CPU only here (its CUDA kernel was not
confirmed in the 1.8.1 sources).
"""
from __future__ import annotations

from math import log2, prod

from placer.errors import InputError, ShapeError
from placer.ops.registry import OpDef, movement_cost, register
from placer.ops.segments import segment_ids, sum_by_id
from placer.types import Args, OpFeatures, TensorType, shape_str

INDEX_DTYPES = ("int32", "int64")
CPU_ONLY = frozenset({"cpu"})


def _fail(args: Args, inputs, what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {what} (inputs {shape_str(inputs)})")


def _index_vector(args: Args, t: TensorType, name: str, inputs) -> None:
    if t.ndim != 1 or t.dtype not in INDEX_DTYPES:
        raise _fail(args, inputs, f"{name} must be a 1-D int32/int64 vector, found {t}")


def segment_of_positions(xp, lengths, n: int, args: Args):
    """The segment of each of the n positions (LENGTHS must be >= 0 and sum to n; one host
    read of the sum and the minimum)."""
    total, smallest = 0, 0
    if lengths.size:
        total, smallest = xp.stack([lengths.sum(dtype=xp.int64), lengths.min().astype(xp.int64)]).tolist()
    if total != n or smallest < 0:
        raise InputError(f"op {args.op}: LENGTHS sum to {total} (or hold a negative length) but there "
                         f"are {n} indices")
    return segment_ids(xp, lengths, n)


# ---------------------------------------------------------------- lengths-reduction gradients
def _expand_infer(weighted: bool):
    def infer(inputs, args):
        if weighted:
            weights, dy, lengths, indices = inputs
        else:
            dy, lengths, indices = inputs
        _index_vector(args, lengths, "LENGTHS", inputs)
        if dy.ndim < 1 or dy.shape[0] != lengths.shape[0]:
            raise _fail(args, inputs, "dY needs one row per segment (LENGTHS)")
        if weighted and weights.shape != indices.shape[:1]:
            raise _fail(args, inputs, "WEIGHTS needs one value per index")
        return [TensorType(indices.shape[:1] + dy.shape[1:], dy.dtype)]
    return infer


def _expand_kernel(weighted: bool = False, mean: bool = False):
    def kernel(xp, inputs, args):
        if weighted:
            weights, dy, lengths, indices = inputs
        else:
            dy, lengths, indices = inputs
        segment = segment_of_positions(xp, lengths, indices.shape[0], args)
        rows = xp.take(dy, segment, axis=0)
        if mean:
            count = xp.maximum(lengths, 1).astype(dy.dtype)
            rows = rows / xp.take(count, segment).reshape((-1,) + (1,) * (dy.ndim - 1))
        if weighted:
            rows = rows * weights.astype(dy.dtype).reshape((-1,) + (1,) * (dy.ndim - 1))
        return (rows.astype(dy.dtype, copy=False),)
    return kernel


def _expand_cost(weighted: bool, scaled: bool):
    """Reads LENGTHS, INDICES (and WEIGHTS) and one dY row per index; writes one row per
    index; a Mean or WeightedSum gradient multiplies every value once."""
    dy_at = 1 if weighted else 0

    def cost(inputs, outputs, args) -> OpFeatures:
        out = outputs[0]
        side = sum(t.nbytes for i, t in enumerate(inputs) if i != dy_at)
        return OpFeatures(flops=float(out.size) if scaled else 0.0, bytes_read=float(side + out.nbytes),
                          bytes_written=float(out.nbytes))
    return cost


def _expand_launches(weighted: bool, mean: bool) -> int:
    """The LENGTHS read (sum and minimum: 4), the segment search (3), the dY gather; a
    divide by the segment's length or a multiply by the weight costs 4 or 2 more."""
    return 8 + (4 if mean else 0) + (2 if weighted else 0)


for _type, _weighted, _mean in (
        ("SparseLengthsIndicesInGradientSumGradient", False, False),
        ("SparseLengthsIndicesInGradientMeanGradient", False, True),
        ("SparseLengthsIndicesInGradientWeightedSumGradient", True, False),
        ("LengthsIndicesInGradientSumGradient", False, False),
        ("LengthsIndicesInGradientMeanGradient", False, True)):
    register(OpDef(_type, _expand_infer(_weighted), _expand_kernel(_weighted, _mean),
                   cost=_expand_cost(_weighted, _weighted or _mean),
                   min_inputs=4 if _weighted else 3, max_inputs=4 if _weighted else 3,
                   launches=_expand_launches(_weighted, _mean),
                   doc=("(WEIGHTS, dY, LENGTHS, INDICES)" if _weighted else "(dY, LENGTHS, INDICES)")
                   + " -> one gradient row per index: dY of its segment"
                   + (" / length" if _mean else "") + (" * weight" if _weighted else "")))


# ---------------------------------------------------------------- SparseToDense
def _checked_rows(xp, indices, rows: int | None, args: Args, what: str) -> int:
    """The output's row count (``rows``, or the largest index + 1 when None) after a range
    check of ``indices``: one host read of their smallest and largest value."""
    if not indices.size:
        return rows or 0
    lo, hi = xp.stack([indices.min(), indices.max()]).tolist()
    rows = hi + 1 if rows is None else rows
    if lo < 0 or hi >= rows:
        raise InputError(f"op {args.op}: {what} {lo if lo < 0 else hi} is out of range for {rows} rows")
    return rows


def _sum_rows(xp, values, ids, rows: int):
    """``values`` rows summed per id into (rows,) + values.shape[1:], in values' dtype."""
    flat = values.reshape(values.shape[0], prod(values.shape[1:]))  # no -1: no rows
    return sum_by_id(xp, flat, ids, rows).astype(values.dtype, copy=False).reshape((rows,) + values.shape[1:])


def _sparse_to_dense_infer(inputs, args):
    indices, values = inputs[:2]
    _index_vector(args, indices, "indices", inputs)
    if values.ndim < 1 or values.shape[0] != indices.shape[0]:
        raise _fail(args, inputs, "values need one row per index")
    if len(inputs) == 2:
        return [None]          # max index + 1 rows: known only from the values
    return [TensorType(inputs[2].shape[:1] + values.shape[1:], values.dtype)]


def _sparse_to_dense_kernel(xp, inputs, args):
    indices, values = inputs[:2]
    if values.dtype.kind != "f":
        raise InputError(f"op {args.op}: SparseToDense values of dtype {values.dtype} are not supported")
    flat = indices.reshape(-1)
    rows = _checked_rows(xp, flat, inputs[2].shape[0] if len(inputs) > 2 else None, args, "index")
    return (_sum_rows(xp, values, flat, rows),)


def _sparse_to_dense_cost(inputs, outputs, args) -> OpFeatures:
    values = inputs[1]
    written = float(outputs[0].nbytes) if outputs else float(values.nbytes)
    return OpFeatures(flops=float(values.size), bytes_read=float(inputs[0].nbytes + values.nbytes),
                      bytes_written=written)


register(OpDef("SparseToDense", _sparse_to_dense_infer, _sparse_to_dense_kernel, cost=_sparse_to_dense_cost,
               min_inputs=2, max_inputs=3, launches=5,      # the range read (3), the zeroed rows, the scatter-add
               doc="(indices, values[, like]) -> dense rows summed per index (like.shape[0] rows)"))


# ---------------------------------------------------------------- Unique
def _unique_infer(inputs, args):
    _index_vector(args, inputs[0], "indices", inputs)
    return [None, TensorType(inputs[0].shape, "int32")]   # the distinct count is value-dependent


def _unique_kernel(xp, inputs, args):
    unique, inverse = xp.unique(inputs[0], return_inverse=True)
    return unique.astype(inputs[0].dtype, copy=False), inverse.reshape(-1).astype(xp.int32)


def _unique_cost(inputs, outputs, args) -> OpFeatures:
    n = inputs[0].size
    return OpFeatures(flops=float(n * max(log2(n), 1.0)) if n else 0.0, bytes_read=float(inputs[0].nbytes),
                      bytes_written=float(inputs[0].nbytes + 4 * n))


register(OpDef("Unique", _unique_infer, _unique_kernel, cost=_unique_cost, min_inputs=1, max_inputs=1, launches=2,
               doc="indices -> (sorted distinct indices, int32 remapping into them)"))


# ---------------------------------------------------------------- UnsortedSegmentSum
def _uss_infer(inputs, args):
    data, ids = inputs
    if ids.ndim != 1 or ids.dtype not in INDEX_DTYPES or data.ndim < 1 or data.shape[0] != ids.shape[0]:
        raise _fail(args, inputs, "SEGMENT_IDS must be an int vector as long as DATA's first dimension")
    if "num_segments" not in args:
        return [None]          # max id + 1 rows: known only from the values
    return [TensorType((args.int("num_segments"),) + data.shape[1:], data.dtype)]


def _uss_kernel(xp, inputs, args):
    data, ids = inputs
    rows = _checked_rows(xp, ids, args.int("num_segments") if "num_segments" in args else None, args,
                         "segment id")
    return (_sum_rows(xp, data, ids, rows),)


register(OpDef("UnsortedSegmentSum", _uss_infer, _uss_kernel, cost=_sparse_to_dense_cost, devices=CPU_ONLY,
               min_inputs=2, max_inputs=2,
               doc="(DATA, SEGMENT_IDS) -> row sums per id (num_segments rows, else max id + 1)"))


# ---------------------------------------------------------------- LengthsPartition
def _lengths_partition_infer(inputs, args):
    lengths, keys = inputs[:2]
    _index_vector(args, keys, "KEYS", inputs)
    if lengths.ndim != 1 or lengths.dtype != "int32":
        raise _fail(args, inputs, "LENGTHS must be a 1-D int32 vector")
    if any(t.ndim < 1 or t.shape[0] != keys.shape[0] for t in inputs[2:]):
        raise _fail(args, inputs, "every input after KEYS needs one row per key")
    n_out = args.n_outputs or len(inputs)
    if n_out % len(inputs):
        raise _fail(args, inputs, f"{n_out} outputs are no whole number of partitions of {len(inputs)} inputs")
    # the rows of each partition depend on the keys' values: only the lengths are typed
    return ([TensorType(lengths.shape, "int32")] + [None] * (len(inputs) - 1)) * (n_out // len(inputs))


def _lengths_partition_kernel(xp, inputs, args):
    lengths, keys = inputs[:2]
    parts = args.n_outputs // len(inputs)
    segment = segment_of_positions(xp, lengths, keys.shape[0], args)
    shard = keys % parts                       # Caffe2's moduloPartition: ((k % K) + K) % K
    out = []
    for p in range(parts):
        mine = shard == p
        counts = xp.bincount(segment[mine], minlength=lengths.shape[0]).astype(xp.int32)
        first = keys[mine] // parts if args.bool("pack_first_input", False) else keys[mine]
        out += [counts, first] + [x[mine] for x in inputs[2:]]
    return tuple(out)


def _lengths_partition_cost(inputs, outputs, args) -> OpFeatures:
    n_bytes = float(sum(t.nbytes for t in inputs))
    return OpFeatures(flops=float(inputs[1].size), bytes_read=n_bytes, bytes_written=n_bytes)


register(OpDef("LengthsPartition", _lengths_partition_infer, _lengths_partition_kernel,
               cost=_lengths_partition_cost, devices=CPU_ONLY, min_inputs=2,
               doc="(LENGTHS, KEYS, X..) -> per partition p (outputs / inputs of them): its lengths, keys "
                   "and rows of each X, for the keys with key mod partitions = p"))


# ---------------------------------------------------------------- CopyOnDeviceLike
register(OpDef("CopyOnDeviceLike", lambda i, a: [i[0]], lambda xp, i, a: (i[0].copy(),),
               cost=lambda i, o, a: movement_cost(i[:1], o, a), min_inputs=2, max_inputs=2,
               doc="(X, like) -> a copy of X on like's device (the gradient of Copy)"))
