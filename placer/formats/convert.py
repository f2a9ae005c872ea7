"""Caffe layers -> Caffe2 ops (predict net) and fill ops (init net).

The mapping follows Caffe2's own Caffe translator: Convolution->Conv, Deconvolution->
ConvTranspose, InnerProduct->FC, Pooling->MaxPool/AveragePool with ``legacy_pad`` 3
(Caffe's ceil rounding), BatchNorm(+Scale)->SpatialBN, Scale->Mul(+Add), Eltwise->Sum/Mul/
Max, ReLU->Relu/LeakyRelu, LRN, Dropout, Concat, Slice->Split, Flatten, Reshape, Softmax,
SoftmaxWithLoss, Accuracy, ... One deliberate difference: a padded average pooling gets
``count_include_pad`` 1, because Caffe divides by the window including its padding
(Caffe2's default leaves the padding out). Auxiliary outputs are named as the translator
named them (``_<top>_dims`` of Concat, ``_<top>_scale`` of LRN, ``_<top>_mask`` of Dropout).

Parameters are ``<layer>_w`` / ``<layer>_b`` (a ParamSpec ``name`` shares one blob).
SpatialBN reads ``<bn>_rm`` / ``<bn>_riv`` (mean, variance: Caffe's blobs divided by their
moving-average factor) and the folded Scale layer's ``<scale>_w`` / ``<scale>_b`` (a lone
BatchNorm gets ``<bn>_s`` = 1 and ``<bn>_b`` = 0), all of shape (C,).

SSD's fork layers (Permute, Normalize, PriorBox, DetectionOutput) become ops of their Caffe
type with their ``*_param`` fields flattened into arguments (``nms_param.top_k``), which
``placer/ops/detection.py`` runs. A layer type with no mapping (Python, Power, ...) becomes
such an op too, unknown to the registry: loading never fails on it. Where the name
is a Caffe2 op with other semantics (LRN within channels, Exp of base 2), the op is named
``Caffe<type>`` instead.

Parameter shapes need the shapes of the layers' inputs, so blob shapes are propagated
with Caffe's own rules (partial shapes: an unknown dimension is None). The init net has one
fill op per parameter: ``GivenTensorFill`` with the ``.caffemodel`` values when given,
else a seeded random fill chosen from the layer's filler.

``load_caffe_net`` returns the converted nets as the ``Net`` that the rest of placer works on.
"""
from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field
from math import prod

import numpy as np

from placer.errors import NetParseError
from placer.formats.caffe import (DATA_LAYERS, CaffeNet, Shape, blob_array, full_shape, layer_error, load_caffe,
                                  read_caffemodel)
from placer.formats.caffe2 import net_from_netdef
from placer.formats.caffe2_pb import NetDef
from placer.ops import registry
from placer.types import Net, TensorType, shape_problem, shape_text

CAFFE_LEGACY_POOLING = 3


@dataclass
class Conversion:
    """What ``convert_caffe`` made: the two NetDefs and what a user should know about them.

    ``shapes`` holds every blob's shape by Caffe's rules (partial where unknown);
    ``unknown_layers`` the (layer, type) pairs kept as ops of their Caffe type;
    ``missing_params`` the parameters left without a fill op (shape unknown), with why.
    """

    predict: object
    init: object
    input_shapes: dict[str, TensorType]
    param_shapes: dict[str, tuple]
    shapes: dict[str, Shape]
    unknown_layers: list[tuple[str, str]] = field(default_factory=list)
    missing_params: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    weights_used: int = 0


def convert_caffe(path: str | os.PathLike, phase: str = "test", weights: str | os.PathLike | None = None,
                  input_shapes: dict[str, TensorType] | None = None) -> Conversion:
    """Convert a prototxt (and optional ``.caffemodel``) to Caffe2 predict and init nets."""
    caffe = load_caffe(path, phase=phase)
    blobs = read_caffemodel(weights) if weights else None
    return convert_net(caffe, blobs, input_shapes, phase=phase, weights_path=str(weights or ""))


def convert_net(caffe: CaffeNet, weights: dict[str, list[np.ndarray]] | None = None,
                input_shapes: dict[str, TensorType] | None = None, phase: str = "test",
                weights_path: str = "") -> Conversion:
    return _Converter(caffe, weights, input_shapes, phase, weights_path).run()


def load_caffe_net(path: str | os.PathLike, phase: str = "test", weights: str | os.PathLike | None = None,
                   input_shapes: dict[str, TensorType] | None = None) -> Net:
    """A Caffe prototxt (and optional ``.caffemodel``) as a ``Net`` over Caffe2 NetDefs.

    The net is converted to Caffe2 in memory (``convert_caffe``): ``proto``/``init_proto``
    are the converted predict and init nets, ``params`` come from the init net's fill ops,
    ``input_shapes`` from the file. ``input_shapes`` given here (the user's ``--input``)
    complete inputs whose shape the file leaves open, so that the parameters that depend on
    them (the first convolution's channels) get their shapes too.
    """
    result = convert_caffe(path, phase=phase, weights=weights, input_shapes=input_shapes)
    net = net_from_netdef(result.predict, result.init, path=str(path),
                          source_format="caffe-prototxt")
    net.input_shapes.update(result.input_shapes)
    net.shape_hints.update(_unknown_op_shapes(result))
    net.path = str(path)
    net.notes.extend(result.notes)
    return net


def _unknown_op_shapes(result) -> dict[str, TensorType]:
    """Complete shapes, by the Caffe layer's own rules, of the tops of layers kept as ops
    placer has no entry for (Python, Power, ...)."""
    hints = {}
    for op in result.predict.op:
        if registry.get(op.type) is not None:
            continue
        for top in op.output:
            shape = result.shapes.get(top)
            if shape is not None and all(d is not None for d in shape):
                hints[top] = TensorType(tuple(int(d) for d in shape))
    return hints


# ---------------------------------------------------------------- the converter

class _Converter:
    def __init__(self, caffe: CaffeNet, weights, input_shapes, phase: str, weights_path: str = ""):
        self.caffe = caffe
        self.weights = weights or {}
        self.weights_path = weights_path or "<weights>"
        self.random_despite_weights: list[str] = []
        self.user_shapes = dict(input_shapes or {})
        self.is_test = str(phase).lower() == "test"
        self.predict = NetDef(name=caffe.name)
        self.init = NetDef(name=f"{caffe.name}_init" if caffe.name else "init")
        self.shapes: dict[str, Shape] = {}
        self.params: dict[str, tuple] = {}
        self.result = Conversion(self.predict, self.init, {}, self.params, self.shapes,
                                 notes=list(caffe.notes))
        self.layer = None  # the layer being converted (for op names and messages)

    def run(self) -> Conversion:
        self._inputs()
        layers = [l for l in self.caffe.layers if l.type not in DATA_LAYERS]
        i = 0
        while i < len(layers):
            self.layer = layer = layers[i]
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if layer.type == "BatchNorm" and _foldable_scale(layer, nxt, layers[i + 2:]):
                _batch_norm(self, layer, nxt)
                i += 2
                continue
            TRANSLATORS.get(layer.type, _unknown)(self, layer)
            i += 1
        self.predict.external_output.extend(_net_outputs(self.caffe.layers))
        self._report()
        return self.result

    def _inputs(self) -> None:
        for name, shape in self.caffe.inputs.items():
            user = self.user_shapes.get(name)
            if user is not None:
                shape = tuple(user.shape)
            self.shapes[name] = shape
            if name not in self.predict.external_input:
                self.predict.external_input.append(name)
            dtype = user.dtype if user is not None else self.caffe.input_dtypes.get(name, "float32")
            if full_shape(shape):
                self.result.input_shapes[name] = TensorType(shape, dtype)
            elif name in self.caffe.hints:
                self.result.notes.append(self.caffe.hints[name])

    def _report(self) -> None:
        if self.result.unknown_layers:
            kinds = sorted({t for _, t in self.result.unknown_layers})
            self.result.notes.append(
                f"{len(self.result.unknown_layers)} layer(s) kept as ops of their Caffe type "
                f"(no Caffe2 mapping): {', '.join(kinds)}")
        if self.result.missing_params:
            self.result.notes.append(
                f"{len(self.result.missing_params)} parameter(s) have no fill op because their "
                f"shape depends on an input shape the file does not give: "
                f"{', '.join(list(self.result.missing_params)[:4])}; pass --input (or --weights)")
        if self.random_despite_weights:
            self.result.notes.append(
                f"{len(self.random_despite_weights)} parameter(s) have no blob in "
                f"{self.weights_path} and got random fills: "
                f"{', '.join(self.random_despite_weights[:4])}")

    # -------------------------------------------------------------- helpers for translators

    def ins(self, layer) -> list[Shape]:
        return [self.shapes.get(b) for b in layer.bottom]

    def set(self, tops, shapes) -> None:
        for top, shape in zip(tops, shapes):
            if shape is not None:
                self.check_shape(shape, f"output '{top}'")
            self.shapes[top] = None if shape is None else tuple(shape)

    def check_shape(self, shape, what: str) -> None:
        """A negative size (an input smaller than a kernel) or more elements than int64
        counts: Caffe refuses such a blob, and so does every later stage."""
        problem = shape_problem(shape)
        if problem:
            raise layer_error(self.caffe.path, self.layer, f"{what}: {problem}",
                              hint="check the layer's parameters and the input shape")

    def op(self, type_: str, inputs, outputs, **args):
        proto = self.predict.op.add(type=type_, name=self.layer.name if self.layer else "")
        proto.input.extend(inputs)
        proto.output.extend(outputs)
        for name, value in args.items():
            if value is not None:
                set_arg(proto.arg.add(name=name), value)
        return proto

    def blob(self, layer, index: int) -> np.ndarray | None:
        blobs = self.weights.get(layer.name) or []
        if not blobs and len(layer.blobs) > index:  # weights written into the prototxt itself
            return blob_array(layer.blobs[index])
        return blobs[index] if index < len(blobs) else None

    def param_name(self, layer, index: int, suffix: str) -> str:
        if index < len(layer.param) and layer.param[index].name:
            return layer.param[index].name
        return f"{layer.name}_{suffix}"

    def param(self, name: str, shape: Shape, filler, values: np.ndarray | None = None,
              learned: bool = True) -> str:
        """Declare a parameter: a fill op in the init net, an external input of the predict net.

        ``learned`` is False for parameters Caffe does not have (FC's zero bias when
        bias_term is false, a lone BatchNorm's unit scale), which no weights file holds.
        """
        if name in self.params:  # shared through ParamSpec.name
            return name
        if shape is not None:
            self.check_shape(shape, f"parameter '{name}'")
        if values is None and learned and self.weights:
            self.random_despite_weights.append(name)
        if values is not None:
            arr = fit_blob(values, shape, name, self.layer.name, self.weights_path)
            self._fill(name, "GivenTensorFill", arr.shape)
            set_float_values(self.init.op[-1].arg.add(name="values"), arr)
            self.result.weights_used += 1
            self.params[name] = arr.shape
        elif full_shape(shape):
            op_type, args = filler_op(filler)
            self._fill(name, op_type, shape, seed=zlib.crc32(name.encode()) & 0x7FFFFFFF, **args)
            self.params[name] = tuple(shape)
        else:
            known = _fmt(shape)
            self.result.missing_params[name] = (
                f"parameter '{name}' of layer '{self.layer.name}' has shape {known}: it depends "
                f"on input dimensions the file does not give")
        if name not in self.predict.external_input:
            self.predict.external_input.append(name)
        return name

    def _fill(self, name: str, op_type: str, shape, **args) -> None:
        proto = self.init.op.add(type=op_type)
        proto.output.append(name)
        set_arg(proto.arg.add(name="shape"), [int(d) for d in shape])
        for key, value in args.items():
            set_arg(proto.arg.add(name=key), value)

    def require(self, ok: bool, layer, message: str, hint: str = "Caffe refuses this layer too") -> None:
        """A layer whose parameters Caffe itself would refuse (a zero stride, a group that
        does not divide the channels, ...) is an error at its line, not a crash later."""
        if not ok:
            raise layer_error(self.caffe.path, layer, message, hint=hint)

    def axis(self, layer, field_name: str, axis: int, x: Shape) -> int | None:
        """Caffe's ``Blob::CanonicalAxisIndex``: an axis in [-rank, rank), negative counting
        from the end, else Caffe stops at setup; None while the rank is unknown and the axis
        counts from the end."""
        if x is None:
            return None if axis < 0 else axis
        rank = len(x)
        self.require(-rank <= axis < rank, layer,
                     f"has {field_name} {axis}, out of range for its {rank}-D input {_fmt(x)}",
                     hint=f"use an axis from {-rank} to {rank - 1}; Caffe refuses this layer too")
        return axis % rank

    def unknown(self, layer, why: str = "") -> None:
        self.result.unknown_layers.append((layer.name, layer.type))
        if why:
            self.result.notes.append(f"layer '{layer.name}' ({layer.type}) kept as an unknown op: {why}")


def set_arg(arg, value) -> None:
    """Fill an Argument from a python value (bool and int -> i, float -> f, str -> s, lists)."""
    if isinstance(value, (bool, int, np.integer)):
        arg.i = int(value)
    elif isinstance(value, (float, np.floating)):
        arg.f = float(value)
    elif isinstance(value, str):
        arg.s = value.encode()
    elif isinstance(value, bytes):
        arg.s = value
    elif all(isinstance(v, (bool, int, np.integer)) for v in value):
        arg.ints.extend(int(v) for v in value)
    elif all(isinstance(v, (int, float, np.number)) for v in value):
        arg.floats.extend(value)
    else:
        arg.strings.extend(v.encode() if isinstance(v, str) else v for v in value)


def set_float_values(arg, values: np.ndarray) -> None:
    """``arg.floats = values`` without a python float per value: the repeated field is
    merged from its packed wire form (protobuf parsers accept packed and unpacked alike),
    which keeps a 60M-value caffemodel fast and small in memory."""
    raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
    length, size = bytearray(), len(raw)
    while True:
        length.append((size & 0x7F) | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            break
    arg.MergeFromString(b"\x2a" + bytes(length) + raw)  # field 5 (floats), wire type 2


def fit_blob(arr: np.ndarray, shape: Shape, name: str, layer: str, path: str = "<weights>") -> np.ndarray:
    """A caffemodel blob in the parameter's shape (legacy 4-D blobs lose their leading 1s)."""
    if shape is None:
        return arr
    if full_shape(shape):
        if arr.size == prod(shape):
            return arr.reshape(shape)
    else:
        a = arr
        while a.ndim > len(shape) and a.shape[0] == 1:
            a = a.reshape(a.shape[1:])
        if a.ndim == len(shape) and all(e is None or e == d for e, d in zip(shape, a.shape)):
            return a
    raise NetParseError(path, f"layer '{layer}': blob for '{name}' has shape "
                        f"{shape_text(arr.shape)}, the prototxt needs {_fmt(shape)}",
                        hint="use the .caffemodel that was trained with this prototxt")


def filler_op(filler) -> tuple[str, dict]:
    """A Caffe filler (FillerParameter or ("type", value)) as a Caffe2 fill op and its args."""
    if isinstance(filler, tuple):
        kind, value = filler[0], (filler[1] if len(filler) > 1 else 0.0)
        mean, std, low, high = 0.0, 1.0, 0.0, 1.0
    else:
        kind, value = filler.type, filler.value
        mean, std, low, high = filler.mean, filler.std, filler.min, filler.max
    if kind == "constant":
        return "ConstantFill", {"value": float(value)}
    if kind == "gaussian":
        return "GaussianFill", {"mean": float(mean), "std": float(std)}
    if kind == "uniform":
        return "UniformFill", {"min": float(low), "max": float(high)}
    if kind == "msra":
        return "MSRAFill", {}
    return "XavierFill", {}  # xavier, and the fillers Caffe2 has no op for (bilinear, unitball)


def filler_of(param, field_name: str, default: tuple):
    return getattr(param, field_name) if param.HasField(field_name) else default


# ---------------------------------------------------------------- shape arithmetic

def _fmt(shape: Shape) -> str:
    return "?" if shape is None else shape_text(shape)


def dims_product(dims) -> int | None:
    return None if any(d is None for d in dims) else prod(dims)


def _expand(values, n: int, default):
    values = [int(v) for v in values]
    if not values:
        return [default] * n
    if len(values) == 1:
        return values * n
    return values[:n] if len(values) >= n else values + [values[-1]] * (n - len(values))


def window_args(kernel, stride, pad, dilation=None) -> dict:
    """Caffe2 ConvPoolOpBase arguments for 2-D windows (single value when h == w)."""
    args: dict = {}
    for name, vals, default in (("kernel", kernel, None), ("stride", stride, 1),
                                ("dilation", dilation or [1, 1], 1)):
        if vals[0] == vals[1]:
            if not (name == "dilation" and vals[0] == default):
                args[name] = vals[0]
        else:
            args[f"{name}_h"], args[f"{name}_w"] = vals
    if pad[0] == pad[1]:
        args["pad"] = pad[0]
    else:
        args.update(pad_t=pad[0], pad_b=pad[0], pad_l=pad[1], pad_r=pad[1])
    args["order"] = "NCHW"
    return args


def conv_geometry(p, rank: int | None):
    n = max(2, (rank - p.axis - 1) if rank else 2)
    if p.HasField("kernel_h") or p.HasField("kernel_w"):
        kernel = [p.kernel_h, p.kernel_w]
    else:
        kernel = _expand(p.kernel_size, n, None)
    stride = [p.stride_h, p.stride_w] if p.HasField("stride_h") or p.HasField("stride_w") \
        else _expand(p.stride, n, 1)
    pad = [p.pad_h, p.pad_w] if p.HasField("pad_h") or p.HasField("pad_w") else _expand(p.pad, n, 0)
    return kernel, stride, pad, _expand(p.dilation, n, 1)


def conv_out(size, k, s, p, d) -> int | None:
    return None if size is None else (size + 2 * p - (d * (k - 1) + 1)) // s + 1


def caffe_pool_out(size, k, s, p, ceil: bool = True) -> int | None:
    """Caffe's pooling output size: ceil rounding, clipped so the last window starts inside."""
    if size is None:
        return None
    out = (int(math.ceil((size + 2 * p - k) / s)) if ceil else (size + 2 * p - k) // s) + 1
    if p > 0 and (out - 1) * s >= size + p:
        out -= 1
    return out


# ---------------------------------------------------------------- translators

def _conv(cv: _Converter, layer, transpose: bool = False) -> None:
    p = layer.convolution_param
    (x,) = cv.ins(layer)[:1] or [None]
    rank = None if x is None else len(x)
    kernel, stride, pad, dil = conv_geometry(p, rank)
    if len(kernel) != 2 or p.axis != 1 or None in kernel:
        return _unknown(cv, layer, "only 2-D convolution over axis 1 is mapped")
    m, g = int(p.num_output), int(p.group)
    c = None if x is None or len(x) < 2 else x[1]
    cv.require(min(kernel) > 0 and min(stride) > 0 and min(dil) > 0, layer,
               f"has kernel {kernel}, stride {stride}, dilation {dil}: each must be at least 1")
    cv.require(m > 0 and g > 0 and m % g == 0 and (c is None or c % g == 0), layer,
               f"has num_output {m} and group {g} over {c if c is not None else '?'} input channels: "
               f"the group must divide both")
    cv.require(x is None or len(x) == 4, layer, f"reads a blob of shape {_fmt(x)}; a 2-D convolution "
                                                "takes N x C x H x W")
    if transpose:  # Caffe and Caffe2 deconvolution filters: (C_in, M / group, kh, kw)
        w_shape = (c, m // g, *kernel)
        spatial = [None if x is None or x[2 + i] is None else
                   s_ * (x[2 + i] - 1) + d_ * (k_ - 1) + 1 - 2 * p_
                   for i, (k_, s_, p_, d_) in enumerate(zip(kernel, stride, pad, dil))]
    else:
        w_shape = (m, None if c is None else c // g, *kernel)
        spatial = [conv_out(None if x is None else x[2 + i], k_, s_, p_, d_)
                   for i, (k_, s_, p_, d_) in enumerate(zip(kernel, stride, pad, dil))]
    inputs = [layer.bottom[0],
              cv.param(cv.param_name(layer, 0, "w"), w_shape,
                       filler_of(p, "weight_filler", ("xavier",)), cv.blob(layer, 0))]
    if p.bias_term:
        inputs.append(cv.param(cv.param_name(layer, 1, "b"), (m,),
                               filler_of(p, "bias_filler", ("constant", 0.0)), cv.blob(layer, 1)))
    args = window_args(kernel, stride, pad, dil)
    if g != 1:
        args["group"] = g
    cv.op("ConvTranspose" if transpose else "Conv", inputs, [layer.top[0]], **args)
    cv.set(layer.top, [None if x is None else (x[0], m, *spatial)])


def _deconv(cv: _Converter, layer) -> None:
    _conv(cv, layer, transpose=True)


def _inner_product(cv: _Converter, layer) -> None:
    p = layer.inner_product_param
    x = cv.ins(layer)[0]
    axis = cv.axis(layer, "inner_product_param.axis", p.axis, x)
    n = int(p.num_output)
    k = None if x is None or axis is None else dims_product(x[axis:])
    weights = cv.blob(layer, 0)
    if weights is not None and p.transpose:  # stored (K, N): Caffe2's FC wants (N, K)
        weights = weights.reshape(-1, n).T
    w = cv.param(cv.param_name(layer, 0, "w"), (n, k), filler_of(p, "weight_filler", ("xavier",)), weights)
    if p.bias_term:
        b = cv.param(cv.param_name(layer, 1, "b"), (n,), filler_of(p, "bias_filler", ("constant", 0.0)),
                     cv.blob(layer, 1))
    else:  # Caffe2's FC always takes a bias
        b = cv.param(f"{layer.name}_b", (n,), ("constant", 0.0), learned=False)
    cv.op("FC", [layer.bottom[0], w, b], [layer.top[0]], axis=p.axis if p.axis != 1 else None)
    cv.set(layer.top, [None if x is None or axis is None else (*x[:axis], n)])


def _pooling(cv: _Converter, layer) -> None:
    p = layer.pooling_param
    x = cv.ins(layer)[0]
    if p.pool == 2:  # STOCHASTIC
        return _unknown(cv, layer, "stochastic pooling has no Caffe2 op")
    kernel = [p.kernel_h, p.kernel_w] if p.HasField("kernel_h") else [p.kernel_size] * 2
    stride = [p.stride_h, p.stride_w] if p.HasField("stride_h") else [p.stride] * 2
    pad = [p.pad_h, p.pad_w] if p.HasField("pad_h") or p.HasField("pad_w") else [p.pad] * 2
    ceil = p.round_mode == 0
    cv.require(x is None or len(x) == 4, layer, f"reads a blob of shape {_fmt(x)}; 2-D pooling "
                                                "takes N x C x H x W")
    # PoolingLayer::LayerSetUp: "With Global_pooling: true Filter size cannot specified" and
    # "With Global_pooling: true; only pad = 0 and stride = 1".
    if p.global_pooling:
        cv.require(not (p.HasField("kernel_size") or p.HasField("kernel_h") or p.HasField("kernel_w")), layer,
                   "has global_pooling with a kernel size: a global pooling's window is the whole input",
                   hint="drop kernel_size (or kernel_h / kernel_w), or global_pooling; Caffe refuses this layer too")
        cv.require(max(pad) == 0 and min(stride) == 1 == max(stride), layer,
                   f"has global_pooling with pad {pad} and stride {stride}: only pad 0 and stride 1 are allowed",
                   hint="Caffe refuses this layer too")
    if not p.global_pooling:
        cv.require(min(kernel) > 0 and min(stride) > 0 and all(a < k for a, k in zip(pad, kernel)), layer,
                   f"has kernel {kernel}, stride {stride}, pad {pad}: kernel and stride must be at "
                   "least 1 and the pad smaller than the kernel")
    if p.global_pooling:
        args = {"global_pooling": 1, "order": "NCHW"}
        out = None if x is None else (*x[:2], 1, 1)
    else:
        args = window_args(kernel, stride, pad)
        if ceil:
            args["legacy_pad"] = CAFFE_LEGACY_POOLING
        if p.pool == 1 and any(pad):  # Caffe's average counts the padding in the window
            args["count_include_pad"] = 1
        out = None if x is None else (*x[:2], *(caffe_pool_out(x[2 + i], kernel[i], stride[i], pad[i], ceil)
                                                 for i in range(2)))
    cv.op("MaxPool" if p.pool == 0 else "AveragePool", [layer.bottom[0]], [layer.top[0]], **args)
    cv.set(layer.top, [out])


def _foldable_scale(bn, scale, rest) -> bool:
    """A Scale layer right after a BatchNorm, on its output, with per-channel parameters."""
    if scale is None or scale.type != "Scale" or len(scale.bottom) != 1:
        return False
    if scale.bottom[0] != bn.top[0] or scale.scale_param.axis != 1 or scale.scale_param.num_axes != 1:
        return False
    return scale.top[0] == bn.top[0] or not any(bn.top[0] in l.bottom for l in rest)


def _batch_norm(cv: _Converter, layer, scale=None) -> None:
    x = cv.ins(layer)[0]
    c = None if x is None or len(x) < 2 else x[1]
    mean, var, factor = (cv.blob(layer, i) for i in range(3))
    if factor is not None:  # Caffe stores mean and variance times a moving-average factor
        f = float(np.asarray(factor).ravel()[0])
        inv = 0.0 if f == 0 else 1.0 / f
        mean = None if mean is None else mean * inv
        var = None if var is None else var * inv
    if scale is not None:
        sp = scale.scale_param
        cv.layer = scale
        s = cv.param(cv.param_name(scale, 0, "w"), (c,), filler_of(sp, "filler", ("constant", 1.0)),
                     cv.blob(scale, 0))
        b = cv.param(cv.param_name(scale, 1, "b"), (c,),
                     filler_of(sp, "bias_filler", ("constant", 0.0)) if sp.bias_term else ("constant", 0.0),
                     cv.blob(scale, 1) if sp.bias_term else None, learned=bool(sp.bias_term))
        cv.layer = layer
    else:
        s = cv.param(f"{layer.name}_s", (c,), ("constant", 1.0), learned=False)
        b = cv.param(f"{layer.name}_b", (c,), ("constant", 0.0), learned=False)
    rm = cv.param(f"{layer.name}_rm", (c,), ("constant", 0.0), mean)
    riv = cv.param(f"{layer.name}_riv", (c,), ("constant", 1.0), var)
    top = (scale or layer).top[0]
    p = layer.batch_norm_param
    is_test = cv.is_test or (p.HasField("use_global_stats") and p.use_global_stats)
    outputs = [top] if is_test else [top, rm, riv, f"_{layer.name}_saved_mean", f"_{layer.name}_saved_var"]
    cv.op("SpatialBN", [layer.bottom[0], s, b, rm, riv], outputs, is_test=int(is_test),
          epsilon=float(p.eps), momentum=None if is_test else float(p.moving_average_fraction),
          order="NCHW")
    cv.set([top], [x])


def _scale(cv: _Converter, layer) -> None:
    p = layer.scale_param
    shapes = cv.ins(layer)
    x = shapes[0]
    axis = cv.axis(layer, "scale_param.axis", p.axis, x)
    _check_num_axes(cv, layer, "scale_param", axis, p.num_axes, x)
    if len(layer.bottom) > 1:
        factor, bias_blob = layer.bottom[1], 0
    else:
        end = None if x is None or axis is None else (len(x) if p.num_axes == -1 else axis + p.num_axes)
        shape = None if end is None else x[axis:end]
        factor = cv.param(cv.param_name(layer, 0, "w"), shape, filler_of(p, "filler", ("constant", 1.0)),
                          cv.blob(layer, 0))
        bias_blob = 1
    cv.op("Mul", [layer.bottom[0], factor], [layer.top[0]], broadcast=1, axis=p.axis)
    if p.bias_term:
        shape = cv.params.get(factor) if len(layer.bottom) == 1 else shapes[1]
        b = cv.param(cv.param_name(layer, bias_blob, "b"), shape,
                     filler_of(p, "bias_filler", ("constant", 0.0)), cv.blob(layer, bias_blob))
        cv.op("Add", [layer.top[0], b], [layer.top[0]], broadcast=1, axis=p.axis)
    cv.set(layer.top, [x])


def _bias(cv: _Converter, layer) -> None:
    p = layer.bias_param
    x = cv.ins(layer)[0]
    if len(layer.bottom) > 1:
        b = layer.bottom[1]
    else:
        axis = cv.axis(layer, "bias_param.axis", p.axis, x)
        _check_num_axes(cv, layer, "bias_param", axis, p.num_axes, x)
        end = None if x is None or axis is None else (len(x) if p.num_axes == -1 else axis + p.num_axes)
        b = cv.param(cv.param_name(layer, 0, "b"), None if end is None else x[axis:end],
                     filler_of(p, "filler", ("constant", 0.0)), cv.blob(layer, 0))
    cv.op("Add", [layer.bottom[0], b], [layer.top[0]], broadcast=1, axis=p.axis)
    cv.set(layer.top, [x])


def _eltwise(cv: _Converter, layer) -> None:
    p = layer.eltwise_param
    x = cv.ins(layer)[0]
    top = layer.top[0]
    inputs = list(layer.bottom)
    # EltwiseLayer::LayerSetUp: "Eltwise Layer takes one coefficient per bottom blob", and
    # "Eltwise layer only takes coefficients for summation"; Reshape: every bottom has one shape.
    cv.require(len(p.coeff) in (0, len(inputs)), layer,
               f"has {len(p.coeff)} coeff value(s) for {len(inputs)} bottoms: give one per bottom, or none")
    cv.require(p.operation == 1 or not len(p.coeff), layer,
               "has coeff values with a PROD or MAX operation: coefficients are for SUM only")
    for blob, s in zip(inputs[1:], cv.ins(layer)[1:]):
        cv.require(x is None or s is None or len(s) != len(x) or
                   all(u is None or v is None or u == v for u, v in zip(s, x)), layer,
                   f"combines '{blob}' {_fmt(s)} with '{inputs[0]}' {_fmt(x)}: every bottom needs the same shape")
    if p.operation == 1:  # SUM
        coeffs = list(p.coeff)
        if coeffs and any(c != 1.0 for c in coeffs):
            scaled = []
            for i, (blob, coeff) in enumerate(zip(inputs, coeffs)):
                if coeff == 1.0:
                    scaled.append(blob)
                    continue
                scaled.append(f"_{top}_x{i}")
                cv.op("Scale", [blob], [scaled[-1]], scale=float(coeff))
            inputs = scaled
        cv.op("Sum", inputs, [top])
    elif p.operation == 0:  # PROD: Caffe2's Mul takes two inputs
        cv.op("Mul", inputs[:2], [top])
        for blob in inputs[2:]:
            cv.op("Mul", [top, blob], [top])
    else:
        cv.op("Max", inputs, [top])
    cv.set(layer.top, [x])


def _relu(cv: _Converter, layer) -> None:
    slope = layer.relu_param.negative_slope
    if slope:
        cv.op("LeakyRelu", [layer.bottom[0]], [layer.top[0]], alpha=float(slope))
    else:
        cv.op("Relu", [layer.bottom[0]], [layer.top[0]])
    cv.set(layer.top, cv.ins(layer))


def _prelu(cv: _Converter, layer) -> None:
    p = layer.prelu_param
    x = cv.ins(layer)[0]
    shape = (1,) if p.channel_shared else (None if x is None or len(x) < 2 else (x[1],))
    slope = cv.param(cv.param_name(layer, 0, "slope"), shape,
                     filler_of(p, "filler", ("constant", 0.25)), cv.blob(layer, 0))
    cv.op("PRelu", [layer.bottom[0], slope], [layer.top[0]], order="NCHW")
    cv.set(layer.top, [x])


def _simple(op_type: str, **fixed):
    """A layer that maps to one op with the same input and output shape."""
    def translate(cv: _Converter, layer) -> None:
        cv.op(op_type, list(layer.bottom[:1]), [layer.top[0]], **fixed)
        cv.set(layer.top, cv.ins(layer)[:1])
    return translate


def _softmax(cv: _Converter, layer) -> None:
    """Caffe normalises along one axis, every other position apart; Caffe2's Softmax
    normalises the whole flattened tail from its axis. They agree when the axis is the last
    one with extent > 1; otherwise the axis is moved last around the Softmax."""
    x = cv.ins(layer)[0]
    axis = layer.softmax_param.axis
    a = cv.axis(layer, "softmax_param.axis", axis, x)
    top = layer.top[0]
    if x is None or a is None or dims_product(x[a + 1:]) == 1:
        cv.op("Softmax", [layer.bottom[0]], [top], axis=axis)
    else:
        order = [i for i in range(len(x)) if i != a] + [a]
        back = [order.index(i) for i in range(len(x))]
        moved = (*(x[i] for i in order),)
        cv.op("Transpose", [layer.bottom[0]], [f"_{top}_moved"], axes=order)
        cv.op("Softmax", [f"_{top}_moved"], [f"_{top}_moved_prob"], axis=len(x) - 1)
        cv.op("Transpose", [f"_{top}_moved_prob"], [top], axes=back)
        cv.set([f"_{top}_moved", f"_{top}_moved_prob"], [moved, moved])
    cv.set(layer.top, [x])


def _softmax_loss(cv: _Converter, layer) -> None:
    """SoftmaxWithLoss; on images (N, C, H, W) Caffe takes a label per pixel, (N, 1, H, W),
    which is Caffe2's SpatialSoftmaxWithLoss with (N, H, W) labels."""
    shapes = cv.ins(layer)
    x = shapes[0]
    top = layer.top[0]
    weight = layer.loss_weight[0] if len(layer.loss_weight) else 1.0
    scale = float(weight) if weight != 1.0 else None
    inputs = list(layer.bottom[:2])
    if x is not None and len(x) == 4 and dims_product(x[2:]) != 1 and layer.softmax_param.axis == 1:
        label = shapes[1] if len(shapes) > 1 else None
        if label is None or len(label) == 4:
            cv.op("Squeeze", [inputs[1]], [f"_{top}_label"], dims=[1])
            cv.set([f"_{top}_label"], [None if label is None else (label[0], *label[2:])])
            inputs[1] = f"_{top}_label"
        cv.op("SpatialSoftmaxWithLoss", inputs, [f"_{top}_softmax", top], scale=scale)
    else:
        cv.op("SoftmaxWithLoss", inputs, [f"_{top}_softmax", top], scale=scale)
    cv.set([f"_{top}_softmax", top], [x, ()])


def _accuracy(cv: _Converter, layer) -> None:
    if len(layer.top) > 1:
        return _unknown(cv, layer, "per-class accuracy output has no Caffe2 op")
    cv.op("Accuracy", list(layer.bottom[:2]), [layer.top[0]], top_k=int(layer.accuracy_param.top_k))
    cv.set(layer.top, [()])


def _lrn(cv: _Converter, layer) -> None:
    p = layer.lrn_param
    if p.norm_region != 0:
        return _unknown(cv, layer, "LRN WITHIN_CHANNEL has no Caffe2 op")
    # LRNLayer::LayerSetUp: "LRN only supports odd values for local_size".
    cv.require(p.local_size % 2 == 1, layer, f"has lrn_param.local_size {p.local_size}: LRN needs an "
                                             "odd window size", hint="use an odd local_size, e.g. 5; "
                                                                     "Caffe refuses this layer too")
    top = layer.top[0]
    cv.op("LRN", [layer.bottom[0]], [top, f"_{top}_scale"], size=int(p.local_size),
          alpha=float(p.alpha), beta=float(p.beta), bias=float(p.k), order="NCHW")
    x = cv.ins(layer)[0]
    cv.set([top, f"_{top}_scale"], [x, x])


def _dropout(cv: _Converter, layer) -> None:
    top = layer.top[0]
    cv.op("Dropout", [layer.bottom[0]], [top, f"_{top}_mask"],
          ratio=float(layer.dropout_param.dropout_ratio), is_test=int(cv.is_test))
    x = cv.ins(layer)[0]
    cv.set([top, f"_{top}_mask"], [x, x])


def _concat(cv: _Converter, layer) -> None:
    p = layer.concat_param
    shapes = cv.ins(layer)
    axis = p.axis if p.HasField("axis") or not p.HasField("concat_dim") else int(p.concat_dim)
    x = shapes[0]
    a = cv.axis(layer, "concat_param.axis", axis, x)
    _check_concat_inputs(cv, layer, shapes, a)
    out = None
    if x is not None and a is not None and all(s is not None and len(s) == len(x) for s in shapes):
        sizes = [s[a] for s in shapes]
        total = None if None in sizes else sum(sizes)
        out = (*x[:a], total, *x[a + 1:])
    top = layer.top[0]
    cv.op("Concat", list(layer.bottom), [top, f"_{top}_dims"], axis=axis)  # not with `order`
    cv.set([top, f"_{top}_dims"], [out, (len(layer.bottom),)])


def _slice(cv: _Converter, layer) -> None:
    p = layer.slice_param
    x = cv.ins(layer)[0]
    axis = p.axis if p.HasField("axis") or not p.HasField("slice_dim") else int(p.slice_dim)
    a = cv.axis(layer, "slice_param.axis", axis, x)
    dim = None if x is None or a is None else x[a]
    points = [int(v) for v in p.slice_point]
    n = len(layer.top)
    _check_slice_points(cv, layer, points, dim)
    if points:
        if dim is None:
            return _unknown(cv, layer, "slice points need the input's size on the slice axis")
        edges = [0, *points, dim]
        sizes = [b - a_ for a_, b in zip(edges, edges[1:])]
    else:
        sizes = None if dim is None else [dim // n] * n
    cv.op("Split", [layer.bottom[0]], list(layer.top), axis=axis, split=sizes if points else None)
    cv.set(layer.top, [None if sizes is None else (*x[:a], s, *x[a + 1:]) for s in sizes]
           if sizes else [None] * n)


def _check_concat_inputs(cv: _Converter, layer, shapes, axis: int | None) -> None:
    """ConcatLayer::Reshape: every input has the first one's rank and its sizes off the axis."""
    known = [(b, s) for b, s in zip(layer.bottom, shapes) if s is not None]
    if not known or axis is None:
        return
    first, x = known[0]
    for blob, s in known[1:]:
        cv.require(len(s) == len(x) and all(u is None or v is None or u == v
                                            for i, (u, v) in enumerate(zip(s, x)) if i != axis), layer,
                   f"concatenates '{blob}' {_fmt(s)} with '{first}' {_fmt(x)} on axis {axis}: every "
                   "input needs the same rank and the same sizes off that axis")


def _check_slice_points(cv: _Converter, layer, points: list[int], dim: int | None) -> None:
    """SliceLayer::Reshape: one slice point fewer than tops, increasing and positive; with
    none, the tops split the axis evenly."""
    n = len(layer.top)
    if points:
        cv.require(len(points) == n - 1, layer,
                   f"has {len(points)} slice_point value(s) for {n} tops: give one fewer than the tops")
        cv.require(all(b > a for a, b in zip([0, *points], points)) and (dim is None or points[-1] <= dim),
                   layer, f"has slice_point {points} over an axis of size {dim if dim is not None else '?'}: "
                          "the points must increase from above 0 and stay within the axis")
    elif dim is not None:
        cv.require(n > 0 and dim % n == 0, layer,
                   f"splits an axis of size {dim} into {n} tops: the tops must divide it evenly",
                   hint="give slice_point values, or a number of tops that divides the axis")


def _check_num_axes(cv: _Converter, layer, param: str, axis: int | None, num_axes: int, x: Shape) -> None:
    """ScaleLayer / BiasLayer::LayerSetUp: num_axes is -1 (to the end) or reaches no further
    than the input's last axis."""
    cv.require(num_axes >= -1, layer, f"has {param}.num_axes {num_axes}: it must be -1 (to the end) or more",
               hint="Caffe refuses this layer too")
    if x is not None and axis is not None and num_axes >= 0:
        cv.require(axis + num_axes <= len(x), layer,
                   f"has {param} axis {axis} and num_axes {num_axes}, past the end of its {len(x)}-D "
                   f"input {_fmt(x)}", hint="Caffe refuses this layer too")


def _split(cv: _Converter, layer) -> None:
    x = cv.ins(layer)[0]
    for top in layer.top:
        if top != layer.bottom[0]:
            cv.op("Copy", [layer.bottom[0]], [top])
    cv.set(layer.top, [x] * len(layer.top))


def _flatten(cv: _Converter, layer) -> None:
    p = layer.flatten_param
    x = cv.ins(layer)[0]
    rank = None if x is None else len(x)
    a = cv.axis(layer, "flatten_param.axis", p.axis, x)
    e = cv.axis(layer, "flatten_param.end_axis", p.end_axis, x)
    cv.require(a is None or e is None or a <= e, layer,
               f"has flatten_param axis {p.axis} after end_axis {p.end_axis} on a {rank}-D input",
               hint="end_axis must not come before axis")
    out = None if x is None else (*x[:a], dims_product(x[a:e + 1]), *x[e + 1:])
    if p.axis == 1 and p.end_axis == -1:
        cv.op("Flatten", [layer.bottom[0]], [layer.top[0]], axis=1)
    elif x is not None and None not in x[e + 1:]:
        top = layer.top[0]
        cv.op("Reshape", [layer.bottom[0]], [top, f"_{top}_old_shape"],
              shape=[0] * a + [-1] + list(x[e + 1:]))
    else:
        return _unknown(cv, layer, "the input's trailing dimensions are unknown")
    cv.set(layer.top, [out])


def _reshape(cv: _Converter, layer) -> None:
    p = layer.reshape_param
    x = cv.ins(layer)[0]
    dims = [int(d) for d in p.shape.dim]
    rank = None if x is None else len(x)
    start = p.axis if p.axis >= 0 else (None if rank is None else rank + p.axis + 1)
    end = None if rank is None else (rank if p.num_axes == -1 else start + p.num_axes)
    _check_reshape(cv, layer, dims, x, start, end)
    if start is None or (end is None and (start != 0 or p.num_axes != -1)):
        return _unknown(cv, layer, "the input's rank is unknown")
    tail = [] if x is None else list(x[end:])
    if None in tail:
        return _unknown(cv, layer, "the input's trailing dimensions are unknown")
    shape = [0] * start + dims + tail  # Caffe2's 0 copies the input dim at the same index
    out = None if x is None else caffe_reshape(x, dims, start, end)
    top = layer.top[0]
    cv.op("Reshape", [layer.bottom[0]], [top, f"_{top}_old_shape"], shape=shape)
    cv.set([top, f"_{top}_old_shape"], [out, None if x is None else (len(x),)])  # the input's shape


def _check_reshape(cv: _Converter, layer, dims: list[int], x: Shape, start: int | None,
                   end: int | None) -> None:
    """ReshapeLayer::LayerSetUp and Reshape: at most one -1, no size below -1, the replaced
    axes within the input, a 0 only where there is an input axis to copy, and as many
    elements out as in."""
    p = layer.reshape_param
    fail = f"has reshape_param shape {dims}"
    cv.require(dims.count(-1) <= 1 and min(dims, default=0) >= -1 and p.num_axes >= -1, layer,
               f"{fail}: at most one -1 may be inferred, no other size is negative, num_axes is -1 or more")
    if x is None:
        return
    rank = len(x)
    cv.require(0 <= start <= end <= rank, layer,
               f"{fail} from axis {p.axis} over {p.num_axes} axes, outside its {rank}-D input {_fmt(x)}",
               hint=f"use an axis from {-rank - 1} to {rank} and a num_axes that stays within the input")
    zeros = [i for i, d in enumerate(dims) if d == 0]
    cv.require(all(start + i < rank for i in zeros), layer,
               f"{fail}: a 0 copies an input axis, and its {rank}-D input {_fmt(x)} has none there")
    out = caffe_reshape(x, dims, start, end)
    total, made = dims_product(x), dims_product(out)
    kept = dims_product([d for i, d in enumerate(out) if i != start + dims.index(-1)]) if -1 in dims else None
    cv.require(total is None or not kept or total % kept == 0, layer,
               f"{fail}: its other sizes ({kept} elements) do not divide {_fmt(x)} ({total}), so the -1 "
               "cannot be inferred", hint="Caffe refuses this layer too")
    cv.require(total is None or made is None or total == made, layer,
               f"{fail}: makes {_fmt(out)} ({made} elements) from {_fmt(x)} ({total} elements)",
               hint="the new shape must hold as many elements as the input; Caffe refuses this layer too")


def caffe_reshape(x: tuple, dims: list[int], start: int, end: int) -> tuple:
    """Caffe's Reshape: dims replace x[start:end]; 0 copies that input dim, -1 is inferred."""
    middle = [x[start + i] if d == 0 else d for i, d in enumerate(dims)]
    full = [*x[:start], *middle, *x[end:]]
    if -1 in middle:
        at = start + middle.index(-1)
        total, rest = dims_product(x), dims_product(full[:at] + full[at + 1:])
        full[at] = None if total is None or not rest or total % rest else total // rest
    return tuple(full)


def _elu(cv: _Converter, layer) -> None:
    _simple("Elu", alpha=float(layer.elu_param.alpha))(cv, layer)


def _exp_or_log(op_type: str, param: str):
    def translate(cv: _Converter, layer) -> None:
        p = getattr(layer, param)
        if p.base != -1.0 or p.scale != 1.0 or p.shift != 0.0:
            return _unknown(cv, layer, "base, scale or shift other than the defaults")
        _simple(op_type)(cv, layer)
    return translate


def _clip(cv: _Converter, layer) -> None:
    p = layer.clip_param
    _simple("Clip", min=float(p.min), max=float(p.max))(cv, layer)


def _tile(cv: _Converter, layer) -> None:
    p = layer.tile_param
    x = cv.ins(layer)[0]
    a = cv.axis(layer, "tile_param.axis", p.axis, x)
    cv.require(p.tiles > 0, layer, f"has tile_param.tiles {p.tiles}: the number of tiles must be "
                                   "positive", hint="set tiles to 1 or more; Caffe refuses this layer too")
    cv.op("Tile", [layer.bottom[0]], [layer.top[0]], tiles=int(p.tiles), axis=int(p.axis))
    out = None if x is None or a is None or x[a] is None else (*x[:a], x[a] * p.tiles, *x[a + 1:])
    cv.set(layer.top, [out])


def _silence(cv: _Converter, layer) -> None:
    """Silence only marks blobs as consumed: no op."""


# ---------------------------------------------------------------- layers with no mapping

def _fork_layer(cv: _Converter, layer) -> None:
    """SSD's fork layers (Permute, Normalize, PriorBox, DetectionOutput): placer has ops of
    their Caffe type (``placer/ops/detection.py``) that read the flattened arguments."""
    _keep(cv, layer, layer.type)


def _unknown(cv: _Converter, layer, why: str = "") -> None:
    """Keep the layer as an op of its Caffe type, its parameters as arguments."""
    _keep(cv, layer, unknown_op_type(layer.type))
    cv.unknown(layer, why)


def _keep(cv: _Converter, layer, op_type: str) -> None:
    """One op of ``op_type`` with the layer's bottoms, parameters (Normalize's scale is
    ``<layer>_scale``, filled from ``scale_filler``) and flattened ``*_param`` fields."""
    shapes = cv.ins(layer)
    inputs = list(layer.bottom)
    if layer.type == "Permute" and shapes[0] is not None:
        order, rank = [int(o) for o in layer.permute_param.order], len(shapes[0])
        cv.require(len(set(order)) == len(order) and all(o < rank for o in order), layer,
                   f"has order {order} over a {rank}-D input: each axis once at most, each below {rank}")
    if layer.type == "Normalize":
        p = layer.norm_param
        x = shapes[0]
        shape = (1,) if p.channel_shared else (None if x is None or len(x) < 2 else (x[1],))
        inputs.append(cv.param(cv.param_name(layer, 0, "scale"), shape,
                               filler_of(p, "scale_filler", ("constant", 1.0)), cv.blob(layer, 0)))
    else:
        for i in range(len(cv.weights.get(layer.name) or layer.blobs)):
            blob = cv.blob(layer, i)
            inputs.append(cv.param(cv.param_name(layer, i, f"blob{i}"), blob.shape, None, blob))
    proto = cv.op(op_type, inputs, list(layer.top))
    for name, value in layer_arguments(layer):
        set_arg(proto.arg.add(name=name), value)
    cv.set(layer.top, unknown_shapes(layer, shapes))


def unknown_op_type(caffe_type: str) -> str:
    """The op type of a layer kept unconverted: its Caffe type, or "Caffe<type>" where a
    Caffe2 op of that name exists with other semantics (an LRN within channels, an Exp of
    another base, a Slice by points), so the registry never runs the wrong kernel."""
    return f"Caffe{caffe_type}" if registry.get(caffe_type) is not None else caffe_type


def layer_arguments(layer) -> list[tuple[str, object]]:
    """The fields set in a layer's *_param messages, flattened ("nms_param.top_k")."""
    out: list[tuple[str, object]] = []
    for fd, value in layer.ListFields():
        if fd.name.endswith("_param") and fd.message_type is not None:
            _flatten_message(value, "", out)
    return out


def _flatten_message(message, prefix: str, out: list) -> None:
    for fd, value in message.ListFields():
        name = prefix + fd.name
        is_repeated = fd.is_repeated
        if fd.message_type is not None:
            for i, sub in enumerate(value if is_repeated else [value]):
                _flatten_message(sub, f"{name}{i if is_repeated else ''}.", out)
        elif fd.enum_type is not None:
            names = [fd.enum_type.values_by_number[v].name for v in (value if is_repeated else [value])]
            out.append((name, names if is_repeated else names[0]))
        elif is_repeated:
            if len(value):
                out.append((name, list(value)))
        else:
            out.append((name, value))


def unknown_shapes(layer, shapes: list[Shape]) -> list[Shape]:
    """Output shapes of layers with no Caffe2 op, by the rules of their (fork's) Caffe code."""
    x = shapes[0] if shapes else None
    t = layer.type
    n = len(layer.top)
    if t in ("Normalize", "Power", "AbsVal", "BNLL", "Threshold", "Exp", "Log", "MVN",
             "Swish", "Pooling", "LRN") and n == 1:
        return [x]
    if t == "Permute" and x is not None:
        order = [int(o) for o in layer.permute_param.order]
        order += [i for i in range(len(x)) if i not in order]
        return [tuple(x[i] for i in order)]
    if t == "PriorBox" and x is not None and len(x) == 4:
        p = layer.prior_box_param
        ratios = [1.0]
        for r in p.aspect_ratio:
            if all(abs(r - q) > 1e-6 for q in ratios):
                ratios.append(r)
                if p.flip:
                    ratios.append(1.0 / r)
        priors = len(ratios) * len(p.min_size) + len(p.max_size)
        hw = dims_product(x[2:])
        return [(1, 2, None if hw is None else hw * priors * 4)]
    if t == "DetectionOutput":
        # data-dependent: at most keep_top_k boxes per image (Caffe's own bound), 7 numbers each
        keep = layer.detection_output_param.keep_top_k
        batch = x[0] if x is not None else None
        return [(1, 1, keep * batch if keep > 0 and batch is not None else None, 7)]
    return [None] * n


TRANSLATORS = {
    "Convolution": _conv, "Deconvolution": _deconv, "InnerProduct": _inner_product,
    "Pooling": _pooling, "BatchNorm": _batch_norm, "Scale": _scale, "Bias": _bias,
    "Eltwise": _eltwise, "ReLU": _relu, "PReLU": _prelu, "Sigmoid": _simple("Sigmoid"),
    "TanH": _simple("Tanh"), "AbsVal": _simple("Abs"), "ELU": _elu,
    "Exp": _exp_or_log("Exp", "exp_param"), "Log": _exp_or_log("Log", "log_param"),
    "Clip": _clip, "Softmax": _softmax, "SoftmaxWithLoss": _softmax_loss,
    "Accuracy": _accuracy, "LRN": _lrn, "Dropout": _dropout, "Concat": _concat,
    "Slice": _slice, "Split": _split, "Flatten": _flatten, "Reshape": _reshape,
    "Tile": _tile, "Silence": _silence,
    "Permute": _fork_layer, "Normalize": _fork_layer, "PriorBox": _fork_layer, "DetectionOutput": _fork_layer,
}


def _net_outputs(layers) -> list[str]:
    """Caffe's net outputs: tops that no later layer reads (data layers included)."""
    available: list[str] = []
    for layer in layers:
        for b in layer.bottom:
            if b in available:
                available.remove(b)
        for t in layer.top:
            if t not in available:
                available.append(t)
    return available
