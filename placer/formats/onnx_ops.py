"""ONNX op -> Caffe2 ops, one handler per ONNX op type (``HANDLERS``).

Each mapping is the one Caffe2's ONNX backend made (torch 1.8.1, checked op by op against
it in ``tests/test_onnx_caffe2_backend.py``), with the arguments the backend renamed
(``kernel_shape`` -> ``kernels``, ``perm`` -> ``axes``, ``axes`` -> ``dims``,
``output_padding`` -> ``adjs``, ``gamma`` -> ``scale``). Where the backend read a constant
input at run time (Reshape's shape, Slice's starts, Clip's bounds from opset 11) the handler
takes the folded value as an argument instead, and where an ONNX form has no Caffe2 op of the
same meaning the handler writes the Caffe2 ops that compute it (a Slice over three axes is
three Slices; Softmax over an inner axis at opset 13 is Transpose, Softmax, Transpose) or
refuses it by name (``OnnxNode.fail``). A handler never maps an attribute it does not
implement to something else: an unknown value is an error naming it.
"""
from __future__ import annotations

import numpy as np

from placer.types import DTYPE_TO_DATA_TYPE

ONNX_TO_DTYPE = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
                 9: "bool", 10: "float16", 11: "float64"}


class OnnxNode:
    """One node as a handler sees it: attributes, inputs (constant values, static types)."""

    def __init__(self, proto, cv):
        from onnx import helper  # onnx is loaded whenever a node exists
        self.proto, self.cv, self.g = proto, cv, cv.g
        self.type = proto.op_type
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        for k, v in list(self.attrs.items()):
            if isinstance(v, bytes):
                self.attrs[k] = v.decode()
        self.opset = self.g.opset

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and bool(self.inputs[i])

    def const(self, i: int):
        """The folded value of input ``i``, or None when it is absent or computed at run time."""
        if not self.has(i):
            return None
        return self.g.consts.get(self.inputs[i])

    def need_const(self, i: int, what: str):
        value = self.const(i)
        if value is None and self.has(i):
            self.fail(f"input {i} ({what}) is computed at run time; placer needs it constant",
                      hint="export with static shapes (fixed input sizes) so it folds")
        return value

    def type_of(self, name_or_index):
        name = self.inputs[name_or_index] if isinstance(name_or_index, int) else name_or_index
        return self.g.type_of(name)

    def shape(self, i: int) -> tuple:
        t = self.type_of(i)
        if t is None:
            self.fail(f"the shape of input {i} ('{self.inputs[i]}') is not known after shape inference",
                      hint="give the inputs' shapes with --input")
        return t.shape

    def out_shape(self, i: int = 0) -> tuple:
        t = self.g.type_of(self.outputs[i])
        if t is None:
            self.fail(f"the shape of output '{self.outputs[i]}' is not known after shape inference",
                      hint="give the inputs' shapes with --input")
        return t.shape

    def x(self, i: int) -> str:
        """The blob an op reads for input ``i``: a constant gets its fill op."""
        name = self.inputs[i]
        if name in self.g.consts:
            return self.cv.const_input(name)
        return self.cv.resolve(name)

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def ints_attr_or_input(self, attr: str, index: int, what: str):
        """An attribute that a later opset moved to an input (axes, split, pads, ...)."""
        if attr in self.attrs:
            return [int(v) for v in self.attrs[attr]]
        value = self.need_const(index, what)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def op(self, type_: str, inputs, outputs, **args):
        return self.cv.op(type_, inputs, outputs, **args)

    def tmp(self, suffix: str) -> str:
        return self.cv.fresh(f"{self.outputs[0]}_{suffix}")

    def fail(self, message: str, hint: str | None = None):
        self.cv.fail(message, hint)

    def reject(self, attr: str, value, supported: str):
        self.fail(f"{attr}={value!r} is not supported", hint=f"supported: {supported}")


def _axis(axis: int, rank: int, node: OnnxNode, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        node.fail(f"{what} {axis} is out of range for a {rank}-D input")
    return axis % rank


# ---------------------------------------------------------------- the handlers

HANDLERS: dict = {}
# The nearest supported form of ONNX ops with no mapping, for the error message.
UNMAPPED_HINTS = {
    "Loop": "control flow is not mapped; export with static shapes or unrolled loops",
    "If": "control flow is not mapped; export with the branch fixed (constant condition folds)",
    "Scan": "control flow is not mapped",
    "LSTM": "recurrent ops are not mapped; placer reads feed-forward nets",
    "GRU": "recurrent ops are not mapped; placer reads feed-forward nets",
    "RNN": "recurrent ops are not mapped; placer reads feed-forward nets",
    "Einsum": "write the contraction as MatMul/Transpose/Reshape before export",
    "DepthToSpace": "Caffe2's backend has no mapping either; use Reshape/Transpose",
    "SpaceToDepth": "Caffe2's backend has no mapping either; use Reshape/Transpose",
    "QuantizeLinear": "placer reads float ONNX models; quantize the converted net with placer.examples.quantize",
    "DequantizeLinear": "placer reads float ONNX models; quantize the converted net with placer.examples.quantize",
    "NonMaxSuppression": "detection post-processing is not mapped; export the model without it",
}


def handles(*op_types):
    def register(fn):
        for t in op_types:
            HANDLERS[t] = fn
        return fn
    return register


def _same(c2_type: str, **fixed):
    def handler(cv, n: OnnxNode) -> None:
        n.op(c2_type, [n.x(i) for i in range(len(n.inputs)) if n.has(i)], n.outputs[:1], **fixed)
    return handler


for _onnx_type, _c2 in {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
                        "Sqrt": "Sqrt", "Abs": "Abs", "Neg": "Negative", "Floor": "Floor", "Ceil": "Ceil",
                        "Sign": "Sign", "Erf": "Erf", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan", "Atan": "Atan",
                        "Asin": "Asin", "Acos": "Acos", "Softsign": "Softsign", "Not": "Not",
                        "Identity": "Copy"}.items():
    HANDLERS[_onnx_type] = _same(_c2)

# Binary ops with numpy broadcasting: Caffe2's elementwise ops broadcast the same way when
# no legacy `broadcast` argument is given (what the backend wrote from opset 7).
for _onnx_type, _c2 in {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div",
                        "And": "And", "Or": "Or", "Xor": "Xor"}.items():
    HANDLERS[_onnx_type] = _same(_c2)

COMPARISONS = {"Equal": "EQ", "Less": "LT", "Greater": "GT", "LessOrEqual": "LE", "GreaterOrEqual": "GE"}
# integer types Caffe2's comparison kernels lack, compared after a Cast to int32 (which holds
# every value of them exactly, so the bool result is unchanged)
_NARROW_INTS = frozenset({"int8", "int16", "uint8", "uint16"})


@handles(*COMPARISONS)
def _compare(cv, n: OnnxNode) -> None:
    ins = []
    for i in range(2):
        blob = n.x(i)
        t = n.type_of(i)
        if t is not None and t.dtype in _NARROW_INTS:
            wide = n.tmp(f"int32_{i}")
            n.op("Cast", [blob], [wide], to=DTYPE_TO_DATA_TYPE["int32"])
            blob = wide
        ins.append(blob)
    n.op(COMPARISONS[n.type], ins, n.outputs[:1])


@handles("Pow")
def _pow(cv, n: OnnxNode) -> None:
    e = n.const(1)
    if e is not None and np.asarray(e).size == 1:
        n.op("Pow", [n.x(0)], n.outputs[:1], exponent=float(np.asarray(e).reshape(-1)[0]))
    else:
        n.op("Pow", [n.x(0), n.x(1)], n.outputs[:1])


@handles("Reciprocal")
def _reciprocal(cv, n: OnnxNode) -> None:
    n.op("Pow", [n.x(0)], n.outputs[:1], exponent=-1.0)


@handles("Sum", "Max", "Min", "Mean")
def _variadic(cv, n: OnnxNode) -> None:
    shapes = [n.shape(i) for i in range(len(n.inputs))]
    if len(set(shapes)) > 1:
        # Caffe2's Sum/Max/Min/Mean need equal shapes; broadcasting ones are chained pairwise
        if n.type == "Mean":
            n.fail("Mean over inputs of different shapes is not supported",
                   hint="Caffe2's Mean needs equal shapes; broadcast the inputs first")
        pair = {"Sum": "Add", "Max": "Max", "Min": "Min"}[n.type]
        acc = n.x(0)
        for i in range(1, len(n.inputs)):
            out = n.outputs[0] if i == len(n.inputs) - 1 else n.tmp(f"acc{i}")
            if pair == "Add":
                n.op("Add", [acc, n.x(i)], [out])
            else:
                n.fail(f"{n.type} over inputs of different shapes is not supported",
                       hint=f"Caffe2's {n.type} needs equal shapes; Expand the inputs first")
            acc = out
        return
    n.op(n.type, [n.x(i) for i in range(len(n.inputs))], n.outputs[:1])


@handles("Where")
def _where(cv, n: OnnxNode) -> None:
    out = n.out_shape()
    ins = []
    for i in range(3):
        blob = n.x(i)
        if n.shape(i) != out:  # Caffe2's Where takes equal shapes (or one value per row)
            expanded = n.tmp(f"expand{i}")
            n.op("Expand", [blob, cv.new_param(f"{n.outputs[0]}_shape", np.array(out, np.int64))], [expanded])
            blob = expanded
        ins.append(blob)
    n.op("Where", ins, n.outputs[:1])


@handles("LeakyRelu")
def _leaky(cv, n: OnnxNode) -> None:
    n.op("LeakyRelu", [n.x(0)], n.outputs[:1], alpha=float(n.attr("alpha", 0.01)))


@handles("Elu")
def _elu(cv, n: OnnxNode) -> None:
    n.op("Elu", [n.x(0)], n.outputs[:1], alpha=float(n.attr("alpha", 1.0)))


@handles("Selu")
def _selu(cv, n: OnnxNode) -> None:
    n.op("Selu", [n.x(0)], n.outputs[:1], alpha=float(n.attr("alpha", 1.67326319217681884765625)),
         scale=float(n.attr("gamma", 1.05070102214813232421875)))


@handles("Softplus")
def _softplus(cv, n: OnnxNode) -> None:
    n.op("Softplus", [n.x(0)], n.outputs[:1])


@handles("HardSigmoid")
def _hard_sigmoid(cv, n: OnnxNode) -> None:
    n.op("HardSigmoid", [n.x(0)], n.outputs[:1], alpha=float(n.attr("alpha", 0.2)),
         beta=float(n.attr("beta", 0.5)))


@handles("HardSwish")
def _hard_swish(cv, n: OnnxNode) -> None:
    # x * HardSigmoid(x; 1/6, 1/2): the definition in the ONNX spec; Caffe2 has no HardSwish
    gate = n.tmp("gate")
    n.op("HardSigmoid", [n.x(0)], [gate], alpha=1.0 / 6.0, beta=0.5)
    n.op("Mul", [n.x(0), gate], n.outputs[:1])


@handles("Clip")
def _clip(cv, n: OnnxNode) -> None:
    if n.opset < 11:
        lo, hi = n.attr("min"), n.attr("max")
    else:
        lo = n.need_const(1, "min")
        hi = n.need_const(2, "max")
    t = n.type_of(0)
    if t is not None and not t.dtype.startswith("float"):
        n.fail(f"Clip of {t.dtype} is not supported", hint="Caffe2's Clip is float only")
    args = {}
    if lo is not None:
        args["min"] = float(np.asarray(lo).reshape(-1)[0])
    if hi is not None:
        args["max"] = float(np.asarray(hi).reshape(-1)[0])
    n.op("Clip", [n.x(0)], n.outputs[:1], **args)


@handles("PRelu")
def _prelu(cv, n: OnnxNode) -> None:
    x, slope = n.shape(0), n.shape(1)
    ok = int(np.prod(slope)) == 1 or (len(x) >= 2 and int(np.prod(slope)) == x[1]
                                      and (len(slope) == 1 and len(x) == 2
                                           or len(slope) == len(x) - 1 and all(d == 1 for d in slope[1:])))
    if not ok:
        n.fail(f"PRelu slope of shape {slope} for input {x} is not one value per channel or one in all",
               hint="Caffe2's PRelu takes a slope of shape (C,) or (1,)")
    s = n.const(1)
    flat = n.cv.new_param(f"{n.inputs[1]}_c", np.asarray(s).reshape(-1)) if s is not None else None
    if flat is None:
        flat = n.tmp("slope")
        n.op("Reshape", [n.x(1)], [flat, n.tmp("slope_shape")], shape=[int(np.prod(slope))])
    n.op("PRelu", [n.x(0), flat], n.outputs[:1])


@handles("Gelu")
def _gelu(cv, n: OnnxNode) -> None:
    approx = n.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        n.reject("approximate", approx, "none, tanh")
    n.op("Gelu", [n.x(0)], n.outputs[:1], **({"fast_gelu": 1} if approx == "tanh" else {}))


@handles("Softmax", "LogSoftmax")
def _softmax(cv, n: OnnxNode) -> None:
    rank = len(n.shape(0))
    if n.opset < 13:
        # opset < 13: the input coerced to 2-D at `axis` (default 1), as Caffe2's Softmax does
        axis = _axis(int(n.attr("axis", 1)), rank, n)
        _softmax_ops(n, n.x(0), n.outputs[0], axis)
        return
    axis = _axis(int(n.attr("axis", -1)), rank, n)
    if axis == rank - 1:
        _softmax_ops(n, n.x(0), n.outputs[0], axis)
        return
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved, result = n.tmp("moved"), n.tmp("softmax")
    n.op("Transpose", [n.x(0)], [moved], axes=perm)
    _softmax_ops(n, moved, result, rank - 1)
    n.op("Transpose", [result], n.outputs[:1], axes=perm)


def _softmax_ops(n: OnnxNode, x: str, y: str, axis: int) -> None:
    if n.type == "Softmax":
        n.op("Softmax", [x], [y], axis=axis)
    else:  # LogSoftmax: Softmax then Log, as Caffe2's backend wrote it
        p = n.tmp("prob")
        n.op("Softmax", [x], [p], axis=axis)
        n.op("Log", [p], [y])


# ---------------------------------------------------------------- convolution, pooling

def _spatial_pads(n: OnnxNode, kernel, strides, dilations, x_shape, transpose=False, out_shape=None):
    """Explicit pads [begins..., ends...] from ``pads`` or ``auto_pad``."""
    rank = len(kernel)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(n.attr("pads", [0] * (2 * rank)))
        if len(pads) != 2 * rank:
            n.fail(f"pads {pads} has {len(pads)} values for {rank} spatial dimensions")
        return pads
    if auto == "VALID":
        return [0] * (2 * rank)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        n.reject("auto_pad", auto, "NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    begins, ends = [], []
    for k in range(rank):
        size = x_shape[2 + k]
        eff = (kernel[k] - 1) * dilations[k] + 1
        if transpose:
            total = max(0, strides[k] * (size - 1) + eff - out_shape[2 + k])
        else:
            out = -(-size // strides[k])
            total = max(0, (out - 1) * strides[k] + eff - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends


def _check_2d(n: OnnxNode, rank: int) -> None:
    if rank != 2:
        n.fail(f"{n.type} over {rank} spatial dimension(s) is not supported",
               hint="placer's Caffe2 Conv/pooling ops are 2-D (NCHW); reshape a 1-D signal to H=1")


@handles("Conv")
def _conv(cv, n: OnnxNode) -> None:
    x, w = n.shape(0), n.shape(1)
    kernel = list(n.attr("kernel_shape", w[2:]))
    _check_2d(n, len(kernel))
    strides = list(n.attr("strides", [1] * len(kernel)))
    dilations = list(n.attr("dilations", [1] * len(kernel)))
    pads = _spatial_pads(n, kernel, strides, dilations, x)
    args = dict(kernels=kernel, strides=strides, pads=pads, group=int(n.attr("group", 1)))
    if any(d != 1 for d in dilations):
        args["dilations"] = dilations
    n.op("Conv", [n.x(i) for i in range(len(n.inputs)) if n.has(i)], n.outputs[:1], **args)


@handles("ConvTranspose")
def _conv_transpose(cv, n: OnnxNode) -> None:
    x, w = n.shape(0), n.shape(1)
    kernel = list(n.attr("kernel_shape", w[2:]))
    _check_2d(n, len(kernel))
    strides = list(n.attr("strides", [1] * len(kernel)))
    dilations = list(n.attr("dilations", [1] * len(kernel)))
    if any(d != 1 for d in dilations):
        n.reject("dilations", dilations, "1 (Caffe2's ConvTranspose has no dilation)")
    adjs = list(n.attr("output_padding", [0] * len(kernel)))
    out = n.out_shape()
    if "output_shape" in n.attrs:
        # pads that give the requested output size (the ONNX spec's formula)
        pads_b, pads_e = [], []
        for k in range(len(kernel)):
            total = strides[k] * (x[2 + k] - 1) + adjs[k] + kernel[k] - out[2 + k]
            if n.attr("auto_pad", "NOTSET") == "SAME_UPPER":
                pads_b.append(total // 2)
                pads_e.append(total - total // 2)
            else:
                pads_b.append(total - total // 2)
                pads_e.append(total // 2)
        pads = pads_b + pads_e
        if any(p < 0 for p in pads):
            n.fail(f"output_shape {list(n.attr('output_shape'))} needs negative pads {pads}",
                   hint="Caffe2's ConvTranspose takes pads >= 0; give output_padding instead")
    else:
        pads = _spatial_pads(n, kernel, strides, dilations, x, transpose=True, out_shape=out)
    group = int(n.attr("group", 1))
    args = dict(kernels=kernel, strides=strides, pads=pads)
    if any(adjs):
        args["adjs"] = adjs
    if group != 1:
        args["group"] = group
    n.op("ConvTranspose", [n.x(i) for i in range(len(n.inputs)) if n.has(i)], n.outputs[:1], **args)


def _pool_args(n: OnnxNode):
    x = n.shape(0)
    kernel = list(n.attr("kernel_shape"))
    _check_2d(n, len(kernel))
    strides = list(n.attr("strides", [1] * len(kernel)))
    dilations = list(n.attr("dilations", [1] * len(kernel)))
    if any(d != 1 for d in dilations):
        n.reject("dilations", dilations, "1 (Caffe2's pooling has no dilation)")
    pads = _spatial_pads(n, kernel, strides, dilations, x)
    if int(n.attr("ceil_mode", 0)):
        # ceil rounding as extra end padding, up to the output size ONNX infers; a window
        # that would start in the padding only is not made (the ONNX rule)
        out = n.out_shape()
        for k in range(len(kernel)):
            need = (out[2 + k] - 1) * strides[k] + kernel[k] - (x[2 + k] + pads[k] + pads[len(kernel) + k])
            pads[len(kernel) + k] += max(0, need)
    return dict(kernels=kernel, strides=strides, pads=pads)


@handles("MaxPool")
def _max_pool(cv, n: OnnxNode) -> None:
    if len(n.outputs) > 1 and n.outputs[1]:
        n.fail("MaxPool's Indices output is not supported", hint="Caffe2's MaxPool has one output")
    if int(n.attr("storage_order", 0)):
        n.reject("storage_order", 1, "0 (row major)")
    n.op("MaxPool", [n.x(0)], n.outputs[:1], **_pool_args(n))


@handles("AveragePool")
def _average_pool(cv, n: OnnxNode) -> None:
    args = _pool_args(n)
    if int(n.attr("count_include_pad", 0)):
        args["count_include_pad"] = 1
    n.op("AveragePool", [n.x(0)], n.outputs[:1], **args)


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cv, n: OnnxNode) -> None:
    _check_2d(n, len(n.shape(0)) - 2)
    op = n.op("AveragePool" if n.type == "GlobalAveragePool" else "MaxPool", [n.x(0)], n.outputs[:1],
              global_pooling=1)
    # Caffe2's ConvPoolOpBase demands a kernel size of every op whose *name* contains "Pool"
    # or starts with "Conv" (conv_pool_op_base.h), so a global pool named "/GlobalAveragePool"
    # (what exporters write) fails to construct there: keep the name, but not those letters.
    op.name = op.name.replace("Pool", "pool")
    if op.name.startswith("Conv"):
        op.name = "_" + op.name


@handles("BatchNormalization")
def _batch_norm(cv, n: OnnxNode) -> None:
    if int(n.attr("training_mode", 0)) or any(o for o in n.outputs[1:]):
        n.fail("BatchNormalization in training mode is not supported",
               hint="export the model in eval mode (model.eval())")
    n.op("SpatialBN", [n.x(i) for i in range(5)], n.outputs[:1], is_test=1,
         epsilon=float(n.attr("epsilon", 1e-5)), momentum=float(n.attr("momentum", 0.9)))


@handles("InstanceNormalization")
def _instance_norm(cv, n: OnnxNode) -> None:
    n.op("InstanceNorm", [n.x(0), n.x(1), n.x(2)], n.outputs[:1], epsilon=float(n.attr("epsilon", 1e-5)))


@handles("LRN")
def _lrn(cv, n: OnnxNode) -> None:
    n.op("LRN", [n.x(0)], [n.outputs[0], n.tmp("scale")], size=int(n.attr("size")),
         alpha=float(n.attr("alpha", 1e-4)), beta=float(n.attr("beta", 0.75)), bias=float(n.attr("bias", 1.0)))


@handles("LayerNormalization")
def _layer_norm(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    axis = _axis(int(n.attr("axis", -1)), len(x), n)
    inner = tuple(x[axis:])
    scale = n.x(1)
    if n.shape(1) != inner:
        n.fail(f"LayerNormalization scale of shape {n.shape(1)} for normalized shape {inner}",
               hint="Caffe2's LayerNorm takes gamma and beta of the normalized shape")
    bias = n.x(2) if n.has(2) else cv.new_param(f"{n.outputs[0]}_beta", np.zeros(inner, np.float32))
    outs = [n.outputs[0], (n.outputs[1] if len(n.outputs) > 1 and n.outputs[1] else n.tmp("mean")),
            n.tmp("std")]
    if len(n.outputs) > 2 and n.outputs[2]:
        n.fail("LayerNormalization's InvStdDev output is not supported",
               hint="Caffe2's LayerNorm gives the standard deviation, not its inverse")
    n.op("LayerNorm", [n.x(0), scale, bias], outs, axis=axis, epsilon=float(n.attr("epsilon", 1e-5)),
         elementwise_affine=1)


# ---------------------------------------------------------------- dense

@handles("Gemm")
def _gemm(cv, n: OnnxNode) -> None:
    ta, tb = int(n.attr("transA", 0)), int(n.attr("transB", 0))
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    a, b = n.shape(0), n.shape(1)
    nout = b[0] if tb else b[1]
    c = n.shape(2) if n.has(2) else None
    if not ta and alpha == 1.0 and beta == 1.0 and (c is None or tuple(c) in ((nout,), (1, nout))):
        # FC (W of shape N x K) or FCTransposed (K x N): what Caffe2's backend wrote for a
        # Gemm whose bias is one row
        bias = n.x(2) if c is not None else cv.new_param(f"{n.outputs[0]}_bias", np.zeros(nout, np.float32))
        if c is not None and len(c) == 2:
            cc = n.const(2)
            if cc is not None:
                bias = cv.new_param(f"{n.inputs[2]}_row", np.asarray(cc).reshape(-1))
            else:
                flat = n.tmp("bias")
                n.op("Reshape", [bias], [flat, n.tmp("bias_shape")], shape=[nout])
                bias = flat
        n.op("FC" if tb else "FCTransposed", [n.x(0), n.x(1), bias], n.outputs[:1])
        return
    # the general form, as the backend wrote it: Scale, MatMul, Scale, Add
    xa = n.x(0)
    if alpha != 1.0:
        xa2 = n.tmp("alpha_a")
        n.op("Scale", [xa], [xa2], scale=alpha)
        xa = xa2
    if c is None or beta == 0.0:
        n.op("MatMul", [xa, n.x(1)], n.outputs[:1], trans_a=ta, trans_b=tb)
        return
    xc = n.x(2)
    if beta != 1.0:
        xc2 = n.tmp("beta_c")
        n.op("Scale", [xc], [xc2], scale=beta)
        xc = xc2
    ab = n.tmp("ab")
    n.op("MatMul", [xa, n.x(1)], [ab], trans_a=ta, trans_b=tb)
    n.op("Add", [ab, xc], n.outputs[:1])
    del a


@handles("MatMul")
def _matmul(cv, n: OnnxNode) -> None:
    if len(n.shape(0)) == 1 and len(n.shape(1)) == 1:
        # a dot product is a scalar in ONNX (numpy's matmul); Caffe2's BatchMatMul gives (1,)
        dot = n.tmp("dot")
        n.op("BatchMatMul", [n.x(0), n.x(1)], [dot], broadcast=1)
        n.op("Squeeze", [dot], n.outputs[:1], dims=[0])
        return
    n.op("BatchMatMul", [n.x(0), n.x(1)], n.outputs[:1], broadcast=1)


# ---------------------------------------------------------------- tensor layout

def _reshape_to(n: OnnxNode, x: str, y: str, shape) -> None:
    n.op("Reshape", [x], [y, n.cv.fresh(f"{y}_old_shape")], shape=[int(d) for d in shape])


@handles("Reshape")
def _reshape(cv, n: OnnxNode) -> None:
    if n.opset >= 5:
        n.need_const(1, "shape")
    out = n.out_shape()
    if 0 in out:
        n.fail(f"Reshape to {tuple(out)}, a shape with a 0 dimension, is not supported",
               hint="Caffe2's Reshape reads 0 as 'keep the input's dimension' and cannot make an empty axis")
    _reshape_to(n, n.x(0), n.outputs[0], out)


@handles("Flatten")
def _flatten(cv, n: OnnxNode) -> None:
    rank = len(n.shape(0))
    axis = int(n.attr("axis", 1))
    if not -rank <= axis <= rank:
        n.fail(f"axis {axis} is out of range for a {rank}-D input")
    axis = axis + rank if axis < 0 else axis
    if axis == 1:
        n.op("Flatten", [n.x(0)], n.outputs[:1], axis=1)
    else:
        _reshape_to(n, n.x(0), n.outputs[0], n.out_shape())


@handles("Squeeze")
def _squeeze(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    axes = n.ints_attr_or_input("axes", 1, "axes")
    if axes is None:
        axes = [k for k, d in enumerate(x) if d == 1]
    dims = sorted({_axis(a, len(x), n) for a in axes})
    n.op("Squeeze", [n.x(0)], n.outputs[:1], dims=dims)


@handles("Unsqueeze")
def _unsqueeze(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    axes = n.ints_attr_or_input("axes", 1, "axes")
    rank = len(x) + len(axes)
    dims = sorted({_axis(a, rank, n) for a in axes})
    n.op("ExpandDims", [n.x(0)], n.outputs[:1], dims=dims)


@handles("Transpose")
def _transpose(cv, n: OnnxNode) -> None:
    rank = len(n.shape(0))
    perm = [int(p) for p in n.attr("perm", list(range(rank))[::-1])]
    n.op("Transpose", [n.x(0)], n.outputs[:1], axes=perm)


@handles("Concat")
def _concat(cv, n: OnnxNode) -> None:
    rank = len(n.out_shape())
    axis = _axis(int(n.attr("axis")), rank, n)
    ins = [n.x(i) for i in range(len(n.inputs)) if n.has(i) and n.shape(i)[axis:axis + 1] != (0,)]
    if len(ins) == 1:
        n.op("Copy", ins, n.outputs[:1])
        return
    n.op("Concat", ins, [n.outputs[0], n.tmp("split_info")], axis=axis)


@handles("Split")
def _split(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    axis = _axis(int(n.attr("axis", 0)), len(x), n)
    split = n.ints_attr_or_input("split", 1, "split")
    if split is None:
        split = [n.g.type_of(o).shape[axis] for o in n.outputs]
    n.op("Split", [n.x(0)], n.outputs, axis=axis, split=split)


@handles("Slice")
def _slice(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    if n.opset < 10:
        starts, ends = list(n.attr("starts")), list(n.attr("ends"))
        axes = list(n.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = n.ints_attr_or_input("starts", 1, "starts")
        ends = n.ints_attr_or_input("ends", 2, "ends")
        axes = n.ints_attr_or_input("axes", 3, "axes") if n.has(3) else list(range(len(starts)))
        steps = n.ints_attr_or_input("steps", 4, "steps") if n.has(4) else [1] * len(starts)
    cur, cur_shape = n.x(0), list(x)
    todo = []
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = _axis(a, len(x), n)
        if st != 1:
            n.fail(f"Slice with step {st} is not supported", hint="Caffe2's Slice takes step 1 only")
        d = x[a]
        s = max(0, min(d, s + d if s < 0 else s))
        e = max(0, min(d, e + d if e < 0 else e))
        e = max(e, s)
        if (s, e) != (0, d):
            todo.append((a, s, e))
    if not todo:
        n.op("Copy", [cur], n.outputs[:1])
        return
    for k, (a, s, e) in enumerate(todo):
        out = n.outputs[0] if k == len(todo) - 1 else n.tmp(f"slice{k}")
        st, en = [0] * len(x), [-1] * len(x)
        st[a], en[a] = s, e
        n.op("Slice", [cur], [out], starts=st, ends=en)
        cur_shape[a] = e - s
        cur = out


@handles("Gather")
def _gather(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    axis = _axis(int(n.attr("axis", 0)), len(x), n)
    idx = n.const(1)
    ind = n.x(1)
    if idx is not None and np.any(np.asarray(idx) < 0):
        # negative indices count from the end (ONNX); Caffe2's Gather reads them as given
        fixed = np.where(np.asarray(idx) < 0, np.asarray(idx) + x[axis], np.asarray(idx))
        ind = cv.new_param(f"{n.inputs[1]}_wrapped", fixed.astype(np.asarray(idx).dtype))
    if axis == 0:
        n.op("Gather", [n.x(0), ind], n.outputs[:1])
    else:
        n.op("Gather", [n.x(0), ind], n.outputs[:1], axis=axis)


@handles("Expand")
def _expand(cv, n: OnnxNode) -> None:
    n.need_const(1, "shape")
    out = n.out_shape()
    n.op("Expand", [n.x(0), cv.new_param(f"{n.outputs[0]}_shape", np.array(out, np.int64))], n.outputs[:1])


@handles("Tile")
def _tile(cv, n: OnnxNode) -> None:
    reps = n.need_const(1, "repeats")
    n.op("NumpyTile", [n.x(0), cv.new_param(f"{n.outputs[0]}_repeats", np.asarray(reps, np.int64))],
         n.outputs[:1])


@handles("Pad")
def _pad(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    mode = n.attr("mode", "constant")
    if n.opset < 11:
        pads = list(n.attr("pads", n.attr("paddings", [])))
        value = float(n.attr("value", 0.0))
    else:
        pads = [int(v) for v in np.asarray(n.need_const(1, "pads")).reshape(-1)]
        v = n.need_const(2, "constant_value") if n.has(2) else None
        value = float(np.asarray(v).reshape(-1)[0]) if v is not None and np.asarray(v).size else 0.0
        if n.has(3):
            axes = [_axis(int(a), len(x), n) for a in np.asarray(n.need_const(3, "axes")).reshape(-1)]
            full = [0] * (2 * len(x))
            for k, a in enumerate(axes):
                full[a], full[len(x) + a] = pads[k], pads[len(axes) + k]
            pads = full
    rank = len(x)
    if mode not in ("constant", "reflect", "edge"):
        n.reject("mode", mode, "constant, reflect, edge")
    if rank != 4 or any(pads[k] or pads[rank + k] for k in (0, 1)) or any(p < 0 for p in pads):
        n.fail(f"Pad {pads} of a {rank}-D input is not supported",
               hint="Caffe2's PadImage pads H and W of a 4-D NCHW tensor by non-negative amounts")
    if not any(pads):  # what Caffe2's backend was handed after onnx's eliminate_nop_pad
        n.cv.alias(n.outputs[0], n.inputs[0])
        return
    n.op("PadImage", [n.x(0)], n.outputs[:1], pads=[pads[2], pads[3], pads[6], pads[7]], mode=mode,
         value=value)


@handles("Upsample", "Resize")
def _resize(cv, n: OnnxNode) -> None:
    x, y = n.shape(0), n.out_shape()
    mode = n.attr("mode", "nearest")
    if len(x) != 4 or tuple(x[:2]) != tuple(y[:2]):
        n.fail(f"{n.type} of {x} to {y} is not supported",
               hint="placer maps resizing of H and W of a 4-D NCHW tensor")
    hs, ws = y[2] / x[2], y[3] / x[3]
    if mode == "nearest":
        ctm = n.attr("coordinate_transformation_mode", "asymmetric" if n.type == "Resize" else "asymmetric")
        nearest = n.attr("nearest_mode", "round_prefer_floor")
        # asymmetric: the source index is (output index) / scale, rounded by nearest_mode;
        # Caffe2's ResizeNearest floors it. The roundings agree for nearest_mode floor, for
        # a scale of 1, and for round_prefer_floor at scales 1 and 2 (fractions 0 and 1/2)
        # only.
        same = all(s in (1.0,) or nearest == "round_prefer_floor" and s == 2.0 for s in (hs, ws))
        if n.type == "Resize" and not (ctm == "asymmetric" and (nearest == "floor" or same)):
            n.fail(f"Resize nearest with coordinate_transformation_mode={ctm}, nearest_mode={nearest}",
                   hint="Caffe2's ResizeNearest is asymmetric with floor rounding (PyTorch's nn.Upsample)")
        n.op("ResizeNearest", [n.x(0)], n.outputs[:1], height_scale=float(hs), width_scale=float(ws))
        return
    n.reject("mode", mode, "nearest")


@handles("Dropout")
def _dropout(cv, n: OnnxNode) -> None:
    if n.has(2):
        training = n.need_const(2, "training_mode")
        if bool(np.asarray(training).reshape(-1)[0]):
            n.fail("Dropout in training mode (training_mode true) is not supported",
                   hint="export the model in eval mode (model.eval()); placer's converted nets run inference")
    if len(n.outputs) > 1 and n.outputs[1]:
        mask = n.outputs[1]
        n.op("Copy", [n.x(0)], n.outputs[:1])
        n.op("ConstantFill", [], [mask], shape=list(n.shape(0)), dtype=DTYPE_TO_DATA_TYPE["bool"], value=1)
        return
    n.op("Dropout", [n.x(0)], [n.outputs[0], n.tmp("mask")], ratio=float(n.attr("ratio", 0.5)), is_test=1)


@handles("Cast")
def _cast(cv, n: OnnxNode) -> None:
    to = int(n.attr("to"))
    dtype = ONNX_TO_DTYPE.get(to)
    if dtype is None:
        n.reject("to", to, "float, double, float16, int8/16/32/64, uint8/16, bool")
    n.op("Cast", [n.x(0)], n.outputs[:1], to=DTYPE_TO_DATA_TYPE[dtype])


@handles("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2")
def _reduce(cv, n: OnnxNode) -> None:
    x = n.shape(0)
    if n.type == "ReduceSum" and n.opset >= 13 or n.opset >= 18:
        axes = n.ints_attr_or_input("axes", 1, "axes") if n.has(1) else None
    else:
        axes = n.attr("axes")
    keep = int(n.attr("keepdims", 1))
    if axes is None or len(axes) == 0:
        if int(n.attr("noop_with_empty_axes", 0)):
            n.op("Copy", [n.x(0)], n.outputs[:1])
            return
        axes = list(range(len(x)))
    axes = sorted({_axis(int(a), len(x), n) for a in axes})
    n.op(n.type, [n.x(0)], n.outputs[:1], axes=axes, keepdims=keep)


@handles("ArgMax", "ArgMin")
def _argmax(cv, n: OnnxNode) -> None:
    if int(n.attr("select_last_index", 0)):
        n.reject("select_last_index", 1, "0 (the first index of ties, as Caffe2)")
    rank = len(n.shape(0))
    n.op(n.type, [n.x(0)], n.outputs[:1], axis=_axis(int(n.attr("axis", 0)), rank, n),
         keepdims=int(n.attr("keepdims", 1)))


@handles("TopK")
def _topk(cv, n: OnnxNode) -> None:
    rank = len(n.shape(0))
    axis = _axis(int(n.attr("axis", -1)), rank, n)
    if not int(n.attr("largest", 1)):
        n.reject("largest", 0, "1 (Caffe2's TopK keeps the largest)")
    k = int(n.attr("k")) if n.opset < 10 else int(np.asarray(n.need_const(1, "k")).reshape(-1)[0])
    n.op("TopK", [n.x(0)], n.outputs[:2], k=k, axis=axis)


@handles("MeanVarianceNormalization", "Hardmax", "ReduceProd", "ReduceLogSumExp", "ReduceSumSquare")
def _not_in_caffe2(cv, n: OnnxNode) -> None:
    n.fail(f"op type {n.type} has no Caffe2 mapping",
           hint="Caffe2's ONNX backend had none either; rewrite it with elementwise and reduction ops")




@handles("SoftmaxCrossEntropyLoss")
def _softmax_xent(cv, n: OnnxNode) -> None:
    # what a model exported with its loss (F.cross_entropy) holds: Caffe2's SoftmaxWithLoss,
    # the mean over the batch of -log softmax at the label
    x, labels = n.shape(0), n.type_of(1)
    if len(x) != 2:
        n.fail(f"SoftmaxCrossEntropyLoss of {len(x)}-D scores is not supported",
               hint="Caffe2's SoftmaxWithLoss takes (N, C) scores; flatten them first")
    if n.attr("reduction", "mean") != "mean":
        n.reject("reduction", n.attr("reduction"), "mean")
    if n.has(2):
        n.fail("class weights are not supported", hint="Caffe2's SoftmaxWithLoss weights samples, not classes")
    if int(n.attr("ignore_index", -1)) >= 0:
        # a negative ignore_index (PyTorch writes -100) matches no class label, so it changes nothing
        n.reject("ignore_index", n.attr("ignore_index"), "a negative value (no class ignored)")
    label = n.x(1)
    if labels is not None and labels.dtype != "int32":  # Caffe2's labels are int32
        cast = n.tmp("label_int32")
        n.op("Cast", [label], [cast], to=DTYPE_TO_DATA_TYPE["int32"])
        label = cast
    prob = n.outputs[1] if len(n.outputs) > 1 and n.outputs[1] else n.tmp("softmax")
    if len(n.outputs) > 1 and n.outputs[1]:
        n.fail("the log-probability output of SoftmaxCrossEntropyLoss is not supported",
               hint="Caffe2's SoftmaxWithLoss gives probabilities; export the loss alone")
    n.op("SoftmaxWithLoss", [n.x(0), label], [prob, n.outputs[0]])
