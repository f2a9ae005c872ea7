"""Gradient makers that are more than one op with fixed blobs: they read the forward op's
arguments or arity (Conv without bias, SpatialBN in test mode, sparse embeddings, ...).

Each function is the ``GetGradientDefs`` of the Caffe2 maker of the same op, as torch
1.8.1's Caffe2 writes it; ``register`` also records the maker's ``CopyArguments()``
override where it has one. One-op makers with fixed blobs are data in ``gradients.py``; ``register`` and
``MakerContext`` are in ``gradient_registry.py``.
"""
from __future__ import annotations

from placer.training.gradient_registry import GradientError, MakerContext, make_op, op_label, register

# TensorProto.DataType by name, for Cast's string form of `to` / `from_type`.
_DATA_TYPES = {"UNDEFINED": 0, "FLOAT": 1, "INT32": 2, "BYTE": 3, "STRING": 4, "BOOL": 5,
               "UINT8": 6, "INT8": 7, "UINT16": 8, "INT16": 9, "INT64": 10, "FLOAT16": 12,
               "DOUBLE": 13}


# ---------------------------------------------------------------- dense layers

@register(["Conv", "Conv1D", "Conv2D", "Conv3D"])
def _conv(ctx: MakerContext) -> list:
    return _conv_like(ctx, f"{ctx.op.type}Gradient")


@register("ConvTranspose")
def _conv_transpose(ctx: MakerContext) -> list:
    return _conv_like(ctx, "ConvTransposeGradient")


def _conv_like(ctx: MakerContext, grad_type: str) -> list:
    """Outputs dW, [db,] [dX]: no bias -> ``no_bias`` 1; ``no_gradient_to_input`` drops dX."""
    n = len(ctx.op.input)
    if n not in (2, 3):
        raise GradientError(f"op {op_label(ctx.op)}: {ctx.op.type} takes 2 or 3 inputs, found {n}")
    compute_dx = not ctx.arg("no_gradient_to_input", 0)
    outputs = [ctx.GI(1)] + ([ctx.GI(2)] if n == 3 else []) + ([ctx.GI(0)] if compute_dx else [])
    inputs = [ctx.I(0), ctx.I(1), ctx.GO(0)]
    return [make_op(grad_type, inputs, outputs, no_bias=1 if n == 2 else None)]


@register(["SoftmaxWithLoss", "SpatialSoftmaxWithLoss"])
def _softmax_with_loss(ctx: MakerContext) -> list:
    """(X, label[, weight], P, d_loss) -> dX."""
    inputs = [ctx.I(0), ctx.I(1), ctx.O(0), ctx.GO(1)]
    if len(ctx.op.input) == 3:
        inputs.insert(2, ctx.I(2))
    return [make_op(f"{ctx.op.type}Gradient", inputs, [ctx.GI(0)])]


@register("SpatialBN")
def _spatial_bn(ctx: MakerContext) -> list:
    """Training reads the saved mean and inverse std (outputs 3, 4); a test-mode op the
    running statistics (inputs 3, 4); ``num_batches`` > 1 also the summed gradients."""
    outputs = [ctx.GI(0), ctx.GI(1), ctx.GI(2)]
    if ctx.arg("is_test", 0):
        inputs = [ctx.I(0), ctx.I(1), ctx.GO(0), ctx.I(3), ctx.I(4)]
    elif ctx.arg("num_batches", 1) > 1:
        inputs = [ctx.I(0), ctx.I(1), ctx.GO(0), ctx.O(3), ctx.O(4), ctx.GI(1), ctx.GI(2)]
    else:
        inputs = [ctx.I(0), ctx.I(1), ctx.GO(0), ctx.O(3), ctx.O(4)]
    return [make_op("SpatialBNGradient", inputs, outputs)]


@register("LayerNorm")
def _layer_norm(ctx: MakerContext) -> list:
    """(dY, Y, mean, std, X[, gamma]) -> dX[, dgamma, dbeta]: gamma and its gradients with
    ``elementwise_affine`` (caffe2/operators/layer_norm_op.cc, GetLayerNormGradient)."""
    inputs = [ctx.GO(0), ctx.O(0), ctx.O(1), ctx.O(2), ctx.I(0)]
    outputs = [ctx.GI(0)]
    if ctx.arg("elementwise_affine", 0):
        inputs.append(ctx.I(1))
        outputs += [ctx.GI(1), ctx.GI(2)]
    return [make_op("LayerNormGradient", inputs, outputs)]


@register("Dropout")
def _dropout(ctx: MakerContext) -> list:
    inputs = [ctx.GO(0)] if ctx.arg("is_test", 0) else [ctx.GO(0), ctx.O(1)]
    return [make_op("DropoutGrad", inputs, [ctx.GI(0)])]


# ---------------------------------------------------------------- tensor plumbing

@register(["Concat", "DepthConcat"])
def _concat(ctx: MakerContext) -> list:
    if ctx.grad_out(0) is None:
        return []
    grads = [ctx.GI(i) for i in range(len(ctx.op.input))]
    return [make_op("Split", [ctx.GO(0), ctx.O(1)], grads)]


@register("AllToAll", copy_args=False)
def _alltoall(ctx: MakerContext) -> list:
    """Block i of rank j's input became block j of rank i's output: the gradients go back
    the same way, so the gradient of an all-to-all is the all-to-all of its gradients."""
    return [make_op("AllToAll", [ctx.GO(i) for i in range(len(ctx.op.output))],
                    [ctx.GI(i) for i in range(len(ctx.op.input))])]


@register(["Split", "DepthSplit"])
def _split(ctx: MakerContext) -> list:
    """Concat of the outputs that have a gradient (Caffe2 leaves the others out)."""
    grads = [ctx.GO(i) for i in range(len(ctx.op.output)) if ctx.grad_out(i) is not None]
    if not grads:
        return []
    dx = ctx.GI(0)
    return [make_op("Concat", grads, [dx, f"_{dx}_dims"])]


@register("Sum")
def _sum(ctx: MakerContext) -> list:
    """Every input's gradient is the output's: no op."""
    for i in range(len(ctx.op.input)):
        ctx.set_dense(i, ctx.GO(0))
    return []


@register("Alias")
def _alias(ctx: MakerContext) -> list:
    ctx.set_dense(0, ctx.GO(0))
    return []


@register("Reshape", copy_args=False)
def _reshape(ctx: MakerContext) -> list:
    dx = ctx.GI(0)
    return [make_op("Reshape", [ctx.GO(0), ctx.O(1)], [dx, f"_{dx}_dims"])]


@register("Transpose", copy_args=False)
def _transpose(ctx: MakerContext) -> list:
    """The forward arguments, with ``axes`` replaced by its inverse permutation."""
    op = make_op("Transpose", [ctx.GO(0)], [ctx.GI(0)])
    op.arg.extend(ctx.op.arg)
    for arg in op.arg:
        if arg.name == "axes":
            axes = list(arg.ints)
            inverse = [0] * len(axes)
            for i, a in enumerate(axes):
                inverse[a] = i
            del arg.ints[:]
            arg.ints.extend(inverse)
    return [op]


@register("Slice")
def _slice(ctx: MakerContext) -> list:
    if len(ctx.op.input) > 1:
        inputs = [ctx.I(0), ctx.I(1), ctx.I(2), ctx.GO(0)]
    else:
        inputs = [ctx.I(0), ctx.GO(0)]
    return [make_op("SliceGradient", inputs, [ctx.GI(0)])]


@register("Tile")
def _tile(ctx: MakerContext) -> list:
    inputs = [ctx.GO(0)] + [ctx.I(i) for i in range(1, min(len(ctx.op.input), 3))]
    return [make_op("TileGradient", inputs, [ctx.GI(0)])]


@register("ResizeNearest")
def _resize_nearest(ctx: MakerContext) -> list:
    inputs = [ctx.GO(0), ctx.I(0)] + ([ctx.I(1)] if len(ctx.op.input) == 2 else [])
    return [make_op("ResizeNearestGradient", inputs, [ctx.GI(0)])]


@register("Cast", copy_args=False)
def _cast(ctx: MakerContext) -> list:
    """Cast back: ``to`` and ``from_type`` swapped (Caffe2 needs ``from_type`` for it)."""
    if not ctx.has_arg("from_type"):
        raise GradientError(f"op {op_label(ctx.op)}: Caffe2 differentiates Cast only when it "
                            "carries a 'from_type' argument", hint="add from_type to the op")
    to, from_type = _data_type(ctx, "to"), _data_type(ctx, "from_type")
    return [make_op("Cast", [ctx.GO(0)], [ctx.GI(0)], args=[("to", from_type), ("from_type", to)])]


def _data_type(ctx: MakerContext, name: str) -> int:
    value = ctx.arg(name, 1)
    if isinstance(value, str):
        if value.upper() not in _DATA_TYPES:
            raise GradientError(f"op {op_label(ctx.op)}: unknown data type {value!r} in '{name}'")
        return _DATA_TYPES[value.upper()]
    return int(value)


# ---------------------------------------------------------------- elementwise with many inputs

@register(["Max", "Min"])
def _max_min(ctx: MakerContext) -> list:
    n = len(ctx.op.input)
    inputs = [ctx.O(0), ctx.GO(0)] + [ctx.I(i) for i in range(n)]
    return [make_op(f"{ctx.op.type}Gradient", inputs, [ctx.GI(i) for i in range(n)])]


@register("Mean")
def _mean(ctx: MakerContext) -> list:
    return [make_op("MeanGradient", [ctx.GO(0)], [ctx.GI(i) for i in range(len(ctx.op.input))])]


@register("WeightedSum")
def _weighted_sum(ctx: MakerContext) -> list:
    """Gradients of the data inputs (even positions); of the weights too with ``grad_on_w``."""
    n = len(ctx.op.input)
    outputs = [ctx.GI(i) for i in range(0, n, 2)]
    if ctx.arg("grad_on_w", 0):
        outputs += [ctx.GI(i) for i in range(1, n, 2)]
    return [make_op("WeightedSumGradient", [ctx.GO(0)] + [ctx.I(i) for i in range(n)], outputs)]


@register("Sqr")
def _sqr(ctx: MakerContext) -> list:
    return [make_op("Scale", [ctx.GO(0)], [ctx.GO(0)], scale=2.0),
            make_op("Mul", [ctx.GO(0), ctx.I(0)], [ctx.GI(0)])]


@register("Sqrt")
def _sqrt(ctx: MakerContext) -> list:
    dx = ctx.GI(0)
    return [make_op("Scale", [ctx.GO(0)], [dx], scale=0.5),
            make_op("Div", [dx, ctx.O(0)], [dx])]


@register("Pow", copy_args=False)
def _pow(ctx: MakerContext) -> list:
    """d(x^e) = e * x^(e-1) * dY, for an exponent given as the argument."""
    if len(ctx.op.input) > 1:
        raise GradientError(f"op {op_label(ctx.op)}: the gradient of Pow with an exponent blob "
                            "is not generated here", hint="give the exponent as an argument")
    e = float(ctx.arg("exponent", 0.0))
    dx = ctx.GI(0)
    return [make_op("Pow", [ctx.I(0)], [dx], exponent=e - 1.0),
            make_op("Mul", [dx, ctx.GO(0)], [dx]),
            make_op("Scale", [dx], [dx], scale=e)]


@register(["BatchMatMul", "MatMul"], copy_args=False)
def _matmul(ctx: MakerContext) -> list:
    """dA and dB as products of dY with the other operand, transposed to match. MatMul also
    reads the operand whose gradient it writes (for its shape) and passes ``axis_a``/``axis_b``."""
    if ctx.arg("broadcast", 0):
        raise GradientError(f"op {op_label(ctx.op)}: Caffe2 has no gradient for BatchMatMul "
                            "with broadcast=1")
    ta, tb = bool(ctx.arg("trans_a", 0)), bool(ctx.arg("trans_b", 0))
    a, b, dy = ctx.I(0), ctx.I(1), ctx.GO(0)
    # (inputs, trans_a, trans_b) of the products giving dA and dB, for each (trans_a, trans_b).
    products = {
        (False, False): (([dy, b], 0, 1), ([a, dy], 1, 0)),
        (False, True): (([dy, b], 0, 0), ([dy, a], 1, 0)),
        (True, False): (([b, dy], 0, 1), ([a, dy], 0, 0)),
        (True, True): (([b, dy], 1, 1), ([dy, a], 1, 1)),
    }[(ta, tb)]
    ops = []
    for (inputs, pa, pb), target, operand in zip(products, (0, 1), (a, b)):
        args = [("trans_a", 1 if pa else None), ("trans_b", 1 if pb else None)]
        if ctx.op.type == "MatMul":
            inputs = [*inputs, operand]
            args.append(("axis_a" if inputs[0] != dy else "axis_b", 1))
        ops.append(make_op(ctx.op.type, inputs, [ctx.GI(target)], args=args))
    return ops


# ---------------------------------------------------------------- sparse (embedding) ops

@register(["SparseLengthsSum", "SparseLengthsMean"])
def _sparse_lengths(ctx: MakerContext) -> list:
    """DATA's gradient is a GradientSlice: rows INDICES get the values this op writes."""
    reducer = ctx.op.type[len("SparseLengths"):]
    values = ctx.GI_V(0)
    ctx.set_sparse(0, ctx.I(1), values)
    grad_type = f"SparseLengthsIndicesInGradient{reducer}Gradient"
    return [make_op(grad_type, [ctx.GO(0), ctx.I(2), ctx.I(1)], [values])]


@register("SparseLengthsWeightedSum")
def _sparse_lengths_weighted_sum(ctx: MakerContext) -> list:
    """(DATA, WEIGHTS, INDICES, LENGTHS); ``grad_on_weights`` also differentiates WEIGHTS,
    which needs DATA (the "WithMainInput" gradient)."""
    values = ctx.GI_V(0)
    ctx.set_sparse(0, ctx.I(2), values)
    if ctx.arg("grad_on_weights", 0):
        return [make_op("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
                        [ctx.I(1), ctx.GO(0), ctx.I(3), ctx.I(0), ctx.I(2)], [values, ctx.GI(1)])]
    return [make_op("SparseLengthsIndicesInGradientWeightedSumGradient",
                    [ctx.I(1), ctx.GO(0), ctx.I(3), ctx.I(2)], [values])]


@register("Gather")
def _gather(ctx: MakerContext) -> list:
    """Axis 0: a GradientSlice (INDICES, dY), or SparseToDense with ``dense_gradient``;
    another axis: BatchGatherGradient."""
    axis = int(ctx.arg("axis", 0))
    if axis == 0:
        if ctx.arg("dense_gradient", 0):
            return [make_op("SparseToDense", [ctx.I(1), ctx.GO(0), ctx.I(0)], [ctx.GI(0)])]
        ctx.set_sparse(0, ctx.I(1), ctx.GO(0))
        return []
    if ctx.has_arg("dense_gradient") and not ctx.arg("dense_gradient"):
        raise GradientError(f"op {op_label(ctx.op)}: Gather with axis > 0 needs dense_gradient")
    return [make_op("BatchGatherGradient", [ctx.I(0), ctx.I(1), ctx.GO(0)], [ctx.GI(0)], axis=axis)]
