"""Post-training quantization of a float32 NCHW Caffe2 net into Caffe2's Int8 (QNNPACK) form.

``quantize(predict, init, calibration_batches)`` -> ``(int8_predict, int8_init)`` lays the
net out as Caffe2's int8 nets are laid out (QNNPACK's NHWC ops between an NCHW2NHWC /
Int8Quantize at the inputs and Int8Dequantize / NHWC2NCHW at the outputs, weights and
biases as Int8 fills in the init net); the names of the blobs it adds (``_nhwc``,
``_int8``, ``_float``, ``_nchw``) are this module's own convention:

- each fed 4-D input ``x``: ``NCHW2NHWC`` -> ``x_nhwc``, ``Int8Quantize`` -> ``x_int8``
  (a 2-D input is quantized as it is);
- ``Conv`` -> ``Int8Conv`` (``Int8ConvRelu`` where the conv's only reader is a ``Relu``:
  fused), NHWC, the kernel size given as an argument; ``FC`` -> ``Int8FC`` (on a 4-D input
  its weight columns are permuted from C, H, W to H, W, C order); ``Sum`` / ``Add`` of two
  inputs -> ``Int8Sum`` / ``Int8Add`` (``...Relu`` fused the same way); ``Relu`` ->
  ``Int8Relu``; ``MaxPool`` / ``AveragePool`` -> ``Int8MaxPool`` / ``Int8AveragePool``;
  ``Concat`` (channels) -> ``Int8Concat`` on axis 3; ``Flatten`` / ``Reshape`` ->
  ``Int8Flatten`` / ``Int8Reshape`` (after an ``Int8Transpose`` back to NCHW order when
  the spatial size is not 1 x 1, so the flattened order is the float net's);
- ``Softmax`` stays a float op on the dequantized logits ``x_float`` (the "float tail", as
  the model zoo's quantized ResNet-50 keeps it), or ``Int8Softmax`` with ``int8_softmax=True``;
- each external output ``y``: its Int8 blob is ``y_int8``, then ``Int8Dequantize``
  (-> ``y_nhwc`` and ``NHWC2NCHW`` -> ``y`` when 4-D, else -> ``y``): the outputs keep
  their float names, shapes and layout;
- before converting: inference ``SpatialBN`` is folded into the conv before it
  (w' = w * gamma / sqrt(var + eps), b' = (b - mean) * gamma / sqrt(var + eps) + beta),
  inference ``Dropout`` is dropped (it is the identity), and blobs written more than once
  (in-place ops) are renamed so that every value has its own name (the last write keeps
  the name).

Quantization parameters (uint8, asymmetric, per tensor):
- weights: from the min / max of the (folded) weights, the range widened to hold 0:
  scale = (max - min) / 255, zero point = round(-min / scale) in 0..255; written as
  ``Int8GivenTensorFill`` (conv weights as (M, kH, kW, C/group));
- biases: int32 round(b / (x_scale * w_scale)), ``Int8GivenIntTensorFill`` with scale
  x_scale * w_scale (float32) and zero point 0;
- activations: the same rule over the min / max seen over ``calibration_batches`` (the
  float net run op by op with placer's kernels, ``activation_ranges``).

Constraints of the ops, and how they are met:
- ``Int8Relu``, ``Int8MaxPool``, ``Int8Concat`` (every input), ``Int8Flatten``,
  ``Int8Reshape``, ``Int8Transpose`` keep their input's quantization: those blobs form one
  class with one (scale, zero point) from the union of their ranges (a blob read only by
  a Relu contributes nothing: its negative part saturates to the zero point, which the
  Relu makes of it anyway);
- conv / FC: x_scale * w_scale / y_scale < 1 (QNNPACK), else y_scale is raised;
- ``Int8Sum`` / ``Int8Add``: each input-to-output scale ratio below 2^8 (y_scale is raised)
  and at least 2^-14, the larger at least 2^-10 (else an error naming the op);
- ``Int8AveragePool``: x_scale / y_scale in [2^-8, 2^8) (y_scale raised above the range);
- ``Int8Softmax``: output scale 1/256, zero point 0.
Raising one class's scale can break a later op's constraint; the rules are applied until
none changes (a handful of passes).

What it cannot convert, each an ``ArgumentError`` naming the op: any other op type (LRN,
Sigmoid, ...), a SpatialBN not directly after a conv (or in training mode), Sum of more
than two inputs, a broadcasting Add, an FC with ``axis`` other than 1, a Concat on another
axis or one whose split-info output is read, NHWC float convs, 3-D convs, a Reshape whose
shape is an input, an op that reads the float output of the float tail.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from placer.errors import ArgumentError
from placer.examples import resnet
from placer.examples.builder import NetBuilder, make_op
from placer.formats import caffe2_pb as pb
from placer.formats.caffe2 import net_from_netdef
from placer.ops import registry
from placer.ops.int8_base import f32
from placer.ops.int8_base import quantize as quantize_values
from placer.types import Args

CONV_ARGS = frozenset({"kernel", "kernels", "kernel_h", "kernel_w", "stride", "strides", "stride_h",
                       "stride_w", "pad", "pads", "pad_t", "pad_l", "pad_b", "pad_r", "dilation",
                       "dilations", "dilation_h", "dilation_w", "group", "legacy_pad"})
POOL_ARGS = CONV_ARGS - {"group"} | {"global_pooling"}
CONVERTED = ("Conv", "FC", "Relu", "Sum", "Add", "MaxPool", "AveragePool", "Concat", "Flatten",
             "Reshape", "Softmax", "SpatialBN (folded)", "Dropout (dropped)")
MAX_PASSES = 64


@dataclass
class FloatOp:
    """One op of the float net being converted (plain Python values)."""

    type: str
    inputs: list[str]
    outputs: list[str]
    args: dict[str, Any]
    label: str


@dataclass
class FloatNet:
    """The float net ready to convert: SSA names, BN folded, Dropout dropped, parameters as
    arrays (``params``), fed inputs and outputs."""

    name: str
    ops: list[FloatOp]
    params: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]


@dataclass
class QParams:
    scale: float
    zero_point: int


@dataclass
class _Int8Op:
    """An op of the Int8 net before emission; ``y`` is its quantized output (None: float)."""

    type: str
    inputs: list[str]
    outputs: list[str]
    args: dict[str, Any]
    label: str
    kind: str = ""                       # "conv", "fc", "sum", "avg", "same", "softmax", ""
    weight: str = ""                     # conv / fc: the float weight and bias names
    bias: str = ""
    fc_input_shape: tuple = ()           # fc on a 4-D input: (N, C, H, W)


@dataclass
class _Classes:
    """Union-find over blobs that must share one quantization."""

    parent: dict[str, str] = field(default_factory=dict)

    def find(self, b: str) -> str:
        self.parent.setdefault(b, b)
        while self.parent[b] != b:
            self.parent[b] = self.parent[self.parent[b]]
            b = self.parent[b]
        return b

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


# ---------------------------------------------------------------- running the float net

def _args(op, seed: int = 0) -> Args:
    if op.args.seed:
        seed = op.args.seed
    elif isinstance(op.args.get("seed"), int):
        seed = op.args["seed"]
    else:
        name = op.outputs[0] if op.outputs else op.type
        seed = zlib.crc32(name.encode()) & 0x7FFFFFFF      # as the executor seeds a fill (seed 0)
    return Args(dict(op.args), op=op.label, seed=seed, n_outputs=len(op.outputs))


def run_init(init: pb.NetDef) -> dict[str, np.ndarray]:
    """The init net's blobs, computed with placer's kernels on the host (fills seeded as
    placer's Executor seeds them at its default seed)."""
    blobs: dict[str, Any] = {}
    for op in net_from_netdef(init).ops:
        outs = registry.get(op.type).kernel(np, [blobs[i] for i in op.inputs], _args(op))
        blobs.update(zip(op.outputs, outs))
    return blobs


def _run_ops(ops: list[FloatOp], blobs: dict[str, Any]) -> dict[str, Any]:
    for op in ops:
        opdef = registry.get(op.type)
        if opdef is None or opdef.kernel is None:
            raise ArgumentError(f"op {op.label}: placer has no kernel for {op.type}")
        a = Args(dict(op.args), op=op.label, n_outputs=len(op.outputs))
        outs = opdef.kernel(np, [blobs[i] for i in op.inputs], a)
        blobs.update(zip(op.outputs, outs))
    return blobs


def run_float(net: FloatNet, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every blob of one run of the prepared float net on ``batch``."""
    return _run_ops(net.ops, {**net.params, **{k: np.asarray(v) for k, v in batch.items()}})


def activation_ranges(net: FloatNet, batches: Iterable[Mapping[str, np.ndarray]]
                      ) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[int, ...]]]:
    """Per activation blob: (min, max) over every batch, and its shape (last batch)."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    n = 0
    for batch in batches:
        n += 1
        for name, v in run_float(net, batch).items():
            if name in net.params or not isinstance(v, np.ndarray) or v.dtype != np.float32 or not v.size:
                continue
            lo[name] = min(lo.get(name, np.inf), float(v.min()))
            hi[name] = max(hi.get(name, -np.inf), float(v.max()))
            shapes[name] = tuple(v.shape)
    if not n:
        raise ArgumentError("quantize: no calibration batches given")
    return {k: (lo[k], hi[k]) for k in lo}, shapes


# ---------------------------------------------------------------- preparing the float net

def _ssa(ops: list[FloatOp], outputs: list[str]) -> list[FloatOp]:
    """Rename every write but the last of a blob written more than once (``x`` -> ``x_v0``, ...)."""
    writes: dict[str, int] = defaultdict(int)
    for op in ops:
        for o in op.outputs:
            writes[o] += 1
    seen: dict[str, int] = defaultdict(int)
    current: dict[str, str] = {}
    out = []
    for op in ops:
        ins = [current.get(i, i) for i in op.inputs]
        outs = []
        for o in op.outputs:
            k = seen[o]
            seen[o] += 1
            name = o if k == writes[o] - 1 else f"{o}_v{k}"
            current[o] = name
            outs.append(name)
        out.append(FloatOp(op.type, ins, outs, dict(op.args), op.label))
    return out


def _readers(ops: list[FloatOp]) -> dict[str, list[int]]:
    r: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        for b in op.inputs:
            r[b].append(i)
    return r


def fold_batchnorm(ops: list[FloatOp], params: dict[str, np.ndarray], outputs: list[str]) -> list[FloatOp]:
    """Fold each inference SpatialBN into the conv before it (new weight and bias params)."""
    readers = _readers(ops)
    producer = {o: i for i, op in enumerate(ops) for o in op.outputs}
    drop, out = set(), list(ops)
    for i, op in enumerate(ops):
        if op.type != "SpatialBN":
            continue
        if not op.args.get("is_test", 0):
            raise ArgumentError(f"op {op.label}: a SpatialBN in training mode cannot be quantized "
                                "(set is_test: 1)")
        x = op.inputs[0]
        j = producer.get(x)
        conv = ops[j] if j is not None else None
        if conv is None or conv.type != "Conv" or readers[x] != [i] or x in outputs:
            raise ArgumentError(f"op {op.label}: SpatialBN can be quantized only folded into a Conv "
                                f"whose output it alone reads ('{x}')")
        gamma, beta, mean, var = (params[n].astype(np.float64) for n in op.inputs[1:5])
        eps = float(op.args.get("epsilon", 1e-5))
        k = gamma / np.sqrt(var + eps)
        w = params[conv.inputs[1]].astype(np.float64)
        b = params[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 else np.zeros(w.shape[0])
        wname = conv.inputs[1]
        bname = (conv.inputs[2] if len(conv.inputs) > 2 else
                 (wname[:-2] if wname.endswith("_w") else wname) + "_b")
        while bname in params and len(conv.inputs) < 3:
            bname += "_"
        params[wname] = (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        params[bname] = ((b - mean) * k + beta).astype(np.float32)
        out[j] = FloatOp("Conv", [conv.inputs[0], wname, bname], list(op.outputs), dict(conv.args),
                         conv.label)
        drop.add(i)
    return [op for i, op in enumerate(out) if i not in drop]


def _drop_dropout(ops: list[FloatOp], outputs: list[str]) -> list[FloatOp]:
    rename: dict[str, str] = {}
    out = []
    for op in ops:
        ins = [rename.get(b, b) for b in op.inputs]
        if op.type == "Dropout":
            if not op.args.get("is_test", 0):
                raise ArgumentError(f"op {op.label}: a training-mode Dropout cannot be quantized "
                                    "(set is_test: 1)")
            if op.outputs[0] in outputs:
                raise ArgumentError(f"op {op.label}: a Dropout writing an external output cannot be dropped")
            rename[op.outputs[0]] = ins[0]
            continue
        out.append(FloatOp(op.type, ins, op.outputs, op.args, op.label))
    return out


def prepare(predict: pb.NetDef, init: pb.NetDef, params: Mapping[str, Any] | None = None) -> FloatNet:
    """The float net as ``quantize`` converts it: SSA names, SpatialBN folded, Dropout
    dropped; ``params`` (the init net's blobs, e.g. placer's ``Executor.run_init()``)
    default to ``run_init(init)``."""
    net = net_from_netdef(predict, init)
    values = {k: np.asarray(v) for k, v in (params if params is not None else run_init(init)).items()}
    ops = [FloatOp(op.type, list(op.inputs), list(op.outputs), dict(op.args), op.label) for op in net.ops]
    outputs = list(net.external_outputs)
    ops = _ssa(ops, outputs)
    ops = _drop_dropout(ops, outputs)
    ops = fold_batchnorm(ops, values, outputs)
    used = {b for op in ops for b in op.inputs}
    return FloatNet(net.name, ops, {k: v for k, v in values.items() if k in used},
                    [b for b in net.data_inputs if b in used], outputs)


def float_netdefs(net: FloatNet) -> tuple[pb.NetDef, pb.NetDef]:
    """The prepared float net as NetDefs: its params as GivenTensorFill (the float
    reference the quantized net is measured against; it runs in Caffe2 too)."""
    predict = pb.NetDef(name=f"{net.name}_float")
    for op in net.ops:
        predict.op.append(make_op(op.type, op.inputs, op.outputs, **op.args))
    predict.external_input.extend(net.inputs + list(net.params))
    predict.external_output.extend(net.outputs)
    init = pb.NetDef(name=f"{net.name}_float_init")
    for name, v in net.params.items():
        init.op.append(make_op("GivenTensorFill", [], [name], shape=list(v.shape),
                               values=[float(x) for x in v.astype(np.float32).reshape(-1)]))
    init.external_output.extend(net.params)
    return predict, init


# ---------------------------------------------------------------- quantization parameters

def qparams(lo: float, hi: float) -> QParams:
    """Asymmetric uint8 parameters of a range (widened to hold 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not hi - lo > 0:
        return QParams(1.0, 0)
    scale = float(f32((hi - lo) / 255.0))
    if f32(scale) < np.finfo(np.float32).tiny:
        scale = float(np.finfo(np.float32).tiny)
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    return QParams(scale, zp)


def _rescaled(q: QParams, scale: float, rng: tuple[float, float]) -> QParams:
    """``q`` with a larger scale, the zero point re-centred on the class's range."""
    lo = min(rng[0], 0.0)
    return QParams(float(f32(scale)), int(np.clip(np.rint(-lo / float(f32(scale))), 0, 255)))


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, QParams]:
    q = qparams(float(w.min()), float(w.max())) if w.size else QParams(1.0, 0)
    return quantize_values(np, w.astype(np.float32), q.scale, q.zero_point), q


# ---------------------------------------------------------------- the conversion

INT8_FORMS = frozenset({"Conv", "FC", "Relu", "Sum", "Add", "MaxPool", "AveragePool", "Concat", "Flatten",
                        "Reshape", "Softmax"})


def precheck(net: FloatNet) -> None:
    """What can be told before calibrating: op types without an Int8 form, FC axes, Sum
    arities, float layouts (the rest is checked in the conversion, with the shapes)."""
    for op in net.ops:
        a = op.args
        if op.type not in INT8_FORMS:
            raise ArgumentError(f"op {op.label}: {op.type} has no Int8 form here (quantize converts "
                                f"{', '.join(CONVERTED)})")
        if op.type == "FC" and (int(a.get("axis", 1)) != 1 or int(a.get("axis_w", 1)) != 1):
            raise ArgumentError(f"op {op.label}: quantize takes FC with axis 1 and axis_w 1 only")
        if op.type in ("Sum", "Add") and len(op.inputs) != 2:
            raise ArgumentError(f"op {op.label}: Int8{op.type} adds exactly two inputs, found {len(op.inputs)}")
        if op.type in ("Conv", "MaxPool", "AveragePool") and str(a.get("order", "NCHW")).upper() != "NCHW":
            raise ArgumentError(f"op {op.label}: quantize takes NCHW float nets ({op.type} says "
                                f"order {a.get('order')!r})")


def _int8_ops(net: FloatNet, shapes: dict[str, tuple[int, ...]], int8_softmax: bool) -> list[_Int8Op]:
    """The float ops as Int8 ops on float names (fused where a Relu follows)."""
    readers = _readers(net.ops)
    fused: set[int] = set()
    out: list[_Int8Op] = []
    outputs = set(net.outputs)

    def relu_after(i: int) -> int | None:
        y = net.ops[i].outputs[0]
        r = readers.get(y, [])
        if len(r) == 1 and net.ops[r[0]].type == "Relu" and y not in outputs:
            return r[0]
        return None

    float_blobs: set[str] = set()
    transposed: set[str] = set()
    for i, op in enumerate(net.ops):
        if i in fused:
            continue
        if any(b in float_blobs for b in op.inputs):
            raise ArgumentError(f"op {op.label}: reads the float output of the float tail "
                                f"('{next(b for b in op.inputs if b in float_blobs)}'); only a final "
                                "Softmax may stay float")
        t, a = op.type, op.args
        if t == "Conv":
            if str(a.get("order", "NCHW")).upper() != "NCHW":
                raise ArgumentError(f"op {op.label}: quantize takes NCHW float convs")
            w = net.params.get(op.inputs[1])
            if w is None or w.ndim != 4:
                raise ArgumentError(f"op {op.label}: Conv needs a 4-D weight from the init net "
                                    "(2-D convolution only)")
            args = {k: v for k, v in a.items() if k in CONV_ARGS}
            if not any(k in args for k in ("kernel", "kernels", "kernel_h", "kernel_w")):
                if w.shape[2] == w.shape[3]:
                    args["kernel"] = int(w.shape[2])
                else:
                    args["kernel_h"], args["kernel_w"] = int(w.shape[2]), int(w.shape[3])
            args["order"] = "NHWC"
            j = relu_after(i)
            y = op.outputs[0]
            if j is not None:
                fused.add(j)
                y = net.ops[j].outputs[0]
            bias = op.inputs[2] if len(op.inputs) > 2 else ""
            out.append(_Int8Op("Int8ConvRelu" if j is not None else "Int8Conv", [op.inputs[0]], [y],
                               args, op.label, "conv", op.inputs[1], bias))
        elif t == "FC":
            if int(a.get("axis", 1)) != 1 or int(a.get("axis_w", 1)) != 1:
                raise ArgumentError(f"op {op.label}: quantize takes FC with axis 1 and axis_w 1 only")
            x_shape = shapes.get(op.inputs[0], ())
            bias = op.inputs[2] if len(op.inputs) > 2 else ""
            out.append(_Int8Op("Int8FC", [op.inputs[0]], [op.outputs[0]], {}, op.label, "fc",
                               op.inputs[1], bias, x_shape if len(x_shape) == 4 else ()))
        elif t in ("Sum", "Add"):
            if len(op.inputs) != 2:
                raise ArgumentError(f"op {op.label}: Int8{t} adds exactly two inputs, found {len(op.inputs)}")
            if shapes.get(op.inputs[0]) != shapes.get(op.inputs[1]):
                raise ArgumentError(f"op {op.label}: Int8{t} does not broadcast: inputs "
                                    f"{shapes.get(op.inputs[0])} and {shapes.get(op.inputs[1])}")
            j = relu_after(i)
            y = op.outputs[0]
            if j is not None:
                fused.add(j)
                y = net.ops[j].outputs[0]
            out.append(_Int8Op(f"Int8{t}Relu" if j is not None else f"Int8{t}", list(op.inputs), [y], {},
                               op.label, "sum"))
        elif t == "Relu":
            out.append(_Int8Op("Int8Relu", list(op.inputs), list(op.outputs), {}, op.label, "same"))
        elif t in ("MaxPool", "AveragePool"):
            if str(a.get("order", "NCHW")).upper() != "NCHW":
                raise ArgumentError(f"op {op.label}: quantize takes NCHW float pools")
            args = {k: v for k, v in a.items() if k in POOL_ARGS}
            args["order"] = "NHWC"
            out.append(_Int8Op(f"Int8{t}", [op.inputs[0]], [op.outputs[0]], args, op.label,
                               "same" if t == "MaxPool" else "avg"))
        elif t == "Concat":
            rank = len(shapes.get(op.inputs[0], ()))
            axis = 1 if "order" in a and str(a["order"]).upper() == "NCHW" else int(a.get("axis", 1))
            if a.get("add_axis", 0) or axis % max(rank, 1) != 1 or rank not in (2, 4):
                raise ArgumentError(f"op {op.label}: quantize takes Concat of 2-D or 4-D inputs on "
                                    "the channel axis only")
            if len(op.outputs) > 1 and readers.get(op.outputs[1]):
                raise ArgumentError(f"op {op.label}: the Concat's split-info output "
                                    f"'{op.outputs[1]}' is read; Int8Concat writes none")
            out.append(_Int8Op("Int8Concat", list(op.inputs), [op.outputs[0]],
                               {"axis": 3 if rank == 4 else 1}, op.label, "same"))
        elif t in ("Flatten", "Reshape"):
            x = op.inputs[0]
            xs = shapes.get(x, ())
            if t == "Reshape" and len(op.inputs) > 1:
                raise ArgumentError(f"op {op.label}: quantize takes Reshape with a 'shape' argument only")
            if t == "Flatten" and int(a.get("axis", 1)) != 1:
                raise ArgumentError(f"op {op.label}: quantize takes Flatten at axis 1 only")
            if len(xs) == 4 and xs[2] * xs[3] != 1:
                if x not in transposed:          # one NCHW copy for every reader
                    out.append(_Int8Op("Int8Transpose", [x], [f"{x}_nchw"], {"axes": [0, 3, 1, 2]},
                                       op.label, "same"))
                    transposed.add(x)
                x = f"{x}_nchw"
            args = {"shape": list(a["shape"])} if t == "Reshape" else {"axis": 1}
            outs = [op.outputs[0]]
            if t == "Reshape":     # Caffe2's Int8Reshape schema wants both outputs
                if len(op.outputs) > 1 and readers.get(op.outputs[1]):
                    raise ArgumentError(f"op {op.label}: the Reshape's old-shape output is read "
                                        "(Int8Reshape's is the NHWC shape)")
                outs.append(op.outputs[1] if len(op.outputs) > 1 else f"{op.outputs[0]}_old_shape")
            out.append(_Int8Op(f"Int8{t}", [x], outs, args, op.label, "same"))
        elif t == "Softmax":
            x_shape = shapes.get(op.inputs[0], ())
            if int8_softmax:
                if int(a.get("axis", 1)) != 1 or len(x_shape) != 2:
                    raise ArgumentError(f"op {op.label}: Int8Softmax takes a 2-D input on axis 1")
                out.append(_Int8Op("Int8Softmax", list(op.inputs), list(op.outputs), {}, op.label,
                                   "softmax"))
            else:
                out.append(_Int8Op("Softmax", list(op.inputs), list(op.outputs), dict(a), op.label))
                float_blobs.update(op.outputs)
        else:
            raise ArgumentError(f"op {op.label}: {t} has no Int8 form here (quantize converts "
                                f"{', '.join(CONVERTED)})")
    return out


def _assign(ops: list[_Int8Op], net: FloatNet, ranges: dict[str, tuple[float, float]],
            wq: dict[str, QParams]) -> dict[str, QParams]:
    """Every Int8 blob's quantization, the ops' constraints met."""
    classes = _Classes()
    readers: dict[str, list[_Int8Op]] = defaultdict(list)
    for op in ops:
        for b in op.inputs:
            readers[b].append(op)
        for b in op.inputs + op.outputs:
            classes.find(b)
        if op.kind == "same":
            for b in op.inputs:
                classes.union(op.outputs[0], b)
    # a transposed copy (Flatten / Reshape of NHWC) has the range of what it copies
    for op in ops:
        if op.type == "Int8Transpose":
            ranges[op.outputs[0]] = ranges[op.inputs[0]]
    members: dict[str, list[str]] = defaultdict(list)
    for b in list(classes.parent):
        members[classes.find(b)].append(b)
    q: dict[str, QParams] = {}
    span: dict[str, tuple[float, float]] = {}
    fixed: set[str] = set()
    for root, blobs in members.items():
        lo, hi = np.inf, -np.inf
        for b in blobs:
            only_relu = readers.get(b) and all(op.type == "Int8Relu" for op in readers[b]) \
                and b not in net.outputs
            if b in ranges and not only_relu:
                lo, hi = min(lo, ranges[b][0]), max(hi, ranges[b][1])
        if not np.isfinite(lo):
            lo, hi = min((ranges[b][0] for b in blobs if b in ranges), default=0.0), \
                max((ranges[b][1] for b in blobs if b in ranges), default=0.0)
        span[root] = (lo, hi)
        q[root] = qparams(lo, hi)
    for op in ops:
        if op.kind == "softmax":
            root = classes.find(op.outputs[0])
            q[root] = QParams(float(f32(1.0 / 256.0)), 0)
            fixed.add(root)

    def get(b: str) -> QParams:
        return q[classes.find(b)]

    def raise_to(b: str, scale: float, op: _Int8Op) -> bool:
        root = classes.find(b)
        if root in fixed:
            raise ArgumentError(f"op {op.label}: its output's quantization is fixed (1/256) and "
                                "breaks the op's scale limits")
        if f32(scale) <= f32(q[root].scale):
            return False
        q[root] = _rescaled(q[root], scale, span[root])
        return True

    for _ in range(MAX_PASSES):
        changed = False
        for op in ops:
            if op.kind in ("conv", "fc"):
                x, y = get(op.inputs[0]), get(op.outputs[0])
                product = f32(x.scale) * f32(wq[op.weight].scale)
                if not product / f32(y.scale) < 1:
                    target = f32(float(product) * (1 + 2 ** -12))
                    while not product / target < 1:
                        target = np.nextafter(target, np.float32(np.inf))
                    changed |= raise_to(op.outputs[0], float(target), op)
            elif op.kind == "sum":
                y = get(op.outputs[0])
                xs = [get(b).scale for b in op.inputs]
                big = max(xs)
                if not f32(big) / f32(y.scale) < 2.0 ** 8:
                    changed |= raise_to(op.outputs[0], big / 255.0, op)
                    y = get(op.outputs[0])
                ratios = [f32(s) / f32(y.scale) for s in xs]
                if min(ratios) < 2.0 ** -14 or max(ratios) < 2.0 ** -10:
                    raise ArgumentError(f"op {op.label}: input-to-output scale ratios "
                                        f"{[float(r) for r in ratios]} are below QNNPACK's limits "
                                        "(2^-14 each, 2^-10 the larger)")
            elif op.kind == "avg":
                x, y = get(op.inputs[0]), get(op.outputs[0])
                if not f32(x.scale) / f32(y.scale) < 2.0 ** 8:
                    changed |= raise_to(op.outputs[0], x.scale / 255.0, op)
                elif f32(x.scale) / f32(y.scale) < 2.0 ** -8:
                    raise ArgumentError(f"op {op.label}: Int8AveragePool input-to-output scale ratio "
                                        "is below 2^-8")
        if not changed:
            break
    else:
        raise ArgumentError("quantize: the scale constraints did not settle")
    return {b: get(b) for b in classes.parent}


def quantize(net_predict: pb.NetDef, net_init: pb.NetDef,
             calibration_batches: Iterable[Mapping[str, np.ndarray]], *,
             params: Mapping[str, Any] | None = None, int8_softmax: bool = False,
             name: str | None = None) -> tuple[pb.NetDef, pb.NetDef]:
    """The Int8 (predict, init) NetDefs of a float32 NCHW net (module docstring).

    ``calibration_batches``: dicts {fed input: float32 array}, run through the float net
    to find the activation ranges. ``params``: the init net's blobs when already computed
    (e.g. placer ``Executor.run_init()``), else the init net is run here."""
    net = prepare(net_predict, net_init, params)
    precheck(net)
    ranges, shapes = activation_ranges(net, calibration_batches)
    return convert(net, ranges, shapes, int8_softmax=int8_softmax, name=name)


def convert(net: FloatNet, ranges: dict[str, tuple[float, float]], shapes: dict[str, tuple[int, ...]],
            int8_softmax: bool = False, name: str | None = None) -> tuple[pb.NetDef, pb.NetDef]:
    """The prepared float net with its activation ranges -> the Int8 NetDefs."""
    ranges = dict(ranges)
    ops = _int8_ops(net, shapes, int8_softmax)
    weights: dict[str, tuple[np.ndarray, QParams]] = {}
    for op in ops:
        if op.kind in ("conv", "fc") and op.weight not in weights:
            w = net.params[op.weight].astype(np.float32)
            if op.kind == "conv":
                w = w.transpose(0, 2, 3, 1)
            elif op.fc_input_shape:
                _, c, h, wd = op.fc_input_shape
                w = w.reshape(w.shape[0], c, h, wd).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)
            weights[op.weight] = quantize_weight(np.ascontiguousarray(w))
    q = _assign(ops, net, ranges, {k: v[1] for k, v in weights.items()})

    predict = pb.NetDef(name=name or f"{net.name}_int8")
    init = pb.NetDef(name=f"{predict.name}_init")
    float_tail = {b for op in ops if op.kind == "" for b in op.outputs}
    int8_outputs = [b for b in net.outputs if b not in float_tail]
    rename = {b: f"{b}_int8" for b in int8_outputs}
    for x in net.inputs:
        rename[x] = f"{x}_int8"

    def n(b: str) -> str:
        return rename.get(b, b)

    def emit(t: str, ins, outs, **args) -> None:
        predict.op.append(make_op(t, list(ins), list(outs), **args))

    for x in net.inputs:
        src = x
        if len(shapes.get(x, ())) == 4:
            emit("NCHW2NHWC", [x], [f"{x}_nhwc"])
            src = f"{x}_nhwc"
        emit("Int8Quantize", [src], [n(x)], Y_scale=q[x].scale, Y_zero_point=q[x].zero_point)
    params_out: list[str] = []
    dequantized: dict[str, str] = {}
    for op in ops:
        if op.kind == "":                         # the float tail reads dequantized values
            ins = []
            for b in op.inputs:
                if b not in dequantized:
                    dequantized[b] = _dequantize(emit, n(b), f"{b}_float", len(shapes.get(b, ())) == 4)
                ins.append(dequantized[b])
            emit(op.type, ins, op.outputs, **op.args)
            continue
        y = op.outputs[0]
        args = {**op.args, "Y_scale": q[y].scale, "Y_zero_point": q[y].zero_point}
        ins = [n(b) for b in op.inputs]
        if op.kind in ("conv", "fc"):
            data, wq = weights[op.weight]
            bname = op.bias or ((op.weight[:-2] if op.weight.endswith("_w") else op.weight) + "_b")
            if op.weight not in params_out:
                init.op.append(make_op("Int8GivenTensorFill", [], [op.weight], values=data.tobytes(),
                                       shape=list(data.shape), Y_scale=wq.scale, Y_zero_point=wq.zero_point))
                params_out.append(op.weight)
            x = q[op.inputs[0]]
            bscale = f32(x.scale) * f32(wq.scale)
            b = net.params[op.bias].astype(np.float64) if op.bias else np.zeros(data.shape[0])
            bq = np.rint(b / float(bscale))
            if np.abs(bq).max(initial=0) >= 2 ** 31:
                raise ArgumentError(f"op {op.label}: the bias '{bname}' does not fit int32 at scale "
                                    f"{float(bscale):.3g}")
            if bname in params_out:
                bname = f"{bname}_{op.outputs[0]}"
            init.op.append(make_op("Int8GivenIntTensorFill", [], [bname], values=[int(v) for v in bq],
                                   shape=[int(b.size)], Y_scale=float(bscale), Y_zero_point=0))
            params_out.append(bname)
            ins += [op.weight, bname]
        emit(op.type, ins, [n(o) for o in op.outputs], **args)
    for y in int8_outputs:
        _dequantize(emit, n(y), y, len(shapes.get(y, ())) == 4)
    written = [o for op in predict.op for o in op.output]
    clash = sorted({o for o in written if written.count(o) > 1})
    if clash:
        raise ArgumentError(f"quantize: the Int8 net would write {clash[0]!r} twice (a float blob "
                            "already has a name this module gives an added blob)")
    predict.external_input.extend(net.inputs + params_out)
    predict.external_output.extend(net.outputs)
    init.external_output.extend(params_out)
    return predict, init


def _dequantize(emit, src: str, dst: str, nhwc: bool) -> str:
    """Int8 ``src`` -> float32 NCHW ``dst`` (through ``dst_nhwc`` when 4-D)."""
    if nhwc:
        emit("Int8Dequantize", [src], [f"{dst}_nhwc"])
        emit("NHWC2NCHW", [f"{dst}_nhwc"], [dst])
    else:
        emit("Int8Dequantize", [src], [dst])
    return dst


# ---------------------------------------------------------------- the bundled Int8 example

TINY_RESNET = resnet.ResNetConfig(name="resnet_tiny_int8", batch=1, image=32, widths=(8, 16, 32),
                                  blocks_per_stage=1, classes=10)


def trained_like_bn(params: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The resnet builder's SpatialBN parameters are the identity (scale 1, shift 0, mean 0,
    variance 1); this draws values like a trained net's, so that folding them matters."""
    rng = np.random.default_rng(seed)
    draws = {"_bn_s": (0.5, 1.5), "_bn_b": (-0.3, 0.3), "_bn_rm": (-0.3, 0.3), "_bn_riv": (0.5, 2.0)}
    out = {}
    for k, v in params.items():
        lohi = next((r for suffix, r in draws.items() if k.endswith(suffix)), None)
        out[k] = rng.uniform(*lohi, np.shape(v)).astype(np.float32) if lohi else np.asarray(v)
    return out


def resnet_tiny_int8(cfg: resnet.ResNetConfig = TINY_RESNET, calibration: int = 8) -> NetBuilder:
    """The bundled Int8 example: a small ResNet-style net (resnet.build at 1x3x32x32, BN
    statistics drawn by ``trained_like_bn``) quantized on ``calibration`` batches of
    standard-normal images (seeded)."""
    b = resnet.build(cfg)
    params = trained_like_bn(run_init(b.init))
    rng = np.random.default_rng(1)
    shape = (cfg.batch, 3, cfg.image, cfg.image)
    batches = [{"data": rng.standard_normal(shape).astype(np.float32)} for _ in range(calibration)]
    p8, i8 = quantize(b.predict, b.init, batches, params=params, name=cfg.name)
    out = NetBuilder(cfg.name)
    out.predict, out.init = p8, i8
    out.value_info = {"data": ("float32", list(shape))}
    return out
