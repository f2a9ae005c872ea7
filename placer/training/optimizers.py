"""Optimizer ops as ``caffe2.python.optimizer`` writes them (torch 1.8.1's Caffe2).

``build_sgd`` / ``build_adagrad`` / ``build_adam`` / ``build_adadelta`` / ``add_weight_decay`` take a
``TrainNets`` (the train net after the backward pass, its init net, the parameters in order
and their gradients) and append, per parameter and in the parameter's device scope:

- once per net: ``ConstantFill -> optimizer_iteration`` (INT64, shape [1]) and
  ``CreateMutex -> iteration_mutex`` in the init net, ``AtomicIter`` in the train net, all
  on the CPU (``extra_info: "device_type_override:cpu"``);
- once per optimizer instance and device: ``LearningRate(optimizer_iteration) ->
  <Class>_<n>_lr_cpu`` (``_lr_gpu<id>`` on a GPU); ``base_lr`` is the negated rate, except
  for momentum SGD, whose update op subtracts;
- the update op and its state fills: SGD ``WeightedSum([p, ONE, g, lr])`` (sparse:
  ``ScatterWeightedSum``) or ``MomentumSGDUpdate`` with ``<p>_momentum`` (sparse:
  ``SparseMomentumSGDUpdate``), a ``ONE_<type>_<id>`` fill per parameter; Adagrad with
  ``<p>_squared_sum`` (rowwise: ``<p>_avg_squared_sum``, one per row); Adam with
  ``<p>_first_moment`` and ``<p>_second_moment`` (rowwise: ``<p>_avg_second_moment``);
  Adadelta with ``<p>_squared_moment`` and ``<p>_squared_moment_update``.

``n`` counts the instances of each optimizer class built for one ``TrainNets``, as Caffe2
counts them per process. Rowwise variants use Caffe2's rowwise ops for parameters with
sparse gradients (Caffe2 refuses them for dense ones) and a second instance of the plain
optimizer for the dense ones, as a Caffe2 model gives its embedding tables their own
optimizer. Weight decay is ``WeightedSum([g, ONE, p, wd_<type>_<id>]) -> g`` on the
weights (``add_weight_decay``) for SGD and Adam, and Adagrad's own ``weight_decay``
argument on parameters of rank > 1, as Caffe2 does.

Two hooks let the Caffe solver (``solver.py``) write its rate without changing the rest:
a ``schedule`` that writes the ops making the learning-rate blob, and per-parameter
learning-rate multipliers (a ``Scale`` of the rate blob).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from placer.errors import PlacerError
from placer.training.gradient_registry import GradientSlice
from placer.training.loss_scaling import LOSS_SCALE_INV, guard_update
from placer.training.netbuilder import CPU, DeviceScope, NetBuilder, blob_devices, device_option, is_gpu

OPTIMIZER_ITERATION = "optimizer_iteration"
ITERATION_MUTEX = "iteration_mutex"
INT64 = 10  # TensorProto.DataType


class OptimizerError(PlacerError):
    """An optimizer that cannot be built for these parameters."""


@dataclass
class TrainNets:
    """What the optimizer builders read and extend (Caffe2's ModelHelper, reduced).

    ``params`` are in the order Caffe2 visits them (the model's parameter order), each with
    its gradient in ``grads`` (a blob name or a GradientSlice); ``weights`` are the ones
    ``add_weight_decay`` decays; ``param_shapes`` the shapes the init net gives them.
    """

    net: object
    init: object
    params: list[str]
    grads: dict
    weights: list[str] = field(default_factory=list)
    param_shapes: dict = field(default_factory=dict)
    masters: dict = field(default_factory=dict)   # half parameter -> its float32 master
    casts: tuple = ("FloatToHalf", "HalfToFloat")  # (down, up) cast op types of the half dtype
    loss_scale: float | None = None               # the gradients are the loss's times this
    dynamic: bool = False                         # dynamic loss scaling (training/loss_scaling.py)
    decay: dict = field(default_factory=dict)     # dynamic: parameter -> weight decay in its update

    def __post_init__(self):
        self.scope = DeviceScope()
        self.train = NetBuilder(self.net, self.scope)
        self.param_init = NetBuilder(self.init, self.scope)
        self.instances: dict[str, int] = defaultdict(int)


# ---------------------------------------------------------------- learning rate

@dataclass
class LearningRateSchedule:
    """``LearningRate(iteration) -> lr`` with a Caffe2 policy and its arguments."""

    policy: str = "fixed"
    args: dict = field(default_factory=dict)

    def write(self, nets: TrainNets, iteration: str, lr: str, base_lr: float) -> None:
        nets.train.add("LearningRate", [iteration], lr,
                       args=[("base_lr", -base_lr), ("policy", self.policy), *self.args.items()])

    def update_iteration(self, nets: TrainNets, iteration: str) -> str:
        """The iteration blob the update ops read (Adam's bias correction)."""
        return iteration


def build_unique_mutex_iter(nets: TrainNets, iter_val: int = 0) -> str:
    """Caffe2's ``utils.BuildUniqueMutexIter``: the shared iteration counter, once."""
    if not nets.param_init.defined(OPTIMIZER_ITERATION):
        with nets.scope(device_option(CPU, 0, ["device_type_override:cpu"])):
            nets.param_init.add("ConstantFill", [], OPTIMIZER_ITERATION, shape=[1],
                                value=int(iter_val), dtype=INT64)
            nets.param_init.add("CreateMutex", [], ITERATION_MUTEX)
            nets.train.add("AtomicIter", [ITERATION_MUTEX, OPTIMIZER_ITERATION], OPTIMIZER_ITERATION)
    return OPTIMIZER_ITERATION


class Optimizer:
    """Caffe2's ``Optimizer`` base: instance numbering, blob names, the learning rate."""

    def __init__(self, nets: TrainNets, schedule: LearningRateSchedule | None = None,
                 lr_mults: dict | None = None):
        self.nets = nets
        self.instance = nets.instances[type(self).__name__]
        nets.instances[type(self).__name__] += 1
        self.schedule = schedule or LearningRateSchedule()
        self.lr_mults = lr_mults or {}
        self.lr_blobs: list[str] = []  # the rate blobs this instance wrote

    def blob_name(self, base: str) -> str:
        """``<Class>_<n>_<base>_cpu`` or ``..._gpu<id>`` after the current device scope."""
        scope = self.nets.scope.current
        node = scope.node_name if scope is not None else ""
        prefix = f"{type(self).__name__}_{self.instance}_{base}{node}"
        return f"{prefix}_gpu{scope.device_id}" if is_gpu(scope) else f"{prefix}_cpu"

    def build_lr(self, base_lr: float) -> tuple[str, str]:
        lr = self.blob_name("lr")
        iteration = build_unique_mutex_iter(self.nets)
        if not self.nets.train.defined(lr):
            self.schedule.write(self.nets, iteration, lr, base_lr)
            self.lr_blobs.append(lr)
        return lr, iteration

    def local_lr(self, lr: str, param: str) -> str:
        """The rate scaled by the parameter's multiplier (Caffe's ``lr_mult``), once per value."""
        mult = self.lr_mults.get(param, 1.0)
        if mult == 1.0:
            return lr
        scaled = f"{lr}_lr_mult_{mult:g}"
        if not self.nets.train.defined(scaled):
            self.nets.train.add("Scale", [lr], scaled, scale=float(mult))
        return scaled

    def one_blob(self, with_node: bool = True) -> str:
        scope = self.nets.scope.current or device_option()
        node = scope.node_name if with_node else ""
        name = f"ONE_{scope.device_type}_{scope.device_id}{node}"
        self.nets.param_init.add("ConstantFill", [], name, shape=[1], value=1.0)
        return name

    def skip(self, param: str) -> bool:
        return self.lr_mults.get(param, 1.0) == 0.0

    def unscale(self, grad, param: str, param32: str | None = None):
        """Divide a gradient of a scaled loss by the scale, in place, before the update; in
        dynamic loss scaling, then add the parameter's weight decay (``param32``: the blob
        the update changes, the float32 master where there is one)."""
        blob = grad.values if isinstance(grad, GradientSlice) else grad
        if self.nets.dynamic:
            self.nets.train.add("Mul", [blob, LOSS_SCALE_INV], blob)
            decay = self.nets.decay.get(param)
            if decay and not isinstance(grad, GradientSlice):
                scope = self.nets.scope.current or device_option()
                t, i = scope.device_type, scope.device_id
                init = self.nets.param_init.add
                one = init("ConstantFill", [], f"ONE_{t}_{i}", shape=[1], value=1.0)
                wd = init("ConstantFill", [], f"wd_{t}_{i}", shape=[1], value=decay)
                self.nets.train.add("WeightedSum", [blob, one, param32 or param, wd], blob)
        elif self.nets.loss_scale is not None:
            self.nets.train.add("Scale", [blob], blob, scale=1.0 / self.nets.loss_scale)
        return grad

    def run(self, param: str, grad) -> None:
        raise NotImplementedError


class SgdOptimizer(Optimizer):
    def __init__(self, nets, base_lr: float, momentum: float = 0.0, nesterov: bool = True, **kw):
        super().__init__(nets, **kw)
        self.base_lr, self.momentum, self.nesterov = base_lr, momentum, nesterov

    def run(self, param: str, grad) -> None:
        if self.base_lr == 0 or self.skip(param):
            return
        sign = -1 if self.momentum else 1
        grad = self.unscale(grad, param)
        lr, _ = self.build_lr(self.base_lr * sign)
        lr = self.local_lr(lr, param)
        one = self.one_blob()
        add, init = self.nets.train.add, self.nets.param_init.add
        if self.momentum > 0:
            momentum = init("ConstantFill", [param], f"{param}_momentum", value=0.0)
        if isinstance(grad, GradientSlice):
            if self.momentum > 0:
                add("SparseMomentumSGDUpdate", [grad.values, momentum, lr, param, grad.indices],
                    [grad.values, momentum, param], momentum=self.momentum, nesterov=self.nesterov)
            else:
                add("ScatterWeightedSum", [param, one, grad.indices, grad.values, lr], param)
        elif self.momentum > 0:
            add("MomentumSGDUpdate", [grad, momentum, lr, param], [grad, momentum, param],
                momentum=self.momentum, nesterov=self.nesterov)
        else:
            add("WeightedSum", [param, one, grad, lr], param)


class AdagradOptimizer(Optimizer):
    def __init__(self, nets, base_lr: float, epsilon: float = 1e-4, decay: float = 1.0,
                 weight_decay: float = 0.0, rowwise: bool = False, **kw):
        super().__init__(nets, **kw)
        self.base_lr, self.epsilon, self.decay = base_lr, epsilon, decay
        self.weight_decay, self.rowwise = float(weight_decay), rowwise

    def run(self, param: str, grad) -> None:
        if self.base_lr <= 0 or self.skip(param):
            return
        grad = self.unscale(grad, param)
        lr, _ = self.build_lr(self.base_lr)
        lr = self.local_lr(lr, param)
        sparse = isinstance(grad, GradientSlice)
        history = self._history(param)
        if self.rowwise and not sparse:
            raise OptimizerError(f"parameter '{param}': rowwise Adagrad needs a sparse gradient")
        weight_decay = 0.0
        if self.weight_decay > 0:  # Caffe2 skips 1-D parameters
            shape = _param_shape(self.nets, param, "Adagrad's weight decay (skipped for 1-D parameters)")
            weight_decay = self.weight_decay if len(shape) > 1 else 0.0
        if sparse:
            if self.decay != 1.0:
                raise OptimizerError(f"parameter '{param}': sparse Adagrad has no decay (Caffe2 needs 1)")
            op = "RowWiseSparseAdagrad" if self.rowwise else "SparseAdagrad"
            self.nets.train.add(op, [param, history, grad.indices, grad.values, lr], [param, history],
                                epsilon=self.epsilon, weight_decay=weight_decay or None, engine="")
        else:
            self.nets.train.add("Adagrad", [param, history, grad, lr], [param, history],
                                epsilon=self.epsilon, decay=float(self.decay),
                                weight_decay=weight_decay or None, engine="")

    def _history(self, param: str) -> str:
        init = self.nets.param_init.add
        if not self.rowwise:
            return init("ConstantFill", [param], f"{param}_squared_sum", value=0.0)
        shape = self.nets.param_shapes.get(param)
        if shape is None:  # Caffe2 reads the row count at run time when inference cannot
            init("Shape", [param], f"{param}_shape")
            init("Slice", [f"{param}_shape"], f"{param}_shape_numrows", starts=[0], ends=[1])
            return init("ConstantFill", [f"{param}_shape_numrows"], f"{param}_avg_squared_sum",
                        input_as_shape=1, value=0.0)
        return init("ConstantFill", [], f"{param}_avg_squared_sum", shape=[shape[0]], value=0.0)


class AdamOptimizer(Optimizer):
    def __init__(self, nets, base_lr: float, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, rowwise: bool = False, **kw):
        super().__init__(nets, **kw)
        self.base_lr, self.beta1, self.beta2 = base_lr, beta1, beta2
        self.epsilon, self.rowwise = epsilon, rowwise

    def run(self, param: str, grad) -> None:
        if self.base_lr <= 0 or self.skip(param):
            return
        grad = self.unscale(grad, param)
        lr, iteration = self.build_lr(self.base_lr)
        lr = self.local_lr(lr, param)
        iteration = self.schedule.update_iteration(self.nets, iteration)
        init = self.nets.param_init.add
        m1 = init("ConstantFill", [param], f"{param}_first_moment", value=0.0)
        if self.rowwise:
            rows = _param_shape(self.nets, param, "rowwise Adam's second moment")[0]
            m2 = init("ConstantFill", [], f"{param}_avg_second_moment", shape=[rows], value=0.0)
        else:
            m2 = init("ConstantFill", [param], f"{param}_second_moment", value=0.0)
        sparse = isinstance(grad, GradientSlice)
        if self.rowwise and not sparse:
            raise OptimizerError(f"parameter '{param}': rowwise Adam needs a sparse gradient")
        args = dict(beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon)
        if sparse:
            op = "RowWiseSparseAdam" if self.rowwise else "SparseAdam"
            extra = {} if self.rowwise else {"enableRAdam": False}
            self.nets.train.add(op, [param, m1, m2, grad.indices, grad.values, lr, iteration],
                                [param, m1, m2], **args, **extra)
        else:
            self.nets.train.add("Adam", [param, m1, m2, grad, lr, iteration], [param, m1, m2], **args)


class AdadeltaOptimizer(Optimizer):
    def __init__(self, nets, base_lr: float, epsilon: float = 1e-4, decay: float = 0.95, **kw):
        super().__init__(nets, **kw)
        self.base_lr, self.epsilon, self.decay = base_lr, epsilon, decay

    def run(self, param: str, grad) -> None:
        if self.base_lr <= 0 or self.skip(param):
            return
        grad = self.unscale(grad, param)
        lr, _ = self.build_lr(self.base_lr)
        lr = self.local_lr(lr, param)
        init = self.nets.param_init.add
        moment = init("ConstantFill", [param], f"{param}_squared_moment", value=0.0)
        update = init("ConstantFill", [param], f"{param}_squared_moment_update", value=0.0)
        args = dict(epsilon=self.epsilon, decay=self.decay, engine="")
        if isinstance(grad, GradientSlice):
            self.nets.train.add("SparseAdadelta", [param, moment, update, grad.indices, grad.values, lr],
                                [param, moment, update], **args)
        else:
            self.nets.train.add("Adadelta", [param, moment, update, grad, lr], [param, moment, update],
                                **args)


# ---------------------------------------------------------------- mixed precision
# A parameter with a master (``nets.masters``, written by ``training/precision.py``) is a half
# copy of a float32 blob the update keeps. Caffe2 has two builders for them, mirrored op for
# op; Adam and Adagrad have none in Caffe2, and the ``MultiPrecision*`` classes below write
# them in the pattern of its multi-precision SGD (the gradient cast up, the fp32 op on the
# master and its fp32 state, the master cast down). Parameters without a master (embedding
# tables with sparse gradients, parameters read by float32 ops) take the plain update.

def _master_gradient(opt: Optimizer, param: str, grad, what: str) -> str:
    if isinstance(grad, GradientSlice):
        raise OptimizerError(f"parameter '{param}': {what} does not take sparse gradients "
                             "(Caffe2's fp16 optimizers refuse them)")
    up, grad32 = opt.nets.casts[1], f"{grad}_fp32"
    if not opt.nets.train.defined(grad32):     # dynamic loss scaling cast it for its check
        opt.nets.train.add(up, [grad], grad32)
    opt.unscale(grad32, param, opt.nets.masters[param])
    return grad32


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """``optimizer.MultiPrecisionSgdOptimizer`` (``build_multi_precision_sgd``)."""

    def run(self, param: str, grad) -> None:
        master = self.nets.masters.get(param)
        if master is None:
            return super().run(param, grad)
        if self.base_lr == 0 or self.skip(param):
            return
        lr, _ = self.build_lr(-self.base_lr)
        lr = self.local_lr(lr, param)
        momentum = self.nets.param_init.add("ConstantFill", [master], f"{param}_momentum", value=0.0)
        grad32 = _master_gradient(self, param, grad, "MultiPrecisionSgd")
        self.nets.train.add("MomentumSGDUpdate", [grad32, momentum, lr, master],
                            [grad32, momentum, master], momentum=self.momentum, nesterov=self.nesterov)
        self.nets.train.add(self.nets.casts[0], [master], param)


class FP16SgdOptimizer(SgdOptimizer):
    """``optimizer.FP16SgdOptimizer`` (``build_fp16_sgd``): float16 momentum and
    ``FP16MomentumSGDUpdate`` on the half weights; ``FP32MomentumSGDUpdate`` for a
    parameter without a master and for one whose name holds "spatbn" (cuDNN's batch norm
    wants float32 scale and bias)."""

    def __init__(self, nets, base_lr: float, momentum: float = 0.0, nesterov: bool = True,
                 weight_decay: float = 1e-4, **kw):
        super().__init__(nets, base_lr, momentum=momentum, nesterov=nesterov, **kw)
        self.weight_decay = weight_decay

    def run(self, param: str, grad) -> None:
        master = self.nets.masters.get(param)
        fp32_update = master is None or "spatbn" in param
        param32 = param if fp32_update else master
        if self.base_lr == 0 or self.skip(param):
            return
        lr, _ = self.build_lr(-self.base_lr)
        lr = self.local_lr(lr, param)
        init = self.nets.param_init.add
        momentum32 = init("ConstantFill", [param32], f"{param}_momentum_fp32", value=0.0)
        momentum = init("FloatToHalf", [momentum32], f"{param}_momentum")
        if isinstance(grad, GradientSlice):
            raise OptimizerError(f"parameter '{param}': FP16Sgd does not take sparse gradients "
                                 "(Caffe2's build_fp16_sgd refuses them)",
                                 hint="train nets with embedding tables with --precision amp-fp16")
        self.unscale(grad, param)
        args = dict(momentum=self.momentum, nesterov=self.nesterov, weight_decay=self.weight_decay)
        if fp32_update:
            self.nets.train.add("FP32MomentumSGDUpdate", [grad, momentum32, lr, param],
                                [grad, momentum32, param], **args)
        else:
            self.nets.train.add("FP16MomentumSGDUpdate", [grad, momentum, lr, param],
                                [grad, momentum, param], **args)


class _MasterUpdate(Optimizer):
    """The start of a placer multi-precision update: the plain update (the next class in
    the MRO) for a parameter without a master; else (master, rate, iteration blob), or None
    when the rate skips the parameter."""

    base_lr: float

    def master_start(self, param: str, grad):
        master = self.nets.masters.get(param)
        if master is None:
            super().run(param, grad)
            return None
        if self.base_lr <= 0 or self.skip(param):
            return None
        lr, iteration = self.build_lr(self.base_lr)
        return master, self.local_lr(lr, param), self.schedule.update_iteration(self.nets, iteration)


class MultiPrecisionAdamOptimizer(_MasterUpdate, AdamOptimizer):
    """Adam on float32 masters (placer's pattern; Caffe2 ships no multi-precision Adam)."""

    def run(self, param: str, grad) -> None:
        start = self.master_start(param, grad)
        if start is None:
            return
        master, lr, iteration = start
        init = self.nets.param_init.add
        m1 = init("ConstantFill", [master], f"{param}_first_moment", value=0.0)
        m2 = init("ConstantFill", [master], f"{param}_second_moment", value=0.0)
        grad32 = _master_gradient(self, param, grad, "multi-precision Adam")
        self.nets.train.add("Adam", [master, m1, m2, grad32, lr, iteration], [master, m1, m2],
                            beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon)
        self.nets.train.add(self.nets.casts[0], [master], param)


class MultiPrecisionAdagradOptimizer(_MasterUpdate, AdagradOptimizer):
    """Adagrad on float32 masters (placer's pattern; Caffe2 ships no multi-precision Adagrad)."""

    def run(self, param: str, grad) -> None:
        start = self.master_start(param, grad)
        if start is None:
            return
        master, lr, _ = start
        history = self.nets.param_init.add("ConstantFill", [master], f"{param}_squared_sum", value=0.0)
        weight_decay = 0.0
        if self.weight_decay > 0:
            shape = _param_shape(self.nets, param, "Adagrad's weight decay (skipped for 1-D parameters)")
            weight_decay = self.weight_decay if len(shape) > 1 else 0.0
        grad32 = _master_gradient(self, param, grad, "multi-precision Adagrad")
        self.nets.train.add("Adagrad", [master, history, grad32, lr], [master, history],
                            epsilon=self.epsilon, decay=float(self.decay),
                            weight_decay=weight_decay or None, engine="")
        self.nets.train.add(self.nets.casts[0], [master], param)


class WeightDecayBuilder:
    """``WeightedSum([g, ONE, p, wd]) -> g``: L2 decay added to a dense gradient."""

    def __init__(self, nets: TrainNets, weight_decay: float):
        self.nets, self.weight_decay = nets, weight_decay

    def run(self, param: str, grad) -> None:
        if isinstance(grad, GradientSlice):
            raise OptimizerError(f"parameter '{param}': Caffe2's weight decay does not take "
                                 "sparse gradients")
        scope = self.nets.scope.current or device_option()
        t, i = scope.device_type, scope.device_id
        init = self.nets.param_init.add
        one = init("ConstantFill", [], f"ONE_{t}_{i}", shape=[1], value=1.0)
        # a scaled loss's gradient gets the decay scaled alike: the update then sees g + wd * p
        decay = self.weight_decay * (self.nets.loss_scale or 1.0)
        wd = init("ConstantFill", [], f"wd_{t}_{i}", shape=[1], value=decay)
        self.nets.train.add("WeightedSum", [grad, one, param, wd], grad)


def _param_shape(nets: TrainNets, param: str, needed_for: str) -> tuple:
    shape = nets.param_shapes.get(param)
    if shape is None:
        raise OptimizerError(f"parameter '{param}': its shape is unknown (the init net's fill op "
                             f"gives none), and {needed_for} needs it",
                             hint="fill it with a shape argument in the init net")
    return tuple(shape)


# ---------------------------------------------------------------- the builders

def build(nets: TrainNets, optimizer, params: list[str] | None = None,
          sparse_optimizer=None) -> None:
    """Caffe2's ``optimizer._build``: each parameter in its device scope (the device of the
    op that writes it, the init net's first), through ``sparse_optimizer`` when its gradient
    is a GradientSlice and one is given."""
    devices = blob_devices(nets.net)
    devices.update(blob_devices(nets.init))
    for param in nets.params if params is None else params:
        grad = nets.grads[param]
        device = devices.get(param)
        if device is None:
            key = grad.values if isinstance(grad, GradientSlice) else grad
            device = devices.get(key)
        if device is None:
            raise OptimizerError(f"parameter '{param}': no op writes it or its gradient, so its "
                                 "device is unknown")
        chosen = sparse_optimizer if sparse_optimizer and isinstance(grad, GradientSlice) else optimizer
        start = len(nets.net.op)
        with nets.scope(device):
            chosen.run(param, grad)
        if nets.dynamic:
            guard_update(nets, start, param)


def add_weight_decay(nets: TrainNets, weight_decay: float) -> None:
    """L2 weight decay on ``nets.weights`` with dense gradients (Caffe2's ``add_weight_decay``)."""
    weights = [p for p in nets.params if p in set(nets.weights)
               and not isinstance(nets.grads[p], GradientSlice)]
    build(nets, WeightDecayBuilder(nets, weight_decay), params=weights)


def build_sgd(nets: TrainNets, base_lr: float, momentum: float = 0.0, nesterov: bool = True,
              **kw) -> None:
    build(nets, SgdOptimizer(nets, base_lr, momentum=momentum, nesterov=nesterov, **kw))


def build_adagrad(nets: TrainNets, base_lr: float, epsilon: float = 1e-4, weight_decay: float = 0.0,
                  rowwise: bool = False, multi_precision: bool = False, **kw) -> None:
    """``multi_precision``: parameters with masters update them (``MultiPrecisionAdagradOptimizer``)."""
    sparse = None
    if rowwise and _has_sparse(nets):
        sparse = AdagradOptimizer(nets, base_lr, epsilon=epsilon, weight_decay=weight_decay,
                                  rowwise=True, **kw)
    cls = MultiPrecisionAdagradOptimizer if multi_precision else AdagradOptimizer
    dense = cls(nets, base_lr, epsilon=epsilon, weight_decay=weight_decay, **kw)
    build(nets, dense, sparse_optimizer=sparse)


def build_adam(nets: TrainNets, base_lr: float, beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-8, rowwise: bool = False, multi_precision: bool = False,
               **kw) -> None:
    """``multi_precision``: parameters with masters update them (``MultiPrecisionAdamOptimizer``)."""
    sparse = None
    if rowwise and _has_sparse(nets):
        sparse = AdamOptimizer(nets, base_lr, beta1=beta1, beta2=beta2, epsilon=epsilon,
                               rowwise=True, **kw)
    cls = MultiPrecisionAdamOptimizer if multi_precision else AdamOptimizer
    dense = cls(nets, base_lr, beta1=beta1, beta2=beta2, epsilon=epsilon, **kw)
    build(nets, dense, sparse_optimizer=sparse)


def build_multi_precision_sgd(nets: TrainNets, base_lr: float, momentum: float = 0.0,
                              nesterov: bool = True, **kw) -> None:
    build(nets, MultiPrecisionSgdOptimizer(nets, base_lr, momentum=momentum, nesterov=nesterov, **kw))


def build_fp16_sgd(nets: TrainNets, base_lr: float, momentum: float = 0.0, nesterov: bool = True,
                   weight_decay: float = 1e-4, **kw) -> None:
    """Parameters with sparse gradients (which FP16Sgd refuses) get a plain ``SgdOptimizer`` of
    their own, as a Caffe2 model gives its embedding tables (``param_info.optimizer``)."""
    sparse = SgdOptimizer(nets, base_lr, momentum=momentum, nesterov=nesterov, **kw) \
        if _has_sparse(nets) else None
    build(nets, FP16SgdOptimizer(nets, base_lr, momentum=momentum, nesterov=nesterov,
                                 weight_decay=weight_decay, **kw), sparse_optimizer=sparse)


def build_adadelta(nets: TrainNets, base_lr: float, epsilon: float = 1e-4, decay: float = 0.95,
                   **kw) -> None:
    build(nets, AdadeltaOptimizer(nets, base_lr, epsilon=epsilon, decay=decay, **kw))


def _has_sparse(nets: TrainNets) -> bool:
    return any(isinstance(nets.grads[p], GradientSlice) for p in nets.params)
