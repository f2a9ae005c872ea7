"""Dense ops: FC, FCTransposed, MatMul, BatchMatMul (Caffe2 semantics).

- FC(X, W, b): X is flattened at ``axis`` (default 1) to (M, K); W (N, K) is flattened at
  ``axis_w`` (default 1); Y = X W^T + b with shape X.dims[:axis] + [N].
  FCTransposed is the same with W stored as (K, N).
- MatMul(A, B): both coerced to 2-D at ``axis_a``/``axis_b`` (default 1), optionally
  transposed (``trans_a``/``trans_b``); Y is (M, N).
- BatchMatMul(A, B): matrices in the last two dims, ``trans_a``/``trans_b`` on those;
  without ``broadcast`` A and B have the same rank (>= 2) and equal batch dims; with
  ``broadcast=1`` it is numpy.matmul (1-d operands promoted, batch dims broadcast).

Costs: a multiply-add is 1 MAC and 2 flops; FC adds M*N flops for the bias.

float16 operands give a float16 result computed in float32 and rounded once (``gemm``), as
Caffe2's CUDA kernels compute at::Half products with float math (math_gpu.cu Gemm /
GemmStridedBatched, math_type FLOAT: fully_connected_op_gpu.cc unless float16_compute,
batch_matmul_op_gpu.cc); FC's bias is then added in float16 (a second rounding, as Caffe2's
bias Gemm into Y does). The float32 product runs on BLAS on the host (numpy's float16 matmul
has none) and the same way on cupy. Caffe2 1.8.1 has no float16 FC, MatMul or BatchMatMul on
the CPU (its FC engine FAKE_FP16 is float32 in and out), and MatMul has a float CUDA kernel
only (matmul_op_gpu.cc).
"""
from __future__ import annotations

from math import prod

from placer.ops.elementwise import canonical_axis, shape_error
from placer.ops.registry import DEFAULT_SCRATCH_FACTOR, OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType


def gemm(xp, a, b):
    """``a @ b``; float16 operands multiplied in float32 and the result rounded to float16."""
    if a.dtype == xp.float16 and b.dtype == xp.float16:
        return xp.matmul(a.astype(xp.float32), b.astype(xp.float32)).astype(xp.float16)
    return xp.matmul(a, b)


def half_scratch(inputs, outputs) -> float:
    """float16 operands: their float32 copies and the float32 product (twice their bytes)."""
    if None in (inputs[0], inputs[1], outputs[0]) or _half_launches(inputs) == 0:
        return 0.0
    return 2.0 * (inputs[0].nbytes + inputs[1].nbytes + outputs[0].nbytes)


def _half_launches(inputs) -> int:
    """The two operand casts and the cast of the result back to float16."""
    return 3 if inputs[0].dtype == "float16" and inputs[1].dtype == "float16" else 0


# ---------------------------------------------------------------- FC
def fc_dims(inputs, args: Args, transposed: bool) -> tuple[int, int, int, int]:
    """(axis, M, K, N) of an FC, checking that X's K, W's K and b's N agree."""
    x, w = inputs[0], inputs[1]
    axis = canonical_axis(args.int("axis", 1), x.ndim, args)
    axis_w = canonical_axis(args.int("axis_w", 1), w.ndim, args, "axis_w")
    m, k = prod(x.shape[:axis]), prod(x.shape[axis:])
    head, tail = prod(w.shape[:axis_w]), prod(w.shape[axis_w:])
    n, kw = (tail, head) if transposed else (head, tail)
    layout = "(K, N)" if transposed else "(N, K)"
    if k != kw:
        raise shape_error(args, f"input K={k} (X flattened at axis {axis} to {m}x{k}) does not match "
                          f"the weight's K={kw} (W is {layout} = {'x'.join(map(str, (head, tail)))} "
                          f"at axis_w {axis_w})", (0, "X", x), (1, "W", w))
    if len(inputs) > 2 and inputs[2].size != n:
        raise shape_error(args, f"bias has {inputs[2].size} values, the weight gives N={n}",
                          (1, "W", w), (2, "b", inputs[2]))
    return axis, m, k, n


def _fc_infer(transposed: bool):
    def infer(inputs, args):
        axis, _, _, n = fc_dims(inputs, args, transposed)
        x = inputs[0]
        return [TensorType(x.shape[:axis] + (n,), x.dtype)]
    return infer


def _fc_kernel(transposed: bool):
    def kernel(xp, inputs, args):
        x, w = inputs[0], inputs[1]
        axis = canonical_axis(args.int("axis", 1), x.ndim, args)
        m = prod(x.shape[:axis])
        k = x.size // m if m else prod(x.shape[axis:])
        w2 = w.reshape(k, -1) if transposed else w.reshape(-1, k).T   # views, no copy
        y = gemm(xp, x.reshape(m, k), w2)
        if len(inputs) > 2:
            y += inputs[2].reshape(-1)
        return (y.reshape(x.shape[:axis] + (w2.shape[1],)),)
    return kernel


def _fc_cost(inputs, outputs, args) -> OpFeatures:
    y = outputs[0]
    n = y.shape[-1]
    m = y.size // n if n else 0
    k = inputs[1].size // n if n else 0
    macs = float(m * k * n)
    read, written = io_bytes(inputs, outputs)
    bias = float(m * n) if len(inputs) > 2 else 0.0
    return OpFeatures(flops=2 * macs + bias, macs=macs, bytes_read=read, bytes_written=written)


def _fc_launches(inputs, args) -> int:
    """The GEMM, and the bias add when there is a bias."""
    return (2 if len(inputs) > 2 else 1) + _half_launches(inputs)


# matmul writes Y and the bias is added in place: tracemalloc saw 0.07 B of temporaries per
# byte of Y (256x1024 by 512x1024, float32); 0.25 leaves room.
FC_SCRATCH = 0.25


def _fc_scratch(inputs, outputs, args) -> float:
    return FC_SCRATCH * (outputs[0].nbytes if outputs[0] is not None else 0) + half_scratch(inputs, outputs)


def _gemm_scratch(inputs, outputs, args) -> float:
    """The registry's default for a matrix product, plus the float32 copies of float16 operands."""
    largest = outputs[0].nbytes if outputs[0] is not None else 0
    return DEFAULT_SCRATCH_FACTOR * largest + half_scratch(inputs, outputs)

register(OpDef("FC", _fc_infer(False), _fc_kernel(False), cost=_fc_cost, min_inputs=2, max_inputs=3,
               launches=_fc_launches, scratch=_fc_scratch,
               doc="Y = X W^T + b, X flattened at axis, W (N, K)"))
register(OpDef("FCTransposed", _fc_infer(True), _fc_kernel(True), cost=_fc_cost, min_inputs=2,
               launches=_fc_launches, scratch=_fc_scratch,
               max_inputs=3, doc="Y = X W + b, X flattened at axis, W (K, N)"))


# ---------------------------------------------------------------- MatMul
def _matmul_dims(inputs, args) -> tuple[int, int, int, int, int]:
    """(rows of A2, cols of A2, rows of B2, cols of B2, K) after 2-D coercion, checked."""
    a, b = inputs
    ax = canonical_axis(args.int("axis_a", 1), a.ndim, args, "axis_a")
    bx = canonical_axis(args.int("axis_b", 1), b.ndim, args, "axis_b")
    a0, a1 = prod(a.shape[:ax]), prod(a.shape[ax:])
    b0, b1 = prod(b.shape[:bx]), prod(b.shape[bx:])
    ka = a0 if args.bool("trans_a", False) else a1
    kb = b1 if args.bool("trans_b", False) else b0
    if ka != kb:
        raise shape_error(args, f"inner dims differ: A as {a0}x{a1} (axis_a {ax}, trans_a "
                          f"{int(args.bool('trans_a', False))}) gives K={ka}, B as {b0}x{b1} (axis_b {bx}, "
                          f"trans_b {int(args.bool('trans_b', False))}) gives K={kb}", (0, "A", a), (1, "B", b))
    return a0, a1, b0, b1, ka


def _matmul_infer(inputs, args):
    a0, a1, b0, b1, _ = _matmul_dims(inputs, args)
    m = a1 if args.bool("trans_a", False) else a0
    n = b0 if args.bool("trans_b", False) else b1
    return [TensorType((m, n), inputs[0].dtype)]


def _matmul_kernel(xp, inputs, args):
    a, b = inputs
    a0, a1, b0, b1, _ = _matmul_dims([TensorType(a.shape), TensorType(b.shape)], args)
    a2, b2 = a.reshape(a0, a1), b.reshape(b0, b1)
    if args.bool("trans_a", False):
        a2 = a2.T
    if args.bool("trans_b", False):
        b2 = b2.T
    return (gemm(xp, a2, b2),)


def _gemm_cost(inputs, outputs, args, k: int) -> OpFeatures:
    macs = float(outputs[0].size * k)
    read, written = io_bytes(inputs, outputs)
    return OpFeatures(flops=2 * macs, macs=macs, bytes_read=read, bytes_written=written)


register(OpDef("MatMul", _matmul_infer, _matmul_kernel,
               cost=lambda i, o, a: _gemm_cost(i, o, a, _matmul_dims(i, a)[4]),
               min_inputs=2, max_inputs=2, launches=lambda i, a: 1 + _half_launches(i), scratch=_gemm_scratch,
               doc="2-D matrix product after coercion at axis_a/axis_b"))


# ---------------------------------------------------------------- BatchMatMul
def _bmm_plan(a: TensorType, b: TensorType, args: Args):
    """(A dims, B dims as 2-d+ after promotion, output shape, K), checked like Caffe2."""
    ta, tb = args.bool("trans_a", False), args.bool("trans_b", False)
    broadcast = args.bool("broadcast", False)
    da, db = list(a.shape), list(b.shape)
    if not broadcast:
        if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
            raise shape_error(args, "without broadcast=1, A and B need the same rank (>= 2) and "
                              "equal batch dims", (0, "A", a), (1, "B", b))
    elif a.ndim == 0 or b.ndim == 0:
        raise shape_error(args, "matmul of a 0-d input", (0, "A", a), (1, "B", b))
    elif (ta and a.ndim == 1) or (tb and b.ndim == 1):
        raise shape_error(args, "trans_a/trans_b on a 1-d input is ambiguous; drop the flag",
                          (0, "A", a), (1, "B", b))
    if len(da) == 1:
        da = [1] + da
    if len(db) == 1:
        db = db + [1]
    m, ka = (da[-1], da[-2]) if ta else (da[-2], da[-1])
    kb, n = (db[-1], db[-2]) if tb else (db[-2], db[-1])
    if ka != kb:
        raise shape_error(args, f"inner dims differ: K={ka} from A (trans_a {int(ta)}) vs K={kb} "
                          f"from B (trans_b {int(tb)})", (0, "A", a), (1, "B", b))
    batch = _broadcast_batch(da[:-2], db[:-2], a, b, args)
    out = batch + ([m] if a.ndim > 1 else []) + ([n] if b.ndim > 1 else [])
    if a.ndim == 1 and b.ndim == 1:
        out = batch + [1]
    return da, db, tuple(out), ka


def _broadcast_batch(ba, bb, a, b, args) -> list[int]:
    out = []
    for i in range(1, max(len(ba), len(bb)) + 1):
        x = ba[-i] if i <= len(ba) else 1
        y = bb[-i] if i <= len(bb) else 1
        if x != y and 1 not in (x, y):
            raise shape_error(args, f"batch dims do not broadcast ({x} vs {y})", (0, "A", a), (1, "B", b))
        out.append(y if x == 1 else x)
    return out[::-1]


def _bmm_infer(inputs, args):
    a, b = inputs
    return [TensorType(_bmm_plan(a, b, args)[2], a.dtype)]


def _bmm_kernel(xp, inputs, args):
    a, b = inputs
    da, db, out, _ = _bmm_plan(TensorType(a.shape), TensorType(b.shape), args)
    a, b = a.reshape(da), b.reshape(db)
    if args.bool("trans_a", False):
        a = xp.swapaxes(a, -1, -2)
    if args.bool("trans_b", False):
        b = xp.swapaxes(b, -1, -2)
    return (gemm(xp, a, b).reshape(out),)


register(OpDef("BatchMatMul", _bmm_infer, _bmm_kernel,
               cost=lambda i, o, a: _gemm_cost(i, o, a, _bmm_plan(i[0], i[1], a)[3]),
               min_inputs=2, max_inputs=2, launches=lambda i, a: 1 + _half_launches(i), scratch=_gemm_scratch,
               doc="batched matrix product over the last two dims"))
