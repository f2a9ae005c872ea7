"""What Caffe's SGDSolver does and Caffe2 has no single op or argument for, as Caffe2 ops.

Caffe's ``ApplyUpdate`` (``sgd_solver.cpp``) runs, each iteration: clip the gradients
(global L2 norm), normalise by ``iter_size``, regularise (``diff += wd * decay_mult * W``,
or ``* sign(W)`` for L1), and update with the local rate ``rate * lr_mult``. Here:

- **Iteration.** Caffe's rate at update k (k = 0, 1, ...) uses ``iter_ = k``; Caffe2's
  ``AtomicIter`` runs before ``LearningRate``, so the counter reads k + 1 there (it starts
  at 0 and cannot start lower). ``caffe_iteration = Sub(optimizer_iteration, 1)`` gives k
  back; the policies and Adam's bias correction read it.
- **Policies.** fixed / step / exp / inv / poly are Caffe2 ``LearningRate`` policies with the
  same formulas. ``multistep`` is the ``composite`` policy of ``fixed`` pieces scaled
  gamma^j, reading ``optimizer_iteration`` (a composite's pieces start at iteration 1, so
  piece j, of length s_(j+1) - s_j, covers Caffe iterations [s_j, s_(j+1))). ``sigmoid``,
  base_lr / (1 + exp(-gamma (k - stepsize))), is ``Sub`` (k - stepsize, exact in INT64),
  ``Cast``, ``Scale`` (gamma), ``Sigmoid``, ``Scale`` (the signed base rate).
- **lr_mult** scales the rate blob (``Scale``, in ``optimizers.Optimizer.local_lr``), and a
  parameter with lr_mult 0 gets no update op (Caffe leaves it unchanged too).
- **decay_mult**: one ``wd_<type>_<id>[_decay_mult_<m>]`` blob per distinct local decay,
  ``WeightedSum([g, ONE, p, wd]) -> g``; L1 uses ``Sign(p) -> <p>_sign`` in place of p.
- **clip_gradients**: the global norm over every gradient (``SumSqrElements``, ``Sum``,
  ``Pow`` 0.5), ``norm_ratio = clip / max(norm, clip)``, and ``Mul(g, norm_ratio) -> g``.
  Caffe scales the gradients themselves (Caffe2's ``max_gradient_norm`` scales the rate,
  which differs once weight decay or Adagrad's history is involved).
- **iter_size**: the train net adds each gradient into ``<p>_grad_acc`` (``Sum``); a
  separate update net, run once per ``iter_size`` runs of the train net, clips the sums,
  scales them by 1 / iter_size into the gradient blobs, regularises, updates, and refills
  the sums with zeros (``ConstantFill`` shaped like them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from placer.training.gradient_registry import GradientSlice
from placer.training.netbuilder import CPU, device_option
from placer.training.optimizers import (
    INT64, LearningRateSchedule, TrainNets, build_unique_mutex_iter)

CAFFE_ITERATION = "caffe_iteration"
CAFFE_ITERATION_OFFSET = "caffe_iteration_offset"
FLOAT = 1  # TensorProto.DataType
CLIP_SCOPE = "clip_gradients"

# Caffe lr_policy -> the Caffe2 LearningRate policy with the same formula and its arguments
# as (Caffe2 name, solver field, type).
NATIVE_POLICIES = {
    "fixed": ("fixed", ()),
    "step": ("step", (("stepsize", "stepsize", int), ("gamma", "gamma", float))),
    "exp": ("exp", (("gamma", "gamma", float),)),
    "inv": ("inv", (("gamma", "gamma", float), ("power", "power", float))),
    "poly": ("poly", (("power", "power", float), ("max_iter", "max_iter", int))),
}


def _cpu_override():
    return device_option(CPU, 0, ["device_type_override:cpu"])


def caffe_iteration(nets: TrainNets) -> str:
    """Caffe's ``iter_`` (updates done before this one): the Caffe2 counter less one."""
    iteration = build_unique_mutex_iter(nets)
    if not nets.train.defined(CAFFE_ITERATION):
        with nets.scope(_cpu_override()):
            nets.param_init.add("ConstantFill", [], CAFFE_ITERATION_OFFSET, shape=[1], value=1,
                                dtype=INT64)
            nets.train.add("Sub", [iteration, CAFFE_ITERATION_OFFSET], CAFFE_ITERATION)
    return CAFFE_ITERATION


@dataclass
class CaffeSchedule(LearningRateSchedule):
    """A Caffe ``lr_policy`` written as Caffe2 ops that give Caffe's rate at every update.

    ``settings`` holds the solver fields the policy reads (gamma, power, stepsize,
    stepvalue, max_iter), already checked by ``solver.py``.
    """

    settings: dict = field(default_factory=dict)

    def write(self, nets: TrainNets, iteration: str, lr: str, base_lr: float) -> None:
        s = self.settings
        if self.policy in NATIVE_POLICIES:
            name, fields = NATIVE_POLICIES[self.policy]
            source = iteration if self.policy == "fixed" else caffe_iteration(nets)
            args = [("base_lr", -base_lr), ("policy", name)]
            args += [(arg, kind(s[key])) for arg, key, kind in fields]
            nets.train.add("LearningRate", [source], lr, args=args)
        elif self.policy == "multistep":
            self._multistep(nets, iteration, lr, base_lr)
        elif self.policy == "sigmoid":
            self._sigmoid(nets, iteration, lr, base_lr)
        else:
            raise ValueError(f"lr_policy {self.policy!r} was not checked")

    def update_iteration(self, nets: TrainNets, iteration: str) -> str:
        return caffe_iteration(nets)

    def _multistep(self, nets: TrainNets, iteration: str, lr: str, base_lr: float) -> None:
        gamma = float(self.settings["gamma"])
        bounds = [0] + [int(v) for v in self.settings["stepvalue"]]
        pieces = [(bounds[j + 1] - bounds[j], gamma ** j) for j in range(len(bounds) - 1)]
        pieces = [p for p in pieces if p[0] > 0] + [(1, gamma ** (len(bounds) - 1))]
        if len(pieces) == 1:  # every step at iteration 0: a constant rate
            nets.train.add("LearningRate", [iteration], lr,
                           args=[("base_lr", -base_lr * pieces[0][1]), ("policy", "fixed")])
            return
        args = [("base_lr", -base_lr), ("policy", "composite"),
                ("sub_policy_num_iters", [n for n, _ in pieces])]
        for j, (_, scale) in enumerate(pieces):
            args += [(f"sub_policy_{j}_policy", "fixed"), (f"sub_policy_{j}_lr_scale", float(scale))]
        nets.train.add("LearningRate", [iteration], lr, args=args)

    def _sigmoid(self, nets: TrainNets, iteration: str, lr: str, base_lr: float) -> None:
        offset = f"{lr}_sigmoid_offset"
        with nets.scope(_cpu_override()):
            nets.param_init.add("ConstantFill", [], offset, shape=[1],
                                value=int(self.settings["stepsize"]) + 1, dtype=INT64)
        add = nets.train.add
        steps = add("Sub", [iteration, offset], f"{lr}_sigmoid_steps")  # k - stepsize
        x = add("Cast", [steps], f"{lr}_sigmoid_steps_float", to=FLOAT)
        x = add("Scale", [x], f"{lr}_sigmoid_input", scale=float(self.settings["gamma"]))
        x = add("Sigmoid", [x], f"{lr}_sigmoid")
        add("Scale", [x], lr, scale=-base_lr)


# ---------------------------------------------------------------- gradient transforms

def clip_gradients(nets: TrainNets, grads: dict, params: list[str], clip_norm: float) -> None:
    """Scale every gradient by clip / max(global L2 norm, clip), as Caffe's ClipGradients."""
    add = nets.train.add
    sums = []
    for i, param in enumerate(params):
        g = _dense_part(grads[param])
        sums.append(add("SumSqrElements", [g], f"{CLIP_SCOPE}/grad_{i}_squared_sum"))
    total = add("Sum", sums, f"{CLIP_SCOPE}/grad_squared_full_sum")
    norm = add("Pow", [total], f"{CLIP_SCOPE}/global_norm", exponent=0.5)
    clip = nets.param_init.add("ConstantFill", [], f"{CLIP_SCOPE}/clip_norm", shape=[],
                               value=float(clip_norm))
    largest = add("Max", [norm, clip], f"{CLIP_SCOPE}/max_norm")
    ratio = add("Div", [clip, largest], f"{CLIP_SCOPE}/norm_ratio")
    for param in params:
        g = _dense_part(grads[param])
        add("Mul", [g, ratio], g)


def _dense_part(grad) -> str:
    return grad.values if isinstance(grad, GradientSlice) else grad


def regularize(nets: TrainNets, param: str, grad, weight_decay: float, decay_mult: float,
               kind: str) -> None:
    """``diff += weight_decay * decay_mult * W`` (L2) or ``* sign(W)`` (L1)."""
    local = weight_decay * decay_mult
    if local == 0:
        return
    scope = nets.scope.current or device_option()
    t, i = scope.device_type, scope.device_id
    one, wd = f"ONE_{t}_{i}", f"wd_{t}_{i}" if decay_mult == 1 else f"wd_{t}_{i}_decay_mult_{decay_mult:g}"
    for name, value in ((one, 1.0), (wd, float(local))):
        if not nets.param_init.defined(name):
            nets.param_init.add("ConstantFill", [], name, shape=[1], value=value)
    source = param if kind == "L2" else nets.train.add("Sign", [param], f"{param}_sign")
    nets.train.add("WeightedSum", [grad, one, source, wd], grad)


def accumulate(train, init, param: str, grad: str) -> str:
    """In the train net: ``<p>_grad_acc += grad`` (filled with zeros by the init net)."""
    acc = init.add("ConstantFill", [param], f"{param}_grad_acc", value=0.0)
    train.add("Sum", [acc, grad], acc)
    return acc


def normalize_accumulated(nets: TrainNets, acc: str, grad: str, iter_size: int) -> None:
    """In the update net: ``grad = acc / iter_size``."""
    nets.train.add("Scale", [acc], grad, scale=1.0 / iter_size)


def reset_accumulated(nets: TrainNets, acc: str) -> None:
    nets.train.add("ConstantFill", [acc], acc, value=0.0)
