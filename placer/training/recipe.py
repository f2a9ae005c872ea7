"""A loaded net + a loss + an optimizer choice -> the Caffe2 train net and its init net.

This is the ``placer train-net`` recipe: what a Caffe2 user wrote by hand with
``AddGradientOperators`` and ``optimizer.build_*``. The parameters are the blobs the init
net fills that get a gradient from the loss, in the init net's order (brew creates both in
the same order); the "weights" that SGD's and Adam's weight decay touches are those not
read as a bias (input 2 of FC / Conv / ConvTranspose / SpatialBN, input 1 of Add), as
brew tags them.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field

from placer.errors import PlacerError
from placer.formats.caffe2 import net_from_netdef
from placer.shapes import infer
from placer.training.backward import add_gradient_ops, out_of_place
from placer.training.gradient_registry import GradientSlice
from placer.training.optimizers import (
    LearningRateSchedule, TrainNets, add_weight_decay, build_adagrad, build_adam, build_fp16_sgd,
    build_multi_precision_sgd, build_sgd)
from placer.training.loss_scaling import (DynamicScale, check_gradients, float_gradient, scale_seeds_dynamic,
                                          scale_seeds_static, update_scale)
from placer.training.precision import PRECISIONS, Casts, HALF_OPS, rewrite_forward
from placer.training.update_order import interleave_updates

UPDATE_ORDERS = ("after-backward", "interleaved")
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adagrad", "rowwise-adagrad", "adam", "rowwise-adam")

# LearningRate policies of torch 1.8.1's Caffe2 and the arguments they read.
LR_POLICIES = ("fixed", "step", "exp", "inv", "poly", "linearWarmup", "constantWarmup", "alter",
               "hill", "composite", "cyclical", "cosine", "gate", "constantThenLinearWarmup",
               "compositeCyclical", "compositeCosine")
REQUIRED_LR_ARGS = {"step": ("stepsize", "gamma"), "exp": ("gamma",), "inv": ("gamma", "power"),
                    "poly": ("power", "max_iter"), "composite": ("sub_policy_num_iters",)}
INT_LR_ARGS = frozenset({"stepsize", "max_iter", "num_iter", "active_period", "inactive_period",
                         "active_first", "n1", "n2", "constant_warmup_num_iter",
                         "linear_warmup_num_iter", "cyclical_step_size", "cosine_period"})
FLOAT_LR_ARGS = frozenset({"gamma", "power", "max_lr", "start_multiplier", "end_multiplier",
                           "multiplier", "multiplier_1", "multiplier_2", "m1", "m2", "m3",
                           "min_lr", "period", "t_mult", "lr_shrink", "start_warmup_multiplier",
                           "cyclical_max_lr", "cyclical_decay", "cosine_min_lr", "cosine_max_lr",
                           "cosine_t_mult", "cosine_lr_shrink"})
_SUB_POLICY_ARG = re.compile(r"^sub_policy_\d+_(\w+)$")

# Op type -> the input that brew creates as a bias (no weight decay).
BIAS_INPUT = {"FC": 2, "FCTransposed": 2, "Conv": 2, "Conv1D": 2, "Conv2D": 2, "Conv3D": 2,
              "ConvTranspose": 2, "SpatialBN": 2, "Add": 1}


class TrainNetError(PlacerError):
    """A train net that cannot be made from this net, loss and optimizer."""


@dataclass
class OptimizerChoice:
    name: str
    lr: float
    momentum: float | None = None
    weight_decay: float = 0.0
    epsilon: float | None = None
    policy: str = "fixed"
    policy_args: dict = field(default_factory=dict)
    precision: str = "fp32"          # PRECISIONS (training/precision.py)
    loss_scale: float | None = None  # static loss scale S (None: no scaling)
    dynamic_scale: DynamicScale | None = None  # dynamic loss scaling (training/loss_scaling.py)
    update_order: str = "after-backward"       # UPDATE_ORDERS (training/update_order.py)


@dataclass
class TrainNetResult:
    train: object
    init: object
    params: list[str]
    sparse_params: list[str]
    lr_blobs: list[str]
    forward_ops: int
    gradient_ops: int
    notes: list[str] = field(default_factory=list)
    masters: dict = field(default_factory=dict)  # half parameter -> float32 master


def parse_lr_args(policy: str, specs: list[str]) -> dict:
    """``["stepsize=100", "gamma=0.1"]`` -> typed LearningRate arguments for ``policy``."""
    if policy not in LR_POLICIES:
        raise TrainNetError(f"--lr-policy {policy}: not a Caffe2 LearningRate policy",
                            hint=f"use one of {', '.join(LR_POLICIES)}")
    args = {}
    for spec in specs:
        key, eq, value = spec.partition("=")
        key = key.strip()
        if not eq or not key:
            raise TrainNetError(f"--lr-arg '{spec}': expected NAME=VALUE, e.g. --lr-arg gamma=0.1")
        args[key] = _typed_lr_arg(key, value.strip(), spec)
    for key in REQUIRED_LR_ARGS.get(policy, ()):
        if key not in args:
            raise TrainNetError(f"--lr-policy {policy} needs --lr-arg {key}=...")
    for key in ("stepsize", "max_iter"):
        if key in REQUIRED_LR_ARGS.get(policy, ()) and args[key] <= 0:
            raise TrainNetError(f"--lr-arg {key}={args[key]}: must be positive for policy {policy}")
    return args


def _typed_lr_arg(key: str, value: str, spec: str):
    sub = _SUB_POLICY_ARG.match(key)
    base = sub.group(1) if sub else key
    try:
        if key == "sub_policy_num_iters":
            return [int(v) for v in value.split(",")]
        if sub and base == "policy":
            return value
        if base in INT_LR_ARGS:
            return int(value)
        if base in FLOAT_LR_ARGS or base == "lr_scale":
            number = float(value)
            if not math.isfinite(number):
                raise TrainNetError(f"--lr-arg '{spec}': {value} is not a finite number")
            return number
    except ValueError:
        raise TrainNetError(f"--lr-arg '{spec}': '{value}' is not a number") from None
    raise TrainNetError(f"--lr-arg '{spec}': LearningRate has no argument '{key}'",
                        hint="see the LearningRate operator's policies and arguments")


def bias_blobs(ops) -> set[str]:
    return {op.input[BIAS_INPUT[op.type]] for op in ops
            if op.type in BIAS_INPUT and len(op.input) > BIAS_INPUT[op.type]}


def make_train_nets(net, losses: list[str], choice: OptimizerChoice) -> TrainNetResult:
    """The train net and init net of ``net`` (a loaded ``placer.types.Net``)."""
    _check_losses(net, losses)
    if net.init_proto is None or not net.params:
        raise TrainNetError(f"{net.path}: no parameters: the net comes without an init net that "
                            "fills them", hint="give the init net with --init-net")
    train, init = copy.deepcopy(net.proto), copy.deepcopy(net.init_proto)
    train.name = f"{train.name or 'net'}_train"
    notes = []
    if net.source_format == "caffe-prototxt":
        renamed = out_of_place(train, losses)
        if renamed:
            notes.append(f"{len(renamed)} in-place op(s) made out of place for the gradients: "
                         + "; ".join(renamed[:3]))
    masters: dict = {}
    casts = Casts.of(choice.precision)
    if choice.precision != "fp32":
        masters = _to_half(net, train, init, losses, choice, casts, notes)
    if choice.loss_scale is not None and choice.dynamic_scale is not None:
        raise TrainNetError("a static --loss-scale and dynamic loss scaling exclude each other")
    if choice.dynamic_scale is not None and choice.precision == "fp16":
        raise TrainNetError("dynamic loss scaling with --precision fp16: its check and unscale read "
                            "float32 gradients, and fp16 updates half ones", hint="use --precision amp-fp16")
    forward_ops = len(train.op)
    grads = add_gradient_ops(train, losses)
    if choice.loss_scale is not None:
        scale_seeds_static(train, losses, forward_ops, choice.loss_scale)
        notes.append(f"loss scale {choice.loss_scale:g}: the backward pass starts from "
                     f"{choice.loss_scale:g} instead of 1; each gradient is divided by it before its update")
    elif choice.dynamic_scale is not None:
        scale_seeds_dynamic(train, init, losses, forward_ops, choice.dynamic_scale)
        notes.append(f"dynamic loss scale: from {choice.dynamic_scale.init_scale:g}, halved and the step "
                     f"skipped on an inf or NaN gradient, doubled after {choice.dynamic_scale.growth_interval} "
                     "good steps; each update runs in If(grads_finite)")
    read = {b for op in net.proto.op for b in op.input}
    params = [p for p in net.params if p in grads and p in read]
    if not params:
        raise TrainNetError(f"{net.path}: no parameters: none of the {len(net.params)} blobs the "
                            f"init net fills gets a gradient from {', '.join(losses)}",
                            hint="check the loss blob; is it computed from the parameters?")
    gradient_ops = len(train.op) - forward_ops
    biases = bias_blobs(net.proto.op)
    nets = TrainNets(train, init, params, {p: grads[p] for p in params},
                     weights=[p for p in params if p not in biases],
                     param_shapes={p: net.params[p].shape for p in params},
                     masters=masters, casts=(casts.down, casts.up), loss_scale=choice.loss_scale,
                     dynamic=choice.dynamic_scale is not None)
    if nets.dynamic:
        check_gradients(nets, {p: float_gradient(nets, p) for p in params})
    lr_blobs = _build(nets, choice)
    if nets.dynamic:
        update_scale(nets)
    if choice.update_order == "interleaved":
        moved = interleave_updates(train, forward_ops + gradient_ops)
        notes.append(f"updates interleaved with the backward pass: {moved} optimizer op(s) run as soon "
                     "as their gradient is final (each gradient dies at its update)")
    elif choice.update_order not in UPDATE_ORDERS:
        raise TrainNetError(f"--update-order {choice.update_order}: unknown",
                            hint=f"use one of {', '.join(UPDATE_ORDERS)}")
    sparse = [p for p in params if isinstance(grads[p], GradientSlice)]
    if choice.weight_decay and sparse and choice.name not in ("adagrad", "rowwise-adagrad"):
        notes.append(f"no weight decay on {len(sparse)} parameter(s) with sparse gradients "
                     "(Caffe2's weight decay takes dense gradients only)")
    return TrainNetResult(train, init, params, sparse, lr_blobs, forward_ops, gradient_ops, notes,
                          masters=masters)


def _to_half(net, train, init, losses: list[str], choice: OptimizerChoice, casts: Casts,
             notes: list[str]) -> dict:
    """``rewrite_forward`` on the forward ops: returns half parameter -> master."""
    if choice.precision not in PRECISIONS:
        raise TrainNetError(f"--precision {choice.precision}: unknown",
                            hint=f"use one of {', '.join(PRECISIONS)}")
    if choice.precision == "fp16" and choice.name not in ("sgd", "momentum", "nesterov"):
        raise TrainNetError(f"--precision fp16 --optimizer {choice.name}: Caffe2's fp16 training "
                            "(build_fp16_sgd) is SGD with float16 momentum only",
                            hint="use --precision amp-fp16 (float32 masters and optimizer state)")
    typed = infer(net_from_netdef(train, init, path=str(net.path)), net.input_shapes)
    unknown = sorted({b for op in train.op if op.type in HALF_OPS for b in op.input
                      if typed.blobs.get(b) is None})
    if unknown:
        raise TrainNetError(f"{net.path}: --precision {choice.precision} needs the dtype of every "
                            f"blob; '{unknown[0]}' has no known type",
                            hint=typed.missing.get(unknown[0], f"give its shape with --input {unknown[0]}=..."))
    float_blobs = {b for b, t in typed.blobs.items() if t is not None and t.dtype == "float32"}
    trial = copy.deepcopy(train)
    trial_grads = add_gradient_ops(trial, losses)
    dense = {p for p, g in trial_grads.items() if not isinstance(g, GradientSlice)}
    done = rewrite_forward(train, init, list(net.params), dense, casts, float_blobs)
    kept = ", ".join(f"{t} {n}" for t, n in sorted(done.float_ops.items())) or "none"
    notes.append(f"{choice.precision}: {len(done.masters)} parameter(s) in {casts.dtype} with float32 "
                 f"masters; {done.casts_down} {casts.down} and {done.casts_up} {casts.up} cast(s) in the "
                 f"forward net; ops run in float32 on half inputs: {kept}")
    if choice.precision == "amp-bf16":
        notes.append("amp-bf16 uses placer's bfloat16 casts (FloatToBFloat16 / BFloat16ToFloat): Caffe2 "
                     "has no bfloat16 and cannot load this net; placer plans and runs it")
    return done.masters


def _check_losses(net, losses: list[str]) -> None:
    produced = {b for op in net.proto.op for b in op.output}
    for loss in losses:
        if loss not in produced:
            read = {b for op in net.proto.op for b in op.input}
            candidates = [b for op in net.proto.op for b in op.output
                          if "loss" in op.type.lower() or b not in read]
            some = ", ".join(dict.fromkeys(candidates[-6:])) or "none"
            raise TrainNetError(f"{net.path}: --loss {loss}: no op of the net writes a blob "
                                f"'{loss}' (candidates: {some})")


def _build(nets: TrainNets, c: OptimizerChoice) -> list[str]:
    """Run the Caffe2 builder for the choice; returns the rate blobs it wrote."""
    if c.momentum is not None and c.name not in ("momentum", "nesterov"):
        raise TrainNetError(f"--momentum applies to --optimizer momentum or nesterov, not {c.name}")
    schedule = LearningRateSchedule(c.policy, dict(c.policy_args))
    before = {b for op in nets.net.op for b in op.output}
    if c.name in ("sgd", "momentum", "nesterov", "adam", "rowwise-adam") and c.weight_decay \
            and c.precision != "fp16":   # build_fp16_sgd decays inside its update op
        if nets.dynamic:   # added in each update, to the unscaled float32 gradient
            nets.decay = {p: c.weight_decay for p in nets.weights
                          if not isinstance(nets.grads[p], GradientSlice)}
        else:
            add_weight_decay(nets, c.weight_decay)
    eps = {} if c.epsilon is None else {"epsilon": c.epsilon}
    amp = c.precision.startswith("amp")
    if c.name in ("sgd", "momentum", "nesterov"):
        momentum = 0.0 if c.name == "sgd" else (0.9 if c.momentum is None else c.momentum)
        nesterov = c.name == "nesterov"
        if c.precision == "fp16":
            build_fp16_sgd(nets, c.lr, momentum=momentum, nesterov=nesterov,
                           weight_decay=c.weight_decay, schedule=schedule)
        elif amp:
            build_multi_precision_sgd(nets, c.lr, momentum=momentum, nesterov=nesterov, schedule=schedule)
        else:
            build_sgd(nets, c.lr, momentum=momentum, nesterov=nesterov, schedule=schedule)
    elif c.name in ("adagrad", "rowwise-adagrad"):
        build_adagrad(nets, c.lr, weight_decay=c.weight_decay, rowwise=c.name.startswith("rowwise"),
                      schedule=schedule, multi_precision=amp, **eps)
    elif c.name in ("adam", "rowwise-adam"):
        build_adam(nets, c.lr, rowwise=c.name.startswith("rowwise"), schedule=schedule,
                   multi_precision=amp, **eps)
    else:
        raise TrainNetError(f"--optimizer {c.name}: unknown", hint=f"use one of {', '.join(OPTIMIZERS)}")
    return [op.output[0] for op in nets.net.op
            if op.type == "LearningRate" and op.output[0] not in before]
