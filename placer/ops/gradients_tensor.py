"""Gradient ops of the data-movement family, as torch 1.8.1's Caffe2 writes them.

Most tensor ops' gradients are forward ops already registered (Concat <-> Split,
Reshape, Transpose with inverted axes, Squeeze <-> ExpandDims, ResizeLike for
Flatten/FlattenToVec, Gather -> a GradientSlice or SparseToDense). The ones with ops of
their own:
- ChannelShuffleGradient(dY) -> dX: the inverse shuffle (channel k*G + g goes back to
  g*K + k), same ``group`` and ``order``.
- BatchGatherGradient(DATA, INDICES, dY) -> dDATA: zeros like DATA, with dY's rows added
  at INDICES along axis 1 (repeated indices add up).
- SliceGradient(X, dY) (``starts``/``ends`` arguments) or SliceGradient(X, starts, ends,
  dY) -> dX: zeros like X with dY in the sliced window.
- TileGradient(dY) (``tiles``/``axis`` arguments) -> dX: dY folded back by summing the
  ``tiles`` copies along ``axis``.
Costs: data movement (bytes read and written); the scatters and folds one add per element
of dY. All four have CUDA kernels in Caffe2. GPU launches (counted on the strict cupy
stand-in): one copy, fill, sum or scatter each, plus the index read and its reorderings.
"""
from __future__ import annotations

from placer.ops.elementwise import shape_error
from placer.ops.registry import OpDef, io_bytes, register
from placer.ops.segments import sum_by_id
from placer.ops.tensor import checked_indices, slice_bounds
from placer.types import OpFeatures, TensorType


def _adds(inputs, outputs, args) -> OpFeatures:
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=float(max(t.size for t in inputs)), bytes_read=read, bytes_written=written)


# ---------------------------------------------------------------- ChannelShuffle
def _shuffle_layout(shape, args) -> tuple[int, int]:
    """(channel axis, group), checked as the forward op checks them."""
    order, group = args.str("order", "NCHW"), args.int("group", 1)
    ax = 1 if order == "NCHW" else len(shape) - 1
    if len(shape) < 2 or group < 1 or shape[ax] % group:
        raise shape_error(args, f"{shape[ax] if len(shape) > 1 else 0} channels do not divide into "
                          f"{group} groups (order {order})", (0, "dY", TensorType(shape)))
    return ax, group


def _shuffle_grad_kernel(xp, inputs, args):
    dy = inputs[0]
    ax, group = _shuffle_layout(tuple(dy.shape), args)
    outer, inner = 1, 1
    for d in dy.shape[:ax]:
        outer *= d
    for d in dy.shape[ax + 1:]:
        inner *= d
    per = dy.shape[ax] // group            # forward: (G, K) -> (K, G); back: (K, G) -> (G, K)
    y = dy.reshape(outer, per, group, inner).transpose(0, 2, 1, 3)
    return (y.copy().reshape(dy.shape),)


register(OpDef("ChannelShuffleGradient", lambda i, a: [_shuffle_check(i, a)], _shuffle_grad_kernel,
               cost=lambda i, o, a: OpFeatures(bytes_read=float(i[0].nbytes), bytes_written=float(o[0].nbytes)),
               min_inputs=1, max_inputs=1, doc="dY -> dX of ChannelShuffle (the inverse shuffle)"))


def _shuffle_check(inputs, args):
    _shuffle_layout(inputs[0].shape, args)
    return inputs[0]


# ---------------------------------------------------------------- BatchGather
def _batch_gather_grad_infer(inputs, args):
    data, idx, dy = inputs
    want = data.shape[:1] + idx.shape + data.shape[2:]
    if data.ndim < 2 or dy.shape != want:
        raise shape_error(args, f"dY must have BatchGather's output shape {want}", (0, "DATA", data),
                          (1, "INDICES", idx), (2, "dY", dy))
    return [TensorType(data.shape, dy.dtype)]


def _batch_gather_grad_kernel(xp, inputs, args):
    data, idx, dy = inputs
    flat = checked_indices(xp, idx.reshape(-1), data.shape[1], args, "BatchGatherGradient")
    batch, rest = data.shape[0], tuple(data.shape[2:])
    rows = xp.ascontiguousarray(dy.reshape((batch, flat.size, -1)).swapaxes(0, 1))   # (K, B, inner)
    summed = sum_by_id(xp, rows.reshape(flat.size, -1), flat, data.shape[1])          # (N1, B * inner)
    back = summed.reshape((data.shape[1], batch) + rest).swapaxes(0, 1)
    return (xp.ascontiguousarray(back).astype(dy.dtype, copy=False),)


register(OpDef("BatchGatherGradient", _batch_gather_grad_infer, _batch_gather_grad_kernel, cost=_adds,
               min_inputs=3, max_inputs=3, launches=7,   # the range read (3), dY reordered, scatter-add, back
               doc="(DATA, INDICES, dY) -> dDATA: dY added at INDICES along axis 1"))


# ---------------------------------------------------------------- Slice
def _slice_bounds_of(x_shape, inputs, args):
    if len(inputs) == 4:
        return None
    return slice_bounds(tuple(x_shape), args.ints("starts"), args.ints("ends"), args, [])


def _slice_grad_infer(inputs, args):
    x, dy = inputs[0], inputs[-1]
    bounds = _slice_bounds_of(x.shape, inputs, args)
    if bounds is not None and dy.shape != tuple(hi - lo for lo, hi in bounds):
        raise shape_error(args, "dY must have the slice's shape", (0, "X", x), (len(inputs) - 1, "dY", dy))
    return [TensorType(x.shape, dy.dtype)]


def _slice_grad_kernel(xp, inputs, args):
    x, dy = inputs[0], inputs[-1]
    if len(inputs) == 4:                    # one host read for both bound vectors
        both = [int(v) for v in xp.concatenate([inputs[1].reshape(-1), inputs[2].reshape(-1)]).tolist()]
        half = inputs[1].size
        bounds = slice_bounds(tuple(x.shape), both[:half], both[half:], args, [])
    else:
        bounds = _slice_bounds_of(x.shape, inputs, args)
    dx = xp.zeros(x.shape, dtype=dy.dtype)
    dx[tuple(slice(lo, hi) for lo, hi in bounds)] = dy
    return (dx,)


register(OpDef("SliceGradient", _slice_grad_infer, _slice_grad_kernel,
               cost=lambda i, o, a: OpFeatures(bytes_read=float(i[-1].nbytes), bytes_written=float(o[0].nbytes)),
               min_inputs=2, max_inputs=4, launches=lambda inputs, args: 2 + (len(inputs) == 4),   # + bounds read
               doc="(X, dY) or (X, starts, ends, dY) -> zeros like X with dY in the sliced window"))


# ---------------------------------------------------------------- Tile
def _tile_axis(dy: TensorType, args) -> tuple[int, int]:
    axis = args.int("axis", 0) % max(dy.ndim, 1)
    tiles = args.int("tiles", 1)
    if tiles < 1 or dy.shape[axis] % tiles:
        raise shape_error(args, f"dimension {axis} of dY does not divide into tiles={tiles}", (0, "dY", dy))
    return axis, tiles


def _tile_grad_infer(inputs, args):
    dy = inputs[0]
    if len(inputs) > 1:
        return [None]                      # tiles and axis come from tensors' values
    axis, tiles = _tile_axis(dy, args)
    shape = list(dy.shape)
    shape[axis] //= tiles
    return [TensorType(tuple(shape), dy.dtype)]


def _tile_grad_kernel(xp, inputs, args):
    dy = inputs[0]
    if len(inputs) > 1:                     # one host read for tiles and axis
        given = [int(v) for v in xp.concatenate([t.reshape(-1)[:1] for t in inputs[1:]]).tolist()]
        args = args.with_values(tiles=given[0], **({"axis": given[1]} if len(given) > 1 else {}))
    axis, tiles = _tile_axis(TensorType(dy.shape), args)
    shape = dy.shape[:axis] + (tiles, dy.shape[axis] // tiles) + dy.shape[axis + 1:]
    return (dy.reshape(shape).sum(axis=axis, dtype=dy.dtype),)


register(OpDef("TileGradient", _tile_grad_infer, _tile_grad_kernel, cost=_adds, min_inputs=1, max_inputs=3,
               launches=lambda inputs, args: 1 + (len(inputs) > 1),                       # + tiles/axis read
               doc="dY -> dX of Tile: the tiles copies along axis summed"))
