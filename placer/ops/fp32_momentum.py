"""Op family 'fp32_momentum': FP32MomentumSGDUpdate, Caffe2's momentum SGD fused with weight
decay (caffe2/sgd/fp32_momentum_sgd_op.cu and fp32_momentum_sgd_op.h, torch 1.8.1).

Caffe2 has a CUDA kernel only: REGISTER_CUDA_OPERATOR in the .cu, where its schema lives too,
so a CPU build of Caffe2 does not know the op (``caffe2_devices={"gpu"}``; placer's kernel
runs on both).

(grad, momentum, lr, param) -> (grad', momentum', param'). Every tensor is float32 despite
the name (FP32MomentumSGDUpdateOp<float, CUDAContext>); lr holds one value, read on the
device. Arguments: momentum (default 0.0), weight_decay (0.0), nesterov (0), each a float32
in the kernel. Per element, with fma(a, b, c) = a*b + c rounded once (__fmaf_rn) and every
other operation rounded to float32:

    g  = fma(weight_decay, param, grad)
    mm = momentum * momentum_in
    nesterov=0:  m' = fma(lr, g, mm);  grad' = m';                      param' = param - m'
    nesterov=1:  m' = fma(lr, g, mm);  grad' = fma(m', momentum, m') - mm;  param' = param - grad'

The CUDA kernel walks the tensors as float2 pairs, N / 2 of them: with an odd N the last value
is never touched. caffe2.python.optimizer (FP16SgdOptimizer with fp32_update) writes the op
in place, [grad, momentum, lr, param] -> [grad, momentum, param] ((0,0), (1,1), (3,2); the
kernel reads param through its param output, which the op never resizes, so param must be in
place), so that value keeps its old grad, momentum and param: placer's outputs do the same.

Each fma is computed in float64: the product of two float32 values is exact there, and the
sum is rounded to float64 and then to float32. That is the correctly rounded fma except when
the float64 rounding lands exactly on a float32 halfway point (double rounding, rare); the
tests compare with an exact fma (tests/test_ops_logical.py).

Cost: 6 flops per element (two fmas, a multiply, a subtract), 9 with nesterov; every input
read once and every output written once.
"""
from __future__ import annotations

import numpy as np

from placer.ops.elementwise import shape_error
from placer.ops.registry import OpDef, io_bytes, register
from placer.types import Args, OpFeatures, TensorType

GPU_ONLY = frozenset({"gpu"})


def _float32_arg(args: Args, name: str) -> float:
    """An argument as the kernel holds it: a float32 (GetSingleArgument<float>)."""
    return float(np.float32(args.float(name, 0.0)))


def _infer(inputs, args):
    g, m, lr, p = inputs
    for i, (name, t) in enumerate(zip(("grad", "momentum", "lr", "param"), inputs)):
        if t.dtype != "float32":
            raise shape_error(args, f"{name} is {t.dtype}; FP32MomentumSGDUpdate takes float32 tensors "
                              "(FP32MomentumSGDUpdateOp<float>)", (i, name, t))
    if m.size != g.size:
        raise shape_error(args, "grad and momentum must have the same number of elements",
                          (0, "grad", g), (1, "momentum", m))
    if p.size != g.size:
        raise shape_error(args, "param must have grad's number of elements (the kernel reads one "
                          "param value per grad value)", (0, "grad", g), (3, "param", p))
    if lr.size != 1:
        raise shape_error(args, "lr must hold exactly one value", (2, "lr", lr))
    return [TensorType(g.shape, g.dtype), TensorType(m.shape, m.dtype), TensorType(p.shape, p.dtype)]


def _fma_into(xp, a, b, c, work, dest) -> None:
    """dest = float32(a * b + c) through float64 (``work``: a float64 array shaped like ``a``)."""
    xp.multiply(a, b, out=work, dtype=xp.float64)    # exact: 24-bit by 24-bit significands
    xp.add(work, c, out=work)                         # rounded once to float64
    dest[...] = work                                  # and once to float32


def _destination(xp, x, n_even: int, own: bool):
    """(output array, the view of its first ``n_even`` values the update writes): ``x``
    itself when the runner allows it, else a new array whose odd last value is ``x``'s."""
    if own and x.flags.c_contiguous:
        return x, x.reshape(-1)[:n_even]
    out = xp.empty(x.shape, dtype=xp.float32)
    flat = out.reshape(-1)
    if n_even < x.size:
        flat[n_even:] = x.reshape(-1)[n_even:]
    return out, flat[:n_even]


def _kernel(xp, inputs, args):
    g, m, lr, p = inputs
    n_even = g.size - g.size % 2
    mu = _float32_arg(args, "momentum")
    wd = _float32_arg(args, "weight_decay")
    gf, mf, pf = (x.reshape(-1)[:n_even] for x in (g, m, p))
    (g_out, g_new), (m_out, m_new), (p_out, p_new) = (
        _destination(xp, x, n_even, i in args.inplace) for i, x in ((0, g), (1, m), (3, p)))
    work = xp.empty(n_even, dtype=xp.float64)
    grad = xp.empty(n_even, dtype=xp.float32)
    _fma_into(xp, pf, wd, gf, work, grad)              # grad + weight_decay * param
    mm = mf * mu                                       # read before m is written
    _fma_into(xp, grad, lr.reshape(()), mm, work, m_new)
    if args.bool("nesterov", False):
        _fma_into(xp, m_new, mu, m_new, work, g_new)
        xp.subtract(g_new, mm, out=g_new)
    else:
        g_new[...] = m_new
    xp.subtract(pf, g_new, out=p_new)
    return g_out, m_out, p_out


def _launches(inputs, args) -> int:
    """Three per fma (multiply, add, rounding), the momentum product, grad' (a copy, or the
    nesterov subtraction), the param subtraction; with an odd count and no update in place,
    each output's last value is copied from its input."""
    n = inputs[0].size
    body = 12 if args.bool("nesterov", False) else 9
    return body + (3 if n % 2 and not args.inplace else 0)


def _cost(inputs, outputs, args) -> OpFeatures:
    read, written = io_bytes(inputs, outputs)
    per_element = 9.0 if args.bool("nesterov", False) else 6.0
    return OpFeatures(flops=per_element * inputs[0].size, bytes_read=read, bytes_written=written)


def _scratch(inputs, outputs, args) -> float:
    """Temporaries beyond the outputs: the float64 work array (8 bytes a value), the
    weight-decayed gradient and momentum * m (4 each), and numpy's casting buffers of 8192
    values for the float32 -> float64 multiplies."""
    return 16.0 * inputs[0].size + 2 * 8192 * 8


register(OpDef("FP32MomentumSGDUpdate", _infer, _kernel, cost=_cost, min_inputs=4, max_inputs=4,
               caffe2_devices=GPU_ONLY, inplace=((0, 0), (1, 1), (3, 2)), launches=_launches, scratch=_scratch,
               doc="(grad, momentum, lr, param) -> (grad', momentum', param): momentum SGD with "
                   "weight decay, fused (CUDA only in Caffe2)"))
