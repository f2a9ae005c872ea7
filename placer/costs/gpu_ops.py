"""Ops priced by the GPU kernel model (``placer.costs.gpu_kernels``): which kernels each op runs.

``price(model, launch_overhead_s, op_type, inputs, args, features, key, byte_scale)``
returns (seconds, explanation) for an op on a GPU whose profile has a kernel model, or
None where the op is not one this module knows (the caller then uses the roofline):

- ``Conv``: cuDNN's forward pass (the fastest algorithm for the shape, named in the
  explanation), plus the bias add (one pass over Y) when the op has a bias;
- ``ConvTranspose``: cuDNN's backward-data pass of the convolution it is the adjoint of
  (Caffe2's CudnnConvTransposeOp calls cudnnConvolutionBackwardData), plus its bias;
- ``ConvGradient``: backward-filter, backward-data (unless ``no_gradient_to_input``) and
  the bias gradient (a reduction over dY);
- ``FC`` / ``FCTransposed``: one cuBLAS GEMM (M rows, N outputs, K inputs) and the bias;
  ``FCGradient``: dW = dY^T X, dX = dY W (when asked for), db;
- ``MatMul`` / ``BatchMatMul``: one GEMM, or one per batch entry as a batched GEMM;
- every other op with known features: memory-bound, its bytes (scaled by the math mode's
  element size) at the achieved bandwidth plus one launch overhead per kernel, or its
  flops at the float32 rate of the SIMT class when those take longer.

``key`` is the peak key (float32, tf32, float16, bfloat16, int8) conv- and GEMM-shaped
work runs at; ``byte_scale`` the element-size ratio of the math mode (0.5 when float32
activations move as float16): operands are the first input's dtype at that ratio.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from placer.costs import gpu_kernels as gk
from placer.errors import PlacerError
from placer.ops import conv as conv_ops
from placer.ops import registry
from placer.types import Args, OpFeatures, TensorType

CONV_TYPES = ("Conv", "ConvTranspose", "ConvGradient")
GEMM_TYPES = ("FC", "FCTransposed", "FCGradient", "FCTransposedGradient", "MatMul", "BatchMatMul")
ELEMENT_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "uint8": 1.0, "float64": 8.0,
                 "int32": 4.0, "int64": 8.0}
# The compute efficiency of memory-bound ops' flops (Softmax's exponentials, LRN's powers):
# the datasheet roofline's default for those families (placer.hardware.constants).
MEMORY_BOUND_COMPUTE_EFFICIENCY = 0.2


def price(model: gk.GpuKernelModel, launch_overhead_s: float, op_type: str, inputs: Sequence[TensorType],
          args: Mapping[str, Any], features: OpFeatures, key: str, byte_scale: float = 1.0,
          launches: int | None = None) -> tuple[float, str] | None:
    """(seconds, explanation) of one op on the GPU, or None when it cannot be priced here."""
    # bytes per element of the operands as stored: the tensors' own, scaled by the math mode
    # (0.5 for float32 tensors under fp16 / bf16 / amp)
    dtype = inputs[0].dtype if inputs else "float32"
    elt = ELEMENT_BYTES.get(dtype, 4.0) * byte_scale
    a = args if isinstance(args, Args) else Args(args, op=op_type)
    try:
        if op_type in CONV_TYPES:
            return _conv(model, op_type, inputs, a, key, elt)
        if op_type in GEMM_TYPES:
            return _gemm_op(model, op_type, inputs, a, key, elt)
    except (PlacerError, ValueError, IndexError, KeyError, ZeroDivisionError):
        return None
    nbytes = (features.bytes_read + features.bytes_written) * byte_scale
    n = launches if launches is not None else 1
    memory = nbytes / model.achieved_bandwidth_bytes_per_s
    simt = model.classes.get("simt")
    rate = model.peak("float32") * (simt.efficiency if simt else 1.0) * MEMORY_BOUND_COMPUTE_EFFICIENCY
    compute = features.flops / rate
    bound = "memory" if memory >= compute else "compute"
    return n * launch_overhead_s + max(memory, compute), f"{bound}-bound, {n} kernel(s)"


def _window(inputs, args: Args, transpose: bool):
    if transpose:
        return conv_ops._transpose_geometry(inputs, args)
    return conv_ops._conv_geometry(inputs, args)


def _conv(model, op_type, inputs, args: Args, key, elt) -> tuple[float, str] | None:
    x, w = inputs[0], inputs[1]
    if x.ndim != 4 or w.ndim != 4:
        return None
    group = args.int("group", 1)
    if op_type == "ConvTranspose":
        win, n, c, m, (ho, wo), pads = _window(inputs, args, True)
        # the adjoint conv: input (N, M, Ho, Wo) -> output (N, C, H, W) = the ConvTranspose's input
        shape = gk.ConvShape(n=n, c=m, h=ho, w=wo, k=c, r=win.kernel[0], s=win.kernel[1],
                             pad_h=pads[0], pad_w=pads[1], stride_h=win.stride[0], stride_w=win.stride[1],
                             groups=group)
        passes = ["backward_data"]
        bias_bytes = elt * n * m * ho * wo * 2 if len(inputs) > 2 else 0.0
    else:
        win, n, c, m, (ho, wo), pads = _window(inputs[:2] if op_type == "ConvGradient" else inputs,
                                               args, False)
        h, wd = (x.shape[2], x.shape[3]) if win.nchw else (x.shape[1], x.shape[2])
        shape = gk.ConvShape(n=n, c=c, h=h, w=wd, k=m, r=win.kernel[0], s=win.kernel[1],
                             pad_h=pads[0], pad_w=pads[1], stride_h=win.stride[0], stride_w=win.stride[1],
                             groups=group, dilation_h=win.dilation[0], dilation_w=win.dilation[1])
        if op_type == "Conv":
            passes = ["forward"]
            bias_bytes = elt * n * m * ho * wo * 2 if len(inputs) > 2 else 0.0
        else:
            passes = ["backward_filter"] + ([] if args.bool("no_gradient_to_input", False) else ["backward_data"])
            bias_bytes = 0.0 if args.bool("no_bias", False) else elt * n * m * ho * wo
    total, parts = 0.0, []
    for p in passes:
        seconds, algo = gk.conv_seconds(model, key, shape, p, elt)
        total += seconds
        parts.append(f"{p.replace('_', '-')} {algo.replace('_', ' ')}")
    if bias_bytes:
        total += model.classes[gk.math_class(key)].fixed_s + bias_bytes / model.achieved_bandwidth_bytes_per_s
        parts.append("bias")
    return total, f"cuDNN {', '.join(parts)} ({_math(key)})"


def _flat(shape, axis: int) -> tuple[int, int]:
    axis = axis + len(shape) if axis < 0 else axis
    return math.prod(shape[:axis]), math.prod(shape[axis:])


def _gemm_op(model, op_type, inputs, args: Args, key, elt) -> tuple[float, str] | None:
    a, b = inputs[0].shape, inputs[1].shape
    batch = 1
    if op_type in ("FC", "FCTransposed", "FCGradient", "FCTransposedGradient"):
        rows, k = _flat(a, args.int("axis", 1))
        w0, w1 = _flat(b, args.int("axis_w", 1))
        transposed = op_type.startswith("FCTransposed")
        cols = w1 if transposed else w0
        if op_type.endswith("Gradient"):
            products = [(cols, k, rows)]                     # dW = dY^T X
            if args.n_outputs is None or args.n_outputs >= 3:   # dX is the third output
                products.append((rows, k, cols))            # dX = dY W
            bias = elt * rows * cols
        else:
            products = [(rows, cols, k)]
            bias = elt * rows * cols * 2 if len(inputs) > 2 else 0.0
    elif op_type == "MatMul":
        a0, a1 = _flat(a, args.int("axis_a", 1))
        b0, b1 = _flat(b, args.int("axis_b", 1))
        m, ka = (a1, a0) if args.int("trans_a", 0) else (a0, a1)
        n = b0 if args.int("trans_b", 0) else b1
        products, bias = [(m, n, ka)], 0.0
    else:  # BatchMatMul
        if len(a) < 2 or len(b) < 2:
            return None
        m, ka = (a[-1], a[-2]) if args.int("trans_a", 0) else (a[-2], a[-1])
        n = b[-2] if args.int("trans_b", 0) else b[-1]
        batch = max(math.prod(a[:-2]), math.prod(b[:-2]), 1)
        products, bias = [(m, n, ka)], 0.0
    total = 0.0
    for m, n, k in products:
        total += float(gk.gemm_seconds(model, key, m, n, k, batch=batch, in_bytes=elt, out_bytes=elt)[0])
    if bias:
        total += model.classes[gk.math_class(key)].fixed_s + bias / model.achieved_bandwidth_bytes_per_s
    kind = "batched GEMM" if batch > 1 else "GEMM"
    return total, f"cuBLAS {kind} x{len(products)} ({_math(key)})"


def _math(key: str) -> str:
    return {"float32": "float32 on CUDA cores", "tf32": "TF32 tensor cores", "float16": "float16 tensor cores",
            "bfloat16": "bfloat16 tensor cores", "int8": "int8 tensor cores"}.get(key, key)


def has_kernel_model(profile) -> bool:
    km = getattr(profile, "kernel_model", None)
    return bool(km and km.get("classes"))


def registry_launches(op_type: str, inputs, args) -> int:
    opdef = registry.get(op_type)
    return opdef.launch_count(inputs, args) if opdef is not None else 1
