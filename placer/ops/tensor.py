"""Op family 'tensor': ops that move or re-view data without arithmetic.

Concat, Split, Reshape, Flatten, FlattenToVec, ResizeLike, Transpose, Squeeze, ExpandDims,
Slice, Gather, BatchGather, ChannelShuffle, Shape, Size, Tile — with Caffe2's semantics.

Conventions of this family:
- An output whose shape depends on the *values* of an input tensor (Reshape's shape
  blob, Split's split blob, Slice's starts/ends blobs, Tile's tiles blob) is returned as
  None by ``infer``: ``shapes.infer`` records it as unknown and the user can give it with
  ``--input``. Such blobs are rare and usually small constants. The exception: values
  that inference itself knows from shapes (``TensorType.values``: Concat's split_info,
  Reshape's old shape), which is what the gradients of Concat (a Split reading
  split_info) and of Reshape (a Reshape reading the old shape) take their sizes from.
- Kernels return fresh arrays, never views of their inputs: Caffe2 copies when an op is
  not in place, and a later in-place op on the input must not change this op's output.
- Gathers check their indices: an index out of range is an error naming the op
  (numpy would raise an IndexError without the op, cupy would read out of bounds).
"""
from __future__ import annotations

from math import prod
from typing import Sequence

from placer.errors import ArgumentError, ShapeError
from placer.ops.registry import OpDef, movement_cost, register
from placer.types import Args, OpFeatures, TensorType, shape_str

INDEX_DTYPES = ("int32", "int64")


def _fail(args: Args, op_type: str, inputs: Sequence[TensorType], what: str) -> ShapeError:
    return ShapeError(f"op {args.op}: {op_type} on inputs ({shape_str(inputs)}): {what}")


def canonical_axis(axis: int, ndim: int, args: Args, op_type: str,
                   inputs: Sequence[TensorType]) -> int:
    """``axis`` in [0, ndim) (negative counts from the end), or a ShapeError."""
    if not -ndim <= axis < ndim:
        raise _fail(args, op_type, inputs, f"axis {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def order_axis(args: Args, op_type: str) -> tuple[int, bool]:
    """Concat/Split axis: the ``axis`` argument (with ``add_axis``), else from ``order``.

    Caffe2 refuses both at once; ``add_axis`` is only read together with ``axis``.
    """
    if "axis" in args and "order" in args:
        raise ArgumentError(f"op {args.op}: {op_type} takes 'axis' or 'order', not both")
    if "axis" in args:
        return args.int("axis"), args.bool("add_axis", False)
    order = args.str("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise ArgumentError(f"op {args.op}: {op_type} order should be NCHW or NHWC, found {order!r}")
    return (1 if order == "NCHW" else 3), False


def _host_list(x) -> list:
    """A small index tensor's values on the host (numpy or cupy array)."""
    return [int(v) for v in x.reshape(-1).tolist()]


# -- Concat / Split ---------------------------------------------------------------------

def infer_concat(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    axis, add_axis = order_axis(args, "Concat")
    first = inputs[0]
    if any(t.ndim != first.ndim for t in inputs):
        raise _fail(args, "Concat", inputs, "inputs differ in number of dimensions")
    if any(t.dtype != first.dtype for t in inputs):
        raise _fail(args, "Concat", inputs,
                    f"inputs differ in dtype ({', '.join(t.dtype for t in inputs)})")
    ax = canonical_axis(axis, first.ndim + add_axis, args, "Concat", inputs)
    if add_axis:
        if any(t.shape != first.shape for t in inputs):
            raise _fail(args, "Concat", inputs, "add_axis=1 needs inputs of equal shapes")
        shape = first.shape[:ax] + (len(inputs),) + first.shape[ax:]
    else:
        off = [t.shape[:ax] + t.shape[ax + 1:] for t in inputs]
        if any(o != off[0] for o in off):
            raise _fail(args, "Concat", inputs, f"inputs differ off axis {ax}")
        shape = first.shape[:ax] + (sum(t.shape[ax] for t in inputs),) + first.shape[ax + 1:]
    sizes = [1] * len(inputs) if add_axis else [t.shape[ax] for t in inputs]
    return [TensorType(shape, first.dtype), TensorType((len(inputs),), "int32", values=sizes)]


def kernel_concat(xp, inputs, args: Args) -> tuple:
    axis, add_axis = order_axis(args, "Concat")
    ax = axis % (inputs[0].ndim + add_axis)
    if add_axis:
        out = xp.stack(list(inputs), axis=ax)
        sizes = [1] * len(inputs)
    else:
        out = xp.concatenate(list(inputs), axis=ax)
        sizes = [x.shape[ax] for x in inputs]
    return out, xp.asarray(sizes, dtype=xp.int32)


def _split_sizes(dim: int, n_inputs: int, args: Args, inputs) -> list[int] | None:
    """Sizes along the axis, or None when they come from a tensor (or the count is unknown)."""
    split = args.ints("split", [])
    if n_inputs == 2:
        if split:
            raise ArgumentError(f"op {args.op}: Split takes 'split' as an argument or as an input, not both")
        known = inputs[1].values if len(inputs) == 2 else None
        return list(known) if known is not None else None
    if split:
        return split
    n = args.n_outputs
    if not n:
        return None
    if dim % n:
        raise _fail(args, "Split", inputs, f"dimension {dim} does not divide into {n} equal outputs")
    return [dim // n] * n


def infer_split(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    axis, add_axis = order_axis(args, "Split")
    x = inputs[0]
    ax = canonical_axis(axis, x.ndim, args, "Split", inputs)
    sizes = _split_sizes(x.shape[ax], len(inputs), args, inputs)
    if sizes is None:
        return []  # sizes come from a tensor's values, or the output count is unknown
    if args.n_outputs and len(sizes) != args.n_outputs:
        raise _fail(args, "Split", inputs, f"{len(sizes)} split sizes for {args.n_outputs} outputs")
    if add_axis:
        if any(s != 1 for s in sizes) or len(sizes) != x.shape[ax]:
            raise _fail(args, "Split", inputs, f"add_axis=1 needs {x.shape[ax]} outputs of size 1")
        return [TensorType(x.shape[:ax] + x.shape[ax + 1:], x.dtype) for _ in sizes]
    if sum(sizes) != x.shape[ax]:
        raise _fail(args, "Split", inputs, f"split sizes {sizes} do not sum to dimension {x.shape[ax]}")
    return [TensorType(x.shape[:ax] + (s,) + x.shape[ax + 1:], x.dtype) for s in sizes]


def kernel_split(xp, inputs, args: Args) -> tuple:
    axis, add_axis = order_axis(args, "Split")
    x = inputs[0]
    ax = axis % x.ndim
    sizes = _host_list(inputs[1]) if len(inputs) == 2 else _split_sizes(x.shape[ax], 1, args, [])
    if sizes is None:
        raise ArgumentError(f"op {args.op}: Split without 'split' needs the number of outputs",
                            hint="give the split argument")
    if sum(sizes) != x.shape[ax]:
        raise ShapeError(f"op {args.op}: Split sizes {sizes} do not sum to dimension {x.shape[ax]}")
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        index = (slice(None),) * ax + (slice(lo, hi),)
        part = x[index]
        outs.append(part.squeeze(ax).copy() if add_axis else part.copy())
    return tuple(outs)


# -- Reshape family -----------------------------------------------------------------------

def reshaped(old: tuple[int, ...], new: Sequence[int], args: Args, inputs) -> tuple[int, ...]:
    """Caffe2's Reshape rule: 0 copies the input dimension, one -1 is inferred."""
    shape = [old[i] if d == 0 and i < len(old) else d for i, d in enumerate(new)]
    if shape.count(-1) > 1:
        raise _fail(args, "Reshape", inputs, f"shape {list(new)} has more than one -1")
    if any(d < -1 for d in shape):
        raise _fail(args, "Reshape", inputs, f"shape {list(new)} has a negative dimension")
    size = prod(old)
    known = prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or size % known:
            raise _fail(args, "Reshape", inputs, f"cannot infer the -1 of shape {list(new)} "
                                                 f"from {size} elements")
        shape[shape.index(-1)] = size // known
    elif known != size:
        raise _fail(args, "Reshape", inputs, f"shape {list(new)} has {known} elements, input has {size}")
    return tuple(shape)


def infer_reshape(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    x = inputs[0]
    if len(inputs) == 2:
        if "shape" in args:
            raise ArgumentError(f"op {args.op}: Reshape takes the shape as an argument or as an "
                                f"input, not both")
        if inputs[1].dtype not in INDEX_DTYPES or inputs[1].ndim != 1:
            raise _fail(args, "Reshape", inputs, "the shape input must be a 1-D int32/int64 tensor")
        old_shape = TensorType((x.ndim,), inputs[1].dtype, values=x.shape)
        if inputs[1].values is None:
            return [None, old_shape]  # the new shape is in the blob's values
        return [TensorType(reshaped(x.shape, inputs[1].values, args, inputs), x.dtype), old_shape]
    new = args.ints("shape")
    return [TensorType(reshaped(x.shape, new, args, inputs), x.dtype),
            TensorType((x.ndim,), "int64", values=x.shape)]


def kernel_reshape(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    if len(inputs) == 2:
        new, dtype = _host_list(inputs[1]), inputs[1].dtype
    else:
        new, dtype = args.ints("shape"), xp.int64
    shape = reshaped(tuple(x.shape), new, args, [TensorType(x.shape, str(x.dtype))])
    return x.reshape(shape).copy(), xp.asarray(x.shape, dtype=dtype)


def infer_flatten(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    x, axis = inputs[0], args.int("axis", 1)
    if not 0 <= axis <= x.ndim:
        raise _fail(args, "Flatten", inputs, f"axis {axis} is out of range for {x.ndim} dimensions")
    return [TensorType((prod(x.shape[:axis]), prod(x.shape[axis:])), x.dtype)]


def kernel_flatten(xp, inputs, args: Args) -> tuple:
    x, axis = inputs[0], args.int("axis", 1)
    return (x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:])).copy(),)


def infer_flatten_to_vec(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    if inputs[0].ndim < 1:
        raise _fail(args, "FlattenToVec", inputs, "the input must have at least 1 dimension")
    return [TensorType((inputs[0].size,), inputs[0].dtype)]


def kernel_flatten_to_vec(xp, inputs, args: Args) -> tuple:
    return (inputs[0].reshape(-1).copy(),)


def _transpose_axes(ndim: int, args: Args, inputs) -> list[int]:
    axes = args.ints("axes", []) or list(range(ndim))[::-1]
    if len(axes) != ndim or sorted(a % ndim for a in axes) != list(range(ndim)):
        raise _fail(args, "Transpose", inputs, f"axes {axes} are not a permutation of {ndim} dimensions")
    return [a % ndim for a in axes]


def infer_transpose(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    x = inputs[0]
    axes = _transpose_axes(x.ndim, args, inputs)
    return [TensorType(tuple(x.shape[a] for a in axes), x.dtype)]


def kernel_transpose(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    return (x.transpose(_transpose_axes(x.ndim, args, ())).copy(),)  # C order, never a view


def _dims(args: Args, op_type: str) -> list[int]:
    dims = sorted(set(args.ints("dims", [])))
    if dims and dims[0] < 0:
        raise ArgumentError(f"op {args.op}: {op_type} dims must be non-negative, found {dims}")
    return dims


def squeezed(shape: tuple[int, ...], args: Args, inputs) -> tuple[int, ...]:
    dims = _dims(args, "Squeeze")
    for d in dims:
        if d >= len(shape):
            raise _fail(args, "Squeeze", inputs, f"dimension {d} is beyond {len(shape)} dimensions")
        if shape[d] != 1:
            raise _fail(args, "Squeeze", inputs, f"dimension {d} has size {shape[d]}, not 1")
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def expanded(shape: tuple[int, ...], args: Args, inputs) -> tuple[int, ...]:
    out = list(shape)
    for d in _dims(args, "ExpandDims"):
        if d > len(out):
            raise _fail(args, "ExpandDims", inputs, f"dimension {d} is beyond {len(out)} dimensions")
        out.insert(d, 1)
    return tuple(out)


def infer_squeeze(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    return [TensorType(squeezed(inputs[0].shape, args, inputs), inputs[0].dtype)]


def kernel_squeeze(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    return (x.reshape(squeezed(tuple(x.shape), args, ())).copy(),)


def infer_expand_dims(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    return [TensorType(expanded(inputs[0].shape, args, inputs), inputs[0].dtype)]


def kernel_expand_dims(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    return (x.reshape(expanded(tuple(x.shape), args, ())).copy(),)


def infer_resize_like(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    x, like = inputs
    if x.size != like.size:
        raise _fail(args, "ResizeLike", inputs, f"{x.size} elements cannot take the shape of {like.size}")
    return [TensorType(like.shape, x.dtype)]


def kernel_resize_like(xp, inputs, args: Args) -> tuple:
    return (inputs[0].reshape(inputs[1].shape).copy(),)


# -- Slice ----------------------------------------------------------------------------------

def slice_bounds(shape: tuple[int, ...], starts: list[int], ends: list[int], args: Args,
                 inputs) -> list[tuple[int, int]]:
    """Caffe2's Slice rule: a negative bound b means dim + 1 + b (so end -1 = to the end);
    bounds are clipped to the dimension; only one dimension may actually be sliced."""
    if len(starts) != len(ends) or len(starts) > len(shape):
        raise _fail(args, "Slice", inputs, f"starts {starts} and ends {ends} do not fit "
                                           f"{len(shape)} dimensions")
    bounds = []
    for i, dim in enumerate(shape):
        if i >= len(starts) or dim == 0:
            bounds.append((0, dim))
            continue
        lo, hi = (min(b + dim + 1 if b < 0 else b, dim) for b in (starts[i], ends[i]))
        if lo < 0 or hi < lo:
            raise _fail(args, "Slice", inputs, f"dimension {i}: start {starts[i]}, end {ends[i]} "
                                               f"give an empty or negative range of {dim}")
        bounds.append((lo, hi))
    sliced = [i for i, (lo, hi) in enumerate(bounds) if lo > 0 or hi < shape[i]]
    if len(sliced) > 1:
        raise _fail(args, "Slice", inputs, f"slices dimensions {sliced}; Caffe2's Slice slices "
                                           f"only one dimension (use one Slice per dimension)")
    return bounds


def infer_slice(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    if len(inputs) == 3:
        return [None]  # the bounds are in the values of the starts/ends blobs
    x = inputs[0]
    bounds = slice_bounds(x.shape, args.ints("starts"), args.ints("ends"), args, inputs)
    return [TensorType(tuple(hi - lo for lo, hi in bounds), x.dtype)]


def kernel_slice(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    if len(inputs) == 3:   # one host read for both bound vectors
        bounds = _host_list(xp.concatenate([inputs[1].reshape(-1), inputs[2].reshape(-1)]))
        starts, ends = bounds[:inputs[1].size], bounds[inputs[1].size:]
    else:
        starts, ends = args.ints("starts"), args.ints("ends")
    bounds = slice_bounds(tuple(x.shape), starts, ends, args, [TensorType(x.shape, str(x.dtype))])
    return (x[tuple(slice(lo, hi) for lo, hi in bounds)].copy(),)


# -- Gathers --------------------------------------------------------------------------------

def _check_indices(t: TensorType, args: Args, op_type: str, inputs) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise _fail(args, op_type, inputs, f"indices must be int32 or int64, found {t.dtype}")


def checked_indices(xp, indices, dim: int, args: Args, op_type: str, wrap: bool = False):
    """``indices`` after a range check against ``dim`` (one host read of min and max).

    With ``wrap`` a negative index counts from the end once (Caffe2's wrap_indices), so
    the valid range is [-dim, dim)."""
    if indices.size == 0:
        return indices
    lo, hi = xp.stack([indices.min(), indices.max()]).tolist()
    if lo < (-dim if wrap else 0) or hi >= dim:
        bad = hi if hi >= dim else lo
        raise ShapeError(f"op {args.op}: {op_type} index {bad} is out of range for a dimension of "
                         f"size {dim}")
    if wrap and lo < 0:
        indices = xp.where(indices < 0, indices + dim, indices)
    return indices


def _gather_checks(inputs: Sequence[TensorType], args: Args, op_type: str, min_ndim: int) -> None:
    data, idx = inputs
    _check_indices(idx, args, op_type, inputs)
    if args.bool("match_outer", False):
        raise ArgumentError(f"op {args.op}: {op_type} with match_outer=1 is not supported")
    if data.ndim < min_ndim:
        raise _fail(args, op_type, inputs,
                    f"DATA must have at least {min_ndim} dimension{'s' if min_ndim > 1 else ''}")


def infer_gather(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    data, idx = inputs
    _gather_checks(inputs, args, "Gather", 1)
    ax = canonical_axis(args.int("axis", 0), data.ndim, args, "Gather", inputs)
    return [TensorType(data.shape[:ax] + idx.shape + data.shape[ax + 1:], data.dtype)]


def kernel_gather(xp, inputs, args: Args) -> tuple:
    data, idx = inputs
    ax = args.int("axis", 0) % data.ndim
    idx = checked_indices(xp, idx, data.shape[ax], args, "Gather", args.bool("wrap_indices", False))
    return (xp.take(data, idx, axis=ax),)


def infer_batch_gather(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    data, idx = inputs
    _gather_checks(inputs, args, "BatchGather", 2)
    return [TensorType(data.shape[:1] + idx.shape + data.shape[2:], data.dtype)]


def kernel_batch_gather(xp, inputs, args: Args) -> tuple:
    data, idx = inputs
    idx = checked_indices(xp, idx, data.shape[1], args, "BatchGather")
    return (xp.take(data, idx, axis=1),)


def gather_cost(inputs: Sequence[TensorType], outputs: Sequence[TensorType], args: Args) -> OpFeatures:
    """A gather reads the rows it picks (as many bytes as it writes) and the indices."""
    out = outputs[0].nbytes if outputs else 0
    return OpFeatures(bytes_read=float(out + inputs[1].nbytes), bytes_written=float(out))


# -- ChannelShuffle, Shape, Size, Tile -----------------------------------------------------

def _shuffle_layout(x_shape, args: Args, inputs) -> tuple[int, int]:
    """(channel axis, group) after checking that the channels divide into groups."""
    order, group = args.str("order", "NCHW"), args.int("group", 1)
    if order not in ("NCHW", "NHWC") or len(x_shape) < 2:
        raise _fail(args, "ChannelShuffle", inputs, f"needs an NCHW/NHWC input of 2+ dimensions "
                                                    f"(order {order!r})")
    ax = 1 if order == "NCHW" else len(x_shape) - 1
    if group < 1 or x_shape[ax] % group:
        raise _fail(args, "ChannelShuffle", inputs, f"{x_shape[ax]} channels do not divide into "
                                                    f"{group} groups")
    return ax, group


def infer_channel_shuffle(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    _shuffle_layout(inputs[0].shape, args, inputs)
    return [inputs[0]]


def kernel_channel_shuffle(xp, inputs, args: Args) -> tuple:
    """Channel c = g*K + k moves to k*G + g: a (G, K) -> (K, G) transpose of the channels."""
    x = inputs[0]
    ax, group = _shuffle_layout(tuple(x.shape), args, ())
    outer, inner = prod(x.shape[:ax]), prod(x.shape[ax + 1:])
    y = x.reshape(outer, group, x.shape[ax] // group, inner).transpose(0, 2, 1, 3)
    return (y.copy().reshape(x.shape),)


def infer_shape(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    axes = args.ints("axes", [])
    for a in axes:
        canonical_axis(a, inputs[0].ndim, args, "Shape", inputs)
    return [TensorType((len(axes) if axes else inputs[0].ndim,), "int64")]


def kernel_shape(xp, inputs, args: Args) -> tuple:
    shape = inputs[0].shape
    axes = args.ints("axes", [])
    return (xp.asarray([shape[a] for a in axes] if axes else list(shape), dtype=xp.int64),)


def infer_size(inputs: Sequence[TensorType], args: Args) -> list[TensorType]:
    return [TensorType((), "int64")]


def kernel_size(xp, inputs, args: Args) -> tuple:
    return (xp.asarray(inputs[0].size, dtype=xp.int64),)


def shape_only_cost(inputs, outputs, args) -> OpFeatures:
    """Shape/Size read only metadata."""
    return OpFeatures(bytes_written=float(sum(t.nbytes for t in outputs)))


def _tile_reps(ndim: int, tiles: int, axis: int, args: Args, inputs) -> tuple[int, ...]:
    ax = canonical_axis(axis, ndim, args, "Tile", inputs)
    if tiles < 0:
        raise _fail(args, "Tile", inputs, f"tiles {tiles} is negative")
    return tuple(tiles if i == ax else 1 for i in range(ndim))


def infer_tile(inputs: Sequence[TensorType], args: Args) -> list[TensorType | None]:
    if len(inputs) > 1:
        return [None]  # tiles (and axis) are in the values of the extra inputs
    x = inputs[0]
    reps = _tile_reps(x.ndim, args.int("tiles", 1), args.int("axis", 0), args, inputs)
    return [TensorType(tuple(d * r for d, r in zip(x.shape, reps)), x.dtype)]


def kernel_tile(xp, inputs, args: Args) -> tuple:
    x = inputs[0]
    given = _host_list(xp.concatenate([t.reshape(-1)[:1] for t in inputs[1:]])) if len(inputs) > 1 else []
    tiles = given[0] if given else args.int("tiles", 1)            # one host read for both
    axis = given[1] if len(given) > 1 else args.int("axis", 0)
    return (xp.tile(x, _tile_reps(x.ndim, tiles, axis, args, ())),)


def whole_input_cost(inputs, outputs, args) -> OpFeatures:
    """Reshape and Split write exactly what they read, known even when the output shapes
    are not (they come from a blob's values)."""
    return OpFeatures(bytes_read=float(inputs[0].nbytes), bytes_written=float(inputs[0].nbytes))


def first_output_cost(inputs, outputs, args) -> OpFeatures:
    """Movement of the main data only (small index/shape side inputs and outputs ignored)."""
    return movement_cost(inputs[:1], outputs[:1], args)


def _reg(type_, infer, kernel, cost=movement_cost, n_in=(1, 1), doc="", launches=1) -> None:
    register(OpDef(type_, infer, kernel, cost, min_inputs=n_in[0], max_inputs=n_in[1], doc=doc,
                   launches=launches))


def _split_launches(inputs, args) -> int:
    """One copy per output."""
    return args.n_outputs or len(args.ints("split", [])) or 2


_reg("Concat", infer_concat, kernel_concat, n_in=(1, None), launches=2,
     doc="Join inputs along axis (or a new axis with add_axis=1); second output split_info "
         "(int32, per-input sizes along the axis; Caffe2 keeps it on the CPU).")
_reg("DepthConcat", infer_concat, kernel_concat, n_in=(1, None), doc="Old name of Concat.", launches=2)
_reg("Split", infer_split, kernel_split, whole_input_cost, n_in=(1, 2), launches=_split_launches,
     doc="Split along axis by the split argument, a split input, or equally among the outputs.")
_reg("DepthSplit", infer_split, kernel_split, whole_input_cost, n_in=(1, 2), doc="Old name of Split.",
     launches=_split_launches)
_reg("Reshape", infer_reshape, kernel_reshape, whole_input_cost, n_in=(1, 2), launches=2,
     doc="New shape from the shape argument (0 copies a dimension, -1 is inferred) or from a "
         "second int32/int64 input (output shape then unknown before running); second output "
         "old_shape (int64, or the shape input's dtype; Caffe2 keeps it on the CPU).")
_reg("Flatten", infer_flatten, kernel_flatten, doc="2-D: dims before axis (default 1) x the rest.")
_reg("FlattenToVec", infer_flatten_to_vec, kernel_flatten_to_vec, doc="1-D view of all elements.")
_reg("ResizeLike", infer_resize_like, kernel_resize_like, first_output_cost, n_in=(2, 2),
     doc="The first input with the second input's shape (same number of elements).")
_reg("Transpose", infer_transpose, kernel_transpose, doc="Permute axes (default: reversed).")
_reg("Squeeze", infer_squeeze, kernel_squeeze, doc="Drop the listed size-1 dims.")
_reg("ExpandDims", infer_expand_dims, kernel_expand_dims, doc="Insert size-1 dims at the listed positions.")
_reg("Slice", infer_slice, kernel_slice, first_output_cost, n_in=(1, 3),
     doc="starts/ends per dimension (arguments or inputs); negative b means dim+1+b; one "
         "dimension only, as in Caffe2.")
_reg("Gather", infer_gather, kernel_gather, gather_cost, n_in=(2, 2), launches=4,
     doc="DATA rows picked by int32/int64 INDICES along axis (default 0).")
_reg("BatchGather", infer_batch_gather, kernel_batch_gather, gather_cost, n_in=(2, 2), launches=4,
     doc="Gather along axis 1 (DLRM's pairwise-interaction pick).")
_reg("ChannelShuffle", infer_channel_shuffle, kernel_channel_shuffle,
     doc="ShuffleNet channel shuffle over group groups, NCHW or NHWC.")
_reg("Shape", infer_shape, kernel_shape, shape_only_cost, doc="int64 dims of the input (optionally only axes).")
_reg("Size", infer_size, kernel_size, shape_only_cost, doc="int64 scalar: number of elements.")
_reg("Tile", infer_tile, kernel_tile, first_output_cost, n_in=(1, 3),
     doc="Repeat the input tiles times along axis.")
