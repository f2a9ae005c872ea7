"""LearningRate(ITER) -> base_lr * multiplier(iter): every policy of torch 1.8.1's Caffe2.

The multipliers are caffe2/sgd/learning_rate_functors.h, with the argument names and
defaults of learning_rate_op.h (iter is the int64 counter's value; ``/`` between integers
truncates, as in C++):

  fixed                 1
  step                  gamma ^ (iter / stepsize)
  exp                   gamma ^ iter
  inv                   (1 + gamma * iter) ^ -power
  poly                  (1 - iter / max_iter) ^ power
  alter                 1 during active_period, 0 during inactive_period (active_first)
  hill                  linearWarmup over num_iter, then max(end_multiplier, inv(iter - num_iter))
  slope                 multiplier_1 before num_iter_1, then a line to multiplier_2 at
                        num_iter_2, never below multiplier_2
  gate                  multiplier_1 before num_iter, multiplier_2 after
  linearWarmup          start_multiplier + (1 - start_multiplier) * iter / num_iter, then 1
  constantWarmup        multiplier before num_iter, then 1
  pieceWarmup           m1 before n1, m2 before n2, then m3
  constantThenLinearWarmup  start_warmup_multiplier for constant_warmup_num_iter, then a
                        linear warmup over linear_warmup_num_iter, then 1
  cyclical              triangular cycles between base_lr and max_lr over 2*stepsize,
                        amplitude decayed by decay per cycle
  cosine                SGDR: min_lr + (max_lr - min_lr)/2 * (1 + cos(pi * t_cur / t_i)),
                        periods growing by t_mult, both bounds shrunk by lr_shrink per period
  compositeCyclical / compositeCosine   constantThenLinearWarmup, then cyclical / cosine
  composite             sub-policies (``sub_policy_<i>_policy`` and their arguments prefixed
                        ``sub_policy_<i>_``, scaled by ``sub_policy_<i>_lr_scale``) for
                        ``sub_policy_num_iters[i]`` iterations each, counted from iter 1;
                        each sub-policy sees the global iter
(``cyclical`` and its composite read ``max_lr``/``cyclical_max_lr`` relative to base_lr.)

The output is a 0-d float32 tensor (Caffe2 resizes it to no dims), computed on the host
in float32 like the C++ (T = float) and moved to the op's device. The counter is read on
the host: Caffe2 reads it from a CPU tensor on every device (``host_inputs``), so a GPU
LearningRate takes it from host memory. Cost: a handful of scalar
flops; it is the launch that costs. Devices: CPU and CUDA (learning_rate_op_gpu.cc).
"""
from __future__ import annotations

import math

import numpy as np

from placer.errors import ArgumentError
from placer.ops.elementwise import shape_error
from placer.ops.registry import OpDef, register
from placer.types import Args, OpFeatures, TensorType

F32 = np.float32


class _Prefixed:
    """The op's arguments seen through a prefix (composite sub-policies)."""

    def __init__(self, args: Args, prefix: str = ""):
        self.args, self.prefix = args, prefix

    def float(self, name: str, default: float) -> float:
        return self.args.float(self.prefix + name, default)

    def int(self, name: str, default: int) -> int:
        return self.args.int(self.prefix + name, default)

    def bool(self, name: str, default: bool) -> bool:
        return self.args.bool(self.prefix + name, default)


def _c_div(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _linear_warmup(it: int, start: float, num_iter: int) -> float:
    if it >= num_iter:
        return 1.0
    return F32(start) + F32(1.0 - F32(start)) * F32(it) / F32(num_iter)


def _inv(it: int, gamma: float, power: float) -> float:
    return F32(F32(1) + F32(gamma) * F32(it)) ** F32(-power)


def _constant_then_linear(it: int, start: float, constant_iters: int, linear_iters: int) -> float:
    if it < constant_iters:
        return F32(start)
    if it < constant_iters + linear_iters:
        return _linear_warmup(it - constant_iters, start, linear_iters)
    return 1.0


def _cyclical(it: int, base_lr: float, max_lr: float, stepsize: int, decay: float) -> float:
    cycle = it // (2 * stepsize) + 1
    x = abs(F32(it) / F32(stepsize) - 2 * cycle + 1)
    return 1 + (F32(abs(max_lr)) / F32(abs(base_lr)) - 1) * max(F32(0.0), F32(1 - x)) \
        * F32(decay) ** (it // (2 * stepsize))


def _cosine(it: int, min_lr: float, max_lr: float, period: int, t_mult: float, shrink: float) -> float:
    if t_mult != 1.0:
        i = math.floor(math.log(1 - it / period * (1.0 - t_mult)) / math.log(t_mult))
        t_i = t_mult ** i * period
        t_curr = it - (1.0 - t_mult ** i) / (1.0 - t_mult) * period
    else:
        i = math.floor(it / period)
        t_i = period
        t_curr = it - t_i * i
    scale = shrink ** i
    lo, hi = min_lr * scale, max_lr * scale
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * t_curr / t_i))


def multiplier(policy: str, it: int, a: _Prefixed, base_lr: float) -> float:
    """Caffe2's LearningRateFunctor for ``policy`` at iteration ``it``."""
    if policy == "fixed":
        return 1.0
    if policy == "step":
        return F32(a.float("gamma", 0)) ** F32(_c_div(it, a.int("stepsize", 0)))
    if policy == "exp":
        return F32(a.float("gamma", 0)) ** F32(it)
    if policy == "inv":
        return _inv(it, a.float("gamma", 0), a.float("power", 0))
    if policy == "poly":
        return F32(1 - F32(it) / F32(a.int("max_iter", -1))) ** F32(a.float("power", 0))
    if policy == "alter":
        active, inactive = a.int("active_period", -1), a.int("inactive_period", -1)
        first = a.bool("active_first", True)
        inside = it % (active + inactive) < (active if first else inactive)
        return float(inside == first)
    if policy == "hill":
        n = a.int("num_iter", 0)
        if it < n:
            return _linear_warmup(it, a.float("start_multiplier", 0.0), n)
        return max(F32(a.float("end_multiplier", 0)), _inv(it - n, a.float("gamma", 0), a.float("power", 0)))
    if policy == "slope":
        n1, m1 = a.int("num_iter_1", 0), F32(a.float("multiplier_1", 0.0))
        n2, m2 = a.int("num_iter_2", 0), F32(a.float("multiplier_2", 0.0))
        return m1 if it < n1 else max(m2, m1 + (it - n1) * (m2 - m1) / F32(n2 - n1))
    if policy == "gate":
        return a.float("multiplier_2", 1) if it >= a.int("num_iter", 0) else a.float("multiplier_1", 1)
    if policy == "linearWarmup":
        return _linear_warmup(it, a.float("start_multiplier", 0.0), a.int("num_iter", 0))
    if policy == "constantWarmup":
        return 1.0 if it >= a.int("num_iter", 0) else a.float("multiplier", 0.5)
    if policy == "pieceWarmup":
        if it < a.int("n1", 0):
            return a.float("m1", 0.5)
        return a.float("m2", 0.5) if it < a.int("n2", 0) else a.float("m3", 0.5)
    if policy == "constantThenLinearWarmup":
        return _constant_then_linear(it, *_warmup_args(a))
    if policy == "cyclical":
        return _cyclical(it, base_lr, a.float("max_lr", 0.005), a.int("stepsize", 0), a.float("decay", 1.0))
    if policy == "cosine":
        return _cosine(it, a.float("min_lr", 0.1), a.float("max_lr", 0.5), a.int("period", 50),
                       a.float("t_mult", 1.0), a.float("lr_shrink", 0.99))
    if policy == "compositeCyclical":
        warm = _warmup_args(a)
        if it < warm[1] + warm[2]:
            return _constant_then_linear(it, *warm)
        return _cyclical(it - warm[1] - warm[2], base_lr, a.float("cyclical_max_lr", 0.05),
                         a.int("cyclical_step_size", 1000000), a.float("cyclical_decay", 1.0))
    if policy == "compositeCosine":
        warm = _warmup_args(a)
        if it < warm[1] + warm[2]:
            return _constant_then_linear(it, *warm)
        return _cosine(it - warm[1] - warm[2], a.float("cosine_min_lr", 0.1), a.float("cosine_max_lr", 0.5),
                       a.int("cosine_period", 50), a.float("cosine_t_mult", 1.0),
                       a.float("cosine_lr_shrink", 0.99))
    if policy == "composite":
        return _composite(it, a.args, base_lr)
    raise ArgumentError(f"op {a.args.op}: unknown learning rate policy {policy!r}",
                        hint="one of " + ", ".join(POLICIES))


def _warmup_args(a: _Prefixed) -> tuple[float, int, int]:
    return (a.float("start_warmup_multiplier", 0.1), a.int("constant_warmup_num_iter", 10000000),
            a.int("linear_warmup_num_iter", 10000000))


def _composite(it: int, args: Args, base_lr: float) -> float:
    """The sub-policy whose span (from iter 1) holds ``it``; the last one past the end."""
    spans = args.ints("sub_policy_num_iters", [])
    if not spans or any(n <= 0 for n in spans):
        raise ArgumentError(f"op {args.op}: composite policy needs positive sub_policy_num_iters, "
                            f"found {spans}")
    start, chosen = 1, 0
    for i, n in enumerate(spans):
        if it >= start:
            chosen = i
        start += n
    prefix = f"sub_policy_{chosen}_"
    sub = args.str(prefix + "policy", "")
    if sub == "composite":
        raise ArgumentError(f"op {args.op}: a composite policy cannot nest another composite one")
    scale = F32(args.float(prefix + "lr_scale", 1.0))
    return multiplier(sub, it, _Prefixed(args, prefix), base_lr) * scale


POLICIES = ("fixed", "step", "exp", "inv", "poly", "alter", "hill", "slope", "gate", "linearWarmup",
            "constantWarmup", "pieceWarmup", "constantThenLinearWarmup", "cyclical", "cosine",
            "compositeCyclical", "compositeCosine", "composite")


def learning_rate(args: Args, iteration: int) -> np.float32:
    """base_lr times the policy's multiplier, as a float32."""
    if "base_lr" not in args:
        raise ArgumentError(f"op {args.op}: LearningRate needs base_lr")
    policy = args.str("policy", "")
    if not policy:
        raise ArgumentError(f"op {args.op}: LearningRate needs a policy", hint="one of " + ", ".join(POLICIES))
    base_lr = args.float("base_lr")
    return F32(F32(base_lr) * F32(multiplier(policy, iteration, _Prefixed(args), base_lr)))


def _infer(inputs, args):
    it = inputs[0]
    if it.size != 1 or it.dtype != "int64":
        raise shape_error(args, "the iteration counter must be a 1-element int64 tensor", (0, "iter", it))
    if args.str("policy", "") not in POLICIES:
        raise ArgumentError(f"op {args.op}: unknown learning rate policy {args.str('policy', '')!r}",
                            hint="one of " + ", ".join(POLICIES))
    return [TensorType((), "float32")]


def _kernel(xp, inputs, args):
    iteration = int(inputs[0].reshape(-1)[:1].tolist()[0])   # explicit: a device counter is one read
    return (xp.asarray(learning_rate(args, iteration), dtype=xp.float32),)


register(OpDef("LearningRate", _infer, _kernel,
               cost=lambda i, o, a: OpFeatures(flops=10.0, bytes_read=8.0, bytes_written=4.0),
               min_inputs=1, max_inputs=1, host_inputs=(0,),
               doc="base_lr * policy multiplier at the iteration counter's value (0-d float32)"))
