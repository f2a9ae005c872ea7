"""Loss scaling for mixed-precision train nets, as ops in the net.

Small gradients underflow float16 (its smallest normal is 6.1e-5, its smallest subnormal
6e-8). Loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section
3.2) computes the gradients of S * loss instead, then divides them by S where they are
float32 again, before the update.

Both kinds scale the backward pass's seed, not the loss: the ``ConstantFill(loss) ->
loss_autogen_grad`` that starts the backward pass fills S instead of 1 (static) or is
multiplied by the ``loss_scale`` blob (dynamic). The same gradients as those of a
scaled loss, and the loss blob keeps its value.

- **static** (``--loss-scale S``): the seed is S; each gradient is divided by S (``Scale``,
  scale 1/S) where the optimizer reads it in float32; weight decay added to the
  still-scaled gradient is multiplied by S (``optimizers.WeightDecayBuilder``).
- **dynamic** (``--loss-scale dynamic``), the scheme of PyTorch's ``GradScaler`` and
  NVIDIA's Apex: ``loss_scale`` starts at ``init_scale`` (2**16); a step whose gradients
  hold an inf or a NaN is skipped (no parameter and no optimizer state moves; the
  iteration counter still counts the step: ``AtomicIter`` and ``LearningRate`` stay outside
  the guard) and the scale halves; after ``growth_interval``
  (2000) good steps in a row it doubles. In ops, after the backward pass:

  - per gradient (float32: cast up first where it is half), ``SumElements(g) -> g_sum``,
    then ``Sum(every g_sum) -> grad_sum``: an inf or NaN anywhere makes it inf or NaN
    (a float32 sum of float16 values cannot overflow: 65504 * 2**24 is far below 3.4e38);
  - ``Sub(grad_sum, grad_sum) -> grad_sum_zero`` (0 when finite, NaN otherwise),
    ``EQ(grad_sum_zero, grad_sum_zero) -> grads_finite`` (a bool: NaN is the one value not
    equal to itself; Caffe2's ``IsNaN`` writes uint8, which ``If`` and ``Not`` do not
    take), ``Not -> found_inf``, ``Reciprocal(loss_scale) -> loss_scale_inv``;
  - each parameter's update ops (the unscale ``Mul(g, loss_scale_inv)``, the weight decay,
    the update, the cast of the master to the half parameter) move into the ``then_net`` of
    ``If(grads_finite, <what they read>) -> <what they write>``: one If per parameter, so
    that the planner still places each update on its own device, and the If lists what its
    branch reads and writes, so that the copies it needs are in the cost graph;
  - the scale: ``If(found_inf)`` then halve it and zero ``loss_scale_good_steps``, else
    count the good step, ``GE(good_steps, loss_scale_window) -> loss_scale_grow`` and
    ``If(loss_scale_grow)`` double it and zero the count.

  Weight decay, in dynamic mode, is added inside the branch to the unscaled float32
  gradient (``WeightedSum([g, ONE, p, wd]) -> g``, with p the float32 master where there
  is one), since no constant can follow a changing scale.

Every op used is a Caffe2 op (``SumElements``, ``Sum``, ``Sub``, ``EQ``, ``Not``,
``Reciprocal``, ``Mul``, ``If``, ``GE``, ``Add``, ``Scale``, ``ConstantFill``), so a
Caffe2 with CUDA kernels for the half ops runs the net as written.
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.formats import caffe2_pb as pb
from placer.training.backward import AUTOGEN_GRAD_SUFFIX
from placer.training.gradient_registry import GradientSlice, make_op

LOSS_SCALE = "loss_scale"
LOSS_SCALE_INV = "loss_scale_inv"
GOOD_STEPS = "loss_scale_good_steps"
WINDOW = "loss_scale_window"
GRADS_FINITE = "grads_finite"
FOUND_INF = "found_inf"
GROW = "loss_scale_grow"

# ops an optimizer writes once for all parameters: they stay outside the per-parameter If
SHARED_OPS = frozenset({"LearningRate", "AtomicIter"})


@dataclass(frozen=True)
class DynamicScale:
    """``GradScaler``'s defaults: init_scale 2**16, growth 2, backoff 0.5, interval 2000."""

    init_scale: float = 65536.0
    growth_interval: int = 2000


def seed_ops(train: pb.NetDef, losses: list[str], first: int):
    """The ``ConstantFill(loss) -> loss_autogen_grad`` seeds among ``train.op[first:]``."""
    seeds = {loss: loss + AUTOGEN_GRAD_SUFFIX for loss in losses}
    return [(k, op) for k, op in enumerate(train.op) if k >= first and op.type == "ConstantFill"
            and list(op.input) in ([loss] for loss in seeds) and op.output[0] == seeds[op.input[0]]]


def scale_seeds_static(train: pb.NetDef, losses: list[str], first: int, scale: float) -> None:
    for _, op in seed_ops(train, losses, first):
        for arg in op.arg:
            if arg.name == "value":
                arg.f = float(scale)


def scale_seeds_dynamic(train: pb.NetDef, init: pb.NetDef, losses: list[str], first: int,
                        cfg: DynamicScale) -> None:
    """``loss_scale`` (a float scalar) and its state in the init net; each seed times it."""
    init.op.extend([
        make_op("ConstantFill", [], [LOSS_SCALE], shape=[], value=float(cfg.init_scale)),
        make_op("ConstantFill", [], [GOOD_STEPS], shape=[], value=0.0),
        make_op("ConstantFill", [], [WINDOW], shape=[], value=float(cfg.growth_interval)),
        make_op("ConstantFill", [], [GROW], shape=[], value=0, dtype=5),   # BOOL: made before it is read
    ])
    found = seed_ops(train, losses, first)
    for k, op in reversed(found):
        train.op.insert(k + 1, make_op("Mul", [op.output[0], LOSS_SCALE], [op.output[0]]))


def check_gradients(nets, float_grads: dict[str, str]) -> None:
    """The finiteness check over ``float_grads`` (parameter -> its float32 gradient blob),
    written into the train net after the backward pass."""
    add = nets.train.add
    sums = [add("SumElements", [g], f"{g}_sum") for g in float_grads.values()]
    total = add("Sum", sums, "grad_sum") if len(sums) > 1 else sums[0]
    zero = add("Sub", [total, total], "grad_sum_zero")
    add("EQ", [zero, zero], GRADS_FINITE)      # NaN is the one value not equal to itself
    add("Not", [GRADS_FINITE], FOUND_INF)
    add("Reciprocal", [LOSS_SCALE], LOSS_SCALE_INV)


def float_gradient(nets, param: str) -> str:
    """The float32 gradient blob an update reads: cast up (once) where the parameter is half."""
    grad = nets.grads[param]
    blob = grad.values if isinstance(grad, GradientSlice) else grad
    if param in nets.masters:
        up = nets.casts[1]
        name = f"{blob}_fp32"
        if not nets.train.defined(name):
            nets.train.add(up, [blob], name)
        return name
    return blob


def guard_update(nets, start: int, label: str) -> None:
    """Move ``nets.net.op[start:]`` (one parameter's update) into ``If(grads_finite)``,
    leaving the ops an optimizer writes once (the rate, the counter) outside."""
    ops = list(nets.net.op[start:])
    del nets.net.op[start:]
    shared = [op for op in ops if op.type in SHARED_OPS]
    branch = [op for op in ops if op.type not in SHARED_OPS]
    nets.net.op.extend(shared)
    if not branch:
        return
    _append_if(nets.train, GRADS_FINITE, branch, f"{label}_update", device=branch[0].device_option)


def update_scale(nets) -> None:
    """Halve on an overflow, count good steps, double after the window (module docstring)."""
    one = "loss_scale_one"
    nets.param_init.add("ConstantFill", [], one, shape=[], value=1.0)
    backoff = [make_op("Scale", [LOSS_SCALE], [LOSS_SCALE], scale=0.5),
               make_op("ConstantFill", [GOOD_STEPS], [GOOD_STEPS], value=0.0)]
    grow = [make_op("Scale", [LOSS_SCALE], [LOSS_SCALE], scale=2.0),
            make_op("ConstantFill", [GOOD_STEPS], [GOOD_STEPS], value=0.0)]
    grow_net = _netdef(grow, "loss_scale_grow_net")
    count = [make_op("Add", [GOOD_STEPS, one], [GOOD_STEPS]),
             make_op("GE", [GOOD_STEPS, WINDOW], [GROW]),
             _if_op(GROW, grow_net, [LOSS_SCALE, GOOD_STEPS], [LOSS_SCALE, GOOD_STEPS])]
    op = _if_op(FOUND_INF, _netdef(backoff, "loss_scale_backoff_net"),
                [LOSS_SCALE, GOOD_STEPS, one, WINDOW], [LOSS_SCALE, GOOD_STEPS, GROW],
                else_net=_netdef(count, "loss_scale_count_net"))
    nets.train.append(op)


def _netdef(ops, name: str) -> pb.NetDef:
    net = pb.NetDef(name=name)
    net.op.extend(ops)
    reads, written = _reads_writes(ops)
    net.external_input.extend(reads)
    net.external_output.extend(written)
    return net


def _reads_writes(ops) -> tuple[list[str], list[str]]:
    reads: dict[str, None] = {}
    written: dict[str, None] = {}
    for op in ops:
        nested = [a.n for a in op.arg if a.HasField("n")]
        inputs = list(op.input) + [b for n in nested for b in n.external_input]
        outputs = list(op.output) + [b for n in nested for b in n.external_output]
        reads.update((b, None) for b in inputs if b not in written)
        written.update((b, None) for b in outputs)
    return list(reads), list(written)


def _if_op(cond: str, then_net: pb.NetDef, inputs, outputs, else_net: pb.NetDef | None = None):
    op = make_op("If", [cond, *[b for b in inputs if b != cond]], list(outputs))
    op.arg.add(name="then_net").n.CopyFrom(then_net)
    if else_net is not None:
        op.arg.add(name="else_net").n.CopyFrom(else_net)
    return op


def _append_if(builder, cond: str, ops, name: str, device=None) -> None:
    branch = _netdef(ops, name)
    op = _if_op(cond, branch, list(branch.external_input), list(branch.external_output))
    if device is not None and device.ByteSize():
        op.device_option.CopyFrom(device)
    builder.append(op)
