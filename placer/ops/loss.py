"""Softmax and the loss/metric ops, with Caffe2's semantics.

- Softmax: X coerced to 2-D (N, D) at ``axis`` (default 1), softmax over D; max-shifted.
- SoftmaxWithLoss(X, label[, weight]) -> (P, loss): P = softmax (X's shape), loss a 0-d
  float32 = scale * sum_i w_i * -log P[i, label_i] / sum_i w_i (0 when the weights sum to
  0). Labels int (N,) or (N, 1); ``label_prob=1`` takes (N, D) distributions instead and
  uses -log(max(P, 1e-20)). ``spatial=1`` (older Caffe2; also the SpatialSoftmaxWithLoss
  op) takes NCHW X with (N, H, W) labels, skips label -1, weights per pixel, and like
  Caffe2 does not apply ``scale`` to the loss.
- LabelCrossEntropy(X, label) -> -log(max(X[i, label_i], 1e-20)), shape (N,).
- SigmoidCrossEntropyWithLogits(X, T) -> mean over the last dim of the logistic loss
  (shape X.dims[:-1]); ``log_D_trick`` and ``unjoined_lr_loss`` as in Caffe2.
- AveragedLoss(X) -> mean of all values, 0-d. Accuracy(X (N, D), label) -> 0-d float32,
  a row counts when fewer than ``top_k`` scores beat the label's (ties go to the lower
  index). SquaredL2Distance(X, Y) -> 0.5 * ||x_i - y_i||^2 per row, (N,).
  MakeTwoClass(X) -> stack of (1 - x, x) on a new last dim.

Costs: softmax 4 flops per element (subtract, exp, add, divide); the losses one flop per
element read; Accuracy 2 per score (compare, count).
"""
from __future__ import annotations

from math import prod

from placer.errors import InputError
from placer.ops.elementwise import canonical_axis, shape_error
from placer.ops.registry import OpDef, default_cost, io_bytes, register
from placer.types import Args, OpFeatures, TensorType

LOG_THRESHOLD = 1e-20   # Caffe2's floor under probabilities before log
DONT_CARE = -1          # spatial label that is skipped
SCALAR = ()


def _flops_per_elem(per: float, which: int = 0):
    def cost(inputs, outputs, args) -> OpFeatures:
        read, written = io_bytes(inputs, outputs)
        return OpFeatures(flops=float(per * inputs[which].size), bytes_read=read, bytes_written=written)
    return cost


def _rows(x: TensorType, args: Args) -> tuple[int, int]:
    """(N, D) of X coerced to 2-D at ``axis``."""
    axis = canonical_axis(args.int("axis", 1), x.ndim, args)
    return prod(x.shape[:axis]), prod(x.shape[axis:])


def log_softmax_rows(xp, x2):
    """Max-shifted log-softmax over axis 1 of a 2-D array (never overflows)."""
    z = x2 - x2.max(axis=1, keepdims=True)
    z -= xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    return z


def _softmax_kernel(xp, inputs, args):
    x = inputs[0]
    n, d = _rows(TensorType(x.shape), args)
    z = x.reshape(n, d) - x.reshape(n, d).max(axis=1, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return (z.reshape(x.shape),)


def _softmax_infer(inputs, args):
    _rows(inputs[0], args)
    return [inputs[0]]


register(OpDef("Softmax", _softmax_infer, _softmax_kernel, cost=_flops_per_elem(4), launches=5,
               min_inputs=1, max_inputs=1, doc="softmax over X coerced to 2-D at axis"))


# ---------------------------------------------------------------- SoftmaxWithLoss
def _swl_infer(inputs, args, spatial=False):
    x, t = inputs[0], inputs[1]
    spatial = spatial or args.bool("spatial", False)
    if spatial:
        if x.ndim != 4 or t.shape != (x.shape[0],) + x.shape[2:]:
            raise shape_error(args, "spatial mode needs NCHW logits and (N, H, W) labels",
                              (0, "X", x), (1, "label", t))
        _integer_labels(t, args)
        per_sample = t
    else:
        n, d = _rows(x, args)
        axis = canonical_axis(args.int("axis", 1), x.ndim, args)
        if args.bool("label_prob", False):
            ok = t.ndim >= 2 and prod(t.shape[:axis]) == n and prod(t.shape[axis:]) == d
            want = f"({n}, {d}) label probabilities"
        else:
            _integer_labels(t, args)
            ok = t.size == n and (t.ndim == axis or prod(t.shape[axis:]) == 1)
            want = f"{n} labels, shape ({n},) or ({n}, 1)"
        if not ok:
            raise shape_error(args, f"logits coerced to {n}x{d} need {want}", (0, "X", x), (1, "label", t))
        per_sample = TensorType((n,))
    if len(inputs) > 2 and inputs[2].size != per_sample.size:
        raise shape_error(args, f"weights need {per_sample.size} values, one per sample",
                          (1, "label", t), (2, "weight", inputs[2]))
    return [x, TensorType(SCALAR, "float32")]


def _integer_labels(t: TensorType, args: Args, index: int = 1) -> None:
    """Class labels must be integers (Caffe2 reads them as int32)."""
    if t.dtype not in ("int32", "int64", "int16", "int8", "uint8"):
        raise shape_error(args, "class labels must be integers (int32)", (index, "label", t))


def _check_labels(xp, labels, d: int, args: Args, allow_dont_care=False):
    """Caffe2 refuses labels outside 0..D-1 (numpy would wrap negatives silently)."""
    if labels.size == 0:
        return
    lo, hi = xp.stack([labels.min(), labels.max()]).tolist()   # one host read
    if hi >= d or lo < (DONT_CARE if allow_dont_care else 0):
        raise InputError(f"op {args.op}: labels range over {lo}..{hi}, outside 0..{d - 1}")


def _average(xp, total, weight_sum, scale=1.0):
    """Caffe2's loss * scale / sum(weights), 0 when the weights sum to 0, as 0-d float32."""
    safe = xp.where(weight_sum != 0, weight_sum, 1)
    return xp.asarray(xp.where(weight_sum != 0, total * scale / safe, 0), dtype=xp.float32)


def _swl_kernel(xp, inputs, args):
    if args.bool("spatial", False):
        return _spatial_swl_kernel(xp, inputs, args)
    x, t = inputs[0], inputs[1]
    w = inputs[2] if len(inputs) > 2 else None
    n, d = _rows(TensorType(x.shape), args)
    logp = log_softmax_rows(xp, x.reshape(n, d))
    w = xp.ones(n, dtype=x.dtype) if w is None else w.reshape(n).astype(x.dtype, copy=False)
    if args.bool("label_prob", False):
        p = xp.exp(logp)
        per_row = -(xp.log(xp.maximum(p, LOG_THRESHOLD)) * t.reshape(n, d)).sum(axis=1)
    else:
        labels = t.reshape(n)
        _check_labels(xp, labels, d, args)
        per_row = -logp[xp.arange(n), labels]
        p = xp.exp(logp, out=logp)
    loss = _average(xp, (per_row * w).sum(), w.sum(), args.float("scale", 1.0))
    return p.reshape(x.shape), loss


def _spatial_swl_kernel(xp, inputs, args):
    x, t = inputs[0], inputs[1]
    z = x - x.max(axis=1, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    _check_labels(xp, t, x.shape[1], args, allow_dont_care=True)
    valid = t != DONT_CARE
    picked = xp.take_along_axis(z, xp.where(valid, t, 0)[:, None].astype(xp.int64), axis=1)[:, 0]
    w = valid.astype(x.dtype)
    if len(inputs) > 2:
        w *= inputs[2].reshape(t.shape)
    total = (-xp.log(xp.maximum(picked, LOG_THRESHOLD)) * w).sum()
    return z, _average(xp, total, w.sum())


register(OpDef("SoftmaxWithLoss", _swl_infer, _swl_kernel, cost=_flops_per_elem(5), launches=23,
               min_inputs=2, max_inputs=3, doc="softmax and averaged cross-entropy loss"))
register(OpDef("SpatialSoftmaxWithLoss", lambda i, a: _swl_infer(i, a, spatial=True),
               lambda xp, i, a: _spatial_swl_kernel(xp, i, a), cost=_flops_per_elem(5), launches=26,
               min_inputs=2, max_inputs=3, doc="per-pixel softmax loss over NCHW logits"))


# ---------------------------------------------------------------- LabelCrossEntropy
def _label_rows(x: TensorType, t: TensorType, args: Args) -> tuple[int, int]:
    n, d = (x.shape[0], prod(x.shape[1:])) if x.ndim > 1 else (1, x.size)
    if not (t.ndim == 1 or (t.ndim == 2 and t.shape[1] == 1)) or t.shape[0] != n:
        raise shape_error(args, f"needs {n} labels, shape ({n},) or ({n}, 1)", (0, "X", x), (1, "label", t))
    return n, d


def _lce_infer(inputs, args):
    x, t = inputs
    n, _ = _label_rows(x, t, args)
    _integer_labels(t, args)
    return [TensorType((n,), x.dtype)]


def _lce_kernel(xp, inputs, args):
    x, t = inputs
    n, d = _label_rows(TensorType(x.shape), TensorType(t.shape), args)
    labels = t.reshape(n)
    _check_labels(xp, labels, d, args)
    picked = x.reshape(n, d)[xp.arange(n), labels]
    return (-xp.log(xp.maximum(picked, LOG_THRESHOLD)),)


register(OpDef("LabelCrossEntropy", _lce_infer, _lce_kernel, cost=_flops_per_elem(1, 1), launches=8,
               min_inputs=2, max_inputs=2, doc="-log(X[i, label_i]) per row"))


# ---------------------------------------------------------------- SigmoidCrossEntropyWithLogits
def _sxe_infer(inputs, args):
    x, t = inputs
    if x.shape != t.shape:
        raise shape_error(args, "logits and targets must have the same shape", (0, "X", x), (1, "targets", t))
    return [TensorType(x.shape[:-1], x.dtype)]


def _sxe_kernel(xp, inputs, args):
    x, t = inputs
    pos = x >= 0
    softplus_neg = xp.log1p(xp.exp(-xp.abs(x)))        # log(1 + exp(-|x|))
    if args.bool("log_D_trick", False):
        value = (2 * t - 1) * (x * ~pos - softplus_neg)  # (2t - 1) * log(sigmoid(x))
    elif args.bool("unjoined_lr_loss", False):
        value = x * t + (t - 1) * x * pos - (1 - t) * softplus_neg
    else:
        value = x * (t - pos) - softplus_neg             # t log s + (1 - t) log(1 - s)
    inner = x.shape[-1] if x.ndim else 1
    return ((-value.reshape(x.shape[:-1] + (inner,)).sum(axis=-1) / inner).astype(x.dtype, copy=False),)


def _sxe_launches(inputs, args) -> int:
    return 14 if args.bool("log_D_trick", False) else 16 if args.bool("unjoined_lr_loss", False) else 11


register(OpDef("SigmoidCrossEntropyWithLogits", _sxe_infer, _sxe_kernel, cost=_flops_per_elem(4),
               launches=_sxe_launches,
               min_inputs=2, max_inputs=2, doc="mean logistic loss over the last dim"))


# ---------------------------------------------------------------- AveragedLoss, Accuracy
register(OpDef("AveragedLoss", lambda i, a: [TensorType(SCALAR, i[0].dtype)],
               lambda xp, i, a: (xp.asarray(i[0].mean(), dtype=i[0].dtype),),
               cost=_flops_per_elem(1), min_inputs=1, max_inputs=1, doc="mean of all values, 0-d"))


def _accuracy_infer(inputs, args):
    x, t = inputs
    if x.ndim != 2:
        raise shape_error(args, "predictions must be 2-D (N, D)", (0, "X", x))
    _label_rows(x, t, args)
    _integer_labels(t, args)
    return [TensorType(SCALAR, "float32")]


def _accuracy_kernel(xp, inputs, args):
    x, t = inputs
    n, d = x.shape
    labels = t.reshape(n)
    _check_labels(xp, labels, d, args)
    score = x[xp.arange(n), labels][:, None]
    beaten = (x > score) | ((x == score) & (xp.arange(d)[None, :] < labels[:, None]))
    correct = (beaten.sum(axis=1) < args.int("top_k", 1)).sum()
    return (xp.asarray(correct / max(n, 1), dtype=xp.float32),)


register(OpDef("Accuracy", _accuracy_infer, _accuracy_kernel, cost=_flops_per_elem(2), launches=16,
               min_inputs=2, max_inputs=2, doc="fraction of rows whose label is in the top_k scores"))


# ---------------------------------------------------------------- SquaredL2Distance, MakeTwoClass
def _l2_infer(inputs, args):
    x, y = inputs
    if x.shape != y.shape:
        raise shape_error(args, "X and Y must have the same shape", (0, "X", x), (1, "Y", y))
    return [TensorType((x.shape[0] if x.ndim else 1,), x.dtype)]


def _l2_kernel(xp, inputs, args):
    x, y = inputs
    n = x.shape[0] if x.ndim else 1
    diff = (x - y).reshape(n, prod(x.shape[1:]))  # no -1: n may be 0
    return ((diff * diff).sum(axis=1) * 0.5).astype(x.dtype, copy=False),


register(OpDef("SquaredL2Distance", _l2_infer, _l2_kernel, cost=_flops_per_elem(3), launches=4,
               min_inputs=2, max_inputs=2, doc="0.5 * squared L2 distance per row"))
register(OpDef("MakeTwoClass", lambda i, a: [TensorType(i[0].shape + (2,), i[0].dtype)],
               lambda xp, i, a: (xp.stack([1 - i[0], i[0]], axis=-1),), cost=default_cost,
               min_inputs=1, max_inputs=1, launches=2, doc="(1 - p, p) on a new last dim"))
