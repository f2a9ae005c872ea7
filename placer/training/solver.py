"""A Caffe ``solver.prototxt`` + train_val prototxt -> Caffe2 train net and init net.

The net is converted in the TRAIN phase (with the solver's ``train_state`` stages and level),
its losses are the tops Caffe gives a loss weight (top 0 of every ``*Loss`` layer unless
``loss_weight`` says otherwise), and every converted parameter that gets a gradient is
trained with the solver's settings:

| solver field | Caffe2 |
|---|---|
| type SGD / Nesterov | ``MomentumSGDUpdate`` (nesterov 0 / 1), or ``WeightedSum`` without momentum |
| type AdaGrad / AdaDelta / Adam | ``Adagrad`` (epsilon = delta) / ``Adadelta`` (decay = momentum) / ``Adam`` (beta1 = momentum, beta2 = momentum2) |
| base_lr, lr_policy, gamma, power, stepsize, stepvalue, max_iter | ``LearningRate`` (see ``caffe_update``) |
| weight_decay, regularization_type, decay_mult | ``WeightedSum`` into the gradient |
| lr_mult | ``Scale`` of the rate; 0 leaves the parameter without update |
| clip_gradients, iter_size | ops in ``caffe_update`` (iter_size: a separate update net) |

Ignored, because they concern running rather than the nets: ``net`` / ``train_net`` (the
net is the one given), ``test_*``, ``display``, ``average_loss``, ``snapshot*``,
``solver_mode`` / ``device_id`` (placement is placer's job), ``random_seed``, ``debug_info``,
``layer_wise_reduce``, ``max_iter`` outside ``poly``. A field that changes the update and has
no equivalent (RMSProp's update, an unknown policy or regularisation) is a ``SolverError``
naming the file and the field.
"""
from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from placer.errors import NetParseError, PlacerError
from placer.fileio import refuse_overwrite
from placer.formats import caffe2_pb as c2
from placer.formats import caffe_pb, save_value_info
from placer.formats.caffe import load_caffe, read_caffemodel, read_prototxt
from placer.formats.caffe2 import read_file_bytes
from placer.formats.convert import convert_net
from placer.training import caffe_update as cu
from placer.training.backward import add_gradient_ops, out_of_place
from placer.training.files import TRAIN_NET, UPDATE_NET, save_train_nets, train_net_paths
from placer.training.gradient_registry import GradientSlice
from placer.training.netbuilder import DeviceScope, NetBuilder
from placer.training.optimizers import (
    AdadeltaOptimizer, AdagradOptimizer, AdamOptimizer, SgdOptimizer, TrainNets, build)

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
SOLVER_TYPES = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
                "ADADELTA": "AdaDelta", "ADAM": "Adam"}
# Fields each policy needs (Caffe reads them without a default that makes sense).
POLICY_FIELDS = {"step": ("stepsize", "gamma"), "exp": ("gamma",), "inv": ("gamma", "power"),
                 "multistep": ("stepvalue", "gamma"), "poly": ("power", "max_iter"),
                 "sigmoid": ("gamma", "stepsize")}


class SolverError(PlacerError):
    """A solver setting that cannot be turned into Caffe2 ops."""


@dataclass
class SolverSettings:
    """The solver fields that shape the train net, checked."""

    path: str
    type: str
    base_lr: float
    lr_policy: str
    policy_settings: dict
    momentum: float
    momentum2: float
    delta: float
    weight_decay: float
    regularization: str
    iter_size: int
    clip_gradients: float | None
    stages: list[str] = field(default_factory=list)
    level: int | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class SolverNets:
    """What ``solver_train_nets`` made. ``update`` is None unless ``iter_size`` > 1: then run
    ``train`` iter_size times, then ``update`` once, per Caffe iteration."""

    train: object
    init: object
    update: object | None
    params: list[str]
    losses: list[str]
    lr_blobs: list[str]
    settings: SolverSettings
    conversion: object
    gradient_ops_end: int = 0  # train.op[:gradient_ops_end] is the forward + backward pass
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- reading the solver

def read_solver(path: str | os.PathLike):
    """Parse a solver.prototxt into a SolverParameter (NetParseError with line:column)."""
    data = read_file_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NetParseError(str(path), "not a solver prototxt: the file is not text") from None
    solver = caffe_pb.SolverParameter()
    try:
        text_format.Parse(text, solver)
    except text_format.ParseError as e:
        message = str(e).split(" : ", 1)[-1]
        hint = ("this looks like a net, not a solver: give it as the net and the solver with --solver"
                if re.search(r"^\s*layers?\s*[{:]", text, re.M) else
                "fix the text at that position (protobuf text format)")
        raise NetParseError(str(path), f"not a valid Caffe solver: {message}",
                            line=e.GetLine(), column=e.GetColumn(), hint=hint) from None
    return solver


def solver_settings(solver, path: str) -> SolverSettings:
    """Check what the solver asks for; a SolverError names the field that has no equivalent."""
    def fail(name: str, why: str, hint: str | None = None):
        raise SolverError(f"{path}: {name}: {why}", hint=hint)

    kind = solver.type if solver.HasField("type") or not solver.HasField("solver_type") else \
        SOLVER_TYPES[caffe_pb.SolverParameter.SolverType.Name(solver.solver_type)]
    known = {v.lower(): v for v in SOLVER_TYPES.values()}
    if kind.lower() not in known:
        fail("type", f"unknown solver type '{kind}'", f"use one of {', '.join(SOLVER_TYPES.values())}")
    kind = known[kind.lower()]
    if kind == "RMSProp":
        fail("type", "RMSProp has no Caffe2 equivalent: Caffe divides by sqrt(history) + delta, "
             "Caffe2's RmsProp by sqrt(history + delta)", "use SGD, Nesterov, AdaGrad, AdaDelta or Adam")
    if not solver.HasField("base_lr"):
        fail("base_lr", "missing (Caffe needs the base learning rate)")
    if not solver.HasField("lr_policy"):
        fail("lr_policy", "missing (Caffe stops on an unknown learning rate policy)",
             f"use one of {', '.join(POLICIES)}")
    policy = solver.lr_policy
    if policy not in POLICIES:
        fail("lr_policy", f"unknown policy '{policy}'", f"use one of {', '.join(POLICIES)}")
    _check_numbers(solver, kind, fail)
    settings = _policy_settings(solver, policy, fail)
    if solver.regularization_type not in ("L2", "L1"):
        fail("regularization_type", f"'{solver.regularization_type}' is not L1 or L2")
    if solver.iter_size < 1:
        fail("iter_size", f"{solver.iter_size} is not a positive number of iterations")
    if kind == "AdaGrad" and solver.momentum != 0:
        fail("momentum", "AdaGrad takes no momentum (Caffe refuses it too)")
    out = SolverSettings(
        path=path, type=kind, base_lr=float(solver.base_lr), lr_policy=policy,
        policy_settings=settings, momentum=float(solver.momentum),
        momentum2=float(solver.momentum2), delta=float(solver.delta),
        weight_decay=float(solver.weight_decay), regularization=solver.regularization_type,
        iter_size=int(solver.iter_size),
        clip_gradients=float(solver.clip_gradients) if solver.clip_gradients >= 0 else None,
        stages=list(solver.train_state.stage),
        level=int(solver.train_state.level) if solver.train_state.HasField("level") else None)
    if solver.solver_mode == caffe_pb.SolverParameter.SolverMode.Value("GPU") or solver.HasField("device_id"):
        out.notes.append("solver_mode / device_id ignored: placer decides where each op runs")
    if len(solver.weights):
        out.notes.append(f"solver weights ({', '.join(solver.weights)}) not loaded: pass --weights")
    return out


# (field, rule, test) for the numbers every update reads; a value outside the rule would be
# written into the train net as it stands (a NaN rate trains nothing, momentum 5 diverges).
_NUMBER_RULES = (
    ("base_lr", "must be positive and finite, e.g. 0.01", lambda v: v > 0),
    ("weight_decay", "must be 0 or more and finite", lambda v: v >= 0),
    ("clip_gradients", "must be finite (negative turns clipping off)", lambda v: True),
    ("gamma", "must be finite", lambda v: True),
    ("power", "must be finite", lambda v: True),
)
# Momentum-like fields, by the solver types that read them: each a decay rate in [0, 1).
_RATE_FIELDS = {"momentum": (("SGD", "Nesterov", "AdaDelta", "Adam"), 0.9), "momentum2": (("Adam",), 0.999)}


def _check_numbers(solver, kind: str, fail) -> None:
    for name, rule, ok in _NUMBER_RULES:
        value = getattr(solver, name)
        if solver.HasField(name) and not (math.isfinite(value) and ok(value)):
            fail(name, f"{value:g} {rule}")
    for name, (kinds, usual) in _RATE_FIELDS.items():
        value = getattr(solver, name)
        if kind in kinds and not (math.isfinite(value) and 0 <= value < 1):
            fail(name, f"{value:g} must be from 0 to below 1 for {kind}, e.g. {usual}")
    if kind in ("AdaGrad", "AdaDelta", "Adam") and not (math.isfinite(solver.delta) and solver.delta > 0):
        fail("delta", f"{solver.delta:g} must be positive and finite for {kind}, e.g. 1e-8")


def _policy_settings(solver, policy: str, fail) -> dict:
    settings = {}
    for name in POLICY_FIELDS.get(policy, ()):
        present = len(solver.stepvalue) > 0 if name == "stepvalue" else solver.HasField(name)
        if not present:
            fail(name, f"missing: lr_policy '{policy}' needs it")
        settings[name] = list(solver.stepvalue) if name == "stepvalue" else getattr(solver, name)
    if policy in ("step",) and solver.stepsize <= 0:
        fail("stepsize", f"{solver.stepsize} is not positive (Caffe needs stepsize > 0)")
    if policy == "poly" and solver.max_iter <= 0:
        fail("max_iter", f"{solver.max_iter} is not positive (lr_policy 'poly' divides by it)")
    values = list(solver.stepvalue)
    if policy == "multistep" and (values[0] < 0 or any(b <= a for a, b in zip(values, values[1:]))):
        fail("stepvalue", f"{values} must increase from 0 or more (one step per value)")
    return settings


# ---------------------------------------------------------------- the net's side

def caffe_losses(layers, path: str) -> list[str]:
    """Tops with a non-zero loss weight; Caffe gives top 0 of a ``*Loss`` layer weight 1."""
    losses = []
    for layer in layers:
        for t, top in enumerate(layer.top):
            if t < len(layer.loss_weight):
                weight = float(layer.loss_weight[t])
            else:
                weight = 1.0 if t == 0 and layer.type.endswith("Loss") else 0.0
            if weight == 0:
                continue
            if weight != 1.0 and layer.type not in ("SoftmaxWithLoss",):
                raise SolverError(f"{path}: layer '{layer.name}' ({layer.type}): loss_weight "
                                  f"{weight:g} is not carried into the Caffe2 net")
            losses.append(top)
    if not losses:
        raise SolverError(f"{path}: no layer has a loss in the TRAIN phase",
                          hint="a train net needs a *Loss layer or a loss_weight")
    return losses


def param_multipliers(layers) -> dict[str, tuple[float, float]]:
    """Converted parameter name -> (lr_mult, decay_mult) from the layers' ParamSpecs.

    Names follow ``formats.convert``: a ParamSpec name, else ``<layer>_<suffix>``. Blobs the
    converter adds that Caffe does not learn (FC's zero bias without bias_term, a lone
    BatchNorm's unit scale and zero shift, a folded Scale's missing bias) get (0, 0). The
    first layer naming a shared parameter decides, as Caffe's owner does.
    """
    out: dict[str, tuple[float, float]] = {}

    def spec(layer, index: int, suffix: str, learned: bool = True) -> None:
        named = index < len(layer.param) and layer.param[index].name
        name = layer.param[index].name if named else f"{layer.name}_{suffix}"
        if name in out:
            return
        if not learned:
            out[name] = (0.0, 0.0)
        elif index < len(layer.param):
            out[name] = (float(layer.param[index].lr_mult), float(layer.param[index].decay_mult))
        else:
            out[name] = (1.0, 1.0)

    for i, layer in enumerate(layers):
        kind = layer.type
        if kind in ("Convolution", "Deconvolution"):
            spec(layer, 0, "w")
            spec(layer, 1, "b", learned=layer.convolution_param.bias_term)
        elif kind == "InnerProduct":
            spec(layer, 0, "w")
            spec(layer, 1, "b", learned=layer.inner_product_param.bias_term)
        elif kind == "Scale" and len(layer.bottom) == 1:
            spec(layer, 0, "w")
            spec(layer, 1, "b", learned=layer.scale_param.bias_term)
        elif kind == "Bias" and len(layer.bottom) == 1:
            spec(layer, 0, "b")
        elif kind == "PReLU":
            spec(layer, 0, "slope")
        elif kind == "BatchNorm":
            out.setdefault(f"{layer.name}_s", (0.0, 0.0))
            out.setdefault(f"{layer.name}_b", (0.0, 0.0))
    return out


def _convert(net_path: str, settings: SolverSettings, weights, input_shapes):
    stages = list(read_prototxt(net_path)[0].state.stage) + settings.stages
    caffe = load_caffe(net_path, phase="train", stages=stages, level=settings.level)
    blobs = read_caffemodel(weights) if weights else None
    conversion = convert_net(caffe, blobs, input_shapes, phase="train", weights_path=str(weights or ""))
    if conversion.missing_params:
        names = list(conversion.missing_params)
        raise SolverError(f"{net_path}: parameter(s) {', '.join(names[:4])} have no shape in the "
                          f"TRAIN phase: {next(iter(conversion.missing_params.values()))}",
                          hint="pass the input shape with --input, e.g. --input data=64,1,28,28")
    return caffe, conversion


# ---------------------------------------------------------------- building the nets

def solver_train_nets(net_path: str | os.PathLike, solver_path: str | os.PathLike,
                      weights: str | os.PathLike | None = None, input_shapes: dict | None = None,
                      solver=None) -> SolverNets:
    """Convert ``net_path`` in the TRAIN phase and add the backward pass and the solver's update."""
    net_path, solver_path = str(net_path), str(solver_path)
    settings = solver_settings(solver if solver is not None else read_solver(solver_path), solver_path)
    caffe, conversion = _convert(net_path, settings, weights, input_shapes)
    losses = caffe_losses(caffe.layers, net_path)
    train = copy.deepcopy(conversion.predict)
    train.name = f"{train.name or 'net'}_train"
    produced = {b for op in train.op for b in op.output}
    for loss in losses:
        if loss not in produced:
            raise SolverError(f"{net_path}: loss '{loss}' is not written by the converted net "
                              "(its layer has no Caffe2 op)")
    made_out_of_place = out_of_place(train, losses)
    grads = add_gradient_ops(train, losses)
    gradient_ops_end = len(train.op)
    params = [p for p in conversion.param_shapes if p in grads]
    if not params:
        raise SolverError(f"{net_path}: no parameter gets a gradient from {', '.join(losses)}")
    init = copy.deepcopy(conversion.init)
    mults = param_multipliers(caffe.layers)
    update = _update_net(train, init, params, grads, settings) if settings.iter_size > 1 else None
    nets = TrainNets(update if update is not None else train, init, params,
                     {p: grads[p] for p in params}, param_shapes=dict(conversion.param_shapes))
    optimizer = _optimizer(nets, settings, {p: mults.get(p, (1.0, 1.0))[0] for p in params})
    learned = [p for p in params if mults.get(p, (1.0, 1.0))[0] != 0]
    if settings.clip_gradients is not None and learned:
        # Caffe clips what the iterations accumulated, before dividing by iter_size.
        clipped = {p: f"{p}_grad_acc" for p in params} if update is not None else nets.grads
        cu.clip_gradients(nets, clipped, learned, settings.clip_gradients)
    build(nets, _CaffeUpdate(nets, optimizer, settings, mults, accumulated=update is not None))
    if update is not None:
        for p in params:
            cu.reset_accumulated(nets, f"{p}_grad_acc")
    notes = list(conversion.notes) + settings.notes
    if made_out_of_place:
        notes.append(f"{len(made_out_of_place)} in-place op(s) made out of place, as Caffe2's "
                     f"gradients need the values they overwrote: {'; '.join(made_out_of_place[:3])}")
    return SolverNets(train, init, update, params, losses, optimizer.lr_blobs, settings,
                      conversion, gradient_ops_end, notes)


def _update_net(train, init, params, grads, settings):
    """iter_size > 1: the train net accumulates; the update net is returned empty."""
    scope = DeviceScope()
    train_b, init_b = NetBuilder(train, scope), NetBuilder(init, scope)
    for p in params:
        if isinstance(grads[p], GradientSlice):
            raise SolverError(f"{settings.path}: iter_size: parameter '{p}' has a sparse gradient, "
                              "which is not accumulated")
        cu.accumulate(train_b, init_b, p, grads[p])
    return c2.NetDef(name=train.name.replace("_train", "_update"))


def _optimizer(nets: TrainNets, s: SolverSettings, lr_mults: dict):
    schedule = cu.CaffeSchedule(policy=s.lr_policy, settings=s.policy_settings)
    common = dict(schedule=schedule, lr_mults=lr_mults)
    if s.type in ("SGD", "Nesterov"):
        return SgdOptimizer(nets, s.base_lr, momentum=s.momentum, nesterov=s.type == "Nesterov", **common)
    if s.type == "AdaGrad":
        return AdagradOptimizer(nets, s.base_lr, epsilon=s.delta, **common)
    if s.type == "AdaDelta":
        return AdadeltaOptimizer(nets, s.base_lr, epsilon=s.delta, decay=s.momentum, **common)
    return AdamOptimizer(nets, s.base_lr, beta1=s.momentum, beta2=s.momentum2, epsilon=s.delta, **common)


class _CaffeUpdate:
    """Per parameter, Caffe's order: normalise (iter_size), regularise, update."""

    def __init__(self, nets, optimizer, settings: SolverSettings, mults: dict, accumulated: bool):
        self.nets, self.optimizer, self.settings = nets, optimizer, settings
        self.mults, self.accumulated = mults, accumulated

    def run(self, param: str, grad) -> None:
        lr_mult, decay_mult = self.mults.get(param, (1.0, 1.0))
        if lr_mult == 0:
            return
        if self.accumulated:
            cu.normalize_accumulated(self.nets, f"{param}_grad_acc", grad, self.settings.iter_size)
        if isinstance(grad, GradientSlice):
            if self.settings.weight_decay * decay_mult:
                raise SolverError(f"{self.settings.path}: weight_decay: parameter '{param}' has a "
                                  "sparse gradient, which Caffe2 does not decay")
        else:
            cu.regularize(self.nets, param, grad, self.settings.weight_decay, decay_mult,
                          self.settings.regularization)
        self.optimizer.run(param, grad)


# ---------------------------------------------------------------- for `placer convert --solver`

def solver_nets_for_convert(net_path, solver_path, out_dir, weights=None, input_shapes=None,
                            binary: bool = False) -> SolverNets:
    """Build the solver's train nets before ``convert`` writes anything, refusing outputs
    that would overwrite an input."""
    for path in train_net_paths(out_dir, update=True, binary=binary):
        refuse_overwrite(path, net_path, solver_path, weights)
    return solver_train_nets(net_path, solver_path, weights=weights, input_shapes=input_shapes)


def save_solver_nets(result: SolverNets, out_dir, binary: bool = False) -> list:
    """Write train_net, train_init_net (and update_net with iter_size > 1) into ``out_dir``."""
    written = save_train_nets(out_dir, result.train, result.init, result.update, binary=binary)
    # the TRAIN phase's input shapes (its data layers' batch), beside the train net: the
    # folder's value_info.json is the predict net's (the phase converted, often TEST's batch)
    for name in [TRAIN_NET] + ([UPDATE_NET] if result.update is not None else []):
        written.append(save_value_info(result.conversion.input_shapes, Path(out_dir) / f"{name}.value_info.json"))
    return written
