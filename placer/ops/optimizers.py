"""Op family 'optimizers': the parameter-update ops of Caffe2 train nets (caffe2/sgd/).

Semantics follow the C++ of torch 1.8.1's Caffe2 (caffe2/sgd/*_op.h, utility_ops.h):
- WeightedSum(X0, w0, X1, w1, ...) -> w0*X0 + w1*X1 + ... (weights are 1-element tensors).
- ScatterWeightedSum(X0, w0, INDICES, X1, w1, ...) -> X0 whose rows INDICES[i] become
  w0*row + sum_b w_b*X_b[i]; a row listed k times is scaled by w0^k, then gets all k
  updates added (the C++ scales in one loop over the indices, then adds in another).
- MomentumSGDUpdate(g, m, lr, p) -> (g', m', p): m' = mu*m + lr*g, g' = m' (nesterov=0)
  or (1+mu)*m' - mu*m (nesterov=1), p -= g'. SparseMomentumSGDUpdate(g, m, lr, p, idx)
  does the same on the rows idx (g has one row per index).
- Adagrad(p, h, g, lr) -> (p, h[, effective_lr[, update]]): g += weight_decay*p,
  h' = decay*h + g^2, p' = p + lr*g/(sqrt(h')+eps). SparseAdagrad(p, h, idx, g, lr) on
  rows; RowWiseSparseAdagrad keeps one h per row: h' = h + mean(g_row^2).
- Adam(p, m1, m2, g, lr, iter) -> (p, m1, m2[, effective grad]): t = iter + 1,
  m1' = b1*m1 + (1-b1)*g, m2' = b2*m2 + (1-b2)*g^2,
  p' = p + lr*sqrt(1-b2^t)/(1-b1^t) * m1'/(sqrt(m2')+eps). SparseAdam on rows;
  RowWiseSparseAdam keeps one m2 per row (mean of g_row^2).
- Iter(ITER) -> ITER+1 and AtomicIter(mutex, ITER) -> ITER+1 on an int64 [1] counter.
- CreateMutex() -> a mutex blob. placer runs one op at a time, so there is nothing to
  lock: the blob is a 0-d uint8 token (1 byte) that keeps AtomicIter's dependency in the
  graph; it is never read.
The learning rate is a 1-element float tensor (LearningRate writes a 0-d one).

Sparse updates walk the indices in order, so a repeated index updates its row twice,
the second time from the first result: the kernels apply ``indices_in_rounds`` one
after another (see placer/ops/scatter.py), exactly as the C++ loop does in place.

In place (``ENFORCED_INPLACE`` lists the input -> output pairs Caffe2 enforces; the
dense updates allow it and are written in place by Caffe2's optimizer): each kernel
declares the pairs it can update in place (``OpDef.inplace``). Every update is written
as arithmetic on state arrays in place; a kernel first takes each state array as it is
when the runner allows it (``args.inplace``, see placer/ops/registry.py), else a copy.
So a sparse update on a runner-owned table touches only the looked-up rows, and without
``args.inplace`` no input is ever written. The in-place forms do the same float
operations in the same order as ``p + update``, so both give the same bits.

Costs: flops per updated element as written in the formulas above (a sqrt or a divide
counts 1); bytes: a dense update reads and writes every state tensor once; a sparse
update reads the gradient rows and indices and reads and writes only the looked-up rows
of the parameter and its state (not the whole table).

Devices (REGISTER_CUDA_OPERATOR in torch 1.8.1: caffe2/sgd/momentum_sgd_op_gpu.cu,
adagrad_op_gpu.cu, adam_op_gpu.cu, iter_op_gpu.cc, learning_rate_op_gpu.cc,
caffe2/operators/utility_ops.cu): CUDA kernels exist for WeightedSum,
ScatterWeightedSum (w0 must be 1 there), MomentumSGDUpdate, SparseMomentumSGDUpdate,
Adagrad, SparseAdagrad, RowWiseSparseAdagrad, Adam and SparseAdam. RowWiseSparseAdam,
AtomicIter and CreateMutex are CPU only. Iter has a CUDA registration, but its counter
is a CPU tensor either way (as is the iteration LearningRate and Adam read), so Iter is
registered for the CPU only here. Adam and SparseAdam on a GPU read the counter from
host memory (``OpDef.host_inputs``), as Caffe2's CUDA kernels do.
"""
from __future__ import annotations

from math import prod
from typing import Sequence

from placer.errors import InputError
from placer.ops.elementwise import shape_error
from placer.ops.registry import OpDef, register
from placer.ops.scatter import indices_in_rounds
from placer.ops.segments import add_rows_at, id_counts
from placer.types import Args, OpFeatures, TensorType

CPU_ONLY = frozenset({"cpu"})

# The (input index, output index) pairs Caffe2 1.8.1's schemas enforce to be in place.
# MomentumSGDUpdate, Adagrad, Adam and WeightedSum only allow it (caffe2.python.optimizer
# still writes them in place: (0,0),(1,1),(3,2) / (0,0),(1,1) / (0,0),(1,1),(2,2) / (0,0)).
ENFORCED_INPLACE = {
    "SparseMomentumSGDUpdate": ((1, 1), (3, 2)),
    "ScatterWeightedSum": ((0, 0),),
    "SparseAdagrad": ((0, 0), (1, 1)),
    "RowWiseSparseAdagrad": ((0, 0), (1, 1)),
    "SparseAdam": ((0, 0), (1, 1), (2, 2)),
    "RowWiseSparseAdam": ((0, 0), (1, 1), (2, 2)),
    "Iter": ((0, 0),),
    "AtomicIter": ((1, 0),),
}



# ---------------------------------------------------------------- GPU launches
# Counted on the strict cupy stand-in (tests/cupy_standin.py). A sparse update that walks its
# indices in rounds (``checked_rounds``) launches a set-up (the index sorts, the range check
# with its one host read, the copies of the parameter and its state) and then one round's
# gathers, update and scatters per occurrence rank of its indices. The cost model cannot see
# the indices' values, so the declared count is one round (unique indices); each further
# time the most repeated index is listed adds ``round_launches``.
INDICES_AT = {"SparseMomentumSGDUpdate": 4, "SparseAdagrad": 2, "RowWiseSparseAdagrad": 2, "SparseAdam": 3}
_ROUNDS_SETUP_LAUNCHES = {"SparseMomentumSGDUpdate": 24, "SparseAdagrad": 24, "RowWiseSparseAdagrad": 24,
                          "SparseAdam": 25}


def round_launches(op_type: str, args: Args) -> int:
    """Launches of one round of a sparse update over distinct rows."""
    if op_type == "SparseMomentumSGDUpdate":
        return 14 if args.bool("nesterov", False) else 12
    if op_type == "SparseAdam":
        return 22
    decay = 2 if args.float("weight_decay", 0.0) else 0      # g + wd * p
    return (13 if op_type == "SparseAdagrad" else 14) + decay


def _rounds_launches(op_type: str):
    return lambda inputs, args: _ROUNDS_SETUP_LAUNCHES[op_type] + round_launches(op_type, args)


def _adagrad_launches(inputs, args: Args) -> int:
    """The update's eight ufuncs; a decay multiplies h, a weight decay adds wd * p to g."""
    return 8 + (args.float("decay", 1.0) != 1.0) + 2 * bool(args.float("weight_decay", 0.0))


# ---------------------------------------------------------------- shared checks and costs
def _scalar(args: Args, t: TensorType, index: int, name: str) -> None:
    if t.size != 1:
        raise shape_error(args, f"{name} must hold exactly one value", (index, name, t))


def _same_size(args: Args, a: TensorType, ia: int, na: str, b: TensorType, ib: int, nb: str) -> None:
    if a.size != b.size:
        raise shape_error(args, f"{na} and {nb} must have the same number of elements",
                          (ia, na, a), (ib, nb, b))


def _rows_of(args: Args, param: TensorType, grad: TensorType, indices: TensorType,
             ip: int, ig: int, ii: int) -> int:
    """Elements per row of ``param``, checking that ``grad`` has one such row per index."""
    if indices.dtype not in ("int32", "int64"):
        raise shape_error(args, "indices must be int32 or int64", (ii, "indices", indices))
    if param.ndim < 1:
        raise shape_error(args, "the parameter must have at least one dimension", (ip, "param", param))
    row = prod(param.shape[1:])
    if grad.size != indices.size * row:
        raise shape_error(args, f"the gradient needs one row of {row} values per index "
                          f"({indices.size} indices)", (ip, "param", param), (ig, "grad", grad),
                          (ii, "indices", indices))
    return row


def _dense_cost(flops_per_element: float):
    """Every input (parameter, state, gradient, lr, iter) is read once and every output
    written once; ``flops_per_element`` per parameter value."""
    def cost(inputs, outputs, args) -> OpFeatures:
        n = max(t.size for t in inputs)
        return OpFeatures(flops=float(flops_per_element * n), bytes_read=float(sum(t.nbytes for t in inputs)),
                          bytes_written=float(sum(t.nbytes for t in outputs)))
    return cost


def _sparse_cost(flops_per_element: float, grad_at: int, indices_at: int, param_at: int,
                 row_states: Sequence[int], rowwise_states: Sequence[int] = (), grad_out: bool = False):
    """A sparse update touches only the looked-up rows: it reads the gradient rows, the
    indices, and the looked-up rows of the parameter and of each state tensor
    (``rowwise_states`` hold one value per row), and writes those rows back."""
    def cost(inputs, outputs, args) -> OpFeatures:
        grad, indices, param = inputs[grad_at], inputs[indices_at], inputs[param_at]
        k = indices.size
        row_bytes = prod(param.shape[1:]) * param.itemsize
        touched = k * row_bytes * (1 + len(row_states)) + k * param.itemsize * len(rowwise_states)
        small = sum(t.nbytes for i, t in enumerate(inputs)
                    if i not in (grad_at, indices_at, param_at, *row_states, *rowwise_states))
        read = grad.nbytes + indices.nbytes + touched + small
        written = touched + (grad.nbytes if grad_out else 0)
        return OpFeatures(flops=float(flops_per_element * grad.size), bytes_read=float(read),
                          bytes_written=float(written))
    return cost


def _host_scalar(x) -> float:
    """The first value of ``x``: no read for a host array, one explicit read for a device one."""
    return float(x.reshape(-1)[:1].tolist()[0])


def _state(x, shape, writable: bool):
    """``x`` seen as ``shape``, to be updated in place: ``x``'s own memory when the runner
    allows it (a C-contiguous reshape is a view, on numpy and cupy), else a copy."""
    if writable and x.flags.c_contiguous:
        return x.reshape(shape), True
    return x.reshape(shape).copy(), False


def _result(x, updated, own: bool):
    """The output for state input ``x``: ``x`` itself when it was updated in place."""
    return x if own else updated.reshape(x.shape)


def _update_rows(table, flat, positions, update, *row_arrays):
    """Gather the rows ``flat[positions]`` (distinct within a round) of ``table`` and of
    each array of ``row_arrays``, let ``update`` change the gathered copies in place,
    and scatter them back: only the looked-up rows are read and written."""
    rows = flat[positions]
    gathered = [a[rows] for a in (table, *row_arrays)]
    extra = update(positions, *gathered)
    for a, g in zip((table, *row_arrays), gathered):
        a[rows] = g
    return extra


def _indices(xp, indices, rows: int, args: Args, op_type: str):
    """Flat indices, checked against the parameter's rows (one host round trip)."""
    flat = indices.reshape(-1)
    if flat.size:
        lo, hi = xp.stack([flat.min(), flat.max()]).tolist()
        if lo < 0 or hi >= rows:
            raise InputError(f"op {args.op}: {op_type} index {lo if lo < 0 else hi} is out of range "
                             f"for a parameter of {rows} rows")
    return flat


# ---------------------------------------------------------------- WeightedSum
def _weighted_sum_infer(inputs, args):
    if len(inputs) % 2:
        raise shape_error(args, f"needs (X, weight) pairs, found {len(inputs)} inputs")
    x0 = inputs[0]
    for i in range(0, len(inputs), 2):
        _scalar(args, inputs[i + 1], i + 1, f"weight_{i // 2}")
        if i:
            _same_size(args, x0, 0, "X_0", inputs[i], i, f"X_{i // 2}")
    return [x0]


def _weighted_sum_kernel(xp, inputs, args):
    x0 = inputs[0]
    out, own = _state(x0, x0.shape, 0 in args.inplace)
    out *= inputs[1].reshape(()).astype(x0.dtype)
    for i in range(2, len(inputs), 2):
        out += inputs[i].reshape(x0.shape) * inputs[i + 1].reshape(()).astype(x0.dtype)
    return (_result(x0, out, own),)


def _weighted_sum_cost(inputs, outputs, args) -> OpFeatures:
    pairs = len(inputs) // 2
    n = inputs[0].size
    return OpFeatures(flops=float(n * (2 * pairs - 1)), bytes_read=float(sum(t.nbytes for t in inputs)),
                      bytes_written=float(outputs[0].nbytes))


register(OpDef("WeightedSum", _weighted_sum_infer, _weighted_sum_kernel, cost=_weighted_sum_cost,
               min_inputs=2, inplace=((0, 0),), launches=lambda inputs, args: 3 * (len(inputs) // 2) - 1,   # per pair: cast, *, +=
               doc="w0*X0 + w1*X1 + ...; SGD's param update and weight decay"))


# ---------------------------------------------------------------- ScatterWeightedSum
def _scatter_weighted_sum_infer(inputs, args):
    if len(inputs) < 3 or len(inputs) % 2 == 0:
        raise shape_error(args, f"needs X0, w0, INDICES, then (X, weight) pairs; found {len(inputs)} inputs")
    x0, w0, indices = inputs[:3]
    _scalar(args, w0, 1, "weight_0")
    for i in range(3, len(inputs), 2):
        _rows_of(args, x0, inputs[i], indices, 0, i, 2)
        _scalar(args, inputs[i + 1], i + 1, f"weight_{(i - 1) // 2}")
    return [x0]


def _scatter_weighted_sum_kernel(xp, inputs, args):
    """As the C++: every listed row is first scaled by w0 once per time it is listed, then
    each w_b * X_b row is added to its row (repeated rows add up)."""
    x0, w0, indices = inputs[:3]
    flat = _indices(xp, indices, x0.shape[0], args, "ScatterWeightedSum")
    out, own = _state(x0, (x0.shape[0], -1), 0 in args.inplace)
    if flat.size == 0:
        return (_result(x0, out, own),)
    scale = xp.power(w0.reshape(()).astype(x0.dtype), id_counts(xp, flat).astype(x0.dtype))
    out[flat] = xp.take(out, flat, axis=0) * scale[:, None]   # a repeated row: equal writes
    row_shape = (flat.size, out.shape[1])
    update = inputs[3].reshape(row_shape) * inputs[4].reshape(()).astype(x0.dtype)
    for i in range(5, len(inputs), 2):
        update = update + inputs[i].reshape(row_shape) * inputs[i + 1].reshape(()).astype(x0.dtype)
    return (_result(x0, add_rows_at(xp, out, flat, update, inplace=True), own),)


register(OpDef("ScatterWeightedSum", _scatter_weighted_sum_infer, _scatter_weighted_sum_kernel,
               cost=_sparse_cost(3.0, 3, 2, 0, ()), min_inputs=5, inplace=((0, 0),),
               launches=lambda inputs, args: 15 + 3 * ((len(inputs) - 3) // 2),
               doc="X0[INDICES] = w0*X0[INDICES] + sum_b w_b*X_b, in place on X0 (sparse SGD)"))


# ---------------------------------------------------------------- momentum SGD
def _momentum_update(xp, g, m, p, lr, args: Args):
    """Caffe2's momentum_sgd_update on ``m`` and ``p`` in place; returns the adjusted
    gradient (a new array): m' = mu*m + lr*g; g' = m' or (1+mu)*m' - mu*m; p -= g'."""
    mu = args.float("momentum", 0.0)
    old = m * mu
    xp.add(old, g * lr, out=m)
    adjusted = m * (1 + mu) - old if args.bool("nesterov", False) else m.copy()
    p -= adjusted
    return adjusted


def _momentum_infer(inputs, args):
    g, m, lr, p = inputs
    _same_size(args, g, 0, "grad", m, 1, "moment")
    _same_size(args, g, 0, "grad", p, 3, "param")
    _scalar(args, lr, 2, "lr")
    return [g, m, p]


def _momentum_kernel(xp, inputs, args):
    g, m, lr, p = inputs
    lr = lr.reshape(()).astype(g.dtype)
    new_m, own_m = _state(m, g.shape, 1 in args.inplace)
    new_p, own_p = _state(p, g.shape, 3 in args.inplace)
    adjusted = _momentum_update(xp, g, new_m, new_p, lr, args)
    if 0 in args.inplace and g.flags.c_contiguous:
        xp.copyto(g, adjusted)
        adjusted = g
    return adjusted, _result(m, new_m, own_m), _result(p, new_p, own_p)


def _sparse_momentum_infer(inputs, args):
    g, m, lr, p, indices = inputs
    _same_size(args, m, 1, "moment", p, 3, "param")
    _scalar(args, lr, 2, "lr")
    _rows_of(args, p, g, indices, 3, 0, 4)
    return [g, m, p]


def _sparse_momentum_kernel(xp, inputs, args):
    g, m, lr, p, indices = inputs
    flat, rounds = indices_in_rounds(xp, indices, p.shape[0], f"op {args.op}: SparseMomentumSGDUpdate")
    lr = lr.reshape(()).astype(g.dtype)
    row_shape = (flat.size,) + tuple(p.shape[1:])
    grad_rows = g.reshape(row_shape)
    new_g = xp.empty_like(grad_rows)
    new_m, own_m = _state(m, p.shape, 1 in args.inplace)
    new_p, own_p = _state(p, p.shape, 3 in args.inplace)

    def update(positions, p_rows, m_rows):
        new_g[positions] = _momentum_update(xp, grad_rows[positions], m_rows, p_rows, lr, args)

    for positions in rounds:
        _update_rows(new_p, flat, positions, update, new_m)
    return new_g.reshape(g.shape), _result(m, new_m, own_m), _result(p, new_p, own_p)


register(OpDef("MomentumSGDUpdate", _momentum_infer, _momentum_kernel, cost=_dense_cost(4.0),
               min_inputs=4, max_inputs=4, inplace=((0, 0), (1, 1), (3, 2)), launches=lambda inputs, args: 8 if args.bool("nesterov", False) else 6,
               doc="(grad, moment, lr, param) -> (grad', moment', param): momentum / nesterov SGD, in place"))
register(OpDef("SparseMomentumSGDUpdate", _sparse_momentum_infer, _sparse_momentum_kernel,
               cost=_sparse_cost(4.0, 0, 4, 3, (1,), grad_out=True), min_inputs=5, max_inputs=5,
               inplace=((1, 1), (3, 2)),
               launches=_rounds_launches("SparseMomentumSGDUpdate"),
               doc="momentum SGD on the rows INDICES: (grad, moment, lr, param, indices) -> (grad', moment', param)"))


# ---------------------------------------------------------------- Adagrad
def _adagrad_update(xp, p, h, g, lr, args: Args, decay: float = 1.0):
    """Caffe2's adagrad_update on ``p`` and ``h`` in place; returns (effective lr, update):
    g += wd*p; h = decay*h + g^2; p += lr*g/(sqrt(h)+eps)."""
    eps = p.dtype.type(args.float("epsilon", 1e-5))
    wd = args.float("weight_decay", 0.0)
    if wd:
        g = g + p * p.dtype.type(wd)
    if decay != 1.0:
        h *= p.dtype.type(decay)
    h += g * g
    effective = lr / (xp.sqrt(h) + eps)
    update = effective * g
    p += update
    return effective, update


def _adagrad_infer(inputs, args):
    p, h, g, lr = inputs
    _same_size(args, g, 2, "grad", h, 1, "moment")
    _same_size(args, g, 2, "grad", p, 0, "param")
    _scalar(args, lr, 3, "lr")
    n = args.n_outputs or 2
    return [p, h, g, g][:max(n, 2)]


def _adagrad_kernel(xp, inputs, args):
    p, h, g, lr = inputs
    lr = lr.reshape(()).astype(p.dtype)
    new_p, own_p = _state(p, p.shape, 0 in args.inplace)
    new_h, own_h = _state(h, p.shape, 1 in args.inplace)
    effective, update = _adagrad_update(xp, new_p, new_h, g.reshape(p.shape), lr, args,
                                        args.float("decay", 1.0))
    outs = (_result(p, new_p, own_p), _result(h, new_h, own_h), effective.reshape(g.shape),
            update.reshape(g.shape))
    return outs[:max(args.n_outputs or 2, 2)]


def _sparse_adagrad_infer(rowwise: bool):
    def infer(inputs, args):
        p, h, indices, g, lr = inputs
        _scalar(args, lr, 4, "lr")
        _rows_of(args, p, g, indices, 0, 3, 2)
        want = p.shape[0] if rowwise else p.size
        if h.size != want:
            raise shape_error(args, f"the moment needs {want} values "
                              f"({'one per row' if rowwise else 'one per parameter value'})",
                              (0, "param", p), (1, "moment", h))
        return [p, h]
    return infer


def _sparse_adagrad_kernel(rowwise: bool):
    def kernel(xp, inputs, args):
        p, h, indices, g, lr = inputs
        if not rowwise and args.float("decay", 1.0) != 1.0:
            raise InputError(f"op {args.op}: SparseAdagrad does not support decay != 1 (Caffe2 refuses it)")
        flat, rounds = indices_in_rounds(xp, indices, p.shape[0], f"op {args.op}: SparseAdagrad")
        lr = lr.reshape(()).astype(p.dtype)
        grad_rows = g.reshape((flat.size,) + tuple(p.shape[1:]))
        new_p, own_p = _state(p, p.shape, 0 in args.inplace)
        new_h, own_h = _state(h, (p.shape[0],) if rowwise else p.shape, 1 in args.inplace)

        def update(positions, p_rows, h_rows):
            if rowwise:
                _rowwise_adagrad_update(xp, p_rows, h_rows, grad_rows[positions], lr, args)
            else:
                _adagrad_update(xp, p_rows, h_rows, grad_rows[positions], lr, args)

        for positions in rounds:
            _update_rows(new_p, flat, positions, update, new_h)
        return _result(p, new_p, own_p), _result(h, new_h, own_h)
    return kernel


def _rowwise_adagrad_update(xp, p_rows, h_rows, g_rows, lr, args: Args) -> None:
    """One moment per row, in place: h += mean over the row of g^2; p += lr*g/(sqrt(h)+eps)."""
    eps = p_rows.dtype.type(args.float("epsilon", 1e-5))
    wd = args.float("weight_decay", 0.0)
    g = g_rows + p_rows * p_rows.dtype.type(wd) if wd else g_rows
    flat_g = g.reshape(g.shape[0], -1)
    h_rows += (flat_g * flat_g).mean(axis=1, dtype=p_rows.dtype)
    step = lr / (xp.sqrt(h_rows) + eps)
    p_rows += g * step.reshape((-1,) + (1,) * (g.ndim - 1))


register(OpDef("Adagrad", _adagrad_infer, _adagrad_kernel, cost=_dense_cost(6.0),
               min_inputs=4, max_inputs=4, inplace=((0, 0), (1, 1)), launches=_adagrad_launches,
               doc="(param, moment, grad, lr) -> (param, moment[, effective_lr[, update]]), in place"))
register(OpDef("SparseAdagrad", _sparse_adagrad_infer(False), _sparse_adagrad_kernel(False),
               cost=_sparse_cost(6.0, 3, 2, 0, (1,)), min_inputs=5, max_inputs=5, inplace=((0, 0), (1, 1)),
               launches=_rounds_launches("SparseAdagrad"),
               doc="Adagrad on the rows INDICES: (param, moment, indices, grad, lr) -> (param, moment)"))
register(OpDef("RowWiseSparseAdagrad", _sparse_adagrad_infer(True), _sparse_adagrad_kernel(True),
               cost=_sparse_cost(5.0, 3, 2, 0, (), (1,)), min_inputs=5, max_inputs=5, inplace=((0, 0), (1, 1)),
               launches=_rounds_launches("RowWiseSparseAdagrad"),
               doc="Adagrad with one moment per row (mean of g^2 over the row) on the rows INDICES"))


# ---------------------------------------------------------------- Adam
def _adam_correction(args: Args, iteration: int) -> float:
    t = iteration + 1
    b1, b2 = args.float("beta1", 0.9), args.float("beta2", 0.999)
    return (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)


def _adam_update(xp, p, m1, m2, g, lr, correction, args: Args, rowwise: bool = False):
    """Caffe2's adam_compute on ``p``, ``m1``, ``m2`` in place; returns the effective
    gradient: m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g^2 (its row mean when rowwise);
    p += lr * correction * m1 / (sqrt(m2) + eps)."""
    dt = p.dtype.type
    b1, b2 = dt(args.float("beta1", 0.9)), dt(args.float("beta2", 0.999))
    eps = dt(args.float("epsilon", 1e-5))
    m1 *= b1
    m1 += g * (1 - b1)
    m2 *= b2
    if rowwise:
        flat_g = g.reshape(g.shape[0], -1)
        m2 += (flat_g * flat_g).mean(axis=1, dtype=p.dtype) * (1 - b2)
        root = xp.sqrt(m2).reshape((-1,) + (1,) * (g.ndim - 1))
    else:
        m2 += g * g * (1 - b2)
        root = xp.sqrt(m2)
    effective = m1 * dt(correction) / (root + eps)
    p += lr * effective
    return effective


def _adam_infer(inputs, args):
    p, m1, m2, g, lr, it = inputs
    for i, (t, name) in enumerate(((m1, "moment_1"), (m2, "moment_2"), (g, "grad")), 1):
        _same_size(args, p, 0, "param", t, i if name != "grad" else 3, name)
    _scalar(args, lr, 4, "lr")
    _scalar(args, it, 5, "iter")
    return [p, m1, m2, g][:max(args.n_outputs or 3, 3)]


def _adam_kernel(xp, inputs, args):
    p, m1, m2, g, lr, it = inputs
    correction = _adam_correction(args, int(_host_scalar(it)))
    lr = lr.reshape(()).astype(p.dtype)
    (new_p, own_p), (new_m1, own_1), (new_m2, own_2) = (
        _state(x, p.shape, i in args.inplace) for i, x in enumerate((p, m1, m2)))
    effective = _adam_update(xp, new_p, new_m1, new_m2, g.reshape(p.shape), lr, correction, args)
    outs = (_result(p, new_p, own_p), _result(m1, new_m1, own_1), _result(m2, new_m2, own_2),
            effective.reshape(g.shape))
    return outs[:max(args.n_outputs or 3, 3)]


def _sparse_adam_infer(rowwise: bool):
    def infer(inputs, args):
        p, m1, m2, indices, g, lr, it = inputs
        _same_size(args, p, 0, "param", m1, 1, "moment_1")
        want = p.shape[0] if rowwise else p.size
        if m2.size != want:
            raise shape_error(args, f"moment_2 needs {want} values", (0, "param", p), (2, "moment_2", m2))
        _rows_of(args, p, g, indices, 0, 4, 3)
        _scalar(args, lr, 5, "lr")
        _scalar(args, it, 6, "iter")
        return [p, m1, m2, g][:max(args.n_outputs or 3, 3)]
    return infer


def _sparse_adam_kernel(rowwise: bool):
    def kernel(xp, inputs, args):
        p, m1, m2, indices, g, lr, it = inputs
        if args.bool("enableRAdam", False):
            raise InputError(f"op {args.op}: SparseAdam with enableRAdam=1 is not supported")
        flat, rounds = indices_in_rounds(xp, indices, p.shape[0], f"op {args.op}: SparseAdam")
        correction = _adam_correction(args, int(_host_scalar(it)))
        lr = lr.reshape(()).astype(p.dtype)
        grad_rows = g.reshape((flat.size,) + tuple(p.shape[1:]))
        new_p, own_p = _state(p, p.shape, 0 in args.inplace)
        new_m1, own_1 = _state(m1, p.shape, 1 in args.inplace)
        new_m2, own_2 = _state(m2, (p.shape[0],) if rowwise else p.shape, 2 in args.inplace)
        effective = xp.empty_like(grad_rows)

        def update(positions, p_rows, m1_rows, m2_rows):
            effective[positions] = _adam_update(xp, p_rows, m1_rows, m2_rows, grad_rows[positions], lr,
                                                correction, args, rowwise)

        for positions in rounds:
            _update_rows(new_p, flat, positions, update, new_m1, new_m2)
        outs = (_result(p, new_p, own_p), _result(m1, new_m1, own_1), _result(m2, new_m2, own_2),
                effective.reshape(g.shape))
        return outs[:max(args.n_outputs or 3, 3)]
    return kernel


register(OpDef("Adam", _adam_infer, _adam_kernel, cost=_dense_cost(10.0), min_inputs=6, max_inputs=6, launches=14,
               host_inputs=(5,), inplace=((0, 0), (1, 1), (2, 2)),
               doc="(param, m1, m2, grad, lr, iter) -> (param, m1, m2[, effective grad]), t = iter+1, in place"))
register(OpDef("SparseAdam", _sparse_adam_infer(False), _sparse_adam_kernel(False),
               cost=_sparse_cost(10.0, 4, 3, 0, (1, 2)), min_inputs=7, max_inputs=7,
               host_inputs=(6,), inplace=((0, 0), (1, 1), (2, 2)),
               launches=_rounds_launches("SparseAdam"),
               doc="Adam on the rows INDICES: (param, m1, m2, indices, grad, lr, iter)"))
register(OpDef("RowWiseSparseAdam", _sparse_adam_infer(True), _sparse_adam_kernel(True),
               cost=_sparse_cost(9.0, 4, 3, 0, (1,), (2,)), devices=CPU_ONLY, min_inputs=7, max_inputs=7,
               host_inputs=(6,), inplace=((0, 0), (1, 1), (2, 2)),
               doc="Adam with one second moment per row on the rows INDICES. CPU only, as in Caffe2."))


# ---------------------------------------------------------------- iteration counters, mutex
def _counter_type(args: Args, t: TensorType, index: int) -> None:
    if t.size != 1 or t.dtype != "int64":
        raise shape_error(args, "the iteration counter must be a 1-element int64 tensor", (index, "iter", t))


def _iter_infer(inputs, args):
    if inputs:
        _counter_type(args, inputs[0], 0)
        return [inputs[0]]
    return [TensorType((1,), "int64")]


def _iter_kernel(xp, inputs, args):
    if not inputs:
        return (xp.ones((1,), dtype=xp.int64),)   # a fresh counter: 0, incremented once
    return (inputs[0] + 1,)


def _atomic_iter_infer(inputs, args):
    _counter_type(args, inputs[1], 1)
    return [inputs[1]]


def _counter_cost(inputs, outputs, args) -> OpFeatures:
    return OpFeatures(flops=1.0, bytes_read=8.0 if inputs else 0.0, bytes_written=8.0)


register(OpDef("Iter", _iter_infer, _iter_kernel, cost=_counter_cost, devices=CPU_ONLY,
               min_inputs=0, max_inputs=1, doc="ITER -> ITER + 1 (int64 [1] counter, in place, on the CPU)"))
register(OpDef("AtomicIter", _atomic_iter_infer, lambda xp, inputs, args: (inputs[1] + 1,),
               cost=_counter_cost, devices=CPU_ONLY, min_inputs=2, max_inputs=2,
               doc="(mutex, ITER) -> ITER + 1 under the mutex (in place, CPU only)"))
register(OpDef("CreateMutex", lambda inputs, args: [TensorType((), "uint8")],
               lambda xp, inputs, args: (xp.zeros((), dtype=xp.uint8),),
               cost=lambda i, o, a: OpFeatures(bytes_written=1.0), devices=CPU_ONLY,
               min_inputs=0, max_inputs=0,
               doc="a mutex blob for AtomicIter: a 0-d uint8 token (CPU only)"))
