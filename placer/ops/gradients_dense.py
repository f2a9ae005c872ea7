"""Gradient ops of the dense family: FC and the broadcasting arithmetic.

What torch 1.8.1's ``AddGradientOperators`` writes (checked with
``core.GradientRegistry.GetGradientForOp``):
- FC(X, W, b) -> FCGradient(X, W, dY) -> (dW, db[, dX]); FCTransposed likewise.
  X flattened at ``axis`` to (M, K), dY to (M, N): dW = dY^T X (N, K) shaped like W
  (X^T dY, (K, N), for FCTransposed), db = column sums of dY, dX = dY W shaped like X.
- Add/Sub/Mul/Div -> AddGradient(dC, A, B), SubGradient(dC, A, B), MulGradient(dC, A, B),
  DivGradient(dC, A, B, C) -> (dA, dB), with the forward op's ``broadcast``/``axis``:
  the elementwise gradient (dC; -dC; dC*B and dC*A; dC/B and -dC*C/B) summed over the
  broadcast dimensions so that dA has A's shape and dB has B's (Caffe2's old broadcast=1
  rule or numpy broadcasting, as the forward op chose).
- SumReduceLike(A, B) -> A summed down to B's shape under the broadcast=1 rule (``axis``,
  ``axis_str``); the gradient op of older Caffe2 releases.
- BatchMatMul / MatMul gradients are the forward ops themselves (registered in fc.py).

Costs: FCGradient does two GEMMs of the forward's size (dW and dX, 2*M*K*N MACs; one
without dX) plus M*N adds for db; the binary gradients one or two flops per element of
dC (three for Div) plus the reduction. GPU launches (``launches``, counted on the strict
cupy stand-in): a GEMM per weight or input gradient and the bias sum; for the binary
gradients the rule's ufuncs, a sum per output folded to a smaller shape, and a copy
where an output is dC itself.
"""
from __future__ import annotations

from math import prod

from placer.ops.elementwise import canonical_axis, legacy_sizes, numpy_broadcast_shape, shape_error
from placer.ops.fc import fc_dims
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType


# ---------------------------------------------------------------- FC
def _fc_grad_infer(transposed: bool):
    def infer(inputs, args):
        x, w, dy = inputs
        _, m, _, n = fc_dims([x, w], args, transposed)
        if dy.size != m * n:
            raise shape_error(args, f"dY needs {m}x{n} values (rows of X by outputs of W)",
                              (0, "X", x), (1, "W", w), (2, "dY", dy))
        return [w, TensorType((n,), w.dtype), x]
    return infer


def _fc_grad_kernel(transposed: bool):
    def kernel(xp, inputs, args):
        if all(a.dtype == xp.float16 for a in inputs):
            # float16 products in float32, rounded once (as the forward's gemm: fc.py)
            outs = kernel(xp, [a.astype(xp.float32) for a in inputs], args)
            return tuple(o.astype(xp.float16) for o in outs)
        x, w, dy = inputs
        axis = canonical_axis(args.int("axis", 1), x.ndim, args)
        m = prod(x.shape[:axis])
        k = x.size // m if m else prod(x.shape[axis:])
        x2, dy2 = x.reshape(m, k), dy.reshape(m, prod(dy.shape[axis:]))  # no -1: m may be 0
        dw = xp.matmul(x2.T, dy2) if transposed else xp.matmul(dy2.T, x2)   # W is (K, N) / (N, K)
        outs = (dw.reshape(w.shape), dy2.sum(axis=0, dtype=dy.dtype))
        if not _fc_has_dx(args):
            return outs
        dx = xp.matmul(dy2, w.reshape(k, -1).T if transposed else w.reshape(-1, k))
        return outs + (dx.reshape(x.shape),)
    return kernel


def _fc_has_dx(args: Args) -> bool:
    """Whether dX is asked for (a third output; all three when the count is not known)."""
    return (args.n_outputs or 3) > 2


def _fc_grad_cost(transposed: bool):
    def cost(inputs, outputs, args) -> OpFeatures:
        _, m, k, n = fc_dims(inputs[:2], args, transposed)
        gemms = 2 if len(outputs) > 2 else 1      # dW always, dX when asked for
        macs = float(gemms * m * k * n)
        read, written = io_bytes(inputs, outputs)
        return OpFeatures(flops=2 * macs + m * n, macs=macs, bytes_read=read, bytes_written=written)
    return cost


for _type, _transposed in (("FCGradient", False), ("FCTransposedGradient", True)):
    register(OpDef(_type, _fc_grad_infer(_transposed), _fc_grad_kernel(_transposed), cost=_fc_grad_cost(_transposed),
                   min_inputs=3, max_inputs=3, launches=lambda inputs, args: 2 + _fc_has_dx(args),
                   doc="(X, W, dY) -> (dW, db[, dX]) of " + _type[:-len("Gradient")]))


# ---------------------------------------------------------------- broadcast reductions
def reduce_to(xp, grad, like_shape: tuple, args: Args, a_shape: tuple):
    """``grad`` (shaped like A, or like the broadcast output) summed down to ``like_shape``:
    Caffe2's broadcast=1 rule when the op has it, numpy broadcasting otherwise."""
    if tuple(grad.shape) == tuple(like_shape):
        return grad
    if args.bool("broadcast", False):
        pre, n, post = legacy_sizes(TensorType(a_shape), TensorType(like_shape), args)
        return grad.reshape(pre, n, post).sum(axis=(0, 2), dtype=grad.dtype).reshape(like_shape)
    lead = grad.ndim - len(like_shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(like_shape)
                                      if d == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=axes, dtype=grad.dtype).reshape(like_shape)


def _binary_grad_infer(inputs, args):
    dc, a, b = inputs[0], inputs[1], inputs[2]
    if args.bool("broadcast", False):
        legacy_sizes(a, b, args)
        out = a.shape
    else:
        out = numpy_broadcast_shape(a, b, args)
    if dc.shape != tuple(out):
        raise shape_error(args, f"dC must have the forward output's shape {tuple(out)}",
                          (0, "dC", dc), (1, "A", a), (2, "B", b))
    return [TensorType(a.shape, dc.dtype), TensorType(b.shape, dc.dtype)]


def _expand_b(xp, b, a_shape, args: Args):
    """B shaped to broadcast against the forward output (the broadcast=1 rule reshaped)."""
    if args.bool("broadcast", False):
        pre, n, post = legacy_sizes(TensorType(a_shape), TensorType(b.shape), args)
        return b.reshape(1, n, 1), (pre, n, post)
    return b, None


def _binary_grad_kernel(rule):
    """``rule(dc, a, b, c)`` gives the elementwise (dA, dB) at the output's shape (dC itself
    for Add's two and Sub's dA: copied where not summed, as outputs never alias inputs)."""
    def kernel(xp, inputs, args):
        dc, a, b = inputs[0], inputs[1], inputs[2]
        c = inputs[3] if len(inputs) > 3 else None
        b_view, legacy = _expand_b(xp, b, tuple(a.shape), args)
        if legacy is not None:
            dc_v = dc.reshape(legacy)
            a_v = a.reshape(legacy)
            c_v = None if c is None else c.reshape(legacy)
        else:
            dc_v, a_v, c_v = dc, a, c
        return tuple(_folded(xp, grad, grad is dc_v, dc, tuple(like.shape), args, tuple(a.shape))
                     for grad, like in zip(rule(xp, dc_v, a_v, b_view, c_v), (a, b)))
    return kernel


def _folded(xp, grad, is_dc: bool, dc, like_shape: tuple, args: Args, a_shape: tuple):
    """``grad`` (dC's size) summed down to ``like_shape``, as a new array of dC's dtype."""
    out = reduce_to(xp, grad.reshape(dc.shape), like_shape, args, a_shape)
    if is_dc and tuple(like_shape) == tuple(dc.shape):
        return out.copy()
    return out.astype(dc.dtype, copy=False)


_RULES = {
    "AddGradient": (lambda xp, dc, a, b, c: (dc, dc), 0.0),
    "SubGradient": (lambda xp, dc, a, b, c: (dc, -dc), 1.0),
    "MulGradient": (lambda xp, dc, a, b, c: (dc * b, dc * a), 2.0),
    "DivGradient": (lambda xp, dc, a, b, c: (dc / b, -dc * c / b), 3.0),
}


def _binary_grad_cost(per_element: float):
    def cost(inputs, outputs, args) -> OpFeatures:
        n = inputs[0].size
        reduce = sum(n - t.size for t in outputs)     # adds that fold broadcast dims away
        read, written = io_bytes(inputs, outputs)
        return OpFeatures(flops=float(per_element * n + reduce), bytes_read=read, bytes_written=written)
    return cost


# GPU launches of each rule's (dA, dB) beyond dC itself (0: the output is dC).
_RULE_LAUNCHES = {"AddGradient": (0, 0), "SubGradient": (0, 1), "MulGradient": (1, 1), "DivGradient": (1, 3)}


def _binary_grad_launches(op_type: str):
    """Per output its rule's ufuncs, then a sum where its shape is smaller than dC's; an
    output that is dC itself costs one launch either way (the sum, or a copy)."""
    def launches(inputs, args) -> int:
        dc = inputs[0]
        return sum(max(ufuncs + (t.shape != dc.shape), 1)
                   for ufuncs, t in zip(_RULE_LAUNCHES[op_type], inputs[1:3]))
    return launches


for _type, (_rule, _flops) in _RULES.items():
    n_in = 4 if _type == "DivGradient" else 3
    register(OpDef(_type, _binary_grad_infer, _binary_grad_kernel(_rule), cost=_binary_grad_cost(_flops),
                   min_inputs=n_in, max_inputs=n_in, launches=_binary_grad_launches(_type),
                   doc=f"(dC, A, B{', C' if n_in == 4 else ''}) -> (dA, dB) of {_type[:-8]}, summed over "
                       "broadcast dims"))


# ---------------------------------------------------------------- SumReduceLike
def _sum_reduce_like_infer(inputs, args):
    a, b = inputs
    legacy_sizes(a, b, args)
    return [TensorType(b.shape, a.dtype)]


def _sum_reduce_like_kernel(xp, inputs, args):
    a, b = inputs
    if tuple(a.shape) == tuple(b.shape):
        return (a.copy(),)
    pre, n, post = legacy_sizes(TensorType(a.shape), TensorType(b.shape), args)
    return (a.reshape(pre, n, post).sum(axis=(0, 2), dtype=a.dtype).reshape(b.shape),)


register(OpDef("SumReduceLike", _sum_reduce_like_infer, _sum_reduce_like_kernel,
               cost=lambda i, o, a: OpFeatures(flops=float(i[0].size), bytes_read=float(i[0].nbytes),
                                               bytes_written=float(o[0].nbytes)),
               min_inputs=2, max_inputs=2,
               doc="A summed to B's shape under the broadcast=1 rule (axis / axis_str)"))
